//! `pixgate`: the gateway binary. See `pixgate --help`.

use clap::{Parser, Subcommand};
use gateway::cli::brcode::{self, BrcodeCmd};
use gateway::cli::broker_config::{self, BrokerConfigCmd};
use gateway::cli::credentials::{self, CredentialsCmd};
use gateway::cli::flags::{self, FlagsCmd};
use gateway::cli::inspect::{self, DeadLetterCmd, Inspection, OutboxCmd};
use gateway::cli::kafka::KafkaCmd;
use gateway::cli::print::{self, PrintCmd};
use gateway::config::{Config, LogFormat};
use std::path::PathBuf;

/// mimalloc instead of glibc's malloc: a fifth of the gateway's CPU under load went to
/// glibc's allocator (`_int_malloc`, `_int_free`, `malloc_consolidate`), and its
/// per-thread arenas kept freed memory in the resident set. Built without transparent huge
/// pages (feature `no_thp`): with them mimalloc's resident set was 2.5 times larger
/// (about 650 MiB against 260 in the load harness, 500 devices).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `pixgate --version`: the crate's version and the git commit it was built from
/// (`build.rs`; `unknown` outside a git checkout).
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("PIXGATE_GIT_COMMIT"), ")");

/// pixgate: Pix charge events from Kafka → QR screens and receipts on card machines and
/// printers, over an embedded MQTT broker, with per-device order and acknowledgements.
///
/// Configuration: built-in defaults, then `--config FILE` (TOML), then environment
/// variables `PIXGATE_<SECTION>__<KEY>`, e.g. `PIXGATE_KAFKA__BROKERS=127.0.0.1:9092`,
/// `PIXGATE_MQTT__LISTEN=0.0.0.0:8883`, `PIXGATE_HTTP__LISTEN=127.0.0.1:8080`.
/// `pixgate config` prints the result.
#[derive(Parser)]
#[command(name = "pixgate", version = VERSION, about, long_about)]
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
    /// Effect flags per kind (cutover and rollback): `pixgate flags` lists them,
    /// `pixgate flags set KIND on|off` switches one (same access as `outbox`; switching
    /// needs the admin token).
    Flags {
        #[command(subcommand)]
        cmd: Option<FlagsCmd>,
    },
    /// Reconciliation counts per topic in windows of event time: records read, effects
    /// queued, skipped, delivered, superseded, expired, ignored and dead-lettered.
    Report(gateway::cli::report::ReportArgs),
    /// Kafka operations: `pixgate kafka reposition` moves a stopped consumer group.
    #[command(subcommand)]
    Kafka(KafkaCmd),
    /// Decode and validate a Pix BR Code, or encode one (no configuration, Kafka or broker needed).
    #[command(subcommand)]
    Brcode(BrcodeCmd),
    /// Send a raw ESC/POS stream to a printer over TCP 9100, serial or USB, and print the
    /// status it answered (`DLE EOT`), before and after (no configuration needed).
    Print(PrintCmd),
    /// Device credentials: a fleet CA, certificates and secrets, revocation.
    #[command(subcommand)]
    Devices(DevicesCmd),
}

#[derive(Subcommand)]
enum DevicesCmd {
    /// Issue and revoke the credentials devices connect with (see `docs/operations.md`).
    #[command(subcommand)]
    Credentials(CredentialsCmd),
    /// Write the configuration of the devices' MQTT broker (the central shape) from the
    /// fleet CA and pixgate's own CA.
    #[command(subcommand)]
    BrokerConfig(BrokerConfigCmd),
}

/// Logs to stderr, filtered by `RUST_LOG` (default: info; librdkafka at warn), as plain
/// lines or one JSON object per line (`log.format`).
fn init_logs(format: LogFormat) {
    use tracing_subscriber::layer::{Layer, SubscriberExt};
    use tracing_subscriber::util::SubscriberInitExt;
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,librdkafka=warn".into());
    let fmt = match format {
        LogFormat::Plain => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .boxed(),
        // The event's fields at the top level, beside `message`, so that one filter
        // (`jq 'select(.charge == "…")'`) follows a payment; the span a line was logged in
        // (a traced record's `trace_id`) under `span`.
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .with_writer(std::io::stderr)
            .boxed(),
    };
    tracing_subscriber::registry().with(filter).with(fmt).init();
}

/// How long the process waits at exit for what still runs on its blocking threads (a
/// librdkafka client closing), once the gateway has stopped.
const EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Some(Cmd::Brcode(cmd)) = &cli.command {
        std::process::exit(brcode::run(cmd));
    }
    if let Some(Cmd::Print(cmd)) = &cli.command {
        let config = || Config::load(cli.config.as_deref()).map_err(|e| anyhow::anyhow!("configuration: {e}"));
        std::process::exit(print::run(cmd, config));
    }
    // The configuration first: it says how to log. Nothing logs while it loads, and an
    // error in it is printed on stderr as `Error: configuration: …`.
    let cfg = Config::load(cli.config.as_deref()).map_err(|e| anyhow::anyhow!("configuration: {e}"))?;
    init_logs(cfg.log.format);
    gateway::telemetry::panic::install();
    match cli.command.unwrap_or(Cmd::Run) {
        Cmd::Config => {
            print!("{}", toml::to_string_pretty(&cfg)?);
            Ok(())
        }
        Cmd::Brcode(_) | Cmd::Print(_) => unreachable!("brcode and print run before the configuration is loaded"),
        Cmd::Run => {
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            let result = runtime.block_on(gateway::app::run(cfg));
            // A librdkafka client still closing on a blocking thread (its brokers gone,
            // rust-rdkafka #611) would hold the exit for good: it gets this long.
            runtime.shutdown_timeout(EXIT_WAIT);
            result
        }
        Cmd::Outbox(cmd) => inspect::command(&cfg, Inspection::Outbox(cmd)),
        Cmd::Deadletter(cmd) => inspect::command(&cfg, Inspection::DeadLetter(cmd)),
        Cmd::Flags { cmd } => flags::command(&cfg, cmd),
        Cmd::Report(args) => gateway::cli::report::command(&cfg, &args),
        Cmd::Kafka(cmd) => gateway::cli::kafka::command(&cfg, cmd),
        Cmd::Devices(DevicesCmd::Credentials(cmd)) => credentials::run(&cmd, cfg.mqtt.credentials.as_deref()),
        Cmd::Devices(DevicesCmd::BrokerConfig(cmd)) => broker_config::run(&cmd),
    }
}
