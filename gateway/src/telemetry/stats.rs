//! Counters and gauges the gateway reports on `/stats` and uses for `/readyz`.
//!
//! Every record read ends in exactly one of: finished with effects, ignored (by reason),
//! or dead-lettered (by reason), so `events_read` = `records_with_effects` + the sum of
//! `ignored` + the sum of `dead_lettered_records`. Dead-lettered *effects* (one effect of a
//! record that had others) are counted separately.
//!
//! `/stats` serves these counters with the health monitor's per-topic view and the
//! readiness reasons beside them (`ops::report`); `/metrics` the same as Prometheus text.

use crate::model::{DeadLetterReason, IgnoreReason};
use crate::telemetry::latency::{Histogram, Stage};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A snapshot of the counters, as served on `/stats` (beside the health view).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Records read, by topic.
    pub events_read: BTreeMap<String, u64>,
    /// Records with no effect by design, by reason.
    pub ignored: BTreeMap<String, u64>,
    /// Whole records sent to the dead-letter topic, by reason.
    pub dead_lettered_records: BTreeMap<String, u64>,
    /// Single effects sent to the dead-letter topic, by reason.
    pub dead_lettered_effects: BTreeMap<String, u64>,
    /// Records whose effects were planned (some may have been dead-lettered).
    pub records_with_effects: u64,
    /// Device registry events applied.
    pub devices_applied: u64,
    /// Effects decided but left out because their kind is switched off (effect flags), by
    /// kind: never queued nor dead-lettered.
    pub skipped_by_flag: BTreeMap<String, u64>,
    /// Effects acknowledged as done by their device, by kind.
    pub effects_done: BTreeMap<String, u64>,
    /// Queued `display_qr` jobs dropped because their charge's next screen came first.
    pub superseded: u64,
    /// Jobs whose time to live passed before they were done, by kind (recorded on the
    /// dead-letter topic with reason `expired`).
    pub expired: BTreeMap<String, u64>,
    /// Dead letters waiting in the outbox for Kafka (grows while Kafka is unreachable).
    pub deadletters_parked: u64,
    /// Dead letters Kafka acknowledged.
    pub deadletters_published: u64,
    /// Devices whose queue is at `outbox.max_jobs_per_device` (their partitions are paused).
    pub devices_at_bound: u64,
    /// Job sends beyond the first (ack timeout or transient failure).
    pub job_redeliveries: u64,
    /// Records read and not yet finished.
    pub pending_records: u64,
    /// Jobs waiting or in flight, all devices (the dispatcher's view).
    pub queued_jobs: u64,
    /// Jobs in the durable outbox (the consumer's view; the bound applies to this).
    pub outbox_jobs: u64,
    /// Partitions currently paused for backpressure.
    pub paused_partitions: u64,
    /// Partitions assigned to this consumer.
    pub assigned_partitions: u64,
    /// Milliseconds since the consumer loop last ran (a dead or stuck consumer grows this).
    pub consumer_idle_ms: u64,
    /// Whether the consumer loop is running.
    pub consumer_running: bool,
    /// Devices connected to the MQTT listener now.
    pub mqtt_connected: u64,
    /// Sockets, CONNECTs and packets the MQTT listener refused, by rule
    /// (`deliver::mqtt::access::Rule`).
    pub mqtt_refusals: BTreeMap<String, u64>,
    /// Connections and requests the CloudPRNT server refused, by rule
    /// (`deliver::cloudprnt::server::Refusal`).
    pub cloudprnt_refusals: BTreeMap<String, u64>,
    /// Polls the CloudPRNT server answered (authenticated, within their rate).
    pub cloudprnt_polls: u64,
    /// Polls the Epson Server Direct Print server answered (authenticated, within their
    /// rate).
    #[serde(default)]
    pub sdp_polls: u64,
    /// Printers' requests for a queue another replica holds (the central shape,
    /// `deliver::cloudprnt::forward`), by outcome: `forwarded` (passed on and answered),
    /// `failed` (the owner did not answer), `no_owner` (none known yet), `not_owner` (passed
    /// on to this replica, which no longer holds the queue).
    #[serde(default)]
    pub cloudprnt_forwards: BTreeMap<String, u64>,
    /// Requests to an admin endpoint refused with 401 (no token, a wrong one, or no token
    /// configured on a listener that is not loopback; [`crate::ops::admin`]).
    pub http_unauthorized: u64,
    /// Devices whose queue is held by their last status, by why: `offline` (away,
    /// unplugged, unreachable), `paper_out`, `cover_open`. Counted when served.
    pub held_devices: BTreeMap<String, u64>,
    /// Times this replica rejoined a consumer group that gave it no partition of a topic
    /// (`ingest::group_watch`), by group.
    pub group_rejoins: BTreeMap<String, u64>,
    /// Latency by stage ([`Stage::as_str`]: `kafka`, `accept`, `queue`, `device`), since
    /// start; a stage appears with its first observation.
    #[serde(default)]
    pub stage_latency: BTreeMap<String, Histogram>,
}

/// Shared counters. Cheap enough for our rates: one short mutex hold per event.
#[derive(Debug)]
pub struct Stats {
    inner: Mutex<Snapshot>,
    last_poll: Mutex<Instant>,
    /// Device → why its queue is held ([`Stats::device_status`]).
    held: Mutex<BTreeMap<String, &'static str>>,
}

impl Default for Stats {
    fn default() -> Self {
        Stats { inner: Mutex::new(Snapshot::default()), last_poll: Mutex::new(Instant::now()), held: Mutex::default() }
    }
}

fn bump(map: &mut BTreeMap<String, u64>, key: &str) {
    *map.entry(key.to_string()).or_default() += 1;
}

impl Stats {
    /// Applies `f` to the counters.
    pub fn update(&self, f: impl FnOnce(&mut Snapshot)) {
        f(&mut self.inner.lock().expect("stats lock"));
    }

    /// The MQTT listener refused something by `rule`.
    pub fn mqtt_refused(&self, rule: &str) {
        self.update(|s| bump(&mut s.mqtt_refusals, rule));
    }

    /// The CloudPRNT server refused something by `rule`.
    pub fn cloudprnt_refused(&self, rule: &str) {
        self.update(|s| bump(&mut s.cloudprnt_refusals, rule));
    }

    /// A printer's request for another replica's queue ended in `outcome`.
    pub fn cloudprnt_forwarded(&self, outcome: &str) {
        self.update(|s| bump(&mut s.cloudprnt_forwards, outcome));
    }

    /// A record was ignored for `reason`.
    pub fn ignored(&self, reason: IgnoreReason) {
        self.update(|s| bump(&mut s.ignored, reason.as_str()));
    }

    /// A whole record was dead-lettered for `reason`.
    pub fn dead_record(&self, reason: &DeadLetterReason) {
        let reason = reason.to_string();
        self.update(|s| bump(&mut s.dead_lettered_records, &reason));
    }

    /// One effect was dead-lettered for `reason`.
    pub fn dead_effect(&self, reason: &DeadLetterReason) {
        let reason = reason.to_string();
        self.update(|s| bump(&mut s.dead_lettered_effects, &reason));
    }

    /// An effect of `kind` was left out: its kind is switched off.
    pub fn skipped_by_flag(&self, kind: &str) {
        self.update(|s| bump(&mut s.skipped_by_flag, kind));
    }

    /// A job of `kind` expired before it was done.
    pub fn expired(&self, kind: &str) {
        self.update(|s| bump(&mut s.expired, kind));
    }

    /// A device acknowledged an effect of `kind` as done.
    pub fn effect_done(&self, kind: &str) {
        self.update(|s| bump(&mut s.effects_done, kind));
    }

    /// `stage` took `d` for one record or job.
    pub fn observe(&self, stage: Stage, d: Duration) {
        self.update(|s| match s.stage_latency.get_mut(stage.as_str()) {
            Some(h) => h.observe(d),
            None => s.stage_latency.entry(stage.as_str().to_string()).or_default().observe(d),
        });
    }

    /// The consumer loop is alive now.
    pub fn polled(&self) {
        *self.last_poll.lock().expect("poll lock") = Instant::now();
    }

    /// Records read so far, per topic.
    pub fn events_read(&self) -> BTreeMap<String, u64> {
        self.inner.lock().expect("stats lock").events_read.clone()
    }

    /// Milliseconds since the consumer loop last ran ([`Stats::polled`]).
    pub fn idle_ms(&self) -> u64 {
        self.last_poll.lock().expect("poll lock").elapsed().as_millis() as u64
    }

    /// A device's last status: `held` is why its queue is held (`offline`, `paper_out`,
    /// `cover_open`), `None` when it can take jobs.
    pub fn device_status(&self, device: &str, held: Option<&'static str>) {
        let mut m = self.held.lock().expect("held lock");
        match held {
            Some(why) => m.insert(device.to_string(), why),
            None => m.remove(device),
        };
    }

    /// Why `device`'s queue is held, if it is.
    pub fn held(&self, device: &str) -> Option<&'static str> {
        self.held.lock().expect("held lock").get(device).copied()
    }

    /// Every device whose queue is held now, with why.
    pub fn held_all(&self) -> BTreeMap<String, &'static str> {
        self.held.lock().expect("held lock").clone()
    }

    /// The current counters, `consumer_idle_ms` as of now.
    pub fn snapshot(&self) -> Snapshot {
        let mut s = self.inner.lock().expect("stats lock").clone();
        s.consumer_idle_ms = self.idle_ms();
        for why in self.held.lock().expect("held lock").values() {
            bump(&mut s.held_devices, why);
        }
        s
    }
}
