//! The local copy of a map and the rule that keeps it equal to Redis.
//!
//! A change applies only when it is the next revision of the same epoch.
//! An older revision is already reflected and is skipped, but only until
//! the first change heard after a snapshot applies: the older ones are
//! those published between the subscription and the snapshot, and they
//! come first. After that, a revision heard twice means Redis went back
//! (a failover lost changes it had published) and new changes reuse the
//! numbers: the replica reloads. A gap or another epoch means the replica
//! missed something (or the map was recreated), so it reloads the whole
//! map instead of guessing.

use std::collections::HashMap;

use crate::codec::{Change, Op, decode_list, encode_list};
use crate::subscription::MapEvent;

/// Where a replica stands: the map's epoch, the last revision applied, and
/// how many snapshots it has loaded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Position {
    pub(crate) epoch: Option<String>,
    pub(crate) rev: u64,
    pub(crate) snapshots: u64,
}

/// The local copy.
#[derive(Debug, Default)]
pub(crate) struct Replica {
    pub(crate) content: HashMap<String, String>,
    pub(crate) position: Position,
    /// A change heard on the channel applied since the last snapshot.
    live: bool,
}

/// What applying a change did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Applied {
    /// The replica changed; tell subscribers.
    Changed(MapEvent),
    /// Already reflected: nothing to do.
    Stale,
    /// The replica missed something: reload the map.
    Resync,
}

impl Replica {
    /// Replaces everything with a snapshot of the hash (`HGETALL`).
    /// Returns whether the snapshot is of an earlier revision of the same
    /// epoch than the replica had: Redis lost changes it had published (a
    /// failover before they reached the replica that took over). That is
    /// logged; the snapshot is taken all the same, as it is what Redis
    /// holds.
    pub(crate) fn load(&mut self, mut fields: HashMap<String, String>) -> bool {
        let epoch = fields.remove("=epoch");
        let rev = fields.remove("=rev").and_then(|r| r.parse().ok()).unwrap_or(0);
        fields.retain(|key, _| !key.starts_with('='));
        let went_back = epoch.is_some() && epoch == self.position.epoch && rev < self.position.rev;
        if went_back {
            tracing::error!(
                from = self.position.rev,
                to = rev,
                "the map went back to an earlier revision: Redis lost changes it had published (a failover before they were replicated?)"
            );
        }
        self.content = fields;
        self.position = Position { epoch, rev, snapshots: self.position.snapshots + 1 };
        self.live = false;
        went_back
    }

    /// Applies one change message under the revision rule.
    pub(crate) fn apply(&mut self, change: Change) -> Applied {
        let fresh_map = self.position.epoch.is_none() && change.rev == 1;
        if self.position.epoch.as_deref() != Some(change.epoch.as_str()) && !fresh_map {
            return Applied::Resync;
        }
        if change.rev <= self.position.rev && !fresh_map {
            return if self.live { Applied::Resync } else { Applied::Stale };
        }
        if change.rev != self.position.rev + 1 && !fresh_map {
            return Applied::Resync;
        }
        let event = match change.op {
            Op::Set { key, value } => {
                self.content.insert(key.clone(), value.clone());
                MapEvent::Set { key, value }
            }
            Op::SetMany { entries } => {
                for (key, value) in &entries {
                    self.content.insert(key.clone(), value.clone());
                }
                MapEvent::SetMany { entries }
            }
            Op::Delete { key } => {
                self.content.remove(&key);
                MapEvent::Deleted { key }
            }
            Op::Append { key, suffix } => {
                let value = self.content.entry(key.clone()).or_default();
                value.push_str(&suffix);
                MapEvent::Set { key, value: value.clone() }
            }
            Op::Remove { key, items } => {
                let Some(list) = self.content.get(&key).and_then(|v| decode_list(v)) else {
                    return Applied::Resync;
                };
                let kept: Vec<&String> = list.iter().filter(|item| !items.contains(item)).collect();
                let value = encode_list(&kept);
                self.content.insert(key.clone(), value.clone());
                MapEvent::Set { key, value }
            }
            Op::Reset => {
                self.content.clear();
                MapEvent::Reset
            }
            Op::Destroy => {
                self.content.clear();
                self.position.epoch = None;
                self.position.rev = 0;
                return Applied::Changed(MapEvent::Reset);
            }
        };
        self.position.epoch = Some(change.epoch);
        self.position.rev = change.rev;
        self.live = true;
        Applied::Changed(event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(epoch: &str, rev: u64) -> HashMap<String, String> {
        HashMap::from([("=epoch".into(), epoch.into()), ("=rev".into(), rev.to_string())])
    }

    #[test]
    fn a_snapshot_of_an_earlier_revision_of_the_same_map_says_changes_were_lost() {
        let mut replica = Replica::default();
        assert!(!replica.load(snapshot("e", 5)), "a first snapshot");
        assert!(!replica.load(snapshot("e", 7)), "a later revision");
        assert!(replica.load(snapshot("e", 6)), "an earlier revision of the same epoch");
        assert_eq!(replica.position.rev, 6, "what Redis holds is taken");
        assert!(!replica.load(snapshot("f", 1)), "another epoch: the map was made again");
    }

    fn change(epoch: &str, rev: u64, op: Op) -> Change {
        Change { epoch: epoch.into(), rev, op }
    }

    fn set(key: &str, value: &str) -> Op {
        Op::Set { key: key.into(), value: value.into() }
    }

    #[test]
    fn applies_the_next_revision_skips_old_ones_and_resyncs_on_gaps() {
        let mut replica = Replica::default();
        replica.load(snapshot("e", 3));
        assert_eq!(replica.apply(change("e", 3, set("a", "old"))), Applied::Stale);
        assert!(matches!(replica.apply(change("e", 4, set("a", "1"))), Applied::Changed(_)));
        assert_eq!(replica.apply(change("e", 6, set("a", "2"))), Applied::Resync, "revision 5 is missing");
        assert_eq!(replica.apply(change("other", 5, set("a", "2"))), Applied::Resync, "another epoch");
        assert_eq!(replica.content["a"], "1");
        assert_eq!(replica.position.rev, 4);
    }

    #[test]
    fn a_revision_heard_twice_after_a_live_change_means_redis_went_back() {
        let mut replica = Replica::default();
        replica.load(snapshot("e", 5));
        assert_eq!(
            replica.apply(change("e", 4, set("a", "queued"))),
            Applied::Stale,
            "published before the snapshot"
        );
        assert!(matches!(replica.apply(change("e", 6, set("a", "1"))), Applied::Changed(_)));
        assert!(matches!(replica.apply(change("e", 7, set("a", "2"))), Applied::Changed(_)));
        // Redis lost revisions 6 and 7 and numbers its next changes again.
        assert_eq!(replica.apply(change("e", 6, set("a", "other"))), Applied::Resync);
        replica.load(snapshot("e", 6));
        assert_eq!(
            replica.apply(change("e", 6, set("a", "other"))),
            Applied::Stale,
            "before the first live change"
        );
    }

    #[test]
    fn list_deltas_rebuild_the_same_encoding() {
        let mut replica = Replica::default();
        let suffix = encode_list(&["a", "b", "a", "c"]);
        replica.apply(change("e", 1, Op::Append { key: "l".into(), suffix }));
        replica.apply(change("e", 2, Op::Remove { key: "l".into(), items: vec!["a".into()] }));
        assert_eq!(replica.content["l"], encode_list(&["b", "c"]));
    }

    #[test]
    fn destroy_forgets_the_epoch_and_a_new_map_is_adopted() {
        let mut replica = Replica::default();
        replica.apply(change("e", 1, set("a", "1")));
        replica.apply(change("e", 2, Op::Destroy));
        assert!(replica.content.is_empty());
        assert_eq!(replica.position.epoch, None);
        assert!(matches!(replica.apply(change("f", 1, set("b", "2"))), Applied::Changed(_)));
        assert_eq!(replica.position.epoch.as_deref(), Some("f"));
    }
}
