//! Test helpers: an embedded rumqttd broker on a free loopback port and an outside MQTT
//! client playing the gateway.

#![allow(dead_code)]

use device_protocol::{Ack, Job, Topic};
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::mpsc;

/// Starts rumqttd 0.20 on 127.0.0.1:<free port> on its own thread; returns the port once it
/// accepts connections.
pub fn start_broker() -> u16 {
    let port = free_port();
    start_broker_on(port);
    port
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Starts rumqttd 0.20 on 127.0.0.1:`port` and waits until it accepts connections.
pub fn start_broker_on(port: u16) {
    let conn = rumqttd::ConnectionSettings {
        connection_timeout_ms: 5000,
        max_payload_size: 8 * 1024 * 1024,
        max_inflight_count: 100,
        auth: None,
        external_auth: None,
        dynamic_filters: true,
    };
    let server = rumqttd::ServerSettings {
        name: "v4-1".into(),
        listen: SocketAddr::from(([127, 0, 0, 1], port)),
        tls: None,
        next_connection_delay_ms: 1,
        connections: conn,
    };
    let config = rumqttd::Config {
        id: 0,
        router: rumqttd::RouterConfig {
            max_connections: 1000,
            max_outgoing_packet_count: 200,
            max_segment_size: 16 * 1024 * 1024,
            max_segment_count: 10,
            ..Default::default()
        },
        v4: Some(HashMap::from([("1".to_string(), server)])),
        ..Default::default()
    };
    let mut broker = rumqttd::Broker::new(config);
    std::thread::spawn(move || {
        let _ = broker.start();
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(std::time::Instant::now() < deadline, "broker did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A fresh empty directory under the system temp dir, removed when dropped unless the
/// test is failing (then it is kept, and its path printed, to look at what was drawn).
pub fn temp_dir(name: &str) -> TempDir {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let d = std::env::temp_dir().join(format!("pixgate-sims-{name}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    TempDir(d)
}

/// See [`temp_dir`]; derefs to its path.
pub struct TempDir(PathBuf);

impl std::ops::Deref for TempDir {
    type Target = PathBuf;
    fn deref(&self) -> &PathBuf {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("output kept in {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// The gateway side: publishes jobs, collects acks and status messages.
pub struct FakeGateway {
    pub client: AsyncClient,
    pub acks: mpsc::UnboundedReceiver<Ack>,
    pub status: mpsc::UnboundedReceiver<(String, Vec<u8>)>,
}

impl FakeGateway {
    pub async fn connect(port: u16) -> FakeGateway {
        let mut mo = MqttOptions::new("fake-gateway", "127.0.0.1", port);
        mo.set_max_packet_size(8 << 20, 8 << 20).set_keep_alive(Duration::from_secs(5));
        let (client, mut el) = AsyncClient::new(mo, 64);
        let (ack_tx, acks) = mpsc::unbounded_channel();
        let (st_tx, status) = mpsc::unbounded_channel();
        let (sub_tx, mut sub_rx) = mpsc::unbounded_channel();
        let c2 = client.clone();
        tokio::spawn(async move {
            loop {
                match el.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        let c = c2.clone();
                        tokio::spawn(async move {
                            c.subscribe(device_protocol::topics::ALL_ACKS, QoS::AtLeastOnce).await.unwrap();
                            c.subscribe(device_protocol::topics::ALL_STATUS, QoS::AtLeastOnce).await.unwrap();
                        });
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        let _ = sub_tx.send(());
                    }
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        if p.topic.ends_with("/acks") {
                            let _ = ack_tx.send(serde_json::from_slice::<Ack>(&p.payload).expect("ack JSON"));
                        } else {
                            let _ = st_tx.send((p.topic.clone(), p.payload.to_vec()));
                        }
                    }
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        });
        for _ in 0..2 {
            tokio::time::timeout(Duration::from_secs(10), sub_rx.recv()).await.expect("gateway subscribed");
        }
        FakeGateway { client, acks, status }
    }

    pub async fn send(&self, device: &str, job: &Job) {
        self.client
            .publish(Topic::Jobs(device.into()).path(), QoS::AtLeastOnce, false, serde_json::to_vec(job).unwrap())
            .await
            .unwrap();
    }

    pub async fn next_ack(&mut self) -> Ack {
        tokio::time::timeout(Duration::from_secs(30), self.acks.recv())
            .await
            .expect("ack in time")
            .expect("ack channel")
    }
}

/// Decodes every QR code rqrr finds in a PNG file.
pub fn qr_codes_in_png(path: &std::path::Path) -> Vec<String> {
    let img = image::open(path).unwrap().to_luma8();
    let mut prepared = rqrr::PreparedImage::prepare(img);
    prepared.detect_grids().into_iter().filter_map(|g| g.decode().ok().map(|(_, s)| s)).collect()
}
