//! The outbox across its files: order, dedupe and state across reopens, prunes, rows.

use super::schema::LEGACY_JOBS;
use super::*;
use crate::model::{DeadLetter, DeadLetterReason, SourceRef, StoredJob};
use cdc::ChargeStatus;
use device_protocol::EffectKind;
use device_protocol::Job;

fn job(id: &str) -> Job {
    crate::test_fixtures::job(id, EffectKind::PrintReceipt, "c")
}

fn src(offset: i64) -> SourceRef {
    SourceRef { topic: "charge.upserted".into(), partition: 0, offset, key: Some("c".into()) }
}

#[test]
fn survives_reopen_with_order_dedupe_and_state() {
    let dir = crate::test_fixtures::TempDir::new("outbox-test");
    let path = dir.outbox_path();
    {
        let o = Outbox::open(&path).unwrap();
        let st = ChargeState { version: 3, status: ChargeStatus::Completed };
        let q = o
            .accept(
                Some(("c", st)),
                vec![("p".into(), job("a")), ("p".into(), job("b")), ("t".into(), job("x"))],
                &src(1),
                1000,
            )
            .unwrap();
        assert_eq!(
            q.iter().map(|q| (q.stored.device.as_str(), q.stored.job.seq)).collect::<Vec<_>>(),
            [("p", 1), ("p", 2), ("t", 1)]
        );
        // The same record read again after a crash: nothing new is queued.
        assert!(o.accept(None, vec![("p".into(), job("a"))], &src(1), 2000).unwrap().is_empty());
        o.complete("p", 1, true).unwrap();
    }
    let o = Outbox::open(&path).unwrap();
    let pending = o.pending().unwrap();
    assert_eq!(
        pending.iter().map(|s| (s.job.message_id.as_str(), s.job.seq)).collect::<Vec<_>>(),
        [("b", 2), ("x", 1)]
    );
    assert_eq!(pending[0].source, src(1));
    assert_eq!(o.charge("c").unwrap(), Some(ChargeState { version: 3, status: ChargeStatus::Completed }));
    assert_eq!(o.charge("other").unwrap(), None);
    // Sequence numbers continue after a restart; a completed id stays deduped.
    let q = o.accept(None, vec![("p".into(), job("a")), ("p".into(), job("c"))], &src(2), 3000).unwrap();
    assert_eq!(q.iter().map(|q| (q.stored.job.message_id.as_str(), q.stored.job.seq)).collect::<Vec<_>>(), [("c", 3)]);
    // After the dedupe window, the id is forgotten.
    assert_eq!(o.prune_seen(2500).unwrap(), 3);
    assert_eq!(o.accept(None, vec![("p".into(), job("a"))], &src(3), 4000).unwrap().len(), 1);
}

/// A prune larger than one transaction ([`PRUNE_CHUNK`]) forgets exactly the ids older
/// than the cutoff, in every chunk, and keeps the rest.
#[test]
fn prune_seen_forgets_only_old_ids_across_chunks() {
    let (_dir, o) = crate::test_fixtures::temp_outbox("outbox-prune");
    let old: Vec<(String, Job)> =
        (0..PRUNE_CHUNK * 2 + 7).map(|i| ("p".to_string(), job(&format!("old{i}")))).collect();
    let young: Vec<(String, Job)> = (0..10).map(|i| ("p".to_string(), job(&format!("young{i}")))).collect();
    assert_eq!(o.accept(None, old.clone(), &src(1), 1_000).unwrap().len(), old.len());
    assert_eq!(o.accept(None, young.clone(), &src(2), 5_000).unwrap().len(), young.len());
    assert_eq!(o.prune_seen(2_000).unwrap(), old.len());
    assert_eq!(o.prune_seen(2_000).unwrap(), 0, "nothing left to forget");
    assert_eq!(o.accept(None, old.clone(), &src(3), 6_000).unwrap().len(), old.len(), "forgotten ids are new again");
    assert!(o.accept(None, young, &src(4), 6_000).unwrap().is_empty(), "ids inside the window stay deduped");
}

/// The prune reads only events older than the cutoff, and forgets an id by when it
/// was accepted: an old event accepted late (a backlog) stays a full window.
#[test]
fn prune_seen_goes_by_event_time_then_acceptance() {
    let (_dir, o) = crate::test_fixtures::temp_outbox("outbox-prune-time");
    let accept = |id: &str, event_secs: u64, now_ms: u64| {
        let mut a = [Accept {
            jobs: vec![("p".into(), job(id))],
            source: Some(src(1)),
            event_time: (event_secs << 32) | 7,
            ..Accept::default()
        }];
        o.write(&mut a, &[], now_ms).unwrap().pop().unwrap().0.len()
    };
    assert_eq!(accept("old", 10, 20_000), 1);
    assert_eq!(accept("late", 10, 500_000), 1);
    // A gateway clock behind the database's: accepted "before" its event.
    assert_eq!(accept("skewed", 200, 50_000), 1);
    assert_eq!(accept("old", 10, 30_000), 0, "deduped within the window");
    assert_eq!(o.prune_seen(100_000).unwrap(), 1);
    assert_eq!(accept("old", 10, 600_000), 1, "forgotten: new again");
    assert_eq!(accept("late", 10, 600_000), 0, "accepted late: still in the window");
    assert_eq!(accept("skewed", 200, 600_000), 0, "an event after the cutoff is not pruned");
}

/// What the outbox hands the dispatcher is what it stored: the wire bytes are the job's
/// JSON with its `seq` and payload, read back the same by [`Outbox::wire`], and the
/// header is the same job without its payload.
#[test]
fn queued_wire_bytes_are_the_stored_job() {
    let (_dir, o) = crate::test_fixtures::temp_outbox("outbox-wire");
    let mut j = job("w");
    j.payload = Job::encode_payload(b"\x1b@receipt");
    let q = o.accept(None, vec![("p".into(), j.clone()), ("p".into(), job("v"))], &src(7), 1).unwrap();
    let sent: Job = serde_json::from_slice(&q[0].wire).unwrap();
    assert_eq!(sent, Job { seq: 1, ..j.clone() });
    assert_eq!(q[0].stored.job, Job { seq: 1, payload: String::new(), ..j });
    assert_eq!((q[0].stored.device.as_str(), &q[0].stored.source), ("p", &src(7)));
    assert_eq!(o.wire("p", 1).unwrap().as_ref(), Some(&q[0].wire));
    assert_eq!(o.wire("p", 2).unwrap().as_ref(), Some(&q[1].wire));
    assert_eq!(o.wire("p", 3).unwrap(), None);
    assert_eq!(o.device_jobs("p").unwrap()[0], StoredJob { device: "p".into(), job: sent, source: src(7) });
}

/// A record read again (its offset not committed before a crash) parks none of its
/// dead letters twice: they keep the ids of its first read, and Kafka gets each once.
/// Two dead letters of one record that look alike are both kept. Once pruned at its
/// retention, the record's dead letter is forgotten like a job's id.
#[test]
fn a_record_read_again_parks_its_dead_letters_once() {
    let (_dir, o) = crate::test_fixtures::temp_outbox("outbox-dl-once");
    let record = |offset: i64| {
        let dl = |device: &str| {
            let mut d = DeadLetter::new(
                crate::model::DeadLetterReason::InvalidBrcode,
                "x".into(),
                "charge.upserted",
                0,
                offset,
                Some(b"c"),
                b"{}",
            );
            d.device = Some(device.into());
            d.effect = Some("display_qr".into());
            d
        };
        Accept { deadletters: vec![dl("t1"), dl("t2"), dl("t2")], source: Some(src(offset)), ..Accept::default() }
    };
    let parked = |o: &Outbox| o.parked_deadletters(100).unwrap().into_iter().map(|d| d.id).collect::<Vec<_>>();
    let (_, first) = o.write(&mut [record(5)], &[], 1_000).unwrap().pop().unwrap();
    assert_eq!(first, [1, 2, 3], "alike dead letters of one record are all kept");
    let (_, again) = o.write(&mut [record(5)], &[], 2_000).unwrap().pop().unwrap();
    assert!(again.is_empty(), "read again: nothing parked twice");
    assert_eq!(parked(&o), [1, 2, 3]);
    let (_, next) = o.write(&mut [record(6)], &[], 3_000).unwrap().pop().unwrap();
    assert_eq!(next, [4, 5, 6], "another record's are new");
    o.mark_published(&[1, 2, 3, 4, 5, 6], 4_000).unwrap();
    assert_eq!(o.prune_deadletters(2_500).unwrap(), 3);
    let (_, after) = o.write(&mut [record(5)], &[], 5_000).unwrap().pop().unwrap();
    assert_eq!(after, [7, 8, 9], "pruned: the record's dead letters are new again");
    let (_, kept) = o.write(&mut [record(6)], &[], 5_000).unwrap().pop().unwrap();
    assert!(kept.is_empty(), "not pruned: still known");
}

/// The row of job `id` queued as `seq`.
fn queued_row(id: &str, seq: u64) -> Vec<u8> {
    let mut j = job(id);
    j.seq = seq;
    schema::encode_row(&src(seq as i64), &j).unwrap().0
}

/// Writes a file of the earlier queue layout (`jobs`: (device, seq) → row) holding `rows`.
fn legacy_file(path: &std::path::Path, rows: &[(&str, u64, Vec<u8>)]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let db = redb::Database::create(path).unwrap();
    let tx = db.begin_write().unwrap();
    {
        let mut t = tx.open_table(LEGACY_JOBS).unwrap();
        for (device, seq, row) in rows {
            t.insert((*device, *seq), row.as_slice()).unwrap();
        }
    }
    tx.commit().unwrap();
}

/// An outbox whose job rows are in the earlier format (the whole stored job as JSON) is
/// refused with a reason that says so, not read as garbage.
#[test]
fn rows_of_the_earlier_format_are_refused_by_name() {
    let dir = crate::test_fixtures::TempDir::new("outbox-old-row");
    let old = serde_json::to_vec(&StoredJob { device: "p".into(), job: job("a"), source: src(1) }).unwrap();
    legacy_file(&dir.outbox_path(), &[("p", 1, old)]);
    let o = Outbox::open(&dir.outbox_path()).unwrap();
    let e = o.pending_headers().unwrap_err().to_string();
    assert!(e.contains("earlier pixgate"), "{e}");
    assert!(o.wire("p", 1).unwrap_err().to_string().contains("earlier pixgate"));
}

/// The queues of a file in the earlier layout are moved at open, in order, and go on from
/// there; the moved file is one an earlier pixgate refuses rather than reads as empty.
#[test]
fn queues_of_the_earlier_layout_are_moved_at_open() {
    let dir = crate::test_fixtures::TempDir::new("outbox-layout");
    legacy_file(
        &dir.outbox_path(),
        &[("p", 3, queued_row("p3", 3)), ("p", 7, queued_row("p7", 7)), ("q", 1, queued_row("q1", 1))],
    );
    let o = Outbox::open(&dir.outbox_path()).unwrap();
    let ids = |o: &Outbox| {
        o.pending().unwrap().into_iter().map(|s| (s.device, s.job.seq, s.job.message_id)).collect::<Vec<_>>()
    };
    let want = vec![("p".to_string(), 3, "p3".to_string()), ("p".into(), 7, "p7".into()), ("q".into(), 1, "q1".into())];
    assert_eq!(ids(&o), want);
    assert_eq!(o.queue_depths().unwrap(), [("p".to_string(), 2), ("q".to_string(), 1)].into());
    assert_eq!(o.wire("p", 7).unwrap().unwrap(), split_wire(&queued_row("p7", 7)));
    o.complete("p", 3, false).unwrap();
    drop(o);
    let o = Outbox::open(&dir.outbox_path()).unwrap();
    assert_eq!(ids(&o), want[1..].to_vec(), "opened again: nothing moved twice");
    let tx = o.db.begin_read().unwrap();
    let names: Vec<String> = tx.list_tables().unwrap().map(|t| redb::TableHandle::name(&t).to_string()).collect();
    assert!(!names.iter().any(|n| n.contains("moved")), "nothing left of the move: {names:?}");
    let refused = tx.open_table(LEGACY_JOBS).map(|_| ()).unwrap_err();
    assert!(matches!(refused, redb::TableError::TableTypeMismatch { .. }), "{refused}");
}

/// A counted record (a tally) at event time `event_time_s` queueing `jobs`.
fn counted(offset: i64, event_time_s: u64, jobs: Vec<(String, Job)>) -> Accept {
    Accept {
        jobs,
        source: Some(src(offset)),
        tally: Some(crate::store::reconcile::RecordTally { event_time_s, counters: Vec::new() }),
        ..Accept::default()
    }
}

/// Every (topic, window start, counter, count) the file holds, in windows of a minute.
fn counts(o: &Outbox) -> Vec<(String, u64, String, u64)> {
    let mut out = Vec::new();
    for w in o.reconcile_windows(0, u64::MAX / 2, 60).unwrap() {
        let start = w.start.timestamp() as u64;
        out.push((w.topic.clone(), start, "read".to_string(), w.read));
        for (kind, n) in &w.queued {
            out.push((w.topic.clone(), start, format!("queued:{kind}"), *n));
        }
        for (kind, n) in &w.delivered {
            out.push((w.topic.clone(), start, format!("delivered:{kind}"), *n));
        }
        for (kind, n) in &w.expired {
            out.push((w.topic.clone(), start, format!("expired:{kind}"), *n));
        }
        if w.superseded > 0 {
            out.push((w.topic.clone(), start, "superseded".to_string(), w.superseded));
        }
    }
    out
}

/// The counts of jobs that left their queue: `delivered:KIND` and `superseded`.
fn counts_leaving(o: &Outbox) -> Vec<(String, u64, String, u64)> {
    counts(o).into_iter().filter(|c| c.2.starts_with("delivered:") || c.2 == "superseded").collect()
}

/// (device, seq, row, reconciliation link as `reconcile_jobs` holds it).
type LinkedRow<'a> = (&'a str, u64, Vec<u8>, Option<(&'a str, u64, &'a str)>);

/// Writes a file of the second queue layout (`job_rows`, the index `jobs`, `job_live` key →
/// (device, seq)), its reconciliation links in `reconcile_jobs`: `jobs` is (device, seq,
/// row, link).
fn second_layout_file(path: &std::path::Path, jobs: &[LinkedRow]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let db = redb::Database::create(path).unwrap();
    let tx = db.begin_write().unwrap();
    {
        let mut rows = tx.open_table(schema::JOB_ROWS).unwrap();
        let mut index = tx.open_table(schema::JOB_INDEX).unwrap();
        let mut live = tx.open_table(schema::LEGACY_JOB_LIVE).unwrap();
        let mut links = tx.open_table(schema::LEGACY_RECONCILE_JOBS).unwrap();
        for (key, (device, seq, row, link)) in (1u64..).zip(jobs) {
            rows.insert(key, row.as_slice()).unwrap();
            index.insert((*device, *seq), key).unwrap();
            live.insert(key, (*device, *seq)).unwrap();
            if let Some(link) = link {
                links.insert((*device, *seq), *link).unwrap();
            }
        }
    }
    tx.commit().unwrap();
}

/// A file of the second layout has its reconciliation links moved into `job_live` at open:
/// a linked job counts in its record's minute when it leaves, an unlinked one (replayed)
/// nowhere; and the moved file is one that layout's pixgate refuses rather than reads as
/// holding no queued row.
#[test]
fn links_of_the_second_layout_move_into_job_live_at_open() {
    let dir = crate::test_fixtures::TempDir::new("outbox-layout-links");
    second_layout_file(
        &dir.outbox_path(),
        &[
            ("p", 1, queued_row("p1", 1), Some(("charge.upserted", 1_700_000_040, "print_receipt"))),
            ("p", 2, queued_row("p2", 2), Some(("charge.upserted", 1_700_000_100, "print_receipt"))),
            ("q", 1, queued_row("q1", 1), None),
        ],
    );
    let o = Outbox::open(&dir.outbox_path()).unwrap();
    let ids: Vec<String> = o.pending().unwrap().into_iter().map(|s| s.job.message_id).collect();
    assert_eq!(ids, ["p1", "p2", "q1"]);
    o.complete("p", 1, false).unwrap();
    o.complete("q", 1, false).unwrap();
    let p2 = o.device_jobs("p").unwrap().remove(0);
    let dl = DeadLetter::for_job(crate::model::DeadLetterReason::Expired, "late".into(), &p2);
    o.fail_job(&p2, dl, 0).unwrap();
    let delivered = ("charge.upserted".to_string(), 1_700_000_040, "delivered:print_receipt".to_string(), 1);
    let expired = ("charge.upserted".to_string(), 1_700_000_100, "expired:print_receipt".to_string(), 1);
    let got: Vec<_> = counts(&o).into_iter().filter(|c| c.3 > 0).collect();
    assert_eq!(got, [delivered, expired], "each in its minute; q1, unlinked, nowhere");
    drop(o);
    let db = redb::Database::open(dir.outbox_path()).unwrap();
    let tx = db.begin_write().unwrap();
    let names: Vec<String> = tx.list_tables().unwrap().map(|t| redb::TableHandle::name(&t).to_string()).collect();
    assert!(!names.iter().any(|n| n.contains("moved") || n == "reconcile_jobs"), "{names:?}");
    let refused = tx.open_table(schema::LEGACY_JOB_LIVE).map(|_| ()).unwrap_err();
    assert!(matches!(refused, redb::TableError::TableTypeMismatch { .. }), "{refused}");
}

/// `pixgate outbox downgrade` writes the queues back in the earlier layout, as an earlier
/// pixgate reads them, and this version moves them again at its next open; the
/// reconciliation links go back to `reconcile_jobs` and come again.
#[test]
fn a_downgraded_file_has_its_queues_in_the_earlier_layout() {
    let (dir, o) = crate::test_fixtures::temp_outbox("outbox-downgrade");
    let jobs = vec![("p".into(), job("p1")), ("q".into(), job("q1")), ("p".into(), job("p2"))];
    o.write(&mut [counted(4, 1_700_000_059, jobs)], &[], 0).unwrap();
    o.complete("p", 1, false).unwrap();
    let want = o.pending().unwrap();
    let busy = downgrade(&dir.outbox_path()).unwrap_err();
    assert!(busy.to_string().contains("in use by a running gateway"), "{busy}");
    drop(o);
    assert_eq!(downgrade(&dir.outbox_path()).unwrap(), Some(2));
    assert_eq!(downgrade(&dir.outbox_path()).unwrap(), None, "already in that layout");
    {
        use redb::{ReadableDatabase, ReadableTable};
        let db = redb::Database::open(dir.outbox_path()).unwrap();
        let tx = db.begin_read().unwrap();
        let t = tx.open_table(LEGACY_JOBS).unwrap();
        let rows: Vec<(String, u64, StoredJob)> = t
            .iter()
            .unwrap()
            .map(|e| {
                let (k, v) = e.unwrap();
                let (device, seq) = k.value();
                (device.to_string(), seq, schema::decode_row(device, v.value()).unwrap())
            })
            .collect();
        let got: Vec<(String, u64, StoredJob)> =
            want.iter().map(|s| (s.device.clone(), s.job.seq, s.clone())).collect();
        assert_eq!(rows, got, "row for row, under (device, seq)");
        assert!(tx.open_table(schema::JOB_ROWS).is_err(), "no table of this layout left");
        let names: Vec<String> = tx.list_tables().unwrap().map(|t| redb::TableHandle::name(&t).to_string()).collect();
        assert!(
            !names.iter().any(|n| n.starts_with("job_") || n.contains("moved") || n == "reconcile_names"),
            "{names:?}"
        );
        let links: Vec<(String, u64, String, u64, String)> = tx
            .open_table(schema::LEGACY_RECONCILE_JOBS)
            .unwrap()
            .iter()
            .unwrap()
            .map(|e| {
                let (k, v) = e.unwrap();
                let ((device, seq), (topic, bucket, kind)) = (k.value(), v.value());
                (device.to_string(), seq, topic.to_string(), bucket, kind.to_string())
            })
            .collect();
        let link = |device: &str, seq| {
            (device.to_string(), seq, "charge.upserted".to_string(), 1_700_000_040, "print_receipt".to_string())
        };
        assert_eq!(links, [link("p", 2), link("q", 1)], "the queued jobs' links, by (device, seq)");
    }
    let o = Outbox::open(&dir.outbox_path()).unwrap();
    assert_eq!(o.pending().unwrap(), want, "moved back at the next open");
    o.complete("q", 1, false).unwrap();
    assert_eq!(
        counts_leaving(&o),
        [("charge.upserted".to_string(), 1_700_000_040, "delivered:print_receipt".to_string(), 2)],
        "p1 before the downgrade, q1 after: both in their record's minute"
    );
}

fn split_wire(row: &[u8]) -> bytes::Bytes {
    bytes::Bytes::copy_from_slice(schema::split_row(row).unwrap().1)
}

/// A record dead-lettered because its charge's stored state could not be read (a disk
/// read error) is routed again by a replay, as one that waited for the registry is: the
/// outbox alone refuses it for the running gateway, not as a record without a job.
#[test]
fn a_record_whose_charge_state_was_unreadable_is_routed_again_by_the_gateway() {
    let (_dir, o) = crate::test_fixtures::temp_outbox("outbox-replay-unreadable");
    let dead = |reason, offset| DeadLetter::new(reason, "x".into(), "charge.upserted", 0, offset, Some(b"c"), b"{}");
    let mut batch = [
        Accept {
            deadletters: vec![dead(DeadLetterReason::ChargeStateUnreadable, 9)],
            ..counted(9, 1_700_000_040, vec![])
        },
        Accept { deadletters: vec![dead(DeadLetterReason::NotJson, 10)], ..counted(10, 1_700_000_040, vec![]) },
    ];
    o.write(&mut batch, &[], 1_000).unwrap();
    let parked = o.parked_deadletters(10).unwrap();
    let id_of = |offset| parked.iter().find(|p| p.dead_letter.source_offset == offset).unwrap().id;
    let ttl = |_| chrono::Duration::seconds(60);
    assert!(matches!(o.replay(id_of(9), 2_000, ttl), Err(ReplayError::NeedsGateway(_))));
    assert!(matches!(o.replay(id_of(10), 2_000, ttl), Err(ReplayError::NoJob { .. })));
    assert!(DeadLetterReason::ChargeStateUnreadable.routes_again() && DeadLetterReason::UnknownTerminal.routes_again());
    assert!(!DeadLetterReason::NotJson.routes_again());
}

/// A salvage of an outbox that is not damaged copies it whole and names nothing lost. It
/// refuses a file a gateway holds open, and never writes over a file.
#[test]
fn salvage_of_an_intact_outbox_copies_it_whole() {
    let (dir, o) = crate::test_fixtures::temp_outbox("outbox-salvage");
    let st = ChargeState { version: 4, status: ChargeStatus::Active };
    let jobs: Vec<(String, Job)> = (0..300).map(|i| (format!("d{}", i % 7), job(&format!("m{i}")))).collect();
    o.write(&mut [Accept { charge: Some(("c".into(), st)), ..counted(9, 1_700_000_040, jobs) }], &[], 1_000).unwrap();
    o.complete("d1", 1, true).unwrap();
    let new = dir.path().join("salvaged.redb");
    let busy = salvage(&dir.outbox_path(), &new).unwrap_err();
    assert!(busy.to_string().contains("in use by a running gateway"), "{busy}");
    assert!(!new.exists());
    let want = o.pending().unwrap().into_iter().map(|s| (s.device, s.job.seq, s.job.message_id)).collect::<Vec<_>>();
    let last_d2 = o.device_jobs("d2").unwrap().last().unwrap().job.seq;
    drop(o);
    let s = salvage(&dir.outbox_path(), &new).unwrap();
    assert!(s.lost_jobs.is_empty() && s.lost_jobs_complete && s.replay_from_s.is_none(), "{s:?}");
    assert_eq!(s.jobs_kept, 299);
    assert!(s.tables.iter().all(|t| t.damage.is_none()), "{s:?}");
    assert!(matches!(salvage(&dir.outbox_path(), &new), Err(OutboxError::Folder(_))), "the new file is kept");
    let copy = Outbox::open_with_cache(&new, crate::config::DEFAULT_CACHE_BYTES, true).unwrap();
    let got = copy.pending().unwrap().into_iter().map(|s| (s.device, s.job.seq, s.job.message_id)).collect::<Vec<_>>();
    assert_eq!(got, want);
    assert_eq!(copy.charge("c").unwrap(), Some(st), "charge states kept when nothing was lost");
    // The dedupe window came along: an id accepted before is not queued again.
    assert!(copy.accept(None, vec![("d2".into(), job("m2"))], &src(9), 2_000).unwrap().is_empty());
    // Seqs go on from where they were.
    let q = copy.accept(None, vec![("d2".into(), job("new"))], &src(10), 2_000).unwrap();
    assert_eq!(q[0].stored.job.seq, last_d2 + 1);
    // The reconciliation links came along: a job leaving counts in its record's minute.
    copy.complete("d2", 1, false).unwrap();
    let count = |counter: &str| ("charge.upserted".to_string(), 1_700_000_040, counter.to_string(), 1);
    assert_eq!(
        counts_leaving(&copy),
        [count("delivered:print_receipt"), count("superseded")],
        "d1 before the salvage, d2 after"
    );
}

/// A printer whose `seq` row is lost and whose queue is empty goes on after its mark:
/// restarted at 1, its next jobs would be at or below the mark's seq, which the printer
/// takes as printed.
#[test]
fn salvage_keeps_a_printers_seq_past_its_mark() {
    let (dir, o) = crate::test_fixtures::temp_outbox("outbox-salvage-mark");
    let jobs: Vec<(String, Job)> = (0..3).map(|i| ("p".to_string(), job(&format!("m{i}")))).collect();
    o.write(&mut [counted(9, 1_700_000_040, jobs)], &[], 1_000).unwrap();
    for n in 1..=3 {
        o.complete("p", n, false).unwrap();
    }
    o.mark_direct("p", &DirectMark { seq: 3, message_id: "m2".into(), done: true }).unwrap();
    {
        let tx = o.db.begin_write().unwrap();
        tx.open_table(schema::SEQ).unwrap().remove("p").unwrap();
        tx.commit().unwrap();
    }
    drop(o);
    let new = dir.path().join("salvaged.redb");
    salvage(&dir.outbox_path(), &new).unwrap();
    let copy = Outbox::open_with_cache(&new, crate::config::DEFAULT_CACHE_BYTES, true).unwrap();
    let q = copy.accept(None, vec![("p".into(), job("next"))], &src(10), 2_000).unwrap();
    assert_eq!(q[0].stored.job.seq, 4, "after the mark's 3");
}

/// A file of the second layout is salvaged with its reconciliation links, moved into
/// `job_live`.
#[test]
fn salvage_of_a_second_layout_file_keeps_its_links() {
    let dir = crate::test_fixtures::TempDir::new("outbox-salvage-second");
    let link = ("charge.upserted", 1_700_000_040, "print_receipt");
    second_layout_file(
        &dir.outbox_path(),
        &[("p", 1, queued_row("p1", 1), Some(link)), ("q", 1, queued_row("q1", 1), None)],
    );
    let new = dir.path().join("salvaged.redb");
    let s = salvage(&dir.outbox_path(), &new).unwrap();
    assert!(s.lost_jobs.is_empty() && s.lost_jobs_complete && s.jobs_kept == 2, "{s:?}");
    let copy = Outbox::open(&new).unwrap();
    copy.complete("p", 1, false).unwrap();
    copy.complete("q", 1, false).unwrap();
    assert_eq!(
        counts_leaving(&copy),
        [("charge.upserted".into(), 1_700_000_040, "delivered:print_receipt".into(), 1)],
        "p1's; q1 unlinked"
    );
}

/// A lost job whose minute is unknown (never linked) sends the reposition back to the
/// earliest event the file knows of, not to another lost job's later minute.
#[test]
fn a_lost_job_without_a_minute_sends_the_replay_back_to_the_earliest_known() {
    let dir = crate::test_fixtures::TempDir::new("outbox-salvage-unlinked");
    let link = |t| Some(("charge.upserted", t, "print_receipt"));
    second_layout_file(
        &dir.outbox_path(),
        &[
            ("k", 1, queued_row("k1", 1), link(1_700_000_040)),
            ("p", 1, queued_row("p1", 1), link(1_700_000_400)),
            ("q", 1, queued_row("q1", 1), None),
        ],
    );
    {
        // p1's and q1's rows (keys 2 and 3) gone; the lists still name them.
        let db = redb::Database::open(dir.outbox_path()).unwrap();
        let tx = db.begin_write().unwrap();
        tx.open_table(schema::JOB_ROWS).unwrap().retain_in(2..=3, |_, _| false).unwrap();
        tx.commit().unwrap();
    }
    let s = salvage(&dir.outbox_path(), &dir.path().join("salvaged.redb")).unwrap();
    let lost: Vec<_> = s.lost_jobs.iter().map(|j| (j.device.as_str(), j.seq, j.event_minute_s)).collect();
    assert_eq!(lost, [("p", 1, Some(1_700_000_400)), ("q", 1, None)]);
    assert_eq!(s.jobs_kept, 1);
    assert_eq!(s.replay_from_s, Some(1_700_000_040), "k1's minute, the earliest the file knows of");
}
