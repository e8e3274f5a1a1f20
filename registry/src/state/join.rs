//! Join, the lattice's least upper bound: how one store (registrations or leases) joins
//! another key by key, what a join reports, what it taught the state (the effective delta,
//! [`State::join_collecting`]), and the `crdts` trait it implements.

use std::collections::{BTreeMap, BTreeSet};

use rpds::HashTrieMapSync;

use super::{RegKey, State, Touched};
use crate::context::CausalContext;
use crate::dotfun::DotFun;
use crate::error::ConflictingDot;
use crate::id::{Dot, ReplicaId};
use crate::regstore::{replacements, RegStore};
use crate::value::Registration;

/// Keys of a state: registrations, then the nodes of leases.
pub(crate) type Keys = (BTreeSet<RegKey>, BTreeSet<ReplicaId>);

/// What a join touched: the keys whose dots changed, and whether the context grew.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct JoinReport {
    /// Registrations that gained or lost a dot.
    pub regs: BTreeSet<RegKey>,
    /// Nodes whose lease gained or lost a dot.
    pub leases: BTreeSet<ReplicaId>,
    /// Whether the join taught this state a dot it had not seen.
    pub context_grew: bool,
    /// Dots a full state taught this state without their writes, which the effective delta
    /// leaves out (see [`State::join_collecting`]): peers learn them from their own
    /// anti-entropy, not from what this state forwards.
    pub left_out: usize,
}

impl JoinReport {
    /// Whether the join changed anything: false means the other state was already included.
    pub fn changed(&self) -> bool {
        self.context_grew || !self.regs.is_empty() || !self.leases.is_empty()
    }
}

/// A map from keys to dot functions: the registrations ([`RegStore`], which counts their
/// writers) or the leases. Every change goes through `update`, `insert_fun` and
/// `replace_all`, so a map can keep an index in step.
trait FunMap<K: 'static, V: 'static> {
    /// Runs `op` on the function under `k` and drops it if `op` empties it; `None` when
    /// there is none.
    fn update<R>(&mut self, k: &K, op: impl FnOnce(&mut DotFun<V>) -> R) -> Option<R>;
    fn insert_fun(&mut self, k: K, f: DotFun<V>);
    fn funs(&self) -> impl Iterator<Item = (&K, &DotFun<V>)>;
    /// Whether there is a function under `k`.
    fn has(&self, k: &K) -> bool;
    /// Replaces every function for which `op` gives a replacement, dropping the empty ones.
    fn replace_all(&mut self, op: impl FnMut(&K, &DotFun<V>) -> Option<DotFun<V>>);
}

impl FunMap<RegKey, Registration> for RegStore {
    fn update<R>(&mut self, k: &RegKey, op: impl FnOnce(&mut DotFun<Registration>) -> R) -> Option<R> {
        RegStore::update(self, k, op)
    }
    fn insert_fun(&mut self, k: RegKey, f: DotFun<Registration>) {
        self.insert(k, f);
    }
    fn funs(&self) -> impl Iterator<Item = (&RegKey, &DotFun<Registration>)> {
        self.iter()
    }
    fn has(&self, k: &RegKey) -> bool {
        self.contains_key(k)
    }
    fn replace_all(
        &mut self,
        op: impl FnMut(&RegKey, &DotFun<Registration>) -> Option<DotFun<Registration>>,
    ) {
        RegStore::replace_all(self, op);
    }
}
impl<K, V, S> FunMap<K, V> for HashTrieMapSync<K, DotFun<V>, S>
where
    K: std::hash::Hash + Eq + Clone + 'static,
    V: Clone + 'static,
    S: std::hash::BuildHasher + Clone,
{
    fn update<R>(&mut self, k: &K, op: impl FnOnce(&mut DotFun<V>) -> R) -> Option<R> {
        // Looked up first: `get_mut` copies the path to a missing key too.
        if !self.contains_key(k) {
            return None;
        }
        let f = self.get_mut(k)?;
        let r = op(f);
        if f.is_empty() {
            self.remove_mut(k);
        }
        Some(r)
    }
    fn insert_fun(&mut self, k: K, f: DotFun<V>) {
        self.insert_mut(k, f);
    }
    fn funs(&self) -> impl Iterator<Item = (&K, &DotFun<V>)> {
        self.iter()
    }
    fn has(&self, k: &K) -> bool {
        self.contains_key(k)
    }
    fn replace_all(&mut self, op: impl FnMut(&K, &DotFun<V>) -> Option<DotFun<V>>) {
        for (k, f) in replacements(self.iter(), op) {
            if f.is_empty() {
                self.remove_mut(&k);
            } else {
                self.insert_mut(k, f);
            }
        }
    }
}

/// Joins one store (registrations or leases): first every key the other side stores, then
/// the keys its context may reach into: the ones it names (`touched`) or, for a full state,
/// all of ours. Returns the keys that changed.
fn join_store<K: Ord + Clone + 'static, V: Clone + 'static, M: FunMap<K, V>>(
    mine: &mut M,
    theirs: &M,
    touched: Option<&BTreeSet<K>>,
    my_ctx: &CausalContext,
    their_ctx: &CausalContext,
) -> BTreeSet<K> {
    let mut changed = BTreeSet::new();
    // The keys `other` stores are joined with their dots first; the touched keys and (for a
    // full state) our other keys only lose what `other` removed.
    for (k, f) in theirs.funs() {
        if join_key(mine, k, Some(f), my_ctx, their_ctx) {
            changed.insert(k.clone());
        }
    }
    match touched {
        Some(keys) => {
            for k in keys.iter().filter(|k| !theirs.has(k)) {
                if join_key(mine, k, None, my_ctx, their_ctx) {
                    changed.insert(k.clone());
                }
            }
        }
        None => mine.replace_all(|k, f| {
            if theirs.has(k) {
                return None;
            }
            let kept = f.without_seen(their_ctx)?;
            changed.insert(k.clone());
            Some(kept)
        }),
    }
    changed
}

/// Joins one key: keeps our dots that `other` stores too or has never seen, adds theirs that
/// we have never seen, and drops the key if it empties. Returns whether anything changed.
fn join_key<K: Clone + 'static, V: Clone + 'static>(
    map: &mut impl FunMap<K, V>,
    k: &K,
    theirs: Option<&DotFun<V>>,
    my_ctx: &CausalContext,
    their_ctx: &CausalContext,
) -> bool {
    let mut theirs = Some(theirs);
    let joined = map.update(k, |mine| {
        let theirs = theirs.take().flatten();
        let mut changed = mine.retain_unseen_or_stored(their_ctx, theirs);
        for (d, v) in theirs.into_iter().flat_map(DotFun::iter) {
            if !my_ctx.contains(d) {
                changed |= mine.insert(d.clone(), v.clone());
            }
        }
        if changed {
            mine.shrink();
        }
        changed
    });
    match joined {
        Some(changed) => changed,
        None => {
            let theirs = theirs.take().flatten();
            let new: Vec<(Dot, V)> = theirs
                .into_iter()
                .flat_map(DotFun::iter)
                .filter(|(d, _)| !my_ctx.contains(d))
                .map(|(d, v)| (d.clone(), v.clone()))
                .collect();
            if new.is_empty() {
                return false;
            }
            map.insert_fun(k.clone(), DotFun::from_vec(new));
            true
        }
    }
}

impl State {
    /// Joins `other` into this state: the least upper bound of the two.
    ///
    /// Idempotent, commutative and associative, so deltas may arrive in any order, twice, or
    /// never (a later join of a full state repairs the loss). A delta costs
    /// `O(|delta| log |self|)`; a full state visits every key of both.
    pub fn join(&mut self, mut other: State) -> JoinReport {
        let mut report = JoinReport {
            context_grew: !self.ctx.includes(&other.ctx),
            ..JoinReport::default()
        };
        let their_touched = other.touched.take();
        // A delta buffer keeps naming every key it may reach into; a full state names none.
        match (&mut self.touched, &their_touched) {
            (Some(_), None) => self.touched = None,
            (Some(mine), Some(theirs)) => {
                mine.regs.extend(theirs.regs.iter().cloned());
                mine.regs.extend(other.regs.keys().cloned());
                mine.leases.extend(theirs.leases.iter().cloned());
                mine.leases.extend(other.leases.keys().cloned());
            }
            (None, _) => {}
        }
        let (my_ctx, their_ctx) = (&self.ctx, &other.ctx);
        let touched = their_touched.as_ref();
        report.regs = join_store(
            &mut self.regs,
            &other.regs,
            touched.map(|t| &t.regs),
            my_ctx,
            their_ctx,
        );
        report.leases = join_store(
            &mut self.leases,
            &other.leases,
            touched.map(|t| &t.leases),
            my_ctx,
            their_ctx,
        );
        if let Some(mine) = &mut self.touched {
            // Keys this join emptied are no longer in the store but still reached into.
            mine.regs.extend(report.regs.iter().cloned());
            mine.leases.extend(report.leases.iter().cloned());
        }
        // Contexts join by union.
        if report.context_grew {
            self.ctx.join(&other.ctx);
        }
        report
    }

    /// The keys (registrations, then the nodes of leases) a join with `other` may touch;
    /// `None` when `other` is a full state and every key may be touched.
    pub(crate) fn keys_touched_by(other: &State) -> Option<Keys> {
        let t = other.touched.as_ref()?;
        let regs = t.regs.iter().chain(other.regs.keys()).cloned().collect();
        let leases = t.leases.iter().chain(other.leases.keys()).cloned().collect();
        Some((regs, leases))
    }

    /// The keys (registrations, then the nodes of leases) a join of `other` into this
    /// state may touch: those `other` names when it is a delta, else every key of both.
    pub(crate) fn keys_a_join_may_touch(&self, other: &State) -> Keys {
        State::keys_touched_by(other).unwrap_or_else(|| {
            let regs = self.regs.keys().chain(other.regs.keys()).cloned().collect();
            let leases = self.leases.keys().chain(other.leases.keys()).copied().collect();
            (regs, leases)
        })
    }
}

impl State {
    /// Whether joining `other` would change this state (what [`JoinReport::changed`] would
    /// say), told without joining: a flood delivers most deltas more than once (about
    /// three copies each, 3.5 a member at a cluster's start), and a copy already held then
    /// costs the lookups of its keys, not the notes a join takes before and after. Always
    /// true for a full state, which a join visits whole anyway.
    pub(crate) fn learns_from(&self, other: &State) -> bool {
        let Some(t) = &other.touched else {
            return true;
        };
        if !self.ctx.includes(&other.ctx) {
            return true;
        }
        let ctx = &other.ctx;
        let regs = other.regs.keys().chain(&t.regs);
        let leases = other.leases.keys().chain(&t.leases);
        regs.into_iter()
            .any(|k| drops_any(self.reg(k), other.reg(k), ctx))
            || leases
                .into_iter()
                .any(|&n| drops_any(self.lease(n), other.lease(n), ctx))
    }
}

/// Whether a join drops a dot of `mine`: one `theirs` does not store and their context saw.
fn drops_any<V>(mine: Option<&DotFun<V>>, theirs: Option<&DotFun<V>>, their_ctx: &CausalContext) -> bool {
    mine.is_some_and(|m| {
        m.iter()
            .any(|(d, _)| their_ctx.contains(d) && !theirs.is_some_and(|t| t.contains(d)))
    })
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

/// The `crdts` crate's state-based CRDT trait: `merge` is [`State::join`].
impl crdts::CvRDT for State {
    type Validation = ConflictingDot;

    /// Checks that every dot both states store names the same write. A dot names one
    /// write, so a difference means a node reused a counter.
    fn validate_merge(&self, other: &Self) -> Result<(), ConflictingDot> {
        fn check<V: PartialEq>(mine: Option<&DotFun<V>>, theirs: &DotFun<V>) -> Result<(), ConflictingDot> {
            for (d, v) in theirs.iter() {
                if mine.and_then(|m| m.get(d)).is_some_and(|m| m != v) {
                    return Err(ConflictingDot { dot: format!("{d}") });
                }
            }
            Ok(())
        }
        for (k, f) in &other.regs {
            check(self.regs.get(k), f)?;
        }
        for (p, f) in &other.leases {
            check(self.leases.get(p), f)?;
        }
        Ok(())
    }

    fn merge(&mut self, other: Self) {
        self.join(other);
    }
}
