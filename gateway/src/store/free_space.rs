//! The outbox's file system running low, seen before it is full: free bytes measured
//! (`statvfs(3)`: `f_bavail × f_frsize`, what a process without root's reserve may still
//! write) against `outbox.min_free_bytes`. Reading pauses below it and resumes once half as
//! much again is free, so that the outbox's next batches, its dedupe window and its
//! removals of done jobs always find room: on a full disk redb refuses the write, and the
//! removals that would free space travel in that refused batch.

use std::path::Path;

/// Bytes free for an unprivileged writer on the file system holding `path`.
///
/// # Errors
/// `statvfs(3)` failed (no such path, say).
pub fn available(path: &Path) -> std::io::Result<u64> {
    let s = rustix::fs::statvfs(path)?;
    Ok(s.f_bavail.saturating_mul(s.f_frsize))
}

/// Whether the free bytes are low, with hysteresis: low below `min`, clear again at
/// `min + min / 2` or more, so that a file system at the watermark does not flip between
/// the two with every batch.
#[derive(Debug, Clone, Copy)]
pub struct Watermark {
    min: u64,
    low: bool,
}

impl Watermark {
    /// Not low; `min` bytes (`outbox.min_free_bytes`).
    pub fn new(min: u64) -> Watermark {
        Watermark { min, low: false }
    }

    /// The watermark, bytes.
    pub fn min(&self) -> u64 {
        self.min
    }

    /// Notes `free` bytes; `Some(low)` when that changes whether they are low.
    pub fn look(&mut self, free: u64) -> Option<bool> {
        let low = if self.low { free < self.min.saturating_add(self.min / 2) } else { free < self.min };
        (low != self.low).then(|| {
            self.low = low;
            low
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn low_below_the_watermark_and_clear_at_half_as_much_again() {
        let mut w = Watermark::new(1_000);
        assert_eq!(w.look(5_000), None);
        assert_eq!(w.look(1_000), None, "at the watermark is not below it");
        assert_eq!(w.look(999), Some(true));
        assert_eq!(w.look(1_200), None, "still low under 1,500");
        assert_eq!(w.look(1_499), None);
        assert_eq!(w.look(1_500), Some(false));
        assert_eq!(w.look(1_200), None, "clear until below the watermark again");
        assert_eq!(w.look(0), Some(true));
    }

    #[test]
    fn the_free_bytes_of_a_real_file_system() {
        let dir = std::env::temp_dir();
        let free = available(&dir).unwrap();
        assert!(free > 0, "the temp dir's file system has room: {free}");
        assert!(available(Path::new("/no/such/folder/pixgate")).is_err());
    }
}
