//! The live members as the node's rounds read them: read from the replica once, and kept
//! until the replica changes or a lease of theirs may end.
//!
//! A gossip round, a reconnect round, the anti-entropy exchange, the zone view and the
//! damping each read every member; read from the replica each time (every member's
//! registration, lease and metadata, and a copy of its URL and name), that was about a
//! third of an idle simulated node's work at 1,000 members. The view keeps ids and zones
//! only (about 40 bytes a member, zones shared): a URL or a name is read from the replica
//! for the one member that needs it.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::Arc;

use roster_registry::{RegKey, ReplicaId};

use super::membership::{live_members, member_provider, members_service, LiveMember};
use super::Node;

/// A live member, as the view keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Member {
    /// The node.
    pub(super) id: ReplicaId,
    /// Its zone (one allocation per zone, shared by its members).
    pub(super) zone: Arc<str>,
    /// Whether it is shown only as unreachable (see [`LiveMember::unreachable`]).
    pub(super) unreachable: bool,
    /// Whether its registration has a URL to dial.
    pub(super) dialable: bool,
}

/// The members read at one replica version, valid from the time they were read until the
/// first of their leases ends: only a change of the replica (which
/// [`roster_registry::Replica::version`] counts, the nodes it shows unreachable included)
/// or an end of a lease changes who is live. A clock that went back reads again.
#[derive(Debug, Default)]
pub(super) struct MemberView(RefCell<Option<Read>>);

#[derive(Debug)]
struct Read {
    version: u64,
    from_ms: u64,
    until_ms: u64,
    /// Every live member, this node included.
    all: Arc<[Member]>,
    /// Those [`Node::members`] lists: not this node, not only unreachable, with a URL;
    /// sorted by id.
    others: Arc<[ReplicaId]>,
}

impl Node {
    /// Every live member at `now_ms`, this node included (as `live_members` reads them).
    pub(super) fn live_all(&self, now_ms: u64) -> Arc<[Member]> {
        self.read_members(now_ms, |r| r.all.clone())
    }

    /// The live members other than this node, not only unreachable, with a URL: those
    /// dialed and picked for exchanges.
    pub(super) fn live_others(&self, now_ms: u64) -> Arc<[ReplicaId]> {
        self.read_members(now_ms, |r| r.others.clone())
    }

    /// A live member's URL and name, read from the replica.
    pub(super) fn member_contact(&self, id: ReplicaId, now_ms: u64) -> Option<(String, String)> {
        let key = RegKey {
            service: members_service(),
            provider: member_provider(id),
        };
        let i = self.replica.visible(&key, now_ms)?;
        let m = LiveMember::of(&i)?;
        Some((m.url?.to_string(), m.name.to_string()))
    }

    fn read_members<T>(&self, now_ms: u64, f: impl FnOnce(&Read) -> T) -> T {
        let version = self.replica.version();
        let mut view = self.member_view.0.borrow_mut();
        let fresh = |r: &Read| r.version == version && r.from_ms <= now_ms && now_ms < r.until_ms;
        if !view.as_ref().is_some_and(fresh) {
            *view = Some(self.read_from_replica(version, now_ms));
        }
        f(view.as_ref().expect("just read"))
    }

    fn read_from_replica(&self, version: u64, now_ms: u64) -> Read {
        let live = live_members(&self.replica, now_ms);
        let until_ms = live
            .iter()
            .map(|m| m.lease.deadline_ms())
            .min()
            .unwrap_or(u64::MAX);
        let mut zones: BTreeMap<&str, Arc<str>> = BTreeMap::new();
        let all: Arc<[Member]> = live
            .iter()
            .map(|m| Member {
                id: m.id,
                zone: zones.entry(m.zone).or_insert_with(|| Arc::from(m.zone)).clone(),
                unreachable: m.unreachable,
                dialable: m.url.is_some(),
            })
            .collect();
        let mut others: Vec<ReplicaId> = all
            .iter()
            .filter(|m| m.id != self.me.id && !m.unreachable && m.dialable)
            .map(|m| m.id)
            .collect();
        // Read in provider order, which is id order for every id written as a member's.
        others.sort_unstable();
        Read {
            version,
            from_ms: now_ms,
            until_ms,
            all,
            others: others.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::SmallRng;
    use rand::{RngExt, SeedableRng};
    use roster_registry::{Replica, ReplicaId};

    use super::super::test_support::{info, membership};
    use super::super::Config;
    use super::*;

    /// What the view must hold: the members read from the replica now.
    fn read_now(node: &Node, now_ms: u64) -> Vec<Member> {
        live_members(&node.replica, now_ms)
            .iter()
            .map(|m| Member {
                id: m.id,
                zone: Arc::from(m.zone),
                unreachable: m.unreachable,
                dialable: m.url.is_some(),
            })
            .collect()
    }

    #[test]
    fn the_members_kept_are_those_the_replica_shows_whatever_joins_unreachables_and_time_do() {
        // Seeds fixed here (the protocol's modules take no randomness from outside);
        // each assertion names its own.
        for seed in 0..100u64 {
            let mut rng = SmallRng::seed_from_u64(seed);
            let mut now = 1_000_000;
            let mut node = Node::new(
                info(1),
                Replica::new(ReplicaId(1)),
                vec![],
                Config::default(),
                1,
                now,
            )
            .unwrap();
            for _ in 0..60 {
                let other = rng.random_range(2..8);
                match rng.random_range(0..4) {
                    0 => {
                        let ttl = rng.random_range(5_000..60_000);
                        node.replica.apply(membership(other, 7420, now, ttl), now);
                    }
                    1 => {
                        let until = now + rng.random_range(0..30_000);
                        node.replica
                            .set_unreachable([(ReplicaId(other), now, until)], now);
                    }
                    _ => now += rng.random_range(0..20_000),
                }
                let all = node.live_all(now);
                assert_eq!(&*all, &read_now(&node, now)[..], "seed {seed}, at {now}");
                let others: Vec<ReplicaId> = all
                    .iter()
                    .filter(|m| m.id != ReplicaId(1) && !m.unreachable && m.dialable)
                    .map(|m| m.id)
                    .collect();
                assert_eq!(&*node.live_others(now), &others[..], "seed {seed}, at {now}");
                for m in live_members(&node.replica, now) {
                    let contact = m.url.map(|u| (u.to_string(), m.name.to_string()));
                    assert_eq!(node.member_contact(m.id, now), contact, "seed {seed}, at {now}");
                }
            }
        }
    }
}
