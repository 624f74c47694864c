//! Reconciliation counts: per topic, in one-minute buckets of the records' event time, what
//! pixgate did with them, kept in the outbox file so that an operator compares them with
//! the upstream capture's counts after a restart too. Reports add the buckets up into
//! windows (10 minutes by default, [`windows`]).
//!
//! Counted in the same transaction as what they count, so they are exact across crashes:
//! - `read`, `ignored:REASON`, `dead_lettered:REASON` (a record's or one effect's),
//!   `skipped_by_flag:KIND` and `queued:KIND` with the record's batch write, once per
//!   record: a record read again (after a crash, a rebalance, a reposition backwards) is
//!   behind its partition's mark (table `reconcile_marks`) and not counted again;
//! - `delivered:KIND` and `superseded` with the job's removal, `expired:KIND` and
//!   `dead_lettered:delivery_failed` with its dead letter, in the bucket of the record the
//!   job came from (the job's link in `job_live`: (topic, minute, kind), the names by id in
//!   `reconcile_names`, written when the job is queued, removed when it leaves). A
//!   replayed job has none and is not counted again.
//!
//! Tables: `reconcile_counts` (bucket start in Unix seconds, topic, counter) → count;
//! pruned past `reconcile.retention_hours`, so the file holds at most that many hours of
//! buckets (a few dozen counters per topic and minute).

use crate::model::DeadLetterReason;
use crate::store::outbox::link_names::{link_bucket, LinkNames};
use crate::store::outbox::schema::{Link, NO_LINK, RECONCILE_COUNTS as COUNTS, RECONCILE_MARKS as MARKS};
use crate::store::outbox::{Outbox, OutboxError};
use chrono::{DateTime, Utc};
use redb::{ReadableTable, WriteTransaction};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

/// The bucket the counts are kept in, seconds. A report's window is a multiple of it.
pub const BUCKET_S: u64 = 60;

fn db(e: impl Into<redb::Error>) -> OutboxError {
    OutboxError::Database(e.into())
}

/// What one record adds to the counts, made by the planner: its event time and the
/// counters it bumps besides `read` and `queued:KIND` (which the write adds).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecordTally {
    /// The record's event time, Unix seconds (its `clusterTime`; the Kafka timestamp when
    /// it has none that can be read).
    pub event_time_s: u64,
    /// `ignored:REASON`, `dead_lettered:REASON`, `skipped_by_flag:KIND`, one per occurrence.
    pub counters: Vec<String>,
}

/// The counting of one write transaction: increments added up in memory and written
/// once per counter at [`Counting::finish`], the tables opened once (a batch's records
/// mostly bump the same few counters of the same minute).
pub(crate) struct Counting<'t> {
    tx: &'t WriteTransaction,
    marks: redb::Table<'t, (&'static str, i32), i64>,
    /// Read on first use: a transaction that links and resolves nothing never reads it.
    names: Option<LinkNames<'t>>,
    /// Each partition's mark as this transaction has moved it.
    seen: HashMap<(String, i32), i64>,
    counts: BTreeMap<(u64, String, String), u64>,
}

impl<'t> Counting<'t> {
    /// Opens the tables in `tx`.
    pub(crate) fn open(tx: &'t WriteTransaction) -> Result<Counting<'t>, OutboxError> {
        Ok(Counting {
            tx,
            marks: tx.open_table(MARKS).map_err(db)?,
            names: None,
            seen: HashMap::new(),
            counts: BTreeMap::new(),
        })
    }

    fn names(&mut self) -> Result<&mut LinkNames<'t>, OutboxError> {
        let names = match self.names.take() {
            Some(names) => names,
            None => LinkNames::open(self.tx)?,
        };
        Ok(self.names.insert(names))
    }

    fn bump(&mut self, bucket: u64, topic: &str, counter: String) {
        *self.counts.entry((bucket, topic.to_string(), counter)).or_default() += 1;
    }

    /// Counts one record: `tally`'s counters, `read`, and `queued:KIND` for each kind of
    /// `produced` (jobs sent to the device-jobs topic, linked when read back,
    /// [`Counting::link`]). Returns the bucket (Unix seconds) its queued jobs count in
    /// ([`Counting::queued`]); `None`, nothing counted, when the record is behind its
    /// partition's mark (counted before).
    pub(crate) fn record(
        &mut self,
        topic: &str,
        partition: i32,
        offset: i64,
        tally: &RecordTally,
        produced: &[&str],
    ) -> Result<Option<u64>, OutboxError> {
        let key = (topic.to_string(), partition);
        let mark = match self.seen.get(&key) {
            Some(m) => *m,
            None => self.marks.get((topic, partition)).map_err(db)?.map_or(0, |v| v.value()),
        };
        if offset < mark {
            return Ok(None);
        }
        self.seen.insert(key, offset + 1);
        let bucket = tally.event_time_s / BUCKET_S * BUCKET_S;
        self.bump(bucket, topic, "read".to_string());
        for c in &tally.counters {
            self.bump(bucket, topic, c.clone());
        }
        for kind in produced {
            self.bump(bucket, topic, format!("queued:{kind}"));
        }
        Ok(Some(bucket))
    }

    /// Counts a job of kind `kind` queued from a record of `topic` counted in `bucket`
    /// ([`Counting::record`]) as `queued:KIND`; returns its link, for its `job_live` entry.
    ///
    /// # Errors
    /// Database failure.
    pub(crate) fn queued(&mut self, topic: &str, bucket: u64, kind: &str) -> Result<Link, OutboxError> {
        // The bucket the job counts in again when it leaves, should its link cap the minute.
        self.bump(link_bucket(bucket), topic, format!("queued:{kind}"));
        self.names()?.link(topic, bucket, kind)
    }

    /// The link of a job of kind `kind`, queued from the device-jobs topic, to the window of
    /// the change event it was planned from (`topic`, `event_time_s`): that record counted
    /// it as queued when its jobs were produced; this job counts there again when it
    /// leaves its queue.
    ///
    /// # Errors
    /// Database failure.
    pub(crate) fn link(&mut self, topic: &str, event_time_s: u64, kind: &str) -> Result<Link, OutboxError> {
        self.names()?.link(topic, event_time_s, kind)
    }

    /// Counts a job leaving its queue, by the bucket of its record (its `link`):
    /// `superseded`, or `delivered:KIND`. A job with no link (replayed) is not counted.
    ///
    /// # Errors
    /// Database failure reading the link's names.
    pub(crate) fn removed(&mut self, link: Link, superseded: bool) -> Result<(), OutboxError> {
        self.left(link, |kind| if superseded { "superseded".to_string() } else { format!("delivered:{kind}") })
    }

    /// Counts a job dead-lettered for `reason`: `expired:KIND`, or `dead_lettered:REASON`.
    ///
    /// # Errors
    /// Database failure reading the link's names.
    pub(crate) fn failed(&mut self, link: Link, reason: &DeadLetterReason) -> Result<(), OutboxError> {
        self.left(link, |kind| match reason {
            DeadLetterReason::Expired => format!("expired:{kind}"),
            other => format!("dead_lettered:{other}"),
        })
    }

    fn left(&mut self, link: Link, counter: impl Fn(&str) -> String) -> Result<(), OutboxError> {
        if link == NO_LINK {
            return Ok(());
        }
        let Some((topic, bucket, kind)) = self.names()?.resolve(link) else { return Ok(()) };
        let (topic, name) = (topic.to_string(), counter(kind));
        self.bump(bucket, &topic, name);
        Ok(())
    }

    /// Writes the marks moved and the counts added up, in `tx`.
    pub(crate) fn finish(mut self, tx: &WriteTransaction) -> Result<(), OutboxError> {
        for ((topic, partition), mark) in &self.seen {
            self.marks.insert((topic.as_str(), *partition), *mark).map_err(db)?;
        }
        if self.counts.is_empty() {
            return Ok(());
        }
        let mut counts = tx.open_table(COUNTS).map_err(db)?;
        for ((bucket, topic, counter), n) in &self.counts {
            let key = (*bucket, topic.as_str(), counter.as_str());
            let before = counts.get(key).map_err(db)?.map_or(0, |v| v.value());
            counts.insert(key, before + n).map_err(db)?;
        }
        Ok(())
    }
}

/// One window of one topic: what happened to the records whose event time falls in it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Window {
    /// Topic.
    pub topic: String,
    /// The window's start (inclusive) and end (exclusive), by event time.
    pub start: DateTime<Utc>,
    /// See `start`.
    pub end: DateTime<Utc>,
    /// Records read (each once).
    pub read: u64,
    /// Jobs queued in the outbox, by effect kind.
    pub queued: BTreeMap<String, u64>,
    /// Effects left out because their kind was switched off, by kind.
    pub skipped_by_flag: BTreeMap<String, u64>,
    /// Jobs acknowledged as done by their device, by kind.
    pub delivered: BTreeMap<String, u64>,
    /// Queued `display_qr` jobs dropped because their charge's next screen came first.
    pub superseded: u64,
    /// Jobs whose time to live passed before they were done, by kind.
    pub expired: BTreeMap<String, u64>,
    /// Records with no effect by design, by reason.
    pub ignored: BTreeMap<String, u64>,
    /// Records and effects dead-lettered, by reason (`expired` apart).
    pub dead_lettered: BTreeMap<String, u64>,
}

impl Window {
    fn add(&mut self, counter: &str, n: u64) {
        let (name, label) = counter.split_once(':').unwrap_or((counter, ""));
        let map = match name {
            "read" => return self.read += n,
            "superseded" => return self.superseded += n,
            "queued" => &mut self.queued,
            "skipped_by_flag" => &mut self.skipped_by_flag,
            "delivered" => &mut self.delivered,
            "expired" => &mut self.expired,
            "ignored" => &mut self.ignored,
            "dead_lettered" => &mut self.dead_lettered,
            // A counter of a later pixgate: not this report's.
            _ => return,
        };
        *map.entry(label.to_string()).or_default() += n;
    }
}

impl Outbox {
    /// The counts whose event time is in `[since_s, until_s)` (Unix seconds), added up in
    /// windows of `window_s` (a multiple of [`BUCKET_S`], aligned to the Unix epoch), per
    /// topic; only windows with counts, by topic then start.
    ///
    /// # Errors
    /// Disk or database failure.
    pub fn reconcile_windows(&self, since_s: u64, until_s: u64, window_s: u64) -> Result<Vec<Window>, OutboxError> {
        let window_s = window_s.max(BUCKET_S) / BUCKET_S * BUCKET_S;
        let tx = self.db.begin_read().map_err(db)?;
        let table = tx.open_table(COUNTS).map_err(db)?;
        let mut out: BTreeMap<(String, u64), Window> = BTreeMap::new();
        let from = since_s / BUCKET_S * BUCKET_S;
        for entry in table.range((from, "", "")..(until_s, "", "")).map_err(db)? {
            let (k, v) = entry.map_err(db)?;
            let (bucket, topic, counter) = k.value();
            if bucket < since_s {
                continue;
            }
            let start = bucket / window_s * window_s;
            let w = out.entry((topic.to_string(), start)).or_insert_with(|| Window {
                topic: topic.to_string(),
                start: at(start),
                end: at(start + window_s),
                ..Window::default()
            });
            w.add(counter, v.value());
        }
        Ok(out.into_values().collect())
    }

    /// The last `n` windows of `window_s` that have counts, per topic (for `/stats`).
    ///
    /// # Errors
    /// Disk or database failure.
    pub fn reconcile_latest(&self, n: usize, window_s: u64) -> Result<Vec<Window>, OutboxError> {
        let last = {
            let tx = self.db.begin_read().map_err(db)?;
            let table = tx.open_table(COUNTS).map_err(db)?;
            let last = table.last().map_err(db)?;
            last.map(|(k, _)| k.value().0)
        };
        let Some(last) = last else { return Ok(Vec::new()) };
        let window_s = window_s.max(BUCKET_S) / BUCKET_S * BUCKET_S;
        let end = (last / window_s + 1) * window_s;
        let since = end.saturating_sub(n as u64 * window_s);
        // The span holds n windows, so each topic has at most n (a quiet one fewer).
        self.reconcile_windows(since, end, window_s)
    }

    /// Forgets the buckets that start before `cutoff_s` (Unix seconds). Returns how many
    /// counters were removed.
    ///
    /// # Errors
    /// Disk or database failure.
    pub fn prune_reconcile(&self, cutoff_s: u64) -> Result<usize, OutboxError> {
        let mut tx = self.db.begin_write().map_err(db)?;
        // Not synced: a prune lost in a crash is done again a minute later.
        tx.set_durability(redb::Durability::None).map_err(db)?;
        let n = {
            let mut table = tx.open_table(COUNTS).map_err(db)?;
            let mut n = 0;
            table
                .retain_in((0, "", "")..(cutoff_s, "", ""), |_, _| {
                    n += 1;
                    false
                })
                .map_err(db)?;
            n
        };
        tx.commit().map_err(db)?;
        Ok(n)
    }
}

fn at(s: u64) -> DateTime<Utc> {
    DateTime::from_timestamp(i64::try_from(s).unwrap_or(i64::MAX), 0).unwrap_or_default()
}
