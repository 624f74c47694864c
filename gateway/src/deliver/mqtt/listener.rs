//! The device listener: accepts sockets, sets up TLS off the accept loop with a deadline,
//! and holds the limits (connections, handshakes in progress, connections per address).
//!
//! Nothing a socket does can hold up another: the accept loop only counts and spawns; the
//! TLS handshake and the CONNECT run in the connection's own task under
//! `mqtt.connect_timeout_ms`; at most `mqtt.max_handshakes` connections are being admitted
//! at once, up to their CONNACK. While that many are, the loop accepts nothing: the sockets
//! beyond wait in the kernel's listen backlog (bounded there: 128, the standard library's
//! backlog that tokio's `bind` uses, or `net.core.somaxconn` if lower; the kernel drops
//! SYNs beyond it and the devices' TCP sends them again), so a reconnect storm after a
//! restart is served at the rate the machine can, every device in turn, without unbounded
//! work. One
//! source address holds at most `mqtt.max_handshakes_per_address` of those, so sockets
//! from one address that never finish cannot keep the rest of the fleet out (a socket
//! beyond it is closed at accept).

use super::access::Rule;
use super::auth::{Authenticator, Peer};
use super::hub::Hub;
use super::session;
use super::star::StarPrinters;
use super::tls::{certificate_identity, Tls};
use super::tls_stream::{self, TlsStream};
use crate::config::MqttConfig;
use crate::model::Directory;
use crate::shutdown::Shutdown;
use crate::telemetry::log_limit::LogLimit;
use crate::telemetry::Stats;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How often the accept loop writes the refusals' summaries that are due ([`LogLimit`]).
const SUMMARY_EVERY: Duration = Duration::from_secs(5);

/// What every connection shares.
pub struct Shared {
    /// Limits and timeouts.
    pub cfg: MqttConfig,
    /// TLS, unless plain TCP.
    pub tls: Option<Arc<Tls>>,
    /// Judges CONNECTs.
    pub auth: Authenticator,
    /// The registry's view of who may connect.
    pub directory: Arc<Directory>,
    /// `mqtt_connected` and `mqtt_refusals` on `/stats` and `/metrics`.
    pub stats: Arc<Stats>,
    /// Where sessions meet the gateway.
    pub hub: Arc<Hub>,
    /// Ends the accept loop, every connection and the credentials watch.
    pub shutdown: Shutdown,
    /// Bounds the refusals' log lines.
    pub log_limit: LogLimit,
    /// The Star CloudPRNT printers that use the MQTT method, if pixgate serves them.
    pub star: Option<Arc<dyn StarPrinters>>,
    connected: AtomicUsize,
    per_address: PerAddress,
    handshakes: Arc<Semaphore>,
    handshakes_per_address: PerAddress,
    /// Bumped when the TLS files or the secrets change: connected devices check that what
    /// they proved themselves with still holds.
    credentials: tokio::sync::watch::Sender<u64>,
}

impl Shared {
    /// Everything a connection needs; no device connected yet.
    pub fn new(
        cfg: MqttConfig,
        tls: Option<Arc<Tls>>,
        auth: Authenticator,
        directory: Arc<Directory>,
        stats: Arc<Stats>,
        hub: Arc<Hub>,
        shutdown: Shutdown,
    ) -> Shared {
        let handshakes = Arc::new(Semaphore::new(cfg.max_handshakes.max(1)));
        Shared {
            cfg,
            tls,
            auth,
            directory,
            stats,
            hub,
            shutdown,
            log_limit: LogLimit::default(),
            star: None,
            connected: AtomicUsize::new(0),
            per_address: PerAddress::default(),
            handshakes,
            handshakes_per_address: PerAddress::default(),
            credentials: tokio::sync::watch::channel(0).0,
        }
    }

    /// Serves the Star printers `star` names on their own topics ([`super::star`]).
    #[must_use]
    pub fn with_star(mut self, star: Option<Arc<dyn StarPrinters>>) -> Shared {
        self.star = star;
        self
    }

    /// Changes of the credentials (TLS files, revocation lists, secrets).
    pub fn credentials_changed(&self) -> tokio::sync::watch::Receiver<u64> {
        self.credentials.subscribe()
    }

    /// Checks the TLS files and the secrets every `mqtt.tls.reload_ms` (5 s without TLS)
    /// until shutdown; a change reloads them and tells the connected devices.
    pub fn watch_credentials(self: Arc<Self>) {
        let period = self.tls.as_ref().map_or(Duration::from_secs(5), |t| t.reload_every());
        self.shutdown.clone().spawn(async move {
            loop {
                if self.shutdown.sleep(period).await {
                    return;
                }
                let shared = self.clone();
                let changed = tokio::task::spawn_blocking(move || {
                    let tls = shared.tls.as_ref().is_some_and(|t| t.reload_if_changed());
                    let secrets = shared.auth.secrets.as_ref().is_some_and(|s| s.changed());
                    tls || secrets
                })
                .await
                .unwrap_or(false);
                if changed {
                    self.credentials.send_modify(|n| *n += 1);
                }
            }
        });
    }

    /// Counts a refusal (`rule`) of `peer` (and `device`, if known), and logs it within
    /// [`LogLimit`]'s bounds (by device, or by address before the device is known).
    pub fn refuse(&self, rule: Rule, peer: &Peer, device: Option<&str>, why: &str) {
        self.stats.mqtt_refused(rule.as_str());
        let source = device.map_or_else(|| peer.addr.ip().to_string(), str::to_string);
        if self.log_limit.admit(rule.as_str(), &source) {
            tracing::warn!(rule = rule.as_str(), device = device.unwrap_or("-"), addr = %peer.addr, why, "device refused");
        }
    }

    /// A connected-device slot, if fewer than `mqtt.max_connections` are taken; freed on
    /// drop.
    pub fn connection_slot(&self) -> Option<Slot<'_>> {
        let max = self.cfg.max_connections;
        self.connected.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1)).ok()?;
        self.stats.update(|s| s.mqtt_connected += 1);
        Some(Slot { shared: self })
    }

    /// A place among the connections being admitted for a socket from `ip`, with the
    /// `mqtt.max_handshakes` permit taken before it was accepted; `None` if `ip` already
    /// holds `mqtt.max_handshakes_per_address` of them (the permit is given back).
    fn handshake_slot(self: &Arc<Self>, ip: IpAddr, permit: OwnedSemaphorePermit) -> Option<Handshake> {
        if !self.handshakes_per_address.try_take(ip, self.cfg.max_handshakes_per_address.max(1)) {
            return None;
        }
        Some(Handshake { _permit: permit, shared: self.clone(), ip })
    }

    fn address_slot(self: &Arc<Self>, ip: IpAddr) -> Option<AddressSlot> {
        self.per_address.try_take(ip, self.cfg.max_per_address).then(|| AddressSlot { shared: self.clone(), ip })
    }
}

/// How many of something each source address holds (sockets, sockets being admitted);
/// an address holding none has no entry, so a spray from many addresses leaves nothing.
#[derive(Debug, Default)]
struct PerAddress(Mutex<HashMap<IpAddr, usize>>);

impl PerAddress {
    /// Takes one for `ip` if it holds fewer than `max`.
    fn try_take(&self, ip: IpAddr, max: usize) -> bool {
        let mut map = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = map.get(&ip).copied().unwrap_or(0);
        if n >= max {
            return false;
        }
        map.insert(ip, n + 1);
        true
    }

    /// Gives one back for `ip`.
    fn give_back(&self, ip: IpAddr) {
        let mut map = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = map.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                map.remove(&ip);
            }
        }
    }
}

/// A connected device, counted until dropped.
pub struct Slot<'a> {
    shared: &'a Shared,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.shared.connected.fetch_sub(1, Ordering::AcqRel);
        self.shared.stats.update(|s| s.mqtt_connected = s.mqtt_connected.saturating_sub(1));
    }
}

/// A connection being admitted (TLS handshake, CONNECT, authentication), counted against
/// `mqtt.max_handshakes` and its address's `mqtt.max_handshakes_per_address` until
/// dropped: once the device has its CONNACK, or the socket is closed.
pub struct Handshake {
    _permit: OwnedSemaphorePermit,
    shared: Arc<Shared>,
    ip: IpAddr,
}

impl Drop for Handshake {
    fn drop(&mut self) {
        self.shared.handshakes_per_address.give_back(self.ip);
    }
}

struct AddressSlot {
    shared: Arc<Shared>,
    ip: IpAddr,
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        self.shared.per_address.give_back(self.ip);
    }
}

/// Accepts devices on `listener` until shutdown; then every connection, in its handshake
/// or connected, is closed (a device's will is not published: the device did nothing).
pub async fn run(listener: TcpListener, shared: Arc<Shared>) {
    // The refusals' summaries are written even when no refusal follows a burst.
    let mut summaries = tokio::time::interval(SUMMARY_EVERY);
    summaries.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // A place among the connections being admitted, taken before the next accept.
    let mut place: Option<OwnedSemaphorePermit> = None;
    loop {
        let accepted = tokio::select! {
            () = shared.shutdown.requested() => return,
            _ = summaries.tick() => {
                shared.log_limit.log_due();
                shared.hub.log_due();
                shared.hub.drop_expired();
                continue;
            }
            p = shared.handshakes.clone().acquire_owned(), if place.is_none() => {
                place = Some(p.expect("the handshake semaphore is never closed"));
                continue;
            }
            a = listener.accept(), if place.is_some() => a,
        };
        let (socket, addr) = match accepted {
            Ok(s) => s,
            Err(e) => {
                // Out of file descriptors, mostly: wait a little rather than spin.
                tracing::error!(error = %e, "accepting a device connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let peer = Peer { addr, tls: shared.tls.is_some(), certificate: None, serial: None };
        let Some(address) = shared.address_slot(addr.ip()) else {
            shared.refuse(Rule::PerAddress, &peer, None, "at mqtt.max_per_address");
            continue;
        };
        let Some(permit) = shared.handshake_slot(addr.ip(), place.take().expect("accepted with a place")) else {
            shared.refuse(Rule::HandshakesPerAddress, &peer, None, "at mqtt.max_handshakes_per_address");
            continue;
        };
        let _ = socket.set_nodelay(true);
        let shutdown = shared.shutdown.clone();
        let shared_ = shared.clone();
        // The connection's future is made inside the task: one made outside and moved in
        // would keep a second slot of its size in the task for the connection's whole life.
        shared.shutdown.spawn(async move {
            tokio::select! {
                () = shutdown.requested() => {}
                () = connection(socket, addr, shared_, permit, address) => {}
            }
        });
    }
}

/// Serves one accepted socket: the TLS handshake if the listener has TLS, then the
/// session ([`session::serve`]). The handshake's state is boxed: it is gone once the
/// handshake is, and does not take room in every connected device's task.
async fn connection(
    socket: TcpStream,
    addr: SocketAddr,
    shared: Arc<Shared>,
    permit: Handshake,
    _address: AddressSlot,
) {
    let mut peer = Peer { addr, tls: shared.tls.is_some(), certificate: None, serial: None };
    // One deadline for the TLS handshake and the CONNECT together.
    let deadline = tokio::time::Instant::now() + Duration::from_millis(shared.cfg.connect_timeout_ms);
    let Some(tls) = shared.tls.clone() else {
        return session::serve(tokio::io::split(socket), peer, shared.clone(), permit, deadline).await;
    };
    match Box::pin(tls_handshake(socket, &tls, deadline, &mut peer)).await {
        Ok(halves) => session::serve(halves, peer, shared, permit, deadline).await,
        Err((rule, why)) => shared.refuse(rule, &peer, None, &why),
    }
}

/// The TLS handshake of `socket` by `deadline` ([`tls_stream`]), the client certificate's
/// identity (if any) written into `peer`; the stream comes back split
/// ([`session::serve`]'s halves).
///
/// # Errors
/// The rule broken and why: no handshake in time, or a failed one.
async fn tls_handshake(
    socket: TcpStream,
    tls: &Tls,
    deadline: tokio::time::Instant,
    peer: &mut Peer,
) -> Result<session::Halves<TlsStream>, (Rule, String)> {
    let stream = match tokio::time::timeout_at(deadline, tls_stream::accept(socket, tls.config())).await {
        Err(_) => return Err((Rule::ConnectTimeout, "no TLS handshake in time".into())),
        Ok(Err(e)) => return Err((Rule::TlsHandshake, e.to_string())),
        Ok(Ok(s)) => s,
    };
    if let Some((id, serial)) =
        stream.session().peer_certificates().and_then(|c| c.first()).and_then(certificate_identity)
    {
        peer.certificate = Some(id);
        peer.serial = Some(serial);
    }
    Ok(tokio::io::split(stream))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_holds_at_most_its_bound_and_no_entry_once_it_holds_none() {
        let per = PerAddress::default();
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        assert!(per.try_take(a, 2) && per.try_take(a, 2));
        assert!(!per.try_take(a, 2), "at its bound");
        assert!(per.try_take(b, 2), "another address has its own");
        assert!(!per.try_take("10.0.0.3".parse().unwrap(), 0), "refused: leaves no entry");
        per.give_back(a);
        assert!(per.try_take(a, 2), "room again");
        for _ in 0..2 {
            per.give_back(a);
        }
        per.give_back(b);
        assert!(per.0.lock().unwrap().is_empty(), "nothing left of addresses holding none");
    }
}
