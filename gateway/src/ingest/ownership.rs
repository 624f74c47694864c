//! Which device-jobs partitions this replica owns, and which partition each device it has
//! seen is on (the central shape's deliver stage, `docs/cluster.md` "Hand-over").
//!
//! The devices' partitions are learnt from the records read (key = device id) and from
//! the delivery logs restored, not computed: a device this replica never read a job of has
//! no queue here to forget.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

/// A partition given up, with the devices this replica knew on it.
pub type GivenUp = (i32, Vec<String>);

/// The partitions owned, the devices' partitions and each owned partition's first offset
/// not yet in the delivery log.
#[derive(Debug, Default)]
pub struct Ownership {
    owned: BTreeSet<i32>,
    devices: HashMap<String, i32>,
    /// Per owned partition: records below this offset are in the delivery log already
    /// (its `pos`), so they are skipped when read again.
    floor: BTreeMap<i32, i64>,
    /// Per owned partition: message ids its previous owner delivered after this replica's
    /// claim (`Restored::done_late`), left out when their records are read again.
    done_late: HashMap<i32, HashSet<String>>,
}

impl Ownership {
    /// The partitions owned.
    pub fn owned(&self) -> &BTreeSet<i32> {
        &self.owned
    }

    /// Given the assignment `now` and the partitions `revoked` since the last call: the
    /// partitions newly taken and those given up (whose devices are dropped from the map),
    /// in order. A partition revoked and assigned again is both given up and taken:
    /// another replica may have owned it meanwhile.
    pub fn reassigned(&mut self, now: BTreeSet<i32>, revoked: &BTreeSet<i32>) -> (Vec<i32>, Vec<GivenUp>) {
        let kept: BTreeSet<i32> = self.owned.difference(revoked).copied().collect();
        let taken: Vec<i32> = now.difference(&kept).copied().collect();
        let given: Vec<i32> = self.owned.iter().filter(|p| revoked.contains(p) || !now.contains(p)).copied().collect();
        let mut given_up = Vec::new();
        for p in given {
            let devices: Vec<String> = self.devices.iter().filter(|(_, q)| **q == p).map(|(d, _)| d.clone()).collect();
            for d in &devices {
                self.devices.remove(d);
            }
            self.floor.remove(&p);
            self.done_late.remove(&p);
            given_up.push((p, devices));
        }
        self.owned = now;
        (taken, given_up)
    }

    /// Partition `p` was restored from its log, whose `pos` is `pos`, with `devices`;
    /// `done_late` are the message ids its previous owner delivered after the claim.
    pub fn restored<'a>(
        &mut self,
        p: i32,
        pos: Option<i64>,
        devices: impl IntoIterator<Item = &'a str>,
        done_late: HashSet<String>,
    ) {
        for d in devices {
            self.devices.insert(d.to_string(), p);
        }
        if let Some(pos) = pos {
            self.floor.insert(p, pos);
        }
        if done_late.is_empty() {
            self.done_late.remove(&p);
        } else {
            self.done_late.insert(p, done_late);
        }
    }

    /// Whether job `message_id`, read from partition `p`, was delivered by the partition's
    /// previous owner after this replica's claim (then left out; each id answers so once).
    pub fn done_late(&mut self, p: i32, message_id: &str) -> bool {
        let Some(ids) = self.done_late.get_mut(&p) else { return false };
        let done = ids.remove(message_id);
        if ids.is_empty() {
            self.done_late.remove(&p);
        }
        done
    }

    /// A job record of `device` was read from partition `p` at `offset`: whether it is
    /// already in the delivery log (below the partition's `pos`), to be skipped.
    pub fn read(&mut self, device: &str, p: i32, offset: i64) -> bool {
        if self.devices.get(device) != Some(&p) {
            self.devices.insert(device.to_string(), p);
        }
        self.floor.get(&p).is_some_and(|&floor| offset < floor)
    }

    /// Every device known on the partitions owned.
    pub fn devices(&self) -> Vec<String> {
        self.devices.keys().cloned().collect()
    }

    /// The partition of `device`, when known.
    pub fn partition_of(&self, device: &str) -> Option<i32> {
        self.devices.get(device).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_given_up_takes_its_devices_and_one_taken_skips_what_its_log_has() {
        let mut o = Ownership::default();
        let none = BTreeSet::new();
        let (taken, given) = o.reassigned(BTreeSet::from([0, 1]), &none);
        assert_eq!((taken, given.len()), (vec![0, 1], 0));
        o.restored(1, Some(5), ["b"], HashSet::new());
        assert!(o.read("b", 1, 4), "below the log's pos: in the log already");
        assert!(!o.read("b", 1, 5));
        assert!(!o.read("a", 0, 0), "no log pos: nothing skipped");
        assert_eq!(o.partition_of("a"), Some(0));
        let (taken, given) = o.reassigned(BTreeSet::from([0, 2]), &none);
        assert_eq!(taken, [2]);
        assert_eq!(given, [(1, vec!["b".to_string()])]);
        o.read("a", 0, 9);
        let (taken, given) = o.reassigned(BTreeSet::from([0, 2]), &BTreeSet::from([0]));
        assert_eq!(taken, [0], "revoked and assigned again: taken again, from its log");
        assert_eq!(given, [(0, vec!["a".to_string()])], "and given up first");
        assert_eq!(o.partition_of("b"), None);
        o.restored(1, None, [], HashSet::new());
        assert!(!o.read("b", 1, 0), "the old floor went with the partition");
    }

    #[test]
    fn a_job_the_previous_owner_finished_after_the_claim_is_left_out_once() {
        let mut o = Ownership::default();
        o.reassigned(BTreeSet::from([1, 2]), &BTreeSet::new());
        o.restored(1, Some(5), ["b"], HashSet::from(["m1".to_string(), "m2".to_string()]));
        assert!(!o.done_late(2, "m1"), "another partition's");
        assert!(o.done_late(1, "m1"));
        assert!(!o.done_late(1, "m1"), "once");
        assert!(!o.done_late(1, "m3"));
        // Given up: what was left goes with the partition.
        o.reassigned(BTreeSet::from([2]), &BTreeSet::new());
        assert!(!o.done_late(1, "m2"));
    }
}
