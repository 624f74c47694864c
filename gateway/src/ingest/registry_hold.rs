//! The consumer loop's side of [`crate::ingest::registry_wait`]: holding a charge
//! partition whose record would be dead-lettered for a registry reason, asking Kafka how
//! far the device topic goes (on a blocking thread; the answer comes back to the loop as
//! an event), and handing the held records back, in order, once the registry has caught up.
//!
//! The loop plans what comes back exactly as a record just read ([`crate::ingest::plan`]),
//! and pauses or resumes the partition through
//! [`crate::ingest::backpressure::Backpressure::registry_wait`].
//!
//! Also here, for testing only: `kafka.hold_device_topic_ms` keeps the device topic paused
//! for a while after the start, so that charges arrive while the registry is behind.

use crate::config::Config;
use crate::ingest::registry_wait::{Answer, Held, Judging, RegistryProbe, RegistryWait};
use crate::model::{DeadLetterReason, Partition};
use crate::telemetry::Monitor;
use rdkafka::message::{Message, OwnedMessage};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// How long each request of a question to Kafka may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// A question's number and Kafka's answer, back to the loop.
pub type RegistryAnswer = (u64, Answer);

/// The held records, the questions to Kafka, and what readiness is told.
pub struct RegistryHold {
    wait: RegistryWait,
    probe: RegistryProbe,
    /// Where the answers go back to the loop.
    answers: mpsc::UnboundedSender<RegistryAnswer>,
    device_topic: String,
    health: Arc<Monitor>,
    /// `kafka.hold_device_topic_ms` (zero: off).
    hold_device_topic: Duration,
    started: Instant,
    /// The device topic's test hold has passed.
    device_topic_released: bool,
}

impl RegistryHold {
    /// Nothing held, for `cfg`'s device topic and consumer group; the receiver gets the
    /// answers to the questions asked (one question in flight at a time).
    pub fn new(cfg: &Config, health: Arc<Monitor>) -> (RegistryHold, mpsc::UnboundedReceiver<RegistryAnswer>) {
        let (answers, rx) = mpsc::unbounded_channel();
        let hold = RegistryHold {
            wait: if cfg.cluster.enabled {
                RegistryWait::new(&cfg.kafka.device_topic).outside_group()
            } else {
                RegistryWait::new(&cfg.kafka.device_topic)
            },
            probe: RegistryProbe::new(&cfg.kafka.brokers, &cfg.kafka.group_id),
            answers,
            device_topic: cfg.kafka.device_topic.clone(),
            health,
            hold_device_topic: Duration::from_millis(cfg.kafka.hold_device_topic_ms),
            started: Instant::now(),
            device_topic_released: false,
        };
        (hold, rx)
    }

    /// Whether records of `part` are held (a record read from it now waits behind them).
    pub fn holds(&self, part: &Partition) -> bool {
        self.wait.holds(part)
    }

    /// Whether any record is held.
    pub fn is_holding(&self) -> bool {
        self.wait.is_holding()
    }

    /// Whether a whole-record dead letter for `reason` must not be carried out now (see
    /// [`RegistryWait::defers`]).
    pub fn defers(&self, reason: &DeadLetterReason, judging: Judging) -> bool {
        self.wait.defers(reason, judging)
    }

    /// Holds `m` at the end of its partition's queue and asks Kafka if needed. True when
    /// the partition held nothing before: the caller pauses it.
    pub fn hold(&mut self, part: Partition, m: OwnedMessage, judging: Judging) -> bool {
        let first = !self.wait.holds(&part);
        if first {
            tracing::info!(topic = %part.0, partition = part.1, offset = m.offset(), "a charge's terminal is not (or not so) in the device registry: holding its partition until the registry has caught up with the device topic");
        }
        self.wait.hold(part, m, judging);
        self.settle();
        first
    }

    /// Puts back a record taken by [`RegistryHold::take_ready`] behind one of its
    /// partition that had to wait again.
    pub fn hold_again(&mut self, part: Partition, h: Held) {
        self.wait.hold(part, h.msg, Judging::Held(h.read_after));
    }

    /// A device record of `partition` at `offset` was planned.
    pub fn device_applied(&mut self, partition: i32, offset: i64) {
        self.wait.device_applied(partition, offset);
    }

    /// Kafka answered question `q`.
    pub fn answered(&mut self, q: u64, answer: Answer) {
        self.wait.answered(q, answer);
    }

    /// The queues whose first record can be judged now, each whole and in order: the
    /// caller plans them again (with [`Judging::Held`]), and puts back with
    /// [`RegistryHold::hold_again`] what follows a record that had to wait again. Call
    /// [`RegistryHold::settle`] once done.
    pub fn take_ready(&mut self) -> Vec<(Partition, VecDeque<Held>)> {
        self.wait.take_ready()
    }

    /// Asks Kafka if a held record needs a (new) answer, and tells readiness what is held.
    pub fn settle(&mut self) {
        self.ask();
        self.health.registry_wait(self.wait.fact());
    }

    /// Partitions revoked in a rebalance, assigned again or not: what they held is
    /// dropped ([`RegistryWait::revoked`]).
    pub fn revoked(&mut self, parts: &[Partition]) {
        self.wait.revoked(parts);
        self.health.registry_wait(self.wait.fact());
    }

    /// The consumer's whole assignment after a rebalance (held records of partitions it
    /// lost are dropped: their new owner reads them again).
    pub fn assigned(&mut self, parts: &[Partition]) {
        self.wait.assigned(parts);
        self.health.registry_wait(self.wait.fact());
    }

    /// The topic to keep paused now for `kafka.hold_device_topic_ms` (testing only).
    pub fn held_topic(&self) -> Option<String> {
        let held = !self.hold_device_topic.is_zero()
            && !self.device_topic_released
            && self.started.elapsed() < self.hold_device_topic;
        held.then(|| self.device_topic.clone())
    }

    /// True once, when `kafka.hold_device_topic_ms` has just passed: the caller resumes
    /// the device topic.
    pub fn device_topic_due(&mut self) -> bool {
        if self.hold_device_topic.is_zero()
            || self.device_topic_released
            || self.started.elapsed() < self.hold_device_topic
        {
            return false;
        }
        self.device_topic_released = true;
        tracing::warn!(
            hold_ms = self.hold_device_topic.as_millis() as u64,
            "kafka.hold_device_topic_ms (testing) has passed: reading the device topic"
        );
        true
    }

    /// Asks Kafka for the device topic's ends when a held record needs a (new) answer.
    fn ask(&mut self) {
        let Some(q) = self.wait.question() else { return };
        let client = match self.probe.client() {
            Ok(c) => c,
            Err(e) => {
                self.wait.answered(q, Err(format!("cannot create the Kafka client that asks: {e}")));
                return;
            }
        };
        let (topic, answers) = (self.device_topic.clone(), self.answers.clone());
        tokio::task::spawn_blocking(move || {
            let answer = RegistryProbe::ask(&client, &topic, ASK_TIMEOUT);
            if answers.send((q, answer)).is_err() {
                // The loop is gone (shutdown): the held records are read again at the next
                // start, since no offset was stored past them.
                tracing::debug!("registry answer after the consumer loop ended");
            }
        });
    }
}
