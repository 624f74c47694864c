//! One direct printer's task: a thread of its own owning the printer's connection (the
//! I/O is blocking: a serial line is a file descriptor), taking the jobs the dispatcher
//! hands it one at a time and answering as an MQTT printer would, with
//! [`Incoming::Ack`] and [`Incoming::Status`] on the gateway's incoming channel.
//!
//! For each job:
//! 1. a job at or before the printer's last job written whole ([`DirectMark`]) is
//!    acknowledged `done` (a duplicate) without printing: the dispatcher sends a job again
//!    after a restart whose removal had not reached the disk, and a raw printer cannot
//!    dedupe;
//! 2. connect if not connected (refused, unplugged, no such device → status `online:
//!    false`, reconnect with doubling backoff);
//! 3. ask `DLE EOT` where the transport answers: paper out, cover open → that printer
//!    state; offline for another cause, an error, no answer → `online: false`; each
//!    reported to the dispatcher, which holds the queue, and asked again every
//!    `direct.poll_ms` until the printer is ready;
//! 4. record durably that the job is being written ([`Outbox::mark_direct`]), write it in
//!    chunks (a write that makes no progress for `direct.stall_timeout_ms` holds the queue
//!    with that reason), ask `DLE EOT` again (an answer after the job means every byte of
//!    it reached the printer), record it written whole, and acknowledge it `done`; a
//!    transport that cannot answer (USB) counts a job done once it is written;
//! 5. a job whose `expires_at` passed while the printer was held is not printed (the
//!    dispatcher expires it);
//! 6. a job cut short (found being written at start-up, or the connection lost while
//!    writing it) may have printed: `reprint` prints it again under the reprint header
//!    ([`super::reprint`]); `hold` hands it to an operator as a dead letter
//!    (`device_rejected: interrupted…`) instead of printing it again, and the queue goes on.

use super::link::{Link, LinkError};
use super::reprint;
use super::status::PrinterStatus;
use super::writes::Writes;
use crate::clock::Clock;
use crate::config::DirectConfig;
use crate::model::{DirectPrinters, Incoming};
use crate::store::{DirectMark, Outbox};
use bytes::Bytes;
use cdc::Interrupted;
use device_protocol::messages::CONTENT_ESCPOS;
use device_protocol::{Ack, Job, PrinterState, Status};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// What a printer task needs besides its jobs.
#[derive(Clone)]
pub struct Shared {
    /// Timings.
    pub cfg: DirectConfig,
    /// Where each printer is, read again at every connection attempt.
    pub printers: Arc<DirectPrinters>,
    /// Where being-written marks are kept.
    pub outbox: Arc<Outbox>,
    /// Acks and status to the dispatcher.
    pub incoming: mpsc::Sender<Incoming>,
    /// The wall clock jobs' `expires_at` is read on (the dispatcher's).
    pub clock: Clock,
    /// The writes under way, let finish at shutdown.
    pub writes: Arc<Writes>,
}

/// One printer's task state.
struct Printer {
    device: String,
    shared: Shared,
    link: Option<Link>,
    /// The last status reported: `(online, printer state)`.
    reported: Option<(bool, Option<PrinterState>)>,
    /// The next reconnect delay.
    backoff: Duration,
}

/// How one attempt at a job ended.
enum Attempt {
    /// Acknowledged (done, or failed): the next job may come.
    Answered,
    /// Not printed now (not connected, cannot print): wait this long and try again.
    Wait(Duration),
    /// Not started: shutdown has begun ([`Writes::close`]). It stays queued.
    Stopped,
}

/// Runs `device`'s task on a thread of its own until `jobs` closes.
///
/// # Errors
/// The thread cannot be started.
pub fn spawn(device: String, shared: Shared, jobs: mpsc::Receiver<Bytes>) -> std::io::Result<()> {
    let initial = Duration::from_millis(shared.cfg.reconnect_initial_ms.max(1));
    let p = Printer { device: device.clone(), shared, link: None, reported: None, backoff: initial };
    std::thread::Builder::new().name(format!("printer-{device}")).spawn(move || p.run(jobs)).map(drop)
}

impl Printer {
    fn run(mut self, mut jobs: mpsc::Receiver<Bytes>) {
        while let Some(wire) = jobs.blocking_recv() {
            let job = match serde_json::from_slice::<Job>(&wire) {
                Ok(j) => j,
                Err(e) => {
                    // Not a job at all: nothing to acknowledge it by; the ack timeout ends it.
                    tracing::error!(device = %self.device, error = %e, "a direct printer was handed bytes that are not a job");
                    continue;
                }
            };
            self.job(&job);
        }
    }

    /// Carries one job through to its ack.
    fn job(&mut self, job: &Job) {
        if job.content_type != CONTENT_ESCPOS {
            let why = format!("a direct printer prints ESC/POS jobs only, not {}", job.content_type);
            return self.ack(Ack::failed(&job.message_id, job.seq, why, true));
        }
        let bytes = match job.payload_bytes() {
            Ok(b) => b,
            Err(e) => return self.ack(Ack::failed(&job.message_id, job.seq, format!("payload: {e}"), true)),
        };
        let mut interrupted = loop {
            match self.shared.outbox.direct_mark(&self.device) {
                Ok(Some(m)) if m.seq > job.seq || (m.seq == job.seq && m.message_id == job.message_id && m.done) => {
                    tracing::info!(device = %self.device, seq = job.seq, message_id = %job.message_id, "already printed; not printed again");
                    return self.ack(Ack::done(&job.message_id, job.seq, true));
                }
                Ok(m) => break m.is_some_and(|m| m.seq == job.seq && m.message_id == job.message_id),
                Err(e) => {
                    tracing::error!(device = %self.device, error = %e, "cannot read the printer's last job from the outbox; retrying");
                    std::thread::sleep(self.next_backoff());
                }
            }
        };
        loop {
            match self.attempt(job, &bytes, &mut interrupted) {
                Attempt::Answered | Attempt::Stopped => return,
                Attempt::Wait(d) => std::thread::sleep(d),
            }
        }
    }

    fn attempt(&mut self, job: &Job, bytes: &[u8], interrupted: &mut bool) -> Attempt {
        let Some(settings) = self.shared.printers.get(&self.device) else {
            // The registry moved it to MQTT: a transient failure makes the dispatcher send
            // the job again, through MQTT this time.
            self.ack(Ack::failed(&job.message_id, job.seq, "no longer a direct printer", false));
            return Attempt::Answered;
        };
        let io = Duration::from_millis(self.shared.cfg.io_timeout_ms.max(1));
        let poll = Duration::from_millis(self.shared.cfg.poll_ms.max(1));
        if !matches!(&self.link, Some(l) if *l.endpoint() == settings.endpoint) {
            // Not connected, or the registry moved the printer.
            self.link = None;
            match Link::open(&settings.endpoint, io) {
                Ok(l) => self.link = Some(l),
                Err(e) => return self.unreachable(&e),
            }
        }
        let Some(link) = self.link.as_mut() else { return Attempt::Wait(poll) };
        match link.status() {
            Err(e) => return self.unreachable(&e),
            Ok(Some(s)) if !s.can_print() => {
                tracing::warn!(device = %self.device, status = s.summary(), "printer cannot print; its queue is held");
                self.report_status(&s);
                if !s.answered() {
                    // Silence may be a printer switched off behind a live adapter: reconnect.
                    self.link = None;
                }
                return Attempt::Wait(poll);
            }
            Ok(Some(s)) => self.report_status(&s),
            Ok(None) => self.report(true, None),
        }
        self.backoff = Duration::from_millis(self.shared.cfg.reconnect_initial_ms.max(1));
        if *interrupted && settings.interrupted == Interrupted::Hold {
            tracing::warn!(device = %self.device, seq = job.seq, message_id = %job.message_id, "a job cut short while being written is handed to an operator (interruptedJob = hold)");
            let why = "interrupted while being written: it may have printed; held for an operator (printer.interruptedJob = hold)";
            self.ack(Ack::failed(&job.message_id, job.seq, why, true));
            return Attempt::Answered;
        }
        if job.expires_at.is_some_and(|at| at <= self.shared.clock.now()) {
            // Held past its time to live (paper out for hours): the dispatcher has expired
            // it, or will; a stale receipt is not printed.
            tracing::info!(device = %self.device, seq = job.seq, message_id = %job.message_id, "job expired while the printer was held; not printed");
            self.ack(Ack::failed(&job.message_id, job.seq, "expired before it could be printed", true));
            return Attempt::Answered;
        }
        let reprint_bytes;
        let out = if *interrupted {
            tracing::warn!(device = %self.device, seq = job.seq, message_id = %job.message_id, "a job cut short while being written is printed again as a reprint");
            reprint_bytes = reprint::with_header(bytes, settings.code_page);
            &reprint_bytes[..]
        } else {
            bytes
        };
        // Held until the job is acknowledged: a shutdown waits for it rather than cut it.
        let Some(_writing) = self.shared.writes.begin(&self.device, job.seq, &job.message_id) else {
            tracing::info!(device = %self.device, seq = job.seq, message_id = %job.message_id, "shutting down: job not started; it stays queued");
            return Attempt::Stopped;
        };
        let mut mark = DirectMark { seq: job.seq, message_id: job.message_id.clone(), done: false };
        if let Err(e) = self.shared.outbox.mark_direct(&self.device, &mark) {
            tracing::error!(device = %self.device, error = %e, "cannot record the job as being written; not written");
            return Attempt::Wait(self.next_backoff());
        }
        let stall = Duration::from_millis(self.shared.cfg.stall_timeout_ms.max(1));
        let Some(link) = self.link.as_mut() else { return Attempt::Wait(poll) };
        if let Err(e) = link.write_job(out, stall) {
            // Some of it may be on paper: from now on the job is a reprint.
            *interrupted = true;
            return self.unreachable(&e);
        }
        if settings.endpoint.answers_status() {
            // The printer answers `DLE EOT` in stream order: an answer after the job says
            // every byte of it reached the printer. A busy printer may take a while to get
            // to it (its buffer full of this job), so silence is asked again up to the
            // stall timeout; a dropped connection or lasting silence leaves the job
            // uncertain, a reprint.
            let since = std::time::Instant::now();
            let after = loop {
                match link.status() {
                    Ok(Some(s)) if s.answered() => break Some(s),
                    Ok(_) if since.elapsed() < stall => continue,
                    _ => break None,
                }
            };
            let Some(after) = after else {
                *interrupted = true;
                let e = LinkError::Write {
                    endpoint: settings.endpoint.to_string(),
                    source: std::io::Error::new(std::io::ErrorKind::TimedOut, "no status after the job"),
                };
                return self.unreachable(&e);
            };
            // The next job waits for the printer to be ready; this one reached it.
            self.report_status(&after);
        }
        mark.done = true;
        while let Err(e) = self.shared.outbox.mark_direct(&self.device, &mark) {
            tracing::error!(device = %self.device, error = %e, "cannot record the job as written; retrying");
            std::thread::sleep(self.next_backoff());
        }
        tracing::info!(device = %self.device, endpoint = %settings.endpoint, seq = job.seq, message_id = %job.message_id, bytes = out.len(), reprint = *interrupted, "written to the printer");
        self.ack(Ack::done(&job.message_id, job.seq, false));
        Attempt::Answered
    }

    /// The printer cannot be reached (or the connection dropped, or a write stalled): the
    /// queue is held with status `online: false`, and reconnected after the backoff.
    fn unreachable(&mut self, e: &LinkError) -> Attempt {
        tracing::warn!(device = %self.device, error = %e, "direct printer unreachable; its queue is held");
        self.link = None;
        self.report(false, None);
        Attempt::Wait(self.next_backoff())
    }

    fn next_backoff(&mut self) -> Duration {
        let d = self.backoff;
        self.backoff = (d * 2).min(Duration::from_millis(self.shared.cfg.reconnect_max_ms.max(1)));
        d
    }

    /// A status read from the printer, as an MQTT printer reports it: its printer state, or
    /// `online: false` for what the protocol has no state for (offline, error, no answer).
    fn report_status(&mut self, s: &PrinterStatus) {
        match s.state() {
            Some(state) => self.report(true, Some(state)),
            None => self.report(false, None),
        }
    }

    /// Tells the dispatcher the printer's status when it changed.
    fn report(&mut self, online: bool, printer: Option<PrinterState>) {
        if self.reported == Some((online, printer)) {
            return;
        }
        self.reported = Some((online, printer));
        let status = Status { v: 1, online, printer };
        let _ = self.shared.incoming.blocking_send(Incoming::Status { device: self.device.clone(), status });
    }

    fn ack(&mut self, ack: Ack) {
        let _ = self.shared.incoming.blocking_send(Incoming::Ack { device: self.device.clone(), ack });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::endpoint::Endpoint;
    use crate::model::DirectSettings;
    use crate::test_fixtures::temp_outbox;
    use device_protocol::{AckResult, EffectKind};
    use render::codepage::CodePage;
    use std::io::{Read, Write};
    use std::sync::Mutex;

    /// A raw printer on loopback TCP for the task to talk to: answers every `DLE EOT n`
    /// with `reply` and keeps every other byte it got. One connection at a time.
    struct FakePrinter {
        addr: String,
        got: Arc<Mutex<Vec<u8>>>,
        reply: Arc<Mutex<u8>>,
    }

    impl FakePrinter {
        fn start() -> FakePrinter {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap().to_string();
            let (got, reply) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(0x12u8)));
            let (g, r) = (got.clone(), reply.clone());
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    let Ok(mut s) = stream else { return };
                    let mut pending: Vec<u8> = Vec::new();
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = s.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        pending.extend_from_slice(&buf[..n]);
                        // DLE EOT n answered in stream order; the rest is paper.
                        let mut i = 0;
                        while i < pending.len() {
                            if pending[i..].starts_with(&[0x10, 0x04]) && pending.len() >= i + 3 {
                                let b = *r.lock().unwrap();
                                let _ = s.write_all(&[b]);
                                i += 3;
                            } else if pending[i] == 0x10 && pending.len() < i + 3 {
                                break;
                            } else {
                                g.lock().unwrap().push(pending[i]);
                                i += 1;
                            }
                        }
                        pending.drain(..i);
                    }
                }
            });
            FakePrinter { addr, got, reply }
        }

        fn paper(&self) -> String {
            String::from_utf8_lossy(&self.got.lock().unwrap()).into_owned()
        }
    }

    struct Rig {
        _dir: crate::test_fixtures::TempDir,
        outbox: Arc<Outbox>,
        jobs: mpsc::Sender<Bytes>,
        incoming: mpsc::Receiver<Incoming>,
    }

    fn rig(name: &str, endpoint: &str, interrupted: Interrupted) -> Rig {
        let (dir, outbox) = temp_outbox(name);
        let printers = Arc::new(DirectPrinters::default());
        let settings =
            DirectSettings { endpoint: Endpoint::parse(endpoint).unwrap(), interrupted, code_page: CodePage::Cp860 };
        printers.set("p", Some(settings));
        let (incoming_tx, incoming) = mpsc::channel(64);
        let cfg = DirectConfig {
            io_timeout_ms: 500,
            stall_timeout_ms: 1_000,
            poll_ms: 20,
            reconnect_initial_ms: 20,
            reconnect_max_ms: 100,
            ..DirectConfig::default()
        };
        let writes = Arc::default();
        let shared =
            Shared { cfg, printers, outbox: outbox.clone(), incoming: incoming_tx, clock: Clock::default(), writes };
        let (jobs, rx) = mpsc::channel(8);
        spawn("p".into(), shared, rx).unwrap();
        Rig { _dir: dir, outbox, jobs, incoming }
    }

    fn wire(id: &str, seq: u64, text: &str) -> Bytes {
        let mut job = crate::test_fixtures::job(id, EffectKind::PrintReceipt, "c");
        job.seq = seq;
        job.content_type = CONTENT_ESCPOS.into();
        job.payload = Job::encode_payload(format!("\x1b@\x1bt\x03{text}\n\x1dVA\x03").as_bytes());
        Bytes::from(job.to_json())
    }

    impl Rig {
        /// The next ack, skipping status reports (collected into `statuses`).
        async fn ack(&mut self, statuses: &mut Vec<Status>) -> Ack {
            loop {
                match tokio::time::timeout(Duration::from_secs(30), self.incoming.recv()).await.unwrap().unwrap() {
                    Incoming::Ack { ack, .. } => return ack,
                    Incoming::Status { status, .. } => statuses.push(status),
                }
            }
        }
    }

    /// A job is written whole between two status queries and acknowledged done with its
    /// message id and seq; sent again (a resend, or after a restart that lost its removal),
    /// it is acknowledged as a duplicate and not printed again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_job_prints_once_and_its_repeat_is_a_duplicate() {
        let printer = FakePrinter::start();
        let mut r = rig("direct-once", &format!("tcp://{}", printer.addr), Interrupted::Reprint);
        let mut statuses = Vec::new();
        r.jobs.send(wire("m1", 1, "first receipt")).await.unwrap();
        let ack = r.ack(&mut statuses).await;
        assert_eq!((ack.message_id.as_str(), ack.seq, ack.result, ack.duplicate), ("m1", 1, AckResult::Done, false));
        assert_eq!(statuses.last().map(|s| (s.online, s.printer)), Some((true, Some(PrinterState::Ready))));
        r.jobs.send(wire("m1", 1, "first receipt")).await.unwrap();
        let again = r.ack(&mut statuses).await;
        assert_eq!((again.result, again.duplicate), (AckResult::Done, true));
        r.jobs.send(wire("m2", 2, "second receipt")).await.unwrap();
        assert_eq!(r.ack(&mut statuses).await.message_id, "m2");
        let paper = printer.paper();
        assert_eq!(paper.matches("first receipt").count(), 1, "{paper:?}");
        assert_eq!(paper.matches("second receipt").count(), 1);
        assert!(!paper.contains("REIMPRESS"), "{paper:?}");
        let mark = r.outbox.direct_mark("p").unwrap().unwrap();
        assert_eq!((mark.seq, mark.message_id.as_str(), mark.done), (2, "m2", true));
    }

    /// Paper out holds the job (reported as the printer state, nothing written) until
    /// the printer says it is ready.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn paper_out_holds_the_job_until_ready() {
        let printer = FakePrinter::start();
        *printer.reply.lock().unwrap() = 0x72; // every reply with the paper-end bits set
        let mut r = rig("direct-paper", &format!("tcp://{}", printer.addr), Interrupted::Reprint);
        r.jobs.send(wire("m1", 1, "held receipt")).await.unwrap();
        let status = tokio::time::timeout(Duration::from_secs(30), r.incoming.recv()).await.unwrap().unwrap();
        assert!(
            matches!(&status, Incoming::Status { status, .. } if status.printer == Some(PrinterState::PaperOut)),
            "{status:?}"
        );
        assert!(!printer.paper().contains("held receipt"), "nothing written while out of paper");
        *printer.reply.lock().unwrap() = 0x12;
        let mut statuses = Vec::new();
        assert_eq!(r.ack(&mut statuses).await.result, AckResult::Done);
        assert_eq!(statuses.last().and_then(|s| s.printer), Some(PrinterState::Ready));
        assert_eq!(printer.paper().matches("held receipt").count(), 1);
    }

    /// A job whose time to live passed (held behind paper out) is not printed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_expired_job_is_not_printed() {
        let printer = FakePrinter::start();
        let mut r = rig("direct-expired", &format!("tcp://{}", printer.addr), Interrupted::Reprint);
        let mut job: Job = serde_json::from_slice(&wire("m1", 1, "stale receipt")).unwrap();
        job.expires_at = Some(chrono::Utc::now() - chrono::Duration::minutes(1));
        r.jobs.send(Bytes::from(job.to_json())).await.unwrap();
        let ack = r.ack(&mut Vec::new()).await;
        assert_eq!((ack.result, ack.permanent), (AckResult::Failed, true));
        assert!(!printer.paper().contains("stale receipt"));
    }

    /// A job found being written (a crash mid-job) is printed again under the reprint
    /// header with `reprint`, and handed to an operator as a permanent failure with `hold`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_job_cut_short_is_reprinted_with_its_header_or_held() {
        let printer = FakePrinter::start();
        let mut r = rig("direct-reprint", &format!("tcp://{}", printer.addr), Interrupted::Reprint);
        let cut = DirectMark { seq: 7, message_id: "m7".into(), done: false };
        r.outbox.mark_direct("p", &cut).unwrap();
        r.jobs.send(wire("m7", 7, "cut short")).await.unwrap();
        assert_eq!(r.ack(&mut Vec::new()).await.result, AckResult::Done);
        let paper = printer.got.lock().unwrap().clone();
        let header = CodePage::Cp860.encode_lossy(reprint::HEADER).0;
        let at = paper.windows(header.len()).position(|w| w == header).expect("the reprint header");
        assert!(at < paper.windows(9).position(|w| w == b"cut short").unwrap(), "above the receipt");

        let printer = FakePrinter::start();
        let mut r = rig("direct-hold", &format!("tcp://{}", printer.addr), Interrupted::Hold);
        r.outbox.mark_direct("p", &cut).unwrap();
        r.jobs.send(wire("m7", 7, "cut short")).await.unwrap();
        let ack = r.ack(&mut Vec::new()).await;
        assert_eq!((ack.result, ack.permanent), (AckResult::Failed, true));
        assert!(ack.reason.unwrap().contains("held for an operator"));
        assert!(!printer.paper().contains("cut short"), "not printed again");
    }

    /// A printer that refuses the connection holds the queue as offline; once it listens,
    /// the job prints.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_connection_is_offline_then_reconnected() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let mut r = rig("direct-refused", &format!("tcp://127.0.0.1:{port}"), Interrupted::Reprint);
        r.jobs.send(wire("m1", 1, "late receipt")).await.unwrap();
        let status = tokio::time::timeout(Duration::from_secs(30), r.incoming.recv()).await.unwrap().unwrap();
        assert!(matches!(&status, Incoming::Status { status, .. } if !status.online), "{status:?}");
        // The printer comes up on that port.
        let listener = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
        let got = Arc::new(Mutex::new(Vec::new()));
        let g = got.clone();
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = [0u8; 4096];
            while let Ok(n) = s.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let queries = buf[..n].windows(2).filter(|w| w == &[0x10, 0x04]).count();
                g.lock().unwrap().extend_from_slice(&buf[..n]);
                let _ = s.write_all(&vec![0x12; queries]);
            }
        });
        let mut statuses = Vec::new();
        assert_eq!(r.ack(&mut statuses).await.result, AckResult::Done);
        assert!(statuses.iter().any(|s| s.online), "back online: {statuses:?}");
        assert!(String::from_utf8_lossy(&got.lock().unwrap()).contains("late receipt"));
    }
}
