//! Inspection of the outbox and the dead letters, as JSON: what `GET /outbox…` and
//! `/deadletters…` answer ([`crate::ops::http`]) and what `pixgate outbox|deadletter`
//! prints ([`crate::cli::inspect`]) when it opens the outbox file itself. Both paths
//! return the same JSON, built here.

use crate::ingest::replay::Replayed;
use crate::model::StoredJob;
use crate::store::{Outbox, OutboxError, ReplayError};
use axum::http::StatusCode;
use serde_json::{json, Value};

/// Why an inspection failed.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    /// Nothing with that name.
    #[error("{0}")]
    NotFound(String),
    /// The replay was refused (see [`ReplayError`]).
    #[error(transparent)]
    Replay(ReplayError),
    /// The outbox could not be read.
    #[error(transparent)]
    Outbox(#[from] OutboxError),
}

impl From<ReplayError> for InspectError {
    fn from(e: ReplayError) -> Self {
        match e {
            ReplayError::NotFound(id) => InspectError::NotFound(format!("no dead letter {id} in the outbox")),
            ReplayError::Outbox(e) => InspectError::Outbox(e),
            e => InspectError::Replay(e),
        }
    }
}

impl InspectError {
    /// The HTTP status for it.
    pub fn status(&self) -> StatusCode {
        match self {
            InspectError::NotFound(_) => StatusCode::NOT_FOUND,
            InspectError::Replay(_) => StatusCode::CONFLICT,
            InspectError::Outbox(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// One line per queued job: no payload (see [`outbox_show`]).
fn job_summary(s: &StoredJob) -> Value {
    json!({
        "device": s.device,
        "seq": s.job.seq,
        "kind": s.job.kind.as_str(),
        "message_id": s.job.message_id,
        "event_id": s.job.event_id,
        "charge_id": s.job.charge_id,
        "content_type": s.job.content_type,
        "payload_bytes": s.job.payload_bytes().map(|b| b.len()).unwrap_or(0),
        "expires_at": s.job.expires_at,
        "source": s.source,
    })
}

/// `{"devices": {id: queued jobs}, "total": n}`.
///
/// # Errors
/// The outbox cannot be read.
pub fn outbox_devices(outbox: &Outbox) -> Result<Value, InspectError> {
    let counts = outbox.queue_depths()?;
    let total: u64 = counts.values().sum();
    Ok(json!({ "devices": counts, "total": total }))
}

/// `{"device": id, "held": why, "jobs": [summary, …]}`, jobs in delivery order (the first
/// may be in flight); `held` is why the running gateway holds the device's queue
/// (`offline`, `paper_out`, `cover_open`; `null`: not held, or read from the outbox file
/// with no gateway running).
///
/// # Errors
/// The outbox cannot be read.
pub fn outbox_list(outbox: &Outbox, device: &str, held: Option<&str>) -> Result<Value, InspectError> {
    let jobs: Vec<Value> = outbox.device_jobs(device)?.iter().map(job_summary).collect();
    Ok(json!({ "device": device, "held": held, "jobs": jobs }))
}

/// One queued job in full: the job as the device will receive it, and its source record.
///
/// # Errors
/// No such job, or the outbox cannot be read.
pub fn outbox_show(outbox: &Outbox, device: &str, seq: u64) -> Result<Value, InspectError> {
    let s = outbox
        .device_jobs(device)?
        .into_iter()
        .find(|s| s.job.seq == seq)
        .ok_or_else(|| InspectError::NotFound(format!("no job {seq} queued for {device}")))?;
    Ok(json!({ "device": s.device, "job": s.job, "source": s.source }))
}

/// `{"deadletters": [{id, state, reason, detail, device, effect, source…}, …]}`, oldest
/// first; `state` is `parked` (Kafka does not have it yet), `published` or `replayed`.
///
/// # Errors
/// The outbox cannot be read.
pub fn deadletter_list(outbox: &Outbox) -> Result<Value, InspectError> {
    let list: Vec<Value> = outbox
        .deadletters()?
        .iter()
        .map(|p| {
            let d = &p.dead_letter;
            json!({
                "id": p.id,
                "state": state(p),
                "reason": d.reason,
                "detail": d.detail,
                "device": d.device,
                "effect": d.effect,
                "message_id": d.message_id,
                "source": format!("{}/{}@{}", d.source_topic, d.source_partition, d.source_offset),
                "replayable": (p.job.is_some() || d.reason.routes_again()) && p.replayed_at_ms.is_none(),
            })
        })
        .collect();
    Ok(json!({ "deadletters": list }))
}

fn state(p: &crate::store::ParkedDeadLetter) -> &'static str {
    match (p.replayed_at_ms, p.published_at_ms) {
        (Some(_), _) => "replayed",
        (None, Some(_)) => "published",
        (None, None) => "parked",
    }
}

/// One dead letter in full.
///
/// # Errors
/// No such dead letter, or the outbox cannot be read.
pub fn deadletter_show(outbox: &Outbox, id: u64) -> Result<Value, InspectError> {
    let p =
        outbox.deadletter(id)?.ok_or_else(|| InspectError::NotFound(format!("no dead letter {id} in the outbox")))?;
    Ok(json!({ "state": state(&p), "deadletter": p }))
}

/// What a replay answers: `{"replayed": job}` for a job's dead letter; for a record's,
/// `{"replayed": [job, …], "deadletters": [id, …]}` (both empty when the charge had moved on
/// and the record had nothing left to do).
pub fn replayed(r: &Replayed) -> Value {
    match r {
        Replayed::Job(stored) => json!({ "replayed": job_summary(stored) }),
        Replayed::Record { jobs, deadletters } => {
            json!({ "replayed": jobs.iter().map(job_summary).collect::<Vec<_>>(), "deadletters": deadletters })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DeadLetter, SourceRef};
    use device_protocol::{EffectKind, Job};

    #[test]
    fn lists_shows_and_replays_once() {
        let (_dir, o) = crate::test_fixtures::temp_outbox("inspect-test");
        let job = Job {
            v: 1,
            message_id: "m1".into(),
            seq: 0,
            kind: EffectKind::PrintReceipt,
            event_id: "e".into(),
            charge_id: "c".into(),
            content_type: "application/vnd.escpos".into(),
            payload: Job::encode_payload(&[0x1B, 0x40]),
            expires_at: None,
        };
        let src = SourceRef { topic: "charge.upserted".into(), partition: 0, offset: 7, key: Some("c".into()) };
        let q = o.accept(None, vec![("p1".into(), job)], &src, 1).unwrap();
        assert_eq!(outbox_devices(&o).unwrap()["devices"]["p1"], 1);
        assert_eq!(outbox_list(&o, "p1", None).unwrap()["jobs"][0]["payload_bytes"], 2);
        assert_eq!(outbox_show(&o, "p1", 1).unwrap()["job"]["message_id"], "m1");
        assert!(matches!(outbox_show(&o, "p1", 9), Err(InspectError::NotFound(_))));

        let id = o
            .fail_job(
                &q[0].stored,
                DeadLetter::for_job(crate::model::DeadLetterReason::Expired, "too late".into(), &q[0].stored),
                2,
            )
            .unwrap();
        assert_eq!(outbox_devices(&o).unwrap()["total"], 0, "a failed job leaves the queue");
        let list = deadletter_list(&o).unwrap();
        assert_eq!(
            (list["deadletters"][0]["state"].as_str(), list["deadletters"][0]["replayable"].as_bool()),
            (Some("parked"), Some(true))
        );
        let stored = o.replay(id, 3, |_| chrono::Duration::seconds(60)).unwrap();
        assert_eq!(
            stored.job.expires_at.map(|t| t.timestamp_millis()),
            Some(60_003),
            "a replayed receipt lives its TTL again"
        );
        assert_eq!((stored.job.seq, stored.job.message_id.as_str()), (2, "m1"), "new seq, same message id");
        assert_eq!(outbox_list(&o, "p1", None).unwrap()["jobs"][0]["seq"], 2);
        assert!(matches!(o.replay(id, 4, |_| chrono::Duration::zero()), Err(ReplayError::AlreadyReplayed(_))));
        assert_eq!(deadletter_show(&o, id).unwrap()["state"], "replayed");

        // A record-level dead letter has no job to replay.
        let a = crate::store::Accept {
            deadletters: vec![DeadLetter::new(
                crate::model::DeadLetterReason::NotJson,
                "x".into(),
                "t",
                0,
                1,
                None,
                b"{",
            )],
            source: Some(src),
            ..Default::default()
        };
        let (_, parked) = o.write(&mut [a], &[], 5).unwrap().pop().unwrap();
        assert!(matches!(o.replay(parked[0], 6, |_| chrono::Duration::zero()), Err(ReplayError::NoJob { .. })));
        assert_eq!(o.parked_deadletters(10).unwrap().len(), 2);
        o.mark_published(&[id, parked[0]], 7).unwrap();
        assert!(o.parked_deadletters(10).unwrap().is_empty());
        assert_eq!(o.prune_deadletters(100).unwrap(), 2);
    }
}
