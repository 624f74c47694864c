//! The hub: where device sessions meet the gateway.
//!
//! A pixgate device exchanges messages with pixgate only: it receives its own jobs and
//! sends its own acks and status ([`super::access`]), never another device's. So no
//! general MQTT router stands between the sessions and the gateway: the hub maps a device
//! id to the sessions subscribed to its jobs topic, and hands what devices send straight
//! to the gateway's `incoming` channel. Sending a job is one map lookup and a new device
//! one insert, so a fleet reconnecting at once costs what it has devices, not their square.
//!
//! Session state follows MQTT 3.1.1 §3.1.2.4: a client that connects with clean session 0
//! keeps its subscription across connections, and jobs sent while it is away wait for it
//! (at most [`PENDING_PER_CLIENT`] different ones, the oldest dropped first: the dispatcher
//! has one job in flight per device and sends it again after `delivery.ack_timeout_ms`, so
//! nothing the outbox holds is lost), with at most [`AWAY_PER_DEVICE`] such sessions per
//! device. A client id that connects again takes its session over, and the older
//! connection is closed (§3.1.4). Nothing here is durable: the outbox is the record.

use crate::model::Incoming;
use crate::telemetry::log_limit::LogLimit;
use crate::telemetry::presence::{Connections, Presence};
use bytes::Bytes;
use rumqttc::QoS;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// A connected session's job queue. futures' bounded channel rather than tokio's: tokio's
/// allocates a block of 32 slots (1 KiB and more) per channel up front, futures' a node
/// per message, and the queue of a session whose device reads is mostly empty.
pub use futures_channel::mpsc as job_queue;

/// Different jobs kept for a client with a persistent session while it is disconnected
/// (a resend of one already kept is not kept again).
pub const PENDING_PER_CLIENT: usize = 8;

/// Persistent sessions a device keeps while away. A device may connect under any
/// `dev-{id}.{tag}`, and firmware that picks a new tag at each boot would otherwise leave a
/// kept session (and its pending jobs) behind at each boot: beyond this, the one away
/// longest is dropped (its jobs are still in the outbox).
pub const AWAY_PER_DEVICE: usize = 4;

/// Jobs queued for a connected session's socket writer. The dispatcher has one job in flight
/// per device, so this fills only when the device stops reading; then a job is dropped
/// (logged) and sent again after the ack timeout.
pub const SESSION_QUEUE: usize = 32;

/// Device sessions by client id, and the way from devices to the gateway.
pub struct Hub {
    state: Mutex<State>,
    incoming: mpsc::Sender<Incoming>,
    next_session: AtomicU64,
    /// Bounds the lines about devices not reading their jobs: one per job sent, so many
    /// stuck devices would write thousands a second.
    log_limit: LogLimit,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub").field("clients", &self.lock().clients.len()).finish()
    }
}

#[derive(Default)]
struct State {
    clients: HashMap<String, Client>,
    /// Device id → its client ids (`dev-{id}`, and `dev-{id}.{tag}` for second connections).
    by_device: HashMap<String, Vec<String>>,
}

struct Client {
    device: String,
    /// The QoS its subscription to the device's jobs topic was granted at, if it has one.
    subscribed: Option<QoS>,
    /// How long the state outlives the connection (MQTT 3.1.1's clean session 0, MQTT 5's
    /// Session Expiry Interval); zero: not at all.
    expiry: Duration,
    /// When its last connection ended, while it is away.
    away_since: Option<Instant>,
    live: Option<Live>,
    pending: VecDeque<Bytes>,
}

struct Live {
    session: u64,
    jobs: job_queue::Sender<Bytes>,
}

/// A session's place in the hub, from [`Hub::attach`].
#[derive(Debug)]
pub struct Attached {
    /// This connection's number: later calls name it, so that a connection that was taken
    /// over cannot change its successor's state.
    pub session: u64,
    /// Jobs for the device, in the order the dispatcher sent them. Ends when another
    /// connection takes the client id over.
    pub jobs: job_queue::Receiver<Bytes>,
    /// A persistent session was resumed (the CONNACK's session-present flag).
    pub session_present: bool,
    /// The resumed session's subscription to the jobs topic, if any.
    pub subscribed: Option<QoS>,
}

impl Hub {
    /// An empty hub; what devices send goes to `incoming` (bounded: a gateway that reads
    /// slowly slows the devices' sessions down).
    pub fn new(incoming: mpsc::Sender<Incoming>) -> Hub {
        Hub { state: Mutex::default(), incoming, next_session: AtomicU64::new(1), log_limit: LogLimit::default() }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a connection of `device` as `client_id`, its state to be kept `expiry`
    /// after it ends. With `clean`, any earlier state of the client id is dropped; without,
    /// it is resumed (subscription and pending jobs) unless it has expired. A connection
    /// already live under the client id is closed (its `jobs` end).
    pub fn attach(&self, client_id: &str, device: &str, clean: bool, expiry: Duration) -> Attached {
        let session = self.next_session.fetch_add(1, Ordering::Relaxed);
        // Room for `buffer` + one per sender: SESSION_QUEUE in all.
        let (tx, rx) = job_queue::channel(SESSION_QUEUE - 1);
        let mut state = self.lock();
        let resumed = match state.clients.remove(client_id) {
            Some(old) if !clean && old.resumable(device) => Some(old),
            Some(old) => {
                state.forget(client_id, &old.device);
                None
            }
            None => None,
        };
        let session_present = resumed.is_some();
        let mut client = resumed.unwrap_or_else(|| Client {
            device: device.to_string(),
            subscribed: None,
            expiry,
            away_since: None,
            live: None,
            pending: VecDeque::new(),
        });
        client.expiry = expiry;
        client.away_since = None;
        client.live = Some(Live { session, jobs: tx });
        let subscribed = client.subscribed;
        client.flush();
        if !session_present {
            state.by_device.entry(device.to_string()).or_default().push(client_id.to_string());
        }
        state.clients.insert(client_id.to_string(), client);
        Attached { session, jobs: rx, session_present, subscribed }
    }

    /// The connection `session` of `client_id` subscribed to its device's jobs topic,
    /// granted at `qos`; jobs waiting for it follow.
    pub fn subscribe(&self, client_id: &str, session: u64, qos: QoS) {
        let mut state = self.lock();
        if let Some(c) = state.clients.get_mut(client_id).filter(|c| c.is_live(session)) {
            c.subscribed = Some(qos);
            c.flush();
        }
    }

    /// The connection `session` of `client_id` unsubscribed from its jobs topic.
    pub fn unsubscribe(&self, client_id: &str, session: u64) {
        let mut state = self.lock();
        if let Some(c) = state.clients.get_mut(client_id).filter(|c| c.is_live(session)) {
            c.subscribed = None;
        }
    }

    /// The connection `session` of `client_id` ended: a persistent session keeps its
    /// state for the next connection ([`AWAY_PER_DEVICE`] at most per device), any other
    /// is forgotten. Returns `false`, and changes nothing, if another connection has taken
    /// the client id over meanwhile: the device is back, and what the ended connection
    /// would say about it (its will) is stale.
    pub fn detach(&self, client_id: &str, session: u64) -> bool {
        let mut state = self.lock();
        let Some(c) = state.clients.get_mut(client_id).filter(|c| c.is_live(session)) else { return false };
        c.live = None;
        c.away_since = Some(Instant::now());
        let device = c.device.clone();
        if c.expiry.is_zero() {
            state.clients.remove(client_id);
            state.forget(client_id, &device);
        }
        state.drop_stale(&device, Instant::now());
        true
    }

    /// Drops the kept sessions that have expired, of every device: a device that never
    /// connects again would otherwise keep them, and their pending jobs, until a restart.
    /// Called every few seconds (one pass over the client ids).
    pub fn drop_expired(&self) {
        let now = Instant::now();
        let mut state = self.lock();
        let expired: Vec<(String, String)> = state
            .clients
            .iter()
            .filter(|(_, c)| c.expired(now))
            .map(|(id, c)| (id.clone(), c.device.clone()))
            .collect();
        for (id, device) in expired {
            state.clients.remove(&id);
            state.forget(&id, &device);
        }
    }

    /// Hands one job's bytes to every session of `device` subscribed to its jobs topic
    /// (kept for a persistent one that is away). Returns how many connected sessions took
    /// it; 0 is not an error (the device is away: the ack timeout sends it again).
    pub fn send(&self, device: &str, job: Bytes) -> usize {
        let mut state = self.lock();
        let State { clients, by_device } = &mut *state;
        let Some(ids) = by_device.get(device) else { return 0 };
        let mut taken = 0;
        for id in ids {
            let Some(c) = clients.get_mut(id).filter(|c| c.subscribed.is_some()) else { continue };
            match &mut c.live {
                Some(live) => match live.jobs.try_send(job.clone()) {
                    Ok(()) => taken += 1,
                    Err(e) if e.is_full() => {
                        if self.log_limit.admit("not_reading", device) {
                            tracing::warn!(rule = "not_reading", device, client_id = %id, "device is not reading its jobs; the ack timeout sends the job again");
                        }
                    }
                    Err(_) => {}
                },
                // A resend of a job already waiting is not kept twice.
                None if !c.expiry.is_zero() && !c.pending.contains(&job) => {
                    if c.pending.len() >= PENDING_PER_CLIENT {
                        c.pending.pop_front();
                    }
                    c.pending.push_back(job.clone());
                }
                None => {}
            }
        }
        taken
    }

    /// A message a device published on its own acks or status (checked and decoded by its
    /// session), passed to the gateway. Waits while the gateway's channel is full.
    ///
    /// # Errors
    /// The gateway stopped reading (shutdown).
    pub async fn from_device(&self, msg: Incoming) -> Result<(), mpsc::error::SendError<Incoming>> {
        self.incoming.send(msg).await
    }

    /// Writes the summaries of its held-back log lines that are due ([`LogLimit::log_due`]).
    pub fn log_due(&self) {
        self.log_limit.log_due();
    }

    /// Client ids with state in the hub (connected, or persistent and away).
    pub fn clients(&self) -> usize {
        self.lock().clients.len()
    }
}

impl Presence for Hub {
    /// Devices with a live session now; a session counts as subscribed once it has
    /// subscribed to its `jobs` topic.
    fn online(&self) -> HashMap<String, Connections> {
        let state = self.lock();
        let mut out: HashMap<String, (usize, usize)> = HashMap::new();
        for c in state.clients.values().filter(|c| c.live.is_some()) {
            let e = out.entry(c.device.clone()).or_default();
            e.0 += 1;
            e.1 += usize::from(c.subscribed.is_some());
        }
        out
    }
}

impl State {
    /// Drops `device`'s kept sessions that have expired by `now`, then, beyond
    /// [`AWAY_PER_DEVICE`], those away longest.
    fn drop_stale(&mut self, device: &str, now: Instant) {
        let Some(ids) = self.by_device.get(device) else { return };
        let mut away: Vec<(Instant, bool, String)> = ids
            .iter()
            .filter_map(|id| {
                let c = self.clients.get(id).filter(|c| c.live.is_none())?;
                Some((c.away_since?, c.expired(now), id.clone()))
            })
            .collect();
        away.sort();
        let mut excess = away.len().saturating_sub(AWAY_PER_DEVICE);
        for (_, expired, id) in away {
            if expired || excess > 0 {
                excess = excess.saturating_sub(1);
                self.clients.remove(&id);
                self.forget(&id, device);
            }
        }
    }

    fn forget(&mut self, client_id: &str, device: &str) {
        if let Some(ids) = self.by_device.get_mut(device) {
            ids.retain(|i| i != client_id);
            if ids.is_empty() {
                self.by_device.remove(device);
            }
        }
    }
}

impl Client {
    fn is_live(&self, session: u64) -> bool {
        self.live.as_ref().is_some_and(|l| l.session == session)
    }

    /// Whether a new connection of `device` resumes this state: kept, and not expired.
    fn resumable(&self, device: &str) -> bool {
        self.device == device && !self.expiry.is_zero() && !self.expired(Instant::now())
    }

    /// Whether it is away and has been for its expiry or longer.
    fn expired(&self, now: Instant) -> bool {
        self.live.is_none() && self.away_since.is_some_and(|since| now.saturating_duration_since(since) >= self.expiry)
    }

    /// Moves waiting jobs to the connection, if it is live and subscribed.
    fn flush(&mut self) {
        let (Some(live), Some(_)) = (&mut self.live, self.subscribed) else { return };
        while let Some(job) = self.pending.pop_front() {
            if live.jobs.try_send(job).is_err() {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hub() -> (Hub, mpsc::Receiver<Incoming>) {
        let (tx, rx) = mpsc::channel(16);
        (Hub::new(tx), rx)
    }

    /// A session kept after its connection, as MQTT 3.1.1's clean session 0 asks.
    const KEPT: Duration = Duration::from_secs(60);

    fn job(n: u8) -> Bytes {
        Bytes::from(vec![n])
    }

    #[test]
    fn a_job_reaches_the_subscribed_session_of_its_device_only() {
        let (hub, _) = hub();
        let mut a = hub.attach("dev-a", "a", true, Duration::ZERO);
        let mut b = hub.attach("dev-b", "b", true, Duration::ZERO);
        assert_eq!(hub.send("a", job(1)), 0, "not subscribed yet: nothing taken");
        hub.subscribe("dev-a", a.session, QoS::AtLeastOnce);
        hub.subscribe("dev-b", b.session, QoS::AtLeastOnce);
        assert_eq!(hub.send("a", job(2)), 1);
        assert_eq!(a.jobs.try_recv().ok(), Some(job(2)));
        assert!(a.jobs.try_recv().is_err(), "a clean session keeps nothing from before it subscribed");
        assert!(b.jobs.try_recv().is_err(), "b gets none of a's jobs");
        assert_eq!(hub.send("nobody", job(3)), 0);
    }

    #[test]
    fn a_persistent_session_keeps_its_subscription_and_the_jobs_sent_while_away() {
        let (hub, _) = hub();
        let first = hub.attach("dev-a", "a", false, KEPT);
        assert!(!first.session_present);
        hub.subscribe("dev-a", first.session, QoS::AtLeastOnce);
        hub.detach("dev-a", first.session);
        for n in 0..(PENDING_PER_CLIENT as u8 + 2) {
            assert_eq!(hub.send("a", job(n)), 0, "away");
        }
        hub.send("a", job(PENDING_PER_CLIENT as u8 + 1)); // a resend of a job already waiting
        let mut second = hub.attach("dev-a", "a", false, KEPT);
        assert!(second.session_present);
        assert_eq!(second.subscribed, Some(QoS::AtLeastOnce));
        let got: Vec<Bytes> = std::iter::from_fn(|| second.jobs.try_recv().ok()).collect();
        let want: Vec<Bytes> = (2..PENDING_PER_CLIENT as u8 + 2).map(job).collect();
        assert_eq!(got, want, "the newest jobs, in order, each once; the oldest dropped first");

        // Clean session 1 drops all of it.
        hub.detach("dev-a", second.session);
        hub.send("a", job(99));
        let mut clean = hub.attach("dev-a", "a", true, Duration::ZERO);
        assert!(!clean.session_present && clean.subscribed.is_none());
        assert!(clean.jobs.try_recv().is_err());
    }

    /// A session kept for its MQTT 5 Session Expiry Interval is resumed within it and
    /// not after.
    #[test]
    fn a_session_past_its_expiry_is_not_resumed() {
        let (hub, _) = hub();
        let expiry = Duration::from_millis(50);
        let first = hub.attach("dev-a", "a", false, expiry);
        hub.subscribe("dev-a", first.session, QoS::AtLeastOnce);
        hub.detach("dev-a", first.session);
        let second = hub.attach("dev-a", "a", false, expiry);
        assert!(second.session_present, "within its expiry");
        hub.detach("dev-a", second.session);
        std::thread::sleep(Duration::from_millis(80));
        let third = hub.attach("dev-a", "a", false, expiry);
        assert!(!third.session_present && third.subscribed.is_none(), "expired: a new session");
    }

    #[test]
    fn a_second_connection_takes_the_client_id_over_and_the_first_cannot_undo_it() {
        let (hub, _) = hub();
        let mut first = hub.attach("dev-a", "a", true, Duration::ZERO);
        hub.subscribe("dev-a", first.session, QoS::AtLeastOnce);
        let mut second = hub.attach("dev-a", "a", true, Duration::ZERO);
        assert!(matches!(first.jobs.try_recv(), Err(job_queue::TryRecvError::Closed)), "first closed");
        // The first connection ending, or subscribing late, changes nothing for the second.
        hub.subscribe("dev-a", first.session, QoS::AtLeastOnce);
        hub.detach("dev-a", first.session);
        assert_eq!(hub.send("a", job(1)), 0, "the second has not subscribed");
        hub.subscribe("dev-a", second.session, QoS::AtLeastOnce);
        assert_eq!(hub.send("a", job(2)), 1);
        assert_eq!(second.jobs.try_recv().ok(), Some(job(2)));
        hub.detach("dev-a", second.session);
        assert_eq!(hub.clients(), 0, "a clean session is forgotten when it ends");
    }

    #[test]
    fn an_ended_connection_learns_whether_it_was_taken_over() {
        let (hub, _) = hub();
        let first = hub.attach("dev-a", "a", false, KEPT);
        let second = hub.attach("dev-a", "a", false, KEPT);
        assert!(!hub.detach("dev-a", first.session), "taken over: its will is stale");
        assert!(hub.detach("dev-a", second.session), "ended on its own");
        assert!(!hub.detach("dev-a", second.session), "once");
    }

    /// Firmware that connects under a new `dev-{id}.{tag}` at each boot leaves at most
    /// AWAY_PER_DEVICE kept sessions behind, the latest; other devices' are not touched.
    #[test]
    fn a_device_keeps_its_latest_sessions_away_and_no_more() {
        let (hub, _) = hub();
        let other = hub.attach("dev-b", "b", false, KEPT);
        hub.detach("dev-b", other.session);
        for n in 0..10 {
            let id = format!("dev-a.boot{n}");
            let s = hub.attach(&id, "a", false, KEPT);
            hub.subscribe(&id, s.session, QoS::AtLeastOnce);
            assert!(hub.detach(&id, s.session));
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(hub.clients(), AWAY_PER_DEVICE + 1);
        hub.send("a", job(1));
        for n in 0..10 {
            let id = format!("dev-a.boot{n}");
            let mut back = hub.attach(&id, "a", false, KEPT);
            let kept = n >= 10 - AWAY_PER_DEVICE;
            assert_eq!(back.session_present, kept, "{id}");
            assert_eq!(back.jobs.try_recv().ok(), kept.then(|| job(1)), "{id}");
        }
        assert!(hub.attach("dev-b", "b", false, KEPT).session_present, "b's session kept");
    }

    #[test]
    fn expired_sessions_go_without_their_device_connecting_again() {
        let (hub, _) = hub();
        let short = hub.attach("dev-a", "a", false, Duration::from_millis(30));
        let long = hub.attach("dev-b", "b", false, KEPT);
        let live = hub.attach("dev-c", "c", false, Duration::from_millis(30));
        hub.detach("dev-a", short.session);
        hub.detach("dev-b", long.session);
        std::thread::sleep(Duration::from_millis(50));
        hub.drop_expired();
        assert_eq!(hub.clients(), 2, "a's expired session went; b's and the connected c stay");
        assert!(hub.attach("dev-b", "b", false, KEPT).session_present);
        assert!(hub.attach("dev-c", "c", false, KEPT).session_present, "c was connected: {}", live.session);
    }

    #[test]
    fn every_connection_of_a_device_that_subscribed_gets_its_jobs() {
        let (hub, _) = hub();
        let mut main = hub.attach("dev-a", "a", true, Duration::ZERO);
        let mut tool = hub.attach("dev-a.sub", "a", true, Duration::ZERO);
        let _acks_only = hub.attach("dev-a.pub", "a", true, Duration::ZERO);
        hub.subscribe("dev-a", main.session, QoS::AtLeastOnce);
        hub.subscribe("dev-a.sub", tool.session, QoS::AtMostOnce);
        assert_eq!(hub.send("a", job(7)), 2);
        assert_eq!((main.jobs.try_recv().ok(), tool.jobs.try_recv().ok()), (Some(job(7)), Some(job(7))));
    }

    #[test]
    fn a_session_that_stops_reading_loses_a_copy_not_the_hub() {
        let (hub, _) = hub();
        let a = hub.attach("dev-a", "a", true, Duration::ZERO);
        hub.subscribe("dev-a", a.session, QoS::AtLeastOnce);
        for n in 0..SESSION_QUEUE {
            assert_eq!(hub.send("a", job(n as u8)), 1);
        }
        assert_eq!(hub.send("a", job(0xff)), 0, "full: dropped, the ack timeout resends it");
    }

    #[tokio::test]
    async fn acks_and_status_reach_the_gateway_and_garbage_does_not() {
        let (hub, mut rx) = hub();
        let parse = |topic: &str, payload: &[u8]| Incoming::parse(topic, payload);
        let ack = serde_json::to_vec(&device_protocol::Ack::done("m1", 3, false)).unwrap();
        hub.from_device(parse("pixgate/v1/devices/a/acks", &ack).unwrap().unwrap()).await.unwrap();
        assert!(parse("pixgate/v1/devices/a/acks", b"not json").is_err(), "garbage is an error for the session");
        assert!(parse("pixgate/v1/devices/a/jobs", b"{}").unwrap().is_none(), "not a device's message");
        let status = serde_json::to_vec(&device_protocol::Status { v: 1, online: true, printer: None }).unwrap();
        hub.from_device(parse("pixgate/v1/devices/a/status", &status).unwrap().unwrap()).await.unwrap();
        match rx.try_recv() {
            Ok(Incoming::Ack { device, ack }) => assert_eq!((device.as_str(), ack.seq), ("a", 3)),
            other => panic!("{other:?}"),
        }
        match rx.try_recv() {
            Ok(Incoming::Status { device, status }) => assert_eq!((device.as_str(), status.online), ("a", true)),
            other => panic!("{other:?}"),
        }
        assert!(rx.try_recv().is_err());
    }
}
