//! Devices over MQTT 3.1.1: pixgate's own device listener, sessions and hub.
//!
//! ```text
//! device ──TLS──► listener (limits, handshake deadline) ──► session (CONNECT, auth,
//!                 access rules on every packet) ◄──► hub (device id → its sessions)
//!                                                     ▲ jobs (Publisher)   │ acks, status
//!                                                     └──── dispatcher ◄───┘ (incoming)
//! ```
//!
//! Every device authenticates ([`auth`]: a client certificate from the fleet CA, or its
//! secret over TLS), reaches only its own topics ([`access`]), and no socket can hold up
//! another ([`listener`]). Because a device only ever talks with pixgate (its own jobs in,
//! its own acks and status out), no general MQTT router is needed between them: the
//! [`hub`] hands each job to the sessions of its device and each device message to the
//! gateway, at a cost that does not grow with the fleet.

pub mod access;
pub mod auth;
pub mod hub;
pub mod inbound;
pub mod listener;
pub mod publisher;
pub mod session;
pub mod star;
pub mod tls;
pub mod tls_stream;
mod wire;

pub use publisher::Publisher;

use crate::config::MqttConfig;
use crate::model::{Directory, Incoming};
use crate::shutdown::Shutdown;
use crate::telemetry::Stats;
use anyhow::{bail, Context};
use listener::Shared;
use std::sync::Arc;
use tokio::sync::mpsc;

/// The client id pixgate itself would have on a broker. No device can take it: devices
/// are `dev-{id}` ([`access::device_of_client_id`]).
pub const GATEWAY_CLIENT_ID: &str = "pixgate-gateway";

/// Starts the device listener on `cfg.listen`; returns the job publisher.
/// Device acks and status arrive on `incoming`. `directory` says which devices may connect
/// (`mqtt.require_registered`); refusals and connections are counted in `stats`. The
/// listener, its connections and its credentials watch end when `shutdown` is requested,
/// and are tracked by it.
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
    star: Option<Arc<dyn star::StarPrinters>>,
    shutdown: Shutdown,
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
    let hub = Arc::new(hub::Hub::new(incoming));
    let publisher = Publisher::new(hub.clone());
    let auth = auth::Authenticator {
        secrets: cfg.credentials.clone().map(auth::Secrets::new),
        anonymous: cfg.anonymous,
        require_registered: cfg.require_registered,
    };
    tracing::info!(listen = %cfg.listen, tls = tls.is_some(), "device listener up");
    let shared = Arc::new(Shared::new(cfg.clone(), tls, auth, directory, stats, hub, shutdown.clone()).with_star(star));
    shared.clone().watch_credentials();
    shutdown.spawn(listener::run(listener, shared));
    Ok(publisher)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deliver::transport::Transport;
    use device_protocol::{Ack, Topic};
    use rumqttc::{AsyncClient, Event, EventLoop, MqttOptions, QoS};
    use std::collections::HashMap;
    use std::time::Duration;

    /// Plain TCP, no credentials, no registry: the access rules alone.
    fn open(listen: String) -> MqttConfig {
        MqttConfig { listen, plain: true, anonymous: true, require_registered: false, ..MqttConfig::default() }
    }

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    /// A device listener on a free loopback port (plain, anonymous): its port, the job
    /// publisher and what devices send, through a channel of `capacity`.
    async fn listener(capacity: usize) -> (u16, Publisher, mpsc::Receiver<Incoming>) {
        let port = free_port();
        let (tx, rx) = mpsc::channel(capacity);
        let publisher =
            start(&open(format!("127.0.0.1:{port}")), Arc::default(), Arc::default(), tx, None, Shutdown::new())
                .await
                .unwrap();
        (port, publisher, rx)
    }

    async fn until_suback(eventloop: &mut EventLoop) {
        loop {
            if let Event::Incoming(rumqttc::Packet::SubAck(_)) = eventloop.poll().await.unwrap() {
                break;
            }
        }
    }

    /// Devices acking in a burst while the gateway is not reading (a fleet reconnecting
    /// and acking at once): their sessions wait (no PUBACK until the gateway has the ack),
    /// and once the gateway reads, every ack arrives once, each device's in order.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_burst_of_acks_waits_for_a_slow_gateway_and_all_arrive_in_order() {
        const DEVICES: u64 = 20;
        const PER_DEVICE: u64 = 25;
        // Capacity 1 and nobody reading yet.
        let (port, _publisher, mut rx) = listener(1).await;
        for d in 0..DEVICES {
            let (client, mut eventloop) =
                AsyncClient::new(MqttOptions::new(format!("dev-d{d}"), "127.0.0.1", port), 64);
            tokio::spawn(async move {
                for seq in 1..=PER_DEVICE {
                    let ack = serde_json::to_vec(&Ack::done(&format!("m{d}-{seq}"), seq, false)).unwrap();
                    client.publish(Topic::Acks(format!("d{d}")).path(), QoS::AtLeastOnce, false, ack).await.unwrap();
                }
                while eventloop.poll().await.is_ok() {}
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;

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
                Err(_) => panic!("only {seen} of {} acks reached the gateway", DEVICES * PER_DEVICE),
            }
        }
        assert!(last.values().all(|&s| s == PER_DEVICE));
    }

    /// Large jobs (50 KiB) sent one at a time as the dispatcher does reach the device's
    /// QoS 1 subscription whole and in order.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn large_jobs_arrive_whole_and_in_order_at_qos_1() {
        let (port, publisher, _rx) = listener(16).await;

        let mut opts = MqttOptions::new("dev-dev2", "127.0.0.1", port);
        opts.set_max_packet_size(1 << 20, 1 << 20);
        let (client, mut eventloop) = AsyncClient::new(opts, 16);
        let jobs = Topic::Jobs("dev2".into()).path();
        client.subscribe(jobs.clone(), QoS::AtLeastOnce).await.unwrap();
        until_suback(&mut eventloop).await;
        for i in 0..20u8 {
            let payload = vec![b'a' + i; 50 * 1024];
            publisher.send("dev2", payload.clone().into()).await.unwrap();
            let got = loop {
                match tokio::time::timeout(Duration::from_secs(10), eventloop.poll()).await {
                    Ok(Ok(Event::Incoming(rumqttc::Packet::Publish(p)))) => break p,
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => panic!("MQTT client error: {e}"),
                    Err(_) => panic!("job {i} never arrived"),
                }
            };
            assert_eq!(
                (got.topic.as_str(), got.payload.len(), got.qos),
                (jobs.as_str(), payload.len(), QoS::AtLeastOnce)
            );
            assert!(got.payload.iter().all(|&b| b == b'a' + i), "job {i} arrives intact");
        }
    }

    /// A device with a persistent session (clean session 0) that drops off keeps its
    /// subscription: a job sent while it is away reaches it when it reconnects, with the
    /// CONNACK's session-present flag set, without subscribing again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_persistent_session_gets_the_job_sent_while_it_was_away() {
        let (port, publisher, _rx) = listener(16).await;
        let options = || {
            let mut o = MqttOptions::new("dev-p1", "127.0.0.1", port);
            o.set_clean_session(false);
            o
        };
        let (client, mut eventloop) = AsyncClient::new(options(), 16);
        client.subscribe(Topic::Jobs("p1".into()).path(), QoS::AtLeastOnce).await.unwrap();
        until_suback(&mut eventloop).await;
        client.disconnect().await.unwrap();
        while eventloop.poll().await.is_ok() {}
        drop(eventloop);
        tokio::time::sleep(Duration::from_millis(200)).await;

        publisher.send("p1", bytes::Bytes::from_static(b"while away")).await.unwrap();
        let (_client, mut eventloop) = AsyncClient::new(options(), 16);
        let mut present = None;
        let got = loop {
            match tokio::time::timeout(Duration::from_secs(10), eventloop.poll()).await {
                Ok(Ok(Event::Incoming(rumqttc::Packet::ConnAck(c)))) => present = Some(c.session_present),
                Ok(Ok(Event::Incoming(rumqttc::Packet::Publish(p)))) => break p,
                Ok(Ok(_)) => {}
                Ok(Err(e)) => panic!("MQTT client error: {e}"),
                Err(_) => panic!("the job sent while away never arrived"),
            }
        };
        assert_eq!(present, Some(true), "session present");
        assert_eq!(&got.payload[..], b"while away");
    }

    /// A device that goes silent past one and a half keep-alive periods is disconnected,
    /// and its will (its own status, offline) reaches the gateway; one that sends
    /// DISCONNECT leaves no will. A raw MQTT client over TCP.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn silence_past_the_keep_alive_ends_the_session_and_publishes_the_will() {
        use rumqttc::mqttbytes::v4::{Connect, LastWill, Packet};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let (port, _publisher, mut rx) = listener(16).await;
        let offline = serde_json::to_vec(&device_protocol::Status { v: 1, online: false, printer: None }).unwrap();
        let connect = |id: &str| {
            let mut c = Connect::new(format!("dev-{id}"));
            c.keep_alive = 1;
            c.clean_session = true;
            c.last_will = Some(LastWill::new(Topic::Status(id.into()).path(), offline.clone(), QoS::AtLeastOnce, true));
            let mut out = bytes::BytesMut::new();
            Packet::Connect(c).write(&mut out, usize::MAX).unwrap();
            out
        };

        for (id, disconnect) in [("silent", false), ("polite", true)] {
            let mut socket = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
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
    /// Device `device` as a raw MQTT 3.1.1 client (`dev-{device}`, keep-alive 0, `will` if
    /// any) with a 4 KiB receive window, subscribed at QoS 1 to its jobs: the socket, its
    /// CONNACK and SUBACK read.
    async fn narrow_subscriber(
        port: u16,
        device: &str,
        will: Option<rumqttc::mqttbytes::v4::LastWill>,
    ) -> tokio::net::TcpStream {
        use rumqttc::mqttbytes::v4::{Connect, Packet, Subscribe};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let mut c = Connect::new(format!("dev-{device}"));
        c.keep_alive = 0;
        c.last_will = will;
        let mut out = bytes::BytesMut::new();
        Packet::Connect(c).write(&mut out, usize::MAX).unwrap();
        let mut subscribe = Subscribe::new(Topic::Jobs(device.into()).path(), QoS::AtLeastOnce);
        subscribe.pkid = 1;
        Packet::Subscribe(subscribe).write(&mut out, usize::MAX).unwrap();
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let mut stream = socket.connect(([127, 0, 0, 1], port).into()).await.unwrap();
        stream.write_all(&out).await.unwrap();
        let mut answers = [0u8; 9];
        stream.read_exact(&mut answers).await.unwrap();
        assert_eq!(answers, [0x20, 2, 0, 0, 0x90, 3, 0, 1, 1], "CONNACK, then SUBACK granting QoS 1");
        stream
    }

    /// A connection taken over while it is stuck writing to a device that stopped reading
    /// (a half-open socket) ends when its write times out: its will is not published then,
    /// since the device is back on its new connection, which the will would call offline.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_connection_taken_over_while_stuck_writing_publishes_no_will() {
        use rumqttc::mqttbytes::v4::LastWill;

        let (port, publisher, mut rx) = listener(16).await;
        let offline = serde_json::to_vec(&device_protocol::Status { v: 1, online: false, printer: None }).unwrap();
        let will = LastWill::new(Topic::Status("w".into()).path(), offline, QoS::AtLeastOnce, false);
        // Nothing read after the SUBACK.
        let stuck = narrow_subscriber(port, "w", Some(will)).await;
        for n in 0..40u8 {
            publisher.send("w", vec![n; 256 * 1024].into()).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;

        // The device is back on a new connection under the same client id.
        let (_client, mut eventloop) = AsyncClient::new(MqttOptions::new("dev-w", "127.0.0.1", port), 16);
        tokio::spawn(async move { while eventloop.poll().await.is_ok() {} });
        let heard = tokio::time::timeout(session::WRITE_TIMEOUT + Duration::from_secs(3), rx.recv()).await;
        assert!(heard.is_err(), "the stuck connection's will is stale: {heard:?}");
        drop(stuck);
    }

    /// A device on a slow link (GPRS: a few KB/s) that keeps reading gets a job whose write
    /// takes longer than [`session::WRITE_TIMEOUT`]: the timeout is for a write that makes
    /// no progress, not for a slow one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_device_reading_slowly_gets_a_job_that_takes_longer_than_the_write_timeout() {
        use rumqttc::mqttbytes::v4::Packet;
        use tokio::io::AsyncReadExt;

        let (port, publisher, _rx) = listener(16).await;
        let mut slow = narrow_subscriber(port, "g", None).await;

        const BIG: usize = 4 << 20;
        publisher.send("g", vec![7u8; BIG].into()).await.unwrap();
        publisher.send("g", b"after".to_vec().into()).await.unwrap();
        // At most 4 KiB every 5 ms: some 800 KiB/s, so 4 MiB take about 5 s.
        let started = std::time::Instant::now();
        let mut buf = bytes::BytesMut::new();
        let mut payloads = Vec::new();
        while payloads.len() < 2 {
            let mut chunk = [0u8; 4096];
            let n = tokio::time::timeout(Duration::from_secs(20), slow.read(&mut chunk)).await.unwrap().unwrap();
            assert!(n > 0, "the gateway closed the slow device after {:?}", started.elapsed());
            buf.extend_from_slice(&chunk[..n]);
            while let Ok(packet) = Packet::read(&mut buf, usize::MAX) {
                if let Packet::Publish(p) = packet {
                    payloads.push(p.payload);
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let took = started.elapsed();
        assert!(took > session::WRITE_TIMEOUT, "the link was not slow enough to test anything: {took:?}");
        assert_eq!(payloads[0].len(), BIG);
        assert!(payloads[0].iter().all(|b| *b == 7));
        assert_eq!(&payloads[1][..], b"after");
    }

    /// The CloudPRNT side as the session sees it: one Star printer `s` on the MQTT method,
    /// and what it published.
    #[derive(Default)]
    struct Printers {
        heard: std::sync::Mutex<Vec<(String, String)>>,
        sessions: std::sync::Mutex<Vec<bool>>,
    }

    const STAR_MAC: &str = "00:11:62:0a:1b:2c";

    impl star::StarPrinters for Printers {
        fn mac_of(&self, device: &str) -> Option<String> {
            (device == "s").then(|| STAR_MAC.to_string())
        }
        fn device_of(&self, mac: &str) -> Option<String> {
            (mac == STAR_MAC).then(|| "s".to_string())
        }
        fn session(&self, _device: &str, up: bool) {
            self.sessions.lock().unwrap().push(up);
        }
        fn published<'a>(&'a self, _device: &'a str, method: &'a str, payload: &'a [u8]) -> star::Pending<'a> {
            let text = String::from_utf8_lossy(payload).to_string();
            Box::pin(async move {
                if text == "bad" {
                    return Err("not JSON".to_string());
                }
                self.heard.lock().unwrap().push((method.to_string(), text));
                Ok(())
            })
        }
    }

    /// A Star printer reaches only its own `star/cloudprnt/…/{mac}` topics: its jobs come
    /// on its `print-job` topic, what it publishes goes to the CloudPRNT side (not the
    /// device protocol), another MAC's filter is refused, and pixgate's topics are not its.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_star_printer_reaches_its_own_topics_only() {
        let port = free_port();
        let (tx, mut rx) = mpsc::channel(16);
        let printers = Arc::new(Printers::default());
        let publisher = start(
            &open(format!("127.0.0.1:{port}")),
            Arc::default(),
            Arc::default(),
            tx,
            Some(printers.clone() as Arc<dyn star::StarPrinters>),
            Shutdown::new(),
        )
        .await
        .unwrap();
        let mut opts = MqttOptions::new("dev-s", "127.0.0.1", port);
        let will = format!("star/cloudprnt/to-server/{STAR_MAC}/client-will");
        opts.set_last_will(rumqttc::LastWill::new(&will, "{}", QoS::AtLeastOnce, false));
        let (client, mut eventloop) = AsyncClient::new(opts, 16);
        client.subscribe("star/cloudprnt/to-device/00:11:62:0a:1b:2d/#", QoS::AtLeastOnce).await.unwrap();
        client.subscribe(Topic::Jobs("s".into()).path(), QoS::AtLeastOnce).await.unwrap();
        client.subscribe(format!("star/cloudprnt/to-device/{STAR_MAC}/#"), QoS::AtLeastOnce).await.unwrap();
        let mut granted = Vec::new();
        while granted.len() < 3 {
            if let Event::Incoming(rumqttc::Packet::SubAck(a)) = eventloop.poll().await.unwrap() {
                granted.extend(a.return_codes.iter().map(|c| matches!(c, rumqttc::SubscribeReasonCode::Success(_))));
            }
        }
        assert_eq!(granted, [false, false, true], "another MAC's and pixgate's topics refused; its own granted");

        publisher.send("s", bytes::Bytes::from_static(b"{\"title\":\"print-job\"}")).await.unwrap();
        let got = loop {
            match tokio::time::timeout(Duration::from_secs(10), eventloop.poll()).await {
                Ok(Ok(Event::Incoming(rumqttc::Packet::Publish(p)))) => break p,
                Ok(Ok(_)) => {}
                other => panic!("no print-job: {other:?}"),
            }
        };
        assert_eq!(got.topic, format!("star/cloudprnt/to-device/{STAR_MAC}/print-job"));
        assert_eq!(&got.payload[..], b"{\"title\":\"print-job\"}");

        let result = format!("star/cloudprnt/to-server/{STAR_MAC}/print-result");
        client.publish(&result, QoS::AtLeastOnce, false, "bad").await.unwrap();
        client.publish(&result, QoS::AtLeastOnce, false, "{\"statusCode\":\"200\"}").await.unwrap();
        let until = tokio::time::Instant::now() + Duration::from_secs(10);
        while printers.heard.lock().unwrap().is_empty() && tokio::time::Instant::now() < until {
            let _ = tokio::time::timeout(Duration::from_millis(100), eventloop.poll()).await;
        }
        assert_eq!(
            printers.heard.lock().unwrap().clone(),
            [("print-result".to_string(), "{\"statusCode\":\"200\"}".to_string())]
        );
        assert!(rx.try_recv().is_err(), "nothing reaches the device protocol's decoder");

        // pixgate's acks topic is not a Star printer's: the connection is closed, and its
        // will goes to the CloudPRNT side.
        let ack = serde_json::to_vec(&Ack::done("m1", 1, false)).unwrap();
        client.publish(Topic::Acks("s".into()).path(), QoS::AtLeastOnce, false, ack).await.unwrap();
        let closed = tokio::time::timeout(Duration::from_secs(10), async { while eventloop.poll().await.is_ok() {} });
        assert!(closed.await.is_ok(), "closed");
        let until = tokio::time::Instant::now() + Duration::from_secs(10);
        while printers.sessions.lock().unwrap().len() < 2 && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(printers.sessions.lock().unwrap().clone(), [true, false]);
        assert_eq!(printers.heard.lock().unwrap().last().unwrap().0, "client-will");
        assert!(rx.try_recv().is_err());
    }
}
