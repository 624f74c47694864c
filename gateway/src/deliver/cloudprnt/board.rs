//! What each CloudPRNT printer is offered: the job the dispatcher has in flight for it,
//! waiting for the printer's next poll, and the printer's condition as its polls report
//! it.
//!
//! The dispatcher keeps one job in flight per device; "sending" it to a printer that pulls
//! its jobs means offering it ([`Board::offer`]). The next poll answers `jobReady` with the
//! job's message id as `jobToken`; the printer GETs it (no side effects: the offer stays)
//! and confirms with a DELETE, which becomes the same [`Ack`] an MQTT printer publishes
//! ([`Board::confirm`]). An offer sent again (the ack timeout) is the same offer; a
//! confirmation for a token no longer offered is answered and ignored.
//!
//! A printer that has not polled for `cloudprnt.offline_after_ms` (or never since the
//! start) is reported `online: false`, so its queue is held instead of its jobs' deliveries
//! running out while it is switched off; its jobs still expire by their time to live.
//!
//! A printer set to CloudPRNT's MQTT method (Full MQTT / Pass URL) does not poll: it is
//! connected to pixgate's MQTT listener ([`crate::deliver::mqtt::star`]) and online while a
//! session of it is up. Its offer is the same; what changes is how it hears of it and
//! answers: a `print-job` message ([`Board::print_job`]) names the URL to GET the job
//! from, the printer's `client-status` messages are its condition, and its `print-result`
//! is the confirmation ([`Confirmation::of_print_result`]).
//!
//! At shutdown the board is closed ([`Board::close`]): no job is announced any more, and
//! the consumer waits, bounded, for the jobs printers were already told of to be confirmed
//! ([`Board::settle`]) before its last outbox write. A printer on the HTTP method or
//! Epson's need not remember its job tokens, so a confirmation that came after that write
//! would leave a printed receipt queued, to print again after the restart.

use crate::clock::Clock;
use crate::deliver::settle::{self, PendingJob};
use crate::model::{DirectPrinters, Incoming};
use bytes::Bytes;
use device_protocol::{Ack, Job, Status};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// How a printer confirmed a job (the DELETE's `code`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Confirmation {
    /// Printed: `OK`, or a 2xx code.
    Printed,
    /// Not printed this time (a DELETE's `520`-`529`: the download failed or timed out; a
    /// `print-result`'s paper or cover condition): offered again.
    Again(String),
    /// This job cannot print there (a DELETE's other codes: `510` incompatible media, `511`
    /// decoding error, `521` too large…): it fails for good.
    Refused(String),
}

impl Confirmation {
    /// Reads a DELETE's `code` (URL-decoded already or not).
    pub fn of_code(code: &str) -> Confirmation {
        let code = super::status::decode(code).trim().to_string();
        if code.eq_ignore_ascii_case("ok") || code.starts_with('2') {
            Confirmation::Printed
        } else if code.starts_with("52") {
            Confirmation::Again(code)
        } else {
            Confirmation::Refused(code)
        }
    }

    /// Reads an MQTT `print-result`: its `statusCode` and `printSucceeded`. Printed when it
    /// says it succeeded or the code is 2xx; a `51x` code (`510` incompatible media, `511`
    /// decoding error) is this job's own fault; any other (`410` out of paper, `420` cover
    /// open, a failed download) is the printer's condition: a failed delivery, the job sent
    /// again after the dispatcher's backoff. Star documents a result "indicating a
    /// duplicate jobToken" for a job the printer had printed already without giving its
    /// code: a 2xx code ends the job, any other sends it again until it runs out of
    /// deliveries (logged with the code).
    pub fn of_print_result(code: &str, succeeded: Option<bool>) -> Confirmation {
        let code = super::status::decode(code).trim().to_string();
        if succeeded == Some(true) || code.eq_ignore_ascii_case("ok") || code.starts_with('2') {
            Confirmation::Printed
        } else if code.starts_with("51") {
            Confirmation::Refused(code)
        } else {
            Confirmation::Again(code)
        }
    }
}

/// One job offered to a printer.
#[derive(Debug, Clone)]
pub struct Offer {
    /// The job's message id: the `jobToken`.
    pub message_id: String,
    /// Its seq in the device's queue.
    pub seq: u64,
    /// Its JSON as stored.
    pub wire: Bytes,
    /// Its picture, drawn at the first GET and kept for the GETs after.
    pub picture: Arc<OnceLock<Bytes>>,
    /// Copies handed to a printer that cannot tell a repeat (Epson's), whose second copy
    /// is marked a reprint; one more when a copy from before a restart is on record.
    pub handed: Arc<std::sync::atomic::AtomicU32>,
    /// Whether the printer was told of it or fetched it (its token in a poll's answer, a
    /// `print-job` message, a GET): it may be printing it now.
    announced: bool,
    /// The job's `expires_at`: after it, the job is no longer handed out.
    expires_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// One printer's state.
#[derive(Debug, Default)]
struct Printer {
    offer: Option<Offer>,
    last_poll: Option<Instant>,
    /// Polls since `window`'s start, a second at most ago.
    window: Option<(Instant, u32)>,
    /// The last status told to the dispatcher.
    reported: Option<Status>,
    /// The last status to tell it (told again by [`Board::check`] while the channel was full).
    wanted: Option<Status>,
    /// Its MQTT sessions up (the MQTT method).
    sessions: u32,
    /// Where it GETs its jobs (the MQTT method): this server's URL as the printer reached it
    /// for its settings.
    url: Option<String>,
}

/// Why a poll is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollRefused {
    /// Faster than `cloudprnt.max_polls_per_second`.
    Rate,
}

/// The offers and conditions of every CloudPRNT printer.
pub struct Board {
    printers: Arc<DirectPrinters>,
    incoming: mpsc::Sender<Incoming>,
    offline_after: Duration,
    max_polls_per_second: u32,
    /// Whether the MQTT method's sessions are seen ([`Board::session`]): not through an
    /// external broker, which tells no one of them.
    sessions_seen: bool,
    state: Mutex<HashMap<String, Printer>>,
    /// Shutdown has begun ([`Board::close`]): no job is announced any more.
    closed: AtomicBool,
    /// What jobs' `expires_at` is read against.
    clock: Clock,
}

impl Board {
    /// A board for the cloud printers `printers` names, telling acks and status on
    /// `incoming` (the dispatcher's, as MQTT devices' are).
    pub fn new(
        printers: Arc<DirectPrinters>,
        incoming: mpsc::Sender<Incoming>,
        offline_after: Duration,
        max_polls_per_second: u32,
    ) -> Board {
        Board {
            printers,
            incoming,
            offline_after,
            max_polls_per_second: max_polls_per_second.max(1),
            sessions_seen: true,
            state: Mutex::default(),
            closed: AtomicBool::new(false),
            clock: Clock::default(),
        }
    }

    /// This board, reading jobs' `expires_at` against `clock` (the gateway's, which tests
    /// and fixture replays move) instead of the system clock.
    pub fn with_clock(mut self, clock: Clock) -> Board {
        self.clock = clock;
        self
    }

    /// This board, for printers on the MQTT method whose sessions it does not see (they
    /// connect to an external broker): one that asks its settings is taken as up for
    /// `offline_after`, as a poll would be, until it is heard from through the broker. A
    /// replica that has not heard from a printer since its start asks it its settings
    /// first ([`Board::print_job`]); without this its job would then wait for a message the
    /// printer has no reason to send.
    pub fn with_sessions_unseen(mut self) -> Board {
        self.sessions_seen = false;
        self
    }

    /// Whether `device` is a cloud printer now.
    pub fn serves(&self, device: &str) -> bool {
        self.printers.is_cloud(device)
    }

    /// The printers it serves.
    pub fn printers(&self) -> Arc<DirectPrinters> {
        self.printers.clone()
    }

    /// `device`'s settings if it is a cloud printer now.
    pub fn settings(&self, device: &str) -> Option<crate::model::CloudSettings> {
        self.printers.cloud(device)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Printer>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Offers `wire` to `device`'s next poll (replacing an older offer: the dispatcher has
    /// moved on from it); returns its message id (`None`: not a job, logged). Never waits.
    /// A printer not polling is reported offline.
    pub fn offer(&self, device: &str, wire: Bytes) -> Option<String> {
        let job = match serde_json::from_slice::<Job>(&wire) {
            Ok(j) => j,
            Err(e) => {
                // Not a job at all: nothing to acknowledge it by; the ack timeout ends it.
                tracing::error!(device, error = %e, "a CloudPRNT printer was handed bytes that are not a job");
                return None;
            }
        };
        let message_id = job.message_id.clone();
        let now = Instant::now();
        let mut state = self.lock();
        let p = state.entry(device.to_string()).or_default();
        if p.offer.as_ref().is_none_or(|o| o.message_id != job.message_id) {
            tracing::debug!(device, seq = job.seq, message_id = %job.message_id, "offered to the printer's next poll");
            let (picture, handed) = (Arc::default(), Arc::default());
            let (message_id, seq, expires_at) = (job.message_id, job.seq, job.expires_at);
            p.offer = Some(Offer { message_id, seq, wire, picture, handed, announced: false, expires_at });
        }
        if !self.polling(p, now) {
            self.report(device, p, Status { v: 1, online: false, printer: None });
        }
        Some(message_id)
    }

    fn polling(&self, p: &Printer, now: Instant) -> bool {
        p.sessions > 0 || p.last_poll.is_some_and(|t| now.duration_since(t) < self.offline_after)
    }

    /// `p`'s offer, unless its time to live has passed: then it is dropped, never handed
    /// out (a printer held overnight must not print yesterday's receipt on its first poll
    /// of the morning); the dispatcher ends the job as expired on its own.
    fn live_offer<'p>(&self, device: &str, p: &'p mut Printer) -> Option<&'p mut Offer> {
        if p.offer.as_ref().is_some_and(|o| o.expires_at.is_some_and(|at| at <= self.clock.now())) {
            let o = p.offer.take()?;
            tracing::info!(device, seq = o.seq, message_id = %o.message_id, "job expired before the printer took it: no longer offered");
        }
        p.offer.as_mut()
    }

    /// Tells the dispatcher `status` if it changed. Never waits: a full channel leaves it
    /// untold, and the next check tells it.
    fn report(&self, device: &str, p: &mut Printer, status: Status) {
        p.wanted = Some(status.clone());
        if p.reported == Some(status.clone()) {
            return;
        }
        let msg = Incoming::Status { device: device.to_string(), status: status.clone() };
        if self.incoming.try_send(msg).is_ok() {
            if status.online && p.reported.as_ref().is_none_or(|s| !s.online) {
                tracing::info!(device, printer = ?status.printer, "CloudPRNT printer polling");
            }
            p.reported = Some(status);
        }
    }

    /// A poll from `device` reporting `status`: the token of the job to print now, if
    /// there is one, the printer can print it (not `printing` another) and the board is
    /// not closed.
    ///
    /// # Errors
    /// [`PollRefused::Rate`]: its polls in the last second reached the bound.
    pub fn poll(&self, device: &str, status: Status, printing: bool) -> Result<Option<String>, PollRefused> {
        let now = Instant::now();
        let mut state = self.lock();
        let p = state.entry(device.to_string()).or_default();
        // A window of a second, not a gap between polls: a printer polls again at once after
        // a job or a status change, a burst a steady rate would refuse.
        let (start, polls) = match p.window {
            Some((start, n)) if now.duration_since(start) < Duration::from_secs(1) => (start, n),
            _ => (now, 0),
        };
        if polls >= self.max_polls_per_second {
            return Err(PollRefused::Rate);
        }
        p.window = Some((start, polls + 1));
        p.last_poll = Some(now);
        let can_print = status.online && status.printer.is_none_or(|s| s.can_print());
        self.report(device, p, status);
        if !can_print || printing || self.is_closed() {
            return Ok(None);
        }
        Ok(self.live_offer(device, p).map(|o| {
            o.announced = true;
            o.message_id.clone()
        }))
    }

    /// `device` is about to be told of its job `message_id` (a `print-job` message): marks
    /// it announced. `false`, and nothing marked, once the board is closed or when that
    /// job is no longer offered: the printer is not to be told.
    pub fn announce(&self, device: &str, message_id: &str) -> bool {
        // Read under the lock, as `close`'s list is: nothing is announced after it.
        let mut state = self.lock();
        if self.is_closed() {
            return false;
        }
        let Some(o) = state.get_mut(device).and_then(|p| self.live_offer(device, p)) else { return false };
        if o.message_id != message_id {
            return false;
        }
        o.announced = true;
        true
    }

    /// Stops announcing jobs (shutdown): polls answer `jobReady: false`, no `print-job` is
    /// sent, and a GET gets only a job its printer was told of. Returns the jobs to wait
    /// for ([`Board::unconfirmed`] as of the close), for [`Board::settle`].
    pub fn close(&self) -> Vec<PendingJob> {
        self.closed.store(true, Ordering::Release);
        self.unconfirmed()
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// The jobs announced and not yet confirmed, on printers still polling or connected
    /// (one silent for `offline_after` is not waited for).
    pub fn unconfirmed(&self) -> Vec<PendingJob> {
        let now = Instant::now();
        let state = self.lock();
        let mut jobs: Vec<PendingJob> = state
            .iter()
            .filter(|(_, p)| self.polling(p, now))
            .filter_map(|(device, p)| {
                let o = p.offer.as_ref().filter(|o| o.announced)?;
                Some(PendingJob { device: device.clone(), seq: o.seq, message_id: o.message_id.clone() })
            })
            .collect();
        jobs.sort_by(|a, b| a.device.cmp(&b.device));
        jobs
    }

    /// Waits, until `deadline` at most, for the jobs of `waiting` (what [`Board::close`]
    /// returned) to be confirmed, or otherwise no longer offered as announced. A printer
    /// printing does not poll meanwhile: it is not dropped from the wait for going silent.
    /// Each confirmation is on the dispatcher's channel by the time its offer ends
    /// ([`Board::confirm`]). Returns those still unconfirmed.
    pub async fn settle(&self, waiting: Vec<PendingJob>, deadline: tokio::time::Instant) -> Vec<PendingJob> {
        settle::settle(waiting, deadline, |u| {
            let state = self.lock();
            let offer = state.get(&u.device).and_then(|p| p.offer.as_ref());
            offer.is_some_and(|o| o.announced && o.message_id == u.message_id)
        })
        .await
    }

    /// A session of `device` (the MQTT method) came up or ended: online while one is up.
    pub fn session(&self, device: &str, up: bool) {
        let mut state = self.lock();
        let p = state.entry(device.to_string()).or_default();
        if up {
            p.sessions += 1;
            if p.sessions == 1 {
                // Its condition follows in its first `client-status`.
                self.report(device, p, Status { v: 1, online: true, printer: None });
            }
        } else {
            p.sessions = p.sessions.saturating_sub(1);
            if !self.polling(p, Instant::now()) {
                tracing::warn!(device, "CloudPRNT printer disconnected; its queue is held");
                self.report(device, p, Status { v: 1, online: false, printer: None });
            }
        }
    }

    /// `device` reported `status` on its own (the MQTT method's `client-status` and
    /// `client-will`): told to the dispatcher, not counted as a poll.
    pub fn condition(&self, device: &str, status: Status) {
        let mut state = self.lock();
        let p = state.entry(device.to_string()).or_default();
        self.report(device, p, status);
    }

    /// Where `device` GETs its jobs (the MQTT method): `url`, this server's job URL as the
    /// printer reached it. With [`Board::with_sessions_unseen`], also a sign of life.
    pub fn set_url(&self, device: &str, url: String) {
        let mut state = self.lock();
        let p = state.entry(device.to_string()).or_default();
        p.url = Some(url);
        if !self.sessions_seen && p.sessions == 0 {
            p.last_poll = Some(Instant::now());
            self.report(device, p, Status { v: 1, online: true, printer: None });
        }
    }

    /// The URL `device` GETs its jobs from, if it asked for its settings.
    pub fn url(&self, device: &str) -> Option<String> {
        self.lock().get(device)?.url.clone()
    }

    /// The job offered to `device` under `token` (or the one offered, for firmware that
    /// sends no token).
    pub fn job(&self, device: &str, token: Option<&str>) -> Option<Offer> {
        let mut state = self.lock();
        let offer = self.live_offer(device, state.get_mut(device)?)?;
        token.is_none_or(|t| t == offer.message_id).then(|| offer.clone())
    }

    /// [`Board::job`] for a printer about to fetch it (a CloudPRNT GET): marked announced,
    /// as it may print it now. Once the board is closed, only a job its printer was
    /// already told of is handed out.
    pub fn hand(&self, device: &str, token: Option<&str>) -> Option<Offer> {
        let mut state = self.lock();
        let closed = self.is_closed();
        let offer = self.live_offer(device, state.get_mut(device)?)?;
        if token.is_some_and(|t| t != offer.message_id) || (closed && !offer.announced) {
            return None;
        }
        offer.announced = true;
        Some(offer.clone())
    }

    /// Drops `device`'s offer of `message_id`, if it is still offered: the dispatcher ended
    /// the job without the printer's answer ([`Transport::withdraw`]: expired, out of
    /// deliveries). It is never handed out after, and a confirmation of it is ignored.
    ///
    /// [`Transport::withdraw`]: crate::deliver::transport::Transport::withdraw
    pub fn withdraw(&self, device: &str, message_id: &str) {
        let mut state = self.lock();
        let Some(p) = state.get_mut(device) else { return };
        if p.offer.as_ref().is_some_and(|o| o.message_id == message_id) {
            if let Some(o) = p.offer.take() {
                tracing::info!(
                    device,
                    seq = o.seq,
                    message_id,
                    announced = o.announced,
                    "job ended by the dispatcher: no longer offered to the printer"
                );
            }
        }
    }

    /// The printer confirmed the job under `token` (or, without a token, the one offered if
    /// the printer was told of it): the offer ends and the dispatcher gets its ack. `false`
    /// when no such job is offered (confirmed already, superseded, or never announced).
    pub async fn confirm(&self, device: &str, token: Option<&str>, how: Confirmation) -> bool {
        self.finish(device, token, "CloudPRNT printer confirmed", |o| match how {
            Confirmation::Printed => Ack::done(&o.message_id, o.seq, false),
            Confirmation::Again(code) => Ack::failed(&o.message_id, o.seq, format!("printer: {code}"), false),
            Confirmation::Refused(code) => {
                Ack::failed(&o.message_id, o.seq, format!("printer cannot print it: {code}"), true)
            }
        })
        .await
    }

    /// The offer under `token` cannot be drawn: it fails for good with `why`.
    pub async fn fail(&self, device: &str, token: &str, why: String) {
        let ack = |o: &Offer| Ack::failed(&o.message_id, o.seq, why, true);
        self.finish(device, Some(token), "CloudPRNT job cannot be drawn", ack).await;
    }

    /// Ends the offer under `token` (any offer without one) with the ack `ack` makes of it,
    /// logged as `what`; `false` when no such job is offered.
    async fn finish(
        &self,
        device: &str,
        token: Option<&str>,
        what: &'static str,
        ack: impl FnOnce(&Offer) -> Ack,
    ) -> bool {
        // Room on the channel first: the offer ends and its ack is on the channel at
        // once, so a shutdown that sees the offer gone finds the ack there.
        let Ok(permit) = self.incoming.reserve().await else {
            // Only past the shutdown's wait: the job stays queued for the next start.
            tracing::warn!(device, "a printer's confirmation came after pixgate stopped delivering: its job is offered again after the restart");
            return false;
        };
        let offer = {
            let mut state = self.lock();
            let Some(p) = state.get_mut(device) else { return false };
            // Without a token, only a job the printer was told of: a repeated confirmation
            // of the one before must not end the one offered since.
            let other = |o: &Offer| token.map_or(!o.announced, |t| t != o.message_id);
            if p.offer.as_ref().is_none_or(other) {
                return false;
            }
            let Some(o) = p.offer.take() else { return false };
            let ack = ack(&o);
            permit.send(Incoming::Ack { device: device.to_string(), ack: ack.clone() });
            (o, ack)
        };
        let (o, ack) = offer;
        tracing::info!(device, seq = o.seq, message_id = %o.message_id, result = ?ack.result, reason = ack.reason.as_deref().unwrap_or(""), "{what}");
        true
    }

    /// Reports offline every printer silent for `offline_after` (module docs), and forgets
    /// those no longer cloud printers with nothing offered. Called every second.
    pub fn check(&self) {
        let now = Instant::now();
        let mut state = self.lock();
        state.retain(|device, p| p.offer.is_some() || self.printers.is_cloud(device));
        for (device, p) in state.iter_mut() {
            if !self.polling(p, now) && p.reported.as_ref().is_none_or(|s| s.online) {
                if p.last_poll.is_some() {
                    tracing::warn!(device = %device, "CloudPRNT printer stopped polling; its queue is held");
                }
                self.report(device, p, Status { v: 1, online: false, printer: None });
            } else if let Some(wanted) = p.wanted.clone().filter(|w| p.reported.as_ref() != Some(w)) {
                self.report(device, p, wanted);
            }
        }
    }

    /// Runs [`Board::check`] every second until `shutdown`.
    pub async fn watch(self: Arc<Self>, shutdown: crate::shutdown::Shutdown) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = tick.tick() => self.check(),
                () = shutdown.requested() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deliver::cloudprnt::status::Condition;
    use crate::model::CloudSettings;
    use device_protocol::{AckResult, EffectKind, PrinterState};
    use render::codepage::CodePage;

    fn board() -> (Board, mpsc::Receiver<Incoming>) {
        let printers = Arc::new(DirectPrinters::default());
        let s = CloudSettings {
            mac: Some("00:11:62:00:00:01".into()),
            method: cdc::CloudMethod::Http,
            width_dots: 576,
            code_page: CodePage::Cp860,
            model: String::new(),
        };
        printers.set_cloud("p", Some(s));
        let (tx, rx) = mpsc::channel(16);
        (Board::new(printers, tx, Duration::from_secs(60), u32::MAX), rx)
    }

    fn wire(id: &str, seq: u64) -> Bytes {
        let mut job = crate::test_fixtures::job(id, EffectKind::PrintReceipt, "c");
        job.seq = seq;
        Bytes::from(job.to_json())
    }

    fn ready() -> Status {
        Condition::read("200 OK", None).status()
    }

    /// Offer, poll, GET, confirm: the token is the message id, a resend is the same offer,
    /// the confirmation is the dispatcher's ack, and a second confirmation is ignored.
    #[tokio::test]
    async fn an_offer_is_polled_fetched_and_confirmed_once() {
        let (b, mut rx) = board();
        b.offer("p", wire("m1", 1));
        let held = rx.try_recv().unwrap();
        assert!(matches!(&held, Incoming::Status { status, .. } if !status.online), "never polled: {held:?}");
        assert_eq!(b.poll("p", ready(), false), Ok(Some("m1".into())));
        let online = rx.try_recv().unwrap();
        assert!(
            matches!(&online, Incoming::Status { status, .. } if status.online && status.printer == Some(PrinterState::Ready))
        );
        b.offer("p", wire("m1", 1));
        assert!(rx.try_recv().is_err(), "a resend changes nothing");
        assert_eq!(b.job("p", Some("m1")).unwrap().seq, 1);
        assert!(b.job("p", Some("m0")).is_none());
        assert_eq!(b.poll("p", ready(), true), Ok(None), "printing: not offered again meanwhile");
        assert!(b.confirm("p", Some("m1"), Confirmation::of_code("OK")).await);
        let Incoming::Ack { ack, .. } = rx.try_recv().unwrap() else { panic!() };
        assert_eq!((ack.message_id.as_str(), ack.seq, ack.result), ("m1", 1, AckResult::Done));
        assert!(!b.confirm("p", Some("m1"), Confirmation::Printed).await, "confirmed already");
        assert_eq!(b.poll("p", ready(), false), Ok(None), "nothing offered");
    }

    /// A job whose time to live passed while its printer was held (switched off overnight)
    /// is not handed to the printer's next poll, nor to a GET of its token, nor announced.
    #[tokio::test]
    async fn an_expired_offer_is_never_handed_out() {
        let (b, _rx) = board();
        let clock = Clock::default();
        let b = b.with_clock(clock.clone());
        let mut job = crate::test_fixtures::job("m1", EffectKind::PrintReceipt, "c");
        job.seq = 1;
        job.expires_at = Some(clock.now() + chrono::Duration::seconds(60));
        b.offer("p", Bytes::from(job.to_json()));
        assert_eq!(b.job("p", Some("m1")).map(|o| o.seq), Some(1), "still live");
        clock.advance(61_000);
        assert_eq!(b.poll("p", ready(), false), Ok(None), "expired: not offered");
        assert!(b.hand("p", Some("m1")).is_none());
        assert!(!b.announce("p", "m1"));
        assert!(!b.confirm("p", None, Confirmation::Printed).await, "nothing left to confirm");
    }

    /// A job the dispatcher ended (out of deliveries) is withdrawn: not offered again, and
    /// its confirmation is ignored; withdrawing another message id changes nothing.
    #[tokio::test]
    async fn a_withdrawn_offer_is_gone() {
        let (b, _rx) = board();
        b.offer("p", wire("m1", 1));
        assert_eq!(b.poll("p", ready(), false), Ok(Some("m1".into())));
        b.withdraw("p", "m0");
        assert!(b.job("p", Some("m1")).is_some(), "another job's withdrawal");
        b.withdraw("p", "m1");
        assert_eq!(b.poll("p", ready(), false), Ok(None));
        assert!(b.hand("p", Some("m1")).is_none());
        assert!(!b.confirm("p", Some("m1"), Confirmation::Printed).await);
    }

    /// A confirmation naming no job ends the job offered only if the printer was told of
    /// it: a repeated confirmation of the one before (its answer lost) must not end, as
    /// printed, a job never handed out.
    #[tokio::test]
    async fn a_confirmation_without_a_token_ends_only_an_announced_job() {
        let (b, mut rx) = board();
        b.offer("p", wire("m1", 1));
        assert_eq!(b.poll("p", ready(), false), Ok(Some("m1".into())));
        while rx.try_recv().is_ok() {}
        assert!(b.confirm("p", None, Confirmation::Printed).await);
        let Incoming::Ack { ack, .. } = rx.try_recv().unwrap() else { panic!() };
        assert_eq!((ack.message_id.as_str(), ack.result), ("m1", AckResult::Done));
        b.offer("p", wire("m2", 2));
        assert!(!b.confirm("p", None, Confirmation::Printed).await, "m2 was never announced");
        assert!(rx.try_recv().is_err(), "no ack for m2");
        assert_eq!(b.poll("p", ready(), false), Ok(Some("m2".into())), "m2 still offered");
        assert!(b.confirm("p", None, Confirmation::Printed).await);
    }

    /// Paper out is told and offers nothing; a 520 is a transient failure, a 510 a
    /// permanent one; polls beyond the bound within a second are refused.
    #[tokio::test]
    async fn conditions_codes_and_rate() {
        let (b, mut rx) = board();
        let b = Board { max_polls_per_second: 2, ..b };
        b.offer("p", wire("m1", 1));
        let _ = rx.try_recv();
        assert_eq!(b.poll("p", Condition::read("410%20Out%20of%20Paper", None).status(), false), Ok(None));
        let Incoming::Status { status, .. } = rx.try_recv().unwrap() else { panic!() };
        assert_eq!(status.printer, Some(PrinterState::PaperOut));
        assert_eq!(b.poll("p", ready(), false), Ok(Some("m1".into())), "a second poll within the second");
        assert!(
            matches!(rx.try_recv().unwrap(), Incoming::Status { status, .. } if status.printer == Some(PrinterState::Ready))
        );
        assert_eq!(b.poll("p", ready(), false), Err(PollRefused::Rate), "a third is beyond 2 a second");
        assert!(b.confirm("p", None, Confirmation::of_code("520%20Download%20Timeout")).await);
        let Incoming::Ack { ack, .. } = rx.try_recv().unwrap() else { panic!() };
        assert_eq!((ack.result, ack.permanent), (AckResult::Failed, false));
        b.offer("p", wire("m2", 2));
        assert!(b.confirm("p", Some("m2"), Confirmation::of_code("510 Incompatible Media Type")).await);
        let Incoming::Ack { ack, .. } = rx.try_recv().unwrap() else { panic!() };
        assert_eq!((ack.message_id.as_str(), ack.result, ack.permanent), ("m2", AckResult::Failed, true));
        assert_eq!(Confirmation::of_code("200%20OK"), Confirmation::Printed);
    }

    /// A printer that stops polling is reported offline once.
    #[tokio::test]
    async fn a_silent_printer_is_reported_offline() {
        let (b, mut rx) = board();
        let b = Board { offline_after: Duration::from_millis(50), ..b };
        assert_eq!(b.poll("p", ready(), false), Ok(None));
        assert!(matches!(rx.try_recv().unwrap(), Incoming::Status { status, .. } if status.online));
        b.check();
        assert!(rx.try_recv().is_err(), "polled just now");
        std::thread::sleep(Duration::from_millis(80));
        b.check();
        assert!(matches!(rx.try_recv().unwrap(), Incoming::Status { status, .. } if !status.online));
        b.check();
        assert!(rx.try_recv().is_err(), "told once");
    }

    /// Closed at shutdown, the board announces nothing more; the consumer waits for the
    /// jobs already announced on printers still polling, and only those, to be confirmed.
    #[tokio::test]
    async fn once_closed_only_jobs_already_announced_are_waited_for() {
        let (b, mut rx) = board();
        for d in ["q", "r", "gone"] {
            b.printers.set_cloud(d, b.printers.cloud("p"));
        }
        let b = Board { offline_after: Duration::from_millis(200), ..b };
        b.offer("p", wire("m1", 1));
        b.offer("q", wire("m2", 2));
        b.offer("r", wire("m4", 4));
        b.offer("gone", wire("m3", 3));
        assert!(b.unconfirmed().is_empty(), "offered, never announced");
        assert_eq!(b.poll("gone", ready(), false), Ok(Some("m3".into())));
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(b.poll("p", ready(), false), Ok(Some("m1".into())));
        assert_eq!(b.poll("r", ready(), false), Ok(Some("m4".into())));
        let ids = |u: &[PendingJob]| u.iter().map(|u| u.message_id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(&b.unconfirmed()), ["m1", "m4"], "announced to printers still polling; `gone` stopped");

        let waiting = b.close();
        assert_eq!(ids(&waiting), ["m1", "m4"]);
        assert_eq!(b.poll("q", ready(), false), Ok(None), "closed: q is not told of m2");
        assert!(b.hand("q", None).is_none(), "closed: m2 is not handed out to a GET either");
        assert_eq!(b.poll("p", ready(), false), Ok(None), "closed: nothing announced again");
        assert_eq!(b.hand("p", Some("m1")).map(|o| o.seq), Some(1), "an announced job can still be fetched");
        let soon = tokio::time::Instant::now() + Duration::from_millis(60);
        assert_eq!(b.settle(waiting.clone(), soon).await.len(), 2, "not confirmed within the bound");

        // r's printer fails m4 (52x): offered again, no longer announced, not waited for.
        assert!(b.confirm("r", Some("m4"), Confirmation::of_code("520")).await);
        b.offer("r", wire("m4", 4));
        while rx.try_recv().is_ok() {}
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let settling = b.settle(waiting, deadline);
        let confirming = async {
            // Printing, it does not poll: silent past `offline_after`, it is still waited for.
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert!(b.unconfirmed().is_empty(), "silent for longer than offline_after");
            assert!(b.confirm("p", Some("m1"), Confirmation::Printed).await);
        };
        let (left, ()) = tokio::join!(settling, confirming);
        assert!(left.is_empty(), "settled once confirmed: {left:?}");
        assert!(
            matches!(rx.try_recv().unwrap(), Incoming::Ack { ack, .. } if ack.message_id == "m1"),
            "the confirmation is on the dispatcher's channel by then"
        );
    }

    /// Through an external broker a printer's MQTT session is unseen: asking its settings
    /// makes it up for a while, as a poll does; pixgate's own listener waits for the
    /// session itself.
    #[tokio::test]
    async fn a_settings_request_is_a_sign_of_life_only_when_sessions_are_unseen() {
        let (seen, mut rx) = board();
        seen.set_url("p", "https://h/cloudprnt".into());
        assert!(rx.try_recv().is_err(), "its own listener tells when the session is up");
        let (b, mut rx) = board();
        let b = Board { offline_after: Duration::from_millis(50), ..b }.with_sessions_unseen();
        b.set_url("p", "https://h/cloudprnt".into());
        assert!(matches!(rx.try_recv().unwrap(), Incoming::Status { status, .. } if status.online));
        std::thread::sleep(Duration::from_millis(80));
        b.check();
        assert!(matches!(rx.try_recv().unwrap(), Incoming::Status { status, .. } if !status.online), "not heard from");
        b.session("p", true);
        b.set_url("p", "https://h/cloudprnt".into());
        assert!(matches!(rx.try_recv().unwrap(), Incoming::Status { status, .. } if status.online));
        assert!(rx.try_recv().is_err(), "a session up says it already");
    }
}
