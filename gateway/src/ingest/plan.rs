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
//! An effect whose kind is switched off ([`crate::model::flags`]) is counted
//! `skipped_by_flag` and neither rendered nor dead-lettered (also when it has no device).
//!
//! A whole-record dead letter the caller's `defer` rule keeps back (a charge whose
//! terminal the registry may not know yet: [`crate::ingest::registry_wait`]) is not
//! planned: [`Planner::plan`] answers [`Deferred`] and changes nothing, since the router
//! applies no state for a dead letter. A tombstone (a null value) is ignored
//! ([`Planner::tombstone`]).

use crate::clock::Clock;
use crate::config::{Config, TtlConfig};
use crate::ingest::registry_wait::Deferred;
use crate::model::{
    DeadLetter, DeadLetterReason, DirectPrinters, DirectSettings, Directory, EffectFlags, IgnoreReason, SourceRef,
};
use crate::route::registry::{Applied, Registry};
use crate::route::render as jobs;
use crate::route::router::{Decision, Router};
use crate::store::reconcile::RecordTally;
use crate::store::{Accept, ChargeState, DeviceEntry, Outbox, OutboxError};
use crate::telemetry::Stats;
use cdc::ChargeRecord;
use device_protocol::EffectKind;
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
    /// The record's Kafka timestamp, Unix ms, if it has one: its event time for the
    /// reconciliation counts when its value has no readable `clusterTime`.
    pub timestamp_ms: Option<i64>,
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
    /// Which effect kinds are carried out.
    flags: Arc<EffectFlags>,
    /// The reconciliation counters of the record being planned
    /// ([`crate::store::reconcile`]).
    tally: Vec<String>,
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
            flags: Arc::default(),
            tally: Vec::new(),
        })
    }

    /// The planner reading the effect flags `flags` (all on without this).
    pub fn with_flags(mut self, flags: Arc<EffectFlags>) -> Planner {
        self.flags = flags;
        self
    }

    /// What to store for the record `src`, its [`Accept::source`] set. A registry change
    /// is applied in memory now, a charge's state in the router now: the record is planned
    /// once, and its batch must be written before a later record's offset is stored.
    ///
    /// # Errors
    /// The charge would be dead-lettered whole for a reason `defer` keeps back: nothing was
    /// planned or counted.
    pub fn plan(&mut self, src: &Source<'_>, defer: impl Fn(&DeadLetterReason) -> bool) -> Result<Accept, Deferred> {
        // Cleared first: a deferred record leaves what it counted behind.
        self.tally.clear();
        let (mut accept, event_time) =
            if src.topic == self.device_topic { self.plan_device(src) } else { self.plan_charge(src, defer)? };
        accept.source = Some(source_ref(src));
        accept.tally = Some(self.take_tally(src, event_time));
        Ok(accept)
    }

    /// The record's reconciliation counts: what planning it counted, in the bucket of its
    /// `clusterTime` (`t << 32 | i`), or of its Kafka timestamp without one.
    fn take_tally(&mut self, src: &Source<'_>, event_time: Option<u64>) -> RecordTally {
        let event_time_s = match event_time {
            Some(t) => t >> 32,
            None => src.timestamp_ms.map_or(0, |ms| u64::try_from(ms / 1000).unwrap_or(0)),
        };
        RecordTally { event_time_s, counters: std::mem::take(&mut self.tally) }
    }

    /// Charge states read from the route changelog of a charge partition taken: the router
    /// keeps each one newer than what it knows; returns those, for the outbox to store.
    ///
    /// # Errors
    /// A charge's stored state cannot be read (the outbox's error text).
    pub fn restore_charge_states(
        &mut self,
        states: impl IntoIterator<Item = (String, ChargeState)>,
    ) -> Result<Vec<(String, ChargeState)>, String> {
        let mut newer = Vec::new();
        for (id, state) in states {
            if self.router.restore_state(&id, state.version, state.status)? {
                newer.push((id, state));
            }
        }
        Ok(newer)
    }

    /// Whether `device` is a printer on a maker's cloud protocol
    /// ([`Registry::is_cloud_printer`]).
    pub fn is_cloud_printer(&self, device: &str) -> bool {
        self.registry.is_cloud_printer(device)
    }

    /// A tombstone (a record with a null value, the marker a compacted topic keeps for a
    /// deleted key): ignored on either topic, since the capture job's deletes are change
    /// events with an envelope. Its offset is stored like any finished record's.
    pub fn tombstone(&mut self, src: &Source<'_>) -> Accept {
        self.tally.clear();
        self.ignored(IgnoreReason::Tombstone);
        Accept { source: Some(source_ref(src)), tally: Some(self.take_tally(src, None)), ..Accept::default() }
    }

    /// Counts a record ignored for `reason`.
    fn ignored(&mut self, reason: IgnoreReason) {
        self.stats.ignored(reason);
        self.tally.push(format!("ignored:{}", reason.as_str()));
    }

    /// A registry change: applied in memory now, stored with the batch; with its
    /// `clusterTime` when it has one.
    fn plan_device(&mut self, src: &Source<'_>) -> (Accept, Option<u64>) {
        let env = match cdc::decode_envelope(src.value) {
            Ok(e) => e,
            Err(e) => return (self.dead_record(src, DeadLetterReason::of_decode(&e), e.to_string()), None),
        };
        let at = Some(env.cluster_time);
        let device = match env.full_document.as_ref().map(cdc::decode_device).transpose() {
            Ok(d) => d,
            Err(e) => return (self.dead_record(src, DeadLetterReason::of_decode(&e), e.to_string()), at),
        };
        // The endpoint's settings (port, baud, parity...) are checked here, where a bad
        // one can still make the event a dead letter rather than a printer never reached.
        if let Some(Err(e)) = device.as_ref().map(DirectSettings::of_device) {
            let reason = DeadLetterReason::InvalidField("printer.endpoint".into());
            return (self.dead_record(src, reason, format!("field `printer.endpoint`: {e}")), at);
        }
        self.stats.update(|s| s.devices_applied += 1);
        if self.registry.apply(&env.document_id, env.cluster_time, device) == Applied::Stale {
            return (Accept::default(), at);
        }
        let accept = Accept {
            device: Some(DeviceEntry {
                id: env.document_id,
                cluster_time: env.cluster_time,
                document: env.full_document,
            }),
            ..Accept::default()
        };
        (accept, at)
    }

    /// A charge change: routed and rendered now, its jobs and dead letters stored with the
    /// batch; or, when `defer` keeps back the whole-record dead letter it would be, nothing
    /// done and why.
    fn plan_charge(
        &mut self,
        src: &Source<'_>,
        defer: impl Fn(&DeadLetterReason) -> bool,
    ) -> Result<(Accept, Option<u64>), Deferred> {
        let ChargeRecord { event_id, operation, cluster_time: event_time, charge, .. } =
            match cdc::decode_charge_record(src.value) {
                Ok(r) => r,
                Err(e) => {
                    // A charge document that does not decode may still have a readable envelope.
                    let at = cdc::decode_envelope(src.value).ok().map(|env| env.cluster_time);
                    return Ok((self.dead_record(src, DeadLetterReason::of_decode(&e), e.to_string()), at));
                }
            };
        let decision = self.router.route_decoded(&event_id, operation, charge, &self.registry);
        let charge_state =
            self.router.take_applied().map(|(id, version, status)| (id, ChargeState { version, status }));
        let mut accept = Accept { charge: charge_state, event_time, ..Accept::default() };
        match decision {
            Decision::Ignored(reason) => self.ignored(reason),
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
                    if !self.flags.is_on(kind) {
                        self.skipped(kind, &event_id, &charge.id, None);
                        continue;
                    }
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
                    if !self.flags.is_on(effect.kind) {
                        self.skipped(effect.kind, &event_id, &charge.id, Some(&effect.device.id));
                        continue;
                    }
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
        Ok((accept, Some(event_time)))
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
        self.tally.push(format!("dead_lettered:{reason}"));
        let dl = DeadLetter::new(reason, detail, src.topic, src.partition, src.offset, src.key, src.value);
        Accept { deadletters: vec![dl], ..Accept::default() }
    }

    /// Counts and logs one effect of `kind` left out because its flag is off.
    fn skipped(&mut self, kind: EffectKind, event_id: &str, charge: &str, device: Option<&str>) {
        tracing::debug!(
            event_id,
            device = device.unwrap_or("-"),
            charge,
            kind = kind.as_str(),
            "effect skipped: its kind is switched off"
        );
        self.stats.skipped_by_flag(kind.as_str());
        self.tally.push(format!("skipped_by_flag:{}", kind.as_str()));
    }

    /// Counts and logs one dead-lettered effect of event `event_id` on charge `charge`.
    fn dead_effect(&mut self, dl: &DeadLetter, event_id: &str, charge: &str) {
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
        self.tally.push(format!("dead_lettered:{}", dl.reason));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Removal;
    use crate::test_fixtures::{records, temp_outbox};
    use std::collections::BTreeSet;

    /// A planner on `outbox` with the default settings, counting into `stats`, telling
    /// `printers` of the direct printers.
    fn restored(outbox: &Arc<Outbox>, stats: Arc<Stats>, printers: Arc<DirectPrinters>) -> Planner {
        Planner::restore(&Config::default(), stats, Clock::with_offset(0), outbox, Arc::default(), printers).unwrap()
    }

    fn planner(name: &str) -> (crate::test_fixtures::TempDir, Planner) {
        let (dir, outbox) = temp_outbox(name);
        (dir, restored(&outbox, Arc::default(), Arc::default()))
    }

    fn source<'a>(topic: &'a str, offset: i64, value: &'a [u8]) -> Source<'a> {
        Source { topic, partition: 0, offset, key: Some(b"k"), value, timestamp_ms: None }
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
        let mut p = restored(&outbox, Arc::default(), printers.clone());
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

    /// Every effect expected.json lists, by kind.
    fn expected_by_kind() -> std::collections::BTreeMap<String, u64> {
        let expected: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(crate::test_fixtures::path("expected.json")).unwrap())
                .unwrap();
        let mut by_kind = std::collections::BTreeMap::new();
        for c in expected.as_object().unwrap().values() {
            for e in c["effects"].as_array().unwrap() {
                *by_kind.entry(e["kind"].as_str().unwrap().to_string()).or_default() += 1;
            }
        }
        by_kind
    }

    #[test]
    fn a_kind_switched_off_is_counted_and_never_planned() {
        let (_dir, outbox) = temp_outbox("plan-flags");
        let stats = Arc::new(Stats::default());
        let flags = Arc::new(EffectFlags::default());
        flags.set(EffectKind::DisplayQr, false);
        let mut p = restored(&outbox, stats.clone(), Arc::default()).with_flags(flags);
        let mut kinds = std::collections::BTreeMap::<String, u64>::new();
        for (offset, (topic, value)) in records("devices.jsonl").into_iter().chain(records("charges.jsonl")).enumerate()
        {
            let a = p.plan(&source(&topic, offset as i64, &value), |_| false).unwrap();
            assert!(a.deadletters.is_empty(), "{:?}", a.deadletters);
            for (_, job) in a.jobs {
                *kinds.entry(job.kind.as_str().to_string()).or_default() += 1;
            }
        }
        let mut want = expected_by_kind();
        let qr = want.remove("display_qr").unwrap();
        assert_eq!(kinds, want, "every other kind planned as expected");
        let skipped = stats.snapshot().skipped_by_flag;
        assert_eq!(skipped, [("display_qr".to_string(), qr)].into_iter().collect());
    }

    /// The registry entries the fixtures leave in the outbox read back one by one as the
    /// whole listing has them; an id the registry never had reads as none.
    #[test]
    fn a_stored_device_reads_back_by_its_id() {
        let (_dir, outbox) = temp_outbox("plan-device-lookup");
        let mut p = restored(&outbox, Arc::default(), Arc::default());
        let mut accepts: Vec<_> = records("devices.jsonl")
            .into_iter()
            .enumerate()
            .map(|(offset, (topic, value))| p.plan(&source(&topic, offset as i64, &value), |_| false).unwrap())
            .collect();
        outbox.write(&mut accepts, &[], 1).unwrap();
        let all = outbox.devices().unwrap();
        assert!(all.len() > 5, "{}", all.len());
        for (id, _, doc) in all {
            assert_eq!(outbox.device(&id).unwrap(), doc, "{id}");
        }
        assert_eq!(outbox.device("no-such-device").unwrap(), None);
    }

    #[test]
    fn the_fixtures_reconcile_in_windows_of_event_time() {
        use std::collections::BTreeMap;
        let (_dir, outbox) = temp_outbox("plan-reconcile");
        let mut p = restored(&outbox, Arc::default(), Arc::default());
        // A record without a readable clusterTime is counted by its Kafka timestamp.
        let kafka_ts: i64 = 1_795_000_000_000;
        let window = 600u64;
        let mut want_read: BTreeMap<(String, u64), u64> = BTreeMap::new();
        let mut accepts = Vec::new();
        let mut offsets: BTreeMap<String, i64> = BTreeMap::new();
        let mut deadletters = 0;
        for (topic, value) in ["devices.jsonl", "charges.jsonl", "edge-cases.jsonl"].into_iter().flat_map(records) {
            let t = serde_json::from_slice::<serde_json::Value>(&value)
                .ok()
                .and_then(|v| v["clusterTime"]["$timestamp"]["t"].as_u64())
                .unwrap_or(kafka_ts as u64 / 1000);
            *want_read.entry((topic.clone(), t / window * window)).or_default() += 1;
            let offset = offsets.entry(topic.clone()).or_default();
            let src = Source {
                topic: &topic,
                partition: 0,
                offset: *offset,
                key: None,
                value: &value,
                timestamp_ms: Some(kafka_ts),
            };
            *offset += 1;
            let a = p.plan(&src, |_| false).unwrap();
            deadletters += a.deadletters.len() as u64;
            accepts.push(a);
        }
        let written = outbox.write(&mut accepts.clone(), &[], 1).unwrap();
        // Read again before the offsets were committed (a crash): counted once.
        outbox.write(&mut accepts, &[], 2).unwrap();

        let windows = outbox.reconcile_windows(0, u64::MAX, window).unwrap();
        let got_read: BTreeMap<(String, u64), u64> =
            windows.iter().map(|w| ((w.topic.clone(), w.start.timestamp() as u64), w.read)).collect();
        assert_eq!(got_read, want_read, "records read per topic and window of event time");
        let total = |f: &dyn Fn(&crate::store::reconcile::Window) -> &BTreeMap<String, u64>| {
            let mut m = BTreeMap::<String, u64>::new();
            for w in &windows {
                for (k, v) in f(w) {
                    *m.entry(k.clone()).or_default() += v;
                }
            }
            m
        };
        assert_eq!(total(&|w| &w.queued), expected_by_kind(), "queued, all windows: expected.json");
        assert_eq!(total(&|w| &w.dead_lettered).values().sum::<u64>(), deadletters);
        assert!(total(&|w| &w.delivered).is_empty());

        // Every job delivered but one, which expires: counted in its record's window.
        let queued: Vec<_> = written.into_iter().flat_map(|(q, _)| q).collect();
        let (last, done) = queued.split_last().unwrap();
        let removals: Vec<Removal> =
            done.iter().map(|q| Removal::done(q.stored.device.clone(), q.stored.job.seq)).collect();
        outbox.write(&mut [], &removals, 3).unwrap();
        let dl = DeadLetter::for_job(DeadLetterReason::Expired, "late".into(), &last.stored);
        outbox.fail_job(&last.stored, dl, 4).unwrap();
        let windows_after = outbox.reconcile_windows(0, u64::MAX, window).unwrap();
        for w in &windows_after {
            let mut left = w.queued.clone();
            for (k, v) in w.delivered.iter().chain(&w.expired) {
                *left.get_mut(k).unwrap() -= v;
            }
            assert!(left.values().all(|v| *v == 0), "{w:?}");
        }
        let expired: u64 = windows_after.iter().flat_map(|w| w.expired.values()).sum();
        assert_eq!(expired, 1);
        assert!(outbox.prune_reconcile(u64::MAX).unwrap() > 0);
        assert!(outbox.reconcile_windows(0, u64::MAX, window).unwrap().is_empty());
    }
}
