//! A consumer group that gives this member nothing of a topic, and the way out of it.
//!
//! Readiness already calls a topic of which this member has held no partition for
//! `health.unassigned_after_ms` a fault (`unassigned`; an operator running more members
//! than the topic has partitions turns the rule off). Kafka ends such a state by itself
//! when it comes from a member gone without leaving (it expires the member after its
//! session timeout and rebalances), but not when the leader assigned from metadata that
//! lacked the topic (a broker too slow to answer the leader's metadata request): the
//! group is stable, every member holds nothing, and no rebalance comes until the topic's
//! metadata changes. tansu 0.6.0 under load does this, and it also keeps a departed
//! member's share assigned after expiring the member.
//!
//! Every [`WATCH_EVERY`] a task looks at what each member holds (librdkafka's assignment,
//! no request) and, for a topic it has held nothing of for the threshold while Kafka's
//! metadata gives the topic partitions, a dynamic member rejoins: unsubscribe (its
//! partitions revoked as in any rebalance, then LeaveGroup) and subscribe again
//! (JoinGroup), which makes the leader assign anew; once per threshold at most. A static
//! member (`kafka.instance_id`) cannot: Kafka gives a known static member its old
//! assignment back without a rebalance (KIP-345), so it only logs, and `/readyz` says
//! `unassigned` until an operator restarts a replica.

use crate::ingest::kafka_metadata::topic_partitions;
use crate::ingest::rebalance::GatewayConsumer;
use crate::shutdown::Shutdown;
use crate::telemetry::Stats;
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
/// joined) or the edge box's one member.
pub trait Members: Send + Sync + 'static {
    /// The members subscribed now (none before they join their groups).
    fn watched(&self) -> Vec<Watched<'_>>;
}

/// What to do about one group after a look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// It holds a partition of every topic.
    Held,
    /// Nothing held of these topics, not yet for the threshold, or rejoined within it,
    /// or a static member.
    Empty(Vec<String>),
    /// Nothing held of these topics for the threshold: rejoin the group.
    Rejoin(Vec<String>),
}

/// Per group: since when it has held nothing of some topic, and when this member last
/// rejoined it.
#[derive(Debug, Default)]
pub struct Watch {
    empty_since: BTreeMap<String, Instant>,
    rejoined: BTreeMap<String, Instant>,
}

impl Watch {
    /// Notes a look at `group` at `now` (`empty`: the subscribed topics of which it holds
    /// no partition) and decides: rejoin once some topic has been empty for `after`, and
    /// not again within `after` of the last rejoin; never for a static member (`dynamic`
    /// false) nor with `after` 0 (the rule off).
    pub fn look(&mut self, group: &str, empty: Vec<String>, now: Instant, after: Duration, dynamic: bool) -> Verdict {
        if empty.is_empty() {
            self.empty_since.remove(group);
            return Verdict::Held;
        }
        let since = *self.empty_since.entry(group.to_string()).or_insert(now);
        let rested = self.rejoined.get(group).is_none_or(|r| now.duration_since(*r) >= after);
        if dynamic && !after.is_zero() && now.duration_since(since) >= after && rested {
            self.rejoined.insert(group.to_string(), now);
            self.empty_since.insert(group.to_string(), now);
            return Verdict::Rejoin(empty);
        }
        Verdict::Empty(empty)
    }
}

/// Blocking: the topics of `w` of which it holds no partition, though Kafka's metadata
/// gives them partitions (a topic without partitions no rejoin would mend). A metadata
/// request that fails counts the topic as held: nothing is decided on what is not known.
fn empty_topics(w: &Watched<'_>) -> Vec<String> {
    let held: BTreeSet<String> = match w.consumer.assignment() {
        Ok(a) => a.elements().iter().map(|e| e.topic().to_string()).collect(),
        Err(_) => return Vec::new(),
    };
    w.topics
        .iter()
        .filter(|t| !held.contains(*t))
        .filter(|t| topic_partitions(w.consumer, t, ASK_TIMEOUT).is_ok_and(|p| !p.is_empty()))
        .cloned()
        .collect()
}

/// Watches `members` every [`WATCH_EVERY`] until `shutdown`; `after` is
/// `health.unassigned_after_ms` (0: never rejoins). Rejoins (dynamic members only,
/// `dynamic`) are counted per group in `stats` (`group_rejoins`).
pub fn spawn<M: Members>(members: Arc<M>, dynamic: bool, after: Duration, stats: Arc<Stats>, shutdown: &Shutdown) {
    let stop = shutdown.clone();
    // Weak: the consumer loop's is the last reference, so that it closes the consumers.
    let members = Arc::downgrade(&members);
    shutdown.spawn(async move {
        let mut watch = Watch::default();
        loop {
            if stop.sleep(WATCH_EVERY).await {
                return;
            }
            let Some(m) = members.upgrade() else { return };
            let (s, w) = (stats.clone(), std::mem::take(&mut watch));
            let Ok(w) = tokio::task::spawn_blocking(move || check(&*m, w, dynamic, after, &s)).await else {
                return;
            };
            watch = w;
        }
    });
}

/// Blocking: one look at every member.
fn check(members: &impl Members, mut watch: Watch, dynamic: bool, after: Duration, stats: &Stats) -> Watch {
    for w in members.watched() {
        let empty = empty_topics(&w);
        match watch.look(&w.group, empty, Instant::now(), after, dynamic) {
            Verdict::Rejoin(topics) => {
                tracing::warn!(
                    group = %w.group,
                    topics = ?topics,
                    ms = after.as_millis() as u64,
                    "the group has given this member no partition of a topic that has some: a leader that assigned without the topic's metadata, or a member gone whose share is kept; rejoining so that it assigns again"
                );
                stats.update(|s| *s.group_rejoins.entry(w.group.clone()).or_default() += 1);
                w.consumer.unsubscribe();
                let topics: Vec<&str> = w.topics.iter().map(String::as_str).collect();
                if let Err(e) = w.consumer.subscribe(&topics) {
                    tracing::error!(group = %w.group, error = %e, "cannot subscribe again after leaving the group; tried at the next look");
                    watch.rejoined.remove(&w.group);
                }
            }
            Verdict::Empty(topics) if !dynamic => tracing::debug!(
                group = %w.group,
                topics = ?topics,
                "no partition held; a static member cannot ask its group to assign again"
            ),
            Verdict::Empty(_) | Verdict::Held => {}
        }
    }
    watch
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topics(t: &[&str]) -> Vec<String> {
        t.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn rejoins_once_empty_for_the_threshold_and_not_again_within_it() {
        let (mut w, t0, after) = (Watch::default(), Instant::now(), Duration::from_secs(30));
        let at = |s: u64| t0 + Duration::from_secs(s);
        let jobs = || topics(&["jobs"]);
        assert_eq!(w.look("g", jobs(), at(0), after, true), Verdict::Empty(jobs()));
        assert_eq!(w.look("g", jobs(), at(29), after, true), Verdict::Empty(jobs()));
        assert_eq!(w.look("g", jobs(), at(30), after, true), Verdict::Rejoin(jobs()));
        assert_eq!(
            w.look("g", jobs(), at(40), after, true),
            Verdict::Empty(jobs()),
            "within the threshold of the rejoin"
        );
        assert_eq!(w.look("g", jobs(), at(60), after, true), Verdict::Rejoin(jobs()), "still empty a threshold later");
        assert_eq!(w.look("g", vec![], at(70), after, true), Verdict::Held);
        assert_eq!(
            w.look("g", jobs(), at(80), after, true),
            Verdict::Empty(jobs()),
            "empty again: the clock starts again"
        );
        assert_eq!(w.look("g", jobs(), at(110), after, true), Verdict::Rejoin(jobs()));
        assert_eq!(w.look("other", jobs(), at(110), after, true), Verdict::Empty(jobs()), "per group");
    }

    #[test]
    fn a_static_member_or_the_rule_off_never_rejoins() {
        let (t0, after, jobs) = (Instant::now(), Duration::from_secs(30), topics(&["jobs"]));
        let mut w = Watch::default();
        assert_eq!(w.look("g", jobs.clone(), t0, after, false), Verdict::Empty(jobs.clone()));
        let later = t0 + Duration::from_secs(600);
        assert_eq!(w.look("g", jobs.clone(), later, after, false), Verdict::Empty(jobs.clone()));
        let mut w = Watch::default();
        assert_eq!(w.look("g", jobs.clone(), t0, Duration::ZERO, true), Verdict::Empty(jobs.clone()));
        assert_eq!(w.look("g", jobs.clone(), later, Duration::ZERO, true), Verdict::Empty(jobs));
    }
}
