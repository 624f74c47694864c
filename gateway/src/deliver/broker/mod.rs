//! Devices through an external MQTT broker: pixgate as one more client of mosquitto, EMQX,
//! VerneMQ or HiveMQ, instead of the devices' server (the central shape's transport,
//! `docs/cluster.md`, "Sending through the external broker").
//!
//! ```text
//! dispatcher ──► BrokerPublisher ══ `broker.client_id` ═══► broker ──► devices (dev-{id})
//!     ▲                                                       │
//!     └── incoming ◄── receiver ◄══ `broker.acks_client_id` ══╛ +/acks, +/status (QoS 1)
//!                         └──► StatusBoard (presence)
//! ```
//!
//! With [`Extras`], the acks connection also reads the partitions' owner records and Star
//! CloudPRNT printers' `star/cloudprnt/to-server/+/+`, and the publisher sends a Star
//! printer's messages to its own `star/cloudprnt/to-device/{mac}/…`.
//!
//! The broker is a pipe: its PUBACK only says the broker has the job. pixgate keeps every
//! job until the device's own ack, sends one job per device at a time and sends it again
//! after the ack timeout, exactly as on its own listener; devices dedupe by message id.
//! The broker authenticates devices and keeps each to its own topics (pixgate's own
//! listener does that itself on the edge box).
//!
//! Each connection reconnects on its own with a growing pause ([`link`]); while either is
//! down, sends are refused ([`crate::deliver::TransportError::Down`]) and, past
//! `health.device_broker_down_after_ms`, readiness fails naming the error.

pub mod link;
pub mod options;
pub mod owners;
pub mod partitions;
pub mod publisher;
pub mod receiver;
pub mod status_board;

pub use owners::{OwnerRecord, Owners};
pub use partitions::{OwnerCheck, PartitionLinks};
pub use publisher::BrokerPublisher;
pub use status_board::StatusBoard;

use crate::config::BrokerConfig;
use crate::deliver::mqtt::star::StarPrinters;
use crate::model::Incoming;
use crate::shutdown::Shutdown;
use crate::telemetry::{Monitor, Stats};
use anyhow::{bail, Context};
use link::Links;
use std::sync::Arc;
use tokio::sync::mpsc;

/// What the broker's connections carry beyond the devices' own topics.
#[derive(Clone, Default)]
pub struct Extras {
    /// The device-jobs partitions' owner records, kept from the acks connection
    /// ([`owners`]); `None`: not subscribed.
    pub owners: Option<Arc<Owners>>,
    /// Star printers on CloudPRNT's MQTT method: their jobs are published to their own
    /// `star/cloudprnt/to-device/{mac}/…` topics, and what they publish to
    /// `star/cloudprnt/to-server/{mac}/…` is read by the acks connection and handed to
    /// these; `None`: no such printer is served.
    pub star: Option<Arc<dyn StarPrinters>>,
}

/// Requests queued towards one connection's event loop (rumqttc's request channel) before
/// a send is refused.
const REQUESTS: usize = 256;

/// Connects to the broker `cfg` names: the jobs connection behind the returned publisher
/// (with `partitions`, the device-jobs topic's partition count in the central shape: one
/// connection per partition owned, opened as partitions are taken,
/// [`BrokerPublisher::partitions`]), and the acks connection, which forwards device acks
/// and status to `incoming` and records presence on the returned board (a malformed one is
/// counted on `stats`, rule `malformed_message`), and what `extras` asks for. All reconnect until `shutdown` is
/// requested, and are tracked by it; their state goes to `health`.
///
/// # Errors
/// The settings are inconsistent (neither TLS nor `plain`, both, a certificate without a
/// key, two connections with one client id) or a TLS file does not load. Nothing is
/// connected yet: a broker that is down at start is retried, not an error.
pub fn start(
    cfg: &BrokerConfig,
    partitions: Option<i32>,
    health: Arc<Monitor>,
    stats: Arc<Stats>,
    incoming: mpsc::Sender<Incoming>,
    extras: Extras,
    shutdown: Shutdown,
) -> anyhow::Result<(BrokerPublisher, Arc<StatusBoard>)> {
    if cfg.client_id == cfg.acks_client_id {
        bail!(
            "broker.client_id and broker.acks_client_id are both `{}`: the broker would let only one of them connect",
            cfg.client_id
        );
    }
    let tls = options::tls(cfg).context("broker.tls")?;
    if tls.is_none() {
        tracing::warn!(host = %cfg.host, port = cfg.port, "MQTT to the devices' broker over plain TCP (broker.plain): job payloads are not encrypted");
    }
    let links = Arc::new(Links::new(health));
    let acks = options::mqtt_options(cfg, &cfg.acks_client_id, false, tls.clone());
    let board = Arc::new(StatusBoard::default());
    let publisher = match partitions {
        None => {
            let jobs = options::mqtt_options(cfg, &cfg.client_id, true, tls);
            tracing::info!(host = %cfg.host, port = cfg.port, jobs = %cfg.client_id, acks = %cfg.acks_client_id, "devices through an external MQTT broker");
            publisher::start(jobs, links.clone(), shutdown.clone())
        }
        Some(n) => {
            let parts = Arc::new(PartitionLinks::new(cfg, tls, n, links.clone(), shutdown.clone()));
            tracing::info!(host = %cfg.host, port = cfg.port, jobs = %format!("{}-{{partition}}", cfg.partition_client_id_prefix), acks = %cfg.acks_client_id, "devices through an external MQTT broker, one jobs connection per device-jobs partition owned");
            publisher::partitioned(parts, links.clone())
        }
    };
    let publisher = publisher.with_star(extras.star.clone());
    receiver::start(acks, links, board.clone(), extras, stats, incoming, shutdown);
    Ok((publisher, board))
}
