//! One device connection: CONNECT, authentication, then every packet checked against the
//! access rules, between the socket and the device's place in the [`Hub`].
//!
//! MQTT 3.1.1 and MQTT 5 are decoded and encoded with rumqttc's codecs ([`wire`]), the
//! version chosen by the CONNECT's protocol level; a CONNECT of any other level is answered
//! with the refusal its own version defines ([`Rule::ProtocolVersion`]) and closed. On
//! MQTT 5 a connection the server ends for a reason gets a DISCONNECT naming it first
//! (MQTT 5 §4.13). What a broker does for a device is done here:
//! QoS 1 (and 2) acknowledgements of what it publishes, its jobs written at the QoS its
//! subscription was granted, the will published when the socket closes without
//! DISCONNECT; and what one connection may send is bounded ([`Inbound`]).

use super::access::{self, Rule};
use super::auth::{Credential, Peer, Refusal};
use super::hub::{job_queue, Attached, Hub};
use super::inbound::{self, Inbound, Verdict};
use super::listener::{Handshake, Shared};
use super::star;
use super::wire::{self, Out, Packet, ReadError, Version};
use crate::model::Incoming;
use bytes::{Bytes, BytesMut};
use device_protocol::Topic;
use rumqttc::mqttbytes::v4::ConnectReturnCode;
use rumqttc::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::DisconnectReasonCode as Reason;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::mpsc;

/// Why a session ended (logged at debug; refusals are logged where they happen).
#[derive(Debug)]
enum End {
    /// The device sent DISCONNECT.
    Clean,
    /// The socket closed or failed, or the keep-alive passed.
    Lost(String),
    /// Another connection took the client id over (MQTT 3.1.1 §3.1.4), or the hub was
    /// dropped.
    Replaced,
    /// The gateway is stopping (it no longer reads what devices send).
    Stopped,
    /// A rule was broken (already logged and counted), and MQTT 5's reason code for it.
    Refused(Rule, Reason),
}

impl End {
    /// [`End::Refused`] for `rule`, with its reason code ([`reason_of`]).
    fn refused(rule: Rule) -> End {
        End::Refused(rule, reason_of(rule))
    }

    /// The DISCONNECT an MQTT 5 device is sent before the close, if any: its reason code
    /// and reason string (the rule's label).
    fn reason(&self) -> Option<(Reason, &'static str)> {
        match self {
            End::Clean => None,
            End::Lost(why) if why.starts_with("keep-alive") => Some((Reason::KeepAliveTimeout, "keep-alive passed")),
            End::Lost(_) => None,
            End::Replaced => Some((Reason::SessionTakenOver, "session taken over")),
            End::Stopped => Some((Reason::ServerShuttingDown, "server shutting down")),
            End::Refused(rule, reason) => Some((*reason, rule.as_str())),
        }
    }
}

/// MQTT 5's reason code for closing a connection that broke `rule` (MQTT 5 §3.14.2.1).
fn reason_of(rule: Rule) -> Reason {
    match rule {
        Rule::TooLarge => Reason::PacketTooLarge,
        Rule::MessageRate | Rule::RateDisconnect => Reason::MessageRateTooHigh,
        Rule::Malformed | Rule::MalformedMessage => Reason::MalformedPacket,
        _ => Reason::NotAuthorized,
    }
}

/// `dev-{username}` when a Star printer connects with its MAC as its client id and the
/// username of the printer with that MAC ([`star`]); `None` otherwise.
fn star_client_id(shared: &Shared, connect: &wire::Connect) -> Option<String> {
    if access::device_of_client_id(&connect.client_id).is_some() {
        return None;
    }
    let user = &connect.login.as_ref()?.username;
    let mac = shared.star.as_ref()?.mac_of(user)?;
    (access::valid_id(user) && star::is_mac(&mac, &connect.client_id))
        .then(|| format!("{}{user}", access::CLIENT_ID_PREFIX))
}

/// Reads MQTT packets from a socket.
struct Reader<S> {
    io: S,
    buf: BytesMut,
    max: usize,
    /// Set from the CONNECT's protocol level, before the CONNECT is read.
    version: Version,
}

/// Read room for an idle device's next packets, bytes: acks and statuses are a few hundred
/// bytes, and thousands of idle devices each keep this much.
const IDLE_READ_ROOM: usize = 512;

/// Read room while a packet is partly read, bytes.
const PARTIAL_READ_ROOM: usize = 4096;

impl<S: AsyncRead + Unpin> Reader<S> {
    /// Room for the next read: little while nothing is pending (a buffer the CONNECT or a
    /// large packet grew is let go once consumed), more while a packet is partly read.
    fn make_room(&mut self) {
        if self.buf.is_empty() {
            if self.buf.capacity() > 2 * IDLE_READ_ROOM {
                self.buf = BytesMut::new();
            }
            self.buf.reserve(IDLE_READ_ROOM);
        } else {
            self.buf.reserve(PARTIAL_READ_ROOM);
        }
    }

    /// The next packet; `Err` names the cause (closed, malformed, too large).
    async fn next(&mut self) -> Result<Packet, (Option<Rule>, String)> {
        loop {
            match self.version.read(&mut self.buf, self.max) {
                Ok(p) => return Ok(p),
                Err(ReadError::Incomplete) => {}
                Err(ReadError::TooLarge(e)) => return Err((Some(Rule::TooLarge), e)),
                Err(ReadError::Malformed(e)) => return Err((Some(Rule::Malformed), e)),
            }
            self.make_room();
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
    /// The version pixgate speaks for this protocol: `MQTT` level 4 (3.1.1) or 5.
    fn version(&self) -> Option<Version> {
        match (self.name.as_slice(), self.level) {
            (b"MQTT", 4) => Some(Version::V311),
            (b"MQTT", 5) => Some(Version::V5),
            _ => None,
        }
    }

    /// The answer to a CONNECT of another protocol before the connection is closed, or
    /// `None` for a protocol name that is not MQTT's (closed without an answer, MQTT 3.1.1
    /// §3.1.2.1): for `MQTT` above level 5 a CONNACK in MQTT 5's layout with reason code
    /// 0x84 "Unsupported Protocol Version" and no properties (MQTT 5 §3.2.2.2: a newer
    /// client reads that one); for any other level of `MQTT` or MQTT 3.1's `MQIsdp`,
    /// CONNACK return code 1 "unacceptable protocol version" (MQTT 3.1.1 §3.2.2.3, MQTT 3.1
    /// §3.2).
    fn refusal(&self) -> Option<&'static [u8]> {
        match (self.name.as_slice(), self.level) {
            (b"MQTT", 6..) => Some(&[0x20, 0x03, 0x00, 0x84, 0x00]),
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

/// Longest a write to a device may go without the device taking a byte: a device that
/// stops reading (its TCP window full) must not hold its session, its keep-alive and its
/// disconnection forever. It bounds each step, not the whole write (as nginx's
/// `send_timeout`), so that a card machine on GPRS (a few KB/s) still gets a batch of
/// raster receipts that takes minutes. 30 s; 3 s in unit tests, which wait it out.
pub(crate) const WRITE_TIMEOUT: Duration = Duration::from_secs(if cfg!(test) { 3 } else { 30 });

/// Longest a connection the gateway ended with a DISCONNECT stays open for the device to
/// read it and close its side; and longest its close (TLS's close_notify) is waited for.
const LINGER: Duration = Duration::from_secs(1);

/// More than a job PUBLISH adds to its topic and payload: the fixed header, packet id and
/// MQTT 5 properties (content type, expiry, three user properties: some 150 bytes; raw,
/// seven: some 350, with a payload a quarter smaller than its JSON's base64).
const JOB_OVERHEAD: usize = 1_024;

/// Most jobs written to a device in one go.
const WRITE_BATCH: usize = 64;

async fn write<S: AsyncWrite + Unpin>(io: &mut S, version: Version, packets: &[Out]) -> std::io::Result<()> {
    let mut out = BytesMut::new();
    for p in packets {
        version.write(p, &mut out).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    }
    let stalled = || std::io::Error::new(std::io::ErrorKind::TimedOut, "device not reading");
    let mut rest = &out[..];
    while !rest.is_empty() {
        match tokio::time::timeout(WRITE_TIMEOUT, io.write(rest)).await {
            Ok(Ok(0)) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(Ok(n)) => rest = &rest[n..],
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(stalled()),
        }
    }
    tokio::time::timeout(WRITE_TIMEOUT, io.flush()).await.map_err(|_| stalled())?
}

fn refused(code: ConnectReturnCode) -> Out {
    Out::ConnAck { code, session_present: false, session_expiry_s: 0, max_packet: 0 }
}

/// A connection's two halves ([`tokio::io::split`]).
pub type Halves<S> = (ReadHalf<S>, WriteHalf<S>);

/// A device that passed admission: its CONNECT, the client id it is known by, and who
/// it proved to be.
struct Admitted {
    connect: wire::Connect,
    client_id: String,
    device: String,
    credential: Credential,
    /// Its MAC, if it is a Star printer on the MQTT method ([`star`]).
    mac: Option<String>,
}

/// Serves one connection (TLS already established when `peer.tls`), given as its two
/// halves ([`tokio::io::split`]), until it ends. The caller splits it so that the stream
/// (a `TlsStream` is 1.2 KiB) lives once, behind the halves: an argument moved into this
/// future keeps its slot there for the connection's whole life. For the same reason the
/// admission and the rare steps (a will, a refusal) run as boxed futures: this future's
/// size is that of its largest step, and every connected device's task keeps it.
/// `handshake` is the listener's handshake slot, released once the device has its
/// CONNACK: the whole admission (TLS, CONNECT, authentication) counts against
/// `mqtt.max_handshakes` and `mqtt.max_handshakes_per_address`. The CONNECT must arrive
/// by `deadline` (`mqtt.connect_timeout_ms` after the socket was accepted, the TLS
/// handshake included).
pub async fn serve<S>(
    (rd, mut wr): Halves<S>,
    peer: Peer,
    shared: Arc<Shared>,
    handshake: Handshake,
    deadline: tokio::time::Instant,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut reader = Reader {
        io: rd,
        buf: BytesMut::with_capacity(IDLE_READ_ROOM),
        max: shared.cfg.max_payload_bytes,
        version: Version::V311,
    };
    // Watched from before the CONNECT is judged: a device disabled meanwhile is not missed.
    let standing = shared.directory.changes();
    let credentials = shared.credentials_changed();
    let Some(Admitted { connect, client_id, device, credential, mac }) =
        Box::pin(admit(&mut reader, &mut wr, &peer, &shared, deadline)).await
    else {
        return;
    };
    let version = reader.version;
    let Some(_slot) = shared.connection_slot() else {
        shared.refuse(Rule::Capacity, &peer, Some(&device), "at mqtt.max_connections");
        let answer = refused(ConnectReturnCode::ServiceUnavailable);
        let _ = Box::pin(write(&mut wr, version, &[answer])).await;
        return;
    };
    let hub = shared.hub.clone();
    let expiry = Duration::from_secs(u64::from(connect.session_expiry_s));
    let Attached { session, jobs, session_present, subscribed } =
        hub.attach(&client_id, &device, connect.clean_start, expiry);
    let star_printer = mac.is_some();
    let mut conn = Conn {
        topic: mac.as_deref().map_or_else(|| Topic::Jobs(device.clone()).path(), star::jobs_topic),
        mac,
        device,
        client_id,
        session,
        credential,
        peer: &peer,
        shared: &shared,
        hub: &hub,
        granted: subscribed,
        next_pkid: 0,
        unacked: 0,
        receive_maximum: connect.receive_maximum,
        // A Star printer takes JSON only.
        raw_payloads: connect.raw_payloads && !star_printer,
        version,
        max_packet: connect.max_packet_size.map_or(usize::MAX, |m| usize::try_from(m).unwrap_or(usize::MAX)),
        inbound: Inbound::new(
            shared.cfg.max_messages_per_second,
            shared.cfg.max_bytes_per_second,
            tokio::time::Instant::now(),
        ),
    };
    let accepted = Out::ConnAck {
        code: ConnectReturnCode::Success,
        session_present,
        session_expiry_s: connect.session_expiry_s,
        max_packet: u32::try_from(shared.cfg.max_payload_bytes).unwrap_or(u32::MAX),
    };
    // Whether the CloudPRNT side was told this Star printer's session is up (told it ended
    // only then: a failed CONNACK must not end another session of the same printer).
    let mut told_up = false;
    let end = if write(&mut wr, version, &[accepted]).await.is_err() {
        End::Lost("CONNACK not written".into())
    } else {
        drop(handshake);
        tracing::debug!(device = %conn.device, addr = %peer.addr, tls = peer.tls, "device connected");
        if let Some(star) = shared.star.as_ref().filter(|_| star_printer) {
            star.session(&conn.device, true);
            told_up = true;
        }
        let keep_alive = match connect.keep_alive {
            0 => None,
            // MQTT 3.1.1 §3.1.2.10: one and a half keep-alive periods without a packet.
            s => Some(Duration::from_millis(u64::from(s) * 1_500)),
        };
        conn.pump(&mut reader, &mut wr, jobs, keep_alive, standing, credentials).await
    };
    // Taken over while it was busy (writing to a half-open socket, say), a connection ends
    // lost rather than replaced: its device is already back, and its will must not say
    // it is offline after its new connection said it is online.
    let taken_over = !hub.detach(&conn.client_id, session);
    // Nor is a DISCONNECT written to the socket that failed.
    let quiet = taken_over && matches!(end, End::Lost(_));
    let end = match end {
        End::Lost(_) if taken_over => End::Replaced,
        end => end,
    };
    match &end {
        End::Lost(why) => tracing::debug!(device = %conn.device, addr = %peer.addr, %why, "device connection lost"),
        other => tracing::debug!(device = %conn.device, addr = %peer.addr, end = ?other, "device disconnected"),
    }
    if !taken_over && !matches!(end, End::Clean | End::Replaced | End::Stopped) {
        if let Some((topic, message)) = connect.will {
            let will = pass_on(&hub, &shared, &peer, &conn.device, conn.mac.as_deref(), &topic, &message);
            let _ = Box::pin(will).await;
        }
    }
    if let Some(star) = shared.star.as_ref().filter(|_| told_up) {
        star.session(&conn.device, false);
    }
    let said = end.reason().filter(|_| version == Version::V5 && !quiet);
    if let Some((reason, why)) = said {
        let _ = write(&mut wr, version, &[Out::Disconnect { reason, why }]).await;
    }
    // Bounded: over TLS the close_notify waits for a socket the device may never read.
    let _ = tokio::time::timeout(LINGER, wr.shutdown()).await;
    if said.is_some() {
        // Closed with the device's bytes still unread (a flood, say), the socket is reset,
        // and the device may lose the DISCONNECT before it reads it: what it still sends
        // is read and dropped until it closes, for at most LINGER.
        // Into the read buffer, not a local array: a local held across the await would sit in
        // every session's future for its whole life.
        let drain = async {
            loop {
                reader.buf.clear();
                if !matches!(reader.io.read_buf(&mut reader.buf).await, Ok(n) if n > 0) {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(LINGER, drain).await;
    }
}

/// Admission: the CONNECT by `deadline` (its protocol level sets `reader`'s version), then
/// authentication and the will's topic. A refusal is counted and logged, and answered
/// where the protocol has an answer; then `None`.
async fn admit<R, W>(
    reader: &mut Reader<R>,
    wr: &mut W,
    peer: &Peer,
    shared: &Shared,
    deadline: tokio::time::Instant,
) -> Option<Admitted>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let first = tokio::time::timeout_at(deadline, async {
        let protocol = reader.protocol().await?;
        let Some(version) = protocol.version() else { return Ok(Err(protocol)) };
        reader.version = version;
        reader.next().await.map(Ok)
    });
    let first = match first.await {
        Err(_) => {
            shared.refuse(Rule::ConnectTimeout, peer, None, "no CONNECT in time");
            return None;
        }
        Ok(Err((rule, why))) => {
            match rule {
                Some(rule) => shared.refuse(rule, peer, None, &why),
                None => tracing::debug!(addr = %peer.addr, %why, "socket closed before CONNECT"),
            }
            return None;
        }
        Ok(Ok(Err(protocol))) => {
            let name = String::from_utf8_lossy(&protocol.name);
            let Some(answer) = protocol.refusal() else {
                shared.refuse(Rule::Malformed, peer, None, &format!("protocol name {name:?}"));
                return None;
            };
            let why = format!("protocol {name} level {} (MQTT 3.1.1 and 5 are levels 4 and 5 of MQTT)", protocol.level);
            shared.refuse(Rule::ProtocolVersion, peer, None, &why);
            let _ = tokio::time::timeout(WRITE_TIMEOUT, async {
                wr.write_all(answer).await?;
                wr.shutdown().await
            })
            .await;
            return None;
        }
        Ok(Ok(Ok(p))) => p,
    };
    let Packet::Connect(connect) = first else {
        shared.refuse(Rule::Malformed, peer, None, "first packet is not CONNECT");
        return None;
    };
    let refuse = |(rule, code): Refusal, device: Option<&str>, why: &str| {
        shared.refuse(rule, peer, device.or(Some(&connect.client_id)), why);
        refused(code)
    };
    // A Star printer whose firmware keeps its MAC as its client id is known by its username.
    let client_id = star_client_id(shared, &connect).unwrap_or_else(|| connect.client_id.clone());
    let authenticated = shared.auth.authenticate(&client_id, connect.login.as_ref(), peer, &shared.directory);
    let mac = authenticated.as_ref().ok().and_then(|(device, _)| shared.star.as_ref()?.mac_of(device));
    let refusal = match &authenticated {
        Err(r) => Some(refuse(*r, None, "CONNECT refused")),
        Ok((device, _)) => {
            let may_will = |topic: &str| match &mac {
                Some(mac) => star::may_will(mac, topic.as_bytes()),
                None => access::may_will(device, topic.as_bytes()),
            };
            connect.will.as_ref().filter(|(topic, _)| !may_will(topic)).map(|(topic, _)| {
                refuse((Rule::Will, ConnectReturnCode::NotAuthorized), Some(device), &format!("will on {topic}"))
            })
        }
    };
    if let Some(answer) = refusal {
        let _ = write(wr, reader.version, &[answer]).await;
        return None;
    }
    let (device, credential) = authenticated.ok()?;
    Some(Admitted { connect, client_id, device, credential, mac })
}

/// A message `device` published (or left as its will) on `topic`, already checked against
/// the access rules: decoded and passed to the hub, or for a Star printer (its `mac`) to
/// the CloudPRNT side; a payload that is not what the topic carries is counted and logged
/// as [`Rule::MalformedMessage`] and dropped. Returns whether the payload was what the
/// topic carries.
///
/// # Errors
/// The gateway stopped reading (shutdown).
async fn pass_on(
    hub: &Hub,
    shared: &Shared,
    peer: &Peer,
    device: &str,
    mac: Option<&str>,
    topic: &str,
    payload: &[u8],
) -> Result<bool, mpsc::error::SendError<Incoming>> {
    if let (Some(mac), Some(printers)) = (mac, shared.star.as_ref()) {
        let Some(method) = star::method_of(mac, topic.as_bytes()) else { return Ok(false) };
        return Ok(match printers.published(device, method, payload).await {
            Ok(()) => true,
            Err(e) => {
                shared.refuse(Rule::MalformedMessage, peer, Some(device), &format!("{e} on {topic}"));
                false
            }
        });
    }
    match Incoming::parse(topic, payload) {
        Ok(Some(msg)) => hub.from_device(msg).await.map(|()| true),
        Ok(None) => Ok(true),
        Err(e) => {
            shared.refuse(Rule::MalformedMessage, peer, Some(device), &format!("{e} on {topic}"));
            Ok(false)
        }
    }
}

/// A connected device's session.
struct Conn<'a> {
    device: String,
    /// The MAC of a Star CloudPRNT printer ([`star`]); `None` for a pixgate device.
    mac: Option<String>,
    /// Where its jobs go: `pixgate/v1/devices/{device}/jobs`, or a Star printer's
    /// `print-job` topic.
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
    /// QoS 1 jobs written and not yet acknowledged at the MQTT level (PUBACK).
    unacked: u16,
    /// How many it takes unacknowledged (its MQTT 5 Receive Maximum; `None`: no limit).
    receive_maximum: Option<u16>,
    /// The protocol it speaks.
    version: Version,
    /// The largest packet it takes (its MQTT 5 Maximum Packet Size; else no limit).
    max_packet: usize,
    /// Its jobs go out as raw bytes ([`wire::Connect::raw_payloads`]).
    raw_payloads: bool,
}

impl Conn<'_> {
    async fn pump<R, W>(
        &mut self,
        reader: &mut Reader<R>,
        wr: &mut W,
        mut jobs: job_queue::Receiver<Bytes>,
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
            return End::refused(rule);
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
                            return End::refused(rule);
                        }
                        Err((None, why)) => return End::Lost(why),
                    };
                    heard = tokio::time::Instant::now();
                    let bytes = match &packet {
                        Packet::Publish { topic, payload, .. } => topic.len() + payload.len(),
                        _ => 0,
                    };
                    // A device may always leave, and its MQTT-level answers to the jobs sent to it are
                    // as many as the jobs: neither counts against its rate.
                    let answer = matches!(packet, Packet::Disconnect | Packet::Answer);
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
                            return End::refused(Rule::RateDisconnect);
                        }
                    }
                    // Boxed: its state (some 1 KiB) is needed only while a packet is handled.
                    match Box::pin(self.on_device_packet(packet, wr)).await {
                        Ok(None) => {}
                        Ok(Some(end)) => return end,
                        Err(e) => return End::Lost(e.to_string()),
                    }
                }
                job = jobs.recv() => {
                    let Ok(first) = job else { return End::Replaced };
                    let mut packets = Vec::new();
                    packets.extend(self.job_packet(first));
                    while packets.len() < WRITE_BATCH {
                        let Ok(job) = jobs.try_recv() else { break };
                        packets.extend(self.job_packet(job));
                    }
                    if let Err(e) = write(wr, self.version, &packets).await {
                        return End::Lost(e.to_string());
                    }
                }
                () = idle => return End::Lost("keep-alive passed without a packet".into()),
                c = credentials.changed() => {
                    if c.is_err() {
                        return End::Stopped;
                    }
                    if !self.shared.auth.still_valid(&self.device, &self.credential, self.shared.tls.as_deref()) {
                        let why = format!("{:?} revoked: disconnected", self.credential);
                        self.shared.refuse(Rule::Revoked, self.peer, Some(&self.device), &why);
                        return End::refused(Rule::Revoked);
                    }
                }
                c = standing.changed() => {
                    if c.is_err() {
                        return End::Stopped;
                    }
                    if let Some(rule) = self.shared.auth.registry_refusal(&self.device, &self.shared.directory) {
                        self.shared.refuse(rule, self.peer, Some(&self.device), "registry change: disconnected");
                        return End::refused(rule);
                    }
                }
            }
        }
    }

    /// A job as the PUBLISH the device's subscription asks for (none if it unsubscribed
    /// meanwhile, or if the PUBLISH is larger than the device's MQTT 5 Maximum Packet Size:
    /// MQTT 5 §3.1.2.11.4 forbids sending it; logged). Not retransmitted on this connection
    /// (MQTT 3.1.1 §4.4 resends only on reconnect): the dispatcher sends the job again if
    /// its ack does not come, and dead-letters it at its expiry.
    fn job_packet(&mut self, job: Bytes) -> Option<Out> {
        let qos = self.granted?;
        if qos != QoS::AtMostOnce && self.receive_maximum.is_some_and(|max| self.unacked >= max) {
            // MQTT 5 §4.9: not beyond its Receive Maximum. The dispatcher sends the job
            // again after its ack timeout.
            tracing::debug!(device = %self.device, unacked = self.unacked, "a job held back: the device's Receive Maximum is reached");
            return None;
        }
        let topic = match &self.mac {
            Some(mac) => star::to_device_topic(mac, &job),
            None => self.topic.clone(),
        };
        let mut job = wire::Job { topic, qos, pkid: 0, payload: job, raw: self.raw_payloads };
        // Measured (by encoding it) only when it could be too large: its header and
        // properties are well under JOB_OVERHEAD bytes.
        if job.payload.len() + job.topic.len() + JOB_OVERHEAD > self.max_packet {
            // The packet id does not change the size (two bytes at QoS 1 whatever it is).
            let size = wire::size(self.version, &Out::Job(Box::new(job.clone())));
            if size > self.max_packet {
                tracing::warn!(device = %self.device, size, max = self.max_packet, "a job larger than the device's Maximum Packet Size: not sent");
                return None;
            }
        }
        if qos != QoS::AtMostOnce {
            self.next_pkid = self.next_pkid.checked_add(1).unwrap_or(1);
            self.unacked = self.unacked.saturating_add(1);
            job.pkid = self.next_pkid;
        }
        Some(Out::Job(Box::new(job)))
    }

    /// Whether the device may subscribe to `filter` ([`access`], [`star`]): `Some(true)` if
    /// the filter covers its jobs, `Some(false)` for another of a Star printer's own topics.
    fn may_subscribe(&self, filter: &str) -> Option<bool> {
        match &self.mac {
            Some(mac) => star::may_subscribe(mac, filter),
            None => access::may_subscribe(&self.device, filter).then_some(true),
        }
    }

    /// A packet from the device: checked, then answered.
    async fn on_device_packet<W: AsyncWrite + Unpin>(
        &mut self,
        packet: Packet,
        wr: &mut W,
    ) -> std::io::Result<Option<End>> {
        let answer = match packet {
            Packet::Publish { topic, qos, pkid, payload } => {
                let allowed = match &self.mac {
                    Some(mac) => star::method_of(mac, topic.as_bytes()).is_some(),
                    None => access::may_publish(&self.device, topic.as_bytes()),
                };
                if !allowed {
                    let why = format!("publish on {topic}");
                    self.shared.refuse(Rule::Publish, self.peer, Some(&self.device), &why);
                    return Ok(Some(End::refused(Rule::Publish)));
                }
                // Acknowledged once the gateway has it (QoS 2 is delivered at PUBREC, so a
                // device that sends it again after a lost PUBREC is seen twice; acks and
                // status are idempotent for the dispatcher). A payload that is not what its
                // topic carries is counted and dropped, and acknowledged all the same (on
                // MQTT 5 with reason 0x99): a device's bug, which sending it again would not
                // mend.
                let passed =
                    pass_on(self.hub, self.shared, self.peer, &self.device, self.mac.as_deref(), &topic, &payload);
                let Ok(taken) = passed.await else {
                    return Ok(Some(End::Stopped));
                };
                match qos {
                    QoS::AtMostOnce => return Ok(None),
                    QoS::AtLeastOnce => Out::PubAck { pkid, payload_invalid: !taken },
                    QoS::ExactlyOnce => Out::PubRec(pkid),
                }
            }
            Packet::PubRel(pkid) => Out::PubComp(pkid),
            // The device's acknowledgement of a job: the job's own ack, on the acks topic,
            // is what the dispatcher waits for.
            Packet::Answer => {
                self.unacked = self.unacked.saturating_sub(1);
                return Ok(None);
            }
            Packet::Subscribe { pkid, filters } => {
                let mut granted = Vec::with_capacity(filters.len());
                for (path, qos) in &filters {
                    if let Some(jobs) = self.may_subscribe(path) {
                        // Jobs go out at QoS 1 at most: the device dedupes by message id.
                        let qos = if *qos == QoS::AtMostOnce { QoS::AtMostOnce } else { QoS::AtLeastOnce };
                        if jobs {
                            self.granted = Some(qos);
                        }
                        granted.push(Some(qos));
                    } else {
                        let why = format!("subscribe to {path}");
                        self.shared.refuse(Rule::Subscribe, self.peer, Some(&self.device), &why);
                        granted.push(None);
                    }
                }
                // The SUBACK is written before any job of the new subscription.
                write(wr, self.version, &[Out::SubAck { pkid, granted }]).await?;
                if let Some(qos) = self.granted {
                    self.hub.subscribe(&self.client_id, self.session, qos);
                }
                return Ok(None);
            }
            Packet::Unsubscribe { pkid, filters } => {
                if filters.iter().any(|f| self.may_subscribe(f) == Some(true)) {
                    self.granted = None;
                    self.hub.unsubscribe(&self.client_id, self.session);
                }
                Out::UnsubAck { pkid, filters: filters.len() }
            }
            Packet::PingReq => Out::PingResp,
            Packet::Disconnect => return Ok(Some(End::Clean)),
            Packet::Connect(_) => {
                // MQTT 3.1.1 §3.1.0, MQTT 5 §3.1: a second CONNECT is a protocol violation.
                self.shared.refuse(Rule::Malformed, self.peer, Some(&self.device), "second CONNECT");
                return Ok(Some(End::Refused(Rule::Malformed, Reason::ProtocolError)));
            }
            Packet::Unexpected(what) => {
                let why = format!("a packet a client does not send: {what}");
                self.shared.refuse(Rule::Malformed, self.peer, Some(&self.device), &why);
                return Ok(Some(End::Refused(Rule::Malformed, Reason::ProtocolError)));
            }
        };
        write(wr, self.version, &[answer]).await?;
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

    /// An idle device's read buffer stays small: a large packet read in pieces gets room
    /// as it comes, and once it is consumed the buffer it grew is let go.
    #[tokio::test]
    async fn the_read_buffer_shrinks_back_after_a_large_packet() {
        use tokio::io::AsyncWriteExt;
        let (mut device, server) = tokio::io::duplex(1 << 16);
        let mut reader =
            Reader { io: server, buf: BytesMut::with_capacity(IDLE_READ_ROOM), max: 1 << 20, version: Version::V311 };
        let mut publish = BytesMut::new();
        let mut big =
            rumqttc::mqttbytes::v4::Publish::new("pixgate/v1/devices/d/status", QoS::AtLeastOnce, vec![b'x'; 20_000]);
        big.pkid = 1;
        rumqttc::mqttbytes::v4::Packet::Publish(big).write(&mut publish, usize::MAX).unwrap();
        device.write_all(&publish).await.unwrap();
        let Ok(Packet::Publish { payload, .. }) = reader.next().await else { panic!("the PUBLISH") };
        assert_eq!(payload.len(), 20_000);
        drop(payload);
        // PINGREQ (MQTT 3.1.1 §3.12): a fixed header alone.
        device.write_all(&[0xC0, 0x00]).await.unwrap();
        assert!(matches!(reader.next().await, Ok(Packet::PingReq)));
        assert!(reader.buf.is_empty() && reader.buf.capacity() <= 2 * IDLE_READ_ROOM, "{}", reader.buf.capacity());
    }

    #[test]
    fn a_311_connect_goes_on_to_the_codec() {
        let mut buf = BytesMut::new();
        let mut connect = Connect::new(DEVICE);
        connect.keep_alive = 30;
        connect.login = Some(Login::new(DEVICE, "secret"));
        rumqttc::mqttbytes::v4::Packet::Connect(connect).write(&mut buf, usize::MAX).unwrap();
        let p = peek_whole(&buf);
        assert_eq!(p.version(), Some(Version::V311), "{p:?}");
    }

    #[test]
    fn an_mqtt5_connect_is_read_with_its_properties() {
        // Written by rumqttc's MQTT 5 codec, with properties: what the 3.1.1 codec would
        // read as the client id's length.
        let mut buf = BytesMut::new();
        let mut props = mqtt5::ConnectProperties::new();
        props.session_expiry_interval = Some(3_600);
        props.receive_maximum = Some(1);
        props.max_packet_size = Some(2_048);
        let connect =
            mqtt5::Connect { keep_alive: 30, client_id: DEVICE.into(), clean_start: false, properties: Some(props) };
        let login = mqtt5::Login { username: DEVICE.into(), password: "secret".into() };
        connect.write(&None, &Some(login), &mut buf).unwrap();
        let p = peek_whole(&buf);
        assert_eq!((p.name.as_slice(), p.level, p.version()), (&b"MQTT"[..], 5, Some(Version::V5)));
        let Ok(wire::Packet::Connect(c)) = Version::V5.read(&mut buf, 1 << 20) else { panic!("a CONNECT") };
        assert_eq!((c.client_id.as_str(), c.keep_alive, c.clean_start), (DEVICE, 30, false));
        assert_eq!((c.session_expiry_s, c.max_packet_size), (3_600, Some(2_048)));
        assert_eq!(c.login.map(|l| l.password).as_deref(), Some("secret"));
    }

    #[test]
    fn other_levels_are_refused_as_their_versions_say_and_other_names_get_nothing() {
        // MQTT 3.1: protocol name `MQIsdp`, level 3 (MQTT V3.1 §3.1), then flags, keep-alive,
        // client id.
        let mut v31 = vec![0x10, 0];
        v31.extend_from_slice(&[0, 6]);
        v31.extend_from_slice(b"MQIsdp");
        v31.extend_from_slice(&[3, 0x02, 0, 30, 0, 4]);
        v31.extend_from_slice(b"dev-");
        v31[1] = u8::try_from(v31.len() - 2).unwrap();
        let level3 = [0x10, 12, 0, 4, b'M', b'Q', b'T', b'T', 3, 0x02, 0, 30, 0, 0];
        for (bytes, level) in [(&v31[..], 3), (&level3[..], 3)] {
            let p = peek_whole(bytes);
            assert_eq!((p.level, p.version()), (level, None));
            let mut answer = BytesMut::from(p.refusal().unwrap());
            let ack = rumqttc::mqttbytes::v4::Packet::read(&mut answer, usize::MAX).unwrap();
            let want = rumqttc::mqttbytes::v4::ConnAck::new(ConnectReturnCode::RefusedProtocolVersion, false);
            assert_eq!(ack, rumqttc::mqttbytes::v4::Packet::ConnAck(want), "level {level}");
            assert!(answer.is_empty());
        }
        // A level above 5: the answer in MQTT 5's framing, read back by rumqttc's MQTT 5 codec.
        let level6 = [0x10, 13, 0, 4, b'M', b'Q', b'T', b'T', 6, 0x02, 0, 30, 0, 0, 0];
        let p = peek_whole(&level6);
        assert_eq!((p.level, p.version()), (6, None));
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
