//! What a join taught a state: the effective delta a node forwards instead of what it
//! received (the writes the join added, the dots it removed, the dots it newly saw), and
//! the keys that delta names so a peer's join visits only those.

use std::collections::{BTreeMap, BTreeSet};

use super::join::{JoinReport, Keys};
use super::{RegKey, State, Touched};
use crate::context::CausalContext;
use crate::dotfun::DotFun;
use crate::id::{Dot, ReplicaId};

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
    incoming: Option<Keys>,
    /// The dots of each registration the join may touch.
    reg_dots: BTreeMap<RegKey, Vec<Dot>>,
    /// The dots of each lease the join may touch.
    lease_dots: BTreeMap<ReplicaId, Vec<Dot>>,
    /// The leases the other state's registrations were written under: a dot named so was
    /// a lease's, under its writer's key.
    lease_refs: BTreeSet<Dot>,
    /// The leases a delta of lease removals only (a death written) removes from without
    /// storing one, and what its context holds of those nodes: see
    /// [`State::removals_known`].
    lease_removals: BTreeSet<ReplicaId>,
    removals_ctx: CausalContext,
}

impl BeforeJoin {
    /// `incoming` is [`State::keys_touched_by`] `other`.
    fn note(state: &State, other: &State, incoming: Option<Keys>) -> Self {
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
        let reg_dots = |k: &RegKey| (k.clone(), state.reg_dots(k));
        let lease_dots = |n: &ReplicaId| (*n, state.lease_dots(*n));
        let (reg_dots, lease_dots): (BTreeMap<_, _>, BTreeMap<_, _>) = match &incoming {
            Some((r, l)) => (
                r.iter().map(reg_dots).collect(),
                l.iter().map(lease_dots).collect(),
            ),
            None => (
                state.regs.keys().map(reg_dots).collect(),
                state.leases.keys().map(lease_dots).collect(),
            ),
        };
        let lease_refs = other
            .regs
            .values()
            .flat_map(|f| f.iter().map(|(_, r)| r.lease_dot.clone()))
            .collect();
        // Only a delta that names leases alone: every dot its context has and its store
        // has not is then under one of those leases (a delta names where its removals
        // are), so what its context holds of a node it names is that node's removed leases.
        let retired: BTreeSet<ReplicaId> = other.ctx.retired().map(|(r, _)| r).collect();
        let lease_removals: BTreeSet<ReplicaId> = match &other.touched {
            Some(t) if t.regs.is_empty() && other.regs.is_empty() => t
                .leases
                .iter()
                .filter(|n| !other.leases.contains_key(n) && !retired.contains(n))
                .copied()
                .collect(),
            _ => BTreeSet::new(),
        };
        let removals_ctx = other.ctx.restricted_to(&lease_removals);
        Self {
            brings_retirements,
            replicas,
            ctx,
            incoming,
            reg_dots,
            lease_dots,
            lease_refs,
            lease_removals,
            removals_ctx,
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
    ///
    /// `incoming` is [`State::keys_touched_by`] `other` (computed once by the caller, who
    /// needs it too).
    pub(crate) fn join_collecting(
        &mut self,
        other: State,
        incoming: Option<Keys>,
        max_new_dots: usize,
    ) -> (JoinReport, Option<State>) {
        let before = BeforeJoin::note(self, &other, incoming);
        let report = self.join(other);
        if !report.changed() {
            return (report, Some(State::new_delta()));
        }
        if before.brings_retirements {
            return (report, None);
        }
        let mut report = report;
        let effective = self.taught(before, &mut report, max_new_dots);
        (report, effective)
    }

    /// What a join that gave `report` taught this state, which held `before` before it:
    /// see [`State::join_collecting`].
    fn taught(&self, before: BeforeJoin, report: &mut JoinReport, max_new_dots: usize) -> Option<State> {
        let (delta, mut dots, hint) = self.entries_changed(&before, report);
        // The dots newly seen without a value (removals we never saw the writes of): for
        // each replica, between what we had seen whole and the newest dot now seen.
        let keyed: BTreeSet<Dot> = dots.iter().cloned().collect();
        let unknown: Vec<Dot> = self
            .newly_seen(&before, max_new_dots)?
            .into_iter()
            .filter(|d| !keyed.contains(d))
            .collect();
        let unknown_len = unknown.len();
        let (touched, named) = self.keys_of_unknown(&before, hint, unknown);
        report.left_out = unknown_len - named.len();
        dots.extend(named);
        dots.sort();
        dots.dedup();
        if dots.len() > max_new_dots {
            return None;
        }
        let mut ctx = CausalContext::from_dots(dots);
        let (mut delta, mut touched) = (delta, touched);
        self.removals_known(&before, report, &mut delta, &mut ctx, &mut touched);
        let mut delta = delta.with_context(ctx);
        delta.touched = Some(touched);
        Some(delta)
    }

    /// A lease removal that taught this state nothing (it had it from another root's
    /// delta) still goes on with what this state forwards for it: the removed lease dots
    /// the received delta named, and the lease as this state holds it. Every peer of a
    /// dead node writes it dead, one removal under as many roots within milliseconds;
    /// forwarded with the first of them only, a node whose trees brought it the others
    /// only kept the dead node listed until some later write (1 node of 100, 11-12 s:
    /// `a_death_written_by_several_peers_at_once_reaches_every_node_on_the_trees`).
    /// Sound: those dots are removed here too (the received delta named only leases, so
    /// they were under that lease, and this join removed them), and this state's own
    /// dots of that lease go along stored.
    fn removals_known(
        &self,
        before: &BeforeJoin,
        report: &JoinReport,
        delta: &mut State,
        ctx: &mut CausalContext,
        touched: &mut Touched,
    ) {
        // Those whose lease this join changed carry their removal already.
        let known: BTreeSet<ReplicaId> = before
            .lease_removals
            .iter()
            .filter(|n| !report.leases.contains(n))
            .copied()
            .collect();
        if known.is_empty() {
            return;
        }
        ctx.join(&before.removals_ctx.restricted_to(&known));
        for &n in &known {
            for (d, l) in self.lease(n).into_iter().flat_map(DotFun::iter) {
                delta.insert_lease(n, d.clone(), *l);
                ctx.insert(d.clone());
            }
            touched.leases.insert(n);
        }
    }

    /// The keys the effective delta names (`Touched`): those the join changed (`hint`),
    /// and those holding the dots it newly saw without their writes (`unknown`) where a
    /// peer may still store them.
    ///
    /// A dot a registration names as its lease is a lease's, under its writer's key (only
    /// a node writes its lease): a node's first lease, replaced by a renewal before a peer
    /// heard of it, is nearly every such dot while a cluster starts. For any other, the
    /// keys the joined delta named hold it, ours among them (our join visited no others):
    /// naming them all made the hints grow with every batch they went through (36 keys
    /// a delta at 300 simulated nodes starting at once, 4 changed). After a full state no
    /// key can be named for it, and a delta naming none would be joined like a full state
    /// at every peer it reaches, each of which forwarded it so again: such dots are left
    /// out (`report.left_out`), and peers whose context lacks them learn them from their
    /// own anti-entropy. Returns the keys, and the dots they name.
    fn keys_of_unknown(
        &self,
        before: &BeforeJoin,
        mut hint: Touched,
        unknown: Vec<Dot>,
    ) -> (Touched, Vec<Dot>) {
        let is_lease = |d: &Dot| {
            before.lease_refs.contains(d)
                || hint
                    .regs
                    .iter()
                    .filter_map(|k| self.reg(k))
                    .any(|f| f.iter().any(|(_, r)| r.lease_dot == *d))
        };
        let (mut named, others): (Vec<Dot>, Vec<Dot>) = unknown.into_iter().partition(is_lease);
        hint.leases.extend(named.iter().map(|d| d.actor));
        if let (Some((regs, leases)), false) = (&before.incoming, others.is_empty()) {
            hint.regs.extend(regs.iter().cloned());
            hint.leases.extend(leases.iter().copied());
            named.extend(others);
        }
        (hint, named)
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
}
