//! The registry's lattice: a delta-state OR-map (a dot store plus a causal context).
//!
//! The store has two kinds of registers, both dot functions:
//! - `regs`: one last-writer-wins register per `(service, provider)`, holding the
//!   provider's [`Registration`] of that service;
//! - `leases`: one register per node, holding its [`Lease`]: every registration lives by
//!   the lease of the node that wrote it.
//!
//! A [`State`] is both a replica's full state and a delta: a mutator returns a small
//! `State` whose context holds exactly the dots it is about, and replication is nothing but
//! [`State::join`]. Join keeps a dot when both sides have it, or when one side has it and
//! the other side's context has never seen it; a dot seen and no longer stored is a removal.

use std::collections::{BTreeMap, BTreeSet};

use rpds::HashTrieMapSync;
use rustc_hash::FxBuildHasher;
use serde::{Deserialize, Serialize};

use crate::context::CausalContext;
use crate::dotfun::DotFun;
use crate::error::{ConflictingDot, ElidedError, InvalidState, MissingValue};
use crate::id::{Dot, ProviderId, ReplicaId, ServiceName};
use crate::regstore::{replacements, RegMap, RegStore};
use crate::value::{Lease, Registration};

/// The key of a registration: which provider offers which service.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RegKey {
    /// The service.
    pub service: ServiceName,
    /// The provider offering it.
    pub provider: ProviderId,
}

/// The keys a delta's context may remove dots from, beyond the keys of its own store.
///
/// A join visits only these (and the delta's own keys) instead of every key it holds, so
/// joining a small delta into a large replica costs `O(|delta| log |replica|)`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Touched {
    pub(crate) regs: BTreeSet<RegKey>,
    pub(crate) leases: BTreeSet<ReplicaId>,
}

/// A registry state, or a delta (a state of the same type).
///
/// A delta also names the keys its context reaches into (`touched`), so a join visits only
/// those. A full state names none (`None`): joining it visits every key. `None` is the
/// safe default; equality and the lattice ignore the hint.
#[derive(Clone, Default)]
pub struct State {
    pub(crate) regs: RegStore,
    pub(crate) leases: LeaseMap,
    pub(crate) ctx: CausalContext,
    pub(crate) touched: Option<Touched>,
}

/// The leases, by node. A hash map: every read of an instance looks its writer's lease up,
/// and order matters only when encoding (which sorts). Persistent, like the registrations,
/// so a snapshot shares it.
pub(crate) type LeaseMap = HashTrieMapSync<ReplicaId, DotFun<Lease>, FxBuildHasher>;

impl PartialEq for State {
    fn eq(&self, other: &Self) -> bool {
        self.regs == other.regs && self.leases == other.leases && self.ctx == other.ctx
    }
}
impl Eq for State {}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("regs", &self.regs)
            .field("leases", &self.leases.iter().collect::<BTreeMap<_, _>>())
            .field("ctx", &self.ctx)
            .finish()
    }
}

/// What a join touched: the keys whose dots changed, and whether the context grew.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct JoinReport {
    /// Registrations that gained or lost a dot.
    pub regs: BTreeSet<RegKey>,
    /// Nodes whose lease gained or lost a dot.
    pub leases: BTreeSet<ReplicaId>,
    /// Whether the join taught this state a dot it had not seen.
    pub context_grew: bool,
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
    let their_keys: BTreeSet<K> = theirs.funs().map(|(k, _)| k.clone()).collect();
    for (k, f) in theirs.funs() {
        if join_key(mine, k, Some(f), my_ctx, their_ctx) {
            changed.insert(k.clone());
        }
    }
    match touched {
        Some(keys) => {
            for k in keys.iter().filter(|k| !their_keys.contains(*k)) {
                if join_key(mine, k, None, my_ctx, their_ctx) {
                    changed.insert(k.clone());
                }
            }
        }
        None => mine.replace_all(|k, f| {
            if their_keys.contains(k) {
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
    /// The empty full state.
    pub fn new() -> Self {
        Self::default()
    }

    /// The empty delta: a state to join deltas into (a delta buffer). It stays a delta,
    /// with cheap joins, as long as only deltas are joined into it.
    pub fn new_delta() -> Self {
        Self {
            touched: Some(Touched::default()),
            ..Self::default()
        }
    }

    /// Whether this is a delta that names the keys it touches (see [`State::new_delta`]).
    pub fn is_delta(&self) -> bool {
        self.touched.is_some()
    }

    /// The causal context: every dot this state has seen. Also its digest.
    pub fn context(&self) -> &CausalContext {
        &self.ctx
    }

    /// Whether the store holds nothing (the context may still remember removals).
    pub fn is_store_empty(&self) -> bool {
        self.regs.is_empty() && self.leases.is_empty()
    }

    /// How many registrations (keys) the store holds, live or not.
    pub fn registration_count(&self) -> usize {
        self.regs.size()
    }

    /// How many provider leases the store holds, live or not.
    pub fn lease_count(&self) -> usize {
        self.leases.size()
    }

    /// How many dots the store holds.
    pub fn dot_count(&self) -> usize {
        self.regs.values().map(|f| f.dots().count()).sum::<usize>()
            + self.leases.values().map(|f| f.dots().count()).sum::<usize>()
    }

    /// The latest time written into any value: a restarted node's clock resumes after it,
    /// so its new writes order after its old ones even if the wall clock went back.
    pub fn latest_time(&self) -> crate::hlc::Hlc {
        let regs = self.regs.values().flat_map(|f| f.iter().map(|(_, r)| r.written));
        let leases = self.leases.values().flat_map(|f| f.iter().map(|(_, l)| l.issued));
        regs.chain(leases).max().unwrap_or_default()
    }

    pub(crate) fn reg(&self, key: &RegKey) -> Option<&DotFun<Registration>> {
        self.regs.get(key)
    }

    pub(crate) fn lease(&self, node: ReplicaId) -> Option<&DotFun<Lease>> {
        self.leases.get(&node)
    }

    /// How many registrations hold a write of `node`.
    pub(crate) fn registrations_by(&self, node: ReplicaId) -> u32 {
        self.regs.count_of(node)
    }

    /// The registrations of one service, in provider order.
    pub(crate) fn regs_of<'a>(
        &'a self,
        service: &'a ServiceName,
    ) -> impl Iterator<Item = (&'a RegKey, &'a DotFun<Registration>)> + 'a {
        let start = RegKey {
            service: service.clone(),
            provider: ProviderId::sentinel_min(),
        };
        self.regs
            .range(start..)
            .take_while(move |(k, _)| &k.service == service)
    }

    /// The keys (registrations, then the nodes of leases) a join with `other` may touch;
    /// `None` when `other` is a full state and every key may be touched.
    pub(crate) fn keys_touched_by(other: &State) -> Option<(BTreeSet<RegKey>, BTreeSet<ReplicaId>)> {
        let t = other.touched.as_ref()?;
        let regs = t.regs.iter().chain(other.regs.keys()).cloned().collect();
        let leases = t.leases.iter().chain(other.leases.keys()).cloned().collect();
        Some((regs, leases))
    }

    /// Inserts a dot into a registration; the caller guarantees the dot is new.
    pub(crate) fn insert_reg(&mut self, key: RegKey, d: Dot, v: Registration) {
        let mut pair = Some((d, v));
        let added = self.regs.update(&key, |f| {
            if let Some((d, v)) = pair.take() {
                f.insert(d, v);
            }
        });
        if let (None, Some((d, v))) = (added, pair) {
            self.regs.insert(key, DotFun::single(d, v));
        }
    }

    /// Inserts a dot into a node's lease; the caller guarantees the dot is new.
    pub(crate) fn insert_lease(&mut self, node: ReplicaId, d: Dot, v: Lease) {
        let f = match self.leases.get(&node) {
            Some(f) => {
                let mut f = f.clone();
                f.insert(d, v);
                f
            }
            None => DotFun::single(d, v),
        };
        self.leases.insert_mut(node, f);
    }

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

    /// Builds a state from decoded parts, checking every invariant.
    pub(crate) fn from_parts(
        regs: RegMap,
        leases: LeaseMap,
        ctx: CausalContext,
        touched: Option<Touched>,
    ) -> Result<Self, InvalidState> {
        ctx.validate()?;
        let mut seen = BTreeSet::new();
        let mut check = |d: &Dot| -> Result<(), InvalidState> {
            if d.counter == 0 {
                return Err(InvalidState::ZeroCounter(d.actor.to_string()));
            }
            if !ctx.contains(d) {
                return Err(InvalidState::DotNotInContext(format!("{d}")));
            }
            if ctx.retired().any(|(r, x)| r == d.actor && d.counter <= x.counter) {
                return Err(InvalidState::RetiredDot(format!("{d}")));
            }
            if !seen.insert(d.clone()) {
                return Err(InvalidState::DuplicateDot(format!("{d}")));
            }
            Ok(())
        };
        for (key, f) in regs.iter() {
            if f.is_empty() || !f.is_sorted_unique() {
                return Err(InvalidState::EmptyEntry(format!(
                    "{}/{}",
                    key.service, key.provider
                )));
            }
            for (d, v) in f.iter() {
                v.validate()?;
                check(d)?;
            }
        }
        for (node, f) in leases.iter() {
            if f.is_empty() || !f.is_sorted_unique() {
                return Err(InvalidState::EmptyEntry(format!("lease of {node}")));
            }
            for (d, v) in f.iter() {
                v.validate()?;
                check(d)?;
                // A node's lease is written by that node alone: no node may keep another
                // alive.
                if d.actor != *node {
                    return Err(InvalidState::ForeignLease {
                        node: node.to_string(),
                        dot: format!("{d}"),
                    });
                }
            }
        }
        Ok(Self {
            regs: regs.into(),
            leases,
            ctx,
            touched,
        })
    }

    /// A delta that removes exactly these dots from these keys.
    pub(crate) fn removal(dots: Vec<Dot>, regs: BTreeSet<RegKey>, leases: BTreeSet<ReplicaId>) -> Self {
        Self {
            ctx: CausalContext::from_dots(dots),
            touched: Some(Touched { regs, leases }),
            ..Self::default()
        }
    }

    /// This delta without what a peer whose context is `peer` has already seen: values
    /// whose dots it holds are left out, and so are their dots in the context (so the
    /// join leaves its copies alone); every dot without a value (a removal, or a removed
    /// write) stays, with the delta's key hints, so removals still reach it (a delta with
    /// no such dot keeps none: it removes nothing, so it needs no hint). Joining the
    /// result into any state whose context includes `peer` gives what joining the whole
    /// delta would.
    /// A state carrying retirements is returned whole (they are not dots to trim).
    pub fn trimmed_for(&self, peer: &CausalContext) -> State {
        if self.ctx.retired().next().is_some() {
            return self.clone();
        }
        let mut out = State::new_delta();
        let mut stored = BTreeSet::new();
        // Keys whose values were left out: a removal among the kept dots may be about them
        // (a write the peer lacks, overwritten by one it has), so they stay named.
        let mut dropped_regs = BTreeSet::new();
        let mut dropped_leases = BTreeSet::new();
        for (k, f) in &self.regs {
            for (d, v) in f.iter() {
                stored.insert(d.clone());
                if peer.contains(d) {
                    dropped_regs.insert(k.clone());
                } else {
                    out.insert_reg(k.clone(), d.clone(), v.clone());
                }
            }
        }
        for (p, f) in &self.leases {
            for (d, v) in f.iter() {
                stored.insert(d.clone());
                if peer.contains(d) {
                    dropped_leases.insert(*p);
                } else {
                    out.insert_lease(*p, d.clone(), *v);
                }
            }
        }
        let vector = self
            .ctx
            .vector()
            .flat_map(|(r, base)| (1..=base).map(move |c| crate::id::dot(r, c)));
        let kept: Vec<Dot> = vector
            .chain(self.ctx.cloud().cloned())
            .filter(|d| !stored.contains(d) || !peer.contains(d))
            .collect();
        // The hints are for removals: a receiver drops its copy of a key's dot when the
        // context has the dot and the store does not. If every kept dot is in the output's
        // store (a dot names one write of one key), nothing can be removed: no hint needed.
        let removes = kept.iter().any(|d| !stored.contains(d));
        let mut out = out.with_context(CausalContext::from_dots(kept));
        if !removes {
            return out;
        }
        match (&mut out.touched, &self.touched) {
            (Some(mine), Some(theirs)) => {
                mine.regs.extend(theirs.regs.iter().cloned());
                mine.leases.extend(theirs.leases.iter().cloned());
                mine.regs.extend(dropped_regs);
                mine.leases.extend(dropped_leases);
            }
            // A full-like delta visits every key; so must its trimmed form.
            (_, None) => out.touched = None,
            (None, Some(_)) => {}
        }
        out
    }

    /// The registration keys holding a value written by `replica`.
    pub fn written_by(&self, replica: crate::id::ReplicaId) -> Vec<RegKey> {
        let mut keys = Vec::new();
        for (k, f) in &self.regs {
            if f.dots().any(|d| d.actor == replica) {
                keys.push(k.clone());
            }
        }
        keys
    }

    /// Whether `replica` wrote, under a counter up to `upto`, anything a read at `now_ms`
    /// could show (its live lease, or a registration while its lease is live) that
    /// `removed` does not name as seen. One scan of the store.
    pub(crate) fn holds_live_writes_of(
        &self,
        replica: crate::id::ReplicaId,
        upto: u64,
        removed: &CausalContext,
        now_ms: u64,
    ) -> bool {
        let ours = |d: &Dot| d.actor == replica && d.counter <= upto && !removed.contains_unretired(d);
        let Some(lease) = self.leases.get(&replica) else {
            return false;
        };
        if !lease.winner(|l| l.issued).is_some_and(|(_, l)| l.is_live(now_ms)) {
            return false;
        }
        lease.iter().any(|(d, l)| ours(d) && l.is_live(now_ms))
            || self.regs.values().any(|f| f.dots().any(ours))
    }

    /// The lowest counter of a write `replica` minted that the store holds.
    pub(crate) fn lowest_own_dot(&self, replica: crate::id::ReplicaId) -> Option<u64> {
        let regs = self.regs.values().flat_map(|f| f.dots());
        let leases = self.leases.values().flat_map(|f| f.dots());
        regs.chain(leases)
            .filter(|d| d.actor == replica)
            .map(|d| d.counter)
            .min()
    }

    /// Every stored write `replica` minted, with its value: a full-like state (it names no
    /// keys, so joining it visits every key) whose context is empty until the caller sets it.
    pub(crate) fn own_writes(&self, replica: crate::id::ReplicaId) -> State {
        let mut out = State::new();
        for (k, f) in &self.regs {
            for (d, v) in f.iter().filter(|(d, _)| d.actor == replica) {
                out.insert_reg(k.clone(), d.clone(), v.clone());
            }
        }
        for (p, f) in &self.leases {
            for (d, v) in f.iter().filter(|(d, _)| d.actor == replica) {
                out.insert_lease(*p, d.clone(), *v);
            }
        }
        out
    }

    /// Every dot the store holds, as a context.
    pub(crate) fn stored_dots(&self) -> CausalContext {
        let regs = self.regs.values().flat_map(|f| f.dots());
        let leases = self.leases.values().flat_map(|f| f.dots());
        CausalContext::from_dots(regs.chain(leases).cloned())
    }

    /// How many stored dots `replica` minted.
    pub(crate) fn dots_of(&self, replica: crate::id::ReplicaId) -> usize {
        let regs = self.regs.values().flat_map(|f| f.dots());
        let leases = self.leases.values().flat_map(|f| f.dots());
        regs.chain(leases).filter(|d| d.actor == replica).count()
    }

    /// The dots of one registration.
    pub(crate) fn reg_dots(&self, key: &RegKey) -> Vec<Dot> {
        self.regs
            .get(key)
            .map(|f| f.dots().cloned().collect())
            .unwrap_or_default()
    }

    /// The dots of one node's lease.
    pub(crate) fn lease_dots(&self, node: ReplicaId) -> Vec<Dot> {
        self.leases
            .get(&node)
            .map(|f| f.dots().cloned().collect())
            .unwrap_or_default()
    }

    /// Sets the context wholesale (for building deltas).
    pub(crate) fn with_context(mut self, ctx: CausalContext) -> Self {
        self.ctx = ctx;
        self
    }

    /// The state as a peer with context `peer` needs it: this whole context and every dot
    /// id, with values only for the dots the peer has not seen.
    ///
    /// Joining the result at that peer ([`Elided::into_state`]) equals joining this whole
    /// state, at the cost of ids instead of values for what the peer already holds.
    pub fn elide_for(&self, peer: &CausalContext) -> Elided {
        let regs = self
            .regs
            .iter()
            .map(|(k, f)| {
                let pairs = f
                    .iter()
                    .map(|(d, v)| (d.clone(), (!peer.contains(d)).then(|| v.clone())))
                    .collect();
                (k.clone(), pairs)
            })
            .collect();
        let leases = self
            .leases
            .iter()
            .map(|(p, f)| {
                let pairs = f
                    .iter()
                    .map(|(d, v)| (d.clone(), (!peer.contains(d)).then_some(*v)))
                    .collect();
                (*p, pairs)
            })
            .collect();
        Elided {
            regs,
            leases,
            ctx: self.ctx.clone(),
        }
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

/// A full state with the values a peer already holds left out (see [`State::elide_for`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Elided {
    pub(crate) regs: BTreeMap<RegKey, Vec<(Dot, Option<Registration>)>>,
    pub(crate) leases: BTreeMap<ReplicaId, Vec<(Dot, Option<Lease>)>>,
    pub(crate) ctx: CausalContext,
}

impl Elided {
    /// Rebuilds the full state the sender elided, taking the left-out values from `local`
    /// (the receiver's own state).
    ///
    /// A left-out dot that `local` has seen but no longer stores was removed here; it is
    /// dropped, as a full join would drop it.
    ///
    /// # Errors
    /// [`ElidedError::Missing`] when a left-out dot was never seen by `local`: the sender worked from
    /// a digest we no longer match. Nothing is changed; ask for a full state.
    pub fn into_state(self, local: &State) -> Result<State, ElidedError> {
        let mut regs = RegMap::default();
        for (key, pairs) in self.regs {
            let mut f: Vec<(Dot, Registration)> = Vec::with_capacity(pairs.len());
            for (d, v) in pairs {
                let v = match v {
                    Some(v) => v,
                    None => match local.reg(&key).and_then(|lf| lf.get(&d)) {
                        Some(v) => v.clone(),
                        None if local.ctx.contains(&d) => continue,
                        None => return Err(MissingValue { dot: format!("{d}") }.into()),
                    },
                };
                f.push((d, v));
            }
            if !f.is_empty() {
                regs.insert_mut(key, DotFun::from_vec(f));
            }
        }
        let mut leases = LeaseMap::default();
        for (p, pairs) in self.leases {
            let mut f: Vec<(Dot, Lease)> = Vec::with_capacity(pairs.len());
            for (d, v) in pairs {
                let v = match v {
                    Some(v) => v,
                    None => match local.lease(p).and_then(|lf| lf.get(&d)) {
                        Some(v) => *v,
                        None if local.ctx.contains(&d) => continue,
                        None => return Err(MissingValue { dot: format!("{d}") }.into()),
                    },
                };
                f.push((d, v));
            }
            if !f.is_empty() {
                leases.insert_mut(p, DotFun::from_vec(f));
            }
        }
        Ok(State::from_parts(regs, leases, self.ctx, None)?)
    }

    /// How many entries (registrations plus leases) it names.
    pub fn entry_count(&self) -> usize {
        self.regs.len() + self.leases.len()
    }

    /// How many values were left out.
    pub fn elided_count(&self) -> usize {
        let r = self.regs.values().flatten().filter(|(_, v)| v.is_none()).count();
        let l = self
            .leases
            .values()
            .flatten()
            .filter(|(_, v)| v.is_none())
            .count();
        r + l
    }
}

/// The encoded shape of a state: the store, the context, and a delta's touched keys
/// (only those outside its store; the store's own keys are implied).
#[derive(Serialize)]
pub(crate) struct WireRef<'a> {
    pub(crate) regs: &'a RegMap,
    pub(crate) leases: BTreeMap<&'a ReplicaId, &'a DotFun<Lease>>,
    pub(crate) ctx: &'a CausalContext,
    pub(crate) touched: Option<Touched>,
}

/// The decoded shape of a state, before its invariants are checked.
#[derive(Deserialize)]
pub(crate) struct Wire {
    pub(crate) regs: RegMap,
    pub(crate) leases: BTreeMap<ReplicaId, DotFun<Lease>>,
    pub(crate) ctx: CausalContext,
    pub(crate) touched: Option<Touched>,
}

impl State {
    pub(crate) fn wire(&self) -> WireRef<'_> {
        let touched = self.touched.as_ref().map(|t| Touched {
            regs: t
                .regs
                .iter()
                .filter(|k| !self.regs.contains_key(*k))
                .cloned()
                .collect(),
            leases: t
                .leases
                .iter()
                .filter(|p| !self.leases.contains_key(*p))
                .cloned()
                .collect(),
        });
        WireRef {
            regs: &self.regs,
            leases: self.leases.iter().collect(),
            ctx: &self.ctx,
            touched,
        }
    }
}

pub(crate) mod legacy;

#[cfg(test)]
mod tests {
    use crdts::CvRDT;

    use crate::{Endpoint, Hlc, ProviderId, Replica, ReplicaId, ServiceName};

    #[test]
    fn validate_merge_finds_a_reused_dot() {
        // A node that lost its disk and its counter floor mints the same dots again.
        let reg = |port| {
            let mut r = Replica::new(ReplicaId(1));
            let web = ServiceName::new("web").unwrap();
            let p = ProviderId::new("p").unwrap();
            let ep = Endpoint::new("10.0.0.1", port).unwrap();
            r.register(web, p, ep, Default::default(), 1_000, Hlc::new(5, 0))
                .unwrap();
            r.state().clone()
        };
        let (before_crash, after_crash) = (reg(80), reg(81));
        assert!(before_crash.validate_merge(&after_crash).is_err());
        assert!(before_crash.validate_merge(&before_crash.clone()).is_ok());
        let mut merged = before_crash.clone();
        merged.merge(before_crash.clone());
        assert_eq!(merged, before_crash);
    }

    #[test]
    fn a_lease_holding_another_nodes_write_is_refused() {
        // Node 2 writes a lease under node 1's id: it would keep node 1's registrations
        // alive after node 1 died.
        let lease = crate::Lease::new(Hlc::new(5, 0), 1_000).unwrap();
        let forged = crate::id::dot(ReplicaId(2), 1);
        let mut leases = super::LeaseMap::default();
        leases.insert_mut(ReplicaId(1), super::DotFun::single(forged.clone(), lease));
        let ctx = crate::CausalContext::from_dots([forged]);
        let err = super::State::from_parts(Default::default(), leases, ctx, None).unwrap_err();
        assert!(
            matches!(err, crate::error::InvalidState::ForeignLease { .. }),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            "the lease of node 0000000000000001 holds 0000000000000002.1, a write of another node"
        );
    }
}
