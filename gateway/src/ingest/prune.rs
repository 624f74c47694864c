//! The outbox's housekeeping, started from the consumer loop's tick: forgetting message
//! ids past the dedupe window (`outbox.dedupe_retention_hours`), published dead letters
//! past their retention (`outbox.deadletter_retention_hours`) and reconciliation counts
//! past theirs (`reconcile.retention_hours`), at most once a minute, on a blocking thread.

use crate::clock::Clock;
use crate::config::{OutboxConfig, ReconcileConfig};
use crate::store::Outbox;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a prune starts, at most.
const EVERY: Duration = Duration::from_secs(60);

/// When the last prune started, and the one running.
pub struct Pruner {
    /// Message ids are kept this long after their event, ms.
    seen_retention_ms: u64,
    /// Published dead letters are kept this long, ms.
    deadletter_retention_ms: u64,
    /// Reconciliation counts are kept this long after their event time, ms.
    reconcile_retention_ms: u64,
    last: Instant,
    running: Option<tokio::task::JoinHandle<()>>,
}

impl Pruner {
    /// The first prune starts a minute from now.
    pub fn new(cfg: &OutboxConfig, reconcile: &ReconcileConfig) -> Pruner {
        Pruner {
            seen_retention_ms: cfg.dedupe_retention_hours * 3_600_000,
            deadletter_retention_ms: cfg.deadletter_retention_hours * 3_600_000,
            reconcile_retention_ms: reconcile.retention_hours * 3_600_000,
            last: Instant::now(),
            running: None,
        }
    }

    /// Starts a prune of `outbox` (cutoffs by `clock`) if a minute has passed since the
    /// last one started and it has finished. Failures are logged; the next prune tries
    /// again.
    pub fn tick(&mut self, outbox: &Arc<Outbox>, clock: &Clock) {
        // One prune at a time: a window large enough to take over a minute to scan would
        // otherwise be scanned twice at once.
        let idle = self.running.as_ref().is_none_or(|p| p.is_finished());
        if !idle || self.last.elapsed() <= EVERY {
            return;
        }
        self.last = Instant::now();
        let outbox = outbox.clone();
        let now = clock.now_ms();
        let seen_cutoff = now.saturating_sub(self.seen_retention_ms);
        let dl_cutoff = now.saturating_sub(self.deadletter_retention_ms);
        let reconcile_cutoff_s = now.saturating_sub(self.reconcile_retention_ms) / 1000;
        self.running = Some(tokio::task::spawn_blocking(move || {
            match outbox.prune_seen(seen_cutoff) {
                Ok(n) if n > 0 => tracing::info!(forgotten = n, "dedupe window pruned"),
                Ok(_) => {}
                Err(e) => tracing::error!(error = %e, "dedupe window prune failed"),
            }
            match outbox.prune_deadletters(dl_cutoff) {
                Ok(n) if n > 0 => tracing::info!(forgotten = n, "published dead letters past their retention pruned"),
                Ok(_) => {}
                Err(e) => tracing::error!(error = %e, "dead-letter prune failed"),
            }
            match outbox.prune_reconcile(reconcile_cutoff_s) {
                Ok(n) if n > 0 => tracing::info!(forgotten = n, "reconciliation counts past their retention pruned"),
                Ok(_) => {}
                Err(e) => tracing::error!(error = %e, "reconciliation prune failed"),
            }
        }));
    }
}
