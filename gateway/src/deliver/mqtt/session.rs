//! One device connection: CONNECT, authentication, then every packet checked against the
//! access rules, between the socket and the device's place in the [`Hub`].
//!
//! MQTT 3.1.1 is decoded and encoded with rumqttc's codec (`mqttbytes::v4`), and a CONNECT
//! of any other protocol level is answered with the refusal its own version defines
//! ([`Rule::ProtocolVersion`]) and closed. What a broker does for a device is done here:
//! QoS 1 (and 2) acknowledgements of what it publishes, its jobs written at the QoS its
//! subscription was granted, the will published when the socket closes without
//! DISCONNECT; and what one connection may send is bounded ([`Inbound`]).

use super::access::{self, Rule};
use super::auth::{Credential, Peer, Refusal};
use super::hub::{Attached, Hub};
use super::inbound::{self, Inbound, Verdict};
use super::listener::{Handshake, Shared};
use crate::model::Incoming;
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

/// A CONNECT's protocol name and level (MQTT 3.1.1 §3.1.2.1–2; MQTT 5 §3.1.2.1–2), read
/// before the packet is decoded: a level-5 CONNECT carries properties the 3.1.1 codec would
/// read as the client id.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Protocol {
    name: Vec<u8>,
    level: u8,
}

impl Protocol {
    /// MQTT 3.1.1, the one protocol pixgate speaks.
    fn is_v311(&self) -> bool {
        self.name == b"MQTT" && self.level == 4
    }

    /// The answer to a CONNECT of another protocol before the connection is closed, or
    /// `None` for a protocol name that is not MQTT's (closed without an answer, MQTT 3.1.1
    /// §3.1.2.1): for `MQTT` level 5 a MQTT 5 CONNACK with reason code 0x84 "Unsupported
    /// Protocol Version" and no properties (MQTT 5 §3.2.2.2); for any other level of
    /// `MQTT` or MQTT 3.1's `MQIsdp`, CONNACK return code 1 "unacceptable protocol version"
    /// (MQTT 3.1.1 §3.2.2.3, MQTT 3.1 §3.2).
    fn refusal(&self) -> Option<&'static [u8]> {
        match (self.name.as_slice(), self.level) {
            (b"MQTT", 5) => Some(&[0x20, 0x03, 0x00, 0x84, 0x00]),
            (b"MQTT" | b"MQIsdp", _) => Some(&[0x20, 0x02, 0x00, 0x01]),
            _ => None,
        }
    }

    /// The protocol of the CONNECT at the start of `buf`: `Ok(None)` while more bytes are
    /// needed, `Err` when `buf` does not start with a CONNECT that names a protocol
    /// (another packet type, a remaining length or name that cannot be one).
    fn peek(buf: &[u8]) -> Result<Option<Protocol>, String> {
        let Some(&first) = buf.first() else { return Ok(None) };
        if first != 0x10 {
            return Err("first packet is not CONNECT".into());
        }
        // The remaining length: 1 to 4 bytes, 7 bits each (MQTT 3.1.1 §2.2.3).
        let mut at = 1;
        loop {
            let Some(&b) = buf.get(at) else { return Ok(None) };
            at += 1;
            if b & 0x80 == 0 {
                break;
            }
            if at == 5 {
                return Err("malformed remaining length".into());
            }
        }
        let (Some(&hi), Some(&lo)) = (buf.get(at), buf.get(at + 1)) else { return Ok(None) };
        let len = usize::from(u16::from_be_bytes([hi, lo]));
        if len > 6 {
            return Err(format!("a protocol name of {len} bytes"));
        }
        let Some(name) = buf.get(at + 2..at + 2 + len) else { return Ok(None) };
        let Some(&level) = buf.get(at + 2 + len) else { return Ok(None) };
        Ok(Some(Protocol { name: name.to_vec(), level }))
    }
}

impl<S: AsyncRead + Unpin> Reader<S> {
    /// The protocol the first packet, a CONNECT, names (nothing consumed: the packet is read
    /// with [`Reader::next`] after); `Err` as [`Reader::next`].
    async fn protocol(&mut self) -> Result<Protocol, (Option<Rule>, String)> {
        loop {
            match Protocol::peek(&self.buf) {
                Ok(Some(p)) => return Ok(p),
                Ok(None) => {}
                Err(why) => return Err((Some(Rule::Malformed), why)),
            }
            self.buf.reserve(64);
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
/// `handshake` is the listener's handshake slot, released once the device has its
/// CONNACK: the whole admission (TLS, CONNECT, authentication) counts against
/// `mqtt.max_handshakes` and `mqtt.max_handshakes_per_address`. The CONNECT must arrive
/// by `deadline` (`mqtt.connect_timeout_ms` after the socket was accepted, the TLS
/// handshake included).
pub async fn serve<S>(io: S, peer: Peer, shared: Arc<Shared>, handshake: Handshake, deadline: tokio::time::Instant)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (rd, mut wr) = tokio::io::split(io);
    let mut reader = Reader { io: rd, buf: BytesMut::with_capacity(1024), max: shared.cfg.max_payload_bytes };
    // Watched from before the CONNECT is judged: a device disabled meanwhile is not missed.
    let standing = shared.directory.changes();
    let credentials = shared.credentials_changed();
    let first = tokio::time::timeout_at(deadline, async {
        let protocol = reader.protocol().await?;
        if !protocol.is_v311() {
            return Ok(Err(protocol));
        }
        reader.next().await.map(Ok)
    });
    let first = match first.await {
        Err(_) => return shared.refuse(Rule::ConnectTimeout, &peer, None, "no CONNECT in time"),
        Ok(Err((rule, why))) => {
            return match rule {
                Some(rule) => shared.refuse(rule, &peer, None, &why),
                None => tracing::debug!(addr = %peer.addr, %why, "socket closed before CONNECT"),
            }
        }
        Ok(Ok(Err(protocol))) => {
            let name = String::from_utf8_lossy(&protocol.name);
            let Some(answer) = protocol.refusal() else {
                return shared.refuse(Rule::Malformed, &peer, None, &format!("protocol name {name:?}"));
            };
            let why = format!("protocol {name} level {} (MQTT 3.1.1 is level 4 of MQTT)", protocol.level);
            shared.refuse(Rule::ProtocolVersion, &peer, None, &why);
            let _ = tokio::time::timeout(WRITE_TIMEOUT, async {
                wr.write_all(answer).await?;
                wr.shutdown().await
            })
            .await;
            return;
        }
        Ok(Ok(Ok(p))) => p,
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
        inbound: Inbound::new(
            shared.cfg.max_messages_per_second,
            shared.cfg.max_bytes_per_second,
            tokio::time::Instant::now(),
        ),
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
            let _ = pass_on(&hub, &shared, &peer, &conn.device, &topic, &message).await;
        }
    }
    let _ = wr.shutdown().await;
}

/// A message `device` published (or left as its will) on `topic`, already checked against
/// the access rules: decoded and passed to the hub; a payload that is not what the topic
/// carries is counted and logged as [`Rule::MalformedMessage`] and dropped.
///
/// # Errors
/// The gateway stopped reading (shutdown).
async fn pass_on(
    hub: &Hub,
    shared: &Shared,
    peer: &Peer,
    device: &str,
    topic: &str,
    payload: &[u8],
) -> Result<(), mpsc::error::SendError<Incoming>> {
    match Incoming::parse(topic, payload) {
        Ok(Some(msg)) => hub.from_device(msg).await,
        Ok(None) => Ok(()),
        Err(e) => {
            shared.refuse(Rule::MalformedMessage, peer, Some(device), &format!("{e} on {topic}"));
            Ok(())
        }
    }
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
    /// What it may still send this second.
    inbound: Inbound,
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
                    let bytes = match &packet {
                        Packet::Publish(p) => p.topic.len() + p.payload.len(),
                        _ => 0,
                    };
                    // A device may always leave, and its MQTT-level answers to the jobs sent to it are
                    // as many as the jobs: neither counts against its rate.
                    let answer = matches!(packet, Packet::Disconnect | Packet::PubAck(_) | Packet::PubRec(_) | Packet::PubComp(_));
                    let verdict = if answer { Verdict::Take } else { self.inbound.admit(bytes, heard) };
                    match verdict {
                        Verdict::Take => {}
                        Verdict::Drop => {
                            self.shared.refuse(Rule::MessageRate, self.peer, Some(&self.device), "beyond mqtt.max_messages_per_second or mqtt.max_bytes_per_second: packet dropped");
                            continue;
                        }
                        Verdict::Disconnect => {
                            let why = format!("beyond its rate for {} s: disconnected", inbound::SUSTAINED.as_secs());
                            self.shared.refuse(Rule::RateDisconnect, self.peer, Some(&self.device), &why);
                            return End::Refused;
                        }
                    }
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
                // status are idempotent for the dispatcher). A payload that is not what its
                // topic carries is counted and dropped, and acknowledged all the same: a
                // device's bug, which sending it again would not mend.
                if pass_on(self.hub, self.shared, self.peer, &self.device, &p.topic, &p.payload).await.is_err() {
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

#[cfg(test)]
mod tests {
    use super::*;
    use rumqttc::mqttbytes::v4::{Connect, Login};
    use rumqttc::v5::mqttbytes::v5 as mqtt5;

    const DEVICE: &str = "dev-7f80e222f828767efc2f9162";

    /// Every strict prefix of `bytes` asks for more; the whole names its protocol.
    fn peek_whole(bytes: &[u8]) -> Protocol {
        let whole = Protocol::peek(bytes).unwrap().expect("the whole header");
        let needed = (0..bytes.len()).find(|&n| Protocol::peek(&bytes[..n]).unwrap().is_some()).unwrap_or(bytes.len());
        for n in 0..needed {
            assert_eq!(Protocol::peek(&bytes[..n]), Ok(None), "{n} bytes");
        }
        whole
    }

    #[test]
    fn a_311_connect_goes_on_to_the_codec() {
        let mut buf = BytesMut::new();
        let mut connect = Connect::new(DEVICE);
        connect.keep_alive = 30;
        connect.login = Some(Login::new(DEVICE, "secret"));
        Packet::Connect(connect).write(&mut buf, usize::MAX).unwrap();
        let p = peek_whole(&buf);
        assert!(p.is_v311(), "{p:?}");
    }

    #[test]
    fn an_mqtt5_connect_is_answered_0x84_in_mqtt5_framing() {
        // Written by rumqttc's MQTT 5 codec, with properties: what the 3.1.1 codec would
        // read as the client id's length.
        let mut buf = BytesMut::new();
        let mut props = mqtt5::ConnectProperties::new();
        props.session_expiry_interval = Some(3_600);
        props.receive_maximum = Some(1);
        let connect =
            mqtt5::Connect { keep_alive: 30, client_id: DEVICE.into(), clean_start: true, properties: Some(props) };
        connect.write(&None, &None, &mut buf).unwrap();
        let p = peek_whole(&buf);
        assert_eq!((p.name.as_slice(), p.level, p.is_v311()), (&b"MQTT"[..], 5, false));
        // The answer, read back by rumqttc's MQTT 5 codec.
        let mut answer = BytesMut::from(p.refusal().unwrap());
        match mqtt5::Packet::read(&mut answer, None).unwrap() {
            mqtt5::Packet::ConnAck(ack) => {
                assert_eq!(
                    (ack.session_present, ack.code),
                    (false, mqtt5::ConnectReturnCode::UnsupportedProtocolVersion)
                );
                assert_eq!(ack.properties, None, "no properties");
            }
            other => panic!("not a CONNACK: {other:?}"),
        }
        assert!(answer.is_empty(), "nothing after the CONNACK");
    }

    #[test]
    fn other_levels_get_connack_1_and_other_names_nothing() {
        // MQTT 3.1: protocol name `MQIsdp`, level 3 (MQTT V3.1 §3.1), then flags, keep-alive,
        // client id.
        let mut v31 = vec![0x10, 0];
        v31.extend_from_slice(&[0, 6]);
        v31.extend_from_slice(b"MQIsdp");
        v31.extend_from_slice(&[3, 0x02, 0, 30, 0, 4]);
        v31.extend_from_slice(b"dev-");
        v31[1] = u8::try_from(v31.len() - 2).unwrap();
        let level6 = [0x10, 12, 0, 4, b'M', b'Q', b'T', b'T', 6, 0x02, 0, 30, 0, 0];
        for (bytes, level) in [(&v31[..], 3), (&level6[..], 6)] {
            let p = peek_whole(bytes);
            assert_eq!((p.level, p.is_v311()), (level, false));
            let mut answer = BytesMut::from(p.refusal().unwrap());
            let ack = Packet::read(&mut answer, usize::MAX).unwrap();
            assert_eq!(ack, connack(ConnectReturnCode::RefusedProtocolVersion, false), "level {level}");
            assert!(answer.is_empty());
        }
        let other = [0x10, 9, 0, 3, b'A', b'M', b'Q', 4, 0x02, 0, 30];
        assert_eq!(Protocol::peek(&other).unwrap().unwrap().refusal(), None, "not MQTT: closed without an answer");
    }

    #[test]
    fn what_cannot_be_a_connect_is_malformed() {
        // A PUBLISH first; a remaining length of five bytes; a name too long for MQTT's.
        assert!(Protocol::peek(&[0x30, 2, 0, 0]).is_err());
        assert!(Protocol::peek(&[0x10, 0x80, 0x80, 0x80, 0x80, 0x01]).is_err());
        assert!(Protocol::peek(&[0x10, 20, 0, 40]).is_err());
        // A fixed header with reserved flags set is not a CONNECT either (MQTT 3.1.1 §2.2.2).
        assert!(Protocol::peek(&[0x11, 2, 0, 4]).is_err());
    }
}
