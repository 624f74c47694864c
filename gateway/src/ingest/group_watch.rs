//! A consumer group that leaves partitions unread, reported, and the way out of it.
//!
//! Every [`WATCH_EVERY`] a task looks at each member: what it holds (librdkafka's
//! assignment), each topic's partitions (metadata), and for the partitions it does not
//! hold the group's committed offsets (OffsetFetch) and ends (ListOffsets). Two faults:
//! - **nothing held** of a topic that has partitions, for `health.unassigned_after_ms`
//!   (readiness says `unassigned`): the leader assigned while the topic was missing from
//!   its metadata (a broker too slow to answer, a topic created after the group formed),
//!   and the group stays so until librdkafka's next metadata refresh, minutes later;
//! - **orphaned partitions**: held elsewhere, with records beyond a committed offset that
//!   has not moved for `health.stall_after_ms` (readiness says `orphaned`): the holder is
//!   gone (Kafka expires a member after its session timeout; tansu 0.6.0 expires it and
//!   keeps its share assigned for good), stuck, or holding them back on purpose.
//!
//! On either a dynamic member rejoins: unsubscribe (its partitions revoked as in any
//! rebalance, then LeaveGroup) and subscribe again (JoinGroup), so that the group
//! rebalances; once per threshold at most. A static member (`kafka.instance_id`) cannot:
//! Kafka gives a known static member its old assignment back without a rebalance
//! (KIP-345), so it only reports. DescribeGroups, which would name the members, is not
//! asked: tansu 0.6.0 fails it and drops the connection.

use crate::ingest::kafka_metadata::{group_positions, topic_partitions};
use crate::ingest::rebalance::GatewayConsumer;
use crate::shutdown::Shutdown;
use crate::telemetry::health::OrphanFact;
use crate::telemetry::{Monitor, Stats};
use rdkafka::consumer::Consumer;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often each member's assignment is looked at.
pub const WATCH_EVERY: Duration = Duration::from_secs(10);
/// How long Kafka may take to answer a metadata request.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// One consumer-group member to watch: its consumer, its group, the topics it subscribes.
pub struct Watched<'a> {
    /// The member.
    pub consumer: &'a GatewayConsumer,
    /// Its consumer group (`group.id`).
    pub group: String,
    /// The topics it subscribes to.
    pub topics: Vec<String>,
}

/// What holds the members to watch: the central shape's reader (route and deliver, once
/// joined) or the edge box's one member. It holds them weakly: the consumer loop's is the
/// last reference, so that the loop closes them (and leaves the groups) at shutdown.
pub trait Members: Send + Sync + 'static {
    /// Calls `f` with each member subscribed now (none before they join their groups,
    /// none once the consumer loop has dropped them).
    fn each(&self, f: &mut dyn FnMut(Watched<'_>));
}

/// The thresholds and the kind of member.
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    /// `health.unassigned_after_ms`: a topic held by nothing for this long is a fault (0:
    /// never).
    pub unassigned_after: Duration,
    /// `health.stall_after_ms`: a partition held elsewhere whose committed offset has not
    /// moved for this long while records wait is orphaned (0: never).
    pub stall_after: Duration,
    /// A dynamic member (no `group.instance.id`): only such a member can rejoin.
    pub dynamic: bool,
}

/// What to do about one group after a look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing to mend, not yet, or nothing a rejoin may do (rejoined within the
    /// threshold, a static member).
    Stay,
    /// A fault past its threshold: rejoin the group.
    Rejoin,
}

/// One partition not held here as a look found it: its group's committed offset (the log
/// start when none) and its end offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unheld {
    /// The partition.
    pub partition: i32,
    /// The group's committed offset, or the low watermark when it has none.
    pub committed: i64,
    /// The high watermark.
    pub end: i64,
}

/// Per group: since when it has held nothing of some topic, how the partitions it does
/// not hold progress, and when this member last rejoined it.
#[derive(Debug, Default)]
pub struct Watch {
    empty_since: BTreeMap<String, Instant>,
    /// (group, topic, partition) → (committed offset, since when it is so).
    progress: BTreeMap<(String, String, i32), (i64, Instant)>,
    rejoined: BTreeMap<String, Instant>,
}

impl Watch {
    /// Notes the partitions of `group`'s `topic` not held here at `now`; returns those
    /// orphaned (records beyond a committed offset unchanged for `stall_after`) with
    /// their lag, and for how long the oldest has not moved (`None`: none orphaned). A
    /// partition held here again is forgotten.
    pub fn orphans(
        &mut self,
        group: &str,
        topic: &str,
        unheld: &[Unheld],
        now: Instant,
        stall_after: Duration,
    ) -> Option<(Vec<(i32, u64)>, Duration)> {
        let key = |p: i32| (group.to_string(), topic.to_string(), p);
        self.progress.retain(|(g, t, p), _| g != group || t != topic || unheld.iter().any(|u| u.partition == *p));
        let (mut out, mut oldest) = (Vec::new(), Duration::ZERO);
        for u in unheld {
            let e = self.progress.entry(key(u.partition)).or_insert((u.committed, now));
            if e.0 != u.committed {
                *e = (u.committed, now);
            }
            let still = now.duration_since(e.1);
            if u.end > u.committed && !stall_after.is_zero() && still >= stall_after {
                out.push((u.partition, (u.end - u.committed) as u64));
                oldest = oldest.max(still);
            }
        }
        (!out.is_empty()).then_some((out, oldest))
    }

    /// Notes a look at `group` at `now` (`empty`: it holds no partition of some topic
    /// that has some; `orphaned`: some partition held elsewhere is orphaned) and decides:
    /// rejoin once a topic has been empty for `unassigned_after`, or on orphans, and not
    /// again within that threshold of the last rejoin; only a dynamic member.
    pub fn look(&mut self, group: &str, empty: bool, orphaned: bool, now: Instant, rules: Rules) -> Verdict {
        if !empty {
            self.empty_since.remove(group);
        }
        let since = empty.then(|| *self.empty_since.entry(group.to_string()).or_insert(now));
        let rested = |after: Duration| self.rejoined.get(group).is_none_or(|r| now.duration_since(*r) >= after);
        let empty_due = since.is_some_and(|s| {
            let after = rules.unassigned_after;
            !after.is_zero() && now.duration_since(s) >= after && rested(after)
        });
        let orphan_due = orphaned && !rules.stall_after.is_zero() && rested(rules.stall_after);
        if !rules.dynamic || !(empty_due || orphan_due) {
            return Verdict::Stay;
        }
        self.rejoined.insert(group.to_string(), now);
        if empty {
            self.empty_since.insert(group.to_string(), now);
        }
        // Judged afresh after the new assignment.
        self.progress.retain(|(g, _, _), _| g != group);
        Verdict::Rejoin
    }
}

/// What one look at a member found of one of its topics.
struct TopicLook {
    topic: String,
    /// It holds no partition of the topic, which has some.
    none_held: bool,
    /// The partitions it does not hold.
    unheld: Vec<Unheld>,
}

/// Blocking: one look at `w`: its assignment (no request), each topic's partitions
/// (metadata), and for those not held where the group stands on them
/// ([`group_positions`]). A topic Kafka does not answer for is left out: nothing is
/// decided on what is not known.
fn see(w: &Watched<'_>) -> Option<Vec<TopicLook>> {
    let held: BTreeSet<(String, i32)> =
        w.consumer.assignment().ok()?.elements().iter().map(|e| (e.topic().to_string(), e.partition())).collect();
    let mut looks = Vec::new();
    for topic in &w.topics {
        let Ok(parts) = topic_partitions(w.consumer, topic, ASK_TIMEOUT) else { continue };
        let free: Vec<i32> = parts.iter().copied().filter(|p| !held.contains(&(topic.clone(), *p))).collect();
        let positions = if free.is_empty() {
            BTreeMap::new()
        } else {
            let Ok(positions) = group_positions(w.consumer, topic, &free, ASK_TIMEOUT) else { continue };
            positions
        };
        let unheld = positions
            .into_iter()
            .map(|(partition, g)| Unheld { partition, committed: g.committed.unwrap_or(g.low), end: g.end })
            .collect();
        looks.push(TopicLook {
            topic: topic.clone(),
            none_held: !parts.is_empty() && free.len() == parts.len(),
            unheld,
        });
    }
    Some(looks)
}

/// Watches `members` every [`WATCH_EVERY`] until `shutdown` under `rules`: orphaned
/// partitions to `health`, rejoins counted per group in `stats` (`group_rejoins`).
pub fn spawn<M: Members>(members: M, rules: Rules, health: Arc<Monitor>, stats: Arc<Stats>, shutdown: &Shutdown) {
    let stop = shutdown.clone();
    let members = Arc::new(members);
    shutdown.spawn(async move {
        let mut watch = Watch::default();
        loop {
            if stop.sleep(WATCH_EVERY).await {
                return;
            }
            let (m, h, s, w) = (members.clone(), health.clone(), stats.clone(), std::mem::take(&mut watch));
            let Ok(w) = tokio::task::spawn_blocking(move || check(&*m, w, rules, &h, &s)).await else {
                return;
            };
            watch = w;
        }
    });
}

/// Blocking: one look at every member.
fn check(members: &impl Members, mut watch: Watch, rules: Rules, health: &Monitor, stats: &Stats) -> Watch {
    members.each(&mut |w| look_at(&w, &mut watch, rules, health, stats));
    watch
}

/// Blocking: one look at one member.
fn look_at(w: &Watched<'_>, watch: &mut Watch, rules: Rules, health: &Monitor, stats: &Stats) {
    let Some(looks) = see(w) else { return };
    let now = Instant::now();
    let (mut empty, mut orphaned) = (Vec::new(), Vec::new());
    for t in looks {
        if t.none_held {
            empty.push(t.topic.clone());
        }
        let found = watch.orphans(&w.group, &t.topic, &t.unheld, now, rules.stall_after);
        health.orphans(
            &t.topic,
            found.as_ref().map(|(parts, still)| OrphanFact {
                group: w.group.clone(),
                partitions: parts.clone(),
                for_ms: still.as_millis() as u64,
            }),
        );
        orphaned.extend(found.map(|(parts, _)| (t.topic, parts)));
    }
    if watch.look(&w.group, !empty.is_empty(), !orphaned.is_empty(), now, rules) == Verdict::Rejoin {
        tracing::warn!(
            group = %w.group,
            unassigned = ?empty,
            orphaned = ?orphaned,
            "the group gives this member no partition of a topic that has some (a leader that assigned without the topic's metadata), or leaves partitions to a member that does not read them (gone, or stuck); rejoining so that it assigns again"
        );
        stats.update(|s| *s.group_rejoins.entry(w.group.clone()).or_default() += 1);
        w.consumer.unsubscribe();
        let topics: Vec<&str> = w.topics.iter().map(String::as_str).collect();
        if let Err(e) = w.consumer.subscribe(&topics) {
            tracing::error!(group = %w.group, error = %e, "cannot subscribe again after leaving the group; tried at the next look");
            watch.rejoined.remove(&w.group);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: Rules =
        Rules { unassigned_after: Duration::from_secs(30), stall_after: Duration::from_secs(60), dynamic: true };

    #[test]
    fn rejoins_once_empty_for_the_threshold_and_not_again_within_it() {
        let (mut w, t0) = (Watch::default(), Instant::now());
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(w.look("g", true, false, at(0), RULES), Verdict::Stay);
        assert_eq!(w.look("g", true, false, at(29), RULES), Verdict::Stay);
        assert_eq!(w.look("g", true, false, at(30), RULES), Verdict::Rejoin);
        assert_eq!(w.look("g", true, false, at(40), RULES), Verdict::Stay, "within the threshold of the rejoin");
        assert_eq!(w.look("g", true, false, at(60), RULES), Verdict::Rejoin, "still empty a threshold later");
        assert_eq!(w.look("g", false, false, at(70), RULES), Verdict::Stay);
        assert_eq!(w.look("g", true, false, at(80), RULES), Verdict::Stay, "empty again: the clock starts again");
        assert_eq!(w.look("g", true, false, at(110), RULES), Verdict::Rejoin);
        assert_eq!(w.look("other", true, false, at(110), RULES), Verdict::Stay, "per group");
    }

    #[test]
    fn a_static_member_or_the_rules_off_never_rejoin() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(600);
        let mut w = Watch::default();
        let fixed = Rules { dynamic: false, ..RULES };
        assert_eq!(w.look("g", true, true, t0, fixed), Verdict::Stay);
        assert_eq!(w.look("g", true, true, later, fixed), Verdict::Stay);
        let mut w = Watch::default();
        let off = Rules { unassigned_after: Duration::ZERO, stall_after: Duration::ZERO, dynamic: true };
        assert_eq!(w.look("g", true, true, t0, off), Verdict::Stay);
        assert_eq!(w.look("g", true, true, later, off), Verdict::Stay);
    }

    fn unheld(partition: i32, committed: i64, end: i64) -> Unheld {
        Unheld { partition, committed, end }
    }

    #[test]
    fn a_partition_held_elsewhere_is_orphaned_when_records_wait_and_its_offset_stands_still() {
        let (mut w, t0, stall) = (Watch::default(), Instant::now(), RULES.stall_after);
        let at = |s: u64| t0 + Duration::from_secs(s);
        // Partition 2 has records waiting; 3 is read to its end; 4 moves.
        let look = |w: &mut Watch, s: u64, four: i64| {
            w.orphans("g", "jobs", &[unheld(2, 100, 140), unheld(3, 50, 50), unheld(4, four, four + 9)], at(s), stall)
        };
        assert_eq!(look(&mut w, 0, 10), None);
        assert_eq!(look(&mut w, 59, 20), None);
        assert_eq!(look(&mut w, 60, 30), Some((vec![(2, 40)], Duration::from_secs(60))));
        // It moves: no longer orphaned, the clock starts again.
        assert_eq!(w.orphans("g", "jobs", &[unheld(2, 101, 140)], at(70), stall), None);
        assert_eq!(w.orphans("g", "jobs", &[unheld(2, 101, 140)], at(130), stall), Some((vec![(2, 39)], stall)));
        // Held here now: forgotten; held elsewhere again later: timed afresh.
        assert_eq!(w.orphans("g", "jobs", &[], at(140), stall), None);
        assert_eq!(w.orphans("g", "jobs", &[unheld(2, 101, 140)], at(150), stall), None);
        // The rule off.
        assert_eq!(w.orphans("g", "jobs", &[unheld(2, 101, 140)], at(900), Duration::ZERO), None);
    }

    #[test]
    fn orphans_make_a_dynamic_member_rejoin_then_are_judged_afresh() {
        let (mut w, t0, stall) = (Watch::default(), Instant::now(), RULES.stall_after);
        let at = |s: u64| t0 + Duration::from_secs(s);
        w.orphans("g", "jobs", &[unheld(5, 0, 9)], at(0), stall);
        assert!(w.orphans("g", "jobs", &[unheld(5, 0, 9)], at(60), stall).is_some());
        assert_eq!(w.look("g", false, true, at(60), RULES), Verdict::Rejoin);
        assert_eq!(w.orphans("g", "jobs", &[unheld(5, 0, 9)], at(70), stall), None, "timed afresh");
        assert_eq!(w.look("g", false, true, at(100), RULES), Verdict::Stay, "not within the threshold of the rejoin");
        assert_eq!(w.look("g", false, true, at(120), RULES), Verdict::Rejoin);
    }
}
