//! Bytes written to disk by the outbox's job rows, in redb's layouts and in fjall (an LSM
//! store).
//!
//! `cargo run --release --manifest-path storage-bench/Cargo.toml -- [TRANSACTIONS]`
//! appends rows the size of `outbox_drain`'s job rows (a receipt's 2,600–3,400 bytes of
//! payload, a QR screen's 700 or a confirmation's 400, each with some 330 bytes of JSON
//! and source position; base64-like bytes, as a job's payload is) keyed by acceptance
//! order, 280 rows a transaction made durable (`fdatasync`) as the outbox does each write,
//! and removes each transaction's rows four transactions later, as the drain's finished
//! jobs go. The stores and layouts, alternated twice in one process:
//! - redb, a value per row: the outbox's `job_rows`; the finished rows go in one range
//!   removal;
//! - redb, consecutive rows of a transaction packed into values of at most 4, 8, 16 and
//!   32 KiB, a value removed with its last row;
//! - fjall 3 with its defaults, the rows in one keyspace, each transaction a write batch
//!   persisted with `PersistMode::SyncData`, the finished rows removed one by one
//!   (tombstones); what it writes in the background within 2 s of the last transaction
//!   and at close counted.
//!
//! Prints the bytes written to disk (`/proc/self/io` `write_bytes`, less
//! `cancelled_write_bytes`) per row byte, the ratio to redb's value per row in the same
//! round, and CPU time per row (generating the rows included).
//!
//! fjall's figure is a floor: no row here outlives its 64 MiB memtable, so none reaches a
//! table file or a compaction, as a job queued for hours would. And `write_bytes` leaves
//! out the file system's own journal, which fjall's appends to new blocks cost more of
//! than redb's rewrites of blocks it has. The temporary folder must be on a disk, not
//! tmpfs, whose writes are not counted.
//!
//! Why redb writes more than the rows: it rewrites every page a transaction changes (copy
//! on write), splits an overfull leaf at half its bytes (redb 4.6, `btree_base.rs`
//! `build_split`) and allocates pages by powers of two from 4 KiB, so rows of 1–4 KiB
//! appended in order leave leaves partly empty, and the empty part is written too.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// Rows per transaction: `outbox_drain`'s 256 records, about 1.1 jobs each.
const ROWS_PER_TRANSACTION: u64 = 280;

/// Transactions a row stays before it is finished.
const FINISHED_AFTER: u64 = 4;

const ROWS: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("job_rows");

/// xorshift64: the same rows for every store.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }

    /// A job row: its payload as `outbox_drain` draws it, plus its JSON and source.
    fn row(&mut self) -> Vec<u8> {
        const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let payload = match self.below(3) {
            0 => 2_600 + self.below(800) as usize,
            1 => 700,
            _ => 400,
        };
        (0..payload + 330).map(|_| BASE64[self.below(64) as usize]).collect()
    }
}

/// Bytes this process had written to storage so far: `write_bytes` less
/// `cancelled_write_bytes` (`proc(5)`).
fn written() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    let field = |name: &str| {
        io.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(0)
    };
    field("write_bytes: ").saturating_sub(field("cancelled_write_bytes: "))
}

/// CPU time of this process so far (user and system, all threads).
fn cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let ticks: u64 = after.split_whitespace().skip(11).take(2).filter_map(|v| v.parse::<u64>().ok()).sum();
    // USER_HZ is 100 on Linux.
    Duration::from_millis(ticks * 10)
}

/// What one run measured.
struct Measured {
    row_bytes: u64,
    written: u64,
    rows: u64,
    cpu: Duration,
}

/// One store under the workload.
trait Store {
    /// Appends `rows` under keys from `first` on, removes the rows of keys below
    /// `finished`, and makes it durable.
    fn transaction(&mut self, first: u64, rows: &[Vec<u8>], finished: Option<std::ops::Range<u64>>);
    /// Closes the store, letting its background work end.
    fn close(self: Box<Self>);
}

/// redb; `pack`: a value holds consecutive rows up to this many bytes (0: a value per row).
struct Redb {
    db: redb::Database,
    pack: usize,
}

impl Store for Redb {
    fn transaction(&mut self, first: u64, rows: &[Vec<u8>], finished: Option<std::ops::Range<u64>>) {
        let tx = self.db.begin_write().expect("begin");
        {
            let mut table = tx.open_table(ROWS).expect("table");
            let (mut value, mut at) = (Vec::new(), first);
            for (i, row) in rows.iter().enumerate() {
                let key = first + i as u64;
                if self.pack == 0 {
                    table.insert(key, row.as_slice()).expect("insert");
                    continue;
                }
                // 8 bytes a row for the value's own index of where each row ends. The value
                // is written again as it grows: redb writes only its last state.
                if !value.is_empty() && value.len() + row.len() + 8 > self.pack {
                    value.clear();
                    at = key;
                }
                value.extend_from_slice(row);
                value.extend_from_slice(&[0; 8]);
                table.insert(at, value.as_slice()).expect("insert");
            }
            if let Some(finished) = finished {
                // Every value starting below the finished range's end holds finished rows
                // only: a transaction's values do not straddle transactions.
                table.retain_in(..finished.end, |_, _| false).expect("range removal");
            }
        }
        tx.commit().expect("commit");
    }

    fn close(self: Box<Self>) {}
}

struct Fjall {
    db: fjall::Database,
    rows: fjall::Keyspace,
}

impl Store for Fjall {
    fn transaction(&mut self, first: u64, rows: &[Vec<u8>], finished: Option<std::ops::Range<u64>>) {
        let mut batch = self.db.batch();
        for (i, row) in rows.iter().enumerate() {
            batch.insert(&self.rows, (first + i as u64).to_be_bytes(), row.as_slice());
        }
        for key in finished.into_iter().flatten() {
            batch.remove(&self.rows, key.to_be_bytes());
        }
        batch.commit().expect("commit");
        self.db.persist(fjall::PersistMode::SyncData).expect("persist");
    }

    fn close(self: Box<Self>) {
        // Background flushes and compactions of what was written.
        std::thread::sleep(Duration::from_secs(2));
        drop(self);
    }
}

/// A store and layout under comparison.
#[derive(Clone, Copy)]
enum Kind {
    /// redb, a value holding consecutive rows up to `pack` bytes (0: a value per row).
    Redb {
        pack: usize,
    },
    Fjall,
}

impl Kind {
    fn name(self) -> String {
        match self {
            Kind::Redb { pack: 0 } => "redb, a value per row".into(),
            // The leaf's header and the value's length come out of a pack: it fills its page.
            Kind::Redb { pack } => format!("redb, packs of at most {} KiB", (pack + 64) >> 10),
            Kind::Fjall => "fjall".into(),
        }
    }

    fn open(self, path: &Path) -> Box<dyn Store> {
        match self {
            Kind::Redb { pack } => {
                Box::new(Redb { db: redb::Database::create(path.join("outbox.redb")).expect("redb"), pack })
            }
            Kind::Fjall => {
                let db = fjall::Database::builder(path).open().expect("fjall");
                let rows = db.keyspace("job_rows", fjall::KeyspaceCreateOptions::default).expect("keyspace");
                Box::new(Fjall { db, rows })
            }
        }
    }
}

fn run(kind: Kind, dir: &Path, transactions: u64) -> Measured {
    let path = dir.join("store");
    let _ = std::fs::remove_dir_all(&path);
    std::fs::create_dir_all(&path).expect("store folder");
    let (before, cpu_before) = (written(), cpu());
    let mut store = kind.open(&path);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut row_bytes = 0;
    for t in 0..transactions {
        let rows: Vec<Vec<u8>> = (0..ROWS_PER_TRANSACTION).map(|_| rng.row()).collect();
        row_bytes += rows.iter().map(|r| r.len() as u64).sum::<u64>();
        let finished = t.checked_sub(FINISHED_AFTER).map(|f| f * ROWS_PER_TRANSACTION..(f + 1) * ROWS_PER_TRANSACTION);
        store.transaction(t * ROWS_PER_TRANSACTION, &rows, finished);
    }
    store.close();
    let written = written() - before;
    if written == 0 {
        eprintln!("no bytes written counted: is {} on tmpfs?", dir.display());
    }
    let measured = Measured { row_bytes, written, rows: transactions * ROWS_PER_TRANSACTION, cpu: cpu() - cpu_before };
    let _ = std::fs::remove_dir_all(&path);
    measured
}

fn main() {
    let transactions = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(400);
    let dir: PathBuf = std::env::temp_dir().join(format!("pixgate-storage-bench-{}", std::process::id()));
    println!(
        "{transactions} transactions of {ROWS_PER_TRANSACTION} rows, each finished {FINISHED_AFTER} transactions later; \
         bytes written per row byte (ratio to redb's value per row in the same round), CPU µs per row"
    );
    let kinds: Vec<Kind> = std::iter::once(Kind::Redb { pack: 0 })
        .chain([4, 8, 16, 32].map(|k| Kind::Redb { pack: (k << 10) - 64 }))
        .chain(std::iter::once(Kind::Fjall))
        .collect();
    for round in 1..=2 {
        let mut baseline = None;
        for &kind in &kinds {
            let m = run(kind, &dir, transactions);
            let ratio = m.written as f64 / m.row_bytes as f64;
            let base = *baseline.get_or_insert(ratio);
            println!(
                "round {round}: {}: {ratio:.2} ({:.2} ×), {:.1} µs",
                kind.name(),
                ratio / base,
                m.cpu.as_secs_f64() * 1e6 / m.rows as f64
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
