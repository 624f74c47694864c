//! Gateway configuration: defaults that serve the demo, overridden by a TOML file, then by
//! environment variables `PIXGATE_<SECTION>__<KEY>` (e.g. `PIXGATE_KAFKA__BROKERS`).

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The default page cache of the outbox, bytes (`outbox.cache_bytes`).
pub const DEFAULT_CACHE_BYTES: usize = 64 << 20;

/// Charge states the router holds in memory by default (`outbox.charge_cache_entries`);
/// older ones are read back from the outbox, where every applied state is stored. About
/// 100 bytes each.
pub const DEFAULT_CHARGE_CACHE: usize = 100_000;

/// All settings. Field docs give units; every field has a default.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct Config {
    /// Kafka client settings.
    pub kafka: KafkaConfig,
    /// Embedded MQTT broker settings.
    pub mqtt: MqttConfig,
    /// An external MQTT broker the devices connect to instead of pixgate's own listener
    /// (the central shape's transport, [`crate::deliver::broker`]). Unset: the edge box's
    /// own listener (`mqtt`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub broker: Option<BrokerConfig>,
    /// The central shape's stages over Kafka ([`ClusterConfig`]).
    pub cluster: ClusterConfig,
    /// Health and stats HTTP endpoint, and the admin endpoints behind a token.
    pub http: HttpConfig,
    /// How log lines are written.
    pub log: LogConfig,
    /// Delivery to devices.
    pub delivery: DeliveryConfig,
    /// The durable outbox.
    pub outbox: OutboxConfig,
    /// Printers pixgate drives itself (raw TCP, serial, USB).
    pub direct: DirectConfig,
    /// Printers that poll pixgate over Star CloudPRNT's HTTP method
    /// ([`crate::deliver::cloudprnt`]). Off unless `cloudprnt.listen` is set.
    pub cloudprnt: CloudPrntConfig,
    /// Printers on Epson Server Direct Print ([`crate::deliver::sdp`]): served at `/sdp`
    /// on `cloudprnt.listen`, and on a listener of their own if asked.
    pub sdp: SdpConfig,
    /// The wall clock used for expiry (injectable for tests and fixture replays).
    pub clock: ClockConfig,
    /// What `/readyz` checks, and throughput expected per topic ([`crate::ops::readiness`]).
    pub health: HealthConfig,
    /// The reconciliation counts per window of event time ([`crate::store::reconcile`]).
    pub reconcile: ReconcileConfig,
    /// The operator's live page ([`crate::ops::dashboard`]).
    pub dashboard: DashboardConfig,
    /// On SIGTERM/Ctrl-C: how long to finish outbox writes, dead letters and the final
    /// offset commit before exiting anyway, ms; up to half of it goes to waiting for the
    /// jobs printers are printing to be done. Nothing is lost by the cut-off:
    /// what was not committed is read again at the next start and deduplicated.
    pub shutdown_timeout_ms: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            kafka: KafkaConfig::default(),
            mqtt: MqttConfig::default(),
            broker: None,
            cluster: ClusterConfig::default(),
            http: HttpConfig::default(),
            log: LogConfig::default(),
            delivery: DeliveryConfig::default(),
            outbox: OutboxConfig::default(),
            direct: DirectConfig::default(),
            cloudprnt: CloudPrntConfig::default(),
            sdp: SdpConfig::default(),
            clock: ClockConfig::default(),
            health: HealthConfig::default(),
            reconcile: ReconcileConfig::default(),
            dashboard: DashboardConfig::default(),
            shutdown_timeout_ms: 10_000,
        }
    }
}

/// The reconciliation counts ([`crate::store::reconcile`]): kept in the outbox in
/// one-minute buckets of event time, reported in windows.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct ReconcileConfig {
    /// The window `/stats` reports them in, minutes (`pixgate report --window` chooses its own).
    pub window_minutes: u64,
    /// How many of the latest windows per topic `/stats` shows.
    pub stats_windows: usize,
    /// How long the counts are kept, by event time against the gateway's clock, hours.
    pub retention_hours: u64,
}

impl Default for ReconcileConfig {
    fn default() -> Self {
        ReconcileConfig { window_minutes: 10, stats_windows: 6, retention_hours: 168 }
    }
}

/// The dashboard ([`crate::ops::dashboard`]): what it keeps of each device's last jobs, and
/// how much of the fleet one update carries.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct DashboardConfig {
    /// The last jobs listed per device.
    pub recent_per_device: usize,
    /// Wire bytes of recent jobs kept in memory for their pictures, in all, bytes: the
    /// oldest are let go first (their jobs stay listed, without a picture).
    pub kept_job_bytes: usize,
    /// Devices listed in one update, those that need a look first (held, away, with a
    /// queue), then the most recently active; the fleet's totals cover all of them.
    pub devices_shown: usize,
}

impl Default for DashboardConfig {
    fn default() -> Self {
        DashboardConfig { recent_per_device: 4, kept_job_bytes: 8 << 20, devices_shown: 200 }
    }
}

/// Printers pixgate drives itself ([`crate::deliver::direct`]): where the ones the registry
/// does not describe are, and the timings of their connections.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct DirectConfig {
    /// The local printers file (TOML, `[printers.<device id>] endpoint = "tcp://…"`,
    /// [`crate::model::DirectPrinters::load_file`]): an entry wins over the registry's
    /// document of that printer. A bad file stops pixgate at start-up.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub printers_file: Option<PathBuf>,
    /// Opening a connection and waiting for each `DLE EOT` reply, ms.
    pub io_timeout_ms: u64,
    /// A write that makes no progress for this long holds the printer's queue, ms.
    pub stall_timeout_ms: u64,
    /// How often a held printer's status is asked again (paper out, cover open), ms.
    pub poll_ms: u64,
    /// Reconnect delay after the first failure, doubling, ms.
    pub reconnect_initial_ms: u64,
    /// Reconnect delay cap, ms.
    pub reconnect_max_ms: u64,
}

impl Default for DirectConfig {
    fn default() -> Self {
        DirectConfig {
            printers_file: None,
            io_timeout_ms: 2_000,
            stall_timeout_ms: 10_000,
            poll_ms: 1_000,
            reconnect_initial_ms: 500,
            reconnect_max_ms: 30_000,
        }
    }
}

/// The Star CloudPRNT server ([`crate::deliver::cloudprnt`]): printers whose registry
/// document says `printer.transport` `cloudprnt-http` poll it at
/// `https://LISTEN/cloudprnt`, authenticated with HTTP Basic (user: the device id,
/// password: its secret from `pixgate devices credentials issue`, checked against
/// `mqtt.credentials`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct CloudPrntConfig {
    /// Listen address, `HOST:PORT`; unset: no CloudPRNT server.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    /// The server's certificate chain and key (PEM). Required unless `plain`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<PathBuf>,
    /// The key of `tls_cert`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<PathBuf>,
    /// Serve plain HTTP: the printers' passwords cross the network readable. Only for a
    /// loopback demo or test.
    pub plain: bool,
    /// Connections open at once (a printer keeps one, polling on it); beyond, a new one is
    /// closed at once.
    pub max_connections: usize,
    /// Largest request body, bytes (a poll is a few hundred).
    pub max_body_bytes: usize,
    /// Polls a printer may make per second; beyond, `429 Too Many Requests`. Star printers
    /// poll every 5 s, and at once on a status change.
    pub max_polls_per_second: u32,
    /// A printer silent this long is reported offline and its queue held (not burning its
    /// jobs' deliveries), ms. Star's guide counts a printer gone after two poll intervals
    /// plus 5 s.
    pub offline_after_ms: u64,
    /// A connection's TLS handshake must end within this, and a connection on which
    /// nothing moves for as long is closed, ms.
    pub request_timeout_ms: u64,
    /// The host name Star printers on the MQTT method (`cloudprnt-mqtt`) are told to
    /// connect to (the settings' `hostName`); unset: the host they reached this server at.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mqtt_host: Option<String>,
    /// The port they are told (`portNumber`); unset: `mqtt.listen`'s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mqtt_port: Option<u16>,
    /// With `cluster.enabled`: this server's base URL as the other replicas reach it
    /// (`https://10.0.0.5:8443`), to which they pass the requests of printers whose queue
    /// this replica holds. Required there; its host must be in `tls_cert`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advertise: Option<String>,
    /// With `cluster.enabled`: the CA (PEM) that signed the other replicas' CloudPRNT
    /// certificates, the only one trusted when passing a printer's request on. Required
    /// unless `plain`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer_ca: Option<PathBuf>,
}

impl Default for CloudPrntConfig {
    fn default() -> Self {
        CloudPrntConfig {
            listen: None,
            tls_cert: None,
            tls_key: None,
            plain: false,
            max_connections: 4_096,
            max_body_bytes: 16 << 10,
            max_polls_per_second: 4,
            offline_after_ms: 15_000,
            request_timeout_ms: 10_000,
            mqtt_host: None,
            mqtt_port: None,
            advertise: None,
            peer_ca: None,
        }
    }
}

/// Epson Server Direct Print's endpoint ([`crate::deliver::sdp`]).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct SdpConfig {
    /// A listener of its own, `HOST:PORT`, serving `/sdp`, which `cloudprnt.listen` (when
    /// set) serves too; unset: only there. Its TLS certificate, bounds and credentials are
    /// CloudPRNT's (`cloudprnt.tls_cert`, `cloudprnt.max_connections`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
}

/// The gateway's wall clock ([`crate::clock`]).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ClockConfig {
    /// Milliseconds added to the system clock (negative: behind). Replaying fixtures
    /// recorded on another day with the offset to that day makes their `expiresDate`s
    /// meaningful; keep the same value across restarts so time never runs backward.
    pub offset_ms: i64,
    /// Testing only: serve `POST /clock/advance?ms=N`, which moves the clock forward.
    pub control: bool,
}

/// The durable per-device outbox ([`crate::store::outbox`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct OutboxConfig {
    /// The redb file. One gateway process per file.
    pub path: std::path::PathBuf,
    /// Jobs queued across all devices before the consumer pauses its partitions.
    pub max_jobs: usize,
    /// Jobs queued for one device before the consumer pauses the partitions feeding it
    /// (a soft bound: records already read may add at most one record's jobs per partition).
    pub max_jobs_per_device: usize,
    /// How long an accepted message id stays in the dedupe window, hours.
    pub dedupe_retention_hours: u64,
    /// Records written to the outbox in one durable transaction (one fsync) at most.
    pub batch_max_records: usize,
    /// Longest a read record waits for its batch to be written, ms (latency cost of batching).
    pub batch_max_delay_ms: u64,
    /// How long dead letters stay listed in the outbox for `pixgate deadletter list|replay`
    /// after Kafka has them, hours.
    pub deadletter_retention_hours: u64,
    /// redb's page cache, bytes (redb's own default is 1 GiB, which a large outbox fills:
    /// memory would grow with the backlog). Reads of queued jobs beyond it go to the disk.
    pub cache_bytes: usize,
    /// Charge states (last applied `__v` and status) the router keeps in memory, entries;
    /// older ones are read back from the outbox. At least `4 × batch_max_records`.
    pub charge_cache_entries: usize,
    /// Verify the checksum of every page of the outbox when it is opened (redb's integrity
    /// check), so that a file damaged outside pixgate (a failing SD card or eMMC, a copy cut
    /// short) is refused at start with an error naming it, where an unchecked open can
    /// panic inside redb at the first read of a damaged page. It reads the whole file.
    pub check_on_open: bool,
    /// Free bytes on the outbox's file system below which every partition pauses (and
    /// `/readyz` says so), resumed once half as much again is free: room kept for the
    /// batches in flight and for the removals of done jobs, which need writes too. 0: off
    /// (then a full disk refuses a batch, and pixgate retries it until there is room).
    pub min_free_bytes: u64,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        OutboxConfig {
            path: ".pixgate/outbox.redb".into(),
            max_jobs: 100_000,
            max_jobs_per_device: 1_000,
            dedupe_retention_hours: 24,
            batch_max_records: 256,
            batch_max_delay_ms: 5,
            deadletter_retention_hours: 168,
            cache_bytes: DEFAULT_CACHE_BYTES,
            charge_cache_entries: DEFAULT_CHARGE_CACHE,
            check_on_open: true,
            min_free_bytes: 64 * 1024 * 1024,
        }
    }
}

/// Kafka consumer, producer and topic names.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct KafkaConfig {
    /// `bootstrap.servers`, e.g. `127.0.0.1:9092`.
    pub brokers: String,
    /// Consumer group (`group.id`).
    pub group_id: String,
    /// Static group membership (`group.instance.id`, KIP-345): a restarted gateway with the
    /// same id takes its partitions back at once instead of waiting for a rebalance. Give
    /// each gateway instance its own stable id; empty = dynamic membership.
    pub instance_id: String,
    /// Charge change events.
    pub charge_topic: String,
    /// Device change events.
    pub device_topic: String,
    /// Where records and effects that cannot be carried out go, with the reason.
    pub deadletter_topic: String,
    /// Records read but not finished, per partition, before the partition is paused
    /// (backpressure: a full pipeline slows the reader, it never grows memory).
    pub max_pending_per_partition: usize,
    /// `partition.assignment.strategy`. Default `range` (eager: revoke all, reassign).
    /// `cooperative-sticky` moves only the partitions that must move and suits a real Kafka
    /// cluster; against tansu 0.6.0 a member lost its whole assignment after an incremental
    /// revoke and never got it back (seen in `tests/tests/crash_restart.rs`).
    pub assignment_strategy: String,
    /// `session.timeout.ms`.
    pub session_timeout_ms: u32,
    /// `max.poll.interval.ms`; also bounds how long a lost StreamConsumer wake-up can last.
    pub max_poll_interval_ms: u32,
    /// `fetch.wait.max.ms`: how long the broker may hold a fetch waiting for data. Every
    /// charge event waits for it when the broker does not answer as soon as a record
    /// arrives (tansu), so it is latency a customer in front of the card machine sees.
    /// Keep it well below `health.kafka_down_after_ms`: a fetch held longer reads as a
    /// broker not answering.
    pub fetch_wait_max_ms: u32,
    /// librdkafka `debug` contexts for troubleshooting, e.g. `cgrp` (consumer group joins
    /// and rebalances) or `consumer,fetch`; empty = none. Logged at debug level under the
    /// `librdkafka` target: run with `RUST_LOG=info,librdkafka=debug` to see them.
    pub debug: String,
    /// Testing only: keep the device topic's partitions paused for this long after the
    /// consumer starts, ms (0 = off), so that charges arrive while the device registry is
    /// behind (`ingest::registry_wait`, `tests/tests/upstream.rs`).
    pub hold_device_topic_ms: u64,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        KafkaConfig {
            brokers: "127.0.0.1:9092".into(),
            group_id: "pixgate".into(),
            instance_id: String::new(),
            charge_topic: "charge.upserted".into(),
            device_topic: "device.upserted".into(),
            deadletter_topic: "pixgate.deadletter".into(),
            max_pending_per_partition: 1000,
            assignment_strategy: "range".into(),
            session_timeout_ms: 10_000,
            max_poll_interval_ms: 60_000,
            fetch_wait_max_ms: 100,
            debug: String::new(),
            hold_device_topic_ms: 0,
        }
    }
}

/// The device listener (MQTT 3.1.1, pixgate's own: `deliver::mqtt`).
///
/// Devices connect over TLS (`tls`), and prove who they are with a client certificate
/// signed by `tls.client_ca` (device id = the certificate's subject CN) or with the secret
/// issued to them (`credentials`) as their MQTT password. Plain TCP only when `plain` is
/// set (a loopback demo or test), and devices without credentials only when `anonymous`
/// is set too; both are warned about at start.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct MqttConfig {
    /// Listen address for devices (MQTT 3.1.1).
    pub listen: String,
    /// Plain TCP instead of TLS. Refused unless set: no fleet should run without TLS.
    pub plain: bool,
    /// With `plain` only: a device is who its client id says (`dev-{id}`), without
    /// credentials. The access rules still hold: it reaches only that id's topics.
    pub anonymous: bool,
    /// TLS settings (required unless `plain`).
    pub tls: Option<TlsConfig>,
    /// Device secrets (`pixgate devices credentials issue`), kept as keyed hashes; the key
    /// is `{file}.key`. Re-read when the file changes.
    pub credentials: Option<PathBuf>,
    /// Refuse (and disconnect) devices that the registry does not know or has disabled.
    pub require_registered: bool,
    /// Largest MQTT packet accepted from a device, bytes (a raster-QR receipt is ~20 KiB
    /// of base64; acks and status are tiny).
    pub max_payload_bytes: usize,
    /// Most devices connected at once; the next gets CONNACK 3 (server unavailable).
    pub max_connections: usize,
    /// Most connections being admitted at once (TLS handshake, CONNECT, authentication, up
    /// to the CONNACK); while that many are, no socket is accepted (the rest wait in the
    /// kernel's listen backlog), so a storm of reconnects cannot exhaust memory, and those
    /// admitted are answered in time.
    pub max_handshakes: usize,
    /// Most of those `max_handshakes` one source address may hold, so that sockets from
    /// one address that never finish their handshake (a slowloris, a broken device in a
    /// loop) cannot keep every other device out. A quarter of the default pool: a shop
    /// behind NAT, or a carrier's NAT address shared by hundreds of card machines, still
    /// reconnects 64 at a time, each handshake taking a round trip or two, and the devices
    /// beyond it retry.
    pub max_handshakes_per_address: usize,
    /// Packets one device connection may send a second (its acks, status, pings; not its
    /// PUBACKs of the jobs it is sent); beyond it a packet is dropped unanswered, and a
    /// device beyond it for 10 s on end is disconnected. A card machine sends a few a
    /// minute; with one job in flight a device acks at most one job per round trip, and a
    /// dropped ack only brings its job again after the ack timeout.
    pub max_messages_per_second: u32,
    /// Bytes (of PUBLISH topics and payloads) one device connection may send a second, as
    /// `max_messages_per_second`.
    pub max_bytes_per_second: u64,
    /// Most connections from one source address. Generous by default: a shop behind NAT
    /// is one address, and card machines on a mobile network may share a carrier's NAT
    /// address by the hundred.
    pub max_per_address: usize,
    /// Time a socket has to finish the TLS handshake and send CONNECT, ms.
    pub connect_timeout_ms: u64,
}

impl Default for MqttConfig {
    fn default() -> Self {
        MqttConfig {
            listen: "127.0.0.1:8883".into(),
            plain: false,
            anonymous: false,
            tls: None,
            credentials: None,
            require_registered: true,
            max_payload_bytes: 1 << 20,
            max_connections: 10_000,
            max_handshakes: 256,
            max_handshakes_per_address: 64,
            max_messages_per_second: 100,
            max_bytes_per_second: 262_144,
            max_per_address: 1_000,
            connect_timeout_ms: 10_000,
        }
    }
}

/// The central shape's hand-off between its two stages (`docs/cluster.md`): with
/// `enabled`, the jobs planned from charge events are produced to `device_jobs_topic`,
/// keyed by device id, and the consumer reads them back from it into the outbox and the
/// dispatcher, instead of writing them to the outbox directly (the edge box). Both stages
/// run in this process, as members of their own groups (`{kafka.group_id}-route` for the
/// charge topic, `{kafka.group_id}-deliver` for this one); the device topic is read in
/// full, outside any group ([`crate::ingest::cluster_reader`]), so that a replica can route
/// every charge whatever partitions it holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct ClusterConfig {
    /// Route jobs through `device_jobs_topic`.
    pub enabled: bool,
    /// The topic between the stages: one record per job, key = device id, partition =
    /// murmur2 of the key (Kafka's Java default), so a device's jobs keep one partition and
    /// their order.
    pub device_jobs_topic: String,
    /// The partition count `device_jobs_topic` must have: a device's partition is its
    /// owner, so pixgate refuses to start on a topic with another count.
    pub device_job_partitions: i32,
    /// The deliver stage's log (`docs/cluster.md` "Accepting a job"): compacted, with
    /// `device_job_partitions` partitions, partition `p` holding what the owner of
    /// `device_jobs_topic` partition `p` accepted and has not finished.
    pub delivery_log_topic: String,
    /// The route stage's changelog (`docs/cluster.md` "The route stage"): compacted, with
    /// as many partitions as `kafka.charge_topic`, partition `p` holding the last applied
    /// state (`__v`, status) of each charge whose records are on charge partition `p`.
    pub route_changelog_topic: String,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            enabled: false,
            device_jobs_topic: "pixgate.device-jobs".into(),
            device_job_partitions: 48,
            delivery_log_topic: "pixgate.delivery-log".into(),
            route_changelog_topic: "pixgate.route-changelog".into(),
        }
    }
}

/// The external MQTT broker (mosquitto, EMQX, VerneMQ, HiveMQ) pixgate uses as an ordinary
/// client when devices connect to it rather than to pixgate ([`crate::deliver::broker`]).
/// pixgate opens two connections: `client_id` publishes the jobs (QoS 1 to
/// `pixgate/v1/devices/{id}/jobs`), `acks_client_id` reads every device's acks and status
/// (`pixgate/v1/devices/+/acks`, `…/+/status`, QoS 1, a persistent session). The broker
/// must let those two client ids do that and nothing else, and every device only its own
/// topics (`docs/cluster.md`, "What the broker is told").
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct BrokerConfig {
    /// The broker's host name or address (checked against its TLS certificate).
    pub host: String,
    /// The broker's port (8883: MQTT over TLS).
    pub port: u16,
    /// Plain TCP instead of TLS. Refused unless set: job payloads carry payers' names.
    pub plain: bool,
    /// TLS to the broker (required unless `plain`).
    pub tls: Option<BrokerTlsConfig>,
    /// Client id of the connection that publishes jobs. The broker lets one client id hold
    /// one connection, so a second pixgate with the same id takes this one's over.
    pub client_id: String,
    /// Client id of the connection that reads acks and status (persistent session: acks
    /// sent while it reconnects wait in the broker).
    pub acks_client_id: String,
    /// With `cluster.enabled`: jobs go out on one connection per device-jobs partition
    /// owned, client id `{prefix}-{partition}`, the same on every replica, so a new owner's
    /// connection closes the old owner's (`docs/cluster.md`, "Fencing"); `client_id` is not
    /// used then.
    pub partition_client_id_prefix: String,
    /// MQTT keep alive of both connections, s.
    pub keep_alive_s: u64,
    /// Jobs published and not yet acknowledged by the broker (PUBACK) at once.
    pub max_in_flight: u16,
    /// Largest packet either way, bytes (a raster-QR receipt is ~20 KiB of base64).
    pub max_packet_bytes: usize,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            host: "127.0.0.1".into(),
            port: 8883,
            plain: false,
            tls: None,
            client_id: "pixgate-deliver-0".into(),
            acks_client_id: "pixgate-acks-0".into(),
            partition_client_id_prefix: "pixgate-partition".into(),
            keep_alive_s: 30,
            max_in_flight: 100,
            max_packet_bytes: 1 << 20,
        }
    }
}

/// TLS to the external broker (rustls, TLS 1.2 and 1.3). PEM files, read at start.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BrokerTlsConfig {
    /// The CA the broker's certificate must chain to.
    pub ca: PathBuf,
    /// pixgate's client certificate chain, when the broker requires one (with `key`).
    #[serde(default)]
    pub cert: Option<PathBuf>,
    /// The private key of `cert`.
    #[serde(default)]
    pub key: Option<PathBuf>,
}

/// TLS for the device listener (rustls; TLS 1.2 and 1.3 only). The files are PEM and are
/// re-read when they change (checked every `reload_ms`), so certificates and revocation
/// lists are replaced without a restart.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TlsConfig {
    /// The server's certificate chain.
    pub cert: PathBuf,
    /// The server's private key.
    pub key: PathBuf,
    /// The fleet CA that signs device certificates; without it devices authenticate with
    /// secrets only.
    #[serde(default)]
    pub client_ca: Option<PathBuf>,
    /// Certificate revocation lists of the fleet CA.
    #[serde(default)]
    pub crls: Vec<PathBuf>,
    /// How often the files are checked for changes, ms.
    #[serde(default = "default_tls_reload_ms")]
    pub reload_ms: u64,
}

fn default_tls_reload_ms() -> u64 {
    5_000
}

/// The HTTP endpoint: `/healthz`, `/readyz`, `/stats` and `/metrics`, open to anyone who
/// reaches `listen`; and the admin endpoints (the outbox and dead letters, which hold
/// payers' names and receipts, replay, the test clock), which need the admin token
/// ([`crate::ops::admin`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct HttpConfig {
    /// Listen address, `HOST:PORT`.
    pub listen: String,
    /// The token the admin endpoints require (`Authorization: Bearer TOKEN`). Without one
    /// (and without `admin_token_file`), the admin endpoints answer only when `listen` is
    /// a loopback address. Never printed by `pixgate config`: it is a secret.
    #[serde(skip_serializing)]
    pub admin_token: Option<String>,
    /// A file holding the admin token (what a secrets manager mounts); surrounding white
    /// space is trimmed. Read once, at start. Exclusive with `admin_token`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_token_file: Option<PathBuf>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig { listen: "127.0.0.1:8080".into(), admin_token: None, admin_token_file: None }
    }
}

impl HttpConfig {
    /// The admin token: `admin_token`, or the contents of `admin_token_file`, trimmed;
    /// `None` when neither is set.
    ///
    /// # Errors
    /// Both are set, the file cannot be read, or the token is empty.
    pub fn admin_token(&self) -> anyhow::Result<Option<String>> {
        let token = match (&self.admin_token, &self.admin_token_file) {
            (None, None) => return Ok(None),
            (Some(_), Some(_)) => {
                anyhow::bail!("http.admin_token and http.admin_token_file are both set: give one")
            }
            (Some(t), None) => t.trim().to_string(),
            (None, Some(f)) => std::fs::read_to_string(f)
                .map_err(|e| anyhow::anyhow!("reading http.admin_token_file {}: {e}", f.display()))?
                .trim()
                .to_string(),
        };
        if token.is_empty() {
            anyhow::bail!("the admin token (http.admin_token or http.admin_token_file) is empty");
        }
        Ok(Some(token))
    }
}

/// Logging. The filter comes from `RUST_LOG`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct LogConfig {
    /// `plain` (human-readable lines) or `json` (one JSON object per line, the fields at
    /// the top level).
    pub format: LogFormat,
}

/// How a log line is written (`log.format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// `2024-05-01T12:00:00Z  INFO gateway::…: message field=value`.
    #[default]
    Plain,
    /// `{"timestamp":…,"level":"INFO","message":…,"field":value,…,"target":…}`.
    Json,
}

/// Readiness rules and the per-topic throughput expectations ([`crate::ops::readiness`]). A
/// threshold of 0 turns its rule off.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct HealthConfig {
    /// Kafka counts as unreachable once librdkafka's statistics have shown no broker
    /// connection in state `UP` for this long, ms.
    pub kafka_down_after_ms: u64,
    /// A subscribed topic of which this consumer holds no partition for this long fails
    /// readiness, ms (covers a rebalance). With more gateway instances than a topic has
    /// partitions, some instance legitimately holds none: set 0 there.
    pub unassigned_after_ms: u64,
    /// A topic with lag (records on its assigned partitions beyond the stored or
    /// committed offset) on which the consumer made no progress for this long is
    /// stalled, ms.
    pub stall_after_ms: u64,
    /// The sliding window over which the read rate per topic is measured, ms.
    pub rate_window_ms: u64,
    /// librdkafka `statistics.interval.ms`: how often the consumer's statistics (broker
    /// states, per-partition offsets and watermarks) arrive, ms. They cost no requests:
    /// librdkafka learns the watermarks from its fetch responses.
    pub statistics_interval_ms: u64,
    /// A paused partition is not fetched, so librdkafka stops learning its end offset:
    /// while any partition is paused, its end offset is asked from Kafka (ListOffsets)
    /// this often, ms, so the lag behind a pause is known.
    pub paused_probe_interval_ms: u64,
    /// Jobs in flight to reachable devices and no device ack at all for this long, ms:
    /// delivery stalled (0: off).
    pub delivery_stall_after_ms: u64,
    /// The external MQTT broker (`broker`) unreachable for this long, ms: no job can reach
    /// a device (0: off).
    pub device_broker_down_after_ms: u64,
    /// Expectations per topic name, e.g. `[health.topics."charge.upserted"]`; none by
    /// default (the demo has no live traffic).
    pub topics: std::collections::BTreeMap<String, TopicExpectation>,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            kafka_down_after_ms: 10_000,
            unassigned_after_ms: 30_000,
            stall_after_ms: 60_000,
            delivery_stall_after_ms: 120_000,
            device_broker_down_after_ms: 10_000,
            rate_window_ms: 60_000,
            statistics_interval_ms: 1_000,
            paused_probe_interval_ms: 5_000,
            topics: std::collections::BTreeMap::new(),
        }
    }
}

/// What is expected of one topic's traffic; each rule is off when absent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TopicExpectation {
    /// Longest expected gap between two records arriving on the topic, ms: quieter than
    /// that fails readiness (the source may have stopped producing).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_quiet_ms: Option<u64>,
    /// Least expected read rate while the topic has lag, records/s over
    /// `rate_window_ms`: slower than that (with lag for the whole window) is an alarm.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_rate_per_s: Option<f64>,
}

/// Device delivery: acknowledgement timeouts, retries, bounds.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct DeliveryConfig {
    /// How long to wait for a device's ack before sending the job again, ms.
    pub ack_timeout_ms: u64,
    /// First retry delay after a failed or unacknowledged delivery, ms; doubles per attempt.
    pub backoff_initial_ms: u64,
    /// Longest retry delay, ms.
    pub backoff_max_ms: u64,
    /// Deliveries of one job before it is dead-lettered.
    pub max_deliveries: u32,
    /// Time zone for devices whose registry entry has none (IANA name).
    pub default_time_zone: String,
    /// Time to live of jobs, per kind (Azure IoT Hub's per-message TTL). A job not done by
    /// then is *expired*: never sent again, recorded on the dead-letter topic (reason
    /// `expired`). `display_qr` lives until its charge's `expiresDate`.
    pub ttl: TtlConfig,
    /// Bytes of queued jobs (their JSON as published) kept in memory, all devices together.
    /// A job beyond it keeps only its header in memory and is read back from the outbox when
    /// sent; so are jobs reloaded at start-up. Memory against disk reads: at 32 MiB a backlog
    /// of a few thousand receipts is sent without reading the outbox back.
    pub held_payload_bytes: usize,
}

/// Time to live per job kind, seconds from when the job is accepted into the outbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct TtlConfig {
    /// `display_qr` of a charge without `expiresDate`, s.
    pub display_qr_s: u64,
    /// `payment_confirmed` ("paid" screen), s.
    pub payment_confirmed_s: u64,
    /// `charge_expired` ("expired" screen), s.
    pub charge_expired_s: u64,
    /// `print_receipt`, s.
    pub print_receipt_s: u64,
}

impl Default for TtlConfig {
    fn default() -> Self {
        TtlConfig { display_qr_s: 3_600, payment_confirmed_s: 600, charge_expired_s: 600, print_receipt_s: 86_400 }
    }
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        DeliveryConfig {
            ack_timeout_ms: 5_000,
            backoff_initial_ms: 500,
            backoff_max_ms: 30_000,
            max_deliveries: 10,
            default_time_zone: "America/Sao_Paulo".into(),
            ttl: TtlConfig::default(),
            held_payload_bytes: 32 << 20,
        }
    }
}

impl Config {
    /// The topics the consumer reads: the device and charge topics, and
    /// `cluster.device_jobs_topic` when `cluster.enabled`.
    pub fn subscribed_topics(&self) -> Vec<String> {
        let mut topics = vec![self.kafka.device_topic.clone(), self.kafka.charge_topic.clone()];
        if self.cluster.enabled {
            topics.push(self.cluster.device_jobs_topic.clone());
        }
        topics
    }

    /// The consumer group that reads `topic`: `kafka.group_id`, or with `cluster.enabled`
    /// the route stage's `{kafka.group_id}-route` (the charge topic) or the deliver stage's
    /// `{kafka.group_id}-deliver` (`cluster.device_jobs_topic`), and no group for any other
    /// topic (the device topic is read outside any group there).
    pub fn group_of(&self, topic: &str) -> Option<String> {
        let k = &self.kafka;
        if !self.cluster.enabled {
            return Some(k.group_id.clone());
        }
        if topic == k.charge_topic {
            Some(format!("{}-route", k.group_id))
        } else if topic == self.cluster.device_jobs_topic {
            Some(format!("{}-deliver", k.group_id))
        } else {
            None
        }
    }

    /// Loads defaults, then `file` if given (it must exist), then `PIXGATE_*` variables.
    ///
    /// # Errors
    /// Unreadable file, TOML syntax, or a value of the wrong type.
    pub fn load(file: Option<&Path>) -> Result<Config, Box<figment::Error>> {
        let mut fig = Figment::from(Serialized::defaults(Config::default()));
        if let Some(f) = file {
            fig = fig.merge(Toml::file_exact(f));
        }
        fig.merge(Env::prefixed("PIXGATE_").split("__")).extract().map_err(Box::new)
    }
}

#[cfg(test)]
// figment::Jail's closures return figment's own (large) error type.
#[allow(clippy::result_large_err)]
mod tests {
    use super::*;

    #[test]
    fn file_then_env_override_defaults() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("p.toml", "[kafka]\nbrokers = \"10.0.0.1:9092\"\n[delivery]\nmax_deliveries = 3\n")?;
            jail.set_env("PIXGATE_DELIVERY__MAX_DELIVERIES", "4");
            let c = Config::load(Some(Path::new("p.toml"))).map_err(|e| e.to_string())?;
            assert_eq!(c.kafka.brokers, "10.0.0.1:9092");
            assert_eq!(c.delivery.max_deliveries, 4);
            assert_eq!(c.kafka.group_id, "pixgate");
            Ok(())
        });
    }

    #[test]
    fn health_section_from_file_and_env() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("p.toml", "[health]\nstall_after_ms = 5000\n[health.topics.\"charge.upserted\"]\nmin_rate_per_s = 2.5\nmax_quiet_ms = 600000\n")?;
            jail.set_env("PIXGATE_HEALTH__KAFKA_DOWN_AFTER_MS", "3000");
            let c = Config::load(Some(Path::new("p.toml"))).map_err(|e| e.to_string())?;
            assert_eq!(
                (c.health.stall_after_ms, c.health.kafka_down_after_ms, c.health.unassigned_after_ms),
                (5_000, 3_000, 30_000)
            );
            let t = &c.health.topics["charge.upserted"];
            assert_eq!((t.min_rate_per_s, t.max_quiet_ms), (Some(2.5), Some(600_000)));
            // `pixgate config` prints a file that loads back to the same settings.
            let printed = toml::to_string_pretty(&c).map_err(|e| e.to_string())?;
            jail.create_file("printed.toml", &printed)?;
            let again = Config::load(Some(Path::new("printed.toml"))).map_err(|e| e.to_string())?;
            assert_eq!(again.health.topics, c.health.topics);
            Ok(())
        });
    }

    #[test]
    fn admin_token_from_env_or_file_never_printed() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("PIXGATE_HTTP__ADMIN_TOKEN", "s3cret");
            jail.set_env("PIXGATE_LOG__FORMAT", "json");
            let c = Config::load(None).map_err(|e| e.to_string())?;
            assert_eq!(c.http.admin_token().map_err(|e| e.to_string())?.as_deref(), Some("s3cret"));
            assert_eq!(c.log.format, LogFormat::Json);
            let printed = toml::to_string_pretty(&c).map_err(|e| e.to_string())?;
            assert!(!printed.contains("s3cret"), "{printed}");
            assert!(printed.contains("format = \"json\""), "{printed}");

            jail.create_file("token", "from-file\n")?;
            let mut c = Config::load(None).map_err(|e| e.to_string())?;
            c.http.admin_token_file = Some("token".into());
            assert!(c.http.admin_token().is_err(), "both set is refused");
            c.http.admin_token = None;
            assert_eq!(c.http.admin_token().map_err(|e| e.to_string())?.as_deref(), Some("from-file"));
            c.http.admin_token = Some("  ".into());
            c.http.admin_token_file = None;
            assert!(c.http.admin_token().is_err(), "an empty token is refused");
            Ok(())
        });
    }
}
