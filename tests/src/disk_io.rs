//! Bytes a process sent to storage, from `/proc/PID/io` (Linux), for the load harness's
//! write amplification figure: what an edge box's eMMC or SD card wears by.

/// Bytes `pid` caused to be written to storage so far: `write_bytes` less
/// `cancelled_write_bytes` (pages dirtied and then truncated before writeback), counted
/// when pages are dirtied, so a write still in the page cache counts. `None` if it is gone,
/// this is not Linux, or the kernel keeps no I/O accounting.
pub fn written(pid: u32) -> Option<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    let field = |name: &str| {
        io.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.trim_start_matches(':').trim().parse::<u64>().ok()))
    };
    Some(field("write_bytes")?.saturating_sub(field("cancelled_write_bytes").unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    /// Written by this process through a synced file, as the counter sees it: at least
    /// what was written (a file system adds its own metadata). The file sits beside the
    /// test binary, on the disk the build uses (`/tmp` may be a tmpfs, which writes
    /// nothing to storage).
    #[test]
    fn a_synced_write_is_counted() {
        use std::io::Write;
        let Some(before) = super::written(std::process::id()) else {
            panic!("no /proc/self/io: the load harness needs Linux with task I/O accounting");
        };
        let exe = std::env::current_exe().expect("test binary path");
        let path = exe.with_file_name(format!("disk-io-test-{}", std::process::id()));
        let mut f = std::fs::File::create(&path).expect("file");
        f.write_all(&vec![7u8; 1 << 20]).expect("write");
        f.sync_all().expect("sync");
        let after = super::written(std::process::id()).expect("still readable");
        std::fs::remove_file(&path).expect("remove");
        assert!(after - before >= 1 << 20, "{before} → {after}");
    }
}
