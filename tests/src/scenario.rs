//! A generated scenario ([`simulators::capture::generate::Scenario`]) run against pixgate:
//! what must happen (from [`simulators::expected::Model`], an independent model of the
//! routing rules), publishing the events as a shop would, and checking what the devices did.
//!
//! Publishing "keeping up": each charge's next event goes to Kafka only once every effect
//! of its previous event has been carried out (a customer pays after the QR was shown). So
//! no queued QR is ever superseded, and every effect of the model must happen exactly once.
//! Events of different charges are not held back by each other.

use crate::gateway::{stats_or_error, GatewayProcess};
use anyhow::{bail, Context};
use rdkafka::producer::FutureProducer;
use simulators::capture::generate::{Scenario, ScenarioConfig};
use simulators::capture::{publish_records_at, CaptureRecord, Position};
use simulators::device::Stats;
use simulators::effect::EffectRecord;
use simulators::expected::{ExpectedEffect, Fate, Model};
use simulators::registry::{devices_from_records, DeviceSpec};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Reads a scale from the environment: `name` as an integer, else `default`.
///
/// # Panics
/// The variable is set but not an integer (a typo must not silently run the default).
pub fn env_scale(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v.trim().replace('_', "").parse().unwrap_or_else(|_| panic!("{name}={v:?} is not an integer")),
        Err(_) => default,
    }
}

/// A scenario with everything it must cause.
pub struct Plan {
    /// The generated world.
    pub scenario: Scenario,
    /// The devices to simulate (all of the registry).
    pub devices: Vec<DeviceSpec>,
    /// Every `charge.upserted` event, in generation order.
    pub charges: Vec<CaptureRecord>,
    /// What pixgate must do with each event of `charges` (same index).
    pub fates: Vec<Fate>,
}

impl Plan {
    /// Generates the scenario and runs the model over it.
    ///
    /// # Panics
    /// The model dead-letters a generated event (the generator is broken).
    pub fn new(cfg: ScenarioConfig) -> Plan {
        let scenario = Scenario::new(cfg);
        let mut model = Model::new();
        for r in scenario.device_records() {
            model.apply_device(&r.value);
        }
        let charges: Vec<CaptureRecord> = scenario.charge_events().collect();
        let fates: Vec<Fate> = charges.iter().map(|r| model.apply_charge(&r.value)).collect();
        for (r, f) in charges.iter().zip(&fates) {
            assert!(
                !matches!(f, Fate::DeadLetter(_)),
                "generated event dead-lettered by the model: {f:?} {}",
                String::from_utf8_lossy(&r.value)
            );
        }
        let devices = devices_from_records(scenario.device_records());
        Plan { scenario, devices, charges, fates }
    }

    /// Every effect that must be carried out, in event order.
    pub fn expected(&self) -> impl Iterator<Item = &ExpectedEffect> {
        self.fates.iter().flat_map(Fate::effects)
    }

    /// How many effects must be carried out.
    pub fn expected_count(&self) -> usize {
        self.expected().count()
    }

    /// Counts of the fates by effect kind or ignore reason (for the log).
    pub fn summary(&self) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for f in &self.fates {
            match f {
                Fate::Effects { effects, .. } => {
                    for e in effects {
                        *m.entry(e.kind.as_str().to_string()).or_default() += 1;
                    }
                }
                Fate::Ignored(r) => *m.entry(format!("ignored:{r}")).or_default() += 1,
                Fate::DeadLetter(r) => *m.entry(format!("dead:{r}")).or_default() += 1,
            }
        }
        m
    }
}

/// Publishes `plan.charges` keeping up (see the module docs), reading the fleet's carried
/// out effects from `stats`. Returns where each event landed (same index as
/// `plan.charges`). Runs until every event is published.
///
/// # Errors
/// A publish failed, or `deadline` passed with events still held back (the error names
/// the effects they wait for).
pub async fn feed_keeping_up(
    producer: &FutureProducer,
    plan: &Plan,
    stats: Arc<Stats>,
    deadline: Instant,
) -> anyhow::Result<Vec<Position>> {
    feed_keeping_up_noting(producer, plan, stats, deadline, |_, _| {}).await
}

/// [`feed_keeping_up`], calling `noted(charge id, when)` as each event is handed to the
/// producer (for produce → effect latencies).
///
/// # Errors
/// As [`feed_keeping_up`].
pub async fn feed_keeping_up_noting(
    producer: &FutureProducer,
    plan: &Plan,
    stats: Arc<Stats>,
    deadline: Instant,
    mut noted: impl FnMut(&str, Instant),
) -> anyhow::Result<Vec<Position>> {
    let n = plan.charges.len();
    let key = |i: usize| plan.charges[i].key.clone().unwrap_or_default();
    let mut queued: HashMap<String, VecDeque<usize>> = HashMap::new();
    let mut ready: Vec<usize> = Vec::new();
    for i in 0..n {
        let q = queued.entry(key(i)).or_default();
        if q.is_empty() {
            ready.push(i);
        }
        q.push_back(i);
    }
    for q in queued.values_mut() {
        q.pop_front();
    }
    // Effects still to be carried out for the last published event of each charge.
    let mut outstanding: HashMap<String, HashSet<String>> = HashMap::new();
    let mut positions: Vec<Option<Position>> = vec![None; n];
    let (mut published, mut cursor) = (0usize, 0usize);
    let mut carried: HashSet<String> = HashSet::new();
    while published < n {
        if !ready.is_empty() {
            ready.sort_unstable();
            let batch: Vec<CaptureRecord> = ready.iter().map(|&i| plan.charges[i].clone()).collect();
            let handed = Instant::now();
            for &i in &ready {
                noted(&key(i), handed);
            }
            let landed = publish_records_at(producer, &batch, None).await?;
            let released = std::mem::take(&mut ready);
            for (&i, pos) in released.iter().zip(landed) {
                positions[i] = Some(pos);
                published += 1;
                let ids: HashSet<String> = plan.fates[i]
                    .effects()
                    .iter()
                    .map(|e| e.message_id.clone())
                    .filter(|id| !carried.contains(id))
                    .collect();
                outstanding.insert(key(i), ids);
            }
        }
        for e in stats.effects_since(cursor) {
            cursor += 1;
            carried.insert(e.message_id.clone());
            if let Some(ids) = outstanding.get_mut(&e.charge) {
                ids.remove(&e.message_id);
            }
        }
        // A charge whose last event is fully carried out releases its next event.
        let done: Vec<String> = outstanding.iter().filter(|(_, ids)| ids.is_empty()).map(|(c, _)| c.clone()).collect();
        for charge in done {
            outstanding.remove(&charge);
            if let Some(next) = queued.get_mut(&charge).and_then(VecDeque::pop_front) {
                ready.push(next);
            }
        }
        if ready.is_empty() && published < n {
            if Instant::now() > deadline {
                let waiting: Vec<String> = outstanding
                    .iter()
                    .filter(|(_, ids)| !ids.is_empty())
                    .take(10)
                    .map(|(c, ids)| format!("{c}: {ids:?}"))
                    .collect();
                bail!("{} of {n} events published; charges waiting for effects (first 10): {waiting:?}", published);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(positions.into_iter().map(|p| p.expect("every event published")).collect())
}

/// Where each of `records` (published in this order, same-key records in order) is on the
/// topic, from the records read back (`read`): the same bytes, the earliest unclaimed
/// offset (identical bytes, e.g. a redelivered change event, are claimed in publishing
/// order). For runs where the producer's delivery reports cannot be trusted: across a
/// broker restart librdkafka reports `-1` for a record an idempotent producer retried, and
/// tansu 0.6.0 answered some produce requests after its restart with a wrong base offset.
///
/// # Errors
/// A record is not on the topic (lost), or the topic holds records that were never
/// published (the error counts them).
pub fn positions_from_topic(
    records: &[CaptureRecord],
    read: &[crate::kafka::ReadRecord],
) -> anyhow::Result<Vec<Position>> {
    let mut by_value: HashMap<&[u8], Vec<Position>> = HashMap::new();
    for r in read {
        by_value.entry(r.value.as_slice()).or_default().push((r.partition, r.offset));
    }
    let mut queues: HashMap<&[u8], VecDeque<Position>> = by_value
        .into_iter()
        .map(|(v, mut ps)| {
            ps.sort_unstable();
            (v, ps.into())
        })
        .collect();
    let mut out = Vec::with_capacity(records.len());
    for (i, r) in records.iter().enumerate() {
        let pos = queues
            .get_mut(r.value.as_slice())
            .and_then(VecDeque::pop_front)
            .with_context(|| format!("record {i} (key {:?}) is not on the topic", r.key))?;
        out.push(pos);
    }
    let extra: usize = queues.values().map(VecDeque::len).sum();
    anyhow::ensure!(extra == 0, "{extra} records on the topic were never published");
    Ok(out)
}

/// `(partition → offset + 1 of its last record)`: where a consumer that has read
/// everything of `positions` stands.
///
/// # Panics
/// An offset is unknown (`-1`; see [`positions_from_topic`]).
pub fn end_offsets(positions: &[Position]) -> BTreeMap<i32, i64> {
    let mut ends = BTreeMap::new();
    for &(p, o) in positions {
        assert!(o >= 0, "unknown offset in partition {p}: take positions from the topic");
        let e = ends.entry(p).or_insert(0);
        *e = (*e).max(o + 1);
    }
    ends
}

/// Waits until every expected effect was carried out, pixgate has nothing pending, queued
/// or in its outbox, and its consumer group has committed every published record of both
/// topics (so nothing is left that could still cause an effect).
///
/// # Errors
/// `deadline` passed (the error says what was missing).
pub async fn wait_all_delivered(
    gw: &GatewayProcess,
    plan: &Plan,
    charge_ends: &BTreeMap<i32, i64>,
    device_ends: &BTreeMap<i32, i64>,
    stats: &Stats,
    deadline: Instant,
) -> anyhow::Result<()> {
    let group = gw.settings.group_id.clone();
    wait_all_delivered_in(gw, &group, plan, charge_ends, device_ends, stats, deadline).await
}

/// [`wait_all_delivered`], the records committed by consumer group `group` (the central
/// shape's route group, `{kafka.group_id}-route`, commits the charge topic).
///
/// # Errors
/// `deadline` passed (the error says what was missing).
pub async fn wait_all_delivered_in(
    gw: &GatewayProcess,
    group: &str,
    plan: &Plan,
    charge_ends: &BTreeMap<i32, i64>,
    device_ends: &BTreeMap<i32, i64>,
    stats: &Stats,
    deadline: Instant,
) -> anyhow::Result<()> {
    let want: HashSet<&str> = plan.expected().map(|e| e.message_id.as_str()).collect();
    let (brokers, group) = (gw.settings.brokers.clone(), group.to_string());
    let mut seen: HashSet<String> = HashSet::new();
    let mut cursor = 0;
    let mut last_print = Instant::now();
    loop {
        for e in stats.effects_since(cursor) {
            cursor += 1;
            seen.insert(e.message_id);
        }
        let missing = want.iter().filter(|id| !seen.contains(**id)).count();
        let s = gw.stats();
        let idle = s.as_ref().is_ok_and(|s| {
            s.counters.pending_records == 0 && s.counters.queued_jobs == 0 && s.counters.outbox_jobs == 0
        });
        let mut committed_all = false;
        if missing == 0 && idle {
            let (b, g) = (brokers.clone(), group.clone());
            let (ce, de) = (charge_ends.clone(), device_ends.clone());
            committed_all = tokio::task::spawn_blocking(move || {
                committed_reach(&b, &g, "charge.upserted", &ce) && committed_reach(&b, &g, "device.upserted", &de)
            })
            .await
            .unwrap_or(false);
            if committed_all {
                return Ok(());
            }
        }
        if last_print.elapsed() > Duration::from_secs(5) {
            last_print = Instant::now();
            let pixgate = match &s {
                Ok(s) => format!(
                    "pending {} queued {} outbox {}",
                    s.counters.pending_records, s.counters.queued_jobs, s.counters.outbox_jobs
                ),
                Err(e) => format!("/stats unavailable ({e:#})"),
            };
            println!(
                "  waiting: {missing} of {} effects missing; pixgate {pixgate}; committed all: {committed_all}",
                want.len()
            );
        }
        if Instant::now() > deadline {
            bail!("not delivered in time: {missing} of {} effects missing, pixgate idle: {idle}, committed all: {committed_all}; stats {}", want.len(), stats_or_error(&s));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn committed_reach(brokers: &str, group: &str, topic: &str, ends: &BTreeMap<i32, i64>) -> bool {
    let parts = ends.keys().max().map_or(0, |p| p + 1);
    match crate::kafka::committed_offsets(brokers, group, topic, parts) {
        Ok(c) => ends.iter().all(|(p, end)| c.get(*p as usize).is_some_and(|o| o >= end)),
        Err(_) => false,
    }
}

/// What [`check_delivery`] found.
#[derive(Debug, Clone, Default)]
pub struct DeliveryReport {
    /// Effects carried out (after the devices' dedupe).
    pub effects: usize,
    /// Devices that carried out at least one effect.
    pub devices: usize,
}

/// Checks the devices' effects against the plan: every expected effect exactly once, on
/// its device, nothing else; per device, `seq` strictly increasing in the order carried
/// out, and the effects of records of one partition in offset order (so each charge's
/// lifecycle in order too). Returns every problem found, not just the first.
///
/// # Errors
/// The list of problems (at most 30 shown, with the total).
pub fn check_delivery(plan: &Plan, positions: &[Position], effects: &[EffectRecord]) -> anyhow::Result<DeliveryReport> {
    let mut problems: Vec<String> = Vec::new();
    let mut position_of: HashMap<&str, Position> = HashMap::new();
    let mut expected: HashMap<&str, &ExpectedEffect> = HashMap::new();
    for (i, fate) in plan.fates.iter().enumerate() {
        for e in fate.effects() {
            expected.insert(&e.message_id, e);
            position_of.insert(&e.message_id, positions[i]);
        }
    }
    let mut carried: HashSet<&str> = HashSet::new();
    let mut per_device: BTreeMap<&str, Vec<&EffectRecord>> = BTreeMap::new();
    for e in effects {
        if !carried.insert(&e.message_id) {
            problems.push(format!(
                "carried out twice: {} {} {} on {}",
                e.message_id,
                e.kind.as_str(),
                e.charge,
                e.device
            ));
        }
        match expected.get(e.message_id.as_str()) {
            None => problems.push(format!(
                "unexpected effect: {} {} on {} (message {})",
                e.kind.as_str(),
                e.charge,
                e.device,
                e.message_id
            )),
            Some(x)
                if (x.device.as_str(), x.charge.as_str(), x.kind) != (e.device.as_str(), e.charge.as_str(), e.kind) =>
            {
                problems.push(format!(
                    "message {} was {} {} on {}, expected {} {} on {}",
                    e.message_id,
                    e.kind.as_str(),
                    e.charge,
                    e.device,
                    x.kind.as_str(),
                    x.charge,
                    x.device
                ))
            }
            Some(_) => {}
        }
        per_device.entry(&e.device).or_default().push(e);
    }
    for (id, x) in &expected {
        if !carried.contains(id) {
            problems.push(format!("never carried out: {} {} on {}", x.kind.as_str(), x.charge, x.device));
        }
    }
    for (device, list) in &per_device {
        let seqs: Vec<u64> = list.iter().map(|e| e.seq).collect();
        if let Some(w) = seqs.windows(2).find(|w| w[0] >= w[1]) {
            problems.push(format!("{device}: seq {} carried out before {}", w[0], w[1]));
        }
        let mut last_offset: HashMap<i32, (i64, &str)> = HashMap::new();
        for e in list {
            let Some(&(p, o)) = position_of.get(e.message_id.as_str()) else { continue };
            if let Some(&(prev, prev_id)) = last_offset.get(&p) {
                if o < prev {
                    problems.push(format!(
                        "{device}: effect of partition {p} offset {o} ({}) carried out after offset {prev} ({prev_id})",
                        e.message_id
                    ));
                }
            }
            last_offset.insert(p, (o, &e.message_id));
        }
    }
    if !problems.is_empty() {
        let total = problems.len();
        problems.truncate(30);
        bail!("{total} delivery problems:\n  {}", problems.join("\n  "));
    }
    Ok(DeliveryReport { effects: effects.len(), devices: per_device.len() })
}

/// Publishes the registry and waits until pixgate has applied every record of it (the
/// contract: devices first). Returns where the records landed.
///
/// # Errors
/// Publish failure or pixgate not done within 60 s.
pub async fn publish_registry(
    producer: &FutureProducer,
    plan: &Plan,
    gw: &GatewayProcess,
) -> anyhow::Result<Vec<Position>> {
    let records = plan.scenario.device_records();
    let positions = publish_records_at(producer, records, None).await?;
    let n = records.len() as u64;
    crate::demo::wait_until(gw, Instant::now() + Duration::from_secs(60), |s| {
        s.counters.devices_applied >= n && s.counters.pending_records == 0
    })
    .await
    .context("pixgate reading the registry")?;
    Ok(positions)
}

/// Waits until the devices have carried out `target` effects (counted in `stats`).
///
/// # Panics
/// `deadline` passed first (`what` names what was waited for).
pub async fn wait_carried(stats: &Stats, target: u64, deadline: Instant, what: &str) {
    while stats.carried_out() < target {
        assert!(Instant::now() < deadline, "stuck at {} effects before {what}", stats.carried_out());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
