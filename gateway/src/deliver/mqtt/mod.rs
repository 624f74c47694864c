//! Devices over MQTT 3.1.1: pixgate's own device listener in front of rumqttd's router.
//!
//! ```text
//! device ──TLS──► listener (limits, handshake deadline) ──► session (CONNECT, auth,
//!                 access rules on every packet) ──local link dev-{id}──► rumqttd router
//!                                                   gateway link ◄──────┘ (publisher)
//! ```
//!
//! rumqttd's own listener is not used: it checks no topic at subscribe or publish time,
//! lets any client take the gateway's link id, and awaits TLS handshakes inside its accept
//! loop. Here every device authenticates ([`auth`]: a client certificate from the fleet CA,
//! or its secret over TLS), reaches only its own topics ([`access`]), and no socket can
//! hold up another ([`listener`]). The router still does what it is good at: sessions,
//! QoS 1 delivery with PUBACK, retained status.

pub mod access;
pub mod auth;
pub mod listener;
pub mod publisher;
pub mod session;
pub mod tls;

pub use publisher::Publisher;

use crate::config::MqttConfig;
use crate::model::{Directory, Incoming};
use crate::telemetry::Stats;
use anyhow::{bail, Context};
use device_protocol::topics;
use listener::{LinkFactory, Shared};
use rumqttd::local::LinkBuilder;
use rumqttd::{Router, RouterConfig};
use std::sync::Arc;
use tokio::sync::mpsc;

/// The gateway's own client id on the router. No device can take it: devices are
/// `dev-{id}` ([`access::device_of_client_id`]).
pub const GATEWAY_CLIENT_ID: &str = "pixgate-gateway";

/// The router's settings from `cfg` (segments bound its memory per topic).
fn router_config(cfg: &MqttConfig) -> RouterConfig {
    RouterConfig {
        // The devices, the gateway's link, and room for sessions being replaced.
        max_connections: cfg.max_connections + 16,
        max_outgoing_packet_count: 200,
        // Per-topic memory bound (rumqttd's commit log is in memory; 16 MiB × 4 per device
        // topic grew RSS with every job sent in the load harness). rumqttd panics below
        // 1024 bytes.
        max_segment_size: cfg.segment_bytes.max(1024),
        max_segment_count: cfg.segment_count.max(1),
        custom_segment: Some(
            [topics::ALL_ACKS, topics::ALL_STATUS]
                .into_iter()
                .map(|f| {
                    let segment = rumqttd::SegmentConfig {
                        max_segment_size: cfg.gateway_segment_bytes.max(1024),
                        max_segment_count: 2,
                    };
                    (f.to_string(), segment)
                })
                .collect(),
        ),
        initialized_filters: None,
        shared_subscriptions_strategy: Default::default(),
    }
}

/// Starts the router on its own thread; returns a way to open links to it.
fn spawn_router(cfg: &MqttConfig) -> LinkFactory {
    let router_tx = Router::new(0, router_config(cfg)).spawn();
    Arc::new(move |client_id: &str, clean: bool| {
        LinkBuilder::new(client_id, router_tx.clone()).clean_session(clean).build().map_err(Box::new)
    })
}

/// Starts the router and the device listener on `cfg.listen`; returns the job publisher.
/// Device acks and status arrive on `incoming`. `directory` says which devices may connect
/// (`mqtt.require_registered`); refusals and connections are counted in `stats`.
///
/// # Errors
/// The settings are inconsistent (no TLS and not `plain`; `anonymous` without `plain`;
/// TLS with neither a client CA nor device secrets), a TLS file does not load, or the
/// listen address cannot be bound.
pub async fn start(
    cfg: &MqttConfig,
    directory: Arc<Directory>,
    stats: Arc<Stats>,
    incoming: mpsc::Sender<Incoming>,
) -> anyhow::Result<Publisher> {
    let tls = match (&cfg.tls, cfg.plain) {
        (Some(_), true) => bail!("mqtt.plain and mqtt.tls are both set: choose one"),
        (None, false) => bail!(
            "mqtt.tls is not configured: give mqtt.tls.cert and mqtt.tls.key (and mqtt.tls.client_ca or \
             mqtt.credentials), or set mqtt.plain = true for a loopback demo"
        ),
        (Some(t), false) => {
            if t.client_ca.is_none() && cfg.credentials.is_none() {
                bail!("mqtt.tls has no client_ca and mqtt.credentials is not set: no device could authenticate");
            }
            Some(Arc::new(tls::Tls::load(t).context("loading mqtt.tls")?))
        }
        (None, true) => None,
    };
    if cfg.anonymous && !cfg.plain {
        bail!("mqtt.anonymous is only for plain TCP (mqtt.plain = true)");
    }
    if cfg.plain && !cfg.anonymous {
        // Certificates need TLS and secrets never travel in clear.
        bail!("mqtt.plain without mqtt.anonymous: no device could authenticate over plain TCP");
    }
    let listener = tokio::net::TcpListener::bind(&cfg.listen)
        .await
        .with_context(|| format!("binding mqtt.listen `{}`", cfg.listen))?;
    if tls.is_none() {
        tracing::warn!(listen = %cfg.listen, "MQTT over plain TCP (mqtt.plain): device traffic is not encrypted");
    }
    if cfg.anonymous {
        tracing::warn!("MQTT devices connect without credentials (mqtt.anonymous): any client can claim any device id");
    }
    let links = spawn_router(cfg);
    let gateway = links.clone();
    let (link_tx, link_rx, _) = tokio::task::spawn_blocking(move || gateway(GATEWAY_CLIENT_ID, true))
        .await
        .context("gateway link")?
        .context("gateway link")?;
    let publisher = publisher::attach(link_tx, link_rx, incoming)?;
    let auth = auth::Authenticator {
        secrets: cfg.credentials.clone().map(auth::Secrets::new),
        anonymous: cfg.anonymous,
        require_registered: cfg.require_registered,
    };
    tracing::info!(listen = %cfg.listen, tls = tls.is_some(), "device listener up");
    let shared = Arc::new(Shared::new(cfg.clone(), tls, auth, directory, stats, links));
    shared.clone().watch_credentials();
    tokio::spawn(listener::run(listener, shared));
    Ok(publisher)
}

#[cfg(test)]
mod tests {
    use super::*;
    use device_protocol::{Ack, Topic};
    use rumqttc::{AsyncClient, Event, MqttOptions, QoS};
    use std::collections::HashMap;
    use std::time::Duration;

    /// Plain TCP, no credentials, no registry: the access rules alone.
    fn open(listen: String) -> MqttConfig {
        MqttConfig { listen, plain: true, anonymous: true, require_registered: false, ..MqttConfig::default() }
    }

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    /// A burst of device messages larger than the router's buffer for the gateway's link
    /// (200), arriving while the gateway is not reading (a fleet reconnecting and acking
    /// at once): rumqttd parks the link, and every message must still arrive once the
    /// gateway reads again. The fleet is a second local link on the same router.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_burst_larger_than_the_link_buffer_still_arrives() {
        const DEVICES: u64 = 250;
        const PER_DEVICE: u64 = 4;
        let links = spawn_router(&MqttConfig::default());
        let gateway = links.clone();
        let (link_tx, link_rx, _) =
            tokio::task::spawn_blocking(move || gateway(GATEWAY_CLIENT_ID, true)).await.unwrap().unwrap();
        // Capacity 1 and nobody reading yet: the receive thread blocks and the router's
        // buffer for the link fills up.
        let (tx, mut rx) = mpsc::channel(1);
        let _publisher = publisher::attach(link_tx, link_rx, tx).unwrap();
        tokio::task::spawn_blocking(move || {
            let (mut fleet, _fleet_rx, _) = links("fleet", true).unwrap();
            for seq in 1..=PER_DEVICE {
                for d in 0..DEVICES {
                    let ack = serde_json::to_vec(&Ack::done(&format!("m{d}-{seq}"), seq, false)).unwrap();
                    fleet.publish(Topic::Acks(format!("dev{d}")).path(), ack).unwrap();
                }
            }
        })
        .await
        .unwrap();

        // Now read: every ack, each device's in order.
        let mut last: HashMap<String, u64> = HashMap::new();
        let mut seen = 0;
        while seen < DEVICES * PER_DEVICE {
            match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await {
                Ok(Some(Incoming::Ack { device, ack })) => {
                    seen += 1;
                    let prev = last.insert(device.clone(), ack.seq).unwrap_or(0);
                    assert_eq!(ack.seq, prev + 1, "{device}: acks arrive once, in order");
                }
                Ok(other) => panic!("unexpected {other:?}"),
                Err(_) => {
                    panic!("only {seen} of {} acks reached the gateway: the link stayed parked", DEVICES * PER_DEVICE)
                }
            }
        }
        assert!(last.values().all(|&s| s == PER_DEVICE));
    }

    /// Jobs far larger than a commit-log segment (rumqttd's minimum, 1 KiB, against
    /// 50 KiB jobs), sent one at a time as the dispatcher does: each reaches the device's
    /// QoS 1 subscription whole, so the segment size bounds memory without losing jobs.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn jobs_larger_than_a_segment_arrive_whole() {
        let cfg = MqttConfig { segment_bytes: 1024, segment_count: 1, ..open(format!("127.0.0.1:{}", free_port())) };
        let port: u16 = cfg.listen.rsplit(':').next().unwrap().parse().unwrap();
        let (tx, _rx) = mpsc::channel(16);
        let publisher = start(&cfg, Arc::default(), Arc::default(), tx).await.unwrap();

        let mut opts = MqttOptions::new("dev-dev2", "127.0.0.1", port);
        opts.set_max_packet_size(1 << 20, 1 << 20);
        let (client, mut eventloop) = AsyncClient::new(opts, 16);
        let jobs = Topic::Jobs("dev2".into()).path();
        client.subscribe(jobs.clone(), QoS::AtLeastOnce).await.unwrap();
        loop {
            if let Event::Incoming(rumqttc::Packet::SubAck(_)) = eventloop.poll().await.unwrap() {
                break;
            }
        }
        for i in 0..20u8 {
            let payload = vec![b'a' + i; 50 * 1024];
            publisher.publish(jobs.clone(), payload.clone().into()).await.unwrap();
            let got = loop {
                match tokio::time::timeout(Duration::from_secs(10), eventloop.poll()).await {
                    Ok(Ok(Event::Incoming(rumqttc::Packet::Publish(p)))) => break p,
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => panic!("MQTT client error: {e}"),
                    Err(_) => panic!("job {i} never arrived"),
                }
            };
            assert_eq!((got.topic.as_str(), got.payload.len()), (jobs.as_str(), payload.len()));
            assert!(got.payload.iter().all(|&b| b == b'a' + i), "job {i} arrives intact");
        }
    }

    /// A device that goes silent past one and a half keep-alive periods is disconnected,
    /// and its will (its own status, offline) reaches the gateway; one that sends
    /// DISCONNECT leaves no will. A raw MQTT client over TCP, speaking rumqttd's codec.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn silence_past_the_keep_alive_ends_the_session_and_publishes_the_will() {
        use rumqttd::protocol::v4::V4;
        use rumqttd::protocol::{Connect, LastWill, Packet, Protocol, QoS as Q};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let cfg = open(format!("127.0.0.1:{}", free_port()));
        let (tx, mut rx) = mpsc::channel(16);
        let _publisher = start(&cfg, Arc::default(), Arc::default(), tx).await.unwrap();
        let offline = serde_json::to_vec(&device_protocol::Status { v: 1, online: false, printer: None }).unwrap();
        let connect = |id: &str| {
            let will = LastWill {
                topic: Topic::Status(id.into()).path().into(),
                message: offline.clone().into(),
                qos: Q::AtLeastOnce,
                retain: true,
            };
            let c = Connect { keep_alive: 1, client_id: format!("dev-{id}"), clean_session: true };
            let mut out = bytes::BytesMut::new();
            V4.write(Packet::Connect(c, None, Some(will), None, None), &mut out).unwrap();
            out
        };

        for (id, disconnect) in [("silent", false), ("polite", true)] {
            let mut socket = tokio::net::TcpStream::connect(&cfg.listen).await.unwrap();
            socket.write_all(&connect(id)).await.unwrap();
            let mut connack = [0u8; 4];
            socket.read_exact(&mut connack).await.unwrap();
            assert_eq!(connack, [0x20, 2, 0, 0], "CONNACK accepted");
            if disconnect {
                socket.write_all(&[0xe0, 0]).await.unwrap();
            }
            let started = std::time::Instant::now();
            let mut rest = Vec::new();
            let read = tokio::time::timeout(Duration::from_secs(10), socket.read_to_end(&mut rest)).await;
            assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{id}: the connection ends: {read:?}");
            if !disconnect {
                assert!(started.elapsed() >= Duration::from_millis(1_400), "not before 1.5 keep-alive periods");
            }
        }
        let got = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap().unwrap();
        match got {
            Incoming::Status { device, status } => {
                assert_eq!((device.as_str(), status.online), ("silent", false));
            }
            other => panic!("expected the silent device's will, got {other:?}"),
        }
        let more = tokio::time::timeout(Duration::from_millis(500), rx.recv()).await;
        assert!(more.is_err(), "the device that sent DISCONNECT left no will: {more:?}");
    }
}
