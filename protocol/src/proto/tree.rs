//! Per-origin dissemination trees (Plumtree: Leitão, Pereira, Rodrigues, SRDS 2007, with
//! its eager and lazy sets kept per root, as Riak's plumtree keeps them).
//!
//! Every link starts eager for every root: a root's first change floods. A node that
//! receives a copy of a change it already had asks one of the two links to push that
//! root's changes no more: the one whose copy crossed more links (so its parent is its
//! neighbour nearest the root). After one change the links still eager for a root form
//! its tree, about as shallow as the links allow, and later changes of that root cross
//! each node about once. On a link that is lazy for a root the
//! change is only announced (its id, batched); a node that hears of a change it lacks and
//! does not receive it within a graft timeout grafts the link: the announcer sends it, and
//! the link is eager for that root again. Announcements go with the pushes (or alone,
//! acknowledged like them), so one lost with its link is sent again. So a tree with a hole (a link lost, a node in
//! between restarted) repairs itself within a timeout of the first change that misses it.
//!
//! This file holds what a node knows of its trees, with no I/O and no clock read: which
//! roots each peer is held back from, the changes seen (per root, bounded), where each
//! root's newest change came from, and the changes announced and missing.

use std::collections::{BTreeMap, BTreeSet};

use roster_registry::{Hlc, ReplicaId};

use crate::message::{ChangeId, Tagged, MAX_TREE_IDS};

/// The changes remembered as seen per root: older ones (below the least kept) count as
/// seen. Changes of one root arrive in about their order (one tree), so a few suffice.
const SEEN_PER_ROOT: usize = 16;

/// The most roots whose changes are remembered as seen; past it the oldest-numbered root
/// is forgotten (its next announcement may cost a needless graft).
const MAX_ROOTS: usize = 65_536;

/// The most changes announced to us and missing, waiting for their graft.
const MAX_MISSING: usize = 4_096;

/// What a node knows of the changes of one root.
#[derive(Debug, Clone, Default)]
struct Seen {
    /// Every change up to this is taken as seen.
    floor: Hlc,
    /// The newest changes seen, above the floor.
    recent: BTreeSet<Hlc>,
}

impl Seen {
    fn has(&self, at: Hlc) -> bool {
        at <= self.floor || self.recent.contains(&at)
    }

    /// Records `at`; returns whether it is new.
    fn insert(&mut self, at: Hlc) -> bool {
        if self.has(at) {
            return false;
        }
        self.recent.insert(at);
        while self.recent.len() > SEEN_PER_ROOT {
            if let Some(oldest) = self.recent.pop_first() {
                self.floor = oldest;
            }
        }
        true
    }
}

/// A change announced to us that we lack.
#[derive(Debug, Clone)]
struct Missing {
    /// The peers that announced it, in order, each with the links its copy crossed.
    announcers: Vec<(ReplicaId, u16)>,
    /// When the next graft goes (monotonic ms).
    graft_at: u64,
}

/// Where a root's newest change came from, and by how many links.
#[derive(Debug, Clone, Copy)]
struct Parent {
    at: Hlc,
    peer: ReplicaId,
    hops: u16,
    /// Whether a nearer link was grafted for this change already.
    sought: bool,
}

/// A node's trees.
#[derive(Debug, Default)]
pub(super) struct Trees {
    /// For each peer, the roots whose changes it is not pushed (lazy links).
    held: BTreeMap<ReplicaId, BTreeSet<ReplicaId>>,
    /// For each peer, the roots it was asked to push us no more (until grafted): the other
    /// end's `held`. A change of one that it pushes all the same (in one delta with a
    /// change of a root it does push) comes off the root's tree.
    pruned: BTreeMap<ReplicaId, BTreeSet<ReplicaId>>,
    seen: BTreeMap<ReplicaId, Seen>,
    /// For each root, its newest change that arrived here and the peer it came from.
    parent: BTreeMap<ReplicaId, Parent>,
    missing: BTreeMap<ChangeId, Missing>,
    /// What crossing the link from a peer counts, where it is not 1 (a link to another
    /// failure domain, say): the trees take the paths of the least cost.
    cost: BTreeMap<ReplicaId, u16>,
}

impl Trees {
    /// The roots held back from `peer`, if any.
    pub(super) fn held_for(&self, peer: ReplicaId) -> Option<&BTreeSet<ReplicaId>> {
        self.held.get(&peer)
    }

    /// Whether `peer` is pushed the changes of `root`.
    #[cfg(test)]
    pub(super) fn is_eager(&self, peer: ReplicaId, root: ReplicaId) -> bool {
        !self.held.get(&peer).is_some_and(|h| h.contains(&root))
    }

    /// Whether the change was seen.
    pub(super) fn has(&self, id: &ChangeId) -> bool {
        self.seen.get(&id.root).is_some_and(|s| s.has(id.at))
    }

    /// Records a change as seen (made here, or arrived); returns whether it is new. It is
    /// missing no more.
    pub(super) fn observe(&mut self, id: ChangeId) -> bool {
        self.missing.remove(&id);
        if !self.seen.contains_key(&id.root) && self.seen.len() >= MAX_ROOTS {
            self.seen.pop_first();
        }
        self.seen.entry(id.root).or_default().insert(id.at)
    }

    /// Whether `id` counts as seen only for being older than the newest kept (it never
    /// arrived here as far as this node remembers).
    pub(super) fn seen_by_age(&self, id: &ChangeId) -> bool {
        self.seen
            .get(&id.root)
            .is_some_and(|s| id.at <= s.floor && !s.recent.contains(&id.at))
    }

    /// `id` looked seen, but it is new: its root named it below what this node had seen
    /// from it, so the root's clock went back (it ran ahead, and came back or restarted
    /// with its clock set right). What was seen of the root, and where its newest change
    /// came from, are forgotten, and `id` is its first change seen since.
    pub(super) fn renamed(&mut self, id: ChangeId) {
        let mut seen = Seen::default();
        seen.insert(id.at);
        self.seen.insert(id.root, seen);
        self.parent.remove(&id.root);
    }

    /// The new change `t` came from `peer`. From a peer that was asked to push its root's
    /// changes no more, it came off the root's tree (in one delta with a change of a root
    /// the peer does push): the parent stays, or the copy the tree brings would prune the
    /// tree's link, and leave this node with no link on the tree at all.
    pub(super) fn arrived_from(&mut self, peer: ReplicaId, t: Tagged) {
        if self.was_pruned(peer, t.id.root) {
            return;
        }
        let newer = self.parent.get(&t.id.root).is_none_or(|p| p.at < t.id.at);
        if newer && (self.parent.contains_key(&t.id.root) || self.parent.len() < MAX_ROOTS) {
            let parent = Parent {
                at: t.id.at,
                peer,
                hops: t.hops,
                sought: false,
            };
            self.parent.insert(t.id.root, parent);
        }
    }

    /// `peer` sent a copy `t` of a change we had. When `t` is its root's newest change
    /// and came by at least `saving` fewer links than the copy that brought it first,
    /// `peer` is the root's parent from now on: returns the one it replaces, which is to
    /// be pruned instead of `peer`.
    pub(super) fn closer(&mut self, peer: ReplicaId, t: Tagged, saving: u16) -> Option<ReplicaId> {
        let p = self.parent.get_mut(&t.id.root)?;
        if p.at != t.id.at || t.hops.saturating_add(saving.max(1)) > p.hops || p.peer == peer {
            return None;
        }
        let old = p.peer;
        p.peer = peer;
        p.hops = t.hops;
        Some(old)
    }

    /// Whether `peer` brought the newest change of `root` here first.
    pub(super) fn is_parent(&self, root: ReplicaId, peer: ReplicaId) -> bool {
        self.parent.get(&root).is_some_and(|p| p.peer == peer)
    }

    /// How many links the newest change of `root` that arrived here crossed, each counted
    /// at its cost.
    pub(super) fn hops(&self, root: ReplicaId) -> Option<u16> {
        self.parent.get(&root).map(|p| p.hops)
    }

    /// `peer`, a lazy link for `t`'s root, announced `t`, which would have come by it
    /// at less cost than by the parent: when it saves at least `saving`, `peer` is the
    /// root's parent from now on (to be grafted) and the parent it replaces is returned,
    /// to be pruned. Once per change of the root, so one announcement grafts one link.
    /// Before, the old parent stayed until the next change came by both links; but where
    /// the costly path is the fast one, `peer` got each change from us first and so never
    /// sent it back, and the costly parent stayed for good.
    pub(super) fn nearer(&mut self, peer: ReplicaId, t: Tagged, saving: u16) -> Option<ReplicaId> {
        let p = self.parent.get_mut(&t.id.root)?;
        let nearer =
            !p.sought && p.at == t.id.at && p.peer != peer && t.hops.saturating_add(saving.max(1)) <= p.hops;
        if !nearer {
            return None;
        }
        let old = p.peer;
        *p = Parent {
            at: p.at,
            peer,
            hops: t.hops,
            sought: true,
        };
        Some(old)
    }

    /// Whether `peer`, which announced a change it got by links costing `theirs`, could
    /// save `saving` by our path to its root, which cost `ours` (unknown: it could), with
    /// the link between us.
    pub(super) fn could_shorten(&self, peer: ReplicaId, ours: Option<u16>, theirs: u16, saving: u16) -> bool {
        let cost = self.link_cost(peer);
        ours.is_none_or(|h| h.saturating_add(cost).saturating_add(saving.max(1)) <= theirs)
    }

    /// What the links `id` came here by cost, while it is its root's newest change here.
    pub(super) fn hops_of(&self, id: &ChangeId) -> Option<u16> {
        self.parent
            .get(&id.root)
            .filter(|p| p.at == id.at)
            .map(|p| p.hops)
    }

    /// The peers that announced `id` while it was missing here, each with the links its
    /// copy crossed.
    pub(super) fn announcers(&self, id: &ChangeId) -> &[(ReplicaId, u16)] {
        self.missing.get(id).map_or(&[], |m| m.announcers.as_slice())
    }

    /// The peer that brought the newest change of `root` here.
    pub(super) fn parent_of(&self, root: ReplicaId) -> Option<ReplicaId> {
        self.parent.get(&root).map(|p| p.peer)
    }

    /// Sets what crossing the link from `peer` counts (at least 1; 1 is the default, and
    /// forgets the peer's entry). Past `MAX_ROOTS` peers with a cost, new ones count 1.
    pub(super) fn set_cost(&mut self, peer: ReplicaId, cost: u16) {
        if cost <= 1 {
            self.cost.remove(&peer);
        } else if self.cost.contains_key(&peer) || self.cost.len() < MAX_ROOTS {
            self.cost.insert(peer, cost);
        }
    }

    /// What crossing the link from `peer` counts.
    pub(super) fn link_cost(&self, peer: ReplicaId) -> u16 {
        self.cost.get(&peer).copied().unwrap_or(1)
    }

    /// What `t`, received from `peer`, has cost here: its count and the link's.
    pub(super) fn via(&self, peer: ReplicaId, t: Tagged) -> Tagged {
        let cost = self.link_cost(peer);
        Tagged {
            id: t.id,
            hops: t.hops.saturating_add(cost),
        }
    }

    /// Whether `peer` was asked to push `root`'s changes here no more.
    fn was_pruned(&self, peer: ReplicaId, root: ReplicaId) -> bool {
        self.pruned.get(&peer).is_some_and(|r| r.contains(&root))
    }

    /// `peer` was asked to push these roots' changes here no more (`ask` true), or to push
    /// them again (a graft).
    pub(super) fn asked(&mut self, peer: ReplicaId, roots: impl IntoIterator<Item = ReplicaId>, ask: bool) {
        let pruned = self.pruned.entry(peer).or_default();
        for root in roots {
            if !ask {
                pruned.remove(&root);
            } else if pruned.len() < MAX_ROOTS {
                pruned.insert(root);
            }
        }
        if pruned.is_empty() {
            self.pruned.remove(&peer);
        }
    }

    /// `peer` is pushed `root`'s changes no more.
    pub(super) fn prune(&mut self, peer: ReplicaId, root: ReplicaId) {
        let held = self.held.entry(peer).or_default();
        if held.len() < MAX_ROOTS {
            held.insert(root);
        }
    }

    /// `peer` is pushed `root`'s changes again.
    pub(super) fn graft(&mut self, peer: ReplicaId, root: ReplicaId) {
        if let Some(h) = self.held.get_mut(&peer) {
            h.remove(&root);
            if h.is_empty() {
                self.held.remove(&peer);
            }
        }
    }

    /// The link to `peer` is gone: a new one starts eager for every root, and it is
    /// grafted from no more.
    pub(super) fn forget_peer(&mut self, peer: ReplicaId) {
        self.held.remove(&peer);
        self.pruned.remove(&peer);
        self.parent.retain(|_, p| p.peer != peer);
        for m in self.missing.values_mut() {
            m.announcers.retain(|(p, _)| *p != peer);
        }
        self.missing.retain(|_, m| !m.announcers.is_empty());
    }

    /// `peer` announced `t`: when we lack it, it is missing from `peer` too, and a graft
    /// is due at `graft_at` unless it arrives first. Returns whether we lack it.
    pub(super) fn announced(&mut self, peer: ReplicaId, t: Tagged, graft_at: u64) -> bool {
        if self.has(&t.id) {
            return false;
        }
        if !self.missing.contains_key(&t.id) && self.missing.len() >= MAX_MISSING {
            return true;
        }
        let m = self.missing.entry(t.id).or_insert(Missing {
            announcers: Vec::new(),
            graft_at,
        });
        if !m.announcers.iter().any(|(p, _)| *p == peer) {
            m.announcers.push((peer, t.hops));
        }
        true
    }

    /// When the next graft is due (monotonic ms).
    pub(super) fn next_graft_at(&self) -> Option<u64> {
        self.missing.values().map(|m| m.graft_at).min()
    }

    /// The grafts due at `now`: per announcer, the changes to ask it for. Each missing
    /// change is asked of its first announcer not asked yet; the next is asked at
    /// `now + retry_ms` if it still has not arrived, and one with no announcer left is
    /// given up (the anti-entropy exchange brings it).
    pub(super) fn due_grafts(&mut self, now: u64, retry_ms: u64) -> Vec<(ReplicaId, Vec<ChangeId>)> {
        let mut asks: BTreeMap<ReplicaId, Vec<ChangeId>> = BTreeMap::new();
        let mut given_up = Vec::new();
        for (id, m) in self.missing.iter_mut().filter(|(_, m)| m.graft_at <= now) {
            if m.announcers.is_empty() {
                given_up.push(*id);
                continue;
            }
            let (peer, _) = m.announcers.remove(0);
            asks.entry(peer).or_default().push(*id);
            m.graft_at = now + retry_ms.max(1);
        }
        for id in given_up {
            self.missing.remove(&id);
        }
        asks.into_iter()
            .flat_map(|(p, ids)| {
                ids.chunks(MAX_TREE_IDS)
                    .map(|c| (p, c.to_vec()))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// How many changes are missing.
    #[cfg(test)]
    pub(super) fn missing_len(&self) -> usize {
        self.missing.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(root: u64, at: u64) -> ChangeId {
        ChangeId {
            root: ReplicaId(root),
            at: Hlc::new(at, 0),
        }
    }

    fn tagged(root: u64, at: u64) -> Tagged {
        Tagged {
            id: id(root, at),
            hops: 1,
        }
    }

    #[test]
    fn a_change_is_new_once_and_old_ones_count_as_seen() {
        let mut t = Trees::default();
        assert!(t.observe(id(1, 10)));
        assert!(!t.observe(id(1, 10)), "a copy is not new");
        for at in 11..40 {
            assert!(t.observe(id(1, at)));
        }
        assert!(t.has(&id(1, 5)), "below the kept window: taken as seen");
        assert!(!t.has(&id(1, 41)));
        assert!(!t.has(&id(2, 10)), "roots are apart");
    }

    #[test]
    fn a_renamed_root_forgets_what_was_seen_of_it_and_its_parent() {
        let mut t = Trees::default();
        for at in 100..140 {
            assert!(t.observe(id(1, at)));
        }
        t.arrived_from(ReplicaId(7), tagged(1, 139));
        t.observe(id(2, 50));
        assert!(t.has(&id(1, 20)), "named below what was seen: taken as seen");
        assert!(
            t.seen_by_age(&id(1, 20)) && !t.seen_by_age(&id(1, 139)),
            "139 arrived"
        );
        t.renamed(id(1, 20));
        assert!(t.has(&id(1, 20)) && !t.has(&id(1, 21)) && !t.has(&id(1, 19)));
        assert_eq!(
            t.parent_of(ReplicaId(1)),
            None,
            "the parent of the old names is gone"
        );
        assert!(t.observe(id(1, 21)), "the root's next change is new");
        assert!(t.has(&id(2, 50)), "other roots keep what was seen");
    }

    #[test]
    fn a_pruned_root_is_held_back_until_grafted_or_the_link_is_gone() {
        let mut t = Trees::default();
        let (p, r) = (ReplicaId(7), ReplicaId(1));
        assert!(t.is_eager(p, r));
        t.prune(p, r);
        assert!(!t.is_eager(p, r) && t.is_eager(p, ReplicaId(2)));
        t.graft(p, r);
        assert!(t.is_eager(p, r) && t.held_for(p).is_none());
        t.prune(p, r);
        t.forget_peer(p);
        assert!(t.is_eager(p, r), "a new link starts eager");
    }

    #[test]
    fn a_missing_change_is_grafted_from_each_announcer_in_turn_then_given_up() {
        let mut t = Trees::default();
        let (a, b) = (ReplicaId(7), ReplicaId(8));
        assert!(t.announced(a, tagged(1, 10), 80));
        assert!(t.announced(b, tagged(1, 10), 90));
        assert_eq!(
            t.next_graft_at(),
            Some(80),
            "the first announcement sets the time"
        );
        assert!(t.due_grafts(79, 40).is_empty());
        assert_eq!(t.due_grafts(80, 40), vec![(a, vec![id(1, 10)])]);
        assert_eq!(t.due_grafts(120, 40), vec![(b, vec![id(1, 10)])]);
        assert!(t.due_grafts(160, 40).is_empty());
        assert_eq!(t.missing_len(), 0, "given up: anti-entropy brings it");
    }

    #[test]
    fn a_change_that_arrives_is_grafted_from_nobody() {
        let mut t = Trees::default();
        assert!(t.announced(ReplicaId(7), tagged(1, 10), 80));
        assert!(t.observe(id(1, 10)));
        assert!(t.due_grafts(80, 40).is_empty());
        assert!(!t.announced(ReplicaId(8), tagged(1, 10), 90), "already had");
    }

    #[test]
    fn the_peer_that_brought_a_roots_newest_change_is_its_parent() {
        let mut t = Trees::default();
        let (a, b) = (ReplicaId(7), ReplicaId(8));
        let at = |change| Tagged {
            id: id(1, change),
            hops: 2,
        };
        t.arrived_from(a, at(10));
        t.arrived_from(b, at(9));
        assert!(t.is_parent(ReplicaId(1), a), "an older change does not move it");
        t.arrived_from(b, at(11));
        assert!(t.is_parent(ReplicaId(1), b) && !t.is_parent(ReplicaId(2), b));
        t.forget_peer(b);
        assert!(!t.is_parent(ReplicaId(1), b));
    }

    #[test]
    fn a_change_from_a_link_pruned_for_its_root_leaves_the_parent_until_a_graft() {
        let mut t = Trees::default();
        let (a, b) = (ReplicaId(7), ReplicaId(8));
        let root = ReplicaId(1);
        let at = |change| Tagged {
            id: id(1, change),
            hops: 2,
        };
        t.arrived_from(a, at(10));
        t.asked(b, [root], true);
        t.arrived_from(b, at(11));
        assert!(t.is_parent(root, a), "b pushed it with a change of another root");
        t.asked(b, [root], false);
        t.arrived_from(b, at(12));
        assert!(t.is_parent(root, b), "grafted, b is on the tree again");
        t.asked(a, [root], true);
        t.forget_peer(a);
        t.arrived_from(a, at(13));
        assert!(t.is_parent(root, a), "a new link starts on every tree");
    }

    #[test]
    fn a_copy_of_the_newest_change_by_fewer_links_moves_the_parent_to_its_sender() {
        let mut t = Trees::default();
        let (a, b, c) = (ReplicaId(7), ReplicaId(8), ReplicaId(9));
        let root = ReplicaId(1);
        let at = |change, hops| Tagged {
            id: id(1, change),
            hops,
        };
        t.arrived_from(a, at(10, 4));
        assert_eq!(t.closer(b, at(10, 4), 1), None, "as many links: the first stays");
        assert_eq!(t.closer(b, at(10, 4), 0), None, "a saving of 0 counts as 1");
        assert_eq!(t.closer(b, at(9, 1), 1), None, "an older change says nothing");
        assert_eq!(
            t.closer(b, at(10, 3), 2),
            None,
            "one link fewer saves less than asked"
        );
        assert_eq!(
            t.closer(b, at(10, 2), 1),
            Some(a),
            "fewer links: the sender is the parent"
        );
        assert!(t.is_parent(root, b));
        assert_eq!(
            t.closer(c, at(10, 2), 1),
            None,
            "compared with the new parent's count"
        );
        assert_eq!(
            t.closer(b, at(10, 1), 1),
            None,
            "the parent's own copy moves nothing"
        );
    }

    #[test]
    fn a_link_counts_its_cost_in_what_a_change_crossed() {
        let mut t = Trees::default();
        let (near, far) = (ReplicaId(7), ReplicaId(8));
        t.set_cost(far, 10);
        assert_eq!(t.via(near, tagged(1, 10)).hops, 2);
        assert_eq!(t.via(far, tagged(1, 10)).hops, 11);
        t.set_cost(far, 1);
        assert_eq!(t.via(far, tagged(1, 10)).hops, 2, "1 is the default again");
        t.set_cost(far, 0);
        assert_eq!(t.via(far, tagged(1, 10)).hops, 2, "a link costs at least 1");
    }

    #[test]
    fn an_announcement_at_less_cost_grafts_its_link_once_per_change() {
        let mut t = Trees::default();
        let (a, b, c) = (ReplicaId(7), ReplicaId(8), ReplicaId(9));
        let at = |change, hops| Tagged {
            id: id(1, change),
            hops,
        };
        t.arrived_from(a, at(10, 4));
        assert_eq!(t.nearer(b, at(10, 4), 1), None, "as costly");
        assert_eq!(t.nearer(b, at(9, 1), 1), None, "an older change");
        assert_eq!(t.nearer(a, at(10, 1), 1), None, "the parent itself");
        assert_eq!(
            t.nearer(b, at(10, 3), 2),
            None,
            "one link less saves less than asked"
        );
        assert_eq!(t.nearer(b, at(10, 3), 1), Some(a), "the old parent is pruned");
        assert!(t.is_parent(ReplicaId(1), b) && t.hops(ReplicaId(1)) == Some(3));
        assert_eq!(t.nearer(c, at(10, 2), 1), None, "one graft per change");
        t.arrived_from(a, at(11, 4));
        assert_eq!(
            t.nearer(c, at(11, 2), 1),
            Some(a),
            "the next change may graft again"
        );
    }
}
