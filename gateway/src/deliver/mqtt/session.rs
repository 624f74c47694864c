//! One device connection: CONNECT, authentication, then every packet checked against the
//! access rules, between the socket and the device's place in the [`Hub`].
//!
//! MQTT 3.1.1 is decoded and encoded with rumqttc's codec (`mqttbytes::v4`); what a broker
//! does for a device is done here: QoS 1 (and 2) acknowledgements of what it publishes, its
//! jobs written at the QoS its subscription was granted, the will published when the
//! socket closes without DISCONNECT.

use super::access::{self, Rule};
use super::auth::{Credential, Peer, Refusal};
use super::hub::{Attached, Hub};
use super::listener::Shared;
use bytes::{Bytes, BytesMut};
use device_protocol::Topic;
use rumqttc::mqttbytes::v4::{
    ConnAck, ConnectReturnCode, LastWill, Packet, PubAck, PubComp, PubRec, Publish, SubAck, SubscribeReasonCode,
    UnsubAck,
};
use rumqttc::mqttbytes::{Error as CodecError, QoS};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// Why a session ended (logged at debug; refusals are logged where they happen).
#[derive(Debug)]
enum End {
    /// The device sent DISCONNECT.
    Clean,
    /// The socket closed or failed, or the keep-alive passed.
    Lost(String),
    /// Another connection took the client id over (MQTT 3.1.1 §3.1.4), or the gateway
    /// stopped reading.
    Replaced,
    /// A rule was broken (already logged and counted).
    Refused,
}

/// Reads MQTT packets from a socket.
struct Reader<S> {
    io: S,
    buf: BytesMut,
    max: usize,
}

impl<S: AsyncRead + Unpin> Reader<S> {
    /// The next packet; `Err` names the cause (closed, malformed, too large).
    async fn next(&mut self) -> Result<Packet, (Option<Rule>, String)> {
        loop {
            match Packet::read(&mut self.buf, self.max) {
                Ok(p) => return Ok(p),
                Err(CodecError::InsufficientBytes(_)) => {}
                Err(e @ CodecError::PayloadSizeLimitExceeded(_)) => return Err((Some(Rule::TooLarge), e.to_string())),
                Err(e) => return Err((Some(Rule::Malformed), e.to_string())),
            }
            self.buf.reserve(4096);
            match self.io.read_buf(&mut self.buf).await {
                Ok(0) => return Err((None, "closed by the device".into())),
                Ok(_) => {}
                Err(e) => return Err((None, e.to_string())),
            }
        }
    }
}

/// Longest a write to a device may take: a device that stops reading (its TCP window
/// full) must not hold its session, its keep-alive and its disconnection forever.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Most jobs written to a device in one go.
const WRITE_BATCH: usize = 64;

async fn write<S: AsyncWrite + Unpin>(io: &mut S, packets: &[Packet]) -> std::io::Result<()> {
    let mut out = BytesMut::new();
    for p in packets {
        p.write(&mut out, usize::MAX)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
    }
    let written = async {
        io.write_all(&out).await?;
        io.flush().await
    };
    match tokio::time::timeout(WRITE_TIMEOUT, written).await {
        Ok(r) => r,
        Err(_) => Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "device not reading")),
    }
}

fn connack(code: ConnectReturnCode, session_present: bool) -> Packet {
    Packet::ConnAck(ConnAck { session_present, code })
}

/// Serves one connection (TLS already established when `peer.tls`) until it ends.
/// `handshake` is the listener's handshake permit, released once the device has its
/// CONNACK: the whole admission (TLS, CONNECT, authentication) counts against
/// `mqtt.max_handshakes`. The CONNECT must arrive by `deadline` (`mqtt.connect_timeout_ms`
/// after the socket was accepted, the TLS handshake included).
pub async fn serve<S>(
    io: S,
    peer: Peer,
    shared: Arc<Shared>,
    handshake: tokio::sync::OwnedSemaphorePermit,
    deadline: tokio::time::Instant,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (rd, mut wr) = tokio::io::split(io);
    let mut reader = Reader { io: rd, buf: BytesMut::with_capacity(1024), max: shared.cfg.max_payload_bytes };
    // Watched from before the CONNECT is judged: a device disabled meanwhile is not missed.
    let standing = shared.directory.changes();
    let credentials = shared.credentials_changed();
    let first = match tokio::time::timeout_at(deadline, reader.next()).await {
        Err(_) => return shared.refuse(Rule::ConnectTimeout, &peer, None, "no CONNECT in time"),
        Ok(Err((rule, why))) => {
            return match rule {
                Some(rule) => shared.refuse(rule, &peer, None, &why),
                None => tracing::debug!(addr = %peer.addr, %why, "socket closed before CONNECT"),
            }
        }
        Ok(Ok(p)) => p,
    };
    let Packet::Connect(connect) = first else {
        return shared.refuse(Rule::Malformed, &peer, None, "first packet is not CONNECT");
    };
    let refuse = |(rule, code): Refusal, device: Option<&str>, why: &str| {
        shared.refuse(rule, &peer, device.or(Some(&connect.client_id)), why);
        connack(code, false)
    };
    let authenticated = shared.auth.authenticate(&connect.client_id, connect.login.as_ref(), &peer, &shared.directory);
    let refusal = match &authenticated {
        Err(r) => Some(refuse(*r, None, "CONNECT refused")),
        Ok((device, _)) => {
            connect.last_will.as_ref().filter(|w| !access::may_will(device, w.topic.as_bytes())).map(|w| {
                refuse((Rule::Will, ConnectReturnCode::NotAuthorized), Some(device), &format!("will on {}", w.topic))
            })
        }
    };
    if let Some(answer) = refusal {
        let _ = write(&mut wr, &[answer]).await;
        return;
    }
    let Ok((device, credential)) = authenticated else { return };
    let Some(_slot) = shared.connection_slot() else {
        let answer =
            refuse((Rule::Capacity, ConnectReturnCode::ServiceUnavailable), Some(&device), "at mqtt.max_connections");
        let _ = write(&mut wr, &[answer]).await;
        return;
    };
    let hub = shared.hub.clone();
    let Attached { session, jobs, session_present, subscribed } =
        hub.attach(&connect.client_id, &device, connect.clean_session);
    let mut conn = Conn {
        topic: Topic::Jobs(device.clone()).path(),
        device,
        client_id: connect.client_id.clone(),
        session,
        credential,
        peer: &peer,
        shared: &shared,
        hub: &hub,
        granted: subscribed,
        next_pkid: 0,
    };
    let end = if write(&mut wr, &[connack(ConnectReturnCode::Success, session_present)]).await.is_err() {
        End::Lost("CONNACK not written".into())
    } else {
        drop(handshake);
        tracing::debug!(device = %conn.device, addr = %peer.addr, tls = peer.tls, "device connected");
        let keep_alive = match connect.keep_alive {
            0 => None,
            // MQTT 3.1.1 §3.1.2.10: one and a half keep-alive periods without a packet.
            s => Some(Duration::from_millis(u64::from(s) * 1_500)),
        };
        conn.pump(&mut reader, &mut wr, jobs, keep_alive, standing, credentials).await
    };
    match &end {
        End::Lost(why) => tracing::debug!(device = %conn.device, addr = %peer.addr, %why, "device connection lost"),
        other => tracing::debug!(device = %conn.device, addr = %peer.addr, end = ?other, "device disconnected"),
    }
    hub.detach(&conn.client_id, session);
    if !matches!(end, End::Clean | End::Replaced) {
        if let Some(LastWill { topic, message, .. }) = connect.last_will {
            let _ = hub.from_device(&topic, &message).await;
        }
    }
    let _ = wr.shutdown().await;
}

/// A connected device's session.
struct Conn<'a> {
    device: String,
    /// `pixgate/v1/devices/{device}/jobs`.
    topic: String,
    client_id: String,
    session: u64,
    /// What it proved itself with (checked again when credentials change).
    credential: Credential,
    peer: &'a Peer,
    shared: &'a Shared,
    hub: &'a Hub,
    /// The QoS its jobs subscription was granted at, if subscribed.
    granted: Option<QoS>,
    /// The last packet identifier used for a job sent at QoS 1.
    next_pkid: u16,
}

impl Conn<'_> {
    async fn pump<R, W>(
        &mut self,
        reader: &mut Reader<R>,
        wr: &mut W,
        mut jobs: mpsc::Receiver<Bytes>,
        keep_alive: Option<Duration>,
        mut standing: tokio::sync::watch::Receiver<u64>,
        mut credentials: tokio::sync::watch::Receiver<u64>,
    ) -> End
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        if let Some(rule) = self.shared.auth.registry_refusal(&self.device, &self.shared.directory) {
            self.shared.refuse(rule, self.peer, Some(&self.device), "registry change while connecting");
            return End::Refused;
        }
        // Only what the device sends counts as its sign of life, not what it is sent.
        let mut heard = tokio::time::Instant::now();
        loop {
            let idle = async {
                match keep_alive {
                    Some(d) => tokio::time::sleep_until(heard + d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                p = reader.next() => {
                    let packet = match p {
                        Ok(p) => p,
                        Err((Some(rule), why)) => {
                            self.shared.refuse(rule, self.peer, Some(&self.device), &why);
                            return End::Refused;
                        }
                        Err((None, why)) => return End::Lost(why),
                    };
                    heard = tokio::time::Instant::now();
                    match self.on_device_packet(packet, wr).await {
                        Ok(None) => {}
                        Ok(Some(end)) => return end,
                        Err(e) => return End::Lost(e.to_string()),
                    }
                }
                job = jobs.recv() => {
                    let Some(first) = job else { return End::Replaced };
                    let mut packets = Vec::new();
                    packets.extend(self.job_packet(first));
                    while packets.len() < WRITE_BATCH {
                        let Ok(job) = jobs.try_recv() else { break };
                        packets.extend(self.job_packet(job));
                    }
                    if let Err(e) = write(wr, &packets).await {
                        return End::Lost(e.to_string());
                    }
                }
                () = idle => return End::Lost("keep-alive passed without a packet".into()),
                c = credentials.changed() => {
                    if c.is_err() {
                        return End::Replaced;
                    }
                    if !self.shared.auth.still_valid(&self.device, &self.credential, self.shared.tls.as_deref()) {
                        let why = format!("{:?} revoked: disconnected", self.credential);
                        self.shared.refuse(Rule::Revoked, self.peer, Some(&self.device), &why);
                        return End::Refused;
                    }
                }
                c = standing.changed() => {
                    if c.is_err() {
                        return End::Replaced;
                    }
                    if let Some(rule) = self.shared.auth.registry_refusal(&self.device, &self.shared.directory) {
                        self.shared.refuse(rule, self.peer, Some(&self.device), "registry change: disconnected");
                        return End::Refused;
                    }
                }
            }
        }
    }

    /// A job as the PUBLISH the device's subscription asks for (none if it unsubscribed
    /// meanwhile). Not retransmitted on this connection (MQTT 3.1.1 §4.4 resends only on
    /// reconnect): the dispatcher sends the job again if its ack does not come.
    fn job_packet(&mut self, job: Bytes) -> Option<Packet> {
        let qos = self.granted?;
        let mut publish = Publish::from_bytes(self.topic.clone(), qos, job);
        if qos != QoS::AtMostOnce {
            self.next_pkid = self.next_pkid.checked_add(1).unwrap_or(1);
            publish.pkid = self.next_pkid;
        }
        Some(Packet::Publish(publish))
    }

    /// A packet from the device: checked, then answered.
    async fn on_device_packet<W: AsyncWrite + Unpin>(
        &mut self,
        packet: Packet,
        wr: &mut W,
    ) -> std::io::Result<Option<End>> {
        let answer = match packet {
            Packet::Publish(p) => {
                if !access::may_publish(&self.device, p.topic.as_bytes()) {
                    let why = format!("publish on {}", p.topic);
                    self.shared.refuse(Rule::Publish, self.peer, Some(&self.device), &why);
                    return Ok(Some(End::Refused));
                }
                // Acknowledged once the gateway has it (QoS 2 is delivered at PUBREC, so a
                // device that sends it again after a lost PUBREC is seen twice; acks and
                // status are idempotent for the dispatcher).
                if self.hub.from_device(&p.topic, &p.payload).await.is_err() {
                    return Ok(Some(End::Replaced));
                }
                match p.qos {
                    QoS::AtMostOnce => return Ok(None),
                    QoS::AtLeastOnce => Packet::PubAck(PubAck::new(p.pkid)),
                    QoS::ExactlyOnce => Packet::PubRec(PubRec::new(p.pkid)),
                }
            }
            Packet::PubRel(r) => Packet::PubComp(PubComp::new(r.pkid)),
            // The device's acknowledgement of a job: the job's own ack, on the acks topic,
            // is what the dispatcher waits for.
            Packet::PubAck(_) | Packet::PubRec(_) | Packet::PubComp(_) => return Ok(None),
            Packet::Subscribe(s) => {
                let mut return_codes = Vec::with_capacity(s.filters.len());
                for f in &s.filters {
                    if access::may_subscribe(&self.device, &f.path) {
                        // Jobs go out at QoS 1 at most: the device dedupes by message id.
                        let qos = if f.qos == QoS::AtMostOnce { QoS::AtMostOnce } else { QoS::AtLeastOnce };
                        self.granted = Some(qos);
                        return_codes.push(SubscribeReasonCode::Success(qos));
                    } else {
                        let why = format!("subscribe to {}", f.path);
                        self.shared.refuse(Rule::Subscribe, self.peer, Some(&self.device), &why);
                        return_codes.push(SubscribeReasonCode::Failure);
                    }
                }
                // The SUBACK is written before any job of the new subscription.
                write(wr, &[Packet::SubAck(SubAck::new(s.pkid, return_codes))]).await?;
                if let Some(qos) = self.granted {
                    self.hub.subscribe(&self.client_id, self.session, qos);
                }
                return Ok(None);
            }
            Packet::Unsubscribe(u) => {
                if u.topics.contains(&self.topic) {
                    self.granted = None;
                    self.hub.unsubscribe(&self.client_id, self.session);
                }
                Packet::UnsubAck(UnsubAck::new(u.pkid))
            }
            Packet::PingReq => Packet::PingResp,
            Packet::Disconnect => return Ok(Some(End::Clean)),
            Packet::Connect(_) => {
                // MQTT 3.1.1 §3.1.0: a second CONNECT is a protocol violation.
                self.shared.refuse(Rule::Malformed, self.peer, Some(&self.device), "second CONNECT");
                return Ok(Some(End::Refused));
            }
            other @ (Packet::ConnAck(_) | Packet::SubAck(_) | Packet::UnsubAck(_) | Packet::PingResp) => {
                let why = format!("a server's packet from a client: {other:?}");
                self.shared.refuse(Rule::Malformed, self.peer, Some(&self.device), &why);
                return Ok(Some(End::Refused));
            }
        };
        write(wr, &[answer]).await?;
        Ok(None)
    }
}
