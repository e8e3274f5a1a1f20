//! Links across zone borders. The zones, sorted by name, stand in a ring. A node keeps
//! its outbound links in its own zone, except the first
//! [`Config::border_links`](super::Config::border_links) nodes of each zone (by id, over
//! the zone's live members: every node ranks them alike): the node of rank `r` keeps one
//! outbound link to a member of the zone `2^r` places on along the ring, when no zone
//! nearer on the other side would link the same pair. So each pair of zones has at most
//! one link, the ring connects them all, and the chords keep paths short when zones are
//! many. A link to another zone counts
//! [`Config::zone_border_cost`](super::Config::zone_border_cost) in the trees' choice of
//! parents, so a change crosses into each zone about once, by the pair's one link, and the
//! zone spreads it (with two links per pair, a zone was entered 1.4-1.6 times per change
//! in the simulator). A cluster that sets no zones has one zone, and all of this does
//! nothing.

use std::collections::{BTreeMap, BTreeSet};

use roster_registry::ReplicaId;

use rand::RngExt;

use super::{DialTarget, Node, Now, Output};

/// The least time between two dials of a border node's target zone past its backoff.
const BORDER_REDIAL_MS: u64 = 2_000;

/// The live members other than this node, by zone: in this node's zone or not.
#[derive(Debug, Default)]
pub(super) struct ZoneView {
    /// Members of this node's zone.
    pub(super) near: BTreeSet<ReplicaId>,
    /// Members of other zones.
    pub(super) far: BTreeSet<ReplicaId>,
    /// The members of the zone this node keeps a border link to, if it is a border node.
    target: BTreeSet<ReplicaId>,
    /// Whether the live members are of more than one zone (whatever `border_links`).
    pub(super) zoned: bool,
}

impl ZoneView {
    /// Whether `peer` is a member of another zone.
    pub(super) fn is_far(&self, peer: ReplicaId) -> bool {
        self.far.contains(&peer)
    }
}

/// The zone, `step` places on along a ring of `zones` zones from the zone at `at`, that
/// the zone at `at` links to; `None` when the pair is linked from the other side (the
/// step is over half the ring, or exactly half and `at` in the ring's second half).
fn ring_target(zones: usize, at: usize, step: usize) -> Option<usize> {
    let linked = 2 * step < zones || (2 * step == zones && 2 * at < zones);
    linked.then_some((at + step) % zones)
}

impl Node {
    /// Where every live member stands, by zone.
    pub(super) fn zone_view(&self, now_ms: u64) -> ZoneView {
        let mut view = ZoneView::default();
        let mut by_zone: BTreeMap<&str, Vec<ReplicaId>> = BTreeMap::new();
        let mine = self.me.zone.as_str();
        by_zone.entry(mine).or_default();
        let members = self.live_all(now_ms);
        for m in members.iter().filter(|m| m.id != self.me.id) {
            view.zoned |= &*m.zone != mine;
            if self.cfg.border_links == 0 || &*m.zone == mine {
                view.near.insert(m.id);
            } else {
                view.far.insert(m.id);
                by_zone.entry(&m.zone).or_default().push(m.id);
            }
        }
        let rank = view.near.range(..self.me.id).count();
        let zones: Vec<&str> = by_zone.keys().copied().collect();
        let at = zones.iter().position(|z| *z == mine).unwrap_or(0);
        let target = (rank < self.cfg.border_links && rank < 32)
            .then(|| ring_target(zones.len(), at, 1 << rank))
            .flatten();
        if let Some(t) = target.filter(|&t| t != at) {
            view.target = by_zone[zones[t]].iter().copied().collect();
        }
        view
    }

    /// How many of this node's outbound links should cross into another zone: one for a
    /// border node, and as many as its own zone lacks members to fill the rest.
    fn border_links_wanted(&self, view: &ZoneView) -> usize {
        if view.far.is_empty() {
            return 0;
        }
        let max = self.cfg.max_outbound;
        let own = usize::from(!view.target.is_empty()).max(max.saturating_sub(view.near.len()));
        own.min(max)
    }

    /// Outbound links (not for an exchange) open to members of another zone.
    fn border_links_open(&self, view: &ZoneView) -> usize {
        self.conns
            .values()
            .filter(|c| c.outbound && !c.sync && view.is_far(c.peer))
            .count()
    }

    /// Every reconnect round: links cost what their zones say (a peer's membership may
    /// arrive after its connection), and a border node short of a border link moves one.
    pub(super) fn tend_borders(&mut self, now: Now) {
        let view = self.zone_view(now.wall_ms);
        self.damping.zoned = view.zoned;
        self.border_node = !view.target.is_empty();
        self.cost_links_by_zone(&view);
        self.rebalance_border(&view, now);
    }

    /// Each gossip round: a border node (as the last reconnect round found it) whose border
    /// link is down dials its target zone (see `redial_border`). The other nodes, most of
    /// them, read no membership for it.
    pub(super) fn tend_border_link(&mut self, now: Now) {
        let spaced = self
            .border_redialed_at
            .is_none_or(|t| now.mono_ms >= t + BORDER_REDIAL_MS);
        if self.border_node && spaced {
            let view = self.zone_view(now.wall_ms);
            self.redial_border(&view, now);
        }
    }

    /// A border node with no link to its target zone dials a member of it, past that
    /// member's backoff, at most every [`BORDER_REDIAL_MS`]: during a zone's cut every dial
    /// across fails and backoffs grow to their cap (30 s, ±50%), so after the heal nobody
    /// dialed across for up to 45 s (a Jepsen run: over 30 s). One dial in flight per
    /// border node, at most three border nodes per zone: a zone that stays cut off takes a
    /// dial every few seconds from each ring neighbour, not a storm.
    fn redial_border(&mut self, view: &ZoneView, now: Now) {
        if self.guarded || self.stopping || !self.cfg.dial || view.target.is_empty() {
            return;
        }
        let linked = self
            .conns
            .values()
            .any(|c| !c.sync && view.target.contains(&c.peer));
        let dialing = view.target.iter().any(|id| self.dialing(*id));
        if linked || dialing || self.outbound_room(now) == 0 {
            return;
        }
        let urls: Vec<(ReplicaId, String)> = view
            .target
            .iter()
            .filter_map(|&id| Some((id, self.member_contact(id, now.wall_ms)?.0)))
            .collect();
        if urls.is_empty() {
            return;
        }
        let (id, url) = urls[self.rng.random_range(0..urls.len())].clone();
        self.border_redialed_at = Some(now.mono_ms);
        self.peers.entry(id).or_default().dialing = Some(now.mono_ms);
        self.counters.dials += 1;
        self.outputs.push_back(Output::Dial(DialTarget::Peer { id, url }));
    }

    /// Gives each connected peer's link its cost in the trees: `zone_border_cost` to a
    /// member of another zone, 1 within the zone.
    /// Nothing while every member is in this node's zone: what [`Node::set_link_cost`]
    /// set stands.
    pub(super) fn cost_links_by_zone(&mut self, view: &ZoneView) {
        if view.far.is_empty() {
            return;
        }
        let peers: BTreeSet<ReplicaId> = self.conns.values().map(|c| c.peer).collect();
        for peer in peers {
            let cost = if view.is_far(peer) {
                self.cfg.zone_border_cost
            } else {
                1
            };
            self.trees.set_cost(peer, cost);
        }
    }

    /// Moves one outbound link across the border or back, when the links differ from what
    /// the zones want (they formed before this node knew the zones, or its rank changed
    /// with the membership): a border node short of its border link closes a link in its
    /// zone, and a node with more links out of its zone than it wants closes one (keeping
    /// one to its target zone), so that the next gossip round dials where the link belongs. Only
    /// when a member there may be dialed now: during a zone's cut the link would come back
    /// at the next round, and go again. At most one link a call.
    fn rebalance_border(&mut self, view: &ZoneView, now: Now) {
        if self.guarded || !self.cfg.dial || view.far.is_empty() {
            return;
        }
        let outbound: Vec<ReplicaId> = self
            .conns
            .values()
            .filter(|c| c.outbound && !c.sync && c.seed.is_none())
            .map(|c| c.peer)
            .collect();
        if outbound.len() < self.cfg.max_outbound {
            return;
        }
        let (open, wanted) = (self.border_links_open(view), self.border_links_wanted(view));
        let astray = !view.target.is_empty() && !outbound.iter().any(|p| view.target.contains(p));
        let (close, to): (Option<&ReplicaId>, &BTreeSet<ReplicaId>) = if open == wanted && astray {
            // A border node whose links out of its zone all go elsewhere than its target
            // zone: one of them moves there.
            (outbound.iter().find(|p| view.is_far(**p)), &view.target)
        } else if open < wanted {
            let to = if view.target.is_empty() {
                &view.far
            } else {
                &view.target
            };
            (outbound.iter().find(|p| view.near.contains(p)), to)
        } else if open > wanted {
            // A link out of the zone that is not the border link: one to another zone, or a
            // second one to the target zone (a link from before the zones were known).
            let into_target = outbound.iter().filter(|p| view.target.contains(p)).count();
            let spare = |p: &&ReplicaId| view.is_far(**p) && (!view.target.contains(p) || into_target > 1);
            (outbound.iter().find(spare), &view.near)
        } else {
            return;
        };
        let Some(&peer) = close else {
            return;
        };
        if to.iter().any(|id| self.may_dial(*id, now)) {
            if let Some(conn) = self
                .conns
                .iter()
                .find(|(_, c)| c.outbound && c.peer == peer)
                .map(|(id, _)| *id)
            {
                self.close(conn, "moving a link to where its zone wants it", now);
            }
        }
    }

    /// Whether `peer` is neither connected nor being dialed, and past its backoff.
    fn may_dial(&self, peer: ReplicaId, now: Now) -> bool {
        !self.conns.values().any(|c| c.peer == peer)
            && self
                .peers
                .get(&peer)
                .is_none_or(|p| p.dialing.is_none() && p.backoff.ready(now.mono_ms))
    }

    /// Dials up to `room` of `candidates`: across the border first (to its ring's target
    /// zone) while this node has fewer border links than it wants, then in its zone. A
    /// node with no candidate left on one side fills its room from the other, so no node
    /// is left short of links. Returns the room left.
    pub(super) fn dial_by_zone(
        &mut self,
        candidates: Vec<(ReplicaId, String)>,
        room: usize,
        now: Now,
    ) -> usize {
        // A cluster of one zone (as far as this node has seen) reads no membership here.
        if !self.damping.zoned {
            return self.dial_peers(candidates, room, now);
        }
        let view = self.zone_view(now.wall_ms);
        if view.far.is_empty() {
            return self.dial_peers(candidates, room, now);
        }
        let border_room = self
            .border_links_wanted(&view)
            .saturating_sub(self.border_links_open(&view))
            .min(room);
        let (far, near): (Vec<_>, Vec<_>) = candidates.into_iter().partition(|(id, _)| view.is_far(*id));
        let border: Vec<_> = far
            .iter()
            .filter(|(id, _)| view.target.is_empty() || view.target.contains(id))
            .cloned()
            .collect();
        let left = self.dial_peers(border, border_room, now);
        // A border node keeps its slot for its target zone: filled from its own zone while
        // the target could not be dialed (a cut), the slot stayed there after the heal.
        let room = room - border_room + if view.target.is_empty() { left } else { 0 };
        let room = self.dial_peers(near, room, now);
        let far: Vec<_> = far.into_iter().filter(|(id, _)| !self.dialing(*id)).collect();
        self.dial_peers(far, room, now)
    }

    fn dialing(&self, peer: ReplicaId) -> bool {
        self.peers.get(&peer).is_some_and(|p| p.dialing.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::ring_target;

    #[test]
    fn each_pair_of_zones_on_the_ring_is_linked_once_and_the_ring_connects_them() {
        for zones in 2..40 {
            let mut pairs = std::collections::BTreeSet::new();
            for at in 0..zones {
                for rank in 0..6 {
                    if let Some(t) = ring_target(zones, at, 1 << rank) {
                        assert!(
                            pairs.insert((at.min(t), at.max(t))),
                            "{zones} zones: {at}-{t} twice"
                        );
                    }
                }
                assert_eq!(
                    ring_target(zones, at, 1),
                    Some((at + 1) % zones).filter(|_| zones > 2 || at == 0)
                );
            }
        }
    }
}
