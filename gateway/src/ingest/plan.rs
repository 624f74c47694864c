//! Planning: one Kafka record into an [`Accept`], everything the outbox must store for it.
//!
//! A `device.upserted` record is a registry change: applied to the in-memory registry at
//! once (so the next charge routes by it) and stored with its batch. A `charge.upserted`
//! record is decoded with `cdc`, routed (which effect for which device) and rendered into
//! one job per effect. What cannot be decoded, routed or rendered becomes a dead letter
//! with its reason: the whole record's, or one effect's beside the jobs of the others.
//! Nothing here touches the disk except the router reading a charge's state back from the
//! outbox when it is not cached.
//!
//! A whole-record dead letter the caller's `defer` rule keeps back (a charge whose
//! terminal the registry may not know yet: [`crate::ingest::registry_wait`]) is not
//! planned: [`Planner::plan`] answers [`Deferred`] and changes nothing, since the router
//! applies no state for a dead letter. A tombstone (a null value) is ignored
//! ([`Planner::tombstone`]).

use crate::clock::Clock;
use crate::config::{Config, TtlConfig};
use crate::ingest::registry_wait::Deferred;
use crate::model::{DeadLetter, DeadLetterReason, DirectPrinters, DirectSettings, Directory, IgnoreReason, SourceRef};
use crate::route::registry::{Applied, Registry};
use crate::route::render as jobs;
use crate::route::router::{Decision, Router};
use crate::store::{Accept, ChargeState, DeviceEntry, Outbox, OutboxError};
use crate::telemetry::Stats;
use cdc::ChargeRecord;
use std::sync::Arc;

/// Where a record came from: its place in Kafka and its bytes.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    /// Topic.
    pub topic: &'a str,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Key, if any.
    pub key: Option<&'a [u8]>,
    /// Value (empty when the record has none).
    pub value: &'a [u8],
}

/// Where `src` came from, as stored with its effects.
fn source_ref(src: &Source<'_>) -> SourceRef {
    SourceRef {
        topic: src.topic.to_string(),
        partition: src.partition,
        offset: src.offset,
        key: src.key.map(|k| String::from_utf8_lossy(k).into_owned()),
    }
}

/// Turns records into [`Accept`]s: the registry, the router and what rendering needs.
pub struct Planner {
    /// Records of this topic are registry changes; of any other, charge changes.
    device_topic: String,
    /// Time zone of a device that names none.
    default_time_zone: String,
    /// Jobs' times to live, by kind.
    ttl: TtlConfig,
    stats: Arc<Stats>,
    /// Stamps the jobs' `expires_at`.
    clock: Clock,
    registry: Registry,
    router: Router,
}

impl Planner {
    /// A planner for `cfg`'s topics, with the device registry restored from `outbox` (and
    /// told to `directory`, its direct printers to `printers`) and a
    /// router that reads charge states back from it (cached: `outbox.charge_cache_entries`,
    /// at least four batches' worth).
    ///
    /// # Errors
    /// The outbox cannot be read.
    pub fn restore(
        cfg: &Config,
        stats: Arc<Stats>,
        clock: Clock,
        outbox: &Arc<Outbox>,
        directory: Arc<Directory>,
        printers: Arc<DirectPrinters>,
    ) -> Result<Planner, OutboxError> {
        let mut registry = Registry::with_directory(directory).with_direct_printers(printers);
        for (id, at, doc) in outbox.devices()? {
            match doc.as_ref().map(cdc::decode_device).transpose() {
                Ok(device) => {
                    registry.apply(&id, at, device);
                }
                Err(e) => tracing::error!(device = %id, error = %e, "stored registry entry no longer decodes"),
            }
        }
        tracing::info!(devices = registry.len(), "device registry restored");
        // Charge states are read back from the outbox as needed: memory does not grow with
        // the charges seen.
        let cache = cfg.outbox.charge_cache_entries.max(4 * cfg.outbox.batch_max_records.max(1));
        let router = Router::with_store(crate::route::router::DEFAULT_SEEN_CAPACITY, outbox.clone(), cache);
        Ok(Planner {
            device_topic: cfg.kafka.device_topic.clone(),
            default_time_zone: cfg.delivery.default_time_zone.clone(),
            ttl: cfg.delivery.ttl.clone(),
            stats,
            clock,
            registry,
            router,
        })
    }

    /// What to store for the record `src`, its [`Accept::source`] set. A registry change
    /// is applied in memory now, a charge's state in the router now: the record is planned
    /// once, and its batch must be written before a later record's offset is stored.
    ///
    /// # Errors
    /// The charge would be dead-lettered whole for a reason `defer` keeps back: nothing was
    /// planned or counted.
    pub fn plan(&mut self, src: &Source<'_>, defer: impl Fn(&DeadLetterReason) -> bool) -> Result<Accept, Deferred> {
        let mut accept =
            if src.topic == self.device_topic { self.plan_device(src) } else { self.plan_charge(src, defer)? };
        accept.source = Some(source_ref(src));
        Ok(accept)
    }

    /// A tombstone (a record with a null value, the marker a compacted topic keeps for a
    /// deleted key): ignored on either topic, since the capture job's deletes are change
    /// events with an envelope. Its offset is stored like any finished record's.
    pub fn tombstone(&mut self, src: &Source<'_>) -> Accept {
        self.stats.ignored(IgnoreReason::Tombstone);
        Accept { source: Some(source_ref(src)), ..Accept::default() }
    }

    /// A registry change: applied in memory now, stored with the batch.
    fn plan_device(&mut self, src: &Source<'_>) -> Accept {
        let env = match cdc::decode_envelope(src.value) {
            Ok(e) => e,
            Err(e) => return self.dead_record(src, DeadLetterReason::of_decode(&e), e.to_string()),
        };
        let device = match env.full_document.as_ref().map(cdc::decode_device).transpose() {
            Ok(d) => d,
            Err(e) => return self.dead_record(src, DeadLetterReason::of_decode(&e), e.to_string()),
        };
        // The endpoint's settings (port, baud, parity...) are checked here, where a bad
        // one can still make the event a dead letter rather than a printer never reached.
        if let Some(Err(e)) = device.as_ref().map(DirectSettings::of_device) {
            let reason = DeadLetterReason::InvalidField("printer.endpoint".into());
            return self.dead_record(src, reason, format!("field `printer.endpoint`: {e}"));
        }
        self.stats.update(|s| s.devices_applied += 1);
        if self.registry.apply(&env.document_id, env.cluster_time, device) == Applied::Stale {
            return Accept::default();
        }
        Accept {
            device: Some(DeviceEntry {
                id: env.document_id,
                cluster_time: env.cluster_time,
                document: env.full_document,
            }),
            ..Accept::default()
        }
    }

    /// A charge change: routed and rendered now, its jobs and dead letters stored with the
    /// batch; or, when `defer` keeps back the whole-record dead letter it would be, nothing
    /// done and why.
    fn plan_charge(&mut self, src: &Source<'_>, defer: impl Fn(&DeadLetterReason) -> bool) -> Result<Accept, Deferred> {
        let ChargeRecord { event_id, operation, cluster_time: event_time, charge, .. } =
            match cdc::decode_charge_record(src.value) {
                Ok(r) => r,
                Err(e) => return Ok(self.dead_record(src, DeadLetterReason::of_decode(&e), e.to_string())),
            };
        let decision = self.router.route_decoded(&event_id, operation, charge, &self.registry);
        let charge_state =
            self.router.take_applied().map(|(id, version, status)| (id, ChargeState { version, status }));
        let mut accept = Accept { charge: charge_state, event_time, ..Accept::default() };
        match decision {
            Decision::Ignored(reason) => self.stats.ignored(reason),
            Decision::DeadLetter { reason, detail } => {
                if defer(&reason) {
                    return Err(Deferred { reason, detail });
                }
                let dead = self.dead_record_of(src, Some(&event_id), reason, detail);
                accept.deadletters = dead.deadletters;
            }
            Decision::Effects { charge, effects, unroutable } => {
                self.stats.update(|s| s.records_with_effects += 1);
                for (kind, reason) in unroutable {
                    let mut dl = DeadLetter::new(
                        reason,
                        format!("{} has no device", kind.as_str()),
                        src.topic,
                        src.partition,
                        src.offset,
                        src.key,
                        src.value,
                    );
                    dl.effect = Some(kind.as_str().to_string());
                    self.dead_effect(&dl, &event_id, &charge.id);
                    accept.deadletters.push(dl);
                }
                let now = self.clock.now();
                for effect in effects {
                    match jobs::render_job(&event_id, &charge, &effect, &self.default_time_zone) {
                        Ok(mut job) => {
                            job.expires_at = Some(jobs::expires_at(effect.kind, &charge, now, &self.ttl));
                            accept.jobs.push((effect.device.id.clone(), job));
                        }
                        Err(e) => {
                            let mut dl = DeadLetter::new(
                                e.reason(),
                                e.to_string(),
                                src.topic,
                                src.partition,
                                src.offset,
                                src.key,
                                src.value,
                            );
                            dl.device = Some(effect.device.id.clone());
                            dl.effect = Some(effect.kind.as_str().to_string());
                            dl.message_id =
                                Some(device_protocol::message_id(&event_id, &effect.device.id, effect.kind));
                            self.dead_effect(&dl, &event_id, &charge.id);
                            accept.deadletters.push(dl);
                        }
                    }
                }
            }
        }
        Ok(accept)
    }

    /// Dead-letters the whole record (it had no effects planned): the returned [`Accept`]
    /// parks it.
    fn dead_record(&mut self, src: &Source<'_>, reason: DeadLetterReason, detail: String) -> Accept {
        self.dead_record_of(src, None, reason, detail)
    }

    /// [`Planner::dead_record`] of a record whose event id is known.
    fn dead_record_of(
        &mut self,
        src: &Source<'_>,
        event_id: Option<&str>,
        reason: DeadLetterReason,
        detail: String,
    ) -> Accept {
        let event_id = event_id.unwrap_or("-");
        tracing::warn!(topic = src.topic, partition = src.partition, offset = src.offset, event_id, %reason, %detail, "dead letter");
        self.stats.dead_record(&reason);
        let dl = DeadLetter::new(reason, detail, src.topic, src.partition, src.offset, src.key, src.value);
        Accept { deadletters: vec![dl], ..Accept::default() }
    }

    /// Counts and logs one dead-lettered effect of event `event_id` on charge `charge`.
    fn dead_effect(&self, dl: &DeadLetter, event_id: &str, charge: &str) {
        tracing::warn!(
            event_id,
            message_id = dl.message_id.as_deref().unwrap_or("-"),
            device = dl.device.as_deref().unwrap_or("-"),
            charge,
            kind = dl.effect.as_deref().unwrap_or("-"),
            reason = %dl.reason,
            detail = %dl.detail,
            "effect dead-lettered"
        );
        self.stats.dead_effect(&dl.reason);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_fixtures::{records, temp_outbox};
    use std::collections::BTreeSet;

    fn planner(name: &str) -> (crate::test_fixtures::TempDir, Planner) {
        let (dir, outbox) = temp_outbox(name);
        let planner = Planner::restore(
            &Config::default(),
            Arc::default(),
            Clock::with_offset(0),
            &outbox,
            Arc::default(),
            Arc::default(),
        )
        .unwrap();
        (dir, planner)
    }

    fn source<'a>(topic: &'a str, offset: i64, value: &'a [u8]) -> Source<'a> {
        Source { topic, partition: 0, offset, key: Some(b"k"), value }
    }

    #[test]
    fn a_record_that_does_not_decode_is_dead_lettered_whole_with_its_source() {
        let (_dir, mut p) = planner("plan-undecodable");
        let a = p.plan(&source("charge.upserted", 7, b"not json"), |_| true).unwrap();
        assert!(a.jobs.is_empty() && a.charge.is_none());
        assert_eq!(a.deadletters.len(), 1);
        assert_eq!(a.deadletters[0].source_offset, 7);
        assert_eq!(a.source.as_ref().map(|s| (s.offset, s.key.as_deref())), Some((7, Some("k"))));
    }

    /// A printer's direct transport reaches the shared map once applied; an endpoint whose
    /// settings do not parse makes the device event a dead letter that says why, and is
    /// not applied.
    #[test]
    fn a_printers_endpoint_is_applied_or_the_event_is_a_dead_letter() {
        let (_dir, outbox) = temp_outbox("plan-direct");
        let printers = Arc::new(DirectPrinters::default());
        let mut p = Planner::restore(
            &Config::default(),
            Arc::default(),
            Clock::with_offset(0),
            &outbox,
            Arc::default(),
            printers.clone(),
        )
        .unwrap();
        let event = |t: u32, endpoint: &str| {
            serde_json::json!({
                "eventId": format!("Device:p1:{t}"), "operationType": "update",
                "documentKey": {"_id": {"$oid": "p1"}}, "clusterTime": {"$timestamp": {"t": t, "i": 1}},
                "fullDocument": {"_id": {"$oid": "p1"}, "company": {"$oid": "c1"}, "kind": "printer",
                    "printer": {"transport": "serial", "endpoint": endpoint, "interruptedJob": "hold"}}
            })
            .to_string()
        };
        let ok = event(1, "serial:///dev/ttyUSB0?baud=19200&flow=rtscts");
        let a = p.plan(&source("device.upserted", 1, ok.as_bytes()), |_| false).unwrap();
        assert!(a.deadletters.is_empty() && a.device.is_some(), "{:?}", a.deadletters);
        let got = printers.get("p1").expect("direct");
        assert_eq!(
            got.endpoint.to_string(),
            "serial:///dev/ttyUSB0?baud=19200&data_bits=8&parity=none&stop_bits=1&flow=rtscts"
        );
        assert_eq!(got.interrupted, cdc::Interrupted::Hold);

        let bad = event(2, "serial:///dev/ttyUSB0?baud=fast");
        let a = p.plan(&source("device.upserted", 2, bad.as_bytes()), |_| false).unwrap();
        assert!(a.device.is_none());
        assert_eq!(a.deadletters.len(), 1);
        assert_eq!(a.deadletters[0].reason.to_string(), "invalid_field:printer.endpoint");
        assert!(a.deadletters[0].detail.contains("baud must be 50 to 4000000"), "{}", a.deadletters[0].detail);
        assert_eq!(printers.get("p1"), Some(got), "the bad event changed nothing");
    }

    #[test]
    fn the_fixtures_plan_the_expected_jobs() {
        let (_dir, mut p) = planner("plan-fixtures");
        let mut planned = BTreeSet::new();
        for (offset, (topic, value)) in records("devices.jsonl").into_iter().chain(records("charges.jsonl")).enumerate()
        {
            let a = p.plan(&source(&topic, offset as i64, &value), |_| false).unwrap();
            assert!(a.deadletters.is_empty(), "{:?}", a.deadletters);
            for (device, job) in a.jobs {
                assert!(job.expires_at.is_some());
                planned.insert((job.charge_id, device, job.kind.as_str().to_string()));
            }
        }
        let expected: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(crate::test_fixtures::path("expected.json")).unwrap())
                .unwrap();
        let expected: BTreeSet<(String, String, String)> = expected
            .as_object()
            .unwrap()
            .iter()
            .flat_map(|(charge, c)| {
                c["effects"].as_array().unwrap().iter().map(move |e| {
                    (charge.clone(), e["device"].as_str().unwrap().to_string(), e["kind"].as_str().unwrap().to_string())
                })
            })
            .collect();
        assert_eq!(planned, expected);
    }
}
