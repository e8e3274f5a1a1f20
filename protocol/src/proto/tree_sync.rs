//! What the node does with its trees (`tree.rs` says how they work): its own writes named,
//! a push received (a copy it had prunes the link), announcements sent and heard, grafts
//! asked and answered, prunes.

use std::collections::{BTreeMap, BTreeSet};

use roster_registry::codec::encode_state;
use roster_registry::{ReplicaId, State};

use super::{ConnId, Dissemination, Node, Now, ProtocolError};
use crate::message::{self, ChangeId, Message, Tagged};

/// A root's parent moved to a nearer announcer.
struct Move {
    new: ReplicaId,
    old: ReplicaId,
    /// What the change cost here by the old parent.
    before: Option<u16>,
    /// The change, as it would come by the new one.
    t: Tagged,
}

impl Node {
    /// Whether changes travel on trees.
    pub(super) fn on_trees(&self) -> bool {
        self.cfg.dissemination == Dissemination::Tree
    }

    /// How many links the newest change of `root` crossed to reach this node, each counted
    /// at its cost, once one came on a tree (a diagnostic). A parent that moved nearer the
    /// root after passing the change on leaves it above this node's depth in the tree
    /// until the root's next change: the depth is the walk up `tree_parent`.
    pub fn tree_hops(&self, root: ReplicaId) -> Option<u16> {
        self.trees.hops(root)
    }

    /// The peer that brought the newest change of `root` here: this node's parent in
    /// `root`'s tree (a diagnostic).
    pub fn tree_parent(&self, root: ReplicaId) -> Option<ReplicaId> {
        self.trees.parent_of(root)
    }

    /// Sets what crossing the link from `peer` counts in the trees' choice of links (1 by
    /// default; a link to another failure domain may count more). A node's parent for a
    /// root is the link whose copy came at the least cost, so trees cross costly links as
    /// seldom as the links allow. Once members of other zones are known, the zones set the
    /// costs of the links (see `Config::zone_border_cost`), at each connection and each
    /// reconnect round.
    pub fn set_link_cost(&mut self, peer: ReplicaId, cost: u16) {
        self.trees.set_cost(peer, cost);
    }

    /// Buffers a delta made here, named as a change of ours when changes travel on trees;
    /// returns its number.
    pub(super) fn buffer_own(&mut self, delta: State, now: Now) -> u64 {
        let tags = if self.on_trees() {
            let id = ChangeId {
                root: self.me.id,
                at: self.clock.tick(now.wall_ms),
            };
            self.trees.observe(id);
            vec![Tagged { id, hops: 0 }]
        } else {
            Vec::new()
        };
        let seq = self.buffer.push_tagged(None, delta, tags);
        self.trim_buffer();
        seq
    }

    /// A push on the trees: admitted, joined, acknowledged (unless it answers a graft).
    /// Changes it carries that we had already came by another link first: unless it is a
    /// resend, one of the two links is pruned for their roots (`prune_copies`).
    #[allow(clippy::too_many_arguments)] // the fields of one message, taken apart
    pub(super) fn on_push(
        &mut self,
        conn: ConnId,
        peer: ReplicaId,
        seq: Option<u64>,
        delta: &[u8],
        ids: Vec<Tagged>,
        resend: bool,
        now: Now,
    ) -> Result<(), ProtocolError> {
        let delta = message::decode_delta(delta)?;
        self.peers.entry(peer).or_default().digest_sent_at = None;
        self.admit(&delta, now)?;
        // On a connection for an exchange, no link of any tree: what it taught floods on,
        // named by nothing, and its names stay unseen, so the copy its tree brings is no
        // reason to prune the tree's own link.
        let ids = match self.conns.get(&conn).is_some_and(|c| c.sync) {
            true => Vec::new(),
            false => ids,
        };
        let (mut fresh, mut fresh_roots, mut copies) = (Vec::new(), BTreeSet::new(), Vec::new());
        let mut announced = Vec::new();
        for t in ids {
            let here = self.trees.via(peer, t);
            announced.extend(
                self.trees
                    .announcers(&t.id)
                    .iter()
                    .map(|&(a, theirs)| (a, theirs, here)),
            );
            if self.trees.observe(t.id) {
                self.trees.arrived_from(peer, here);
                fresh_roots.insert(t.id.root);
                fresh.push(here);
            } else {
                copies.push(here);
            }
        }
        self.take_renamed(peer, &delta, &mut copies, &mut fresh);
        fresh_roots.extend(fresh.iter().map(|t| t.id.root));
        if !resend {
            copies.retain(|t| !fresh_roots.contains(&t.id.root));
            self.prune_copies(peer, copies, now);
        }
        self.apply_tagged(peer, delta, fresh, now);
        self.known_by_announcers(&announced);
        self.graft_nearer_announcers(&announced, now);
        if let Some(seq) = seq {
            self.owe_ack(conn, seq, now);
        }
        Ok(())
    }

    /// Changes of a root that all looked seen, one of them only for being named below the
    /// newest seen, although the delta holds a dot of the root above every dot of it in
    /// our context: a node's counter only grows, across restarts and clock steps, where
    /// its clock may not, so the root named a new change below what we had seen from it
    /// (its clock ran ahead, and came back or restarted set right). A change whose name
    /// arrived before its dot (named in a delta that left the dot out) is no such case.
    /// What was seen of it is forgotten ([`Trees::renamed`]) and its newest-named change
    /// here moves from `copies` to `fresh`. Taken as seen, the root's changes pruned its
    /// tree's links as copies and its announcements were never grafted, so it reached a
    /// peer that was ahead with it only by digest exchanges (the fault soak's finding 7).
    fn take_renamed(
        &mut self,
        peer: ReplicaId,
        delta: &State,
        copies: &mut Vec<Tagged>,
        fresh: &mut Vec<Tagged>,
    ) {
        if copies.is_empty() {
            return;
        }
        let fresh_roots: BTreeSet<ReplicaId> = fresh.iter().map(|t| t.id.root).collect();
        let mut newest: BTreeMap<ReplicaId, usize> = BTreeMap::new();
        for (i, t) in copies.iter().enumerate() {
            let root = t.id.root;
            if fresh_roots.contains(&root) || !self.trees.seen_by_age(&t.id) {
                continue;
            }
            let e = newest.entry(root).or_insert(i);
            if copies[*e].id.at < t.id.at {
                *e = i;
            }
        }
        let ctx = self.replica.context();
        let mut renamed: Vec<usize> = newest
            .into_iter()
            .filter(|(root, _)| delta.context().max_counter(*root) > ctx.max_counter(*root))
            .map(|(_, i)| i)
            .collect();
        renamed.sort_unstable_by(|a, b| b.cmp(a));
        for i in renamed {
            let t = copies.remove(i);
            self.trees.renamed(t.id);
            self.trees.arrived_from(peer, t);
            fresh.push(t);
        }
    }

    /// `peer` sent copies of changes we had, none of whose roots it brought anything new
    /// of. Per root (its newest change in the push), the link that brought the change by
    /// fewer links stays eager and becomes the root's parent, and the other is asked to
    /// push that root's changes no more: so each node's parent is its neighbour nearest
    /// the root, and trees have about the fewest links from the root that the links allow.
    /// Only the node that receives on a link prunes it, so no prune of another node's can
    /// leave it without a parent; and a copy is no reason to prune the link that brought
    /// the root's newest change (two changes of one root that crossed while its tree
    /// formed would otherwise each prune the other's first link).
    fn prune_copies(&mut self, peer: ReplicaId, copies: Vec<Tagged>, now: Now) {
        let mut newest: BTreeMap<ReplicaId, Tagged> = BTreeMap::new();
        for t in copies {
            let e = newest.entry(t.id.root).or_insert(t);
            if e.id.at < t.id.at {
                *e = t;
            }
        }
        let saving = self.cfg.parent_saving;
        let mut prunes: BTreeMap<ReplicaId, Vec<ReplicaId>> = BTreeMap::new();
        let mut hints: BTreeMap<ReplicaId, Vec<Tagged>> = BTreeMap::new();
        for (root, t) in newest {
            let before = self.trees.hops(root);
            let pruned = match self.trees.closer(peer, t, saving) {
                Some(old) => {
                    if self.old_parent_could_shorten(old, before, t) {
                        hints.entry(old).or_default().push(t);
                    }
                    old
                }
                None if self.trees.is_parent(root, peer) => continue,
                None => peer,
            };
            prunes.entry(pruned).or_default().push(root);
        }
        if !prunes.is_empty() {
            self.counters.duplicate_pushes += 1;
        }
        self.send_prunes(prunes, hints, now);
    }

    /// Asks each peer to push the roots' changes here no more; and tells those of them
    /// that could save links by our path of it (`hints`).
    fn send_prunes(
        &mut self,
        prunes: BTreeMap<ReplicaId, Vec<ReplicaId>>,
        hints: BTreeMap<ReplicaId, Vec<Tagged>>,
        now: Now,
    ) {
        for (p, roots) in prunes {
            self.trees.asked(p, roots.iter().copied(), true);
            self.send_to_peer(p, Message::Prune { roots }, now);
        }
        for (p, ids) in hints {
            self.send_to_peer(p, Message::IHave { seq: None, ids }, now);
        }
    }

    /// Whether the parent `old` we left for a copy `t` that came cheaper (ours cost
    /// `before` by `old`) could save links by our new path. It brought the change here
    /// first, so nothing of it goes back to it, and it would never learn of the cheaper
    /// path: a node whose copies came fastest over a costly detour (two zone borders, say)
    /// kept it, change after change. Told (an announcement it may lose, for it has the
    /// change), it grafts us as `on_ihave` does.
    fn old_parent_could_shorten(&self, old: ReplicaId, before: Option<u16>, t: Tagged) -> bool {
        let Some(theirs) = before.map(|h| h.saturating_sub(self.trees.link_cost(old))) else {
            return false;
        };
        self.trees
            .could_shorten(old, Some(t.hops), theirs, self.cfg.parent_saving)
    }

    /// A peer announced changes: those we lack are grafted from it if they do not arrive
    /// within the graft timeout. Acknowledged when it came alone (`seq`).
    pub(super) fn on_ihave(
        &mut self,
        conn: ConnId,
        peer: ReplicaId,
        seq: Option<u64>,
        ids: Vec<Tagged>,
        now: Now,
    ) {
        let due = now.mono_ms + self.cfg.graft_timeout_ms;
        self.known_by_announcement(peer, &ids);
        let mut moves = Vec::new();
        for t in ids {
            let via = self.trees.via(peer, t);
            if !self.trees.announced(peer, t, due) {
                moves.extend(self.nearer(peer, via));
            }
        }
        self.adopt_nearer(moves, now);
        if let Some(seq) = seq {
            self.owe_ack(conn, seq, now);
        }
    }

    /// A peer that announced a change before its copy came, by links cheaper by
    /// `parent_saving`, is the better parent: grafted at once, as when its announcement
    /// comes after the copy (`on_ihave`). Before, only that later order moved the
    /// parent, so trees found their shorter paths at random renewals, long after they
    /// formed, and an idle cluster grafted now and then.
    fn graft_nearer_announcers(&mut self, announced: &[(ReplicaId, u16, Tagged)], now: Now) {
        let mut moves = Vec::new();
        for &(a, theirs, here) in announced {
            let via = self.trees.via(
                a,
                Tagged {
                    id: here.id,
                    hops: theirs,
                },
            );
            moves.extend(self.nearer(a, via));
        }
        self.adopt_nearer(moves, now);
    }

    /// When `peer`'s copy `t` (counted here) would save `parent_saving` on the parent's:
    /// the move of the root's parent to `peer`, from the parent it replaces.
    fn nearer(&mut self, peer: ReplicaId, t: Tagged) -> Option<Move> {
        let before = self.trees.hops(t.id.root);
        let old = self.trees.nearer(peer, t, self.cfg.parent_saving)?;
        Some(Move {
            new: peer,
            old,
            before,
            t,
        })
    }

    /// Parents moved to nearer announcers: each is grafted, and the parent it replaces is
    /// pruned for the root (and told of the cheaper path when it could use it).
    fn adopt_nearer(&mut self, moves: Vec<Move>, now: Now) {
        let mut grafts: BTreeMap<ReplicaId, Vec<ChangeId>> = BTreeMap::new();
        let mut prunes: BTreeMap<ReplicaId, Vec<ReplicaId>> = BTreeMap::new();
        let mut hints: BTreeMap<ReplicaId, Vec<Tagged>> = BTreeMap::new();
        for m in moves {
            grafts.entry(m.new).or_default().push(m.t.id);
            prunes.entry(m.old).or_default().push(m.t.id.root);
            if self.old_parent_could_shorten(m.old, m.before, m.t) {
                hints.entry(m.old).or_default().push(m.t);
            }
        }
        for (p, ids) in grafts {
            self.send_graft(p, ids, now);
        }
        self.send_prunes(prunes, hints, now);
    }

    /// Peers that announced changes before they arrived here (each with the links its
    /// copy crossed, and the change as it came here) hold them: they are neither pushed
    /// nor announced them, unless our path could save them links (as in
    /// `known_by_announcement`).
    fn known_by_announcers(&mut self, announced: &[(ReplicaId, u16, Tagged)]) {
        let saving = self.cfg.parent_saving;
        let mut known: BTreeMap<ReplicaId, BTreeSet<ChangeId>> = BTreeMap::new();
        for &(a, theirs, here) in announced {
            if !self.trees.could_shorten(a, Some(here.hops), theirs, saving) {
                known.entry(a).or_default().insert(here.id);
            }
        }
        for (a, ids) in known {
            self.buffer.known_to(a, &ids);
        }
    }

    /// `peer` announced `ids`, so it holds them: those we hold too are neither pushed nor
    /// announced to it, unless our path to their root could save it links (announced, it
    /// grafts that path: `Trees::nearer`). Before, both ends of a link off a tree
    /// announced each change to the other. (Those announced before they arrived here are
    /// marked on arrival: `known_by_announcers`.)
    fn known_by_announcement(&mut self, peer: ReplicaId, ids: &[Tagged]) {
        let saving = self.cfg.parent_saving;
        let known: BTreeSet<ChangeId> = ids
            .iter()
            .filter(|t| self.trees.has(&t.id))
            .filter(|t| {
                !self
                    .trees
                    .could_shorten(peer, self.trees.hops_of(&t.id), t.hops, saving)
            })
            .map(|t| t.id)
            .collect();
        if !known.is_empty() {
            self.buffer.known_to(peer, &known);
        }
    }

    /// A peer grafted changes: the link is eager again for their roots, and it is sent
    /// them from the buffer, or asked for its digest when the buffer no longer holds
    /// them (the exchange then sends what it lacks).
    pub(super) fn on_graft(&mut self, peer: ReplicaId, ids: Vec<ChangeId>, now: Now) {
        for id in &ids {
            self.trees.graft(peer, id.root);
        }
        let wanted: BTreeSet<ChangeId> = ids.into_iter().collect();
        match self.buffer.carrying(&wanted) {
            Some((delta, ids)) => {
                let push = Message::Push {
                    seq: None,
                    delta: encode_state(&delta),
                    ids,
                    announced: Vec::new(),
                    resend: true,
                };
                self.send_to_peer(peer, push, now);
            }
            None => self.send_digest(peer, now),
        }
    }

    /// A peer had these roots' changes from another link first, or by fewer links: announce
    /// them to it from now on, and push them no more.
    pub(super) fn on_prune(&mut self, peer: ReplicaId, roots: Vec<ReplicaId>) {
        for r in roots {
            self.trees.prune(peer, r);
        }
    }

    /// Asks `peer` for `ids`, and to push their roots' changes here again.
    fn send_graft(&mut self, peer: ReplicaId, ids: Vec<ChangeId>, now: Now) {
        self.trees.asked(peer, ids.iter().map(|id| id.root), false);
        self.send_to_peer(peer, Message::Graft { ids }, now);
    }

    /// Grafts what was announced and has not arrived in time.
    pub(super) fn run_grafts(&mut self, now: Now) {
        for (peer, ids) in self.trees.due_grafts(now.mono_ms, self.cfg.graft_retry_ms) {
            self.counters.changes_grafted += ids.len() as u64;
            for id in &ids {
                self.trees.graft(peer, id.root);
            }
            self.send_graft(peer, ids, now);
        }
    }
}
