//! The consumer loop on paused time, with a fake consumer-group member ([`FakeReader`]) in
//! place of librdkafka and a real outbox file: what it stores, pauses and commits, and
//! when.

use super::*;
use crate::ingest::group_reader::GroupReader;
use crate::model::{DirectPrinters, Directory, StoredJob};
use crate::test_fixtures::{records, temp_outbox};
use rdkafka::error::KafkaResult;
use rdkafka::message::{OwnedHeaders, Timestamp};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Mutex;

const DEVICES: &str = "device.upserted";
const CHARGES: &str = "charge.upserted";

/// What the loop did to its member, in order.
#[derive(Debug, Clone, PartialEq)]
enum Call {
    /// An offset stored, with the message ids of the jobs the outbox then held from the
    /// partition's records below it.
    Stored(Partition, i64, BTreeSet<String>),
    Paused(Partition),
    Resumed(Partition),
    Sought(Partition, i64),
    Committed,
}

/// A consumer-group member that serves the records it is given, in order per partition,
/// never from a paused partition, and notes every call.
struct FakeReader {
    queue: Mutex<VecDeque<OwnedMessage>>,
    paused: Mutex<BTreeSet<Partition>>,
    assigned: Mutex<Vec<Partition>>,
    /// A rebalance to report (the revoked partitions).
    rebalance: Mutex<Option<Vec<Partition>>>,
    calls: Mutex<Vec<Call>>,
    wake: Notify,
    outbox: Arc<Outbox>,
}

impl FakeReader {
    fn new(outbox: Arc<Outbox>, assigned: Vec<Partition>) -> FakeReader {
        FakeReader {
            queue: Mutex::default(),
            paused: Mutex::default(),
            assigned: Mutex::new(assigned),
            rebalance: Mutex::new(Some(Vec::new())),
            calls: Mutex::default(),
            wake: Notify::new(),
            outbox,
        }
    }

    fn feed(&self, topic: &str, partition: i32, offset: i64, key: &str, value: Vec<u8>) {
        let m = OwnedMessage::new(
            Some(value),
            Some(key.as_bytes().to_vec()),
            topic.to_string(),
            Timestamp::CreateTime(1_700_000_000_000),
            partition,
            offset,
            None::<OwnedHeaders>,
        );
        self.queue.lock().unwrap().push_back(m);
        self.wake.notify_one();
    }

    /// A rebalance, as librdkafka makes one: `assigned` is the new assignment, `revoked`
    /// records are no longer served, and no pause survives (the loop must pause again
    /// what must stay paused). Reported to the loop at its next `rebalanced`.
    fn reassign(&self, assigned: Vec<Partition>, revoked: Vec<Partition>) {
        *self.assigned.lock().unwrap() = assigned;
        self.paused.lock().unwrap().clear();
        self.queue.lock().unwrap().retain(|m| !revoked.contains(&(m.topic().to_string(), m.partition())));
        *self.rebalance.lock().unwrap() = Some(revoked);
        self.wake.notify_one();
    }

    fn paused(&self) -> BTreeSet<Partition> {
        self.paused.lock().unwrap().clone()
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    /// The first queued record whose partition is not paused, keeping each partition's order.
    fn next(&self) -> Option<OwnedMessage> {
        let paused = self.paused.lock().unwrap();
        let mut queue = self.queue.lock().unwrap();
        let mut blocked = BTreeSet::new();
        for i in 0..queue.len() {
            let part = (queue[i].topic().to_string(), queue[i].partition());
            if paused.contains(&part) {
                blocked.insert(part);
            } else if !blocked.contains(&part) {
                return queue.remove(i);
            }
        }
        None
    }
}

impl GroupReader for FakeReader {
    async fn recv(&self) -> KafkaResult<OwnedMessage> {
        loop {
            let woken = self.wake.notified();
            if let Some(m) = self.next() {
                return Ok(m);
            }
            woken.await;
        }
    }

    fn store_offset(&self, part: &Partition, next: i64) -> KafkaResult<()> {
        let held = self
            .outbox
            .pending()
            .unwrap()
            .into_iter()
            .filter(|s| (s.source.topic.as_str(), s.source.partition) == (part.0.as_str(), part.1))
            .filter(|s| s.source.offset < next)
            .map(|s| s.job.message_id)
            .collect();
        self.calls.lock().unwrap().push(Call::Stored(part.clone(), next, held));
        Ok(())
    }

    fn pause(&self, part: &Partition, action: Action) -> KafkaResult<()> {
        let mut paused = self.paused.lock().unwrap();
        let call = match action {
            Action::Pause => {
                paused.insert(part.clone());
                Call::Paused(part.clone())
            }
            Action::Resume => {
                paused.remove(part);
                Call::Resumed(part.clone())
            }
        };
        drop(paused);
        self.calls.lock().unwrap().push(call);
        self.wake.notify_one();
        Ok(())
    }

    fn seek(&self, part: &Partition, offset: i64) -> KafkaResult<()> {
        self.calls.lock().unwrap().push(Call::Sought(part.clone(), offset));
        Ok(())
    }

    fn assignment(&self) -> KafkaResult<Vec<Partition>> {
        Ok(self.assigned.lock().unwrap().clone())
    }

    fn rebalanced(&self) -> Option<Vec<Partition>> {
        self.rebalance.lock().unwrap().take()
    }

    fn positions(&self) -> KafkaResult<Vec<(Partition, Option<i64>)>> {
        Ok(self.assigned.lock().unwrap().iter().map(|p| (p.clone(), None)).collect())
    }

    fn commit(&self) -> KafkaResult<()> {
        self.calls.lock().unwrap().push(Call::Committed);
        Ok(())
    }
}

/// The loop's surroundings: a real outbox, the dispatcher's channels (its commands kept),
/// shutdown.
struct Rig {
    _dir: crate::test_fixtures::TempDir,
    outbox: Arc<Outbox>,
    stats: Arc<Stats>,
    reader: Arc<FakeReader>,
    enqueued: Arc<Mutex<Vec<Queued>>>,
    finished: mpsc::UnboundedSender<Finished>,
    shutdown: Shutdown,
    task: tokio::task::JoinHandle<()>,
}

impl Rig {
    fn start(name: &str, cfg: Config) -> Rig {
        let (dir, outbox) = temp_outbox(name);
        let stats = Arc::new(Stats::default());
        let health = Arc::new(Monitor::new(&cfg));
        let clock = Clock::with_offset(0);
        let planner = Planner::restore(
            &cfg,
            stats.clone(),
            clock.clone(),
            &outbox,
            Arc::new(Directory::default()),
            Arc::new(DirectPrinters::default()),
        )
        .unwrap();
        let (commands, mut commands_rx) = mpsc::channel(1024);
        let enqueued = Arc::new(Mutex::new(Vec::new()));
        let kept = enqueued.clone();
        tokio::spawn(async move {
            while let Some(c) = commands_rx.recv().await {
                if let Command::Enqueue(q) = c {
                    kept.lock().unwrap().push(q);
                }
            }
        });
        let (finished, finished_rx) = mpsc::unbounded_channel();
        let (_replays_tx, replays) = mpsc::channel(1);
        let shutdown = Shutdown::new();
        let reader = Arc::new(FakeReader::new(outbox.clone(), all_partitions()));
        let services = Services {
            cfg,
            stats: stats.clone(),
            health,
            clock,
            outbox: outbox.clone(),
            outbox_jobs: HashMap::new(),
            planner,
            commands,
            finished: finished_rx,
            replays,
            deadletters: Arc::new(Notify::new()),
            shutdown: shutdown.clone(),
            jobs_out: None,
            delivery_log: None,
            partition_links: None,
            route_changelog: None,
            cloud_printers: None,
            direct_writes: None,
        };
        let task = tokio::spawn(run_with(services, reader.clone()));
        Rig { _dir: dir, outbox, stats, reader, enqueued, finished, shutdown, task }
    }

    /// Feeds the fixture registry on device partition 0, then the first `n` fixture
    /// charges spread over charge partitions 0 and 1 by key. Returns how many records each
    /// partition got.
    fn feed_fixtures(&self, n: usize) -> BTreeMap<Partition, i64> {
        let mut ends = BTreeMap::new();
        let mut feed = |topic: &str, partition: i32, key: &str, value: Vec<u8>| {
            let end = ends.entry((topic.to_string(), partition)).or_insert(0i64);
            self.reader.feed(topic, partition, *end, key, value);
            *end += 1;
        };
        for (key, value) in records("devices.jsonl") {
            feed(DEVICES, 0, &key, value);
        }
        for (key, value) in records("charges.jsonl").into_iter().take(n) {
            let partition = i32::from(key.as_bytes().last().copied().unwrap_or(0) % 2);
            feed(CHARGES, partition, &key, value);
        }
        ends
    }

    /// Waits (on paused time) until `done` holds for the counters, at most a virtual minute.
    async fn wait(&self, done: impl Fn(&crate::telemetry::Snapshot) -> bool) {
        let waited = tokio::time::timeout(Duration::from_secs(60), async {
            while !done(&self.stats.snapshot()) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        assert!(waited.is_ok(), "not reached: {:?}", self.stats.snapshot());
    }

    async fn stop(self) -> Vec<Call> {
        self.shutdown.request();
        self.task.await.unwrap();
        self.reader.calls()
    }
}

/// The partitions the fake member holds at start.
fn all_partitions() -> Vec<Partition> {
    vec![(DEVICES.to_string(), 0), (CHARGES.to_string(), 0), (CHARGES.to_string(), 1)]
}

/// Sends every job the dispatcher got back as done, until `drained` holds for the
/// counters (at most 10,000 jobs).
async fn finish_until(rig: &Rig, drained: impl Fn(&crate::telemetry::Snapshot) -> bool) {
    let mut finished = 0;
    while !drained(&rig.stats.snapshot()) {
        let jobs: Vec<Queued> = std::mem::take(&mut *rig.enqueued.lock().unwrap());
        for q in jobs {
            rig.finished.send(Finished { stored: q.stored, outcome: Outcome::Done }).unwrap();
            finished += 1;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(finished < 10_000, "never drained: {:?}", rig.stats.snapshot());
    }
}

fn read_all(ends: &BTreeMap<Partition, i64>) -> impl Fn(&crate::telemetry::Snapshot) -> bool + '_ {
    move |s| {
        let read: u64 = s.events_read.values().sum();
        read == ends.values().sum::<i64>() as u64 && s.pending_records == 0
    }
}

/// The read position is part of the data: an offset is stored only once every job of the
/// records below it is in the outbox (none of them appears later), each partition's
/// stored offsets only grow and end at its last record, the jobs reach the dispatcher in
/// each device's `seq` order, and the final commit comes once, after the last store.
#[tokio::test(start_paused = true)]
async fn offsets_follow_the_outbox_and_the_final_commit_comes_last() {
    let rig = Rig::start("consumer-offsets", Config::default());
    let ends = rig.feed_fixtures(120);
    rig.wait(read_all(&ends)).await;
    let outbox = rig.outbox.clone();
    let enqueued = rig.enqueued.clone();
    let calls = rig.stop().await;

    let held_at_end: Vec<StoredJob> = outbox.pending().unwrap();
    assert!(held_at_end.len() > 100, "the fixtures' charges queue jobs: {}", held_at_end.len());
    let mut last: BTreeMap<Partition, i64> = BTreeMap::new();
    for call in &calls {
        if let Call::Stored(part, next, held) = call {
            let now: BTreeSet<String> = held_at_end
                .iter()
                .filter(|s| (s.source.topic.as_str(), s.source.partition) == (part.0.as_str(), part.1))
                .filter(|s| s.source.offset < *next)
                .map(|s| s.job.message_id.clone())
                .collect();
            assert_eq!(held, &now, "{part:?} stored at {next} before all its records' jobs were in the outbox");
            let before = last.insert(part.clone(), *next).unwrap_or(0);
            assert!(*next > before, "{part:?}: stored {next} after {before}");
        }
    }
    assert_eq!(last, ends, "every partition stored up to its last record");
    let commits: Vec<usize> =
        calls.iter().enumerate().filter(|(_, c)| **c == Call::Committed).map(|(i, _)| i).collect();
    assert_eq!(commits, [calls.len() - 1], "one final commit, after every store");

    let enqueued = enqueued.lock().unwrap();
    assert_eq!(enqueued.len(), held_at_end.len(), "every stored job went to the dispatcher");
    let mut seqs: BTreeMap<&str, u64> = BTreeMap::new();
    for q in enqueued.iter() {
        let prev = seqs.insert(&q.stored.device, q.stored.job.seq).unwrap_or(0);
        assert_eq!(q.stored.job.seq, prev + 1, "device {} got seq {} after {prev}", q.stored.device, q.stored.job.seq);
    }
}

/// No unbounded queue: a device at its bound pauses the partition that feeds it (and the
/// fake serves nothing from it while paused); a job of that device finishing resumes it,
/// and everything is then read.
#[tokio::test(start_paused = true)]
async fn a_device_at_its_bound_pauses_its_partition_until_a_job_finishes() {
    let mut cfg = Config::default();
    cfg.outbox.max_jobs_per_device = 3;
    let rig = Rig::start("consumer-bound", cfg);
    let ends = rig.feed_fixtures(60);
    rig.wait(|s| s.devices_at_bound > 0).await;
    // What can still be read (records for other devices) is read; then nothing more while
    // nothing finishes.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let read = rig.stats.snapshot().events_read.values().sum::<u64>();
    assert!(read < ends.values().sum::<i64>() as u64, "read everything past the bound");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(rig.stats.snapshot().events_read.values().sum::<u64>(), read, "read on past the bound");
    let paused: Vec<Partition> = rig
        .reader
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::Paused(p) => Some(p),
            _ => None,
        })
        .collect();
    assert!(paused.iter().any(|p| p.0 == CHARGES), "a charge partition paused: {paused:?}");

    // The devices carry out their jobs: each one finished frees its place.
    finish_until(&rig, |s| read_all(&ends)(s) && s.outbox_jobs == 0 && s.paused_partitions == 0).await;
    let calls = rig.stop().await;
    for part in &paused {
        let last = calls.iter().rposition(|c| *c == Call::Paused(part.clone())).unwrap();
        assert!(calls[last..].contains(&Call::Resumed(part.clone())), "{part:?} paused and never resumed");
    }
}

/// A rebalance: no pause survives a reassignment in librdkafka, so the loop pauses again
/// the partition a device at its bound holds; after a partition is revoked, the loop
/// counts the new assignment, and the partitions kept are released, read and stored to
/// their ends.
#[tokio::test(start_paused = true)]
async fn after_a_rebalance_pauses_hold_again_and_the_kept_partitions_go_on() {
    let mut cfg = Config::default();
    cfg.outbox.max_jobs_per_device = 3;
    let rig = Rig::start("consumer-rebalance", cfg);
    let ends = rig.feed_fixtures(60);
    rig.wait(|s| s.devices_at_bound > 0).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let paused = rig.reader.paused();
    assert!(paused.iter().any(|p| p.0 == CHARGES), "a charge partition paused at the bound: {paused:?}");

    // The same partitions assigned again: the pauses are gone from the member, and come back.
    rig.reader.reassign(all_partitions(), Vec::new());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(rig.reader.paused(), paused, "what must stay paused is paused again after the reassignment");

    // Charge partition 1 moves to another member.
    let revoked: Partition = (CHARGES.to_string(), 1);
    let kept: Vec<Partition> = all_partitions().into_iter().filter(|p| *p != revoked).collect();
    rig.reader.reassign(kept.clone(), vec![revoked]);
    finish_until(&rig, |s| {
        s.pending_records == 0 && s.outbox_jobs == 0 && s.paused_partitions == 0 && s.assigned_partitions == 2
    })
    .await;
    // Whatever is still to finish goes, then the loop stops.
    tokio::time::sleep(Duration::from_secs(2)).await;
    finish_until(&rig, |s| s.outbox_jobs == 0).await;
    let calls = rig.stop().await;
    for part in kept.iter().filter(|p| p.0 == CHARGES) {
        let last = calls.iter().rev().find_map(|c| match c {
            Call::Stored(p, next, _) if p == part => Some(*next),
            _ => None,
        });
        assert_eq!(last, Some(ends[part]), "{part:?}, kept, was read and stored to its end");
    }
}
