//! `pixgate outbox salvage`: what can still be read of a damaged outbox, copied into a new
//! file, with a list of what could not.
//!
//! redb verifies page checksums only in its integrity check: a read of a damaged page
//! returns garbage, an error, or panics inside redb (a page whose type byte is noise). So
//! every read here runs under `catch_unwind`, on a copy of the file (redb repairs a file
//! that was not closed cleanly when it opens it; the damaged original stays as it was),
//! and the database is opened again after a panic. Each table is read from its first key
//! forward and from its last key backward, each until the first unreadable entry: what
//! lies between the first and the last damaged leaf is lost. The queues are read again per
//! device (each device's key range, both ways) and per job (the index and `job_live` each
//! name every queued job by (device, seq)), so a damaged leaf costs only the jobs on it.
//!
//! So that the jobs lost can be had again by moving the consumer group back
//! (`pixgate kafka reposition --to-time`), the new file, when jobs were lost:
//! - forgets the charges' states (`charges`): a record read again would otherwise be
//!   ignored as `stale_version` (its `__v` is not newer than the one stored);
//! - forgets the dedupe window's ids (`seen_by_event_time`) of the event minutes the lost
//!   jobs came from (all of them when which jobs were lost cannot be told), except the ids
//!   of the jobs kept: a record read again queues its lost jobs again, and the devices
//!   drop by message id what they had already done.
//!
//! Ids of kept jobs that the window lost with a damaged page are put back (their key comes
//! from the job's event id). It also drops a lost job's reconciliation link, keeps each device's `seq` at least
//! at its highest job's (no seq is given twice), the last dead-letter id at least at the
//! highest kept dead letter's, and, when the registry (`devices`) lost entries, the saved
//! read positions, so that a central-shape replica reads the device topic again.

use super::error::{err, OutboxError};
use super::schema::{
    decode_row, Link, CHARGES, DEADLETTERS, DEVICES, DIRECT_WRITING, DL_BY_SOURCE, FLAGS, JOB_INDEX, JOB_LIVE,
    JOB_ROWS, LAST_DEADLETTER_ID, LEGACY_JOBS, LEGACY_JOB_LIVE, LEGACY_RECONCILE_JOBS, META, NO_LINK, PARKED,
    READ_POSITIONS, RECONCILE_COUNTS, RECONCILE_MARKS, RECONCILE_NAMES, SEEN, SEQ,
};
use redb::{Key, ReadTransaction, ReadableDatabase, ReadableTable, TableDefinition, Value};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

/// A table's entries as redb stores them: key bytes → value bytes.
type Entries = BTreeMap<Vec<u8>, Vec<u8>>;

/// What [`salvage`] did, table by table.
#[derive(Debug, Default)]
pub struct Salvaged {
    /// Every table of the file, in the order they were read.
    pub tables: Vec<TableReport>,
    /// Queued jobs copied whole.
    pub jobs_kept: usize,
    /// Queued jobs that could not be read, by (device, seq).
    pub lost_jobs: Vec<LostJob>,
    /// False when the lists of queued jobs (the index, `job_live`; `reconcile_jobs` in a
    /// file of an earlier layout) were damaged too: jobs may be lost that
    /// [`Salvaged::lost_jobs`] cannot name.
    pub lost_jobs_complete: bool,
    /// Charge states forgotten (see the module docs).
    pub charges_forgotten: usize,
    /// Dedupe-window ids forgotten (see the module docs).
    pub ids_forgotten: usize,
    /// Dedupe-window ids of kept jobs put back, from their event ids, where the window's
    /// damaged pages had lost them.
    pub ids_restored: usize,
    /// Where to move the consumer group back to, Unix seconds, to have the lost jobs again:
    /// the earliest lost job's event minute; when they cannot all be named, the earliest
    /// event the file still knows of (a kept job's, or the dedupe window's start). `None`
    /// when nothing was lost.
    pub replay_from_s: Option<u64>,
}

/// One table's salvage.
#[derive(Debug)]
pub struct TableReport {
    /// The table's name in the file.
    pub table: &'static str,
    /// Entries copied into the new file.
    pub copied: usize,
    /// redb's words (or its panic's) for the first unreadable entry; `None`: read whole.
    pub damage: Option<String>,
}

/// A queued job that could not be read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostJob {
    /// The device it was queued for.
    pub device: String,
    /// Its place in the device's queue.
    pub seq: u64,
    /// The topic of the record it came from; empty when unknown.
    pub topic: String,
    /// The start of the minute of that record's event time, Unix seconds
    /// ([`crate::store::reconcile::BUCKET_S`]); `None` when unknown.
    pub event_minute_s: Option<u64>,
    /// Its effect kind (`display_qr`, …); empty when unknown.
    pub kind: String,
}

/// Copies what can be read of the outbox at `damaged` into a new outbox at `new` (which
/// must not exist), never writing to `damaged`; a working copy `new` + `.reading` is made
/// beside `new` and removed at the end.
///
/// # Errors
/// `new` exists, `damaged` is held by a running gateway, a file cannot be copied or
/// created (the copy needs room for `damaged` once more), or redb cannot open the file at
/// all (its header pages are damaged: nothing can be read).
pub fn salvage(damaged: &Path, new: &Path) -> Result<Salvaged, OutboxError> {
    if new.exists() {
        return Err(OutboxError::Folder(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!("{} exists; salvage writes a new file", new.display()),
        )));
    }
    let quiet = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let result = copy_into(damaged, new);
    std::panic::set_hook(quiet);
    result
}

/// [`salvage`], with redb's panics kept off the terminal.
fn copy_into(damaged: &Path, new: &Path) -> Result<Salvaged, OutboxError> {
    // A running gateway holds the file locked: what it writes meanwhile would be torn.
    let in_use =
        catch_unwind(|| matches!(redb::ReadOnlyDatabase::open(damaged), Err(redb::DatabaseError::DatabaseAlreadyOpen)));
    if in_use.unwrap_or(false) {
        return Err(OutboxError::InUse(damaged.to_path_buf()));
    }
    let mut reading = new.as_os_str().to_owned();
    reading.push(".reading");
    let reading = PathBuf::from(reading);
    std::fs::copy(damaged, &reading)?;
    let result = Reader::open(&reading).and_then(|mut reader| copy(&mut reader, new));
    let _ = std::fs::remove_file(&reading);
    if result.is_err() {
        let _ = std::fs::remove_file(new);
    }
    result
}

/// Where a file keeps its queues ([`super::job_rows`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// `jobs`: (device, seq) → row; links in `reconcile_jobs`.
    First,
    /// `job_rows`, the index `jobs` and `job_live` key → (device, seq); links in
    /// `reconcile_jobs`.
    Second,
    /// `job_rows`, `jobs` and `job_live` key → (device, seq, link).
    Current,
}

/// `link` as an earlier layout's `reconcile_jobs` value, (topic, bucket, kind), its names
/// from `names` (`reconcile_names`' entries); `None` for no link or a name `names` lacks.
fn resolve(names: &Entries, link: Link) -> Option<Vec<u8>> {
    if link == NO_LINK {
        return None;
    }
    let name = |id: u16| names.get(&key_bytes::<u16>(&id)).map(|v| <&str as Value>::from_bytes(v));
    let bucket = u64::from(link.1) * crate::store::reconcile::BUCKET_S;
    Some(key_bytes::<(&str, u64, &str)>(&(name(link.0)?, bucket, name(link.2)?)))
}

/// Reads the working copy, opening it again after a panic inside redb.
struct Reader {
    path: PathBuf,
    db: Option<Box<dyn ReadableDatabase>>,
}

impl Reader {
    fn open(path: &Path) -> Result<Reader, OutboxError> {
        let mut reader = Reader { path: path.to_path_buf(), db: None };
        reader.db = Some(reader.open_db()?);
        Ok(reader)
    }

    /// Read-only when it can be (nothing is written, not even the allocator's state);
    /// opened for writing when redb asks for a repair first (a file not closed cleanly).
    fn open_db(&self) -> Result<Box<dyn ReadableDatabase>, OutboxError> {
        let path = &self.path;
        let opened = catch_unwind(|| match redb::Builder::new().open_read_only(path) {
            Ok(db) => Ok(Box::new(db) as Box<dyn ReadableDatabase>),
            Err(redb::DatabaseError::RepairAborted | redb::DatabaseError::Storage(_)) => {
                let db = redb::Builder::new().set_check_integrity_on_open(false).open(path)?;
                Ok(Box::new(db) as Box<dyn ReadableDatabase>)
            }
            Err(e) => Err(e),
        });
        match opened {
            Ok(Ok(db)) => Ok(db),
            Ok(Err(e)) => Err(err(e)),
            Err(panic) => Err(OutboxError::Damaged { path: path.clone(), detail: panic_text(&*panic) }),
        }
    }

    /// Runs `read` in a read transaction: its error, or the panic's words, as text.
    fn attempt(&mut self, read: impl FnOnce(&ReadTransaction) -> Result<(), redb::Error>) -> Result<(), String> {
        if self.db.is_none() {
            self.db = Some(self.open_db().map_err(|e| e.to_string())?);
        }
        let db = self.db.as_ref().expect("opened above");
        match catch_unwind(AssertUnwindSafe(|| read(&db.begin_read()?))) {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(panic) => {
                self.db = None;
                Err(format!("redb panicked reading it: {}", panic_text(&*panic)))
            }
        }
    }

    /// Every entry of `def` it can read: forward from the first, then (if that stopped)
    /// backward from the last. The second value is the first failure's words.
    fn table<K: Key + 'static, V: Value + 'static>(&mut self, def: TableDefinition<K, V>) -> (Entries, Option<String>) {
        let mut out = Entries::new();
        let forward = self.attempt(|tx| {
            let Some(t) = open(tx, def)? else { return Ok(()) };
            for entry in t.iter()? {
                put::<K, V>(&mut out, entry?);
            }
            Ok(())
        });
        let Err(damage) = forward else { return (out, None) };
        let _ = self.attempt(|tx| {
            let Some(t) = open(tx, def)? else { return Ok(()) };
            for entry in t.iter()?.rev() {
                put::<K, V>(&mut out, entry?);
            }
            Ok(())
        });
        (out, Some(damage))
    }

    /// The layout the file keeps its queues in.
    fn layout(&mut self) -> Layout {
        let mut layout = Layout::Current;
        let _ = self.attempt(|tx| {
            let mismatch = |e| matches!(e, Err(redb::TableError::TableTypeMismatch { .. }));
            if mismatch(tx.open_table(JOB_INDEX).map(|_| ())) {
                layout = Layout::First;
            } else if mismatch(tx.open_table(JOB_LIVE).map(|_| ())) {
                layout = Layout::Second;
            }
            Ok(())
        });
        layout
    }

    /// The queued jobs of `device` it can read besides those in `jobs`, both ways.
    fn device_jobs(&mut self, legacy: bool, device: &str, jobs: &mut Entries) {
        for backward in [false, true] {
            let mut found: Vec<(u64, u64)> = Vec::new();
            let done = self.attempt(|tx| {
                if legacy {
                    let Some(t) = open(tx, LEGACY_JOBS)? else { return Ok(()) };
                    let range = t.range((device, 0)..=(device, u64::MAX))?;
                    let entries: Box<dyn Iterator<Item = _>> =
                        if backward { Box::new(range.rev()) } else { Box::new(range) };
                    for entry in entries {
                        put::<(&str, u64), &[u8]>(jobs, entry?);
                    }
                } else {
                    let Some(t) = open(tx, JOB_INDEX)? else { return Ok(()) };
                    let range = t.range((device, 0)..=(device, u64::MAX))?;
                    let entries: Box<dyn Iterator<Item = _>> =
                        if backward { Box::new(range.rev()) } else { Box::new(range) };
                    for entry in entries {
                        let (k, v) = entry?;
                        found.push((k.value().1, v.value()));
                    }
                }
                Ok(())
            });
            for (seq, key) in found {
                self.row(device, seq, key, jobs);
            }
            if done.is_ok() {
                return;
            }
        }
    }

    /// The job (`device`, `seq`), if it can be read.
    fn job(&mut self, legacy: bool, device: &str, seq: u64, jobs: &mut Entries) {
        let mut key = None;
        let _ = self.attempt(|tx| {
            if legacy {
                let Some(t) = open(tx, LEGACY_JOBS)? else { return Ok(()) };
                if let Some(row) = t.get((device, seq))? {
                    jobs.insert(key_bytes::<(&str, u64)>(&(device, seq)), row.value().to_vec());
                }
            } else {
                let Some(t) = open(tx, JOB_INDEX)? else { return Ok(()) };
                key = t.get((device, seq))?.map(|v| v.value());
            }
            Ok(())
        });
        if let Some(key) = key {
            self.row(device, seq, key, jobs);
        }
    }

    /// The row under `key` of `job_rows`, as (`device`, `seq`)'s job, if it can be read
    /// and `jobs` does not have it yet.
    fn row(&mut self, device: &str, seq: u64, key: u64, jobs: &mut Entries) {
        let at = key_bytes::<(&str, u64)>(&(device, seq));
        if jobs.contains_key(&at) {
            return;
        }
        let _ = self.attempt(|tx| {
            let Some(t) = open(tx, JOB_ROWS)? else { return Ok(()) };
            if let Some(row) = t.get(key)? {
                jobs.insert(at, row.value().to_vec());
            }
            Ok(())
        });
    }
}

/// `def` in `tx`; `None` when the file (an earlier version's) has no such table.
fn open<K: Key + 'static, V: Value + 'static>(
    tx: &ReadTransaction,
    def: TableDefinition<K, V>,
) -> Result<Option<redb::ReadOnlyTable<K, V>>, redb::Error> {
    match tx.open_table(def) {
        Ok(t) => Ok(Some(t)),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

fn put<K: Key + 'static, V: Value + 'static>(out: &mut Entries, (k, v): (redb::AccessGuard<K>, redb::AccessGuard<V>)) {
    out.insert(K::as_bytes(&k.value()).as_ref().to_vec(), V::as_bytes(&v.value()).as_ref().to_vec());
}

fn key_bytes<K: Key + 'static>(k: &K::SelfType<'_>) -> Vec<u8> {
    K::as_bytes(k).as_ref().to_vec()
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    crate::telemetry::panic::message(panic).unwrap_or_else(|| "a panic".into())
}

/// Reads every table through `reader`, mends what depends on what was lost, and writes the
/// new file.
fn copy(reader: &mut Reader, new: &Path) -> Result<Salvaged, OutboxError> {
    let mut s = Salvaged::default();
    let read = |s: &mut Salvaged, name: &'static str, (entries, damage): (Entries, Option<String>)| {
        s.tables.push(TableReport { table: name, copied: 0, damage });
        entries
    };
    let whole = |s: &Salvaged| s.tables.last().is_some_and(|t| t.damage.is_none());
    let layout = reader.layout();
    let seq = read(&mut s, "seq", reader.table(SEQ));
    // Each queued job's reconciliation link as an earlier layout's `reconcile_jobs` keeps
    // it, whatever the file's layout: (device, seq) → (topic, bucket, kind).
    let (mut links, mut listed_whole) = match layout {
        Layout::Current => (Entries::new(), false),
        Layout::First | Layout::Second => {
            let links = read(&mut s, "reconcile_jobs", reader.table(LEGACY_RECONCILE_JOBS));
            let w = whole(&s);
            (links, w)
        }
    };
    let direct = read(&mut s, "direct_writing", reader.table(DIRECT_WRITING));
    let legacy = layout == Layout::First;
    // Every queued job the file's lists name, by (device, seq).
    let mut named: BTreeSet<Vec<u8>> = links.keys().cloned().collect();
    let (mut jobs, jobs_damaged) = if legacy {
        let jobs = read(&mut s, "jobs", reader.table(LEGACY_JOBS));
        (jobs, !whole(&s))
    } else {
        let names = match layout {
            Layout::Current => read(&mut s, "reconcile_names", reader.table(RECONCILE_NAMES)),
            _ => Entries::new(),
        };
        let names_whole = layout != Layout::Current || whole(&s);
        // Each queued job is named twice, by the index and by `job_live`: either names it
        // when the other's page is damaged.
        let index = read(&mut s, "jobs", reader.table(JOB_INDEX));
        let live = match layout {
            Layout::Current => read(&mut s, "job_live", reader.table(JOB_LIVE)),
            _ => read(&mut s, "job_live", reader.table(LEGACY_JOB_LIVE)),
        };
        listed_whole |= whole(&s) && names_whole;
        let rows = read(&mut s, "job_rows", reader.table(JOB_ROWS));
        let damaged = s.tables.iter().rev().take(3).any(|t| t.damage.is_some());
        let mut keys: BTreeMap<Vec<u8>, u64> =
            index.iter().map(|(at, key)| (at.clone(), <u64 as Value>::from_bytes(key))).collect();
        for (key, v) in &live {
            let at = match layout {
                Layout::Current => {
                    let (device, seq, link) = <(&str, u64, Link) as Value>::from_bytes(v);
                    let at = key_bytes::<(&str, u64)>(&(device, seq));
                    if let Some(named) = resolve(&names, link) {
                        links.insert(at.clone(), named);
                    }
                    at
                }
                _ => v.clone(),
            };
            keys.entry(at).or_insert_with(|| <u64 as Value>::from_bytes(key));
        }
        named.extend(keys.keys().cloned());
        let mut jobs = Entries::new();
        for (at, key) in keys {
            match rows.get(&key_bytes::<u64>(&key)) {
                Some(row) => {
                    jobs.insert(at, row.clone());
                }
                None => {
                    let (device, seq) = <(&str, u64) as Value>::from_bytes(&at);
                    reader.row(device, seq, key, &mut jobs);
                }
            }
        }
        (jobs, damaged)
    };
    s.lost_jobs_complete = listed_whole || !jobs_damaged;
    if jobs_damaged {
        let mut devices: BTreeSet<String> = BTreeSet::new();
        devices.extend(seq.keys().map(|k| <&str as Value>::from_bytes(k).to_string()));
        devices.extend(direct.keys().map(|k| <&str as Value>::from_bytes(k).to_string()));
        devices.extend(named.iter().map(|k| <(&str, u64) as Value>::from_bytes(k).0.to_string()));
        devices.extend(jobs.keys().map(|k| <(&str, u64) as Value>::from_bytes(k).0.to_string()));
        for device in &devices {
            reader.device_jobs(legacy, device, &mut jobs);
        }
        for k in &named {
            if !jobs.contains_key(k) {
                let (device, n) = <(&str, u64) as Value>::from_bytes(k);
                reader.job(legacy, device, n, &mut jobs);
            }
        }
    }
    // A row that reads but does not decode is as lost as one that does not read.
    let mut kept_ids: HashSet<String> = HashSet::new();
    let mut kept_events: Vec<(u64, String)> = Vec::new();
    let mut lost: BTreeSet<(String, u64)> = BTreeSet::new();
    jobs.retain(|k, row| {
        let (device, n) = <(&str, u64) as Value>::from_bytes(k);
        // A damaged index page read as noise may name another job's (finished) row: a row is
        // kept only as the job it says it is.
        match decode_row(device, row).ok().filter(|job| job.job.seq == n) {
            Some(job) => {
                if let Some(t) = cluster_time_of(&job.job.event_id) {
                    kept_events.push((t, job.job.message_id.clone()));
                }
                kept_ids.insert(job.job.message_id);
                true
            }
            None => {
                lost.insert((device.to_string(), n));
                false
            }
        }
    });
    for k in &named {
        if !jobs.contains_key(k) {
            let (device, n) = <(&str, u64) as Value>::from_bytes(k);
            lost.insert((device.to_string(), n));
        }
    }
    s.lost_jobs = lost
        .iter()
        .map(|(device, n)| {
            let link = links.get(&key_bytes::<(&str, u64)>(&(device.as_str(), *n)));
            let link = link.map(|v| <(&str, u64, &str) as Value>::from_bytes(v));
            LostJob {
                device: device.clone(),
                seq: *n,
                topic: link.map_or(String::new(), |l| l.0.to_string()),
                event_minute_s: link.map(|l| l.1),
                kind: link.map_or(String::new(), |l| l.2.to_string()),
            }
        })
        .collect();
    s.jobs_kept = jobs.len();
    links.retain(|k, _| jobs.contains_key(k));
    let some_lost = !s.lost_jobs.is_empty() || !s.lost_jobs_complete;

    let mut seq = seq;
    let queued = jobs.keys().map(|k| {
        let (device, n) = <(&str, u64) as Value>::from_bytes(k);
        (device.to_string(), n)
    });
    for (device, n) in queued.collect::<Vec<_>>().into_iter().chain(lost) {
        let at = key_bytes::<&str>(&device.as_str());
        let last = seq.get(&at).map_or(0, |v| <u64 as Value>::from_bytes(v));
        if n > last {
            seq.insert(at, key_bytes::<u64>(&n));
        }
    }
    // A printer's mark names the last job it was handed or written, and the printer takes
    // a job at or below the mark's seq as printed: the device's next seq must come after
    // it, though its row in `seq` was lost and its queue is empty.
    for (at, mark) in &direct {
        let (n, _, _) = <(u64, &str, bool) as Value>::from_bytes(mark);
        let last = seq.get(at).map_or(0, |v| <u64 as Value>::from_bytes(v));
        if n > last {
            seq.insert(at.clone(), key_bytes::<u64>(&n));
        }
    }

    let mut seen = read(&mut s, "seen_by_event_time", reader.table(SEEN));
    if some_lost {
        let named = s.lost_jobs.iter().filter_map(|j| j.event_minute_s).min();
        let known = links
            .values()
            .map(|v| <(&str, u64, &str) as Value>::from_bytes(v).1)
            .chain(seen.keys().next().map(|k| <(u64, &str) as Value>::from_bytes(k).0 >> 32))
            .min();
        // A lost job whose minute is unknown (its link lost, or never linked) may have come
        // from any record the file knows of, however late the other lost jobs' minutes.
        let everything = !s.lost_jobs_complete || s.lost_jobs.iter().any(|j| j.event_minute_s.is_none());
        s.replay_from_s = if everything { named.into_iter().chain(known).min() } else { named.or(known) };
        let minutes: HashSet<u64> = s.lost_jobs.iter().filter_map(|j| j.event_minute_s).collect();
        let before = seen.len();
        seen.retain(|k, _| {
            let (t, id) = <(u64, &str) as Value>::from_bytes(k);
            let minute = (t >> 32) / crate::store::reconcile::BUCKET_S * crate::store::reconcile::BUCKET_S;
            kept_ids.contains(id) || !(everything || minutes.contains(&minute))
        });
        s.ids_forgotten = before - seen.len();
    }
    // A kept job's id lost with a damaged page of the window: without it, the record read
    // again would queue the job a second time.
    let now_ms = u64::try_from(chrono::Utc::now().timestamp_millis()).unwrap_or(0);
    for (t, id) in &kept_events {
        let at = key_bytes::<(u64, &str)>(&(*t, id.as_str()));
        if let std::collections::btree_map::Entry::Vacant(e) = seen.entry(at) {
            e.insert(key_bytes::<u64>(&now_ms));
            s.ids_restored += 1;
        }
    }
    let mut charges = read(&mut s, "charges", reader.table(CHARGES));
    if some_lost {
        s.charges_forgotten = charges.len();
        charges.clear();
    }
    let devices = read(&mut s, "devices", reader.table(DEVICES));
    let mut read_positions = read(&mut s, "read_positions", reader.table(READ_POSITIONS));
    if s.tables.iter().any(|t| t.table == "devices" && t.damage.is_some()) {
        read_positions.clear();
    }
    let deadletters = read(&mut s, "deadletters", reader.table(DEADLETTERS));
    let parked = read(&mut s, "parked", reader.table(PARKED));
    let dl_by_source = read(&mut s, "deadletters_by_source", reader.table(DL_BY_SOURCE));
    let mut meta = read(&mut s, "meta", reader.table(META));
    if let Some(highest) = deadletters.keys().next_back().map(|k| <u64 as Value>::from_bytes(k)) {
        let at = key_bytes::<&str>(&LAST_DEADLETTER_ID);
        let last = meta.get(&at).map_or(0, |v| <u64 as Value>::from_bytes(v));
        meta.insert(at, key_bytes::<u64>(&last.max(highest)));
    }
    let flags = read(&mut s, "effect_flags", reader.table(FLAGS));
    let counts = read(&mut s, "reconcile_counts", reader.table(RECONCILE_COUNTS));
    let marks = read(&mut s, "reconcile_marks", reader.table(RECONCILE_MARKS));

    let outbox = super::Outbox::open(new)?;
    let tx = outbox.db.begin_write().map_err(err)?;
    let mut copied = BTreeMap::new();
    copied.insert("seq", write(&tx, SEQ, &seq)?);
    copied.insert("direct_writing", write(&tx, DIRECT_WRITING, &direct)?);
    {
        let mut names = super::link_names::LinkNames::open(&tx)?;
        let mut table = super::job_rows::JobTables::open(&tx)?;
        for (at, row) in &jobs {
            let (device, seq) = <(&str, u64) as Value>::from_bytes(at);
            let link = match links.get(at) {
                Some(v) => {
                    let (topic, bucket, kind) = <(&str, u64, &str) as Value>::from_bytes(v);
                    names.link(topic, bucket, kind)?
                }
                None => NO_LINK,
            };
            table.insert(device, seq, row, link)?;
        }
        copied.insert("reconcile_names", names.len());
    }
    copied.insert("reconcile_jobs", links.len());
    for name in ["jobs", "job_live", "job_rows"] {
        copied.insert(name, jobs.len());
    }
    copied.insert("seen_by_event_time", write(&tx, SEEN, &seen)?);
    copied.insert("charges", write(&tx, CHARGES, &charges)?);
    copied.insert("devices", write(&tx, DEVICES, &devices)?);
    copied.insert("read_positions", write(&tx, READ_POSITIONS, &read_positions)?);
    copied.insert("deadletters", write(&tx, DEADLETTERS, &deadletters)?);
    copied.insert("parked", write(&tx, PARKED, &parked)?);
    copied.insert("deadletters_by_source", write(&tx, DL_BY_SOURCE, &dl_by_source)?);
    copied.insert("meta", write(&tx, META, &meta)?);
    copied.insert("effect_flags", write(&tx, FLAGS, &flags)?);
    copied.insert("reconcile_counts", write(&tx, RECONCILE_COUNTS, &counts)?);
    copied.insert("reconcile_marks", write(&tx, RECONCILE_MARKS, &marks)?);
    tx.commit().map_err(err)?;
    for t in &mut s.tables {
        t.copied = copied.get(t.table).copied().unwrap_or(0);
    }
    Ok(s)
}

/// The `clusterTime` (`t << 32 | i`) an event id carries as its last `:` field
/// (`Charge:<_id>:<t << 32 | i>`, `fixtures/cdc/README.md`), which is the dedupe window's key.
fn cluster_time_of(event_id: &str) -> Option<u64> {
    event_id.rsplit_once(':')?.1.parse().ok()
}

/// Inserts `entries` into `def`; returns how many.
fn write<K: Key + 'static, V: Value + 'static>(
    tx: &redb::WriteTransaction,
    def: TableDefinition<K, V>,
    entries: &Entries,
) -> Result<usize, OutboxError> {
    let mut t = tx.open_table(def).map_err(err)?;
    for (k, v) in entries {
        t.insert(K::from_bytes(k), V::from_bytes(v)).map_err(err)?;
    }
    Ok(entries.len())
}
