//! The gateway's wiring: opens the outbox, starts the device listener, the
//! dispatcher, the dead-letter publisher, the HTTP server and the health watch, then runs
//! the consumer until SIGTERM or Ctrl-C, and stops them in order.
//!
//! ```text
//! Kafka ──► ingest (consumer, backpressure, offsets) ──► route (registry, router, render)
//!              ▲                                               │ jobs per device
//!              │ offset stored once durably accepted           ▼
//!              └──────────────────────────────────── store (outbox: redb) ──► dead letters
//!                                                              │ Command::Enqueue
//!                                                              ▼
//!              deliver (dispatcher ──► transport: MQTT hub ◄── device sessions) ◄──TLS── devices
//!                                      │   or an external MQTT broker (`broker`) ◄──TLS── devices
//!                                      └─► direct printers' tasks ──TCP 9100 / serial / USB──► printers
//! ```

use crate::clock::Clock;
use crate::config::Config;
use crate::deliver::deadletter::Publisher as DeadLetterPublisher;
use crate::deliver::device_link::DeviceLink;
use crate::deliver::{self, Dispatcher};
use crate::ingest::consumer;
use crate::ingest::plan::Planner;
use crate::model::{DirectPrinters, Directory};
use crate::ops::admin::AdminAccess;
use crate::ops::dashboard::Dashboard;
use crate::ops::{http, probe};
use crate::shutdown::Shutdown;
use crate::store::Outbox;
use crate::telemetry::recent::Recent;
use crate::telemetry::{Monitor, Presence, Stats};
use anyhow::Context;
use std::sync::Arc;
use tokio::sync::mpsc;

/// How long the listener, the device sessions, the dashboard feed, the probe and the HTTP
/// server get to end after the consumer has stopped (they end at once when asked).
const TASKS_BOUND: std::time::Duration = std::time::Duration::from_secs(5);

/// How long each request of the start-up check for jobs left on the device-jobs topic
/// (`cluster.enabled` off) waits: short, since an edge box starts without Kafka too.
const UNREAD_CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// How long the start-up check of the device-jobs topic waits for Kafka's metadata.
const CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Runs the gateway with `cfg` until SIGTERM or Ctrl-C.
///
/// # Errors
/// The outbox cannot be opened, the MQTT broker or a Kafka client cannot be started; with
/// `cluster.enabled`, the device-jobs topic cannot be checked, is missing, or has another
/// partition count than `cluster.device_job_partitions`; without it, jobs are left unread
/// on that topic.
pub async fn run(cfg: Config) -> anyhow::Result<()> {
    let stats = Arc::new(Stats::default());
    let health = Arc::new(Monitor::new(&cfg));
    let clock = Clock::with_offset(cfg.clock.offset_ms);
    if cfg.clock.offset_ms != 0 || cfg.clock.control {
        tracing::warn!(offset_ms = cfg.clock.offset_ms, control = cfg.clock.control, now = %clock.now(), "clock is not the system clock (testing or replay)");
    }
    let shutdown = Shutdown::new();
    // The device listener and sessions end last, once the consumer has written and
    // committed: acks that arrive meanwhile still finish their jobs.
    let devices = Shutdown::new();
    let admin_token = cfg.http.admin_token()?;
    let http_listener = http::bind(&cfg.http.listen).await?;
    let admin = Arc::new(AdminAccess::new(admin_token.as_deref(), http_listener.local_addr()?)?);
    if admin.closed() {
        tracing::warn!(listen = %cfg.http.listen, "no http.admin_token and http.listen is not a loopback address: the outbox, dead-letter and clock endpoints refuse every request");
    }

    let (commands_tx, commands_rx) = mpsc::channel(1024);
    // Unbounded in type only: one message per job that leaves the outbox, and the outbox
    // holds at most `outbox.max_jobs`. Bounding it would deadlock the dispatcher and the
    // consumer against each other (each waits on the other's full channel).
    let (finished_tx, finished_rx) = mpsc::unbounded_channel();
    let (incoming_tx, incoming_rx) = mpsc::channel(1024);

    let outbox = Arc::new(
        Outbox::open_with_cache(&cfg.outbox.path, cfg.outbox.cache_bytes, cfg.outbox.check_on_open)
            .with_context(|| format!("opening the outbox {}", cfg.outbox.path.display()))?,
    );
    // The registry is restored before devices may connect: at a restart the whole fleet
    // reconnects at once, and each is checked against it.
    let directory = Arc::new(Directory::default());
    let flags = Arc::new(crate::ops::flags::load(&outbox)?);
    if let Some(line) = crate::ops::flags::readiness_line(&flags) {
        tracing::warn!("{line}");
    }
    let local_printers = match &cfg.direct.printers_file {
        Some(path) => DirectPrinters::load_file(path)?,
        None => Default::default(),
    };
    let printers = Arc::new(DirectPrinters::with_local(local_printers));
    let planner = Planner::restore(&cfg, stats.clone(), clock.clone(), &outbox, directory.clone(), printers.clone())?
        .with_flags(flags.clone());
    let directory_for_cloud = directory.clone();
    let board = deliver::cloudprnt::Board::new(
        printers.clone(),
        incoming_tx.clone(),
        std::time::Duration::from_millis(cfg.cloudprnt.offline_after_ms.max(1)),
        cfg.cloudprnt.max_polls_per_second,
    )
    .with_clock(clock.clone());
    // Through an external broker, pixgate sees no printer's MQTT session.
    let board = Arc::new(if cfg.broker.is_some() { board.with_sessions_unseen() } else { board });
    // Star printers on CloudPRNT's MQTT method GET their jobs and settings from the
    // CloudPRNT server, which tells them where to connect: pixgate's own listener, or with
    // an external broker its printers' listener (`cloudprnt.mqtt_host` and `mqtt_port`).
    let star_listener = star_listener(&cfg)?;
    let star = star_listener.is_some().then(|| board.clone() as Arc<dyn deliver::mqtt::star::StarPrinters>);
    let mut partition_links = None;
    let printers_served = cfg.cloudprnt.listen.is_some() || cfg.sdp.listen.is_some();
    let owners = (cfg.cluster.enabled && printers_served).then(|| Arc::new(deliver::broker::Owners::default()));
    let (link, presence): (DeviceLink, Option<Arc<dyn Presence>>) = match &cfg.broker {
        None => {
            let publisher = deliver::mqtt::start(
                &cfg.mqtt,
                directory,
                stats.clone(),
                incoming_tx.clone(),
                star.clone(),
                devices.clone(),
            )
            .await
            .context("starting the device listener")?;
            let presence = publisher.hub().map(|hub| hub as Arc<dyn Presence>);
            (DeviceLink::Listener(publisher), presence)
        }
        Some(broker) => {
            let (publisher, board) = deliver::broker::start(
                broker,
                cfg.cluster.enabled.then_some(cfg.cluster.device_job_partitions),
                health.clone(),
                stats.clone(),
                incoming_tx.clone(),
                deliver::broker::Extras { owners: owners.clone(), star: star.clone() },
                devices.clone(),
            )
            .context("starting the external MQTT broker's connections")?;
            partition_links = publisher.partitions();
            (DeviceLink::Broker(publisher), Some(board as Arc<dyn Presence>))
        }
    };
    // The central shape: a printer's request may reach a replica that does not hold its
    // queue, and is passed on to the one that does.
    if cfg.cluster.enabled && cfg.sdp.listen.is_some() && cfg.cloudprnt.listen.is_none() {
        anyhow::bail!("sdp.listen with cluster.enabled needs cloudprnt.listen too: the replicas pass printers' requests to each other there");
    }
    let forward = match (&partition_links, &owners) {
        (Some(links), Some(owners)) => {
            let Some(advertise) = cfg.cloudprnt.advertise.clone() else {
                anyhow::bail!("cloudprnt.listen with cluster.enabled needs cloudprnt.advertise: the URL the other replicas reach this CloudPRNT server at (e.g. https://10.0.0.5:8443)");
            };
            if !cfg.cloudprnt.plain && cfg.cloudprnt.peer_ca.is_none() {
                anyhow::bail!("cloudprnt.listen with cluster.enabled needs cloudprnt.peer_ca: the CA of the other replicas' CloudPRNT certificates");
            }
            let replica = replica_name(&cfg);
            links.set_announce(&deliver::broker::OwnerRecord { replica: replica.clone(), cloudprnt: advertise });
            let f = deliver::cloudprnt::forward::Forward::new(
                links.clone(),
                owners.clone(),
                replica,
                cfg.cloudprnt.peer_ca.as_deref(),
                cfg.cloudprnt.max_body_bytes,
                std::time::Duration::from_millis(cfg.cloudprnt.request_timeout_ms.max(1)),
                stats.clone(),
            )
            .context("cloudprnt: passing printers' requests to other replicas")?;
            let f = Arc::new(f);
            devices.spawn(f.clone().watch(health.clone(), devices.clone()));
            Some(f)
        }
        _ if cfg.cluster.enabled && printers_served => {
            anyhow::bail!("cloudprnt.listen with cluster.enabled needs the devices' broker (broker.host): the partitions' owners are known through it")
        }
        _ => None,
    };
    deliver::cloudprnt::start(
        &cfg.cloudprnt,
        board.clone(),
        directory_for_cloud,
        cfg.mqtt.credentials.clone(),
        star_listener,
        (
            |server: &deliver::cloudprnt::server::Server| {
                let sdp = deliver::sdp::Sdp {
                    server: server.clone(),
                    digest: Arc::default(),
                    conditions: Arc::default(),
                    fresh_for: std::time::Duration::from_millis(cfg.cloudprnt.offline_after_ms.max(1)),
                    outbox: outbox.clone(),
                    marking: Arc::default(),
                };
                deliver::sdp::routes(sdp, cfg.cloudprnt.max_body_bytes)
            },
            cfg.sdp.listen.as_deref(),
        ),
        forward,
        stats.clone(),
        devices.clone(),
    )
    .await
    .context("starting the CloudPRNT server")?;
    let direct_writes = Arc::new(deliver::direct::Writes::default());
    let shared = deliver::direct::printer::Shared {
        cfg: cfg.direct.clone(),
        printers: printers.clone(),
        outbox: outbox.clone(),
        incoming: incoming_tx,
        clock: clock.clone(),
        writes: direct_writes.clone(),
    };
    let transport =
        deliver::direct::Routed::new(shared, deliver::cloudprnt::CloudRouted::new(board.clone(), link, star.is_some()));

    if cfg.cluster.enabled {
        // The central shape's queues are a cache of the delivery log: what this replica
        // owns is restored from there as its partitions are assigned.
        let n = outbox.forget_all()?;
        if n > 0 {
            tracing::info!(jobs = n, "queued jobs left from the last run forgotten: each device-jobs partition's owner restores its queues from the delivery log (cluster.enabled)");
        }
    }
    let pending = outbox.pending_headers()?;
    let mut per_device = std::collections::HashMap::new();
    for s in &pending {
        *per_device.entry(s.device.clone()).or_insert(0usize) += 1;
    }
    tracing::info!(jobs = pending.len(), path = %cfg.outbox.path.display(), "outbox open");
    let recent = Arc::new(Recent::new(cfg.dashboard.recent_per_device, cfg.dashboard.kept_job_bytes));
    let mut dispatcher =
        Dispatcher::new(cfg.delivery.clone(), transport, finished_tx, stats.clone(), health.clone(), clock.clone())
            .with_outbox(outbox.clone())
            .with_recent(recent.clone())
            .with_incoming(incoming_rx);
    dispatcher.preload(pending);
    let mut dispatcher_task = tokio::spawn(dispatcher.run(commands_rx));

    // Few at a time: a replay is an operator's command.
    let (replays_tx, replays_rx) = mpsc::channel(16);
    let dashboard = Arc::new(Dashboard::new(
        stats.clone(),
        health.clone(),
        outbox.clone(),
        flags.clone(),
        clock.clone(),
        cfg.reconcile.clone(),
        cfg.dashboard.clone(),
        recent,
        presence,
        printers,
        cfg.delivery.default_time_zone.clone(),
    ));
    shutdown.spawn(dashboard.clone().run_feed(shutdown.clone()));
    let state = http::AppState {
        stats: stats.clone(),
        health: health.clone(),
        outbox: outbox.clone(),
        clock: clock.clone(),
        clock_control: cfg.clock.control,
        replays: replays_tx,
        admin,
        flags,
        reconcile: cfg.reconcile.clone(),
        dashboard,
    };
    let http_shutdown = shutdown.clone();
    let http_task = shutdown.spawn(http::serve(http_listener, state, async move {
        http_shutdown.requested().await;
    }));

    shutdown.spawn(probe::watch(stats.clone(), health.clone(), cfg.kafka.brokers.clone(), shutdown.clone()));
    let requester = shutdown.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown requested");
        requester.request();
    });

    let deadletters = DeadLetterPublisher::new(
        &cfg.kafka.brokers,
        &cfg.kafka.deadletter_topic,
        outbox.clone(),
        clock.clone(),
        stats.clone(),
    )?;
    let deadletter_wake = deadletters.notifier();
    let deadletter_task = shutdown.spawn(deadletters.run(shutdown.clone()));

    if !cfg.cluster.enabled {
        refuse_unread_jobs(&cfg).await?;
    }
    let jobs_out = if cfg.cluster.enabled {
        let (brokers, topic, partitions) =
            (cfg.kafka.brokers.clone(), cfg.cluster.device_jobs_topic.clone(), cfg.cluster.device_job_partitions);
        let log_topic = cfg.cluster.delivery_log_topic.clone();
        let (charge_topic, changelog) = (cfg.kafka.charge_topic.clone(), cfg.cluster.route_changelog_topic.clone());
        tokio::task::spawn_blocking(move || {
            crate::ingest::device_jobs::check_partitions(&brokers, &topic, partitions, CHECK_TIMEOUT)?;
            crate::ingest::device_jobs::check_partitions(&brokers, &log_topic, partitions, CHECK_TIMEOUT)?;
            crate::ingest::route_changelog::check_partitions(&brokers, &charge_topic, &changelog, CHECK_TIMEOUT)
        })
        .await
        .context("checking the device-jobs, delivery log and route changelog topics")??;
        tracing::info!(topic = %cfg.cluster.device_jobs_topic, partitions = cfg.cluster.device_job_partitions, "jobs go through the device-jobs topic (cluster.enabled)");
        Some(Arc::new(crate::ingest::device_jobs::JobProducer::new(
            &cfg.kafka.brokers,
            &cfg.cluster.device_jobs_topic,
        )?))
    } else {
        None
    };
    let delivery_log = if cfg.cluster.enabled {
        let reader_group = format!("{}-delivery-log", cfg.kafka.group_id);
        let log = Arc::new(crate::ingest::delivery_log::DeliveryLog::new(
            &cfg.kafka.brokers,
            &cfg.cluster.delivery_log_topic,
            &reader_group,
            &replica_name(&cfg),
        )?);
        if let Some(links) = &partition_links {
            links.set_owner_check(log.clone());
        }
        Some(log)
    } else {
        None
    };
    let route_changelog = if cfg.cluster.enabled {
        Some(Arc::new(crate::ingest::route_changelog::RouteChangelog::new(
            &cfg.kafka.brokers,
            &cfg.cluster.route_changelog_topic,
            &format!("{}-route-changelog", cfg.kafka.group_id),
        )?))
    } else {
        None
    };
    let services = consumer::Services {
        cfg,
        stats,
        health,
        clock,
        outbox,
        outbox_jobs: per_device,
        planner,
        commands: commands_tx,
        finished: finished_rx,
        replays: replays_rx,
        deadletters: deadletter_wake,
        shutdown: shutdown.clone(),
        jobs_out,
        delivery_log,
        partition_links,
        route_changelog,
        cloud_printers: Some(board),
        direct_writes: Some(direct_writes),
    };
    let (result, dispatcher_died) = run_watching(consumer::run(services), &mut dispatcher_task, &shutdown).await;
    // The rest ends with the consumer, also when it could not start.
    shutdown.request();
    devices.request();
    // A dead letter being sent waits up to 30 s for Kafka: it stays parked for the next start.
    deadletter_task.abort();
    dispatcher_task.abort();
    match tokio::time::timeout(TASKS_BOUND, http_task).await {
        Ok(Ok(Err(e))) => tracing::error!(error = %e, "HTTP server failed"),
        Ok(Err(e)) if !e.is_cancelled() => tracing::error!(error = %e, "HTTP task failed"),
        Err(_) => tracing::warn!("the HTTP server did not end within {} s; exiting anyway", TASKS_BOUND.as_secs()),
        _ => {}
    }
    let (ended, devices_ended) = tokio::join!(shutdown.wait(TASKS_BOUND), devices.wait(TASKS_BOUND));
    if !(ended && devices_ended) {
        tracing::warn!(
            tasks = shutdown.running() + devices.running(),
            "tasks still running {} s after the consumer stopped; exiting anyway",
            TASKS_BOUND.as_secs()
        );
    }
    tracing::info!("stopped");
    if dispatcher_died {
        return result.and(Err(anyhow::anyhow!("the dispatcher stopped while pixgate was running")));
    }
    result
}

/// Runs `consumer` to its end while watching `dispatcher`, which ends only once the
/// consumer has ended: ended before (a panic), no job would reach a device while readiness
/// stayed green, so shutdown is requested, the consumer ends as on SIGTERM, and pixgate
/// exits with an error for its service manager to start it again. Returns the consumer's
/// result and whether the dispatcher died.
async fn run_watching(
    consumer: impl std::future::Future<Output = anyhow::Result<()>>,
    dispatcher: &mut tokio::task::JoinHandle<()>,
    shutdown: &Shutdown,
) -> (anyhow::Result<()>, bool) {
    tokio::pin!(consumer);
    tokio::select! {
        biased;
        r = &mut consumer => (r, false),
        ended = dispatcher => {
            let why = match ended {
                Ok(()) => "it returned".to_string(),
                Err(e) if e.is_panic() => "it panicked".to_string(),
                Err(e) => e.to_string(),
            };
            tracing::error!(why, "the dispatcher stopped while pixgate runs: no job reaches a device; stopping");
            shutdown.request();
            (consumer.await, true)
        }
    }
}

/// With `cluster.enabled` off, nothing reads the device-jobs topic: jobs a central-shape
/// run left there unread would never be delivered. Refuses to start while there are some;
/// starts anyway, with a warning, when Kafka cannot say (an edge box starts without Kafka).
///
/// # Errors
/// Jobs are left on the topic (how many, and what to do).
async fn refuse_unread_jobs(cfg: &Config) -> anyhow::Result<()> {
    let topic = cfg.cluster.device_jobs_topic.clone();
    let group = format!("{}-deliver", cfg.kafka.group_id);
    let (brokers, t, g) = (cfg.kafka.brokers.clone(), topic.clone(), group.clone());
    let unread = tokio::task::spawn_blocking(move || {
        crate::ingest::device_jobs::unread_jobs(&brokers, &t, &g, UNREAD_CHECK_TIMEOUT)
    })
    .await
    .context("checking the device-jobs topic")?;
    match unread {
        Ok(None) => Ok(()),
        Ok(Some(n)) => anyhow::bail!(
            "{n} jobs on {topic} were never delivered (consumer group {group}), and with cluster.enabled off nothing reads that topic: start with cluster.enabled until its lag is 0, or move {group} past them with `pixgate kafka reposition --group {group} --topic {topic} --to end` (they are then not delivered)"
        ),
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), topic = %topic, "cannot tell whether jobs are left on the device-jobs topic (cluster.enabled is off, so nothing would read them); starting anyway");
            Ok(())
        }
    }
}

/// Where Star printers on CloudPRNT's MQTT method are told to connect, if they are served
/// (`cloudprnt.listen` set): pixgate's own MQTT listener, or with an external broker
/// (`broker.host`) the broker's printers' listener, given as `cloudprnt.mqtt_host` and
/// `cloudprnt.mqtt_port` (without them such printers are told to poll).
///
/// # Errors
/// An external broker with `cloudprnt.mqtt_host` and no `cloudprnt.mqtt_port`.
fn star_listener(cfg: &Config) -> anyhow::Result<Option<deliver::cloudprnt::server::MqttListener>> {
    use deliver::cloudprnt::server::MqttListener;
    if cfg.cloudprnt.listen.is_none() {
        return Ok(None);
    }
    if cfg.broker.is_none() {
        let own_port = cfg.mqtt.listen.rsplit_once(':').and_then(|(_, p)| p.parse().ok()).unwrap_or(8883);
        return Ok(Some(MqttListener {
            host: cfg.cloudprnt.mqtt_host.clone(),
            port: cfg.cloudprnt.mqtt_port.unwrap_or(own_port),
            tls: cfg.mqtt.tls.is_some(),
        }));
    }
    match (&cfg.cloudprnt.mqtt_host, cfg.cloudprnt.mqtt_port) {
        (None, _) => Ok(None),
        (Some(host), Some(port)) => Ok(Some(MqttListener { host: Some(host.clone()), port, tls: true })),
        (Some(_), None) => anyhow::bail!(
            "cloudprnt.mqtt_host with an external broker (broker.host) needs cloudprnt.mqtt_port: the port of the broker's printers' listener (`pixgate devices broker-config mosquitto --printers-listener`)"
        ),
    }
}

/// This replica's name in the delivery log's owner records: `kafka.instance_id` when set
/// (it names the replica to Kafka too), else the host name and process id.
fn replica_name(cfg: &Config) -> String {
    if !cfg.kafka.instance_id.is_empty() {
        return cfg.kafka.instance_id.replace('/', "_");
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("{}-{}", host.trim().replace('/', "_"), std::process::id())
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dispatcher that panics while the consumer runs: shutdown is requested, the
    /// consumer ends as on SIGTERM, and the death is reported.
    #[tokio::test]
    async fn a_dispatcher_that_dies_stops_the_consumer() {
        let shutdown = Shutdown::new();
        let mut dispatcher = tokio::spawn(async { panic!("a damaged page") });
        let stopping = shutdown.clone();
        let consumer = async move {
            stopping.requested().await;
            Ok(())
        };
        let (result, died) = run_watching(consumer, &mut dispatcher, &shutdown).await;
        assert!(result.is_ok() && died);
        assert!(shutdown.is_requested());
    }

    /// The dispatcher ending once the consumer has (its commands' sender dropped) is no
    /// death.
    #[tokio::test]
    async fn a_dispatcher_ending_after_the_consumer_is_no_death() {
        let shutdown = Shutdown::new();
        let (tx, mut rx) = mpsc::channel::<()>(1);
        let mut dispatcher = tokio::spawn(async move { while rx.recv().await.is_some() {} });
        let consumer = async move {
            drop(tx);
            tokio::task::yield_now().await;
            anyhow::Ok(())
        };
        let (result, died) = run_watching(consumer, &mut dispatcher, &shutdown).await;
        assert!(result.is_ok() && !died);
        assert!(!shutdown.is_requested());
    }
}
