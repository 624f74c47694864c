//! The embedded MQTT broker (rumqttd) and the gateway's in-process link to it.
//!
//! rumqttd runs its router and listener on their own OS threads (`Broker::start` blocks).
//! The gateway talks to it over a local link, not TCP: it subscribes to every device's acks
//! and status, and publishes jobs. `LinkTx::publish` is QoS 0 from the link, but the broker
//! forwards at the *subscriber's* QoS, so a device subscribed at QoS 1 gets QoS 1 with
//! PUBACK and session redelivery (rumqttd's router forwards at the subscriber's QoS). The broker keeps
//! nothing on disk: end-to-end delivery is the gateway's job (acks per job, retries).
//!
//! `LinkTx`/`LinkRx` calls block the calling thread, so each side runs on a dedicated
//! thread and talks to tokio through bounded channels.

use crate::config::MqttConfig;
use crate::deliver::transport::{Transport, TransportError};
use crate::model::Incoming;
use anyhow::{bail, Context};
use bytes::Bytes;
use device_protocol::{topics, Topic};
use rumqttd::{Broker, Config, ConnectionSettings, Notification, RouterConfig, ServerSettings};
use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Sends jobs into the broker. Cloneable; bounded (a full channel makes the caller wait).
#[derive(Debug, Clone)]
pub struct Publisher {
    tx: mpsc::Sender<(String, Bytes)>,
}

impl Publisher {
    /// A publisher not backed by a broker: what it publishes arrives on the returned
    /// receiver. For tests and tools that stand in for the broker.
    pub fn channel(capacity: usize) -> (Publisher, mpsc::Receiver<(String, Bytes)>) {
        let (tx, rx) = mpsc::channel(capacity);
        (Publisher { tx }, rx)
    }

    /// Publishes `payload` on `topic` (shared bytes: handed to the broker without a copy).
    ///
    /// # Errors
    /// The broker link is gone.
    pub async fn publish(&self, topic: String, payload: Bytes) -> anyhow::Result<()> {
        self.tx.send((topic, payload)).await.context("MQTT publisher thread is gone")
    }
}

/// Jobs go to a device's jobs topic, `pixgate/v1/devices/{device}/jobs`, where the device
/// is subscribed at QoS 1; acks and status come back through [`start`]'s `incoming`.
impl Transport for Publisher {
    async fn send(&self, device: &str, wire: Bytes) -> Result<(), TransportError> {
        let topic = Topic::Jobs(device.to_string()).path();
        self.tx.send((topic, wire)).await.map_err(|_| TransportError::Closed("MQTT publisher"))
    }
}

/// Starts the broker listening on `cfg.listen` and returns the job publisher and the stream
/// of device messages, forwarded into `incoming` (bounded: a slow gateway slows the link).
///
/// # Errors
/// Bad listen address, the port is in use, or the listener did not come up within 5 s.
pub fn start(cfg: &MqttConfig, incoming: mpsc::Sender<Incoming>) -> anyhow::Result<Publisher> {
    let listen: SocketAddr = cfg.listen.parse().with_context(|| format!("mqtt.listen `{}`", cfg.listen))?;
    // rumqttd binds in its own thread and only logs a failure there: a port in use would
    // leave the gateway running with no device able to connect. Fail here instead.
    drop(std::net::TcpListener::bind(listen).with_context(|| format!("binding mqtt.listen `{listen}`"))?);
    let server = ServerSettings {
        name: "v4-devices".into(),
        listen,
        tls: None,
        next_connection_delay_ms: 1,
        connections: ConnectionSettings {
            connection_timeout_ms: 60_000,
            max_payload_size: cfg.max_payload_bytes,
            max_inflight_count: 100,
            auth: None,
            external_auth: None,
            dynamic_filters: true,
        },
    };
    let config = Config {
        id: 0,
        router: RouterConfig {
            max_connections: cfg.max_connections,
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
                        (
                            f.to_string(),
                            rumqttd::SegmentConfig {
                                max_segment_size: cfg.gateway_segment_bytes.max(1024),
                                max_segment_count: 2,
                            },
                        )
                    })
                    .collect(),
            ),
            initialized_filters: None,
            shared_subscriptions_strategy: Default::default(),
        },
        v4: Some(HashMap::from([("1".to_string(), server)])),
        ..Config::default()
    };
    let mut broker = Broker::new(config);
    let (mut link_tx, mut link_rx) = broker.link("pixgate-gateway").context("local MQTT link")?;
    std::thread::Builder::new().name("mqtt-broker".into()).spawn(move || {
        if let Err(e) = broker.start() {
            tracing::error!(error = %e, "embedded MQTT broker stopped");
        }
    })?;
    wait_listening(listen)?;
    link_tx.subscribe(topics::ALL_ACKS).context("subscribe acks")?;
    link_tx.subscribe(topics::ALL_STATUS).context("subscribe status")?;

    let (tx, mut rx) = mpsc::channel::<(String, Bytes)>(1024);
    std::thread::Builder::new().name("mqtt-publish".into()).spawn(move || {
        while let Some((topic, payload)) = rx.blocking_recv() {
            if let Err(e) = link_tx.publish(topic.clone(), payload) {
                tracing::error!(%topic, error = %e, "MQTT publish failed; the ack timeout will resend");
            }
        }
    })?;
    std::thread::Builder::new().name("mqtt-receive".into()).spawn(move || loop {
        match link_rx.recv() {
            Ok(Some(Notification::Forward(f))) => {
                let topic = String::from_utf8_lossy(&f.publish.topic).to_string();
                if let Some(msg) = parse_incoming(&topic, &f.publish.payload) {
                    if incoming.blocking_send(msg).is_err() {
                        return; // gateway shutting down
                    }
                }
            }
            // The router parks a link whose buffer reached its capacity (200 notifications,
            // `rumqttd::router::MAX_CHANNEL_CAPACITY`) and forwards nothing more to it until
            // the link says it is ready again, as rumqttd's own network links do after
            // writing. Without this, a burst of acks (a fleet reconnecting, a backlog
            // draining) silenced every device's acks for good.
            Ok(Some(Notification::Unschedule)) => {
                if let Err(e) = link_rx.ready() {
                    tracing::error!(error = %e, "MQTT link closed");
                    return;
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::error!(error = %e, "MQTT link closed");
                return;
            }
        }
    })?;
    Ok(Publisher { tx })
}

/// Decodes a device message; malformed ones are logged and dropped here because they are
/// not events pixgate owns (a device bug, visible in the log with its topic).
fn parse_incoming(topic: &str, payload: &[u8]) -> Option<Incoming> {
    let parsed = match Topic::parse(topic)? {
        Topic::Acks(device) => serde_json::from_slice(payload).map(|ack| Incoming::Ack { device, ack }),
        Topic::Status(device) => serde_json::from_slice(payload).map(|status| Incoming::Status { device, status }),
        Topic::Jobs(_) => return None,
    };
    parsed.map_err(|e| tracing::warn!(%topic, error = %e, "malformed device message")).ok()
}

fn wait_listening(addr: SocketAddr) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("embedded MQTT broker is not listening on {addr} (port in use?)")
}

#[cfg(test)]
mod tests {
    use super::*;
    use device_protocol::Ack;
    use rumqttc::{AsyncClient, Event, MqttOptions, QoS};

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    /// A burst of device messages larger than the router's buffer for the gateway's link
    /// (200), arriving while the gateway is not reading (a fleet reconnecting and acking
    /// at once): rumqttd parks the link, and every message must still arrive once the
    /// gateway reads again. Real broker with its default segments, real MQTT client over TCP.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_burst_larger_than_the_link_buffer_still_arrives() {
        const DEVICES: u64 = 250;
        const PER_DEVICE: u64 = 4;
        let cfg = MqttConfig { listen: format!("127.0.0.1:{}", free_port()), ..MqttConfig::default() };
        let port: u16 = cfg.listen.rsplit(':').next().unwrap().parse().unwrap();
        // Capacity 1 and nobody reading yet: the receive thread blocks and the router's
        // buffer for the link fills up.
        let (tx, mut rx) = mpsc::channel(1);
        let _publisher = start(&cfg, tx).unwrap();

        let mut opts = MqttOptions::new("burst-device", "127.0.0.1", port);
        opts.set_inflight(100);
        let (client, mut eventloop) = AsyncClient::new(opts, 64);
        let sender = tokio::spawn(async move {
            for seq in 1..=PER_DEVICE {
                for d in 0..DEVICES {
                    let ack = serde_json::to_vec(&Ack::done(&format!("m{d}-{seq}"), seq, false)).unwrap();
                    client.publish(Topic::Acks(format!("dev{d}")).path(), QoS::AtLeastOnce, false, ack).await.unwrap();
                }
            }
        });
        // Drive the client until every publish has been written and acknowledged.
        let mut pubacks = 0;
        while pubacks < DEVICES * PER_DEVICE {
            match tokio::time::timeout(Duration::from_secs(30), eventloop.poll()).await {
                Ok(Ok(Event::Incoming(rumqttc::Packet::PubAck(_)))) => pubacks += 1,
                Ok(Ok(_)) => {}
                Ok(Err(e)) => panic!("MQTT client error: {e}"),
                Err(_) => panic!("broker stopped acknowledging after {pubacks} publishes"),
            }
        }
        sender.await.unwrap();
        let poller = tokio::spawn(async move { while eventloop.poll().await.is_ok() {} });

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
        poller.abort();
    }

    /// Jobs far larger than a commit-log segment (rumqttd's minimum, 1 KiB, against
    /// 50 KiB jobs), sent one at a time as the dispatcher does: each reaches the device's
    /// QoS 1 subscription whole, so the segment size bounds memory without losing jobs.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn jobs_larger_than_a_segment_arrive_whole() {
        let cfg = MqttConfig {
            listen: format!("127.0.0.1:{}", free_port()),
            segment_bytes: 1024,
            segment_count: 1,
            ..MqttConfig::default()
        };
        let port: u16 = cfg.listen.rsplit(':').next().unwrap().parse().unwrap();
        let (tx, _rx) = mpsc::channel(16);
        let publisher = start(&cfg, tx).unwrap();

        let mut opts = MqttOptions::new("big-jobs-device", "127.0.0.1", port);
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
}
