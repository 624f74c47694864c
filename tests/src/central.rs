//! The central shape on one machine: tansu, Debian's `mosquitto` as the devices' broker
//! (TLS, client certificates from a fleet CA, an ACL), several `pixgate` replicas with
//! `cluster.enabled` (each its own outbox, group instance id and broker client ids), and a
//! generated scenario's fleet of verifying devices. [`run`] is what `scripts/central.sh`
//! (`pixgate-central`) shows and `tests/tests/cluster_replicas.rs` checks.
//!
//! The first replica starts first and reads the registry as it is published; the others
//! start on fresh outboxes once the registry is on Kafka, so their registry readers read
//! every device record before they join the route and deliver groups (the start gate). The
//! charge events are produced once the groups have settled. With
//! [`CentralOptions::kills`], replicas other than the first are SIGKILLed and started again
//! meanwhile: their queues move to the other replicas through the delivery log
//! (`docs/cluster.md`, "Hand-over"). With [`CentralOptions::stop_ms`], replica r1 is frozen
//! (SIGSTOP) and replaced by a process with its identity, then continued: the fence
//! (`docs/cluster.md`, "Fencing"). Each replica connects to a listener of its own on the
//! broker, so that [`CentralReport::takeovers`] can say whose connection the broker closed.

use crate::devices_broker::{central_topics, DevicesBroker};
use crate::gateway::{count, GatewayProcess, GatewaySettings};
use crate::harness::{fleet_connect_timeout, verifying_devices, Rig};
use crate::kafka::committed_offsets;
use crate::net::free_port;
use crate::scenario::{self, DeliveryReport, Plan};
use anyhow::{bail, Context};
use simulators::capture::generate::ScenarioConfig;
use simulators::device::Stats;
use simulators::fleet;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The device-jobs topic and its partition count.
pub const DEVICE_JOBS: (&str, i32) = ("pixgate.device-jobs", 6);

/// What to run.
#[derive(Debug, Clone)]
pub struct CentralOptions {
    /// Names the scratch folder (`pixgate-{name}-{pid}` under the temp dir) and the groups
    /// (`pixgate-{name}-route`, `-deliver`).
    pub name: String,
    /// Replicas: 2 up to the charge topic's 3 partitions (each holds one at least).
    pub replicas: usize,
    /// Charge events of the generated scenario.
    pub events: usize,
    /// Devices of the generated scenario.
    pub devices: usize,
    /// The scenario's seed.
    pub seed: u64,
    /// Replicas other than the first SIGKILLed and started again while the events are fed,
    /// one after another, each once the devices have carried out its share of the expected
    /// effects (`kills + 1` equal shares); 0: a steady state.
    pub kills: usize,
    /// When not zero, replica r1 is SIGSTOPped once the devices have carried out a third of
    /// the expected effects and a replacement is started with its identity (its group
    /// instance id, as an orchestrator does for a replica it holds dead); r1 is continued
    /// (SIGCONT) this long (ms) after the replacement has connected as an owner, given 5 s,
    /// then stopped. The replacement takes its place.
    pub stop_ms: u64,
    /// mosquitto SIGKILLed and started again (empty: it keeps no sessions) while the events
    /// are fed, each once the devices have carried out its share of the expected effects
    /// (`broker_restarts + 1` equal shares). Not with kills or a stop.
    pub broker_restarts: usize,
    /// Scale out, then in: once the devices have carried out a fifth of the expected
    /// effects a new replica joins (a fresh outbox, a listener of its own); once the group
    /// has settled on it and it has delivered, replica r1 is stopped with SIGTERM and not
    /// started again (the run fails when four fifths are carried out by then: too few
    /// left to scale in under load). Not with kills, a
    /// stop or broker restarts; `replicas` is the count before the new one joins.
    pub scale: bool,
    /// After delivery, a bare rdkafka consumer with a fresh group reads the whole charge
    /// topic on the same broker: the baseline a benchmark compares with.
    pub baseline: bool,
    /// Dynamic group membership (no `kafka.instance_id`) for every replica, as with
    /// `scale`; otherwise each replica is a static member.
    pub dynamic: bool,
    /// With kills: a killed replica is not started again, as when its machine is gone (with
    /// `dynamic`: a static member's share would wait for its return). The run fails when
    /// one replica would be left.
    pub gone: bool,
    /// More `PIXGATE_*` settings for every replica, applied last.
    pub env: Vec<(&'static str, String)>,
}

impl CentralOptions {
    /// A steady run (no kill, stop, broker restart, scale or baseline) of `replicas`
    /// replicas on a scenario of `events` charge events for `devices` devices from `seed`;
    /// a test sets what it disrupts with struct update syntax.
    pub fn steady(name: &str, replicas: usize, events: usize, devices: usize, seed: u64) -> CentralOptions {
        CentralOptions {
            name: name.to_string(),
            replicas,
            events,
            devices,
            seed,
            kills: 0,
            stop_ms: 0,
            broker_restarts: 0,
            scale: false,
            baseline: false,
            dynamic: false,
            gone: false,
            env: Vec::new(),
        }
    }
}

/// One replica at the end.
#[derive(Debug, Clone)]
pub struct ReplicaReport {
    /// Partitions it held: (device topic read, charge topic, device-jobs topic).
    pub partitions: (usize, usize, usize),
    /// Charge events it read (routed).
    pub routed: u64,
    /// Jobs its devices acknowledged as done.
    pub delivered: u64,
    /// Device records its registry reader saw at start before joining the groups
    /// (`None`: the line is not in its log).
    pub registry_at_start: Option<usize>,
    /// Times it rejoined a group that left partitions unread (`group_rejoins`).
    pub rejoins: u64,
}

/// What [`run`] saw.
#[derive(Debug, Clone)]
pub struct CentralReport {
    /// Effects the model expects.
    pub expected: usize,
    /// Every expected effect carried out once, in order (the independent model's check).
    pub delivery: DeliveryReport,
    /// Times a device saw its `seq` go backwards.
    pub order_violations: u64,
    /// Job deliveries the devices received, copies included.
    pub raw_jobs: u64,
    /// Device records published.
    pub device_records: usize,
    /// Per replica, in start order.
    pub replicas: Vec<ReplicaReport>,
    /// The groups' committed offsets on the device topic (negative: none).
    pub device_topic_commits: Vec<(String, Vec<i64>)>,
    /// Replicas SIGKILLed and started again.
    pub kills: usize,
    /// Jobs restored from the delivery log by replicas taking device-jobs partitions, in
    /// all (from their `device-jobs partition taken` lines).
    pub restored_jobs: u64,
    /// Each time the broker closed a partition connection because another connection
    /// came with its client id: (client id, the replica that held it, the replica that took
    /// it), from the broker's log (each replica has a listener of its own).
    pub takeovers: Vec<(String, Option<usize>, Option<usize>)>,
    /// Partition connections that stood down after a takeover, found so by their replica's
    /// delivery log check (`partition connection taken over` lines).
    pub stood_down: usize,
    /// Times mosquitto was SIGKILLed and started again.
    pub broker_restarts: usize,
    /// With `scale`: whether r1 exited cleanly (status 0) within 30 s of its SIGTERM.
    pub sigterm_clean: Option<bool>,
    /// Devices of the device-jobs partitions taken, summed over every take (the
    /// `devices=` of each `device-jobs partition taken` line, all replicas): how many
    /// devices' queues moved, at most, so how many jobs in flight a move may repeat.
    pub moved_devices: u64,
    /// The longest take (claim, connection, restore), in ms.
    pub longest_take_ms: u64,
    /// Jobs the devices received again after carrying them out (absorbed by their
    /// dedupe).
    pub duplicates: u64,
    /// Extra copies of jobs on the device-jobs topic (a message id produced more than
    /// once: the route stage routed its record again, e.g. after a charge partition moved
    /// before the record's state reached the route changelog).
    pub job_copies: u64,
    /// Partition connections that dropped while up (the broker cut them), all replicas.
    pub partition_connections_dropped: usize,
    /// Partitions whose connection's last word in its replica's log is that it dropped:
    /// never back, never given up (replica log index, partition).
    pub partition_connections_not_back: Vec<(usize, i32)>,
    /// Device-jobs partitions whose queues a replica dropped on finding its claim
    /// overtaken (`another replica's claim overtook this one's` lines, one per partition).
    pub suspended: usize,
    /// From the first event handed to the producer to every effect carried out.
    pub feed: Duration,
    /// Produce → effect latency: from an event handed to the producer to each of its
    /// effects carried out by its device (just before its `done` ack), sorted.
    pub latencies: Vec<Duration>,
    /// With `baseline`: records the bare consumer read, and how long it took.
    pub bare: Option<(u64, Duration)>,
    /// Wall time.
    pub secs: f64,
}

/// Runs `opts` (see the module docs); stops everything it started.
///
/// # Errors
/// A replica did not start, the groups did not settle within 90 s, or the scenario was not
/// delivered in time or not as the model expects (the error says what).
///
/// # Panics
/// tansu, mosquitto or the fleet could not be started (as the test harness does).
pub async fn run(opts: &CentralOptions) -> anyhow::Result<CentralReport> {
    let began = Instant::now();
    let plan = Arc::new(Plan::new(ScenarioConfig::new(opts.seed, opts.devices, opts.events)));
    let dir = std::env::temp_dir().join(format!("pixgate-{}-mosquitto-{}", opts.name, std::process::id()));
    let mut mosquitto = DevicesBroker::prepare(&dir, &plan.devices);
    let mut ports = vec![mosquitto.gateway_port()];
    // One more for a stopped replica's replacement.
    for _ in 1..opts.replicas + usize::from(opts.stop_ms > 0 || opts.scale) {
        ports.push(mosquitto.add_gateway_listener());
    }
    let mut broker = Some(mosquitto.start().await);
    // The log of each mosquitto run stopped, for the takeovers.
    let mut broker_logs = String::new();
    let topics = central_topics(DEVICE_JOBS);
    let partitions = |name: &str| topics.iter().find(|(t, _)| *t == name).map_or(0, |(_, n)| *n as usize);
    let (device_parts, charge_parts) = (partitions("device.upserted"), partitions("charge.upserted"));
    if !(1..=charge_parts).contains(&opts.replicas) {
        bail!("between 1 and {charge_parts} replicas (each holds one charge partition at least)");
    }
    if opts.replicas < 2 && (opts.kills > 0 || opts.stop_ms > 0 || opts.scale) {
        bail!("kills, a stop or scaling need two replicas at least");
    }
    let rig = Rig::builder(&opts.name).topics(&topics).envs(replica_env(&mosquitto, &ports, opts, 0)).start().await;

    let (carried_tx, mut carried_rx) = tokio::sync::mpsc::unbounded_channel();
    let stats = Arc::new(Stats::with_sink(carried_tx));
    // When each charge's events were handed to the producer: a charge's next event goes out
    // only once its last one's effects are carried out, so an effect belongs to the latest
    // event handed before it was carried out.
    let handed: Arc<std::sync::Mutex<HashMap<String, Vec<Instant>>>> = Arc::default();
    let (stop_timing, mut timing_stopped) = tokio::sync::oneshot::channel::<()>();
    let timing = {
        let handed = handed.clone();
        tokio::spawn(async move {
            let mut latencies = Vec::new();
            let latency = |c: simulators::device::Carried| {
                let handed = handed.lock().expect("handed lock");
                let at = handed.get(&c.charge).and_then(|t| t.iter().rev().find(|&&h| h <= c.done_at).copied());
                at.map(|at| c.done_at - at)
            };
            loop {
                tokio::select! {
                    c = carried_rx.recv() => match c {
                        Some(c) => latencies.extend(latency(c)),
                        None => break,
                    },
                    _ = &mut timing_stopped => {
                        while let Ok(c) = carried_rx.try_recv() {
                            latencies.extend(latency(c));
                        }
                        break;
                    }
                }
            }
            latencies.sort_unstable();
            latencies
        })
    };
    let fleet_cfg = mosquitto.fleet_config(plan.devices.clone(), &rig.dir().join("devices"));
    let fleet = fleet::start_with_options(fleet_cfg, verifying_devices(&stats)).await?;
    fleet.wait_connected(fleet_connect_timeout(plan.devices.len())).await?;
    let producer = rig.producer();
    let device_records = scenario::publish_registry(&producer, &plan, rig.gateway()).await?.len();

    let mut others = Vec::new();
    for r in 1..opts.replicas {
        others.push(start_replica(&rig, r, replica_env(&mosquitto, &ports, opts, r)).await?);
    }
    let all: Vec<&GatewayProcess> = std::iter::once(rig.gateway()).chain(others.iter()).collect();
    let shares = settle(&all, device_parts, charge_parts).await?;
    drop(all);

    if opts.stop_ms > 0 && opts.kills > 0 {
        bail!("a stop and kills in one run are not supported: the kills restart r1");
    }
    if opts.gone && (!opts.dynamic || opts.kills + 2 > opts.replicas) {
        bail!("replicas killed for good need dynamic membership and one replica besides r0 left");
    }
    if opts.broker_restarts > 0 && (opts.stop_ms > 0 || opts.kills > 0) {
        bail!("broker restarts with kills or a stop in one run are not supported");
    }
    if opts.scale && (opts.stop_ms > 0 || opts.kills > 0 || opts.broker_restarts > 0) {
        bail!("scaling with kills, a stop or broker restarts in one run is not supported");
    }
    if opts.scale && opts.replicas >= charge_parts {
        bail!(
            "scaling out needs fewer than {charge_parts} replicas at start (each holds one charge partition at least)"
        );
    }
    let deadline = Instant::now()
        + Duration::from_millis(opts.stop_ms)
        + Duration::from_secs(240 + 60 * opts.kills as u64)
        + Duration::from_millis(60 * opts.events as u64);
    let expected_effects = plan.expected_count() as u64;
    let mut sigterm_clean = None;
    let disrupt = async {
        let mut logs = Vec::new();
        if opts.scale {
            while stats.carried_out() < expected_effects / 5 {
                if Instant::now() > deadline {
                    bail!("stuck at {} effects before scaling out", stats.carried_out());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let r = opts.replicas;
            println!("replica r{r} joins at {} effects carried out", stats.carried_out());
            others.push(start_replica(&rig, r, replica_env(&mosquitto, &ports, opts, r)).await?);
            // The scale-in comes only once the group has settled on the new member and it
            // has delivered: otherwise the join and the leave could fall into one rebalance.
            let grown: Vec<&GatewayProcess> = std::iter::once(rig.gateway()).chain(others.iter()).collect();
            settle(&grown, device_parts, charge_parts).await.context("after the scale-out")?;
            drop(grown);
            let newcomer = others.last().expect("the replica that joined");
            while newcomer.stats().map_or(0, |s| s.counters.effects_done.values().sum::<u64>()) == 0 {
                if Instant::now() > deadline {
                    bail!("the replica that joined delivered nothing (at {} effects)", stats.carried_out());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            println!("replica r{r} holds partitions and delivers at {} effects carried out", stats.carried_out());
            if stats.carried_out() >= expected_effects * 4 / 5 {
                bail!(
                    "the scale-out took until {} of {expected_effects} effects: too few left to scale in under load (more events)",
                    stats.carried_out()
                );
            }
            println!("SIGTERM replica r1 at {} effects carried out", stats.carried_out());
            let mut leaving = others.remove(0);
            logs.push(leaving.log().to_path_buf());
            let clean = tokio::task::spawn_blocking(move || leaving.stop(Duration::from_secs(30))).await?;
            println!(
                "replica r1 exited ({}) at {} effects carried out",
                if clean { "cleanly" } else { "not cleanly" },
                stats.carried_out()
            );
            sigterm_clean = Some(clean);
            return Ok::<_, anyhow::Error>(logs);
        }
        for k in 0..opts.broker_restarts {
            let target = expected_effects * (k as u64 + 1) / (opts.broker_restarts as u64 + 1);
            while stats.carried_out() < target {
                if Instant::now() > deadline {
                    bail!("stuck at {} effects before broker restart {k}", stats.carried_out());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let old = broker.take().expect("a broker runs between restarts");
            broker_logs.push_str(&old.log_text());
            old.stop().await;
            println!("mosquitto SIGKILLed at {} effects carried out", stats.carried_out());
            tokio::time::sleep(Duration::from_millis(500)).await;
            broker = Some(mosquitto.start().await);
            println!("mosquitto started again at {} effects carried out", stats.carried_out());
        }
        if opts.stop_ms > 0 {
            while stats.carried_out() < expected_effects / 3 {
                if Instant::now() > deadline {
                    bail!("stuck at {} effects before the stop", stats.carried_out());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let pid = others[0].pid().to_string();
            signal("-STOP", &pid)?;
            println!("SIGSTOP replica r1 at {} effects carried out", stats.carried_out());
            // Its replacement: r1's identity (group instance id) on an empty outbox (what an
            // orchestrator does for a replica it holds dead when the volume is gone), its
            // own ports and broker listener. Its queues come from the delivery log and its
            // charges' states from the route changelog: without them it would show QRs a
            // later record had superseded.
            let outbox = rig.dir().join("data-r1-replacement/outbox.redb");
            let settings = GatewaySettings {
                http_port: free_port(),
                mqtt_port: free_port(),
                outbox_path: outbox,
                ..others[0].settings().clone()
            };
            let mut env = replica_env(&mosquitto, &ports, opts, 1);
            env.retain(|(k, _)| *k != "PIXGATE_BROKER__PORT" && *k != "PIXGATE_BROKER__ACKS_CLIENT_ID");
            env.push(("PIXGATE_BROKER__PORT", ports[opts.replicas].to_string()));
            env.push(("PIXGATE_BROKER__ACKS_CLIENT_ID", "pixgate-r1-replacement-acks".to_string()));
            let log = rig.dir().join("pixgate-r1-replacement.log");
            let (bin, log_path) = (rig.bin().to_path_buf(), log.clone());
            let replacement = tokio::task::spawn_blocking(move || {
                let env: Vec<(&str, String)> = env.iter().map(|(k, v)| (*k, v.clone())).collect();
                GatewayProcess::spawn_with_env(&bin, settings, &env, &log_path, Duration::from_secs(60))
            })
            .await?
            .context("starting r1's replacement")?;
            println!("r1's replacement started at {} effects carried out", stats.carried_out());
            // Until it has claimed r1's partitions and connected as their owner.
            while !std::fs::read_to_string(&log)
                .unwrap_or_default()
                .contains("partition connection to the devices' broker up")
            {
                if Instant::now() > deadline {
                    bail!("r1's replacement never connected a partition connection");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            tokio::time::sleep(Duration::from_millis(opts.stop_ms)).await;
            signal("-CONT", &pid)?;
            println!("SIGCONT replica r1 at {} effects carried out", stats.carried_out());
            // Long enough for its connections to find themselves closed and ask the log.
            tokio::time::sleep(Duration::from_secs(5)).await;
            let mut stale = std::mem::replace(&mut others[0], replacement);
            stale.stop(Duration::from_secs(10));
            logs.push(stale.log().to_path_buf());
            return Ok::<_, anyhow::Error>(logs);
        }
        for k in 0..opts.kills {
            let target = expected_effects * (k as u64 + 1) / (opts.kills as u64 + 1);
            while stats.carried_out() < target {
                if Instant::now() > deadline {
                    bail!("stuck at {} effects before kill {k}", stats.carried_out());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if opts.gone {
                // The last one started goes, so that r1 stays others[0].
                let mut replica = others.pop().expect("a replica to kill");
                logs.push(replica.log().to_path_buf());
                replica.kill();
                println!(
                    "SIGKILL replica r{} for good at {} effects carried out",
                    others.len() + 1,
                    stats.carried_out()
                );
                continue;
            }
            let r = 1 + k % (opts.replicas - 1);
            let replica = &mut others[r - 1];
            let settings = replica.settings().clone();
            logs.push(replica.log().to_path_buf());
            replica.kill();
            println!("SIGKILL replica r{r} at {} effects carried out", stats.carried_out());
            let env = replica_env(&mosquitto, &ports, opts, r);
            let log = rig.dir().join(format!("pixgate-r{r}-after-kill-{k}.log"));
            let bin = rig.bin().to_path_buf();
            let log_path = log.clone();
            let restarted = tokio::task::spawn_blocking(move || {
                let env: Vec<(&str, String)> = env.iter().map(|(k, v)| (*k, v.clone())).collect();
                GatewayProcess::spawn_with_env(&bin, settings, &env, &log_path, Duration::from_secs(60))
            })
            .await?
            .with_context(|| format!("starting replica r{r} again after kill {k}"))?;
            *replica = restarted;
        }
        Ok::<_, anyhow::Error>(logs)
    };
    // The logs of the replicas no longer running (killed, frozen, scaled in).
    let fed = Instant::now();
    let note =
        |charge: &str, at: Instant| handed.lock().expect("handed lock").entry(charge.to_string()).or_default().push(at);
    let (positions, gone_logs) =
        tokio::join!(scenario::feed_keeping_up_noting(&producer, &plan, stats.clone(), deadline, note), disrupt);
    let (positions, gone_logs) = (positions?, gone_logs?);
    let all: Vec<&GatewayProcess> = std::iter::once(rig.gateway()).chain(others.iter()).collect();
    let charge_ends = scenario::end_offsets(&positions);
    let group = rig.settings().group_id.clone();
    let route = format!("{group}-route");
    scenario::wait_all_delivered_in(rig.gateway(), &route, &plan, &charge_ends, &BTreeMap::new(), &stats, deadline)
        .await?;
    let feed = fed.elapsed();
    for (r, g) in all.iter().enumerate().skip(1) {
        while !g.stats().is_ok_and(|s| s.counters.pending_records == 0 && s.counters.outbox_jobs == 0) {
            if Instant::now() > deadline {
                bail!("replica r{r} still busy: {:?}", g.stats().map(|s| s.counters));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let report = fleet.shutdown().await;
    drop(producer);
    let bare = if opts.baseline {
        let charges = plan.charges.len() as u64;
        Some(crate::kafka::bare_consume(rig.brokers(), &["charge.upserted"], charges).await?)
    } else {
        None
    };
    let _ = stop_timing.send(());
    let latencies = timing.await.context("the latency task")?;
    let delivery = scenario::check_delivery(&plan, &positions, &report.effects)?;
    let job_copies = job_copies(rig.brokers(), delivery.effects).await?;

    let shares = if opts.scale || opts.gone { settle(&all, device_parts, charge_parts).await? } else { shares };
    let mut replicas = Vec::new();
    for (g, share) in all.iter().zip(shares) {
        let s = g.stats()?;
        let log = g.log();
        replicas.push(ReplicaReport {
            partitions: share,
            routed: count(&s.counters.events_read, "charge.upserted"),
            delivered: s.counters.effects_done.values().sum(),
            registry_at_start: registry_at_start(&std::fs::read_to_string(log).unwrap_or_default()),
            rejoins: s.counters.group_rejoins.values().sum(),
        });
    }
    let (mut restored_jobs, mut stood_down, mut suspended) = (0, 0, 0);
    let (mut partition_connections_dropped, mut partition_connections_not_back) = (0, Vec::new());
    let (mut moved_devices, mut longest_take_ms) = (0, 0);
    let logs: Vec<std::path::PathBuf> = all.iter().map(|g| g.log().to_path_buf()).chain(gone_logs).collect();
    if opts.broker_restarts > 0 {
        // A partition connection whose devices had nothing left to receive reconnects
        // after its backoff, maybe after the last effect: waited for, under the deadline.
        let not_back = || {
            logs.iter()
                .any(|log| !partition_connection_drops(&std::fs::read_to_string(log).unwrap_or_default()).1.is_empty())
        };
        while not_back() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    for (i, log) in logs.iter().enumerate() {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        for take in text.lines().filter(|l| l.contains("device-jobs partition taken")) {
            let field = |name: &str| {
                take.split_whitespace().find_map(|w| w.strip_prefix(name)).and_then(|n| n.parse::<u64>().ok())
            };
            moved_devices += field("devices=").unwrap_or(0);
            longest_take_ms = longest_take_ms.max(field("ms=").unwrap_or(0));
        }
        let (dropped, not_back) = partition_connection_drops(&text);
        partition_connections_dropped += dropped;
        partition_connections_not_back.extend(not_back.into_iter().map(|p| (i, p)));
        restored_jobs += restored_in(&text);
        stood_down += text.lines().filter(|l| l.contains("partition connection taken over")).count();
        suspended +=
            text.lines().filter(|l| l.contains("another replica's claim overtook")).map(partitions_in).sum::<usize>();
    }
    let broker = broker.expect("a broker runs after the restarts");
    broker_logs.push_str(&broker.log_text());
    let takeovers = takeovers(&broker_logs, &ports);
    let mut device_topic_commits = Vec::new();
    for g in [route, format!("{group}-deliver"), format!("{group}-registry")] {
        let committed = committed_offsets(rig.brokers(), &g, "device.upserted", device_parts as i32)?;
        device_topic_commits.push((g, committed));
    }
    drop(others);
    broker.stop().await;
    rig.shutdown();
    mosquitto.remove();
    Ok(CentralReport {
        expected: plan.expected_count(),
        delivery,
        order_violations: report.stats.order_violations,
        raw_jobs: report.stats.raw_jobs,
        device_records,
        replicas,
        device_topic_commits,
        kills: opts.kills,
        restored_jobs,
        takeovers,
        stood_down,
        broker_restarts: opts.broker_restarts,
        sigterm_clean,
        moved_devices,
        longest_take_ms,
        duplicates: report.stats.duplicates,
        job_copies,
        partition_connections_dropped,
        partition_connections_not_back,
        suspended,
        feed,
        latencies,
        bare,
        secs: began.elapsed().as_secs_f64(),
    })
}

/// The extra copies of jobs on the device-jobs topic: every record read (at least
/// `at_least`, then until none came for 3 s), counted by message id. tansu 0.6.0 serves a
/// busy topic's reads at a few hundred records a second: 60 s and 10 ms per record.
async fn job_copies(brokers: &str, at_least: usize) -> anyhow::Result<u64> {
    let within = Duration::from_secs(60) + Duration::from_millis(10 * at_least as u64);
    let records =
        crate::kafka::read_topic(brokers, DEVICE_JOBS.0, DEVICE_JOBS.1, at_least, Duration::from_secs(3), within)
            .await?;
    let mut seen: HashMap<String, u64> = HashMap::new();
    for r in &records {
        let v: serde_json::Value = serde_json::from_slice(&r.value).context("a device-jobs record")?;
        let id = v["job"]["message_id"].as_str().context("a device-jobs record without job.message_id")?;
        *seen.entry(id.to_string()).or_default() += 1;
    }
    Ok(seen.values().map(|n| n - 1).sum())
}

/// In a replica's log: how many times a partition connection dropped while up, and the
/// partitions whose connection's last line is such a drop (not up again, not closed).
fn partition_connection_drops(log: &str) -> (usize, Vec<i32>) {
    let mut last: BTreeMap<i32, bool> = BTreeMap::new();
    let mut dropped = 0;
    for line in log.lines() {
        let down = line.contains("a partition connection to the devices' broker dropped");
        let back = line.contains("partition connection to the devices' broker up")
            || line.contains("partition connection to the devices' broker closed")
            || line.contains("partition connection taken over");
        if !(down || back) {
            continue;
        }
        let Some(p) = line
            .split_once(" partition=")
            .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
        else {
            continue;
        };
        dropped += usize::from(down);
        last.insert(p, down);
    }
    (dropped, last.into_iter().filter(|(_, down)| *down).map(|(p, _)| p).collect())
}

/// How many partitions a log line's `partitions=[a, b]` field names.
fn partitions_in(line: &str) -> usize {
    line.split_once("partitions=[")
        .and_then(|(_, rest)| rest.split_once(']'))
        .map_or(0, |(list, _)| list.split(',').filter(|p| !p.trim().is_empty()).count())
}

/// The jobs a replica's log says it restored from the delivery log, in all.
fn restored_in(log: &str) -> u64 {
    log.lines()
        .filter(|l| l.contains("device-jobs partition taken"))
        .filter_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("jobs=")).and_then(|n| n.parse::<u64>().ok()))
        .sum()
}

/// Sends `sig` (`-STOP`, `-CONT`) to process `pid` with kill(1).
fn signal(sig: &str, pid: &str) -> anyhow::Result<()> {
    let status = std::process::Command::new("kill").args([sig, pid]).status().context("running kill")?;
    anyhow::ensure!(status.success(), "kill {sig} {pid}: {status}");
    Ok(())
}

/// The broker's takeovers, from its log: (client id, replica that held it, replica that
/// took it), each replica known by its listener's port in `ports` (index = replica).
fn takeovers(log: &str, ports: &[u16]) -> Vec<(String, Option<usize>, Option<usize>)> {
    use std::collections::HashMap;
    // mosquitto 2.0: `New connection from 127.0.0.1:54321 on port 8884.`, then
    // `Client C already connected, closing old connection.` when C is held, then
    // `New client connected from 127.0.0.1:54321 as C (…)`.
    let (mut listener_of, mut holder, mut pending) = (HashMap::new(), HashMap::new(), Vec::new());
    let mut out = Vec::new();
    for line in log.lines() {
        let line = line.split_once(": ").map_or(line, |(_, rest)| rest);
        if let Some(rest) = line.strip_prefix("New connection from ") {
            if let Some((from, port)) = rest.split_once(" on port ") {
                let port: u16 = port.trim_end_matches('.').parse().unwrap_or(0);
                listener_of.insert(from.to_string(), ports.iter().position(|p| *p == port));
            }
        } else if let Some(rest) = line.strip_prefix("Client ") {
            if let Some(client) = rest.strip_suffix(" already connected, closing old connection.") {
                pending.push((client.to_string(), holder.get(client).copied().flatten()));
            }
        } else if let Some(rest) = line.strip_prefix("New client connected from ") {
            if let Some((from, rest)) = rest.split_once(" as ") {
                let client = rest.split_whitespace().next().unwrap_or_default().to_string();
                let replica = listener_of.get(from).copied().flatten();
                if let Some(i) = pending.iter().position(|(c, _)| *c == client) {
                    let (c, old) = pending.remove(i);
                    out.push((c, old, replica));
                }
                holder.insert(client, replica);
            }
        }
    }
    out
}

/// Starts replica `r` (`r` ≥ 1) with the rig's settings but ports and an outbox of its own
/// (`data-r{r}/`), `env` beyond them, logging to `pixgate-r{r}.log` in the rig's folder;
/// waits off the async threads until it listens.
async fn start_replica(rig: &Rig, r: usize, env: Vec<(&'static str, String)>) -> anyhow::Result<GatewayProcess> {
    let settings = GatewaySettings {
        http_port: free_port(),
        mqtt_port: free_port(),
        outbox_path: rig.dir().join(format!("data-r{r}/outbox.redb")),
        ..rig.settings().clone()
    };
    let (bin, log) = (rig.bin().to_path_buf(), rig.dir().join(format!("pixgate-r{r}.log")));
    tokio::task::spawn_blocking(move || {
        let env: Vec<(&str, String)> = env.iter().map(|(k, v)| (*k, v.clone())).collect();
        GatewayProcess::spawn_with_env(&bin, settings, &env, &log, Duration::from_secs(60))
    })
    .await?
    .with_context(|| format!("starting replica r{r}"))
}

/// Replica `r`'s settings beyond the rig's: the central shape, its own listener on the
/// broker (`ports[r]`), its own client ids for the single connections (one client id holds
/// one connection at a time; the partition connections' ids are shared, which is the
/// fence) and its own group instance id, none with `scale` (a shared one makes two replicas one member: tansu
/// then gives each every partition).
fn replica_env(
    mosquitto: &DevicesBroker,
    ports: &[u16],
    opts: &CentralOptions,
    r: usize,
) -> Vec<(&'static str, String)> {
    let instance = format!("pixgate-{}-r{r}", opts.name);
    let mut env = mosquitto.replica_env(r, DEVICE_JOBS);
    env.retain(|(k, _)| *k != "PIXGATE_BROKER__PORT");
    env.push(("PIXGATE_BROKER__PORT", ports[r].to_string()));
    env.extend([
        // Scaling in needs the leaving replica's LeaveGroup: librdkafka sends none for a
        // static member, whose partitions then wait for its session timeout, and tansu
        // 0.6.0 has no session timer (docs/cluster.md), so they would never move.
        ("PIXGATE_KAFKA__INSTANCE_ID", if opts.scale || opts.dynamic { String::new() } else { instance }),
    ]);
    env.extend(opts.env.iter().cloned());
    env
}

/// Partitions of `topic` a replica holds (or reads, for the device topic).
fn assigned(gw: &GatewayProcess, topic: &str) -> usize {
    gw.stats().ok().and_then(|s| s.topics.get(topic).map(|t| t.assigned_partitions as usize)).unwrap_or(0)
}

/// Waits until the replicas hold every charge and device-jobs partition between them, each
/// some of both and every device partition; returns each one's (device, charge,
/// device-jobs) partitions.
async fn settle(
    all: &[&GatewayProcess],
    device_parts: usize,
    charge_parts: usize,
) -> anyhow::Result<Vec<(usize, usize, usize)>> {
    let until = Instant::now() + Duration::from_secs(90);
    loop {
        let shares: Vec<(usize, usize, usize)> = all
            .iter()
            .map(|g| (assigned(g, "device.upserted"), assigned(g, "charge.upserted"), assigned(g, DEVICE_JOBS.0)))
            .collect();
        let settled = shares.iter().all(|(d, c, j)| *d == device_parts && *c > 0 && *j > 0)
            && shares.iter().map(|s| s.1).sum::<usize>() == charge_parts
            && shares.iter().map(|s| s.2).sum::<usize>() == DEVICE_JOBS.1 as usize;
        if settled {
            return Ok(shares);
        }
        if Instant::now() > until {
            bail!("the groups did not settle on {} members: (device, charge, device-jobs) {shares:?}", all.len());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The device records the registry reader had to read at start, from its log line
/// (`reading the device registry in full … records=N`).
fn registry_at_start(log: &str) -> Option<usize> {
    let line = log.lines().find(|l| l.contains("reading the device registry in full"))?;
    line.split("records=").nth(1)?.split_whitespace().next()?.parse().ok()
}
