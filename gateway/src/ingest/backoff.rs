//! The pause between tries of the consumer's retry loops: 100 ms, doubling up to 10 s.
//!
//! Short enough that a blip (a broker's leader moving, a disk's moment of pressure) costs a
//! card machine a fraction of a second; long enough at its cap that a broker or disk that
//! stays away is not hammered, and each failure is still logged every 10 s.

use crate::shutdown::Shutdown;
use std::time::Duration;

/// The first pause after a failed try.
pub(crate) const FIRST: Duration = Duration::from_millis(100);
/// The longest pause: the doubling stops here.
pub(crate) const MAX: Duration = Duration::from_secs(10);

/// A retry loop's next pause ([`FIRST`], doubling to [`MAX`]).
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { next: FIRST }
    }
}

impl Backoff {
    /// The pause the next [`Backoff::wait`] sleeps, in ms (for the failure's log line).
    pub(crate) fn next_ms(&self) -> u64 {
        u64::try_from(self.next.as_millis()).unwrap_or(u64::MAX)
    }

    /// Sleeps the next pause, cut short by a shutdown request, and doubles it for the try
    /// after. Returns whether shutdown is requested.
    pub(crate) async fn wait(&mut self, shutdown: &Shutdown) -> bool {
        let stop = shutdown.sleep(self.next).await;
        self.next = (self.next * 2).min(MAX);
        stop
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn doubles_from_100_ms_to_10_s_and_stops_at_shutdown() {
        let shutdown = Shutdown::new();
        let mut b = Backoff::default();
        let mut pauses = Vec::new();
        for _ in 0..9 {
            pauses.push(b.next_ms());
            let t = tokio::time::Instant::now();
            assert!(!b.wait(&shutdown).await);
            assert_eq!(t.elapsed().as_millis() as u64, *pauses.last().unwrap());
        }
        assert_eq!(pauses, [100, 200, 400, 800, 1_600, 3_200, 6_400, 10_000, 10_000]);
        shutdown.request();
        let t = tokio::time::Instant::now();
        assert!(b.wait(&shutdown).await, "a shutdown ends the wait");
        assert_eq!(t.elapsed(), Duration::ZERO);
    }
}
