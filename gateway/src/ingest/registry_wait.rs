//! No charge judged against a device registry that is behind.
//!
//! The registry is built from `device.upserted`, read by the same consumer as
//! `charge.upserted`, and nothing orders the two topics: after a restart, a rebalance, or a
//! device topic that cannot be read for a while, charges can arrive before the device
//! records that registered their card machines. Routing such a charge would dead-letter
//! it as `unknown_terminal` for good. The rule, also in `fixtures/cdc/README.md`
//! ("Routing") and `docs/design.md`:
//!
//! - A charge whose routing decision is a record-level dead letter that depends on the
//!   registry (`unknown_terminal`, `terminal_of_another_company`: a device record not yet
//!   applied can register the terminal or move it to the charge's company) is not
//!   dead-lettered when read. It is *held*: it and every later record of its partition
//!   wait in memory, in order, and the partition is paused.
//! - pixgate asks Kafka for the end offsets (high watermarks) of every `device.upserted`
//!   partition. A device record that registers a terminal was produced before the
//!   terminal's first charge, and a record this consumer has read was produced before the
//!   question was asked, so it is below those ends.
//! - Once the registry has applied every device record below those ends, the held records
//!   are planned again, in order: a charge read before the question was asked is now
//!   judged, and its dead letter stands if it still has one. A charge read after it needs
//!   an answer asked after it was read. Applied means planned by this consumer in this run
//!   (offset + 1), or below the group's committed offset of a partition this consumer
//!   holds (what earlier runs applied and the outbox restored), or below the partition's
//!   log start (what retention removed can never be applied).
//! - The check runs again on every device record applied and on the consumer's 500 ms
//!   tick. There is no time limit: a device topic that never catches up keeps the charges
//!   waiting and `/readyz` red, saying why, rather than dead-letter them.
//!
//! In the central shape (`cluster.enabled`) the device topic is read outside the group, in
//! full, by every replica ([`crate::ingest::cluster_reader`]): applied then means below the
//! reader's position (which starts where the outbox saved it), and the group's committed
//! offsets say nothing.
//!
//! Held records stay pending in the offset tracker (no offset is stored past them) and
//! count against `kafka.max_pending_per_partition`. A partition revoked in a rebalance
//! drops its held records: its new owner reads them again.
//!
//! Cost: one question to Kafka (metadata, committed offsets, one ListOffsets per device
//! partition) per charge that would otherwise be dead-lettered for a registry reason; every
//! other charge is routed at once.

use crate::ingest::kafka_metadata::{group_positions, topic_partitions, GroupPosition};
use crate::kafka_client;
use crate::model::{DeadLetterReason, Partition};
use crate::telemetry::health::RegistryWaitFact;
use rdkafka::consumer::BaseConsumer;
use rdkafka::message::OwnedMessage;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

/// How a charge record is being planned, for [`RegistryWait::defers`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Judging {
    /// Read from Kafka just now.
    Fresh,
    /// Held, and planned again; read when this many questions had been asked.
    Held(u64),
    /// An operator's replay of its dead letter (`pixgate deadletter replay`): routed with
    /// the registry as it is, and refused rather than dead-lettered again.
    Replay,
}

/// A record-level dead letter the routing decided and [`RegistryWait::defers`] kept from
/// being carried out: the record is held (or, for a replay, the replay refused).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deferred {
    /// The reason it would be dead-lettered for.
    pub reason: DeadLetterReason,
    /// The router's detail.
    pub detail: String,
}

/// A record waiting for the registry.
#[derive(Debug)]
pub struct Held {
    /// The record as read.
    pub msg: OwnedMessage,
    /// Questions asked when it was read: an answer to a later one can judge it.
    pub read_after: u64,
}

/// Where the group and the log stand on one `device.upserted` partition.
pub type DeviceEnd = GroupPosition;

/// The answer to one question: per `device.upserted` partition, or why Kafka gave none.
pub type Answer = Result<BTreeMap<i32, DeviceEnd>, String>;

/// The held records and what they wait for (see the module docs).
#[derive(Debug)]
pub struct RegistryWait {
    device_topic: String,
    /// Per device partition: one past the last record applied in this run.
    applied: HashMap<i32, i64>,
    /// Device partitions this consumer holds.
    assigned: BTreeSet<i32>,
    /// The device topic is read outside the consumer group, every partition (the central
    /// shape): committed offsets do not count, and no device partition is unassigned.
    outside_group: bool,
    held: BTreeMap<Partition, VecDeque<Held>>,
    /// Questions asked so far (numbered from 1).
    asked: u64,
    in_flight: bool,
    /// The newest answer: its question's number and the ends.
    answer: Option<(u64, BTreeMap<i32, DeviceEnd>)>,
    /// The newest question whose ends the registry has caught up with: records read before
    /// it was asked can be judged.
    satisfied: u64,
    /// The last failure to ask, while it lasts.
    failing: Option<String>,
}

impl RegistryWait {
    /// Nothing held, for the registry read from `device_topic`.
    pub fn new(device_topic: &str) -> RegistryWait {
        RegistryWait {
            device_topic: device_topic.to_string(),
            applied: HashMap::new(),
            assigned: BTreeSet::new(),
            outside_group: false,
            held: BTreeMap::new(),
            asked: 0,
            in_flight: false,
            answer: None,
            satisfied: 0,
            failing: None,
        }
    }

    /// The same, for a device topic read outside the consumer group, every partition by
    /// this consumer ([`crate::ingest::cluster_reader`]).
    pub fn outside_group(mut self) -> RegistryWait {
        self.outside_group = true;
        self
    }

    /// Whether a routing decision to dead-letter a whole charge record for `reason` must
    /// not be carried out now: a registry-dependent reason while the registry is not known
    /// to be complete for this record ([`Judging::Fresh`], [`Judging::Held`]), or any reason
    /// under [`Judging::Replay`] (the replay is refused, not dead-lettered again).
    pub fn defers(&self, reason: &DeadLetterReason, judging: Judging) -> bool {
        let registry = reason.depends_on_registry();
        match judging {
            Judging::Replay => true,
            Judging::Fresh => registry,
            Judging::Held(read_after) => registry && read_after >= self.satisfied,
        }
    }

    /// Whether records of `part` are held (a record read from it now must wait behind them).
    pub fn holds(&self, part: &Partition) -> bool {
        self.held.contains_key(part)
    }

    /// Whether any record is held.
    pub fn is_holding(&self) -> bool {
        !self.held.is_empty()
    }

    /// Holds `msg` at the end of its partition's queue.
    pub fn hold(&mut self, part: Partition, msg: OwnedMessage, judging: Judging) {
        let read_after = match judging {
            Judging::Held(k) => k,
            Judging::Fresh | Judging::Replay => self.asked,
        };
        self.held.entry(part).or_default().push_back(Held { msg, read_after });
    }

    /// A device record of `partition` at `offset` was applied to the registry (or judged:
    /// a malformed one is dead-lettered, which finishes it too).
    pub fn device_applied(&mut self, partition: i32, offset: i64) {
        let next = self.applied.entry(partition).or_insert(offset + 1);
        *next = (*next).max(offset + 1);
        self.evaluate();
    }

    /// The consumer's whole assignment now: which device partitions it holds; what is known
    /// of the others is dropped, and so are the held records of charge partitions it lost
    /// (their new owner reads them again).
    pub fn assigned(&mut self, parts: &[Partition]) {
        if !self.outside_group {
            self.assigned = parts.iter().filter(|p| p.0 == self.device_topic).map(|p| p.1).collect();
            let held = &self.assigned;
            self.applied.retain(|p, _| held.contains(p));
        }
        self.held.retain(|part, _| parts.contains(part));
    }

    /// Partitions revoked (assigned again or not): their held records are dropped. The
    /// consumer forgot their offsets and reads them again from the committed offset, so
    /// records still held would be read a second time behind themselves, once more at
    /// each such rebalance.
    pub fn revoked(&mut self, parts: &[Partition]) {
        self.held.retain(|part, _| !parts.contains(part));
    }

    /// The number of a question to ask now, if one is needed: a held record that no
    /// answer yet can judge, and no question in flight. The caller asks
    /// ([`RegistryProbe::ask`]) and hands the answer to [`RegistryWait::answered`].
    pub fn question(&mut self) -> Option<u64> {
        let answered = self.answer.as_ref().map_or(0, |(q, _)| *q);
        let needed = self.held.values().filter_map(VecDeque::front).any(|h| h.read_after >= answered);
        if self.in_flight || !needed {
            return None;
        }
        self.asked += 1;
        self.in_flight = true;
        Some(self.asked)
    }

    /// Kafka answered question `q` (or failed to: asked again at the next tick).
    pub fn answered(&mut self, q: u64, answer: Answer) {
        self.in_flight = false;
        match answer {
            Ok(ends) => {
                self.failing = None;
                if self.answer.as_ref().is_none_or(|(prev, _)| *prev < q) {
                    self.answer = Some((q, ends));
                }
            }
            Err(e) => {
                if self.failing.is_none() {
                    tracing::warn!(error = %e, topic = %self.device_topic, "cannot ask Kafka for the device topic's end offsets; charges keep waiting, asked again in 500 ms");
                }
                self.failing = Some(e);
            }
        }
        self.evaluate();
    }

    /// Records the newest answer as satisfied when the registry has caught up with it.
    fn evaluate(&mut self) {
        if let Some((q, ends)) = &self.answer {
            if *q > self.satisfied && ends.iter().all(|(p, e)| self.done(*p, e) >= e.end) {
                self.satisfied = *q;
            }
        }
    }

    /// Records of device partition `p` below this offset are applied (see the module docs).
    fn done(&self, p: i32, e: &DeviceEnd) -> i64 {
        let committed = if !self.outside_group && self.assigned.contains(&p) { e.committed.unwrap_or(-1) } else { -1 };
        e.low.max(committed).max(self.applied.get(&p).copied().unwrap_or(-1))
    }

    /// Takes the queues whose first record can now be judged, each whole and in order: the
    /// caller plans them again (a record that must wait again is held anew, and the rest of
    /// its queue behind it).
    pub fn take_ready(&mut self) -> Vec<(Partition, VecDeque<Held>)> {
        let ready: Vec<Partition> = self
            .held
            .iter()
            .filter(|(_, q)| q.front().is_some_and(|h| h.read_after < self.satisfied))
            .map(|(p, _)| p.clone())
            .collect();
        ready.into_iter().filter_map(|p| self.held.remove(&p).map(|q| (p, q))).collect()
    }

    /// What readiness reports while records are held; `None` when none is.
    pub fn fact(&self) -> Option<RegistryWaitFact> {
        if self.held.is_empty() {
            return None;
        }
        let (behind, unassigned) = match &self.answer {
            Some((_, ends)) => {
                let behind: u64 = ends.iter().map(|(p, e)| (e.end - self.done(*p, e)).max(0) as u64).sum();
                let unassigned = ends
                    .iter()
                    .filter(|(p, e)| self.done(**p, e) < e.end && !self.outside_group && !self.assigned.contains(p))
                    .map(|(p, _)| *p)
                    .collect();
                (Some(behind), unassigned)
            }
            None => (None, Vec::new()),
        };
        Some(RegistryWaitFact {
            held: self.held.iter().map(|(p, q)| (p.clone(), q.len())).collect(),
            device_topic: self.device_topic.clone(),
            behind,
            unassigned,
            error: self.failing.clone(),
        })
    }
}

/// Asks Kafka for the `device.upserted` ends: a bare client (created on first use) in the
/// gateway's consumer group that never joins it, only reads its committed offsets.
pub struct RegistryProbe {
    brokers: String,
    group: String,
    client: Option<Arc<BaseConsumer>>,
}

impl RegistryProbe {
    /// A probe of `brokers` (`kafka.brokers`) for consumer group `group` (`kafka.group_id`).
    pub fn new(brokers: &str, group: &str) -> RegistryProbe {
        RegistryProbe { brokers: brokers.to_string(), group: group.to_string(), client: None }
    }

    /// The client, created on first use.
    ///
    /// # Errors
    /// librdkafka refuses the configuration (the text of its error).
    pub fn client(&mut self) -> Result<Arc<BaseConsumer>, String> {
        if let Some(c) = &self.client {
            return Ok(c.clone());
        }
        let c: BaseConsumer = kafka_client::client(&self.brokers)
            .set("group.id", &self.group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .create()
            .map_err(|e| e.to_string())?;
        let c = Arc::new(c);
        self.client = Some(c.clone());
        Ok(c)
    }

    /// Blocking: every partition of `topic` with its log start, the group's committed
    /// offset and its end (each request waits at most `timeout`).
    ///
    /// # Errors
    /// Kafka did not answer, or the topic has no partitions (the error's text).
    pub fn ask(client: &BaseConsumer, topic: &str, timeout: Duration) -> Answer {
        let parts = topic_partitions(client, topic, timeout).map_err(|e| format!("metadata of {topic}: {e}"))?;
        if parts.is_empty() {
            return Err(format!("{topic} has no partitions in Kafka's metadata"));
        }
        let out = group_positions(client, topic, &parts, timeout)?;
        // Serve the client's own events (errors, logs) so they do not pile up.
        let _ = client.poll(Duration::ZERO);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::message::{Message, Timestamp};

    const DV: &str = "device.upserted";

    fn ch(p: i32) -> Partition {
        ("charge.upserted".to_string(), p)
    }

    fn msg(p: i32, offset: i64) -> OwnedMessage {
        OwnedMessage::new(
            Some(b"{}".to_vec()),
            None,
            "charge.upserted".into(),
            Timestamp::NotAvailable,
            p,
            offset,
            None,
        )
    }

    fn ends(parts: &[(i32, i64, Option<i64>, i64)]) -> Answer {
        Ok(parts.iter().map(|&(p, low, committed, end)| (p, DeviceEnd { low, committed, end })).collect())
    }

    fn offsets(q: &VecDeque<Held>) -> Vec<i64> {
        q.iter().map(|h| h.msg.offset()).collect()
    }

    #[test]
    fn only_registry_reasons_wait_and_a_replay_is_never_dead_lettered_again() {
        let w = RegistryWait::new(DV);
        assert!(w.defers(&DeadLetterReason::UnknownTerminal, Judging::Fresh));
        assert!(w.defers(&DeadLetterReason::TerminalOfAnotherCompany, Judging::Fresh));
        assert!(!w.defers(&DeadLetterReason::TerminalIsNotACardMachine, Judging::Fresh));
        assert!(!w.defers(&DeadLetterReason::NotJson, Judging::Held(0)));
        assert!(w.defers(&DeadLetterReason::NotJson, Judging::Replay));
    }

    #[test]
    fn held_records_wait_until_the_registry_reaches_the_ends_asked_after_them() {
        let mut w = RegistryWait::new(DV);
        w.assigned(&[(DV.to_string(), 0), (DV.to_string(), 1), ch(0), ch(1)]);
        w.device_applied(0, 4);
        // A charge with an unknown terminal: held, and a question is needed.
        w.hold(ch(0), msg(0, 10), Judging::Fresh);
        w.hold(ch(0), msg(0, 11), Judging::Fresh);
        assert!(w.holds(&ch(0)) && !w.holds(&ch(1)));
        let q = w.question().expect("a question");
        assert_eq!(w.question(), None, "one in flight at a time");
        // Kafka: device/0 ends at 8 (5 applied), device/1 at 3 with 3 committed.
        w.answered(q, ends(&[(0, 0, Some(2), 8), (1, 0, Some(3), 3)]));
        assert!(w.take_ready().is_empty(), "registry behind");
        let f = w.fact().unwrap();
        assert_eq!((f.behind, f.held.clone(), f.unassigned.clone()), (Some(3), vec![(ch(0), 2)], vec![]));
        assert!(w.defers(&DeadLetterReason::UnknownTerminal, Judging::Held(0)));
        for o in 5..=7 {
            w.device_applied(0, o);
        }
        let ready = w.take_ready();
        assert_eq!(ready.len(), 1);
        assert_eq!(offsets(&ready[0].1), vec![10, 11], "whole queue, in order");
        assert!(!w.defers(&DeadLetterReason::UnknownTerminal, Judging::Held(ready[0].1[0].read_after)), "judged now");
        assert!(
            w.defers(&DeadLetterReason::UnknownTerminal, Judging::Fresh),
            "a record read after the question needs another"
        );
        assert!(w.fact().is_none() && !w.is_holding());
    }

    #[test]
    fn a_partition_revoked_and_assigned_again_holds_nothing_from_before() {
        let mut w = RegistryWait::new(DV);
        let parts = [(DV.to_string(), 0), ch(0), ch(1)];
        w.assigned(&parts);
        w.hold(ch(0), msg(0, 10), Judging::Fresh);
        w.hold(ch(1), msg(1, 20), Judging::Fresh);
        w.revoked(&[ch(0)]);
        w.assigned(&parts);
        assert!(!w.holds(&ch(0)), "read again from its committed offset: nothing held twice");
        assert!(w.holds(&ch(1)), "a partition not revoked keeps its held records");
    }

    #[test]
    fn a_record_read_after_the_question_needs_a_new_one() {
        let mut w = RegistryWait::new(DV);
        w.assigned(&[(DV.to_string(), 0), ch(0), ch(1)]);
        w.hold(ch(0), msg(0, 1), Judging::Fresh);
        let q1 = w.question().unwrap();
        // Meanwhile another partition holds a charge read after q1 was asked.
        w.hold(ch(1), msg(1, 1), Judging::Fresh);
        w.answered(q1, ends(&[(0, 0, None, 0)]));
        let ready = w.take_ready();
        assert_eq!(ready.iter().map(|(p, _)| p.clone()).collect::<Vec<_>>(), vec![ch(0)]);
        assert!(w.holds(&ch(1)));
        let q2 = w.question().expect("ch/1's record needs a question asked after it");
        assert!(q2 > q1);
        w.answered(q2, ends(&[(0, 0, None, 0)]));
        assert_eq!(w.take_ready().len(), 1);
    }

    #[test]
    fn a_failed_question_is_asked_again_and_readiness_says_why() {
        let mut w = RegistryWait::new(DV);
        w.assigned(&[(DV.to_string(), 0), ch(0)]);
        w.hold(ch(0), msg(0, 1), Judging::Fresh);
        let q = w.question().unwrap();
        w.answered(q, Err("metadata of device.upserted: timed out".into()));
        assert_eq!(w.fact().unwrap().error.as_deref(), Some("metadata of device.upserted: timed out"));
        assert!(w.take_ready().is_empty());
        assert!(w.question().is_some(), "asked again");
    }

    #[test]
    fn committed_offsets_count_only_for_partitions_held_and_log_start_always() {
        let mut w = RegistryWait::new(DV);
        w.assigned(&[(DV.to_string(), 0), ch(0)]);
        w.hold(ch(0), msg(0, 1), Judging::Fresh);
        let q = w.question().unwrap();
        // device/1 is not ours: another member's commit says nothing of our registry.
        w.answered(q, ends(&[(0, 0, Some(9), 9), (1, 5, Some(9), 9)]));
        assert!(w.take_ready().is_empty());
        let f = w.fact().unwrap();
        assert_eq!((f.behind, f.unassigned), (Some(4), vec![1]));
        w.assigned(&[(DV.to_string(), 0), (DV.to_string(), 1), ch(0)]);
        w.device_applied(1, 8);
        assert_eq!(w.take_ready().len(), 1);
    }

    #[test]
    fn outside_the_group_committed_offsets_never_count_and_no_device_partition_is_unassigned() {
        let mut w = RegistryWait::new(DV).outside_group();
        w.assigned(&[ch(0)]);
        // Where the reader started (saved by an earlier run) counts as applied.
        w.device_applied(0, 6);
        w.hold(ch(0), msg(0, 1), Judging::Fresh);
        let q = w.question().unwrap();
        // A commit left by an edge-box run of the same group id says nothing.
        w.answered(q, ends(&[(0, 0, Some(9), 9), (1, 0, Some(4), 4)]));
        assert!(w.take_ready().is_empty());
        let f = w.fact().unwrap();
        assert_eq!((f.behind, f.unassigned), (Some(6), vec![]));
        w.assigned(&[ch(0), ch(1)]);
        w.device_applied(0, 8);
        assert!(w.take_ready().is_empty(), "device/1 still behind");
        w.device_applied(1, 3);
        assert_eq!(w.take_ready().len(), 1);
    }

    #[test]
    fn a_revoked_partition_drops_its_held_records() {
        let mut w = RegistryWait::new(DV);
        w.assigned(&[(DV.to_string(), 0), ch(0)]);
        w.hold(ch(0), msg(0, 1), Judging::Fresh);
        w.assigned(&[(DV.to_string(), 0)]);
        assert!(!w.is_holding());
        assert_eq!(w.question(), None);
    }
}
