//! The state of pixgate's two connections to the external broker, shared by their event
//! loops, the publisher and health: which is up, the last error, and the pause before the
//! next connection attempt.

use crate::shutdown::Shutdown;
use crate::telemetry::Monitor;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// The first pause after a connection fails, ms; it doubles up to [`MAX_BACKOFF_MS`].
const FIRST_BACKOFF_MS: u64 = 100;
/// The longest pause between connection attempts, ms.
const MAX_BACKOFF_MS: u64 = 5_000;

/// Which of the two connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// Publishes jobs (`broker.client_id`).
    Jobs,
    /// Reads acks and status (`broker.acks_client_id`).
    Acks,
}

impl Which {
    fn index(self) -> usize {
        match self {
            Which::Jobs => 0,
            Which::Acks => 1,
        }
    }

    /// `jobs` or `acks`, for logs.
    pub fn name(self) -> &'static str {
        match self {
            Which::Jobs => "jobs",
            Which::Acks => "acks",
        }
    }
}

/// Both connections' state. Health hears of the broker as down while either is down
/// (without acks every job times out; without jobs nothing reaches a device).
#[derive(Debug)]
pub struct Links {
    health: Arc<Monitor>,
    up: [AtomicBool; 2],
    errors: Mutex<[Option<String>; 2]>,
}

impl Links {
    /// Both down (not yet connected), reported to `health` as such.
    pub fn new(health: Arc<Monitor>) -> Links {
        let links = Links {
            health,
            up: [AtomicBool::new(false), AtomicBool::new(false)],
            errors: Mutex::new(
                [Which::Jobs, Which::Acks].map(|w| Some(format!("{} connection: not connected yet", w.name()))),
            ),
        };
        links.report();
        links
    }

    /// Whether `which` is connected (CONNACK accepted, not failed since).
    pub fn is_up(&self, which: Which) -> bool {
        self.up[which.index()].load(Ordering::Acquire)
    }

    /// `which` got its CONNACK.
    pub fn up(&self, which: Which) {
        self.up[which.index()].store(true, Ordering::Release);
        self.errors.lock().unwrap_or_else(PoisonError::into_inner)[which.index()] = None;
        self.report();
    }

    /// `which` failed with `error` (or a SUBACK refused what it needs).
    pub fn down(&self, which: Which, error: String) {
        self.up[which.index()].store(false, Ordering::Release);
        self.errors.lock().unwrap_or_else(PoisonError::into_inner)[which.index()] =
            Some(format!("{} connection: {error}", which.name()));
        self.report();
    }

    /// `which` failed with `error`: logged (a warning when it was up, at debug while it
    /// keeps failing to connect), recorded, then the pause `backoff` gives before the next
    /// attempt. Returns whether shutdown was requested meanwhile.
    pub async fn failed(&self, which: Which, error: String, backoff: &mut Backoff, shutdown: &Shutdown) -> bool {
        let pause = backoff.pause();
        if self.is_up(which) {
            tracing::warn!(connection = which.name(), %error, "a connection to the devices' broker was lost; reconnecting");
        } else {
            tracing::debug!(connection = which.name(), %error, retry_ms = pause.as_millis() as u64, "a connection to the devices' broker failed");
        }
        self.down(which, error);
        shutdown.sleep(pause).await
    }

    fn report(&self) {
        let errors = self.errors.lock().unwrap_or_else(PoisonError::into_inner);
        let error = errors.iter().flatten().next().cloned();
        self.health.device_broker_down(error);
    }
}

/// Growing pauses between connection attempts: 100 ms, doubling, at most 5 s; back to the
/// first after a connection succeeds.
#[derive(Debug, Default)]
pub struct Backoff {
    next_ms: u64,
}

impl Backoff {
    /// The pause before the next attempt, and grows the one after.
    pub fn pause(&mut self) -> Duration {
        let now = self.next_ms.max(FIRST_BACKOFF_MS);
        self.next_ms = (now * 2).min(MAX_BACKOFF_MS);
        Duration::from_millis(now)
    }

    /// A connection succeeded.
    pub fn reset(&mut self) {
        self.next_ms = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    /// The error health holds for the broker (`None`: up).
    fn broker_error(health: &Monitor) -> Option<String> {
        health.facts(true, 0).1.device_broker_down.map(|(_, e)| e)
    }

    #[test]
    fn health_hears_of_the_broker_down_until_both_connections_are_up() {
        let health = Arc::new(Monitor::new(&Config::default()));
        let links = Links::new(health.clone());
        assert_eq!(broker_error(&health).as_deref(), Some("jobs connection: not connected yet"), "before any CONNACK");
        links.up(Which::Jobs);
        assert_eq!(broker_error(&health).as_deref(), Some("acks connection: not connected yet"));
        links.up(Which::Acks);
        assert_eq!(broker_error(&health), None);
        assert!(links.is_up(Which::Jobs) && links.is_up(Which::Acks));
        links.down(Which::Acks, "connection refused".into());
        assert_eq!(broker_error(&health).as_deref(), Some("acks connection: connection refused"));
        assert!(!links.is_up(Which::Acks) && links.is_up(Which::Jobs));
    }

    #[test]
    fn backoff_doubles_to_its_cap_and_resets() {
        let mut b = Backoff::default();
        let ms: Vec<u128> = (0..8).map(|_| b.pause().as_millis()).collect();
        assert_eq!(ms, [100, 200, 400, 800, 1_600, 3_200, 5_000, 5_000]);
        b.reset();
        assert_eq!(b.pause(), Duration::from_millis(100));
    }
}
