//! Repositioning a consumer group: committing new offsets for its partitions while none of
//! its members runs, so that it starts at the end of a topic (a rollback: the old system
//! must not replay the backlog pixgate handled), at a point in time, or at given offsets
//! (`pixgate kafka reposition`, [`crate::cli::kafka`]).
//!
//! The plan is made first ([`plan`], no I/O): per partition the current committed offset,
//! the target, and how many records the move skips (forward) or replays (backward). It is
//! committed only when the group has no live members: Kafka refuses a commit from outside
//! an active generation, and a running member would overwrite it with its own position at
//! its next commit anyway.
//!
//! Sources: Kafka's `ListOffsets` by timestamp (KIP-79: the earliest offset whose record
//! timestamp is at or after the time; none, the end) through librdkafka's
//! `rd_kafka_offsets_for_times`; group members from `DescribeGroups`
//! (`rd_kafka_list_groups`); the commit is an `OffsetCommit` outside a generation, which
//! Kafka accepts for an empty group (the way `kafka-consumer-groups --reset-offsets` does).

use crate::kafka_client;
use anyhow::{bail, Context};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// The offset `list` gives `topic`/`partition`, if it is an actual one (not a logical
/// offset such as "none committed").
fn offset_in(list: &TopicPartitionList, topic: &str, partition: i32) -> Option<i64> {
    match list.find_partition(topic, partition).map(|e| e.offset()) {
        Some(Offset::Offset(o)) if o >= 0 => Some(o),
        _ => None,
    }
}

/// How long one Kafka request of a reposition may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Where to move the group.
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    /// Each partition's end (high watermark): nothing read before now is read.
    End,
    /// The first record at or after this time (Unix ms, the records' Kafka timestamps);
    /// the end when none is.
    Time(i64),
    /// These offsets, topic → partition → offset (the next record to read); partitions not
    /// named are left as they are.
    Offsets(BTreeMap<String, BTreeMap<i32, i64>>),
}

/// One partition as Kafka has it now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionNow {
    /// Partition number.
    pub partition: i32,
    /// Low and high watermarks: the first offset kept and the next to be written.
    pub low: i64,
    /// See `low`.
    pub high: i64,
    /// The group's committed offset; `None` when it has none.
    pub committed: Option<i64>,
    /// For [`Target::Time`]: the offset Kafka answered for the time (`None`: none at or
    /// after it, the end).
    pub at_time: Option<i64>,
}

/// One partition's move.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Move {
    /// Topic.
    pub topic: String,
    /// Partition number.
    pub partition: i32,
    /// The committed offset now; `None` when the group has none there (it would start at
    /// the beginning, `auto.offset.reset = earliest`).
    pub current: Option<i64>,
    /// Where the group would start now: `current`, or the low watermark without one.
    pub start: i64,
    /// The offset to commit.
    pub target: i64,
    /// Records skipped (the target is after the start), never read by the group.
    pub skipped: i64,
    /// Records replayed (the target is before the start), read again by the group.
    pub replayed: i64,
}

/// The moves for `target` on `topic`'s partitions `parts`.
///
/// # Errors
/// An offset of [`Target::Offsets`] outside its partition's watermarks, or naming a
/// partition the topic does not have.
pub fn plan(topic: &str, parts: &[PartitionNow], target: &Target) -> anyhow::Result<Vec<Move>> {
    if let Target::Offsets(given) = target {
        for p in given.get(topic).into_iter().flat_map(BTreeMap::keys) {
            if !parts.iter().any(|x| x.partition == *p) {
                bail!("{topic} has no partition {p}");
            }
        }
    }
    let mut out = Vec::new();
    for p in parts {
        let to = match target {
            Target::End => p.high,
            // Kafka answers an offset within the watermarks; clamped for a broker that
            // does not.
            Target::Time(_) => p.at_time.unwrap_or(p.high).clamp(p.low, p.high),
            Target::Offsets(given) => match given.get(topic).and_then(|m| m.get(&p.partition)) {
                Some(&o) if (p.low..=p.high).contains(&o) => o,
                Some(&o) => {
                    bail!("{topic}/{}: offset {o} is outside the partition's {}..={}", p.partition, p.low, p.high)
                }
                None => continue,
            },
        };
        let start = p.committed.unwrap_or(p.low);
        out.push(Move {
            topic: topic.to_string(),
            partition: p.partition,
            current: p.committed,
            start,
            target: to,
            skipped: (to - start).max(0),
            replayed: (start - to).max(0),
        });
    }
    Ok(out)
}

/// Reads an offsets file: JSON `{"topic": {"partition": offset, …}, …}`.
///
/// # Errors
/// Not that shape (a partition that is not a number, an offset that is not an integer).
pub fn parse_offsets(text: &str) -> anyhow::Result<BTreeMap<String, BTreeMap<i32, i64>>> {
    let raw: BTreeMap<String, BTreeMap<String, i64>> =
        serde_json::from_str(text).context("an offsets file is JSON {\"topic\": {\"partition\": offset, …}, …}")?;
    raw.into_iter()
        .map(|(topic, parts)| {
            let parts = parts
                .into_iter()
                .map(|(p, o)| {
                    Ok((p.parse::<i32>().with_context(|| format!("{topic}: partition `{p}` is not a number"))?, o))
                })
                .collect::<anyhow::Result<_>>()?;
            Ok((topic, parts))
        })
        .collect()
}

/// A live member of the group, as `DescribeGroups` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Member {
    /// Member id.
    pub id: String,
    /// The client's `client.id`.
    pub client_id: String,
    /// The client's host.
    pub client_host: String,
}

/// What the broker says about the group's members.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberCheck {
    /// No live member.
    Empty,
    /// These members are live.
    Live(Vec<Member>),
    /// `DescribeGroups` failed: unknown (tansu 0.6.0 fails it for every group that exists,
    /// its SQLite storage reading the group back as a JSON string).
    Unknown(String),
}

/// Whether a reposition may commit after `check`: `Ok` with a note to print (a dry run,
/// a check skipped), or `Err` with the refusal. Live members always refuse a commit; an
/// unknown answer refuses it unless the operator says every consumer is stopped
/// (`no_member_check`).
///
/// # Errors
/// The refusal, in words saying what to do.
pub fn verdict(
    check: &MemberCheck,
    group: &str,
    session_timeout_ms: u32,
    dry_run: bool,
    no_member_check: bool,
) -> Result<Option<String>, String> {
    let why = match check {
        MemberCheck::Empty => return Ok(None),
        MemberCheck::Live(members) => {
            let who: Vec<String> =
                members.iter().map(|m| format!("{} ({} {})", m.id, m.client_id, m.client_host)).collect();
            format!(
                "consumer group `{group}` has {} live member(s): {}. Stop its consumers (pixgate, or the other \
                 system's), wait until the group is empty (a static member stays up to its session timeout, \
                 pixgate's kafka.session_timeout_ms = {session_timeout_ms}), then run this again",
                members.len(),
                who.join(", ")
            )
        }
        MemberCheck::Unknown(e) => {
            if no_member_check && !dry_run {
                return Ok(Some(format!(
                    "member check skipped (--no-member-check): the broker did not answer DescribeGroups: {e}"
                )));
            }
            format!(
                "cannot tell whether consumer group `{group}` has live members: the broker did not answer \
                 DescribeGroups: {e}. Stop every consumer of the group, then run this again with --no-member-check"
            )
        }
    };
    if dry_run {
        Ok(Some(format!("dry run: a reposition now would be refused: {why}")))
    } else {
        Err(format!("refused: {why}"))
    }
}

/// A Kafka client for repositioning `group` on `brokers` (not a member: it never joins).
pub struct Repositioner {
    consumer: BaseConsumer,
    group: String,
}

impl Repositioner {
    /// A client for `group` on `brokers`.
    ///
    /// # Errors
    /// librdkafka refuses the configuration.
    pub fn new(brokers: &str, group: &str) -> anyhow::Result<Repositioner> {
        let consumer: BaseConsumer = kafka_client::client(brokers)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .create()
            .context("creating a Kafka client")?;
        Ok(Repositioner { consumer, group: group.to_string() })
    }

    /// The group's live members, as `DescribeGroups` answers.
    pub fn members(&self) -> MemberCheck {
        let list = match self.consumer.fetch_group_list(Some(&self.group), TIMEOUT) {
            Ok(l) => l,
            Err(e) => return MemberCheck::Unknown(e.to_string()),
        };
        let members: Vec<Member> = list
            .groups()
            .iter()
            .filter(|g| g.name() == self.group)
            .flat_map(|g| g.members())
            .map(|m| Member {
                id: m.id().to_string(),
                client_id: m.client_id().to_string(),
                client_host: m.client_host().to_string(),
            })
            .collect();
        if members.is_empty() {
            MemberCheck::Empty
        } else {
            MemberCheck::Live(members)
        }
    }

    /// `topic`'s partitions now: watermarks, the group's committed offsets, and for a
    /// [`Target::Time`] the offset at that time.
    ///
    /// # Errors
    /// The topic does not exist, or the broker did not answer.
    pub fn partitions(&self, topic: &str, target: &Target) -> anyhow::Result<Vec<PartitionNow>> {
        let md = self.consumer.fetch_metadata(Some(topic), TIMEOUT).with_context(|| format!("metadata of {topic}"))?;
        let t = md.topics().iter().find(|t| t.name() == topic).with_context(|| format!("no topic {topic}"))?;
        if let Some(e) = t.error() {
            bail!("topic {topic}: {e:?}");
        }
        let mut ids: Vec<i32> = t.partitions().iter().map(|p| p.id()).collect();
        ids.sort_unstable();
        if ids.is_empty() {
            bail!("no topic {topic} (no partitions)");
        }
        let mut tpl = TopicPartitionList::new();
        for p in &ids {
            tpl.add_partition(topic, *p);
        }
        let committed = self.consumer.committed_offsets(tpl, TIMEOUT).context("reading committed offsets")?;
        let at_time = match target {
            Target::Time(ms) => {
                let mut q = TopicPartitionList::new();
                for p in &ids {
                    q.add_partition_offset(topic, *p, Offset::Offset(*ms))?;
                }
                Some(self.consumer.offsets_for_times(q, TIMEOUT).context("ListOffsets by time")?)
            }
            _ => None,
        };
        let mut out = Vec::new();
        for p in ids {
            let (low, high) = self
                .consumer
                .fetch_watermarks(topic, p, TIMEOUT)
                .with_context(|| format!("watermarks of {topic}/{p}"))?;
            let committed = offset_in(&committed, topic, p);
            let at_time = at_time.as_ref().and_then(|l| offset_in(l, topic, p));
            out.push(PartitionNow { partition: p, low, high, committed, at_time });
        }
        Ok(out)
    }

    /// Commits the moves' targets for the group, then reads them back.
    ///
    /// # Errors
    /// The broker refused the commit (a member joined meanwhile), or reading back does not
    /// show the targets.
    pub fn commit(&self, moves: &[Move]) -> anyhow::Result<()> {
        let mut tpl = TopicPartitionList::new();
        for m in moves {
            tpl.add_partition_offset(&m.topic, m.partition, Offset::Offset(m.target))?;
        }
        self.consumer
            .commit(&tpl, CommitMode::Sync)
            .with_context(|| format!("committing offsets for group `{}`", self.group))?;
        let back = self.consumer.committed_offsets(tpl, TIMEOUT).context("reading the committed offsets back")?;
        for m in moves {
            let got = back.find_partition(&m.topic, m.partition).map(|e| e.offset());
            if got != Some(Offset::Offset(m.target)) {
                bail!("{}/{}: committed {}, but the group reads back {got:?}", m.topic, m.partition, m.target);
            }
        }
        Ok(())
    }
}

/// The moves as a table: topic, partition, current, target, skipped, replayed.
pub fn table(moves: &[Move]) -> String {
    let mut out = format!(
        "{:<24} {:>9} {:>10} {:>10} {:>9} {:>9}\n",
        "topic", "partition", "current", "target", "skipped", "replayed"
    );
    for m in moves {
        let current = m.current.map_or_else(|| format!("none({})", m.start), |c| c.to_string());
        out.push_str(&format!(
            "{:<24} {:>9} {:>10} {:>10} {:>9} {:>9}\n",
            m.topic, m.partition, current, m.target, m.skipped, m.replayed
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts() -> Vec<PartitionNow> {
        vec![
            PartitionNow { partition: 0, low: 0, high: 100, committed: Some(40), at_time: Some(70) },
            PartitionNow { partition: 1, low: 10, high: 50, committed: None, at_time: None },
        ]
    }

    #[test]
    fn live_members_refuse_a_commit_and_an_unknown_answer_needs_the_operators_word() {
        let m = Member { id: "m-1".into(), client_id: "rdkafka".into(), client_host: "/10.0.0.5".into() };
        let live = MemberCheck::Live(vec![m]);
        let e = verdict(&live, "g", 10_000, false, true).unwrap_err();
        assert!(e.starts_with("refused: consumer group `g` has 1 live member(s): m-1 (rdkafka /10.0.0.5)"), "{e}");
        assert!(verdict(&live, "g", 10_000, true, false)
            .unwrap()
            .unwrap()
            .starts_with("dry run: a reposition now would be refused"));
        let unknown = MemberCheck::Unknown("BrokerTransportFailure".into());
        let e = verdict(&unknown, "g", 10_000, false, false).unwrap_err();
        assert!(e.contains("cannot tell") && e.contains("--no-member-check"), "{e}");
        assert!(verdict(&unknown, "g", 10_000, false, true).unwrap().unwrap().contains("member check skipped"));
        assert_eq!(verdict(&MemberCheck::Empty, "g", 10_000, false, false), Ok(None));
    }

    #[test]
    fn to_end_skips_what_is_unread() {
        let m = plan("t", &parts(), &Target::End).unwrap();
        assert_eq!((m[0].target, m[0].skipped, m[0].replayed), (100, 60, 0));
        assert_eq!((m[1].current, m[1].start, m[1].target, m[1].skipped), (None, 10, 50, 40));
    }

    #[test]
    fn to_a_time_takes_kafkas_offset_or_the_end() {
        let m = plan("t", &parts(), &Target::Time(1)).unwrap();
        assert_eq!((m[0].target, m[0].skipped), (70, 30));
        assert_eq!(m[1].target, 50, "no record at or after the time: the end");
    }

    #[test]
    fn to_offsets_moves_only_the_named_partitions_and_counts_a_replay() {
        let given = parse_offsets(r#"{"t": {"0": 25}}"#).unwrap();
        let m = plan("t", &parts(), &Target::Offsets(given)).unwrap();
        assert_eq!(m.len(), 1);
        assert_eq!((m[0].partition, m[0].target, m[0].skipped, m[0].replayed), (0, 25, 0, 15));
        let out_of_range = parse_offsets(r#"{"t": {"1": 5}}"#).unwrap();
        let e = plan("t", &parts(), &Target::Offsets(out_of_range)).unwrap_err().to_string();
        assert!(e.contains("outside the partition's 10..=50"), "{e}");
        let no_such = parse_offsets(r#"{"t": {"7": 5}}"#).unwrap();
        assert!(plan("t", &parts(), &Target::Offsets(no_such)).unwrap_err().to_string().contains("no partition 7"));
        assert!(parse_offsets(r#"{"t": {"x": 5}}"#).is_err());
        assert!(table(&plan("t", &parts(), &Target::End).unwrap()).contains("none(10)"));
    }
}
