//! The last jobs of each device, for the dashboard: what each device was sent and how each
//! job ended, with the wire bytes of the most recent ones so that the dashboard can draw
//! them as the device shows them ([`crate::ops::dashboard`]).
//!
//! Written by the dispatcher: [`Recent::sent`] at a job's first send (its bytes are in hand
//! then, as an `Arc` clone: nothing is copied), [`Recent::finished`] when it leaves its
//! queue. Both are one short mutex hold. Memory is bounded twice: at most
//! `dashboard.recent_per_device` entries per device, and at most
//! `dashboard.kept_job_bytes` of wire bytes in all (the oldest let go first; an entry
//! whose bytes were let go stays listed, without a picture). Nothing here is durable: the
//! outbox is the record.

use bytes::Bytes;
use device_protocol::{EffectKind, Job};
use serde::Serialize;
use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// How a recent job stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RecentState {
    /// Sent, no ack yet.
    Sent,
    /// Acknowledged as done by the device.
    Done,
    /// Dropped because its charge's next screen came first.
    Superseded,
    /// Its time to live passed first.
    Expired,
    /// Dead-lettered (the reason is on the dead letter).
    Failed,
}

/// One recent job of a device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RecentJob {
    /// The job's per-device seq.
    pub seq: u64,
    /// Its message id (the device's dedupe key).
    pub message_id: String,
    /// What it does; `None` until [`Recent::finished`] names it (a job only sent so far
    /// is known by its bytes).
    pub kind: Option<EffectKind>,
    /// The charge it is about; empty until finished.
    pub charge_id: String,
    /// How it stands.
    pub state: RecentState,
    /// Sends so far (1: the first).
    pub attempts: u32,
    /// Wall-clock time of the last change, ms since the Unix epoch.
    pub at_ms: i64,
    /// Whether its wire bytes are still kept (a picture can be drawn).
    pub kept: bool,
}

#[derive(Debug)]
struct Entry {
    job: RecentJob,
    wire: Option<Bytes>,
}

#[derive(Debug, Default)]
struct Inner {
    devices: HashMap<String, VecDeque<Entry>>,
    /// (device, seq) of every entry holding bytes, oldest first; also of some let go
    /// since (skipped when met, swept once they outnumber the live ones).
    kept: VecDeque<(String, u64)>,
    kept_bytes: usize,
    /// Entries holding bytes.
    kept_entries: usize,
}

/// The last jobs per device (see the module docs).
#[derive(Debug)]
pub struct Recent {
    per_device: usize,
    max_bytes: usize,
    inner: Mutex<Inner>,
}

impl Default for Recent {
    fn default() -> Self {
        Recent::new(4, 8 << 20)
    }
}

impl Recent {
    /// At most `per_device` jobs per device (at least 1) and `max_bytes` of wire bytes kept in
    /// all.
    pub fn new(per_device: usize, max_bytes: usize) -> Recent {
        Recent { per_device: per_device.max(1), max_bytes, inner: Mutex::default() }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `device`'s job `seq` (`message_id`) was sent, the `attempt`-th time, as `wire` (the
    /// job's JSON as the device receives it). The bytes are kept from the first send.
    pub fn sent(&self, device: &str, seq: u64, message_id: &str, attempt: u32, wire: &Bytes, at_ms: i64) {
        let mut inner = self.lock();
        let entry = inner.entry(device, seq, message_id, self.per_device, at_ms);
        entry.job.attempts = entry.job.attempts.max(attempt);
        entry.job.at_ms = at_ms;
        let keep = entry.wire.is_none() && wire.len() <= self.max_bytes;
        if keep {
            entry.wire = Some(wire.clone());
            entry.job.kept = true;
            inner.kept_bytes += wire.len();
            inner.kept_entries += 1;
            inner.kept.push_back((device.to_string(), seq));
        }
        inner.trim_bytes(self.max_bytes);
    }

    /// `device`'s `job` (its `seq`, `message_id`, `kind` and `charge_id` are read) left its
    /// queue in `state` (a job that was never sent is listed too, without bytes).
    pub fn finished(&self, device: &str, job: &Job, state: RecentState, at_ms: i64) {
        let mut inner = self.lock();
        let entry = inner.entry(device, job.seq, &job.message_id, self.per_device, at_ms);
        entry.job.kind = Some(job.kind);
        entry.job.charge_id = job.charge_id.clone();
        entry.job.state = state;
        entry.job.at_ms = at_ms;
    }

    /// `device`'s recent jobs, newest first.
    pub fn of_device(&self, device: &str) -> Vec<RecentJob> {
        self.lock().devices.get(device).map(|q| q.iter().rev().map(|e| e.job.clone()).collect()).unwrap_or_default()
    }

    /// The kept wire bytes of `device`'s job `seq`, if it is recent and they are still kept.
    pub fn wire(&self, device: &str, seq: u64) -> Option<Bytes> {
        self.lock().devices.get(device)?.iter().find(|e| e.job.seq == seq)?.wire.clone()
    }

    /// Wire bytes kept now, in all.
    pub fn kept_bytes(&self) -> usize {
        self.lock().kept_bytes
    }
}

impl Inner {
    /// The entry of `device`'s job `seq`, made (and the device's oldest let go beyond
    /// `per_device`) if it is new.
    fn entry(&mut self, device: &str, seq: u64, message_id: &str, per_device: usize, at_ms: i64) -> &mut Entry {
        if !self.devices.contains_key(device) {
            self.devices.insert(device.to_string(), VecDeque::new());
        }
        let queue = self.devices.get_mut(device).expect("inserted above");
        let pos = match queue.iter().position(|e| e.job.seq == seq) {
            Some(p) => p,
            None => {
                let job = RecentJob {
                    seq,
                    message_id: message_id.to_string(),
                    kind: None,
                    charge_id: String::new(),
                    state: RecentState::Sent,
                    attempts: 0,
                    at_ms,
                    kept: false,
                };
                // Jobs of a device arrive in seq order, but a replay or a restart may
                // bring an older one back: keep the queue ordered by seq, and never let the
                // new entry itself go to make room.
                let mut pos = queue.iter().position(|e| e.job.seq > seq).unwrap_or(queue.len());
                queue.insert(pos, Entry { job, wire: None });
                while queue.len() > per_device {
                    let victim = usize::from(pos == 0);
                    if let Some(w) = queue.remove(victim).and_then(|old| old.wire) {
                        self.kept_bytes -= w.len();
                        self.kept_entries -= 1;
                    }
                    if victim < pos {
                        pos -= 1;
                    }
                }
                pos
            }
        };
        &mut self.devices.get_mut(device).expect("entry made above")[pos]
    }

    /// Lets the oldest kept bytes go until at most `max` are kept.
    fn trim_bytes(&mut self, max: usize) {
        while self.kept_bytes > max {
            let Some((device, seq)) = self.kept.pop_front() else { break };
            let Some(e) = self.devices.get_mut(&device).and_then(|q| q.iter_mut().find(|e| e.job.seq == seq)) else {
                // Already let go with its entry (its bytes were counted out then).
                continue;
            };
            if let Some(w) = e.wire.take() {
                self.kept_bytes -= w.len();
                self.kept_entries -= 1;
                e.job.kept = false;
            }
        }
        if self.kept.len() > 2 * self.kept_entries + 64 {
            let Inner { devices, kept, .. } = self;
            kept.retain(|(d, s)| devices.get(d).is_some_and(|q| q.iter().any(|e| e.job.seq == *s && e.wire.is_some())));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(n: usize) -> Bytes {
        Bytes::from(vec![b'x'; n])
    }

    /// Job `seq`, message id `m{seq}`.
    fn job(seq: u64, kind: EffectKind, charge: &str) -> Job {
        Job { seq, ..crate::test_fixtures::job(&format!("m{seq}"), kind, charge) }
    }

    #[test]
    fn keeps_the_last_jobs_per_device_newest_first() {
        let r = Recent::new(2, 1 << 20);
        for seq in 1..=3 {
            r.sent("p1", seq, &format!("m{seq}"), 1, &wire(10), seq as i64);
            r.finished("p1", &job(seq, EffectKind::PrintReceipt, "c"), RecentState::Done, seq as i64);
        }
        let jobs = r.of_device("p1");
        assert_eq!(jobs.iter().map(|j| j.seq).collect::<Vec<_>>(), vec![3, 2]);
        assert!(jobs
            .iter()
            .all(|j| j.kept && j.state == RecentState::Done && j.kind == Some(EffectKind::PrintReceipt)));
        assert_eq!(r.kept_bytes(), 20, "the let-go entry's bytes are counted out");
        assert!(r.wire("p1", 1).is_none());
        assert_eq!(r.wire("p1", 3).map(|w| w.len()), Some(10));
    }

    #[test]
    fn the_byte_budget_lets_the_oldest_bytes_go_and_keeps_the_entries() {
        let r = Recent::new(4, 25);
        r.sent("a", 1, "m1", 1, &wire(10), 1);
        r.sent("b", 1, "m2", 1, &wire(10), 2);
        r.sent("a", 2, "m3", 1, &wire(10), 3);
        assert_eq!(r.kept_bytes(), 20);
        assert!(r.wire("a", 1).is_none(), "the oldest bytes went first");
        assert!(!r.of_device("a")[1].kept);
        assert_eq!(r.of_device("a").len(), 2, "the entry stays listed");
        assert!(r.wire("b", 1).is_some() && r.wire("a", 2).is_some());
        // A job larger than the whole budget is listed without bytes.
        r.sent("c", 1, "m4", 1, &wire(26), 4);
        assert!(!r.of_device("c")[0].kept);
        assert_eq!(r.kept_bytes(), 20);
    }

    #[test]
    fn a_resend_counts_its_attempt_and_keeps_the_first_bytes() {
        let r = Recent::new(4, 100);
        r.sent("a", 7, "m7", 1, &wire(10), 1);
        r.sent("a", 7, "m7", 2, &wire(10), 2);
        let j = &r.of_device("a")[0];
        assert_eq!((j.attempts, j.state, j.at_ms), (2, RecentState::Sent, 2));
        assert_eq!(r.kept_bytes(), 10, "not kept twice");
        r.finished("a", &job(7, EffectKind::DisplayQr, "c1"), RecentState::Superseded, 3);
        let j = &r.of_device("a")[0];
        assert_eq!((j.state, j.charge_id.as_str()), (RecentState::Superseded, "c1"));
    }

    #[test]
    fn the_list_of_kept_bytes_stays_bounded_when_entries_go_by_count() {
        let r = Recent::new(1, 1 << 30);
        for seq in 0..10_000 {
            r.sent("a", seq, "m", 1, &wire(1), 0);
        }
        assert_eq!(r.kept_bytes(), 1);
        assert!(r.lock().kept.len() <= 2 + 64);
    }

    #[test]
    fn an_old_seq_coming_back_is_listed_in_order() {
        let r = Recent::new(2, 100);
        r.sent("a", 5, "m5", 1, &wire(1), 1);
        r.sent("a", 6, "m6", 1, &wire(1), 2);
        r.sent("a", 3, "m3", 1, &wire(1), 3);
        let seqs: Vec<u64> = r.of_device("a").iter().map(|j| j.seq).collect();
        assert_eq!(seqs.len(), 2);
        assert!(seqs.contains(&3), "the replayed job shows: {seqs:?}");
        assert!(r.kept_bytes() <= 2);
    }
}
