//! The gateway's wall clock, injectable: job expiry (TTL) and the dedupe window read it,
//! never `Utc::now()` directly, so tests and fixture replays can move time.
//!
//! The clock is the system clock plus an offset in ms. The offset starts at
//! [`ClockConfig::offset_ms`](crate::config::ClockConfig) (the same value on every restart
//! keeps time monotonic across restarts, e.g. to replay fixtures recorded days ago as if
//! now), and, when [`ClockConfig::control`](crate::config::ClockConfig) is on, a test can
//! move it forward at run time with `POST /clock/advance?ms=N` (a device offline for 25
//! minutes without sleeping 25 minutes). Ack timeouts and retry backoff use the monotonic
//! [`tokio::time::Instant`] and are not affected: only deadlines stated in wall time are.

use chrono::{DateTime, Utc};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

/// A shared, cheaply cloned wall clock: system time + an adjustable offset.
#[derive(Debug, Clone, Default)]
pub struct Clock {
    offset_ms: Arc<AtomicI64>,
}

impl Clock {
    /// A clock `offset_ms` ahead of the system clock (negative: behind).
    pub fn with_offset(offset_ms: i64) -> Clock {
        Clock { offset_ms: Arc::new(AtomicI64::new(offset_ms)) }
    }

    /// The current time by this clock.
    pub fn now(&self) -> DateTime<Utc> {
        Utc::now() + chrono::Duration::milliseconds(self.offset_ms.load(Ordering::Relaxed))
    }

    /// The current time as Unix ms (0 before 1970).
    pub fn now_ms(&self) -> u64 {
        self.now().timestamp_millis().max(0) as u64
    }

    /// Moves the clock forward by `ms` (never backward: a negative value is ignored, so
    /// expiry decisions already taken stay consistent). Returns the new offset, ms.
    pub fn advance(&self, ms: i64) -> i64 {
        self.offset_ms.fetch_add(ms.max(0), Ordering::Relaxed) + ms.max(0)
    }

    /// The current offset from the system clock, ms.
    pub fn offset_ms(&self) -> i64 {
        self.offset_ms.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_and_advance_move_the_clock_forward_only() {
        let c = Clock::with_offset(-86_400_000);
        let behind = Utc::now() - c.now();
        assert!((behind.num_minutes() - 1440).abs() <= 1, "{behind}");
        let shared = c.clone();
        assert_eq!(shared.advance(86_400_000 + 1_500_000), 1_500_000);
        assert_eq!(c.offset_ms(), 1_500_000, "clones share the offset");
        assert_eq!(c.advance(-5), 1_500_000, "never backward");
        let ahead = c.now() - Utc::now();
        assert!((ahead.num_seconds() - 1500).abs() <= 2, "{ahead}");
    }
}
