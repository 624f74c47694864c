//! Outbox writes the consumer must not read past: retried until the disk takes them, given
//! up only at shutdown.
//!
//! Reading on past an effect or registry change that is not stored would lose it (its
//! offset would be committed with the next record's), so while the outbox refuses a
//! write the consumer holds there and `/readyz` goes red naming the failure. A shutdown
//! ends the retries, to stay within `shutdown_timeout_ms`: what was not stored is read
//! again at the next start, since no offset was stored past it.

use crate::shutdown::Shutdown;
use crate::store::{OutboxError, ReplayError};
use crate::telemetry::Monitor;
use std::time::Duration;

/// Runs `write` against the outbox (on this thread, in `block_in_place`: it needs the
/// multi-thread runtime) until it succeeds, backing off from 100 ms doubling to 10 s, and
/// reports the failure to `health` meanwhile (`what` names the write in the logs).
/// `Some` with the write's value once stored; `None` when shutdown is requested while it
/// still fails.
pub async fn until_stored<T>(
    health: &Monitor,
    what: &str,
    shutdown: &Shutdown,
    mut write: impl FnMut() -> Result<T, OutboxError>,
) -> Option<T> {
    let mut delay = Duration::from_millis(100);
    loop {
        match tokio::task::block_in_place(&mut write) {
            Ok(v) => {
                // Clears what this call or its caller reported (a no-op when nothing was).
                health.outbox_failing(None);
                return Some(v);
            }
            Err(e) => {
                health.outbox_failing(Some(e.to_string()));
                if shutdown.is_requested() {
                    tracing::error!(error = %e, "cannot store {what} in the outbox, and shutdown is requested: given up (it is read again at the next start)");
                    return None;
                }
                tracing::error!(error = %e, "cannot store {what} in the outbox; retrying (reading is held)");
                shutdown.sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(10));
            }
        }
    }
}

/// [`until_stored`] for a replay: a disk failure is retried until the disk takes the write
/// (or shutdown is requested: then nothing was replayed); any other refusal is returned.
///
/// # Errors
/// The write's refusal, or shutdown came while the disk still refused it.
pub async fn until_stored_or<T>(
    health: &Monitor,
    what: &str,
    shutdown: &Shutdown,
    mut write: impl FnMut() -> Result<T, ReplayError>,
) -> Result<T, ReplayError> {
    let mut refused = None;
    let stored = until_stored(health, what, shutdown, || match write() {
        Ok(v) => Ok(Some(v)),
        Err(ReplayError::Outbox(e)) => Err(e),
        Err(other) => {
            refused = Some(other);
            Ok(None)
        }
    })
    .await;
    match (stored, refused) {
        (Some(Some(v)), _) => Ok(v),
        (_, Some(refused)) => Err(refused),
        _ => Err(ReplayError::Outbox(OutboxError::Format(
            "the outbox kept refusing the write and shutdown was requested: nothing was replayed",
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Outbox;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A real refusal: an outbox where no folder can be made.
    fn refused() -> Result<(), OutboxError> {
        Outbox::open(std::path::Path::new("/proc/pixgate-no-such-folder/outbox.redb")).map(|_| ())
    }

    /// A write the disk keeps refusing is retried while the gateway runs, and given up
    /// once shutdown is requested, so SIGTERM stays within its bound. On the multi-thread
    /// runtime, on the wall clock: `block_in_place` panics on the current-thread runtime,
    /// the only one whose time can be paused.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_write_is_retried_until_shutdown_then_given_up() {
        let health = Monitor::default();
        let rx = Shutdown::new();
        let tries = AtomicUsize::new(0);
        let retrying = until_stored(&health, "a test", &rx, || {
            tries.fetch_add(1, Ordering::SeqCst);
            refused()
        });
        tokio::pin!(retrying);
        // Retrying: 100 ms, then 200 ms between tries; still no answer after 500 ms.
        assert!(tokio::time::timeout(Duration::from_millis(500), &mut retrying).await.is_err());
        assert!(tries.load(Ordering::SeqCst) >= 2, "retried");
        rx.request();
        let given_up = tokio::time::timeout(Duration::from_secs(5), &mut retrying).await.expect("gives up at shutdown");
        assert_eq!(given_up, None);

        // It still succeeds when the disk takes it, also during shutdown.
        assert_eq!(until_stored(&health, "a test", &rx, || Ok::<_, OutboxError>(7)).await, Some(7));
    }
}
