//! The dispatcher end to end: its runner and machine, commands in, publishes and finished
//! jobs out, through a channel-backed [`Publisher`]. On paused time
//! (`start_paused = true`): the runtime jumps to the next timer whenever every task waits,
//! so ack timeouts and backoff pass without waiting them out, and a test states when
//! something happens as an exact instant. Jobs' time to live runs on the injected
//! [`Clock`], moved with `clock.advance(ms)`.

use super::Dispatcher;
use crate::clock::Clock;
use crate::config::DeliveryConfig;
use crate::deliver::mqtt::Publisher;
use crate::model::{Command, Finished, Incoming, Outcome, Queued, StoredJob};
use crate::telemetry::{Monitor, Stats};
use bytes::Bytes;
use device_protocol::{Ack, AckResult, EffectKind, Job, PrinterState, Status};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::{timeout, Instant};

/// Waits for `f` at most 5 s (of paused time): a test that misses an event fails instead
/// of advancing time for ever.
async fn soon<F: Future>(f: F) -> F::Output {
    timeout(Duration::from_secs(5), f).await.expect("within 5 s")
}

struct Harness {
    cmd: mpsc::Sender<Command>,
    sent: mpsc::Receiver<(String, Bytes)>,
    finished: mpsc::UnboundedReceiver<Finished>,
    stats: Arc<Stats>,
    health: Arc<Monitor>,
    clock: Clock,
    /// When the dispatcher started (its 100 ms ticks count from here).
    t0: Instant,
}

fn harness(ack_timeout_ms: u64, max_deliveries: u32) -> Harness {
    let cfg = DeliveryConfig {
        ack_timeout_ms,
        backoff_initial_ms: 10,
        backoff_max_ms: 20,
        max_deliveries,
        ..DeliveryConfig::default()
    };
    let (publisher, sent) = Publisher::channel(64);
    let (ftx, finished) = mpsc::unbounded_channel();
    let stats = Arc::new(Stats::default());
    let health = Arc::new(Monitor::default());
    let (cmd, rx) = mpsc::channel(64);
    let clock = Clock::default();
    tokio::spawn(Dispatcher::new(cfg, publisher, ftx, stats.clone(), health.clone(), clock.clone()).run(rx));
    Harness { cmd, sent, finished, stats, health, clock, t0: Instant::now() }
}

use crate::test_fixtures::job;

impl Harness {
    /// Enqueues as the outbox would: `seq` = 1 + the device's previous (offset order).
    async fn enqueue(&self, dev: &str, mut j: Job, seq: i64) {
        j.seq = seq as u64;
        let source = crate::model::SourceRef { topic: "charge.upserted".into(), partition: 0, offset: seq, key: None };
        self.cmd
            .send(Command::Enqueue(Queued::from_stored(StoredJob { device: dev.into(), job: j, source })))
            .await
            .unwrap();
    }
    async fn ack(&self, dev: &str, id: &str, result: AckResult, permanent: bool) {
        let ack = match result {
            AckResult::Done => Ack::done(id, 0, false),
            AckResult::Failed => Ack::failed(id, 0, "r", permanent),
        };
        self.cmd.send(Command::Device(Incoming::Ack { device: dev.into(), ack })).await.unwrap();
    }
    async fn status(&self, dev: &str, online: bool, printer: Option<PrinterState>) {
        let status = Status { v: 1, online, printer };
        self.cmd.send(Command::Device(Incoming::Status { device: dev.into(), status })).await.unwrap();
    }
    async fn next_sent(&mut self) -> Job {
        let (topic, payload) = soon(self.sent.recv()).await.unwrap();
        let j: Job = serde_json::from_slice(&payload).unwrap();
        assert_eq!(topic, format!("pixgate/v1/devices/{}/jobs", topic.split('/').nth(3).unwrap()));
        j
    }
    /// Nothing is sent for `ms` (of paused time).
    async fn nothing_sent(&mut self, ms: u64) {
        assert!(timeout(Duration::from_millis(ms), self.sent.recv()).await.is_err(), "unexpected publish");
    }
    async fn next_finished(&mut self) -> Finished {
        soon(self.finished.recv()).await.unwrap()
    }
    /// Time since the dispatcher started, ms.
    fn elapsed_ms(&self) -> u64 {
        (Instant::now() - self.t0).as_millis() as u64
    }
}

#[tokio::test(start_paused = true)]
async fn one_in_flight_per_device_in_order() {
    let mut h = harness(10_000, 10);
    h.enqueue("d1", job("a", EffectKind::DisplayQr, "c1"), 1).await;
    h.enqueue("d1", job("b", EffectKind::PaymentConfirmed, "c2"), 2).await;
    h.enqueue("d2", job("x", EffectKind::PrintReceipt, "c3"), 1).await;
    let first = h.next_sent().await;
    let other = h.next_sent().await;
    assert_eq!((first.message_id.as_str(), first.seq), ("a", 1));
    assert_eq!((other.message_id.as_str(), other.seq), ("x", 1), "other devices are not held back");
    assert_eq!(h.elapsed_ms(), 0, "sent at once");
    h.nothing_sent(150).await;
    h.ack("d1", "a", AckResult::Done, false).await;
    assert_eq!(h.next_finished().await.outcome, Outcome::Done);
    let second = h.next_sent().await;
    assert_eq!((second.message_id.as_str(), second.seq), ("b", 2));
}

/// Sent again at the first 100 ms tick once its ack timeout (1 s) plus the attempt's
/// backoff (10 ms, then 20 ms) has passed, the same id and seq each time; dead-lettered
/// `no_ack` when the third delivery's timeout passes.
#[tokio::test(start_paused = true)]
async fn unacknowledged_job_is_resent_then_dead_lettered() {
    let mut h = harness(1_000, 3);
    h.enqueue("d1", job("a", EffectKind::DisplayQr, "c1"), 1).await;
    let mut sent_at = Vec::new();
    for _ in 0..3 {
        let j = h.next_sent().await;
        assert_eq!((j.message_id.as_str(), j.seq), ("a", 1), "same id and seq on every delivery");
        sent_at.push(h.elapsed_ms());
    }
    let f = h.next_finished().await;
    assert!(matches!(&f.outcome, Outcome::Failed(r) if r.starts_with("no_ack")), "{:?}", f.outcome);
    assert_eq!(h.stats.snapshot().job_redeliveries, 2);
    assert_eq!(sent_at, [0, 1_000, 2_100], "0, then ticks at or after 0 + 1000 + 0 and 1000 + 1000 + 10");
    assert_eq!(h.elapsed_ms(), 3_200, "the tick at or after 2100 + 1000 + 20");
}

#[tokio::test(start_paused = true)]
async fn permanent_failure_dead_letters_and_moves_on() {
    let mut h = harness(10_000, 10);
    h.enqueue("p", job("a", EffectKind::PrintReceipt, "c1"), 1).await;
    h.enqueue("p", job("b", EffectKind::PrintReceipt, "c2"), 2).await;
    h.next_sent().await;
    h.ack("p", "a", AckResult::Failed, true).await;
    assert!(matches!(h.next_finished().await.outcome, Outcome::Failed(_)));
    assert_eq!(h.next_sent().await.message_id, "b");
}

#[tokio::test(start_paused = true)]
async fn transient_failure_is_retried() {
    let mut h = harness(10_000, 10);
    h.enqueue("p", job("a", EffectKind::PrintReceipt, "c1"), 1).await;
    h.next_sent().await;
    h.ack("p", "a", AckResult::Failed, false).await;
    assert_eq!(h.next_sent().await.message_id, "a", "retried after backoff");
    assert_eq!(h.elapsed_ms(), 100, "at the first tick after its 10 ms backoff, not its ack timeout");
    h.ack("p", "a", AckResult::Done, false).await;
    assert_eq!(h.next_finished().await.outcome, Outcome::Done);
}

#[tokio::test(start_paused = true)]
async fn offline_and_paper_out_hold_the_queue() {
    let mut h = harness(10_000, 10);
    h.status("p", true, Some(PrinterState::PaperOut)).await;
    h.status("t", false, None).await;
    h.enqueue("p", job("a", EffectKind::PrintReceipt, "c1"), 1).await;
    h.enqueue("t", job("b", EffectKind::DisplayQr, "c2"), 1).await;
    h.nothing_sent(200).await;
    h.status("p", true, Some(PrinterState::Ready)).await;
    assert_eq!(h.next_sent().await.message_id, "a");
    h.status("t", true, None).await;
    assert_eq!(h.next_sent().await.message_id, "b");
}

/// A job in flight when its device went away is sent again as soon as the device is back,
/// not at its ack timeout.
#[tokio::test(start_paused = true)]
async fn a_device_back_gets_its_job_in_flight_again_at_once() {
    let mut h = harness(10_000, 10);
    h.enqueue("t", job("a", EffectKind::DisplayQr, "c1"), 1).await;
    h.next_sent().await;
    h.status("t", false, None).await;
    h.nothing_sent(500).await;
    h.status("t", true, None).await;
    let again = h.next_sent().await;
    assert_eq!((again.message_id.as_str(), h.elapsed_ms()), ("a", 500));
    assert_eq!(h.stats.snapshot().job_redeliveries, 1);
}

#[tokio::test(start_paused = true)]
async fn queued_qr_is_superseded_by_the_paid_screen() {
    let mut h = harness(10_000, 10);
    h.enqueue("t", job("busy", EffectKind::DisplayQr, "c0"), 1).await;
    h.enqueue("t", job("qr", EffectKind::DisplayQr, "c1"), 2).await;
    h.enqueue("t", job("paid", EffectKind::PaymentConfirmed, "c1"), 3).await;
    let f = h.next_finished().await;
    assert_eq!((f.stored.job.message_id.as_str(), f.outcome), ("qr", Outcome::Superseded));
    assert_eq!(h.next_sent().await.message_id, "busy");
    h.ack("t", "busy", AckResult::Done, false).await;
    h.next_finished().await;
    assert_eq!(h.next_sent().await.message_id, "paid");
}

/// A device offline for 25 minutes (by the injected clock): its backlog comes in order
/// when it is back, without the jobs whose time to live passed, which are recorded.
#[tokio::test(start_paused = true)]
async fn offline_backlog_keeps_order_and_expires_what_outlived_its_ttl() {
    let mut h = harness(10_000, 10);
    let at = |min: i64| Some(h.clock.now() + chrono::Duration::minutes(min));
    h.status("t", false, None).await;
    let mut jobs = vec![
        job("qr-old", EffectKind::DisplayQr, "c1"), // QR of a charge expiring in 15 min
        job("paid-old", EffectKind::PaymentConfirmed, "c0"), // 10 min TTL
        job("receipt", EffectKind::PrintReceipt, "c0"), // 24 h TTL
        job("qr-new", EffectKind::DisplayQr, "c2"), // expires in 60 min
    ];
    for (j, ttl) in jobs.iter_mut().zip([15, 10, 1440, 60]) {
        j.expires_at = at(ttl);
    }
    for (i, j) in jobs.into_iter().enumerate() {
        h.enqueue("t", j, i as i64 + 1).await;
    }
    h.nothing_sent(150).await;
    h.clock.advance(25 * 60_000);
    // The 1 s expiry sweep finds them while the device is still offline.
    let mut gone = [h.next_finished().await, h.next_finished().await];
    assert_eq!(h.elapsed_ms(), 1_000, "at the expiry sweep");
    gone.sort_by_key(|f| f.stored.job.seq);
    assert_eq!(
        gone.iter().map(|f| (f.stored.job.message_id.as_str(), f.outcome.clone())).collect::<Vec<_>>(),
        [("qr-old", Outcome::Expired), ("paid-old", Outcome::Expired)]
    );
    assert_eq!(h.stats.snapshot().expired.values().sum::<u64>(), 2);
    h.status("t", true, None).await;
    let first = h.next_sent().await;
    assert_eq!((first.message_id.as_str(), first.seq), ("receipt", 3));
    h.ack("t", "receipt", AckResult::Done, false).await;
    h.next_finished().await;
    assert_eq!(h.next_sent().await.message_id, "qr-new");
}

/// A job whose TTL passes while it waits for its ack is not sent again.
#[tokio::test(start_paused = true)]
async fn in_flight_job_expires_instead_of_being_resent() {
    let mut h = harness(300, 10);
    let mut j = job("paid", EffectKind::PaymentConfirmed, "c1");
    j.expires_at = Some(h.clock.now() + chrono::Duration::minutes(10));
    h.enqueue("t", j, 1).await;
    assert_eq!(h.next_sent().await.message_id, "paid");
    h.clock.advance(11 * 60_000);
    let f = h.next_finished().await;
    assert_eq!((f.stored.job.message_id.as_str(), f.outcome), ("paid", Outcome::Expired));
    assert_eq!(h.elapsed_ms(), 300, "when it would have been sent again");
    h.nothing_sent(200).await;
}

/// A job in flight when its device went offline expires while the device stays away
/// (not only when it comes back), once its ack timeout has passed; the device's next
/// job goes out when it is back.
#[tokio::test(start_paused = true)]
async fn in_flight_job_of_an_offline_device_expires_while_it_is_away() {
    let mut h = harness(1_000, 10);
    let mut j = job("paid", EffectKind::PaymentConfirmed, "c1");
    j.expires_at = Some(h.clock.now() + chrono::Duration::minutes(10));
    h.enqueue("t", j, 1).await;
    h.enqueue("t", job("receipt", EffectKind::PrintReceipt, "c1"), 2).await;
    assert_eq!(h.next_sent().await.message_id, "paid");
    h.status("t", false, None).await;
    // Past its TTL but within its ack timeout (1 s): the device may still report it done.
    h.clock.advance(11 * 60_000);
    assert!(timeout(Duration::from_millis(999), h.finished.recv()).await.is_err(), "expired before its ack timeout");
    // At the first tick after the ack timeout.
    let f = h.next_finished().await;
    assert_eq!((f.stored.job.message_id.as_str(), f.outcome), ("paid", Outcome::Expired));
    assert_eq!(h.elapsed_ms(), 1_000);
    assert_eq!(h.stats.snapshot().expired.values().sum::<u64>(), 1);
    h.nothing_sent(200).await;
    h.status("t", true, None).await;
    assert_eq!(h.next_sent().await.message_id, "receipt");
}

/// Every 100 ms the dispatcher reports the jobs queued (to `/stats`) and the ones awaiting
/// an ack on a reachable device (to readiness).
#[tokio::test(start_paused = true)]
async fn counts_are_reported_every_tick() {
    let mut h = harness(10_000, 10);
    let in_flight = |h: &Harness| h.health.facts(true, 0).1.in_flight;
    h.enqueue("t", job("a", EffectKind::DisplayQr, "c1"), 1).await;
    h.enqueue("t", job("b", EffectKind::PrintReceipt, "c1"), 2).await;
    h.next_sent().await;
    h.nothing_sent(150).await;
    assert_eq!((h.stats.snapshot().queued_jobs, in_flight(&h)), (2, 1));
    assert!(h.health.facts(true, 0).1.unacked_since.is_some(), "in flight without an ack");
    h.status("t", false, None).await;
    h.nothing_sent(150).await;
    assert_eq!(in_flight(&h), 0, "not counted while its device is away");
    h.status("t", true, None).await;
    h.next_sent().await;
    h.ack("t", "a", AckResult::Done, false).await;
    h.next_finished().await;
    h.next_sent().await;
    h.nothing_sent(150).await;
    assert_eq!((h.stats.snapshot().queued_jobs, in_flight(&h)), (1, 1));
}

/// After a crash the outbox may still hold a QR whose removal had not reached the disk,
/// ahead of its charge's "paid" screen: it is superseded at load, never sent.
#[tokio::test(start_paused = true)]
async fn preload_supersedes_a_qr_followed_by_its_charges_end() {
    let cfg = DeliveryConfig { ack_timeout_ms: 10_000, ..DeliveryConfig::default() };
    let (publisher, mut sent) = Publisher::channel(64);
    let (ftx, mut finished) = mpsc::unbounded_channel();
    let mut d = Dispatcher::new(
        cfg,
        publisher,
        ftx,
        Arc::new(Stats::default()),
        Arc::new(Monitor::default()),
        Clock::default(),
    );
    let src = src();
    let stored = |id: &str, kind, charge: &str, seq| {
        let mut j = job(id, kind, charge);
        j.seq = seq;
        StoredJob { device: "t".into(), job: j, source: src.clone() }
    };
    // A QR queued after its charge's end (seq 8) is not ended by it.
    d.preload(vec![
        stored("qr1", EffectKind::DisplayQr, "c1", 5),
        stored("paid1", EffectKind::PaymentConfirmed, "c1", 6),
        stored("qr2", EffectKind::DisplayQr, "c2", 7),
        stored("qr1-later", EffectKind::DisplayQr, "c1", 8),
    ]);
    let (cmd, rx) = mpsc::channel(8);
    tokio::spawn(d.run(rx));
    let f = soon(finished.recv()).await.unwrap();
    assert_eq!((f.stored.job.message_id.as_str(), f.outcome), ("qr1", Outcome::Superseded));
    for want in ["paid1", "qr2", "qr1-later"] {
        let (_, payload) = soon(sent.recv()).await.unwrap();
        assert_eq!(serde_json::from_slice::<Job>(&payload).unwrap().message_id, want);
        cmd.send(Command::Device(Incoming::Ack { device: "t".into(), ack: Ack::done(want, 0, false) })).await.unwrap();
        let f = soon(finished.recv()).await.unwrap();
        assert_eq!((f.stored.job.message_id.as_str(), f.outcome), (want, Outcome::Done));
    }
}

#[tokio::test(start_paused = true)]
async fn queued_pix_slip_is_superseded_by_the_receipt() {
    let mut h = harness(10_000, 10);
    h.enqueue("p", job("busy", EffectKind::PrintReceipt, "c0"), 1).await;
    h.enqueue("p", job("slip", EffectKind::DisplayQr, "c1"), 2).await;
    h.enqueue("p", job("receipt", EffectKind::PrintReceipt, "c1"), 3).await;
    let f = h.next_finished().await;
    assert_eq!((f.stored.job.message_id.as_str(), f.outcome), ("slip", Outcome::Superseded));
}

/// A source to store test jobs with.
fn src() -> crate::model::SourceRef {
    crate::model::SourceRef { topic: "charge.upserted".into(), partition: 0, offset: 1, key: None }
}

/// A receipt job whose payload names it.
fn with_payload(id: &str) -> Job {
    let mut j = job(id, EffectKind::PrintReceipt, &format!("c-{id}"));
    j.payload = Job::encode_payload(format!("receipt bytes of {id}").as_bytes());
    j
}

/// With an outbox attached and no memory for payloads, queued jobs keep only their
/// header and are read back when sent: each device still gets every job whole, in
/// order, whether it was reloaded at start-up or enqueued behind a busy head; a failed
/// one's dead letter keeps the stored job, payload included.
#[tokio::test(start_paused = true)]
async fn queued_jobs_shed_their_payload_and_are_sent_whole() {
    let (_dir, outbox) = crate::test_fixtures::temp_outbox("dispatch-payload");
    let src = src();
    // Two stored before a "restart" (reloaded without payloads), two after (queued behind a busy head).
    let before =
        outbox.accept(None, vec![("p".into(), with_payload("a")), ("p".into(), with_payload("b"))], &src, 1).unwrap();
    assert_eq!(before.len(), 2);
    let cfg = DeliveryConfig { ack_timeout_ms: 10_000, held_payload_bytes: 0, ..DeliveryConfig::default() };
    let (publisher, mut sent) = Publisher::channel(64);
    let (ftx, mut finished) = mpsc::unbounded_channel();
    let mut d = Dispatcher::new(
        cfg,
        publisher,
        ftx,
        Arc::new(Stats::default()),
        Arc::new(Monitor::default()),
        Clock::default(),
    )
    .with_outbox(outbox.clone());
    let headers = outbox.pending_headers().unwrap();
    assert!(headers.iter().all(|s| s.job.payload.is_empty()), "loaded without payloads");
    d.preload(headers);
    let (cmd, rx) = mpsc::channel(8);
    tokio::spawn(d.run(rx));
    let after =
        outbox.accept(None, vec![("p".into(), with_payload("c")), ("p".into(), with_payload("d"))], &src, 2).unwrap();
    for s in after {
        cmd.send(Command::Enqueue(s)).await.unwrap();
    }
    for id in ["a", "b", "c", "d"] {
        let (_, payload) = soon(sent.recv()).await.unwrap();
        let j: Job = serde_json::from_slice(&payload).unwrap();
        assert_eq!(j.message_id, id, "in order");
        assert_eq!(j.payload_bytes().unwrap(), format!("receipt bytes of {id}").as_bytes(), "{id} sent whole");
        if id == "d" {
            cmd.send(Command::Device(Incoming::Ack { device: "p".into(), ack: Ack::failed(id, j.seq, "jam", true) }))
                .await
                .unwrap();
        } else {
            cmd.send(Command::Device(Incoming::Ack { device: "p".into(), ack: Ack::done(id, j.seq, false) }))
                .await
                .unwrap();
        }
    }
    for _ in 0..4 {
        let f = soon(finished.recv()).await.unwrap();
        if f.outcome == Outcome::Done {
            outbox.complete(&f.stored.device, f.stored.job.seq, false).unwrap();
            continue;
        }
        // What the consumer does with a failed job: its dead letter keeps the job whole.
        let dl =
            crate::model::DeadLetter::for_job(crate::model::DeadLetterReason::DeliveryFailed, "jam".into(), &f.stored);
        let id = outbox.fail_job(&f.stored, dl, 3).unwrap();
        let parked = outbox.parked_deadletters(10).unwrap().into_iter().find(|p| p.id == id).unwrap();
        let kept = parked.job.unwrap();
        assert_eq!(kept.job.payload_bytes().unwrap(), b"receipt bytes of d");
        let value: Job = serde_json::from_str(parked.dead_letter.job.as_deref().unwrap()).unwrap();
        assert_eq!(value.payload_bytes().unwrap(), b"receipt bytes of d", "the dead letter's job is the whole job");
    }
    assert!(outbox.pending().unwrap().is_empty());
}

/// Queued jobs keep their wire bytes in memory up to `held_payload_bytes`, and are sent
/// from memory; beyond it they are read back from the outbox. Told apart here by taking
/// both rows out of the outbox while they wait: the held job still goes out whole, the
/// other one is found gone and not sent, but reported done so the consumer's bounds count
/// it out.
#[tokio::test(start_paused = true)]
async fn queued_jobs_are_held_up_to_the_budget_then_read_back() {
    let (_dir, outbox) = crate::test_fixtures::temp_outbox("dispatch-held");
    let src = src();
    let queued = outbox
        .accept(None, ["head", "held", "read"].map(|id| ("p".to_string(), with_payload(id))).to_vec(), &src, 1)
        .unwrap();
    // Room for one of the two that wait behind the head.
    let cfg = DeliveryConfig {
        ack_timeout_ms: 10_000,
        held_payload_bytes: queued[1].wire.len(),
        ..DeliveryConfig::default()
    };
    let (publisher, mut sent) = Publisher::channel(64);
    let (ftx, mut finished) = mpsc::unbounded_channel();
    let stats = Arc::new(Stats::default());
    let d = Dispatcher::new(cfg, publisher, ftx, stats.clone(), Arc::new(Monitor::default()), Clock::default())
        .with_outbox(outbox.clone());
    let (cmd, rx) = mpsc::channel(8);
    tokio::spawn(d.run(rx));
    for q in queued {
        cmd.send(Command::Enqueue(q)).await.unwrap();
    }
    let (_, wire) = soon(sent.recv()).await.unwrap();
    assert_eq!(serde_json::from_slice::<Job>(&wire).unwrap().message_id, "head");
    outbox.complete("p", 2, false).unwrap();
    outbox.complete("p", 3, false).unwrap();
    cmd.send(Command::Device(Incoming::Ack { device: "p".into(), ack: Ack::done("head", 1, false) })).await.unwrap();
    assert_eq!(soon(finished.recv()).await.unwrap().outcome, Outcome::Done);
    let (_, wire) = soon(sent.recv()).await.unwrap();
    let j: Job = serde_json::from_slice(&wire).unwrap();
    assert_eq!(
        (j.message_id.as_str(), j.payload_bytes().unwrap()),
        ("held", b"receipt bytes of held".to_vec()),
        "sent from memory"
    );
    cmd.send(Command::Device(Incoming::Ack { device: "p".into(), ack: Ack::done("held", 2, false) })).await.unwrap();
    assert_eq!(soon(finished.recv()).await.unwrap().outcome, Outcome::Done);
    assert!(
        timeout(Duration::from_millis(300), sent.recv()).await.is_err(),
        "the job not held was read back, found gone, and not sent"
    );
    let gone = soon(finished.recv()).await.unwrap();
    assert_eq!((gone.stored.job.message_id.as_str(), gone.outcome), ("read", Outcome::Done));
    assert_eq!(
        stats.snapshot().effects_done.values().sum::<u64>(),
        2,
        "the device did not carry out the one found gone"
    );
}

/// The central shape's moves: a device whose partition went to another replica is
/// forgotten (its job in flight is neither sent again nor reported when its ack comes), and
/// the queues of a partition taken are queued with their `seq`s, the supersede rule
/// applied again.
#[tokio::test(start_paused = true)]
async fn a_forgotten_device_gets_nothing_more_and_a_restored_queue_is_sent_in_order() {
    let mut h = harness(1_000, 5);
    h.enqueue("a", job("a1", EffectKind::PrintReceipt, "c0"), 1).await;
    assert_eq!(h.next_sent().await.message_id, "a1");
    h.cmd.send(Command::Forget(vec!["a".into()])).await.unwrap();
    h.ack("a", "a1", AckResult::Done, false).await;
    h.nothing_sent(3_000).await;
    assert!(h.finished.try_recv().is_err(), "nothing of a forgotten device is reported");

    let stored = |id: &str, kind, charge: &str, seq| {
        let mut j = job(id, kind, charge);
        j.seq = seq;
        StoredJob { device: "t".into(), job: j, source: src() }
    };
    let restored = vec![
        stored("qr1", EffectKind::DisplayQr, "c1", 41),
        stored("paid1", EffectKind::PaymentConfirmed, "c1", 42),
        stored("r1", EffectKind::PrintReceipt, "c1", 43),
    ];
    h.cmd.send(Command::Restore(restored)).await.unwrap();
    let f = h.next_finished().await;
    assert_eq!((f.stored.job.message_id.as_str(), f.outcome), ("qr1", Outcome::Superseded));
    for (id, seq) in [("paid1", 42), ("r1", 43)] {
        let j = h.next_sent().await;
        assert_eq!((j.message_id.as_str(), j.seq), (id, seq), "the log's seq, in order");
        h.ack("t", id, AckResult::Done, false).await;
        let f = h.next_finished().await;
        assert_eq!((f.stored.job.message_id.as_str(), f.outcome), (id, Outcome::Done));
    }
}

/// The central shape's shutdown: once the barrier after a `Forget` is answered, every job
/// the dispatcher finished before is already reported (its end can be logged), and
/// nothing more is sent or reported.
#[tokio::test(start_paused = true)]
async fn a_barrier_is_answered_after_what_came_before_is_reported() {
    let mut h = harness(1_000, 5);
    for (id, seq) in [("a1", 1), ("a2", 2), ("a3", 3)] {
        h.enqueue("a", job(id, EffectKind::PrintReceipt, "c0"), seq).await;
    }
    assert_eq!(h.next_sent().await.message_id, "a1");
    h.ack("a", "a1", AckResult::Done, false).await;
    assert_eq!(h.next_sent().await.message_id, "a2", "sent once a1 is done: in flight at the Forget");
    h.cmd.send(Command::Forget(vec!["a".into()])).await.unwrap();
    let (answer, answered) = tokio::sync::oneshot::channel();
    h.cmd.send(Command::Barrier(answer)).await.unwrap();
    soon(answered).await.expect("the barrier is answered");
    let f = h.finished.try_recv().expect("a1's end is reported before the barrier's answer");
    assert_eq!((f.stored.job.message_id.as_str(), f.outcome), ("a1", Outcome::Done));
    h.ack("a", "a2", AckResult::Done, false).await;
    h.nothing_sent(3_000).await;
    assert!(h.finished.try_recv().is_err(), "a2 and a3 are not reported: their next owner sends them");
}

/// A dispatcher through `transport`, hearing devices on `incoming`: its commands and the
/// jobs it finishes.
fn spawn_with_incoming<T: crate::deliver::Transport>(
    cfg: DeliveryConfig,
    transport: T,
    incoming: mpsc::Receiver<Incoming>,
) -> (mpsc::Sender<Command>, mpsc::UnboundedReceiver<Finished>) {
    let (ftx, finished) = mpsc::unbounded_channel();
    let (cmd, rx) = mpsc::channel(64);
    let dispatcher = Dispatcher::new(
        cfg,
        transport,
        ftx,
        Arc::new(Stats::default()),
        Arc::new(Monitor::default()),
        Clock::default(),
    )
    .with_incoming(incoming);
    tokio::spawn(dispatcher.run(rx));
    (cmd, finished)
}

/// Receipt `p1`, seq 1, for device `p`, as the outbox queues it.
fn receipt_for_p() -> Queued {
    let mut j = job("p1", EffectKind::PrintReceipt, "c0");
    j.seq = 1;
    let source = crate::model::SourceRef { topic: "charge.upserted".into(), partition: 0, offset: 1, key: None };
    Queued::from_stored(StoredJob { device: "p".into(), job: j, source })
}

/// A device's ack sent on the incoming channel before a barrier is handled before the
/// barrier is answered, even when both are waiting at once: the job it finished is
/// already reported (a cloud printer's confirmation before the last outbox write). On two
/// threads, so that the answer is seen at once, not only once the dispatcher waits again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_barrier_is_answered_after_the_device_messages_sent_before_it() {
    for round in 0..200 {
        let (publisher, mut sent) = Publisher::channel(64);
        let (incoming, incoming_rx) = mpsc::channel(64);
        let (cmd, mut finished) = spawn_with_incoming(DeliveryConfig::default(), publisher, incoming_rx);
        cmd.send(Command::Enqueue(receipt_for_p())).await.unwrap();
        soon(sent.recv()).await.unwrap();
        // Both wait before the dispatcher runs again.
        let ack = Ack::done("p1", 1, false);
        incoming.send(Incoming::Ack { device: "p".into(), ack }).await.unwrap();
        let (answer, answered) = tokio::sync::oneshot::channel();
        cmd.send(Command::Barrier(answer)).await.unwrap();
        soon(answered).await.expect("the barrier is answered");
        let f = finished.try_recv().unwrap_or_else(|_| panic!("round {round}: the ack is handled before the answer"));
        assert_eq!((f.stored.job.message_id.as_str(), f.outcome), ("p1", Outcome::Done));
    }
}

/// A CloudPRNT printer's job the dispatcher ends itself (here out of deliveries: the
/// printer fetched it and never confirmed) is withdrawn from the board: the printer's next
/// poll is not handed a job already dead-lettered.
#[tokio::test(start_paused = true)]
async fn a_cloud_printers_job_ended_without_its_answer_is_withdrawn_from_the_board() {
    use crate::deliver::cloudprnt::{Board, CloudRouted};
    use crate::model::{CloudSettings, DirectPrinters};

    let printers = Arc::new(DirectPrinters::default());
    let settings = CloudSettings {
        mac: Some("00:11:62:00:00:01".into()),
        method: cdc::CloudMethod::Http,
        width_dots: 576,
        code_page: render::codepage::CodePage::Cp860,
        model: String::new(),
    };
    printers.set_cloud("p", Some(settings));
    let (incoming, incoming_rx) = mpsc::channel(64);
    let board = Arc::new(Board::new(printers, incoming, Duration::from_secs(3600), u32::MAX));
    let (publisher, _sent) = Publisher::channel(64);
    let cfg =
        DeliveryConfig { ack_timeout_ms: 100, backoff_initial_ms: 10, max_deliveries: 1, ..DeliveryConfig::default() };
    let transport = CloudRouted::new(board.clone(), publisher, false);
    let (cmd, mut finished) = spawn_with_incoming(cfg, transport, incoming_rx);
    let ready = Status { v: 1, online: true, printer: Some(PrinterState::Ready) };
    assert_eq!(board.poll("p", ready.clone(), false), Ok(None), "polling, nothing offered yet");

    cmd.send(Command::Enqueue(receipt_for_p())).await.unwrap();
    let until = Instant::now() + Duration::from_secs(1);
    while board.job("p", None).is_none() && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(board.poll("p", ready.clone(), false), Ok(Some("p1".into())), "offered and announced");

    let f = soon(finished.recv()).await.unwrap();
    assert!(matches!(&f.outcome, Outcome::Failed(why) if why.starts_with("no_ack")), "{:?}", f.outcome);
    assert!(board.job("p", None).is_none(), "the dead-lettered job is no longer offered");
    assert_eq!(board.poll("p", ready, false), Ok(None));
}
