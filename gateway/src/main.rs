//! `pixgate`: the gateway binary. See `pixgate --help`.

use anyhow::Context;
use clap::{Parser, Subcommand};
use gateway::clock::Clock;
use gateway::config::Config;
use gateway::dispatch::Dispatcher;
use gateway::inspect::{self, DeadLetterCmd, OutboxCmd};
use gateway::stats::Stats;
use gateway::{consumer, http, mqtt};
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::{mpsc, watch};

/// mimalloc instead of glibc's malloc: a fifth of the gateway's CPU under load went to
/// glibc's allocator (`_int_malloc`, `_int_free`, `malloc_consolidate`), and its
/// per-thread arenas kept freed memory in the resident set. Built without transparent huge
/// pages (feature `no_thp`): with them mimalloc's resident set was 2.5 times larger
/// (about 650 MiB against 260 in the load harness, 500 devices).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod brcode_cli;

/// pixgate: Pix charge events from Kafka → QR screens and receipts on card machines and
/// printers, over an embedded MQTT broker, with per-device order and acknowledgements.
///
/// Configuration: built-in defaults, then `--config FILE` (TOML), then environment
/// variables `PIXGATE_<SECTION>__<KEY>`, e.g. `PIXGATE_KAFKA__BROKERS=127.0.0.1:9092`,
/// `PIXGATE_MQTT__LISTEN=0.0.0.0:1883`, `PIXGATE_HTTP__LISTEN=127.0.0.1:8080`.
/// `pixgate config` prints the result.
#[derive(Parser)]
#[command(version, about, long_about)]
struct Cli {
    /// TOML configuration file.
    #[arg(long, short, env = "PIXGATE_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Cmd>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the gateway (the default): Kafka consumer, MQTT broker, delivery, /healthz, /readyz, /stats.
    Run,
    /// Print the effective configuration as TOML (usable as a `--config` file).
    Config,
    /// Inspect the durable outbox: queued jobs per device. Asks the running gateway at
    /// `http.listen`, or opens `outbox.path` when none runs.
    #[command(subcommand)]
    Outbox(OutboxCmd),
    /// Inspect and replay dead letters kept in the outbox (same access as `outbox`).
    #[command(subcommand)]
    Deadletter(DeadLetterCmd),
    /// Decode and validate a Pix BR Code, or encode one (no configuration, Kafka or broker needed).
    #[command(subcommand)]
    Brcode(brcode_cli::BrcodeCmd),
}

/// Logs to stderr, filtered by `RUST_LOG` (default: info; rumqttd and librdkafka at warn).
///
/// rumqttd's spans are never recorded: its router opens one per message it routes (an
/// error-level `publish` span with the topic debug-formatted, and more), and the log
/// formatter renders each span's fields when it opens, log line or not: about 5% of the
/// gateway's CPU in the load harness. rumqttd's warnings and errors still log, without
/// that span context.
fn init_logs() {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,rumqttd=warn,librdkafka=warn".into());
    // Global filters, not per-layer ones: a global filter's verdict is cached per callsite,
    // so a disabled rumqttd span costs nothing. As per-layer filters (5427f51) they were
    // asked again at every span and the registry still opened each one: 4% of the CPU.
    let broker_span = |meta: &tracing::Metadata<'_>| !(meta.is_span() && meta.target().starts_with("rumqttd"));
    let no_broker_spans = tracing_subscriber::filter::filter_fn(broker_span);
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    tracing_subscriber::registry().with(no_broker_spans).with(filter).with(fmt).init();
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Some(Cmd::Brcode(cmd)) = &cli.command {
        std::process::exit(brcode_cli::run(cmd));
    }
    init_logs();
    let cfg = Config::load(cli.config.as_deref()).map_err(|e| anyhow::anyhow!("configuration: {e}"))?;
    match cli.command.unwrap_or(Cmd::Run) {
        Cmd::Config => {
            print!("{}", toml::to_string_pretty(&cfg)?);
            Ok(())
        }
        Cmd::Brcode(_) => unreachable!("brcode runs before the configuration is loaded"),
        Cmd::Run => tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(run(cfg)),
        Cmd::Outbox(cmd) => inspect_command(&cfg, Inspection::Outbox(cmd)),
        Cmd::Deadletter(cmd) => inspect_command(&cfg, Inspection::DeadLetter(cmd)),
    }
}

enum Inspection {
    Outbox(OutboxCmd),
    DeadLetter(DeadLetterCmd),
}

/// Runs an `outbox`/`deadletter` command; exits 1 when it was refused (error on stderr).
fn inspect_command(cfg: &Config, cmd: Inspection) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let (listen, path) = (cfg.http.listen.as_str(), cfg.outbox.path.as_path());
    let ok = rt.block_on(async {
        match cmd {
            Inspection::Outbox(OutboxCmd::List { device: None }) => inspect::run(listen, path, "/outbox".into(), false, inspect::outbox_devices).await,
            Inspection::Outbox(OutboxCmd::List { device: Some(d) }) => {
                inspect::run(listen, path, format!("/outbox/{d}"), false, |o| inspect::outbox_list(o, &d)).await
            }
            Inspection::Outbox(OutboxCmd::Show { device, seq }) => {
                inspect::run(listen, path, format!("/outbox/{device}/{seq}"), false, |o| inspect::outbox_show(o, &device, seq)).await
            }
            Inspection::DeadLetter(DeadLetterCmd::List) => inspect::run(listen, path, "/deadletters".into(), false, inspect::deadletter_list).await,
            Inspection::DeadLetter(DeadLetterCmd::Show { id }) => {
                inspect::run(listen, path, format!("/deadletters/{id}"), false, |o| inspect::deadletter_show(o, id)).await
            }
            Inspection::DeadLetter(DeadLetterCmd::Replay { id }) => {
                let now = Clock::with_offset(cfg.clock.offset_ms).now_ms();
                let ttl = &cfg.delivery.ttl;
                inspect::run(listen, path, format!("/deadletters/{id}/replay"), true, |o| Ok(inspect::replayed(&o.replay(id, now, |k| gateway::jobs::ttl_of(k, ttl))?))).await
            }
        }
    })?;
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}

async fn run(cfg: Config) -> anyhow::Result<()> {
    let stats = Arc::new(Stats::new(&cfg));
    let clock = Clock::with_offset(cfg.clock.offset_ms);
    if cfg.clock.offset_ms != 0 || cfg.clock.control {
        tracing::warn!(offset_ms = cfg.clock.offset_ms, control = cfg.clock.control, now = %clock.now(), "clock is not the system clock (testing or replay)");
    }
    let (shutdown_tx, shutdown_rx) = watch::channel(false);

    let (commands_tx, commands_rx) = mpsc::channel(1024);
    // Unbounded in type only: one message per job that leaves the outbox, and the outbox
    // holds at most `outbox.max_jobs`. Bounding it would deadlock the dispatcher and the
    // consumer against each other (each waits on the other's full channel).
    let (finished_tx, finished_rx) = mpsc::unbounded_channel();
    let (incoming_tx, mut incoming_rx) = mpsc::channel(1024);
    let publisher = mqtt::start(&cfg.mqtt, incoming_tx).context("starting the embedded MQTT broker")?;
    tracing::info!(listen = %cfg.mqtt.listen, "embedded MQTT broker listening");

    let outbox = Arc::new(
        gateway::outbox::Outbox::open_with_cache(&cfg.outbox.path, cfg.outbox.cache_bytes).with_context(|| format!("opening the outbox {}", cfg.outbox.path.display()))?,
    );
    let pending = outbox.pending_headers()?;
    let mut per_device = std::collections::HashMap::new();
    for s in &pending {
        *per_device.entry(s.device.clone()).or_insert(0usize) += 1;
    }
    tracing::info!(jobs = pending.len(), path = %cfg.outbox.path.display(), "outbox open");
    let mut dispatcher = Dispatcher::new(cfg.delivery.clone(), publisher, finished_tx, stats.clone(), clock.clone()).with_outbox(outbox.clone());
    dispatcher.preload(pending);
    let dispatcher_task = tokio::spawn(dispatcher.run(commands_rx));
    let to_dispatcher = commands_tx.clone();
    tokio::spawn(async move {
        while let Some(msg) = incoming_rx.recv().await {
            if to_dispatcher.send(gateway::dispatch::Command::Device(msg)).await.is_err() {
                return;
            }
        }
    });

    let mut http_shutdown = shutdown_rx.clone();
    // Few at a time: a replay is an operator's command.
    let (replays_tx, replays_rx) = mpsc::channel(16);
    let state = http::AppState { stats: stats.clone(), outbox: outbox.clone(), clock: clock.clone(), clock_control: cfg.clock.control, replays: replays_tx };
    let http_task = tokio::spawn(http::serve(cfg.http.listen.clone(), state, async move {
        let _ = http_shutdown.changed().await;
    }));

    tokio::spawn(gateway::health::watch(stats.clone(), cfg.kafka.brokers.clone(), shutdown_rx.clone()));
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown requested");
        let _ = shutdown_tx.send(true);
    });

    let result = consumer::run(cfg, stats, clock, outbox, per_device, commands_tx, finished_rx, replays_rx, shutdown_rx).await;
    dispatcher_task.abort();
    match http_task.await {
        Ok(Err(e)) => tracing::error!(error = %e, "HTTP server failed"),
        Err(e) if !e.is_cancelled() => tracing::error!(error = %e, "HTTP task failed"),
        _ => {}
    }
    tracing::info!("stopped");
    result
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
