//! Outbox writes the consumer must not read past: retried until the disk takes them, given
//! up only at shutdown.
//!
//! Reading on past an effect or registry change that is not stored would lose it (its
//! offset would be committed with the next record's), so while the outbox refuses a
//! write no offset is stored past it and `/readyz` goes red naming the failure. A batch's
//! write is retried in its own task while the consumer goes on polling Kafka, its
//! partitions paused at their bounds ([`crate::ingest::handoff`]); the other writes are
//! retried where they are made. A shutdown
//! ends the retries, to stay within `shutdown_timeout_ms`: what was not stored is read
//! again at the next start, since no offset was stored past it.

use crate::ingest::backoff::Backoff;
use crate::shutdown::Shutdown;
use crate::store::{OutboxError, ReplayError};
use crate::telemetry::Monitor;

/// Runs `f` (an outbox read or write: it waits for the disk) on a blocking thread.
///
/// # Panics
/// When `f` panicked (the panic is carried on).
pub async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(f).await {
        Ok(v) => v,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

/// Runs `write` on `state` against the outbox until it succeeds, each attempt on a blocking
/// thread (`spawn_blocking`: a redb commit waits for the disk, and the caller may run on
/// any runtime, the current-thread one of paused-time tests included), backing off from
/// 100 ms doubling to 10 s, and reports the failure to `health` meanwhile (`what` names the
/// write in the logs). Returns `state` back with `Some` of the write's value once stored,
/// or `None` when shutdown is requested while it still fails.
///
/// # Panics
/// When the blocking thread running `write` panicked (the panic is carried on).
pub async fn until_stored<S, T, W>(
    health: &Monitor,
    what: &str,
    shutdown: &Shutdown,
    state: S,
    write: W,
) -> (S, Option<T>)
where
    S: Send + 'static,
    T: Send + 'static,
    W: FnMut(&mut S) -> Result<T, OutboxError> + Send + 'static,
{
    let mut backoff = Backoff::default();
    let mut held = Some((state, write));
    loop {
        let (mut state, mut write) = held.take().expect("state returned by the last attempt");
        let (state, write, result) = blocking(move || {
            let result = write(&mut state);
            (state, write, result)
        })
        .await;
        match result {
            Ok(v) => {
                // Clears what this call or its caller reported (a no-op when nothing was).
                health.outbox_failing(None);
                return (state, Some(v));
            }
            Err(e) => {
                health.outbox_failing(Some(e.to_string()));
                if shutdown.is_requested() {
                    tracing::error!(error = %e, "cannot store {what} in the outbox, and shutdown is requested: given up (it is read again at the next start)");
                    return (state, None);
                }
                tracing::error!(error = %e, "cannot store {what} in the outbox; retrying (nothing is read past it)");
                backoff.wait(shutdown).await;
                held = Some((state, write));
            }
        }
    }
}

/// [`until_stored`] for a replay: a disk failure is retried until the disk takes the write
/// (or shutdown is requested: then nothing was replayed); any other refusal is returned.
/// Returns `state` back with the outcome.
///
/// # Errors
/// The write's refusal, or shutdown came while the disk still refused it.
pub async fn until_stored_or<S, T, W>(
    health: &Monitor,
    what: &str,
    shutdown: &Shutdown,
    state: S,
    mut write: W,
) -> (S, Result<T, ReplayError>)
where
    S: Send + 'static,
    T: Send + 'static,
    W: FnMut(&mut S) -> Result<T, ReplayError> + Send + 'static,
{
    let (state, stored) =
        until_stored(health, what, shutdown, (state, None), move |(state, refused)| match write(state) {
            Ok(v) => Ok(Some(v)),
            Err(ReplayError::Outbox(e)) => Err(e),
            Err(other) => {
                *refused = Some(other);
                Ok(None)
            }
        })
        .await;
    let (state, refused) = state;
    let outcome = match (stored, refused) {
        (Some(Some(v)), _) => Ok(v),
        (_, Some(refused)) => Err(refused),
        _ => Err(ReplayError::Outbox(OutboxError::Format(
            "the outbox kept refusing the write and shutdown was requested: nothing was replayed",
        ))),
    };
    (state, outcome)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Outbox;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    /// A real refusal: an outbox where no folder can be made.
    fn refused() -> Result<(), OutboxError> {
        Outbox::open(std::path::Path::new("/proc/pixgate-no-such-folder/outbox.redb")).map(|_| ())
    }

    /// A write the disk keeps refusing is retried while the gateway runs, backing off, and
    /// given up once shutdown is requested, so SIGTERM stays within its bound; the state
    /// comes back either way. On paused time: the attempts run on blocking threads.
    #[tokio::test(start_paused = true)]
    async fn a_refused_write_is_retried_until_shutdown_then_given_up() {
        let health = Monitor::default();
        let shutdown = Shutdown::new();
        let tries = Arc::new(AtomicUsize::new(0));
        let counted = tries.clone();
        let retrying = until_stored(&health, "a test", &shutdown, 7u32, move |_| {
            counted.fetch_add(1, Ordering::SeqCst);
            refused()
        });
        tokio::pin!(retrying);
        // Tries at 0, 100, 300, 700 and 1,500 ms (the waits double from 100 ms).
        assert!(tokio::time::timeout(Duration::from_millis(1_600), &mut retrying).await.is_err());
        assert_eq!(tries.load(Ordering::SeqCst), 5, "retried with a doubling backoff");
        shutdown.request();
        let (state, given_up) =
            tokio::time::timeout(Duration::from_secs(5), &mut retrying).await.expect("gives up at shutdown");
        assert_eq!((state, given_up), (7, None));
        assert_eq!(tries.load(Ordering::SeqCst), 6, "one more try after the request, then no more");

        // It still succeeds when the disk takes it, also during shutdown.
        let (_, stored) = until_stored(&health, "a test", &shutdown, (), |_| Ok::<_, OutboxError>(7)).await;
        assert_eq!(stored, Some(7));
    }
}
