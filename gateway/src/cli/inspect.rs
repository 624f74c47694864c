//! `pixgate outbox list|show|check|salvage|downgrade` and `pixgate deadletter list|show|replay`.
//!
//! A redb file is open in one process at a time, so while the gateway runs these commands
//! ask it over HTTP (at `http.listen`); when it does not run they open the outbox file
//! themselves. Both paths print the same JSON ([`crate::ops::inspect`]). Over HTTP they
//! send the configured admin token (`http.admin_token` or `http.admin_token_file`,
//! [`crate::ops::admin`]).

use crate::clock::Clock;
use crate::config::Config;
use crate::ingest::replay::Replayed;
use crate::ops::inspect::{self, InspectError};
use crate::store::Outbox;
use anyhow::Context;
use clap::Subcommand;
use serde_json::{json, Value};

/// `pixgate outbox …`
#[derive(Debug, Subcommand)]
pub enum OutboxCmd {
    /// Devices with queued jobs and how many; with DEVICE, that device's jobs in delivery order.
    List {
        /// A device id.
        device: Option<String>,
    },
    /// One queued job in full (payload base64, as the device receives it).
    Show {
        /// Device id.
        device: String,
        /// The job's seq.
        seq: u64,
    },
    /// Verifies the checksum of every page of an outbox file (redb's integrity check, as
    /// `outbox.check_on_open` does at start) and reads every queued job: exit status 0 and
    /// what it holds when intact, 1 with what is damaged otherwise. On a stopped gateway's
    /// file, or a copy: a running gateway holds its file locked.
    Check {
        /// The file (`outbox.path` by default).
        file: Option<std::path::PathBuf>,
    },
    /// Copies what can still be read of a damaged outbox into a new file and lists what
    /// could not be read: the queued jobs lost (device, seq, kind, event minute) and how to
    /// have them again (`pixgate kafka reposition --to-time`). The damaged file is only
    /// read. Exit status 0 when nothing was lost, 2 when the new file was written without
    /// some of it, 1 when none could be written.
    Salvage {
        /// The damaged outbox.
        damaged: std::path::PathBuf,
        /// The new outbox to write (must not exist).
        new: std::path::PathBuf,
    },
    /// Rewrites a stopped gateway's outbox with its queues in the earlier layout (rows
    /// under (device, seq)), for a pixgate built before the queues were kept in acceptance
    /// order. Any command of this version that opens the file afterwards moves them back.
    /// Exit status 0 when written or nothing to do, 1 when it failed (no file, a gateway
    /// holds it, a disk error).
    Downgrade {
        /// The file (`outbox.path` by default).
        file: Option<std::path::PathBuf>,
    },
}

/// `pixgate deadletter …`
#[derive(Debug, Subcommand)]
pub enum DeadLetterCmd {
    /// Dead letters the outbox holds (parked until Kafka has them, then kept for
    /// `outbox.deadletter_retention_hours`), oldest first.
    List,
    /// One dead letter in full.
    Show {
        /// Its id.
        id: u64,
    },
    /// Puts the job of a dead letter (delivery failed, expired) back at the end of its
    /// device's queue, with its original message id; routes the record of an
    /// `unknown_terminal` or `terminal_of_another_company` dead letter again with the
    /// running gateway's device registry. Once per dead letter.
    Replay {
        /// Its id.
        id: u64,
    },
}

/// Where an inspection asks: the running gateway's HTTP listener, with the admin token
/// if one is configured, and the outbox file for when no gateway answers.
pub struct Target<'a> {
    /// `http.listen`.
    pub http_listen: &'a str,
    /// The admin token sent as `Authorization: Bearer …`.
    pub admin_token: Option<&'a str>,
    /// `outbox.path`.
    pub path: &'a std::path::Path,
}

/// Runs an inspection: over HTTP against the running gateway at `target.http_listen`, or,
/// when nothing answers there, on the outbox file at `target.path`. Prints JSON; returns
/// whether it succeeded (exit status 1 otherwise, with the error on stderr).
///
/// # Errors
/// Neither the gateway nor the outbox file could be reached.
pub async fn run(
    target: &Target<'_>,
    http_path: String,
    method_post: bool,
    local: impl FnOnce(&Outbox) -> Result<Value, InspectError>,
) -> anyhow::Result<bool> {
    let (ok, body) = fetch(target, http_path, method_post, local).await?;
    print_result(ok, &body);
    Ok(ok)
}

/// [`run`] without printing: whether it succeeded, and the JSON answered (`{"error": …}`
/// when it did not).
///
/// # Errors
/// Neither the gateway nor the outbox file could be reached.
pub async fn fetch(
    target: &Target<'_>,
    http_path: String,
    method_post: bool,
    local: impl FnOnce(&Outbox) -> Result<Value, InspectError>,
) -> anyhow::Result<(bool, Value)> {
    let (http_listen, path) = (target.http_listen, target.path);
    let url = format!("http://{http_listen}{http_path}");
    let client = reqwest::Client::builder().timeout(std::time::Duration::from_secs(10)).build()?;
    let mut req = if method_post { client.post(&url) } else { client.get(&url) };
    if let Some(token) = target.admin_token {
        req = req.bearer_auth(token);
    }
    match req.send().await {
        Ok(resp) => {
            let ok = resp.status().is_success();
            let body: Value = resp.json().await?;
            Ok((ok, body))
        }
        Err(e) if e.is_connect() => {
            let outbox = Outbox::open(path).map_err(|oe| {
                anyhow::anyhow!(
                    "no gateway answers at {url} ({e}) and the outbox {} cannot be opened: {oe}",
                    path.display()
                )
            })?;
            match local(&outbox) {
                Ok(v) => Ok((true, v)),
                Err(e) => Ok((false, json!({ "error": e.to_string() }))),
            }
        }
        Err(e) => Err(e.into()),
    }
}

/// `pixgate outbox check`: opens the outbox at `path` with redb's integrity check and reads
/// every queued job's row back. Returns a line saying what it holds.
///
/// # Errors
/// No such file (one is not created), locked by a running gateway, damaged
/// ([`crate::store::OutboxError::Damaged`]), or a row that does not read back.
pub fn check(path: &std::path::Path) -> anyhow::Result<String> {
    anyhow::ensure!(path.is_file(), "no outbox file at {}", path.display());
    let outbox = Outbox::open_with_cache(path, crate::config::DEFAULT_CACHE_BYTES, true)?;
    let jobs = outbox.pending().with_context(|| format!("reading the queued jobs of {}", path.display()))?;
    let devices = jobs.iter().map(|j| j.device.as_str()).collect::<std::collections::BTreeSet<_>>().len();
    let deadletters =
        outbox.deadletters().with_context(|| format!("reading the dead letters of {}", path.display()))?;
    Ok(format!(
        "the outbox {} is intact: every page passes its checksum; {} jobs queued for {devices} devices, {} dead letters",
        path.display(),
        jobs.len(),
        deadletters.len()
    ))
}

/// Prints a file command's summary, or its error on stderr and exits 1.
fn say_or_exit(result: anyhow::Result<String>) {
    match result {
        Ok(summary) => println!("{summary}"),
        Err(e) => {
            eprintln!("{e:#}");
            std::process::exit(1);
        }
    }
}

/// `pixgate outbox downgrade`: runs [`crate::store::outbox::downgrade`]; says what it did.
///
/// # Errors
/// No file at `path`, or as [`crate::store::outbox::downgrade`].
pub fn downgrade(path: &std::path::Path) -> anyhow::Result<String> {
    anyhow::ensure!(path.is_file(), "no outbox file at {}", path.display());
    let n = crate::store::outbox::downgrade(path).with_context(|| format!("downgrading {}", path.display()))?;
    Ok(match n {
        None => format!("the outbox {} has its queues in the earlier layout already: nothing to do", path.display()),
        Some(n) => format!(
            "the outbox {} has its {n} queued jobs in the earlier layout: an earlier pixgate can run on it (opened by this one, by any command, it moves them back)",
            path.display()
        ),
    })
}

/// `pixgate outbox salvage`: runs [`crate::store::outbox::salvage`] and says what it did,
/// table by table, then the jobs lost and the reposition that reads them again. Returns
/// the report and whether anything was lost.
///
/// # Errors
/// As [`crate::store::outbox::salvage`].
pub fn salvage(damaged: &std::path::Path, new: &std::path::Path) -> anyhow::Result<(String, bool)> {
    use std::fmt::Write as _;
    anyhow::ensure!(damaged.is_file(), "no outbox file at {}", damaged.display());
    let s = crate::store::outbox::salvage(damaged, new)
        .with_context(|| format!("salvaging {} into {}", damaged.display(), new.display()))?;
    let mut out = format!("salvaged what could be read of {} into {}\n", damaged.display(), new.display());
    for t in &s.tables {
        let damage = t.damage.as_deref().map_or_else(|| "read whole".to_string(), |d| format!("DAMAGED: {d}"));
        let _ = writeln!(out, "  {:<22} {:>8} copied  {damage}", t.table, t.copied);
    }
    let lost = !s.lost_jobs.is_empty() || !s.lost_jobs_complete || s.tables.iter().any(|t| t.damage.is_some());
    let _ = writeln!(out, "queued jobs: {} kept, {} lost", s.jobs_kept, s.lost_jobs.len());
    for j in &s.lost_jobs {
        let minute = j.event_minute_s.map_or_else(|| "unknown".into(), rfc3339);
        let (kind, topic) = (or_unknown(&j.kind), or_unknown(&j.topic));
        let _ = writeln!(out, "  lost: device {} seq {} {kind} from {topic}, event minute {minute}", j.device, j.seq);
    }
    if !s.lost_jobs_complete {
        let _ = writeln!(
            out,
            "  the list of queued jobs (job_live or reconcile_names; reconcile_jobs in an earlier layout) is damaged too: more jobs may be lost than named"
        );
    }
    if s.ids_restored > 0 {
        let _ = writeln!(out, "dedupe-window ids of kept jobs put back: {}", s.ids_restored);
    }
    if s.charges_forgotten > 0 || s.ids_forgotten > 0 {
        let _ = writeln!(
            out,
            "forgotten so that the records read again queue the lost jobs again: {} charge states, {} dedupe-window ids",
            s.charges_forgotten, s.ids_forgotten
        );
    }
    let replay = match s.replay_from_s {
        Some(from) if s.lost_jobs_complete && s.lost_jobs.iter().all(|j| j.event_minute_s.is_some()) => {
            Some((from, "the earliest lost event's minute"))
        }
        Some(from) => Some((from, "the earliest event the file still knows of")),
        None => None,
    };
    if let Some((from, which)) = replay {
        let at = rfc3339(from.saturating_sub(120));
        let _ = writeln!(
            out,
            "to have the lost jobs again: with pixgate stopped, put {} in place of the outbox, then move the consumer group back ({which} less 2 minutes):\n  pixgate kafka reposition --to-time {at} --dry-run\n  pixgate kafka reposition --to-time {at}\nand start pixgate; the devices drop by message id what they had already done",
            new.display(),
        );
    } else if !s.lost_jobs.is_empty() || !s.lost_jobs_complete {
        let _ = writeln!(
            out,
            "to have the lost jobs again: with pixgate stopped, put {} in place of the outbox, then move the consumer group back to before the oldest job it could have held (outbox.dedupe_retention_hours ago) with pixgate kafka reposition --to-time, and start pixgate",
            new.display(),
        );
    }
    if s.tables.iter().any(|t| t.table == "devices" && t.damage.is_some()) {
        let _ = writeln!(
            out,
            "the device registry lost entries: read the device topic again from its start (pixgate kafka reposition --topic DEVICE_TOPIC --to-time 1970-01-01T00:00:00Z)"
        );
    }
    Ok((out, lost))
}

fn rfc3339(unix_s: u64) -> String {
    chrono::DateTime::from_timestamp(i64::try_from(unix_s).unwrap_or(i64::MAX), 0)
        .map_or_else(|| unix_s.to_string(), |t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string())
}

fn or_unknown(s: &str) -> &str {
    if s.is_empty() {
        "unknown"
    } else {
        s
    }
}

/// Prints `v` as JSON on stdout, or its `error` on stderr when `ok` is false.
pub fn print_result(ok: bool, v: &Value) {
    let text = serde_json::to_string_pretty(v).expect("JSON prints");
    if ok {
        println!("{text}");
    } else {
        eprintln!("{}", v.get("error").and_then(Value::as_str).unwrap_or(&text));
    }
}

/// An inspection command, as parsed from the command line.
pub enum Inspection {
    /// `pixgate outbox …`
    Outbox(OutboxCmd),
    /// `pixgate deadletter …`
    DeadLetter(DeadLetterCmd),
}

/// Runs an `outbox`/`deadletter` command; exits 1 when it was refused (error on stderr).
///
/// # Errors
/// Neither the gateway nor the outbox file could be reached.
pub fn command(cfg: &Config, cmd: Inspection) -> anyhow::Result<()> {
    if let Inspection::Outbox(OutboxCmd::Check { file }) = &cmd {
        say_or_exit(check(file.as_deref().unwrap_or(&cfg.outbox.path)));
        return Ok(());
    }
    if let Inspection::Outbox(OutboxCmd::Salvage { damaged, new }) = &cmd {
        match salvage(damaged, new) {
            Ok((report, lost)) => {
                print!("{report}");
                if lost {
                    std::process::exit(2);
                }
            }
            Err(e) => {
                eprintln!("{e:#}");
                std::process::exit(1);
            }
        }
        return Ok(());
    }
    if let Inspection::Outbox(OutboxCmd::Downgrade { file }) = &cmd {
        say_or_exit(downgrade(file.as_deref().unwrap_or(&cfg.outbox.path)));
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let token = cfg.http.admin_token()?;
    let target = Target { http_listen: &cfg.http.listen, admin_token: token.as_deref(), path: &cfg.outbox.path };
    let t = &target;
    let ok = rt.block_on(async {
        match cmd {
            Inspection::Outbox(OutboxCmd::List { device: None }) => {
                run(t, "/outbox".into(), false, inspect::outbox_devices).await
            }
            Inspection::Outbox(OutboxCmd::List { device: Some(d) }) => {
                run(t, format!("/outbox/{d}"), false, |o| inspect::outbox_list(o, &d, None)).await
            }
            Inspection::Outbox(OutboxCmd::Show { device, seq }) => {
                run(t, format!("/outbox/{device}/{seq}"), false, |o| inspect::outbox_show(o, &device, seq)).await
            }
            Inspection::Outbox(OutboxCmd::Check { .. } | OutboxCmd::Salvage { .. } | OutboxCmd::Downgrade { .. }) => {
                unreachable!("answered above, without the gateway")
            }
            Inspection::DeadLetter(DeadLetterCmd::List) => {
                run(t, "/deadletters".into(), false, inspect::deadletter_list).await
            }
            Inspection::DeadLetter(DeadLetterCmd::Show { id }) => {
                run(t, format!("/deadletters/{id}"), false, |o| inspect::deadletter_show(o, id)).await
            }
            Inspection::DeadLetter(DeadLetterCmd::Replay { id }) => {
                let now = Clock::with_offset(cfg.clock.offset_ms).now_ms();
                let ttl = &cfg.delivery.ttl;
                let central = cfg.cluster.enabled;
                run(t, format!("/deadletters/{id}/replay"), true, |o| {
                    // Queued in this outbox alone, the job would be forgotten at the next
                    // start of a central-shape replica (its queues come from the delivery log).
                    if central {
                        return Err(crate::store::ReplayError::CentralShape(id).into());
                    }
                    Ok(inspect::replayed(&Replayed::Job(o.replay(id, now, |k| crate::route::render::ttl_of(k, ttl))?)))
                })
                .await
            }
        }
    })?;
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}
