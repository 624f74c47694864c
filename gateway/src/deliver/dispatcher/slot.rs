//! A device's in-flight slot: the one job between its queue and the device.
//!
//! ```text
//!            taken from the queue (at: now)
//!   Idle ───────────────────────────────────► Scheduled { at }
//!    ▲                                          │   ▲
//!    │ done / failed / expired /                │   │ transient failure (at: now + backoff),
//!    │ no_ack after max deliveries              │   │ device back (at: now)
//!    │                                  sent    ▼   │
//!    └──────────────────────────────── AwaitingAck { deadline }
//!                                         ack timeout: sent again
//! ```
//!
//! Deadlines are [`tokio::time::Instant`]s, so tests run them on paused time. The rules that
//! move a job between these states live in [`super::machine`].

use super::queue::Waiting;
use crate::model::StoredJob;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use tokio::time::Instant;

/// A job taken from its device's queue: sent, or to be sent.
#[derive(Debug)]
pub struct InFlight {
    /// The job without its payload.
    pub stored: StoredJob,
    /// What is sent, and sent again on a resend; `None` until read back from the outbox
    /// when it was not held (or, without an outbox, serialized from `stored`).
    pub wire: Option<Bytes>,
    /// Deliveries so far.
    pub attempts: u32,
    /// When its record was durably accepted, if this run stored it.
    pub accepted_at: Option<Instant>,
    /// When it was first sent.
    pub first_sent: Option<Instant>,
}

impl InFlight {
    /// `w`, taken from the head of its queue, not yet sent.
    pub fn new(w: Waiting) -> InFlight {
        InFlight { stored: w.stored, wire: w.wire, attempts: 0, accepted_at: w.accepted_at, first_sent: None }
    }

    /// Whether its time to live passed by `wall`.
    pub fn expired(&self, wall: DateTime<Utc>) -> bool {
        self.stored.job.expires_at.is_some_and(|at| at <= wall)
    }
}

/// A device's in-flight slot; at most one job per device is in flight.
#[derive(Debug, Default)]
pub enum Slot {
    /// Nothing in flight: the head of the queue goes next.
    #[default]
    Idle,
    /// To be sent (the first time or again) once `at` has come and the device can take it:
    /// just taken from the queue, after a transient failure's backoff, back from offline or
    /// paper out, after a failed read-back, or due while its device cannot take it.
    Scheduled {
        /// The job.
        job: InFlight,
        /// When it may be sent.
        at: Instant,
    },
    /// Sent; its ack is expected by `deadline` (the ack timeout plus the attempt's backoff),
    /// after which it is sent again or, after `max_deliveries`, dead-lettered.
    AwaitingAck {
        /// The job.
        job: InFlight,
        /// When it counts as unacknowledged.
        deadline: Instant,
    },
}

impl Slot {
    /// The job in flight, if any.
    pub fn job(&self) -> Option<&InFlight> {
        match self {
            Slot::Idle => None,
            Slot::Scheduled { job, .. } | Slot::AwaitingAck { job, .. } => Some(job),
        }
    }

    /// When the job in flight is due to be acted on (sent, or found unacknowledged).
    pub fn due(&self) -> Option<Instant> {
        match self {
            Slot::Idle => None,
            Slot::Scheduled { at, .. } => Some(*at),
            Slot::AwaitingAck { deadline, .. } => Some(*deadline),
        }
    }

    /// Whether a job was sent and its ack is awaited.
    pub fn awaiting_ack(&self) -> bool {
        matches!(self, Slot::AwaitingAck { .. })
    }

    /// Takes the job in flight out (the slot is left idle) with when it was due, if it is
    /// due by `now`; otherwise leaves the slot as it is.
    pub fn take_due(&mut self, now: Instant) -> Option<(InFlight, Instant)> {
        match std::mem::take(self) {
            Slot::Scheduled { job, at: due } | Slot::AwaitingAck { job, deadline: due } if due <= now => {
                Some((job, due))
            }
            other => {
                *self = other;
                None
            }
        }
    }

    /// Takes the job in flight out (the slot is left idle) if its message id is
    /// `message_id`; otherwise (nothing in flight, or an ack of an earlier job) leaves the
    /// slot as it is.
    pub fn take_acked(&mut self, message_id: &str) -> Option<InFlight> {
        match std::mem::take(self) {
            Slot::Scheduled { job, .. } | Slot::AwaitingAck { job, .. } if job.stored.job.message_id == message_id => {
                Some(job)
            }
            other => {
                *self = other;
                None
            }
        }
    }

    /// The job in flight, if any, to be sent again at `at` rather than when it was due
    /// (the device is back: now, not after its ack timeout).
    pub fn reschedule(&mut self, at: Instant) {
        *self = match std::mem::take(self) {
            Slot::Idle => Slot::Idle,
            Slot::Scheduled { job, .. } | Slot::AwaitingAck { job, .. } => Slot::Scheduled { job, at },
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn job(id: &str, attempts: u32) -> InFlight {
        let j = device_protocol::Job {
            v: 1,
            message_id: id.into(),
            seq: 1,
            kind: device_protocol::EffectKind::PrintReceipt,
            event_id: format!("ev-{id}"),
            charge_id: "c1".into(),
            content_type: "x".into(),
            payload: String::new(),
            expires_at: None,
        };
        let source = crate::model::SourceRef { topic: "charge.upserted".into(), partition: 0, offset: 1, key: None };
        InFlight {
            stored: StoredJob { device: "d".into(), job: j, source },
            wire: None,
            attempts,
            accepted_at: None,
            first_sent: None,
        }
    }

    #[test]
    fn a_job_is_taken_only_once_due() {
        let t0 = Instant::now();
        let mut slot = Slot::AwaitingAck { job: job("a", 1), deadline: t0 + Duration::from_secs(1) };
        assert!(slot.take_due(t0).is_none(), "not due before its deadline");
        assert!(slot.awaiting_ack(), "left as it was");
        let (taken, due) = slot.take_due(t0 + Duration::from_secs(1)).expect("due at its deadline");
        assert_eq!((taken.stored.job.message_id.as_str(), taken.attempts, due), ("a", 1, t0 + Duration::from_secs(1)));
        assert!(matches!(slot, Slot::Idle));
        assert!(Slot::Idle.take_due(t0).is_none());
    }

    #[test]
    fn only_the_ack_of_the_job_in_flight_takes_it() {
        let t0 = Instant::now();
        let mut slot = Slot::Scheduled { job: job("b", 2), at: t0 };
        assert!(slot.take_acked("a").is_none(), "a late ack of an earlier job");
        assert_eq!(slot.job().map(|j| j.stored.job.message_id.as_str()), Some("b"));
        assert_eq!(slot.take_acked("b").map(|j| j.attempts), Some(2));
        assert!(matches!(slot, Slot::Idle));
        assert!(slot.take_acked("b").is_none(), "a duplicate ack");
    }

    #[test]
    fn rescheduling_keeps_the_attempts_and_stops_awaiting_the_ack() {
        let t0 = Instant::now();
        let mut slot = Slot::AwaitingAck { job: job("a", 3), deadline: t0 + Duration::from_secs(10) };
        slot.reschedule(t0);
        assert!(!slot.awaiting_ack());
        assert_eq!((slot.due(), slot.job().map(|j| j.attempts)), (Some(t0), Some(3)));
        let mut idle = Slot::Idle;
        idle.reschedule(t0);
        assert!(matches!(idle, Slot::Idle), "nothing to reschedule");
    }
}
