//! Nodes shown as unreachable: a node whose lease ended, or was written dead, is hidden from
//! reads at once, unless the replica's owner judged it unreachable rather than dead (its
//! whole failure domain was cut off, see the protocol's damping). Reads then show its
//! registrations, marked unreachable, until a stand-in lease ends; a sweep does not
//! collect them meanwhile. The judgement is local: nothing of it is replicated.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::{Change, Replica};
use crate::hlc::Hlc;
use crate::id::ReplicaId;
use crate::value::Lease;

impl Replica {
    /// Shows the registrations of `nodes` as unreachable while their own lease is not live:
    /// each `(node, since_ms, until_ms)` from when it was judged unreachable until when
    /// reads stop showing it. Replaces the set given before. Returns what a reader sees
    /// change at `now_ms`: instances of nodes that enter the set come back up (marked
    /// unreachable), those of nodes that leave it go down unless their lease is live.
    pub fn set_unreachable(
        &mut self,
        nodes: impl IntoIterator<Item = (ReplicaId, u64, u64)>,
        now_ms: u64,
    ) -> Vec<Change> {
        let next: BTreeMap<ReplicaId, Lease> = nodes
            .into_iter()
            .map(|(node, since, until)| {
                let ttl_ms = until.saturating_sub(since).max(1);
                (
                    node,
                    Lease {
                        issued: Hlc::new(since, 0),
                        ttl_ms,
                    },
                )
            })
            .collect();
        if *self.unreachable == next {
            return Vec::new();
        }
        let touched: BTreeSet<ReplicaId> = self
            .unreachable
            .keys()
            .chain(next.keys())
            .filter(|n| self.unreachable.get(n) != next.get(n))
            .copied()
            .collect();
        let before = self.read_of(&touched, now_ms);
        // Their ends change reads too (see `lapsed_due`).
        for l in next.values() {
            self.lapse_floor = self.lapse_floor.min(l.deadline_ms());
        }
        self.unreachable = Arc::new(next);
        self.version += 1;
        let after = self.read_of(&touched, now_ms);
        // The same registers before and after: only the set changed, not the state.
        before
            .into_iter()
            .zip(after)
            .filter(|((_, was), (_, shown))| was != shown)
            .map(|((key, _), (_, shown))| match shown {
                Some(i) => Change::Up(i),
                None => Change::Down {
                    service: key.0,
                    provider: key.1,
                },
            })
            .collect()
    }

    /// The nodes shown as unreachable, with when reads stop showing each.
    pub fn unreachable(&self) -> impl Iterator<Item = (ReplicaId, u64)> + '_ {
        self.unreachable.iter().map(|(n, l)| (*n, l.deadline_ms()))
    }

    /// The lease a write of `node` lives by at `now_ms`: its own when live, else its
    /// stand-in while it is shown as unreachable (then `true`).
    pub(super) fn live_lease(&self, node: ReplicaId, now_ms: u64) -> Option<(&Lease, bool)> {
        if let Some(l) = self.lease_of(node).filter(|l| l.is_live(now_ms)) {
            return Some((l, false));
        }
        let stand_in = self.unreachable.get(&node).filter(|l| l.is_live(now_ms))?;
        Some((stand_in, true))
    }

    /// What a read shows of every register `nodes` wrote to.
    #[allow(clippy::type_complexity)]
    fn read_of(
        &self,
        nodes: &BTreeSet<ReplicaId>,
        now_ms: u64,
    ) -> BTreeMap<(crate::ServiceName, crate::ProviderId), Option<super::Instance>> {
        self.state
            .regs
            .iter()
            .filter(|(_, f)| f.dots().any(|d| nodes.contains(&d.actor)))
            .map(|(k, f)| {
                let shown = self.live_instance(k, f, now_ms).map(|i| i.to_owned());
                ((k.service.clone(), k.provider.clone()), shown)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::{Endpoint, Metadata, ProviderId, ServiceName};

    const TTL: u64 = 60_000;

    fn svc() -> ServiceName {
        ServiceName::new("web").unwrap()
    }

    /// Replica 1, holding an instance of node 2 that node 2 registered at `at`.
    fn holding_one(at: u64) -> Replica {
        let mut two = Replica::new(ReplicaId(2));
        let ep = Endpoint::parse("10.0.0.2:80").unwrap();
        let delta = two
            .register(
                svc(),
                ProviderId::new("w2").unwrap(),
                ep,
                Metadata::default(),
                TTL,
                Hlc::new(at, 0),
            )
            .unwrap()
            .delta;
        let mut one = Replica::new(ReplicaId(1));
        one.apply(delta, at);
        one
    }

    fn shown(r: &Replica, now: u64) -> Vec<(String, bool)> {
        r.instances(&svc(), now)
            .map(|i| (i.provider.to_string(), i.unreachable))
            .collect()
    }

    #[test]
    fn a_node_written_dead_is_shown_unreachable_until_its_stand_in_ends_and_no_sweep_takes_it() {
        let mut r = holding_one(1_000);
        let lease = r.lease_dots(ReplicaId(2));
        r.write_dead(ReplicaId(2), &lease, 2_000).unwrap();
        assert!(shown(&r, 2_000).is_empty(), "written dead: hidden");

        let up = r.set_unreachable([(ReplicaId(2), 2_000, 602_000)], 3_000);
        assert!(matches!(&up[..], [Change::Up(i)] if i.unreachable), "{up:?}");
        assert_eq!(shown(&r, 3_000), vec![("w2".to_string(), true)]);
        assert!(
            r.set_unreachable([(ReplicaId(2), 2_000, 602_000)], 3_000)
                .is_empty(),
            "the same set: no change"
        );
        assert!(
            r.expire_holding(500_000, 0, &BTreeSet::new()).is_none(),
            "a sweep leaves it be"
        );
        assert_eq!(shown(&r, 500_000), vec![("w2".to_string(), true)]);
        assert!(shown(&r, 602_000).is_empty(), "its stand-in ended");

        let down = r.set_unreachable([], 4_000);
        assert!(matches!(&down[..], [Change::Down { .. }]), "{down:?}");
        assert!(
            r.expire(4_000, 0).is_some(),
            "out of the set, the sweep collects it"
        );
    }

    #[test]
    fn watchers_are_told_when_a_display_ends_and_when_a_lease_ends_under_one() {
        // Written dead, shown unreachable until 602 s: gone from reads then, and told.
        let mut r = holding_one(1_000);
        let lease = r.lease_dots(ReplicaId(2));
        r.write_dead(ReplicaId(2), &lease, 2_000).unwrap();
        // Looked once with no lease left: nothing to look at until a change says so.
        assert!(r.lapsed_due(2_000, 2_500).is_empty());
        r.set_unreachable([(ReplicaId(2), 2_000, 602_000)], 3_000);
        assert_eq!(r.next_deadline_ms(3_000), Some(602_000));
        assert!(r.lapsed_due(3_000, 601_999).is_empty());
        let down = r.lapsed_due(601_999, 602_000);
        assert!(matches!(&down[..], [Change::Down { .. }]), "{down:?}");

        // Its own lease ends while it is in the set: still shown, now as unreachable.
        let mut r = holding_one(1_000);
        assert!(r
            .set_unreachable([(ReplicaId(2), 1_500, 600_000)], 2_000)
            .is_empty());
        assert!(r.lapsed_due(2_000, 1_000 + TTL - 1).is_empty());
        let flipped = r.lapsed_due(1_000 + TTL - 1, 1_000 + TTL);
        assert!(
            matches!(&flipped[..], [Change::Up(i)] if i.unreachable),
            "{flipped:?}"
        );
        assert_eq!(shown(&r, 1_000 + TTL), vec![("w2".to_string(), true)]);
    }

    #[test]
    fn a_node_whose_own_lease_is_live_is_shown_as_it_is_and_a_hold_spares_it_from_one_sweep() {
        let mut r = holding_one(1_000);
        assert!(r
            .set_unreachable([(ReplicaId(2), 1_500, 600_000)], 2_000)
            .is_empty());
        assert_eq!(
            shown(&r, 2_000),
            vec![("w2".to_string(), false)],
            "its own lease is live"
        );
        r.set_unreachable([], 2_000);
        let hold = BTreeSet::from([ReplicaId(2)]);
        assert!(r.expire_holding(1_000 + TTL, 0, &hold).is_none(), "held");
        assert!(
            r.expire_holding(1_000 + TTL, 0, &BTreeSet::new()).is_some(),
            "then swept"
        );
    }
}
