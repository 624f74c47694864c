//! `pixgate kafka reposition`: moves a consumer group (pixgate's, `kafka.group_id`, or
//! another system's with `--group`) to the end of its topics, to a point in time or to
//! given offsets, printing per partition the current offset, the target and the records
//! skipped or replayed; refused while the group has live members ([`crate::ops::reposition`]).

use crate::config::Config;
use crate::ops::reposition::{self, MemberCheck, Move, Repositioner, Target};
use clap::{ArgGroup, Args, Subcommand};
use std::path::PathBuf;

/// `pixgate kafka …`
#[derive(Debug, Subcommand)]
pub enum KafkaCmd {
    /// Commits new offsets for a consumer group whose members are all stopped.
    Reposition(RepositionArgs),
}

/// `pixgate kafka reposition`
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("target").required(true).args(["to", "to_time", "to_offsets"])))]
pub struct RepositionArgs {
    /// `end`: each partition's end, so nothing already in the topic is read.
    #[arg(long, value_parser = ["end"])]
    to: Option<String>,
    /// The first record at or after this time (RFC 3339, e.g. 2026-11-27T12:00:00Z), by
    /// the records' Kafka timestamps; the end where none is.
    #[arg(long)]
    to_time: Option<String>,
    /// A JSON file `{"topic": {"partition": offset, …}}`; partitions not named stay.
    #[arg(long)]
    to_offsets: Option<PathBuf>,
    /// Print the moves, commit nothing (allowed while the group runs).
    #[arg(long)]
    dry_run: bool,
    /// The consumer group (default `kafka.group_id`; with `cluster.enabled`, the group that
    /// reads the topics: `{kafka.group_id}-route` for the charge topic).
    #[arg(long)]
    group: Option<String>,
    /// A topic to move (repeatable; default `kafka.charge_topic` only: skipping
    /// `kafka.device_topic` would leave the device registry without the changes skipped).
    #[arg(long = "topic")]
    topics: Vec<String>,
    /// JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Commit although the broker cannot say whether the group has live members
    /// (`DescribeGroups` failed): you have stopped every consumer of the group yourself.
    /// Known live members refuse the commit anyway.
    #[arg(long)]
    no_member_check: bool,
}

/// Runs `pixgate kafka …`; exits 1 with the reason on stderr when refused.
///
/// # Errors
/// Kafka could not be asked, or the target cannot be read.
pub fn command(cfg: &Config, cmd: KafkaCmd) -> anyhow::Result<()> {
    let KafkaCmd::Reposition(args) = cmd;
    let target = if args.to.is_some() {
        Target::End
    } else if let Some(t) = &args.to_time {
        let at = chrono::DateTime::parse_from_rfc3339(t)
            .map_err(|e| anyhow::anyhow!("--to-time `{t}` is not an RFC 3339 time (2026-11-27T12:00:00Z): {e}"))?;
        Target::Time(at.timestamp_millis())
    } else if let Some(path) = &args.to_offsets {
        let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
        Target::Offsets(reposition::parse_offsets(&text)?)
    } else {
        unreachable!("clap requires one target")
    };
    let topics = if args.topics.is_empty() { vec![cfg.kafka.charge_topic.clone()] } else { args.topics.clone() };
    let group = match &args.group {
        Some(g) => g.clone(),
        None => {
            let groups: std::collections::BTreeSet<Option<String>> = topics.iter().map(|t| cfg.group_of(t)).collect();
            match groups.into_iter().collect::<Vec<_>>().as_slice() {
                [Some(g)] => g.clone(),
                _ => anyhow::bail!(
                    "with cluster.enabled, {} are not read by one consumer group ({}-route reads {}, {}-deliver reads {}): move them one group at a time, or name it with --group",
                    topics.join(", "),
                    cfg.kafka.group_id,
                    cfg.kafka.charge_topic,
                    cfg.kafka.group_id,
                    cfg.cluster.device_jobs_topic
                ),
            }
        }
    };
    if let Target::Offsets(given) = &target {
        if let Some(other) = given.keys().find(|t| !topics.contains(t)) {
            anyhow::bail!("the offsets file names topic {other}, which is not being moved (--topic {other})");
        }
    }
    let r = Repositioner::new(&cfg.kafka.brokers, &group)?;
    let check = r.members();
    let mut moves: Vec<Move> = Vec::new();
    for topic in &topics {
        moves.extend(reposition::plan(topic, &r.partitions(topic, &target)?, &target)?);
    }
    match reposition::verdict(&check, &group, cfg.kafka.session_timeout_ms, args.dry_run, args.no_member_check) {
        Ok(note) => {
            if let Some(note) = note {
                eprintln!("{note}");
            }
        }
        Err(refusal) => {
            eprintln!("{refusal}");
            std::process::exit(1);
        }
    }
    if !args.dry_run {
        r.commit(&moves)?;
    }
    if args.json {
        // `members` is null when the broker could not say (`member_check_error`).
        let (members, member_check_error) = match &check {
            MemberCheck::Empty => (serde_json::json!([]), None),
            MemberCheck::Live(m) => (serde_json::json!(m), None),
            MemberCheck::Unknown(e) => (serde_json::Value::Null, Some(e.as_str())),
        };
        let v = serde_json::json!({
            "group": group,
            "members": members,
            "member_check_error": member_check_error,
            "dry_run": args.dry_run,
            "committed": !args.dry_run,
            "moves": moves,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", reposition::table(&moves));
        if args.dry_run {
            println!("dry run: nothing committed");
        } else {
            println!("committed for consumer group `{group}`");
        }
    }
    Ok(())
}
