//! One device connection: CONNECT, authentication, then every packet checked against the
//! access rules on its way between the socket and the device's own link to the broker.
//!
//! The broker (rumqttd's router) never sees a socket: each authenticated device gets a
//! local link under its client id (`dev-{id}`), and this session moves packets between the
//! two, decoded and encoded with rumqttd's MQTT 3.1.1 codec. What the router would do with
//! a device's will is done here: the session keeps the will and publishes it itself when
//! the socket closes without DISCONNECT.

use super::access::{self, Rule};
use super::auth::{Credential, Peer, Refusal};
use super::listener::Shared;
use bytes::BytesMut;
use rumqttd::local::{LinkRx, LinkTx};
use rumqttd::protocol::v4::V4;
use rumqttd::protocol::{
    ConnAck, ConnectReturnCode, Disconnect, DisconnectReasonCode, LastWill, Packet, PingResp, Protocol, Publish,
    SubAck, Subscribe, SubscribeReasonCode,
};
use rumqttd::Notification;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Why a session ended (logged at debug; refusals are logged where they happen).
#[derive(Debug)]
enum End {
    /// The device sent DISCONNECT.
    Clean,
    /// The socket closed or failed, or the keep-alive passed.
    Lost(String),
    /// The router dropped the link (the same client id connected again, or shutdown).
    Router,
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
            match V4.read_mut(&mut self.buf, self.max) {
                Ok(p) => return Ok(p),
                Err(rumqttd::protocol::Error::InsufficientBytes(_)) => {}
                Err(e @ rumqttd::protocol::Error::PayloadSizeLimitExceeded(_)) => {
                    return Err((Some(Rule::TooLarge), e.to_string()))
                }
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

async fn write<S: AsyncWrite + Unpin>(io: &mut S, packets: Vec<Packet>) -> std::io::Result<()> {
    let mut out = BytesMut::new();
    for p in packets {
        V4.write(p, &mut out).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
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
    Packet::ConnAck(ConnAck { session_present, code }, None)
}

/// Serves one connection (TLS already established when `peer.tls`) until it ends.
/// `handshake` is the listener's handshake permit, released once the device has its
/// CONNACK: the whole admission (TLS, CONNECT, authentication and the router's answer for
/// the device's link) counts against `mqtt.max_handshakes`, so that a restart storm cannot
/// pile link builds up behind the router past the devices' own connect timeouts. The
/// CONNECT must arrive by `deadline` (`mqtt.connect_timeout_ms` after the socket was
/// accepted, the TLS handshake included).
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
    let mut reader = Reader { io: rd, buf: BytesMut::with_capacity(4096), max: shared.cfg.max_payload_bytes };
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
    let Packet::Connect(connect, _, will, _, login) = first else {
        return shared.refuse(Rule::Malformed, &peer, None, "first packet is not CONNECT");
    };
    let refused = |(rule, code): Refusal, device: Option<&str>, why: &str| {
        shared.refuse(rule, &peer, device.or(Some(&connect.client_id)), why);
        code
    };
    let (device, credential) =
        match shared.auth.authenticate(&connect.client_id, login.as_ref(), &peer, &shared.directory) {
            Ok(d) => d,
            Err(r) => {
                let code = refused(r, None, "CONNECT refused");
                let _ = write(&mut wr, vec![connack(code, false)]).await;
                return;
            }
        };
    if let Some(w) = will.as_ref().filter(|w| !access::may_will(&device, &w.topic)) {
        let why = format!("will on {}", String::from_utf8_lossy(&w.topic));
        let code = refused((Rule::Will, ConnectReturnCode::NotAuthorized), Some(&device), &why);
        let _ = write(&mut wr, vec![connack(code, false)]).await;
        return;
    }
    let Some(_slot) = shared.connection_slot() else {
        let code =
            refused((Rule::Capacity, ConnectReturnCode::ServiceUnavailable), Some(&device), "at mqtt.max_connections");
        let _ = write(&mut wr, vec![connack(code, false)]).await;
        return;
    };
    let links = shared.links.clone();
    let (client_id, clean) = (connect.client_id.clone(), connect.clean_session);
    let built = tokio::task::spawn_blocking(move || links(&client_id, clean)).await;
    let (link_tx, link_rx, ack) = match built {
        Ok(Ok(l)) => l,
        Ok(Err(e)) => {
            tracing::error!(device = %device, error = %e, "broker refused the device's link");
            let _ = write(&mut wr, vec![connack(ConnectReturnCode::ServiceUnavailable, false)]).await;
            return;
        }
        Err(e) => {
            tracing::error!(device = %device, error = %e, "building the device's link failed");
            return;
        }
    };
    let session_present =
        matches!(Option::<Packet>::from(ack), Some(Packet::ConnAck(ConnAck { session_present: true, .. }, _)));
    if write(&mut wr, vec![connack(ConnectReturnCode::Success, session_present)]).await.is_err() {
        let mut link_tx = link_tx;
        let _ = link_tx.send(disconnect()).await;
        return;
    }
    drop(handshake);
    tracing::debug!(device = %device, addr = %peer.addr, tls = peer.tls, "device connected");
    let keep_alive = match connect.keep_alive {
        0 => None,
        // MQTT 3.1.1 §3.1.2.10: one and a half keep-alive periods without a packet.
        s => Some(Duration::from_millis(u64::from(s) * 1_500)),
    };
    let mut link = Link {
        device: device.clone(),
        credential,
        peer: &peer,
        shared: &shared,
        tx: link_tx,
        pending_subacks: HashMap::new(),
    };
    let end = link.pump(&mut reader, &mut wr, link_rx, keep_alive, standing, credentials).await;
    match &end {
        End::Lost(why) => tracing::debug!(device = %device, addr = %peer.addr, %why, "device connection lost"),
        other => tracing::debug!(device = %device, addr = %peer.addr, end = ?other, "device disconnected"),
    }
    if !matches!(end, End::Clean | End::Router) {
        if let Some(w) = will {
            publish_will(&mut link.tx, w).await;
        }
    }
    // The router keeps a link's slot until it sees a DISCONNECT.
    let _ = link.tx.send(disconnect()).await;
    let _ = wr.shutdown().await;
}

fn disconnect() -> Packet {
    Packet::Disconnect(Disconnect { reason_code: DisconnectReasonCode::NormalDisconnection }, None)
}

async fn publish_will(tx: &mut LinkTx, will: LastWill) {
    let _ = tx.send(Packet::Publish(Publish::new(will.topic, will.message, will.retain), None)).await;
}

/// A device's link to the router, with the SUBSCRIBEs whose refused filters are waiting
/// for the router's SUBACK to be merged in.
struct Link<'a> {
    device: String,
    /// What it proved itself with (checked again when credentials change).
    credential: Credential,
    peer: &'a Peer,
    shared: &'a Shared,
    tx: LinkTx,
    /// pkid → (position, refused) for every filter of a SUBSCRIBE partly refused.
    pending_subacks: HashMap<u16, Vec<bool>>,
}

impl Link<'_> {
    async fn pump<R, W>(
        &mut self,
        reader: &mut Reader<R>,
        wr: &mut W,
        mut rx: LinkRx,
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
                n = rx.next() => {
                    let first = match n {
                        Ok(n) => n,
                        Err(_) => return End::Router,
                    };
                    let mut packets = Vec::new();
                    let mut unscheduled = false;
                    // One wake-up carries a batch; take what is there without waiting.
                    let mut next = first;
                    loop {
                        match next {
                            Some(Notification::Disconnect(..)) => return End::Router,
                            Some(Notification::Unschedule) => unscheduled = true,
                            Some(n) => {
                                if let Some(p) = Option::<Packet>::from(n) {
                                    packets.push(self.for_device(p));
                                }
                            }
                            None => {}
                        }
                        if packets.len() >= 100 {
                            break;
                        }
                        next = match rx.recv_deadline(std::time::Instant::now()) {
                            Ok(Some(n)) => Some(n),
                            _ => break,
                        };
                    }
                    if let Err(e) = write(wr, packets).await {
                        return End::Lost(e.to_string());
                    }
                    if unscheduled && rx.wake().await.is_err() {
                        return End::Router;
                    }
                }
                () = idle => return End::Lost("keep-alive passed without a packet".into()),
                c = credentials.changed() => {
                    if c.is_err() {
                        return End::Router;
                    }
                    if !self.shared.auth.still_valid(&self.device, &self.credential, self.shared.tls.as_deref()) {
                        let why = format!("{:?} revoked: disconnected", self.credential);
                        self.shared.refuse(Rule::Revoked, self.peer, Some(&self.device), &why);
                        return End::Refused;
                    }
                }
                c = standing.changed() => {
                    if c.is_err() {
                        return End::Router;
                    }
                    if let Some(rule) = self.shared.auth.registry_refusal(&self.device, &self.shared.directory) {
                        self.shared.refuse(rule, self.peer, Some(&self.device), "registry change: disconnected");
                        return End::Refused;
                    }
                }
            }
        }
    }

    /// A packet from the device: checked, then answered here or passed to the router.
    async fn on_device_packet<W: AsyncWrite + Unpin>(
        &mut self,
        packet: Packet,
        wr: &mut W,
    ) -> std::io::Result<Option<End>> {
        let forward = match packet {
            Packet::Publish(p, props) => {
                if !access::may_publish(&self.device, &p.topic) {
                    let why = format!("publish on {}", String::from_utf8_lossy(&p.topic));
                    self.shared.refuse(Rule::Publish, self.peer, Some(&self.device), &why);
                    return Ok(Some(End::Refused));
                }
                Packet::Publish(p, props)
            }
            Packet::Subscribe(s, props) => {
                let refused: Vec<bool> =
                    s.filters.iter().map(|f| !access::may_subscribe(&self.device, &f.path)).collect();
                for (f, _) in s.filters.iter().zip(&refused).filter(|(_, r)| **r) {
                    let why = format!("subscribe to {}", f.path);
                    self.shared.refuse(Rule::Subscribe, self.peer, Some(&self.device), &why);
                }
                if refused.iter().all(|r| *r) {
                    let codes = vec![SubscribeReasonCode::Failure; refused.len()];
                    write(wr, vec![Packet::SubAck(SubAck { pkid: s.pkid, return_codes: codes }, None)]).await?;
                    return Ok(None);
                }
                if refused.iter().any(|r| *r) {
                    self.pending_subacks.insert(s.pkid, refused.clone());
                }
                let filters = s.filters.into_iter().zip(&refused).filter(|(_, r)| !**r).map(|(f, _)| f).collect();
                Packet::Subscribe(Subscribe { pkid: s.pkid, filters }, props)
            }
            Packet::PingReq(_) => {
                write(wr, vec![Packet::PingResp(PingResp)]).await?;
                return Ok(None);
            }
            Packet::Disconnect(..) => return Ok(Some(End::Clean)),
            Packet::Connect(..) => {
                // MQTT 3.1.1 §3.1.0: a second CONNECT is a protocol violation.
                self.shared.refuse(Rule::Malformed, self.peer, Some(&self.device), "second CONNECT");
                return Ok(Some(End::Refused));
            }
            other => other,
        };
        if self.tx.send(forward).await.is_err() {
            return Ok(Some(End::Router));
        }
        Ok(None)
    }

    /// A packet from the router: a SUBACK for a partly refused SUBSCRIBE gets 0x80 put back
    /// at the refused filters' places.
    fn for_device(&mut self, p: Packet) -> Packet {
        match p {
            Packet::SubAck(ack, props) => match self.pending_subacks.remove(&ack.pkid) {
                Some(refused) => {
                    let mut granted = ack.return_codes.into_iter();
                    let return_codes = refused
                        .iter()
                        .map(|r| {
                            if *r {
                                SubscribeReasonCode::Failure
                            } else {
                                granted.next().unwrap_or(SubscribeReasonCode::Failure)
                            }
                        })
                        .collect();
                    Packet::SubAck(SubAck { pkid: ack.pkid, return_codes }, props)
                }
                None => Packet::SubAck(ack, props),
            },
            other => other,
        }
    }
}
