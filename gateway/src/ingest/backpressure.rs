//! Backpressure: which partitions the consumer must stop reading, and when they may read
//! again.
//!
//! A partition is paused while any of these holds, and resumed when none does; each bound
//! releases at half, so a partition at a bound does not flip between paused and resumed
//! with every record:
//! - it has `kafka.max_pending_per_partition` records read and not yet written (until
//!   half);
//! - the outbox holds `outbox.max_jobs` jobs in all (every assigned partition pauses; until
//!   half drained);
//! - it fed a job to a device whose queue holds `outbox.max_jobs_per_device` jobs (until
//!   that device's queue is half drained). Which partitions feed a device is only known
//!   when one of their records does, so the bound is soft by at most one record's jobs
//!   per partition;
//! - the outbox's file system has less than `outbox.min_free_bytes` free (every assigned
//!   partition pauses; until half as much again is free: [`crate::store::free_space`]);
//! - the next batch has been full for a while behind a write in flight that has not landed
//!   (the disk refusing it, say: every assigned partition pauses, so that the loop goes on
//!   polling Kafka without reading more; until that write lands);
//! - its records wait for the device registry to catch up (until released:
//!   [`crate::ingest::registry_wait`]);
//! - it belongs to a topic held back on purpose (`kafka.hold_device_topic_ms`, testing
//!   only).
//!
//! Jobs count against the bounds from the moment they are planned (not when their batch is
//! written), so a batch cannot overshoot a device's bound; a planned job the outbox's
//! dedupe window leaves out is counted out again, and a replayed dead letter's job counts
//! like a planned one.
//!
//! [`Backpressure`] keeps the counts and the pause reasons and answers each change with
//! [`Decision`]s. It does no I/O: the consumer loop pauses or resumes the partitions in
//! librdkafka (which keeps being polled while paused) and reports each partition's
//! [`PauseCause`] to the health monitor. Pauses do not survive a reassignment, so after a
//! rebalance every assigned partition's pause is decided again
//! ([`Backpressure::rebalanced`]).

use crate::config::Config;
use crate::model::Partition;
use crate::telemetry::health::PauseCause;
use std::collections::{HashMap, HashSet};

/// The three bounds, from the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Records read and not yet written, per partition (`kafka.max_pending_per_partition`).
    pub pending_per_partition: usize,
    /// Jobs in the outbox, all devices (`outbox.max_jobs`).
    pub jobs: usize,
    /// Jobs in one device's queue (`outbox.max_jobs_per_device`).
    pub jobs_per_device: usize,
}

impl Bounds {
    /// The bounds `cfg` sets.
    pub fn of(cfg: &Config) -> Bounds {
        Bounds {
            pending_per_partition: cfg.kafka.max_pending_per_partition,
            jobs: cfg.outbox.max_jobs,
            jobs_per_device: cfg.outbox.max_jobs_per_device,
        }
    }
}

/// What to tell librdkafka about a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Stop fetching it (`rd_kafka_pause_partitions`).
    Pause,
    /// Fetch it again (`rd_kafka_resume_partitions`).
    Resume,
}

/// A partition whose pause reasons were looked at again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The partition.
    pub part: Partition,
    /// Pause or resume it; `None` when it already is as it should be.
    pub action: Option<Action>,
    /// Its pause reasons now, for [`crate::telemetry::Monitor::paused`] (all empty: it
    /// reads).
    pub cause: PauseCause,
}

/// The counts the bounds are judged on, the pause reasons per partition, and what is
/// paused.
#[derive(Debug)]
pub struct Backpressure {
    bounds: Bounds,
    /// Jobs in the outbox (queued or in flight, or planned and not yet written), all devices.
    jobs: usize,
    /// The same, per device id.
    device_jobs: HashMap<String, usize>,
    /// Partitions at their pending bound.
    pending_bound: HashSet<Partition>,
    /// Per partition, the devices at their bound it fed a job to (never an empty set).
    waiting_on: HashMap<Partition, HashSet<String>>,
    /// The outbox is at its bound (every assigned partition pauses).
    outbox_full: bool,
    /// The outbox's file system is low on space (every assigned partition pauses).
    low_space: bool,
    /// The write in flight is held with the next batch full (every assigned partition
    /// pauses).
    write_held: bool,
    /// Partitions whose records wait for the device registry.
    registry_wait: HashSet<Partition>,
    /// Partitions taken whose state is being read back from their log (the central shape).
    restoring: HashSet<Partition>,
    /// A topic whose partitions stay paused (`kafka.hold_device_topic_ms`, testing only).
    held_topic: Option<String>,
    /// The consumer's assignment, as of the last rebalance.
    assigned: Vec<Partition>,
    /// What is paused in librdkafka.
    paused: HashSet<Partition>,
}

impl Backpressure {
    /// Nothing paused, nothing assigned; `device_jobs` are the jobs the outbox holds at
    /// start, by device id (they count against the bounds).
    pub fn new(bounds: Bounds, device_jobs: HashMap<String, usize>) -> Backpressure {
        Backpressure {
            bounds,
            jobs: device_jobs.values().sum(),
            device_jobs,
            pending_bound: HashSet::new(),
            waiting_on: HashMap::new(),
            outbox_full: false,
            low_space: false,
            write_held: false,
            registry_wait: HashSet::new(),
            restoring: HashSet::new(),
            held_topic: None,
            assigned: Vec::new(),
            paused: HashSet::new(),
        }
    }

    /// A record of `part` was read: `pending` of its records are now read and not yet
    /// written. Pauses `part` when that reaches the pending bound.
    pub fn record_read(&mut self, part: &Partition, pending: usize) -> Option<Decision> {
        if pending >= self.bounds.pending_per_partition && self.pending_bound.insert(part.clone()) {
            tracing::info!(topic = %part.0, partition = part.1, "pausing partition: pending bound reached");
            return Some(self.reconcile(part));
        }
        None
    }

    /// A record of `part` was written: `pending` of its records are still read and not
    /// yet written. Releases the pending bound at half.
    pub fn record_done(&mut self, part: &Partition, pending: usize) -> Option<Decision> {
        if self.pending_bound.contains(part) && pending <= self.bounds.pending_per_partition / 2 {
            self.pending_bound.remove(part);
            return Some(self.reconcile(part));
        }
        None
    }

    /// A record of `part` was planned with one job for each of `devices` (a device id
    /// once per job). Counts them, pauses `part` if one of those devices is at its bound,
    /// and every assigned partition if the outbox is.
    pub fn planned<'a>(&mut self, part: &Partition, devices: impl IntoIterator<Item = &'a str>) -> Vec<Decision> {
        let mut decisions = Vec::new();
        for device in devices {
            self.jobs += 1;
            let n = self.device_jobs.entry(device.to_string()).or_default();
            *n += 1;
            if *n >= self.bounds.jobs_per_device
                && self.waiting_on.entry(part.clone()).or_default().insert(device.to_string())
            {
                tracing::warn!(device, topic = %part.0, partition = part.1, bound = self.bounds.jobs_per_device, "device queue at its bound: pausing the partition feeding it");
                decisions.push(self.reconcile(part));
            }
        }
        decisions.extend(self.check_outbox_bound());
        decisions
    }

    /// A planned job of `device` the outbox did not queue (its message id was in the
    /// dedupe window): counted out again, and, like a finished job, it releases the
    /// partitions waiting on `device` once its queue is half drained (a device can reach
    /// its bound through jobs that are then left out: nothing would ever finish for it).
    /// Call [`Backpressure::check_outbox_bound`] once the batch's jobs are counted.
    pub fn left_out(&mut self, device: &str) -> Vec<Decision> {
        self.count_out(device)
    }

    /// A dead letter's job was queued again in `device`'s queue: counted like a planned
    /// job (the device's next records pause their partitions if it is at its bound).
    pub fn replayed(&mut self, device: &str) -> Vec<Decision> {
        self.jobs += 1;
        *self.device_jobs.entry(device.to_string()).or_default() += 1;
        self.check_outbox_bound()
    }

    /// A job left `device`'s queue (done, superseded, failed or expired). Resumes the
    /// partitions waiting on that device once its queue is half drained, and every
    /// partition once the outbox is.
    pub fn finished(&mut self, device: &str) -> Vec<Decision> {
        let mut decisions = self.count_out(device);
        decisions.extend(self.check_outbox_bound());
        decisions
    }

    /// Every job of `device` left this replica (the central shape: its partition went to
    /// another replica): counted out as if finished.
    pub fn forgotten(&mut self, device: &str) -> Vec<Decision> {
        let n = self.device_jobs.get(device).copied().unwrap_or(0);
        let mut decisions = Vec::new();
        for _ in 0..n {
            decisions.extend(self.count_out(device));
        }
        self.device_jobs.remove(device);
        decisions.extend(self.check_outbox_bound());
        decisions
    }

    /// One job of `device` fewer; resumes the partitions waiting on `device` once its
    /// queue is half drained.
    fn count_out(&mut self, device: &str) -> Vec<Decision> {
        // A device with nothing counted has nothing to count out: its jobs were counted
        // out already when its partition went to another replica ([`Backpressure::forgotten`]).
        let Some(n) = self.device_jobs.get_mut(device).filter(|n| **n > 0) else { return Vec::new() };
        *n -= 1;
        let left = Some(*n);
        self.jobs = self.jobs.saturating_sub(1);
        let mut decisions = Vec::new();
        if left.is_some_and(|n| n <= self.bounds.jobs_per_device / 2) {
            let parts: Vec<Partition> =
                self.waiting_on.iter().filter(|(_, d)| d.contains(device)).map(|(p, _)| p.clone()).collect();
            for part in parts {
                if let Some(d) = self.waiting_on.get_mut(&part) {
                    d.remove(device);
                    if d.is_empty() {
                        self.waiting_on.remove(&part);
                    }
                }
                tracing::info!(device, "device queue drained below half its bound");
                decisions.push(self.reconcile(&part));
            }
        }
        decisions
    }

    /// Records of `part` wait for the device registry (`waiting`), or no longer do: pauses
    /// or resumes it; `None` when that changes nothing.
    pub fn registry_wait(&mut self, part: &Partition, waiting: bool) -> Option<Decision> {
        let changed = if waiting { self.registry_wait.insert(part.clone()) } else { self.registry_wait.remove(part) };
        changed.then(|| self.reconcile(part))
    }

    /// `part` was taken and waits for its state to be read back from its log
    /// (`restoring`), or no longer does: pauses or resumes it; `None` when that changes
    /// nothing.
    pub fn restoring(&mut self, part: &Partition, restoring: bool) -> Option<Decision> {
        let changed = if restoring { self.restoring.insert(part.clone()) } else { self.restoring.remove(part) };
        changed.then(|| self.reconcile(part))
    }

    /// Keeps every partition of `topic` paused (`None`: none): for
    /// `kafka.hold_device_topic_ms` (testing only).
    pub fn hold_topic(&mut self, topic: Option<String>) -> Vec<Decision> {
        if self.held_topic == topic {
            return Vec::new();
        }
        self.held_topic = topic;
        self.reconcile_all()
    }

    /// The outbox's file system is low on space (`true`: every assigned partition pauses)
    /// or has room again; no decisions when that does not change.
    pub fn low_space(&mut self, low: bool) -> Vec<Decision> {
        if self.low_space == low {
            return Vec::new();
        }
        self.low_space = low;
        self.reconcile_all()
    }

    /// The write in flight is held with the next batch full (`true`: every assigned
    /// partition pauses), or no longer; no decisions when that does not change.
    pub fn write_held(&mut self, held: bool) -> Vec<Decision> {
        if self.write_held == held {
            return Vec::new();
        }
        self.write_held = held;
        if held {
            tracing::warn!("outbox write held and the next batch full: pausing all partitions until it lands");
        } else {
            tracing::info!("held outbox write landed: resuming");
        }
        self.reconcile_all()
    }

    /// Whether every partition is paused for a held write ([`Backpressure::write_held`]).
    pub fn is_write_held(&self) -> bool {
        self.write_held
    }

    /// Pauses every assigned partition when the outbox reaches its bound, resumes them at
    /// half; no decisions while neither happens.
    pub fn check_outbox_bound(&mut self) -> Vec<Decision> {
        let max = self.bounds.jobs;
        let full = if self.outbox_full { self.jobs > max / 2 } else { self.jobs >= max };
        if full == self.outbox_full {
            return Vec::new();
        }
        self.outbox_full = full;
        tracing::info!(
            jobs = self.jobs,
            full,
            "outbox bound: {} all partitions",
            if full { "pausing" } else { "resuming" }
        );
        self.reconcile_all()
    }

    /// A rebalance: forgets the pause reasons of the `revoked` partitions, takes
    /// `assigned` (the whole new assignment) and decides every assigned partition's pause
    /// again, since librdkafka's pauses do not survive a reassignment.
    pub fn rebalanced(&mut self, revoked: &[Partition], assigned: Vec<Partition>) -> Vec<Decision> {
        for part in revoked {
            self.pending_bound.remove(part);
            self.waiting_on.remove(part);
            self.registry_wait.remove(part);
            self.restoring.remove(part);
        }
        self.paused.clear();
        self.assigned = assigned;
        self.reconcile_all()
    }

    /// Jobs in the outbox (and planned for it), all devices.
    pub fn jobs(&self) -> usize {
        self.jobs
    }

    /// Partitions paused in librdkafka.
    pub fn paused_count(&self) -> usize {
        self.paused.len()
    }

    /// Devices at their bound holding back a partition (one may hold back several).
    pub fn devices_at_bound(&self) -> usize {
        self.waiting_on.values().flatten().collect::<HashSet<_>>().len()
    }

    /// Decides `part`'s pause from its reasons.
    fn reconcile(&mut self, part: &Partition) -> Decision {
        let mut cause = PauseCause::new(self.pending_bound.contains(part), self.outbox_full, self.waiting_on.get(part));
        cause.registry_wait = self.registry_wait.contains(part);
        cause.restoring = self.restoring.contains(part);
        cause.low_space = self.low_space;
        cause.write_held = self.write_held;
        let want = cause.is_paused() || self.held_topic.as_deref() == Some(part.0.as_str());
        let action = (want != self.paused.contains(part)).then(|| {
            if want {
                self.paused.insert(part.clone());
                Action::Pause
            } else {
                self.paused.remove(part);
                tracing::info!(topic = %part.0, partition = part.1, "resuming partition");
                Action::Resume
            }
        });
        Decision { part: part.clone(), action, cause }
    }

    /// [`Backpressure::reconcile`] for every assigned partition.
    fn reconcile_all(&mut self) -> Vec<Decision> {
        let parts = self.assigned.clone();
        parts.iter().map(|p| self.reconcile(p)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(n: i32) -> Partition {
        ("charge.upserted".to_string(), n)
    }

    fn bounds(pending: usize, jobs: usize, per_device: usize) -> Bounds {
        Bounds { pending_per_partition: pending, jobs, jobs_per_device: per_device }
    }

    #[test]
    fn low_space_pauses_every_partition_until_there_is_room() {
        let mut b = assigned(bounds(10, 100, 10), &[part(0), part(1)]);
        let d = b.low_space(true);
        assert_eq!(d.len(), 2);
        assert!(d.iter().all(|d| d.action == Some(Action::Pause) && d.cause.low_space && d.cause.is_paused()));
        assert!(b.low_space(true).is_empty(), "no change, no decisions");
        // A rebalance pauses every partition again, the one assigned meanwhile too.
        let d = b.rebalanced(&[], vec![part(0), part(1), part(2)]);
        assert!(d.iter().all(|d| d.cause.low_space && d.action == Some(Action::Pause)), "{d:?}");
        let d = b.low_space(false);
        assert_eq!(d.len(), 3);
        assert!(d.iter().all(|d| d.action == Some(Action::Resume) && !d.cause.is_paused()));
    }

    #[test]
    fn a_held_write_pauses_every_partition_and_keeps_other_causes_on_landing() {
        let mut b = assigned(bounds(2, 100, 10), &[part(0), part(1)]);
        b.record_read(&part(1), 2).expect("part 1 at its pending bound");
        let d = b.write_held(true);
        assert_eq!(acting(&d, Action::Pause), vec![part(0)], "part 1 was paused already");
        assert!(d.iter().all(|d| d.cause.write_held) && b.is_write_held());
        assert!(b.write_held(true).is_empty(), "no change, no decisions");
        let d = b.write_held(false);
        assert_eq!(acting(&d, Action::Resume), vec![part(0)], "part 1 stays paused at its bound");
        assert!(d.iter().all(|d| !d.cause.write_held) && !b.is_write_held());
    }

    /// Backpressure with `assigned` partitions assigned by a first rebalance.
    fn assigned(bounds: Bounds, parts: &[Partition]) -> Backpressure {
        let mut b = Backpressure::new(bounds, HashMap::new());
        let decisions = b.rebalanced(&[], parts.to_vec());
        assert!(decisions.iter().all(|d| d.action.is_none() && !d.cause.is_paused()), "nothing paused at start");
        b
    }

    /// The partitions `decisions` pause or resume, sorted.
    fn acting(decisions: &[Decision], action: Action) -> Vec<Partition> {
        let mut parts: Vec<Partition> =
            decisions.iter().filter(|d| d.action == Some(action)).map(|d| d.part.clone()).collect();
        parts.sort();
        parts
    }

    /// A taken partition stays paused while its state is restored, whatever else resumes
    /// partitions meanwhile, and reads once it is restored; a revoke forgets it.
    #[test]
    fn a_restoring_partition_stays_paused_until_restored() {
        let mut b = assigned(bounds(2, 100, 10), &[part(0), part(1)]);
        let d = b.restoring(&part(1), true).expect("paused");
        assert_eq!((d.action, d.cause.restoring), (Some(Action::Pause), true));
        assert!(b.restoring(&part(1), true).is_none(), "already restoring: nothing changes");
        // The pending bound reached and left again on it: still paused for the restore.
        assert_eq!(b.record_read(&part(1), 2).and_then(|d| d.action), None);
        assert_eq!(b.record_done(&part(1), 0).and_then(|d| d.action), None);
        assert!(b.check_outbox_bound().is_empty());
        let d = b.restoring(&part(1), false).expect("resumed");
        assert_eq!((d.action, d.cause.is_paused()), (Some(Action::Resume), false));

        b.restoring(&part(0), true);
        let d = b.rebalanced(&[part(0)], vec![part(1)]);
        assert!(d.iter().all(|d| !d.cause.restoring), "a revoked partition's restore is forgotten");
        let again = b.rebalanced(&[], vec![part(0), part(1)]);
        assert!(again.iter().all(|d| d.action.is_none() && !d.cause.is_paused()), "{again:?}");
    }

    #[test]
    fn the_pending_bound_pauses_its_partition_and_resumes_at_half() {
        let (p0, p1) = (part(0), part(1));
        let mut b = assigned(bounds(4, 1000, 1000), &[p0.clone(), p1.clone()]);
        for pending in 1..4 {
            assert_eq!(b.record_read(&p0, pending), None);
        }
        let d = b.record_read(&p0, 4).expect("at the bound");
        assert_eq!((d.part, d.action), (p0.clone(), Some(Action::Pause)));
        assert_eq!(d.cause, PauseCause { pending_bound: true, ..PauseCause::default() });
        assert_eq!(b.record_read(&p0, 5), None, "paused already");
        assert_eq!(b.paused_count(), 1);

        assert_eq!(b.record_done(&p0, 3), None, "above half");
        let d = b.record_done(&p0, 2).expect("at half");
        assert_eq!((d.part, d.action), (p0.clone(), Some(Action::Resume)));
        assert!(!d.cause.is_paused());
        assert_eq!(b.record_done(&p0, 1), None);
        assert_eq!(b.record_done(&p1, 0), None, "a partition that was never at its bound");
        assert_eq!(b.paused_count(), 0);
    }

    #[test]
    fn a_device_at_its_bound_pauses_only_the_partitions_that_fed_it() {
        let (p0, p1, p2) = (part(0), part(1), part(2));
        let mut b = assigned(bounds(1000, 1000, 4), &[p0.clone(), p1.clone(), p2.clone()]);
        // p0 feeds the device up to its bound; p2 feeds another device.
        assert!(b.planned(&p0, ["d", "d", "d"]).is_empty());
        assert!(b.planned(&p2, ["e"]).is_empty());
        let d = b.planned(&p0, ["d"]);
        assert_eq!(acting(&d, Action::Pause), vec![p0.clone()]);
        assert_eq!(d[0].cause.devices_at_bound, vec!["d".to_string()]);
        // p1 is known to feed the device only when one of its records does: it pauses then
        // (the bound is soft by that record's jobs).
        let d = b.planned(&p1, ["d", "e"]);
        assert_eq!(acting(&d, Action::Pause), vec![p1.clone()]);
        assert_eq!((b.paused_count(), b.devices_at_bound()), (2, 1));
        assert!(b.planned(&p2, ["e"]).is_empty(), "p2 never fed d");

        // d holds 5: resumed when 2 are left (half of 4), not before.
        assert!(b.finished("d").is_empty());
        assert!(b.finished("d").is_empty());
        let d = b.finished("d");
        assert_eq!(acting(&d, Action::Resume), vec![p0.clone(), p1.clone()]);
        assert!(d.iter().all(|d| !d.cause.is_paused()));
        assert_eq!((b.paused_count(), b.devices_at_bound()), (0, 0));
        assert!(b.finished("e").is_empty());
    }

    #[test]
    fn a_partition_waiting_on_two_devices_resumes_when_both_drained() {
        let p0 = part(0);
        let mut b = assigned(bounds(1000, 1000, 2), std::slice::from_ref(&p0));
        assert_eq!(acting(&b.planned(&p0, ["d", "d", "e", "e"]), Action::Pause), vec![p0.clone()]);
        let d = b.finished("d");
        assert_eq!(d.len(), 1);
        assert_eq!(
            (d[0].action, d[0].cause.devices_at_bound.clone()),
            (None, vec!["e".to_string()]),
            "still waiting on e"
        );
        assert_eq!(acting(&b.finished("e"), Action::Resume), vec![p0]);
    }

    #[test]
    fn the_outbox_bound_pauses_every_assigned_partition_and_resumes_at_half() {
        let (p0, p1, p2) = (part(0), part(1), part(2));
        let mut b = assigned(bounds(1000, 6, 1000), &[p0.clone(), p1.clone(), p2.clone()]);
        assert!(b.planned(&p0, ["a", "b", "c"]).is_empty());
        assert!(b.planned(&p1, ["a", "b"]).is_empty());
        // The sixth job pauses every assigned partition, p2 too, which fed none.
        let d = b.planned(&p1, ["c"]);
        assert_eq!(acting(&d, Action::Pause), vec![p0.clone(), p1.clone(), p2.clone()]);
        assert!(d.iter().all(|d| d.cause == PauseCause { outbox_full: true, ..PauseCause::default() }));
        assert_eq!(b.jobs(), 6);

        assert!(b.finished("a").is_empty(), "5 left");
        assert!(b.finished("b").is_empty(), "4 left");
        let d = b.finished("c");
        assert_eq!(acting(&d, Action::Resume), vec![p0, p1, p2], "3 left: half");
        assert_eq!(b.paused_count(), 0);
    }

    #[test]
    fn a_partition_stays_paused_while_another_reason_holds() {
        let p0 = part(0);
        let mut b = assigned(bounds(2, 4, 1000), std::slice::from_ref(&p0));
        assert_eq!(b.record_read(&p0, 2).and_then(|d| d.action), Some(Action::Pause));
        assert_eq!(
            acting(&b.planned(&p0, ["a", "b", "c", "d"]), Action::Pause),
            Vec::<Partition>::new(),
            "paused already"
        );
        // The outbox drains, the pending bound still holds.
        b.finished("a");
        let d = b.finished("b");
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].action, None);
        assert_eq!(d[0].cause, PauseCause { pending_bound: true, ..PauseCause::default() });
        assert_eq!(b.record_done(&p0, 1).and_then(|d| d.action), Some(Action::Resume));
    }

    #[test]
    fn a_rebalance_drops_revoked_partitions_and_pauses_the_new_assignment_again() {
        let (p0, p1, p2) = (part(0), part(1), part(2));
        let mut b = assigned(bounds(2, 1000, 2), &[p0.clone(), p1.clone()]);
        assert!(b.record_read(&p0, 2).is_some());
        assert_eq!(acting(&b.planned(&p1, ["d", "d"]), Action::Pause), vec![p1.clone()]);
        assert_eq!(b.paused_count(), 2);

        // p0 is revoked, p2 assigned: p1 is paused again (librdkafka forgot), p2 reads.
        let d = b.rebalanced(std::slice::from_ref(&p0), vec![p1.clone(), p2.clone()]);
        assert_eq!(acting(&d, Action::Pause), vec![p1.clone()]);
        assert_eq!(d.iter().find(|d| d.part == p2).map(|d| (d.action, d.cause.is_paused())), Some((None, false)));
        assert!(!d.iter().any(|d| d.part == p0), "a revoked partition is not decided");
        assert_eq!((b.paused_count(), b.devices_at_bound()), (1, 1));
        // p0's pending bound is gone with it: its last records written release nothing.
        assert_eq!(b.record_done(&p0, 0), None);

        // With the outbox at its bound, a rebalance pauses the whole new assignment.
        let mut b = assigned(bounds(1000, 2, 1000), std::slice::from_ref(&p0));
        assert_eq!(acting(&b.planned(&p0, ["a", "b"]), Action::Pause), vec![p0.clone()]);
        let d = b.rebalanced(&[], vec![p0.clone(), p1.clone()]);
        assert_eq!(acting(&d, Action::Pause), vec![p0, p1]);
    }

    #[test]
    fn a_planned_job_the_dedupe_window_left_out_is_counted_out_again() {
        let (p0, p1) = (part(0), part(1));
        let mut b = Backpressure::new(bounds(1000, 4, 1000), HashMap::from([("d".to_string(), 1)]));
        b.rebalanced(&[], vec![p0.clone(), p1.clone()]);
        assert_eq!(b.jobs(), 1, "the outbox's jobs at start count");
        // A record read again after a restart: its three jobs are planned, two were seen.
        assert_eq!(acting(&b.planned(&p0, ["d", "d", "e"]), Action::Pause), vec![p0.clone(), p1.clone()]);
        b.left_out("d");
        b.left_out("e");
        assert_eq!(b.jobs(), 2);
        assert_eq!(acting(&b.check_outbox_bound(), Action::Resume), vec![p0, p1], "2 of 4: half");
        // d holds the job from the start and the one queued.
        b.finished("d");
        b.finished("d");
        assert_eq!(b.jobs(), 0);
    }

    #[test]
    fn jobs_left_out_by_the_dedupe_window_release_their_device() {
        let p0 = part(0);
        let mut b = assigned(bounds(1000, 1000, 4), std::slice::from_ref(&p0));
        // A record read again after a restart: its four jobs reach d's bound when planned…
        assert!(b.planned(&p0, ["d", "d", "d"]).is_empty());
        assert_eq!(acting(&b.planned(&p0, ["d"]), Action::Pause), vec![p0.clone()]);
        // …and the outbox already had them all: nothing will ever finish for d, so being
        // counted out must resume the partition at half.
        assert!(acting(&b.left_out("d"), Action::Resume).is_empty());
        assert_eq!(acting(&b.left_out("d"), Action::Resume), vec![p0.clone()]);
        assert_eq!(b.devices_at_bound(), 0);
        assert!(b.left_out("d").is_empty() && b.left_out("d").is_empty());
        assert_eq!(b.jobs(), 0);
    }

    #[test]
    fn replayed_jobs_count_against_the_bounds() {
        let (p0, p1) = (part(0), part(1));
        let mut b = assigned(bounds(1000, 1000, 2), &[p0.clone(), p1.clone()]);
        assert!(b.replayed("d").is_empty());
        assert!(b.replayed("d").is_empty());
        // d is at its bound through replays alone: the next record that feeds it pauses its
        // partition at once.
        assert_eq!(acting(&b.planned(&p0, ["d"]), Action::Pause), vec![p0.clone()]);
        assert_eq!(b.devices_at_bound(), 1);
        assert_eq!(b.jobs(), 3);
        // A replay is counted in the outbox too.
        let mut b = assigned(bounds(1000, 2, 1000), &[p0.clone(), p1.clone()]);
        assert!(b.replayed("d").is_empty());
        assert_eq!(acting(&b.replayed("e"), Action::Pause), vec![p0, p1]);
    }
}
