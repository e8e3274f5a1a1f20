//! Joins into a replica: a delta or a full state from a peer, or the replica's own delta,
//! and what a read shows differently after it (the [`Change`]s at `now_ms`).

use std::collections::{BTreeMap, BTreeSet};

use super::{Applied, Change, Replica};
use crate::context::CausalContext;
use crate::dotfun::DotFun;
use crate::error::ElidedError;
use crate::id::{Dot, ReplicaId};
use crate::state::{Elided, JoinReport, RegKey, State, Touched};
use crate::value::Registration;

impl Replica {
    pub(super) fn apply_own(&mut self, delta: State, now_ms: u64) -> Applied {
        let changes = self.join_and_diff(delta.clone(), now_ms).1;
        Applied { delta, changes }
    }

    /// Joins a delta or a full state received from a peer.
    ///
    /// Returns what the join did (`report.changed()` is false when the state already
    /// included it: nothing to forward) and what became visible or invisible at `now_ms`.
    pub fn apply(&mut self, delta: State, now_ms: u64) -> (JoinReport, Vec<Change>) {
        self.join_and_diff(delta, now_ms)
    }

    /// Joins an elided state from a peer (see [`State::elide_for`]).
    ///
    /// # Errors
    /// [`ElidedError`] when it leaves out a value this replica never had, or is invalid;
    /// nothing is changed.
    pub fn apply_elided(
        &mut self,
        elided: Elided,
        now_ms: u64,
    ) -> Result<(JoinReport, Vec<Change>), ElidedError> {
        let full = elided.into_state(&self.state)?;
        Ok(self.join_and_diff(full, now_ms))
    }

    /// Joins a delta or a full state (an elided one, rebuilt) and returns, besides the report
    /// and the changes, the **effective delta**: a small state holding exactly what the join
    /// taught this replica (the writes it added, the dots it removed, the dots it newly saw),
    /// which a node forwards to its peers instead of everything it received.
    ///
    /// The delta is `None` when the join taught more than `max_new_dots` new dots, or brought
    /// retirements: the caller then falls back to full syncs with its peers.
    pub fn apply_collecting(
        &mut self,
        full: State,
        now_ms: u64,
        max_new_dots: usize,
    ) -> (JoinReport, Vec<Change>, Option<State>) {
        let before = self.note_visible(&full, now_ms);
        let (report, effective) = self.state.join_collecting(full, max_new_dots);
        let changes = self.after_join(before, &report, now_ms);
        (report, changes, effective)
    }

    /// Joins `delta` and returns what the join did and what a read at `now_ms` shows
    /// differently.
    fn join_and_diff(&mut self, delta: State, now_ms: u64) -> (JoinReport, Vec<Change>) {
        let before = self.note_visible(&delta, now_ms);
        let report = self.state.join(delta);
        let changes = self.after_join(before, &report, now_ms);
        (report, changes)
    }

    /// What a read shows, before joining `delta`, of what the join may change.
    fn note_visible(&self, delta: &State, now_ms: u64) -> VisibleBefore {
        // What a read shows of a registration is its winning write among those whose node's
        // lease is live. The join can change the writes only of the registrations it
        // touches, and the liveness only of the leases it touches: note both before,
        // compare after.
        let (regs, leases) = self.state.keys_a_join_may_touch(delta);
        let live: Vec<(ReplicaId, bool)> = leases
            .into_iter()
            .map(|n| (n, self.lease_live(n, now_ms)))
            .collect();
        let visible: BTreeMap<RegKey, Option<Dot>> = regs
            .into_iter()
            .map(|k| {
                let v = self.visible(&k, now_ms).map(|i| i.dot.clone());
                (k, v)
            })
            .collect();
        VisibleBefore { live, visible }
    }

    /// After a join that gave `report`: notes the keys it changed (when tracked) and
    /// returns what a read at `now_ms` shows differently from `before`.
    fn after_join(&mut self, before: VisibleBefore, report: &JoinReport, now_ms: u64) -> Vec<Change> {
        if let Some(changed) = &mut self.changed {
            changed.record(report);
        }
        let VisibleBefore { live, visible } = before;
        let mut changes = Vec::new();
        for (k, was) in &visible {
            match (was, self.visible(k, now_ms)) {
                (Some(a), Some(b)) if a == b.dot => {}
                (None, None) => {}
                (_, Some(b)) => changes.push(Change::Up(b.to_owned())),
                (Some(_), None) => changes.push(Change::Down {
                    service: k.service.clone(),
                    provider: k.provider.clone(),
                }),
            }
        }
        // Nodes whose lease came alive or died: the other registrations they wrote (whose
        // writes the join did not touch) appear or disappear with it.
        let flipped: BTreeSet<ReplicaId> = live
            .into_iter()
            .filter(|(n, was)| self.lease_live(*n, now_ms) != *was)
            .map(|(n, _)| n)
            .collect();
        if !flipped.is_empty() {
            changes.extend(self.changes_with_flipped_leases(&flipped, &visible, now_ms));
        }
        changes
    }

    /// What a read at `now_ms` shows of the registrations written by the `flipped` nodes
    /// (whose lease came alive or died) that a join did not touch (`looked_at` holds those
    /// it did).
    fn changes_with_flipped_leases(
        &self,
        flipped: &BTreeSet<ReplicaId>,
        looked_at: &BTreeMap<RegKey, Option<Dot>>,
        now_ms: u64,
    ) -> Vec<Change> {
        // Nearly always the join already looked at every registration such a node wrote
        // (they came in the same delta, or went with the lease); the counts say when it did
        // not, and only then is the store scanned.
        let mut counts: BTreeMap<ReplicaId, u32> = BTreeMap::new();
        for f in looked_at.keys().filter_map(|k| self.state.reg(k)) {
            for n in flipped.iter().filter(|n| f.dots().any(|d| d.actor == **n)) {
                *counts.entry(*n).or_default() += 1;
            }
        }
        let unseen = flipped
            .iter()
            .any(|n| counts.get(n).copied().unwrap_or(0) < self.state.registrations_by(*n));
        if !unseen {
            return Vec::new();
        }
        self.state
            .regs_with_writes_of(flipped)
            .filter(|(k, _)| !looked_at.contains_key(*k))
            .map(|(k, f)| match self.live_instance(k, f, now_ms) {
                Some(i) => Change::Up(i.to_owned()),
                None => Change::Down {
                    service: k.service.clone(),
                    provider: k.provider.clone(),
                },
            })
            .collect()
    }
}

/// What a read showed, before a join, of what the join may change.
struct VisibleBefore {
    /// Whether each node whose lease the join may touch held a live lease.
    live: Vec<(ReplicaId, bool)>,
    /// The dot of the visible write of each registration the join may touch.
    visible: BTreeMap<RegKey, Option<Dot>>,
}

/// What a state held, before a join, of what the join may change: enough to tell after it
/// what the join taught the state (see [`State::join_collecting`]).
struct BeforeJoin {
    /// Whether the other state brings a retirement this one lacks.
    brings_retirements: bool,
    /// The replicas the other state's context names: only those can teach us dots.
    replicas: BTreeSet<ReplicaId>,
    /// What this state had seen of those (not its whole context, which names every node
    /// that ever wrote).
    ctx: CausalContext,
    /// The keys the other state names, when it is a delta (see [`State::keys_touched_by`]).
    incoming: Option<(BTreeSet<RegKey>, BTreeSet<ReplicaId>)>,
    /// The dots of each registration the join may touch.
    reg_dots: BTreeMap<RegKey, Vec<Dot>>,
    /// The dots of each lease the join may touch.
    lease_dots: BTreeMap<ReplicaId, Vec<Dot>>,
}

impl BeforeJoin {
    fn note(state: &State, other: &State) -> Self {
        let brings_retirements = other
            .ctx
            .retired()
            .any(|(r, x)| state.ctx.retired().all(|(b, y)| b != r || y < x));
        // Only replicas the other side's context names can teach us dots: note what we had
        // seen of those (not the whole context, which names every node that ever wrote).
        let replicas: BTreeSet<ReplicaId> = other
            .ctx
            .ranges()
            .map(|(r, _)| r)
            .chain(other.ctx.cloud().map(|d| d.actor))
            .collect();
        let ctx = state.ctx.restricted_to(&replicas);
        // Only the keys the join may touch can change: note their dots before.
        let incoming = State::keys_touched_by(other);
        let (reg_keys, lease_keys): (Vec<RegKey>, Vec<ReplicaId>) = match &incoming {
            Some((r, l)) => (r.iter().cloned().collect(), l.iter().copied().collect()),
            None => (
                state.regs.keys().cloned().collect(),
                state.leases.keys().copied().collect(),
            ),
        };
        let reg_dots: BTreeMap<RegKey, Vec<Dot>> = reg_keys
            .into_iter()
            .map(|k| {
                let dots = state.reg_dots(&k);
                (k, dots)
            })
            .collect();
        let lease_dots: BTreeMap<ReplicaId, Vec<Dot>> =
            lease_keys.into_iter().map(|n| (n, state.lease_dots(n))).collect();
        Self {
            brings_retirements,
            replicas,
            ctx,
            incoming,
            reg_dots,
            lease_dots,
        }
    }
}

impl State {
    /// Joins `other` into this state, as [`State::join`] does, and returns besides the
    /// report the **effective delta**: a small state holding exactly what the join taught
    /// this state (the writes it added, the dots it removed, the dots it newly saw).
    ///
    /// The delta is `None` when the join taught more than `max_new_dots` new dots, or
    /// brought retirements.
    pub(crate) fn join_collecting(
        &mut self,
        other: State,
        max_new_dots: usize,
    ) -> (JoinReport, Option<State>) {
        let before = BeforeJoin::note(self, &other);
        let report = self.join(other);
        if !report.changed() {
            return (report, Some(State::new_delta()));
        }
        if before.brings_retirements {
            return (report, None);
        }
        let effective = self.taught(before, &report, max_new_dots);
        (report, effective)
    }

    /// What a join that gave `report` taught this state, which held `before` before it:
    /// see [`State::join_collecting`].
    fn taught(&self, before: BeforeJoin, report: &JoinReport, max_new_dots: usize) -> Option<State> {
        let (delta, mut dots, hint) = self.entries_changed(&before, report);
        // The dots newly seen without a value (removals we never saw the writes of): for
        // each replica, between what we had seen whole and the newest dot now seen.
        let keyed: BTreeSet<Dot> = dots.iter().cloned().collect();
        let mut unknown_keys = false;
        for d in self.newly_seen(&before, max_new_dots)? {
            unknown_keys |= !keyed.contains(&d);
            dots.push(d);
        }
        dots.sort();
        dots.dedup();
        if dots.len() > max_new_dots {
            return None;
        }
        let mut delta = delta.with_context(CausalContext::from_dots(dots));
        // A dot seen without its write has no key we know. If what we joined was a delta,
        // the keys it named (its store's and its hint's) hold every dot its context reaches,
        // ours among them: name those too (our join visited no others). After a full state,
        // the delta cannot name every key it reaches into: it then joins like a full state
        // (every key visited, at every peer it reaches).
        delta.touched = match (unknown_keys, before.incoming) {
            (false, _) => Some(hint),
            (true, Some((regs, leases))) => Some(Touched {
                regs: hint.regs.into_iter().chain(regs).collect(),
                leases: hint.leases.into_iter().chain(leases).collect(),
            }),
            (true, None) => None,
        };
        Some(delta)
    }

    /// The entries a join that gave `report` changed, from their dots `before` it: a delta
    /// holding the writes it added, the dots it removed or added, and the keys it changed.
    fn entries_changed(&self, before: &BeforeJoin, report: &JoinReport) -> (State, Vec<Dot>, Touched) {
        let mut delta = State::new_delta();
        let mut dots: Vec<Dot> = Vec::new();
        let mut hint = Touched::default();
        for k in &report.regs {
            let before = before.reg_dots.get(k).map(Vec::as_slice).unwrap_or_default();
            dots.extend(
                before
                    .iter()
                    .filter(|d| !self.reg(k).is_some_and(|f| f.contains(d)))
                    .cloned(),
            );
            if let Some(f) = self.reg(k) {
                for (d, v) in f.iter().filter(|(d, _)| !before.contains(d)) {
                    delta.insert_reg(k.clone(), d.clone(), v.clone());
                    dots.push(d.clone());
                }
            }
            hint.regs.insert(k.clone());
        }
        for &n in &report.leases {
            let before = before.lease_dots.get(&n).map(Vec::as_slice).unwrap_or_default();
            dots.extend(
                before
                    .iter()
                    .filter(|d| !self.lease(n).is_some_and(|f| f.contains(d)))
                    .cloned(),
            );
            if let Some(f) = self.lease(n) {
                for (d, v) in f.iter().filter(|(d, _)| !before.contains(d)) {
                    delta.insert_lease(n, d.clone(), *v);
                    dots.push(d.clone());
                }
            }
            hint.leases.insert(n);
        }
        (delta, dots, hint)
    }

    /// The dots this state has seen since `before`, of the replicas `before` names; `None`
    /// when one replica taught more than `max_new_dots`.
    fn newly_seen(&self, before: &BeforeJoin, max_new_dots: usize) -> Option<Vec<Dot>> {
        let after = &self.ctx;
        let mut new = Vec::new();
        // Only replicas the other side's context names can have taught us dots.
        for &r in &before.replicas {
            let (lo, hi) = (before.ctx.seen_through(r), after.max_counter(r));
            if hi.saturating_sub(lo) > max_new_dots as u64 {
                return None;
            }
            new.extend(
                (lo + 1..=hi)
                    .map(|c| crate::id::dot(r, c))
                    .filter(|d| after.contains(d) && !before.ctx.contains(d)),
            );
        }
        Some(new)
    }

    /// The keys (registrations, then the nodes of leases) a join of `other` into this
    /// state may touch: those `other` names when it is a delta, else every key of both.
    pub(crate) fn keys_a_join_may_touch(&self, other: &State) -> (BTreeSet<RegKey>, BTreeSet<ReplicaId>) {
        State::keys_touched_by(other).unwrap_or_else(|| {
            let regs = self.regs.keys().chain(other.regs.keys()).cloned().collect();
            let leases = self.leases.keys().chain(other.leases.keys()).copied().collect();
            (regs, leases)
        })
    }

    /// The registrations holding a write of one of `nodes`, in key order.
    pub(crate) fn regs_with_writes_of<'a>(
        &'a self,
        nodes: &'a BTreeSet<ReplicaId>,
    ) -> impl Iterator<Item = (&'a RegKey, &'a DotFun<Registration>)> + 'a {
        self.regs
            .iter()
            .filter(|(_, f)| f.dots().any(|d| nodes.contains(&d.actor)))
    }
}
