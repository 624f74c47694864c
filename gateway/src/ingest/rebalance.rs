//! The consumer's librdkafka context: it notes each rebalance for the consumer loop and
//! passes librdkafka's statistics to the health monitor.
//!
//! librdkafka calls the rebalance hook inside the consumer's poll (`StreamConsumer::recv`,
//! on the loop's own task), where the loop's state cannot be reached: the hook only notes
//! the revoked partitions and that something changed, and the loop applies the change
//! ([`Rebalances::take`]) before it handles its next event: it forgets the revoked
//! partitions' offsets and pause reasons and pauses the new assignment again
//! ([`crate::ingest::backpressure::Backpressure::rebalanced`]).

use crate::model::Partition;
use crate::telemetry::Monitor;
use rdkafka::consumer::{BaseConsumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::ClientContext;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Called with each partition revoked, inside librdkafka's rebalance hook (so before the
/// group hands it to another member); must not wait.
pub type RevokeHook = Box<dyn Fn(&str, i32) + Send + Sync>;

/// The consumer the loop reads with.
pub type GatewayConsumer = StreamConsumer<Rebalances>;

/// Rebalances not yet applied by the loop, and the health monitor for statistics.
pub struct Rebalances {
    /// Partitions revoked since the loop last looked.
    revoked: Mutex<Vec<Partition>>,
    /// A rebalance (assign, revoke or error) happened since the loop last looked.
    changed: AtomicBool,
    health: Arc<Monitor>,
    on_revoke: OnceLock<RevokeHook>,
}

impl Rebalances {
    /// Nothing noted yet; statistics go to `health`.
    pub fn new(health: Arc<Monitor>) -> Rebalances {
        Rebalances { revoked: Mutex::default(), changed: AtomicBool::default(), health, on_revoke: OnceLock::new() }
    }

    /// Sets what runs for each partition revoked, before the revoke completes (the central
    /// shape closes the partition's connection to the devices' broker there). Once only.
    pub fn on_revoke(&self, hook: RevokeHook) {
        let _ = self.on_revoke.set(hook);
    }

    /// The partitions revoked since the last call, when a rebalance happened since (the
    /// list may be empty: only assigned); `None` when none did.
    pub fn take(&self) -> Option<Vec<Partition>> {
        // A plain load first: this runs for every event of the loop, and a rebalance is rare.
        if !(self.changed.load(Ordering::Relaxed) && self.changed.swap(false, Ordering::SeqCst)) {
            return None;
        }
        Some(std::mem::take(&mut *self.revoked.lock().expect("rebalance lock")))
    }

    /// Notes a rebalance that revoked `revoked` (nothing for an assignment or an error).
    fn note(&self, revoked: impl IntoIterator<Item = Partition>) {
        self.revoked.lock().expect("rebalance lock").extend(revoked);
        self.changed.store(true, Ordering::SeqCst);
    }
}

impl ClientContext for Rebalances {
    /// librdkafka's statistics (`statistics.interval.ms`) feed readiness.
    fn stats(&self, statistics: rdkafka::statistics::Statistics) {
        self.health.kafka_statistics(&statistics);
    }
}

impl ConsumerContext for Rebalances {
    fn pre_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let (Rebalance::Revoke(tpl), Some(hook)) = (rebalance, self.on_revoke.get()) {
            for e in tpl.elements() {
                hook(e.topic(), e.partition());
            }
        }
    }

    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                tracing::info!(partitions = tpl.count(), "partitions assigned");
                self.note([]);
            }
            Rebalance::Revoke(tpl) => {
                tracing::info!(partitions = tpl.count(), "partitions revoked");
                self.note(tpl.elements().iter().map(|e| (e.topic().to_string(), e.partition())));
            }
            Rebalance::Error(e) => {
                tracing::error!(error = %e, "rebalance error");
                self.note([]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_rebalance_is_taken_once_with_the_partitions_revoked_since() {
        let r = Rebalances::new(Arc::default());
        assert_eq!(r.take(), None);
        r.note([("t".to_string(), 0)]);
        r.note([]);
        r.note([("t".to_string(), 2)]);
        assert_eq!(r.take(), Some(vec![("t".to_string(), 0), ("t".to_string(), 2)]));
        assert_eq!(r.take(), None);
        r.note([]);
        assert_eq!(r.take(), Some(vec![]), "an assignment alone is a change too");
    }
}
