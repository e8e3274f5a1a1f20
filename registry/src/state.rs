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
use crate::id::{Dot, ProviderId, RegKey, ReplicaId, ServiceName};
use crate::regstore::{RegMap, RegStore};
use crate::value::{Lease, Registration};

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

    /// A full state that stores nothing and has seen `ctx`: joined, it removes whatever
    /// the other side stores of those dots. What a join's effective delta left out
    /// ([`JoinReport::left_out`]) is such a state; a peer gets it with a full state from
    /// its anti-entropy.
    pub fn context_only(ctx: CausalContext) -> Self {
        Self::new().with_context(ctx)
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

    /// A delta that removes exactly these dots from these keys.
    pub(crate) fn removal(dots: Vec<Dot>, regs: BTreeSet<RegKey>, leases: BTreeSet<ReplicaId>) -> Self {
        Self {
            ctx: CausalContext::from_dots(dots),
            touched: Some(Touched { regs, leases }),
            ..Self::default()
        }
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

    /// The registrations holding a write of one of `nodes`, in key order.
    pub(crate) fn regs_with_writes_of<'a>(
        &'a self,
        nodes: &'a BTreeSet<ReplicaId>,
    ) -> impl Iterator<Item = (&'a RegKey, &'a DotFun<Registration>)> + 'a {
        self.regs
            .iter()
            .filter(|(_, f)| f.dots().any(|d| nodes.contains(&d.actor)))
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
}

mod elide;
mod join;
pub(crate) mod legacy;
mod parts;
mod taught;

pub use elide::Elided;
pub use join::JoinReport;
pub(crate) use join::Keys;
pub(crate) use parts::Wire;
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
