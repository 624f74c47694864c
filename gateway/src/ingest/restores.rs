//! Restores of partitions taken in the central shape, run beside the consumer loop rather
//! than inside it (`docs/cluster.md`, "Hand-over"): a device-jobs partition's claim and
//! delivery log, a charge partition's route changelog.
//!
//! Reading a log can take seconds. A loop waiting for one would poll neither group member,
//! so neither could take part in a rebalance: the other group's rebalance would end
//! without this member, and the next one would move every partition again (eager
//! assignors), starting more restores. Kafka Streams restores the same way: a restoring
//! task's partitions are paused and the thread keeps polling.
//!
//! A restore is started per partition taken ([`Restores::start`]; its partition is
//! paused meanwhile), tried again inside its task until it succeeds, and cancelled when
//! the partition is revoked ([`Restores::cancel`]). Its outcome comes back to the loop
//! ([`Restores::finished`]) tagged with a generation, so the outcome of a restore
//! cancelled or started again after it finished is told apart and dropped.

use crate::model::Partition;
use crate::store::ChargeState;
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::time::Instant;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

/// What a restore read.
#[derive(Debug)]
pub enum Outcome {
    /// A device-jobs partition claimed: what its delivery log holds (boxed: it is much
    /// larger than the other outcome).
    Claimed(Box<crate::model::delivery_log::Restored>),
    /// A charge partition's states read from the route changelog, with the count of
    /// values that did not read.
    States(HashMap<String, ChargeState>, usize),
}

/// A restore that ended, as the loop receives it.
#[derive(Debug)]
pub struct Done {
    /// Its partition.
    pub part: Partition,
    generation: u64,
    /// When it started.
    pub started: Instant,
    /// What it read.
    pub outcome: Outcome,
}

/// The restores running, and the channel their outcomes come back on.
pub struct Restores {
    tx: mpsc::Sender<Done>,
    running: BTreeMap<Partition, (u64, AbortHandle)>,
    next_generation: u64,
    /// Per restoring partition, the lowest offset of a record read and dropped while it
    /// restored (it is read again from there once restored).
    dropped: HashMap<Partition, i64>,
}

impl Restores {
    /// No restore yet; ended ones arrive on the receiver (at most `capacity` waiting).
    pub fn new(capacity: usize) -> (Restores, mpsc::Receiver<Done>) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        (Restores { tx, running: BTreeMap::new(), next_generation: 0, dropped: HashMap::new() }, rx)
    }

    /// Starts restoring `part` with `restore` (which retries on its own until it has an
    /// outcome), cancelling a restore of it already running.
    pub fn start(&mut self, part: Partition, restore: impl Future<Output = Outcome> + Send + 'static) {
        self.cancel(&part);
        self.next_generation += 1;
        let (generation, tx, started) = (self.next_generation, self.tx.clone(), Instant::now());
        let task_part = part.clone();
        let handle = tokio::spawn(async move {
            let outcome = restore.await;
            // The loop is gone only at shutdown: nothing is waiting for it then.
            let _ = tx.send(Done { part: task_part, generation, started, outcome }).await;
        });
        self.running.insert(part, (generation, handle.abort_handle()));
    }

    /// Cancels `part`'s restore (revoked, or shutting down); whether one was running.
    pub fn cancel(&mut self, part: &Partition) -> bool {
        self.dropped.remove(part);
        match self.running.remove(part) {
            Some((_, handle)) => {
                handle.abort();
                true
            }
            None => false,
        }
    }

    /// Cancels every restore.
    pub fn cancel_all(&mut self) {
        let parts: Vec<Partition> = self.running.keys().cloned().collect();
        for part in parts {
            self.cancel(&part);
        }
    }

    /// Whether `part` is restoring.
    pub fn is_restoring(&self, part: &Partition) -> bool {
        self.running.contains_key(part)
    }

    /// Whether partition `partition` of `topic` is restoring, without building a
    /// [`Partition`]: asked for every record read, and nothing runs most of the time.
    pub fn is_restoring_at(&self, topic: &str, partition: i32) -> bool {
        !self.running.is_empty() && self.running.keys().any(|(t, p)| t == topic && *p == partition)
    }

    /// A record of `part` at `offset` was read and dropped while it restored.
    pub fn dropped(&mut self, part: &Partition, offset: i64) {
        let low = self.dropped.entry(part.clone()).or_insert(offset);
        *low = (*low).min(offset);
    }

    /// Whether `done` is the outcome of `part`'s running restore, which then ends; `false`
    /// for one cancelled or replaced since (drop it). With `true`, the lowest offset of a
    /// record dropped meanwhile, if any.
    pub fn finished(&mut self, done: &Done) -> (bool, Option<i64>) {
        match self.running.get(&done.part) {
            Some((generation, _)) if *generation == done.generation => {
                self.running.remove(&done.part);
                (true, self.dropped.remove(&done.part))
            }
            _ => (false, None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn part(n: i32) -> Partition {
        ("pixgate.device-jobs".to_string(), n)
    }

    fn states(n: usize) -> Outcome {
        Outcome::States(HashMap::new(), n)
    }

    #[tokio::test(start_paused = true)]
    async fn an_outcome_counts_only_for_the_restore_still_running() {
        let (mut r, mut rx) = Restores::new(4);
        r.start(part(1), async { states(1) });
        assert!(r.is_restoring(&part(1)));
        assert!(r.is_restoring_at("pixgate.device-jobs", 1) && !r.is_restoring_at("pixgate.device-jobs", 2));
        r.dropped(&part(1), 9);
        r.dropped(&part(1), 7);
        let done = rx.recv().await.expect("an outcome");
        assert_eq!(r.finished(&done), (true, Some(7)), "its own, with the lowest offset dropped");
        assert!(!r.is_restoring(&part(1)));
        assert_eq!(r.finished(&done), (false, None), "once only");

        // One that finished, then was started again before the loop saw it: the first
        // outcome is stale.
        r.start(part(2), async { states(2) });
        let first = rx.recv().await.expect("an outcome");
        r.start(part(2), async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            states(3)
        });
        assert!(!r.finished(&first).0, "replaced since");
        let second = rx.recv().await.expect("the new one's");
        assert!(matches!(second.outcome, Outcome::States(_, 3)));
        assert!(r.finished(&second).0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_restore_sends_nothing() {
        let (mut r, mut rx) = Restores::new(4);
        r.start(part(1), async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            states(1)
        });
        r.dropped(&part(1), 3);
        assert!(r.cancel(&part(1)));
        assert!(!r.cancel(&part(1)), "nothing left to cancel");
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(rx.try_recv().is_err(), "aborted: no outcome");
        r.start(part(1), async { states(2) });
        let done = rx.recv().await.expect("an outcome");
        assert_eq!(r.finished(&done), (true, None), "the drops of the cancelled restore went with it");
        r.start(part(4), std::future::pending());
        r.cancel_all();
        assert!(!r.is_restoring(&part(4)));
    }
}
