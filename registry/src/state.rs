//! The registry's lattice: a delta-state OR-map (a dot store plus a causal context).
//!
//! The store has two kinds of registers, both dot functions:
//! - `regs`: one last-writer-wins register per `(service, provider)`, holding the
//!   provider's [`Registration`] of that service;
//! - `leases`: one register per provider, holding its [`Lease`].
//!
//! A [`State`] is both a replica's full state and a delta: a mutator returns a small
//! `State` whose context holds exactly the dots it is about, and replication is nothing but
//! [`State::join`]. Join keeps a dot when both sides have it, or when one side has it and
//! the other side's context has never seen it; a dot seen and no longer stored is a removal.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::context::CausalContext;
use crate::dotfun::DotFun;
use crate::error::{ElidedError, InvalidState, MissingValue};
use crate::id::{dot, Dot, ProviderId, ServiceName};
use crate::value::{Lease, Registration};

/// The key of a registration: which provider offers which service.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RegKey {
    /// The service.
    pub service: ServiceName,
    /// The provider offering it.
    pub provider: ProviderId,
}

/// Where a dot lives in the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Slot {
    Reg(RegKey),
    Lease(ProviderId),
}

/// A registry state, or a delta (a state of the same type).
///
/// Besides the store and the context it keeps two derived indexes, never encoded: dot to
/// slot (so a removal finds its key in `O(log n)`) and provider to services (so a lease
/// change finds the registrations it governs).
#[derive(Clone, Default)]
pub struct State {
    pub(crate) regs: BTreeMap<RegKey, DotFun<Registration>>,
    pub(crate) leases: BTreeMap<ProviderId, DotFun<Lease>>,
    pub(crate) ctx: CausalContext,
    index: BTreeMap<Dot, Slot>,
    by_provider: BTreeSet<(ProviderId, ServiceName)>,
}

impl PartialEq for State {
    fn eq(&self, other: &Self) -> bool {
        // The indexes derive from the store, so equal stores have equal indexes.
        self.regs == other.regs && self.leases == other.leases && self.ctx == other.ctx
    }
}
impl Eq for State {}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("regs", &self.regs)
            .field("leases", &self.leases)
            .field("ctx", &self.ctx)
            .finish()
    }
}

/// What a join touched: the keys whose dots changed, and whether the context grew.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct JoinReport {
    /// Registrations that gained or lost a dot.
    pub regs: BTreeSet<RegKey>,
    /// Providers whose lease gained or lost a dot.
    pub leases: BTreeSet<ProviderId>,
    /// Whether the join taught this state a dot it had not seen.
    pub context_grew: bool,
}

impl JoinReport {
    /// Whether the join changed anything: false means the other state was already included.
    pub fn changed(&self) -> bool {
        self.context_grew || !self.regs.is_empty() || !self.leases.is_empty()
    }
}

/// The sentinel that sorts before every valid service name (valid names are non-empty).
fn min_service() -> ServiceName {
    ServiceName::sentinel_min()
}

impl State {
    /// The empty state.
    pub fn new() -> Self {
        Self::default()
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
        self.regs.len()
    }

    /// How many provider leases the store holds, live or not.
    pub fn lease_count(&self) -> usize {
        self.leases.len()
    }

    /// How many dots the store holds.
    pub fn dot_count(&self) -> usize {
        self.index.len()
    }

    pub(crate) fn reg(&self, key: &RegKey) -> Option<&DotFun<Registration>> {
        self.regs.get(key)
    }

    pub(crate) fn lease(&self, provider: &ProviderId) -> Option<&DotFun<Lease>> {
        self.leases.get(provider)
    }

    /// The services a provider has registrations for.
    pub(crate) fn services_of<'a>(
        &'a self,
        provider: &'a ProviderId,
    ) -> impl Iterator<Item = &'a ServiceName> + 'a {
        self.by_provider
            .range((provider.clone(), min_service())..)
            .take_while(move |(p, _)| p == provider)
            .map(|(_, s)| s)
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
        self.index.insert(d.clone(), Slot::Reg(key.clone()));
        match self.regs.get_mut(&key) {
            Some(f) => {
                f.insert(d, v);
            }
            None => {
                self.by_provider
                    .insert((key.provider.clone(), key.service.clone()));
                self.regs.insert(key, DotFun::single(d, v));
            }
        }
    }

    pub(crate) fn insert_lease(&mut self, provider: ProviderId, d: Dot, v: Lease) {
        self.index.insert(d.clone(), Slot::Lease(provider.clone()));
        match self.leases.get_mut(&provider) {
            Some(f) => {
                f.insert(d, v);
            }
            None => {
                self.leases.insert(provider, DotFun::single(d, v));
            }
        }
    }

    /// Removes a dot from the store (not from the context), and its key if it empties.
    fn remove_dot(&mut self, d: &Dot, report: &mut JoinReport) {
        let Some(slot) = self.index.remove(d) else { return };
        match slot {
            Slot::Reg(key) => {
                if let Some(f) = self.regs.get_mut(&key) {
                    f.remove(d);
                    if f.is_empty() {
                        self.regs.remove(&key);
                        self.by_provider
                            .remove(&(key.provider.clone(), key.service.clone()));
                    }
                }
                report.regs.insert(key);
            }
            Slot::Lease(p) => {
                if let Some(f) = self.leases.get_mut(&p) {
                    f.remove(d);
                    if f.is_empty() {
                        self.leases.remove(&p);
                    }
                }
                report.leases.insert(p);
            }
        }
    }

    /// The registrations and leases holding a dot that `ctx` has seen.
    pub(crate) fn slots_covered_by(&self, ctx: &CausalContext) -> (Vec<RegKey>, Vec<ProviderId>) {
        let mut regs = Vec::new();
        let mut leases = Vec::new();
        let mut note = |slot: &Slot| match slot {
            Slot::Reg(k) => regs.push(k.clone()),
            Slot::Lease(p) => leases.push(p.clone()),
        };
        for (replica, n) in ctx.ranges() {
            self.index
                .range(dot(replica, 1)..=dot(replica, n))
                .for_each(|(_, s)| note(s));
        }
        for d in ctx.cloud() {
            if let Some(s) = self.index.get(d) {
                note(s);
            }
        }
        (regs, leases)
    }

    /// Whether `other`'s store holds `d` at `slot`.
    fn store_has(&self, slot: &Slot, d: &Dot) -> bool {
        match slot {
            Slot::Reg(k) => self.regs.get(k).is_some_and(|f| f.contains(d)),
            Slot::Lease(p) => self.leases.get(p).is_some_and(|f| f.contains(d)),
        }
    }

    /// Joins `other` into this state: the least upper bound of the two.
    ///
    /// Idempotent, commutative and associative, so deltas may arrive in any order, twice, or
    /// never (a later join of a full state repairs the loss). Costs `O(|other| log |self|)`
    /// for a delta; the version-vector part of `other`'s context costs a range scan of this
    /// state's dots from that replica.
    pub fn join(&mut self, other: State) -> JoinReport {
        let mut report = JoinReport {
            context_grew: !self.ctx.includes(&other.ctx),
            ..JoinReport::default()
        };
        // 1. Removals: our dots that `other` has seen but no longer stores.
        let mut removed = Vec::new();
        for (replica, n) in other.ctx.ranges() {
            for (d, slot) in self.index.range(dot(replica, 1)..=dot(replica, n)) {
                if !other.store_has(slot, d) {
                    removed.push(d.clone());
                }
            }
        }
        for d in other.ctx.cloud() {
            if let Some(slot) = self.index.get(d) {
                if !other.store_has(slot, d) {
                    removed.push(d.clone());
                }
            }
        }
        // 2. Additions: `other`'s dots that we have never seen. Decided against our context
        // before it is joined, independently of step 1 (which only looks at `other`).
        let mut added_regs = Vec::new();
        for (key, f) in other.regs {
            for (d, v) in f.into_iter() {
                if !self.ctx.contains(&d) {
                    added_regs.push((key.clone(), d, v));
                }
            }
        }
        let mut added_leases = Vec::new();
        for (p, f) in other.leases {
            for (d, v) in f.into_iter() {
                if !self.ctx.contains(&d) {
                    added_leases.push((p.clone(), d, v));
                }
            }
        }
        for d in &removed {
            self.remove_dot(d, &mut report);
        }
        for (key, d, v) in added_regs {
            report.regs.insert(key.clone());
            self.insert_reg(key, d, v);
        }
        for (p, d, v) in added_leases {
            report.leases.insert(p.clone());
            self.insert_lease(p, d, v);
        }
        // 3. Contexts join by union.
        if report.context_grew {
            self.ctx.join(&other.ctx);
        }
        report
    }

    /// Builds a state from decoded parts, checking every invariant and building the indexes.
    pub(crate) fn from_parts(
        regs: BTreeMap<RegKey, DotFun<Registration>>,
        leases: BTreeMap<ProviderId, DotFun<Lease>>,
        ctx: CausalContext,
    ) -> Result<Self, InvalidState> {
        ctx.validate()?;
        let mut index = BTreeMap::new();
        let mut by_provider = BTreeSet::new();
        let mut check = |d: &Dot, slot: Slot| -> Result<(), InvalidState> {
            if d.counter == 0 {
                return Err(InvalidState::ZeroCounter(d.actor.to_string()));
            }
            if !ctx.contains(d) {
                return Err(InvalidState::DotNotInContext(format!("{d}")));
            }
            if ctx.retired().any(|(r, x)| r == d.actor && d.counter <= x.counter) {
                return Err(InvalidState::RetiredDot(format!("{d}")));
            }
            if index.insert(d.clone(), slot).is_some() {
                return Err(InvalidState::DuplicateDot(format!("{d}")));
            }
            Ok(())
        };
        for (key, f) in &regs {
            if f.is_empty() || !f.is_sorted_unique() {
                return Err(InvalidState::EmptyEntry(format!(
                    "{}/{}",
                    key.service, key.provider
                )));
            }
            for (d, v) in f.iter() {
                v.validate()?;
                check(d, Slot::Reg(key.clone()))?;
            }
            by_provider.insert((key.provider.clone(), key.service.clone()));
        }
        for (p, f) in &leases {
            if f.is_empty() || !f.is_sorted_unique() {
                return Err(InvalidState::EmptyEntry(format!("lease of {p}")));
            }
            for (d, v) in f.iter() {
                v.validate()?;
                check(d, Slot::Lease(p.clone()))?;
            }
        }
        Ok(Self {
            regs,
            leases,
            ctx,
            index,
            by_provider,
        })
    }

    /// A delta that removes exactly these dots (an empty store, a context of these dots).
    pub(crate) fn removal(dots: impl IntoIterator<Item = Dot>) -> Self {
        Self {
            ctx: CausalContext::from_dots(dots),
            ..Self::default()
        }
    }

    /// How many stored dots `replica` minted.
    pub(crate) fn dots_of(&self, replica: crate::id::ReplicaId) -> usize {
        self.index.range(dot(replica, 1)..=dot(replica, u64::MAX)).count()
    }

    /// The dots of one registration.
    pub(crate) fn reg_dots(&self, key: &RegKey) -> Vec<Dot> {
        self.regs
            .get(key)
            .map(|f| f.dots().cloned().collect())
            .unwrap_or_default()
    }

    /// The dots of one provider's lease.
    pub(crate) fn lease_dots(&self, p: &ProviderId) -> Vec<Dot> {
        self.leases
            .get(p)
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
                (p.clone(), pairs)
            })
            .collect();
        Elided {
            regs,
            leases,
            ctx: self.ctx.clone(),
        }
    }
}

/// A full state with the values a peer already holds left out (see [`State::elide_for`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Elided {
    pub(crate) regs: BTreeMap<RegKey, Vec<(Dot, Option<Registration>)>>,
    pub(crate) leases: BTreeMap<ProviderId, Vec<(Dot, Option<Lease>)>>,
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
        let mut regs = BTreeMap::new();
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
                regs.insert(key, DotFun::from_vec(f));
            }
        }
        let mut leases = BTreeMap::new();
        for (p, pairs) in self.leases {
            let mut f: Vec<(Dot, Lease)> = Vec::with_capacity(pairs.len());
            for (d, v) in pairs {
                let v = match v {
                    Some(v) => v,
                    None => match local.lease(&p).and_then(|lf| lf.get(&d)) {
                        Some(v) => *v,
                        None if local.ctx.contains(&d) => continue,
                        None => return Err(MissingValue { dot: format!("{d}") }.into()),
                    },
                };
                f.push((d, v));
            }
            if !f.is_empty() {
                leases.insert(p, DotFun::from_vec(f));
            }
        }
        Ok(State::from_parts(regs, leases, self.ctx)?)
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

/// The encoded shape of a state: the store and the context, no indexes.
#[derive(Serialize)]
pub(crate) struct WireRef<'a> {
    pub(crate) regs: &'a BTreeMap<RegKey, DotFun<Registration>>,
    pub(crate) leases: &'a BTreeMap<ProviderId, DotFun<Lease>>,
    pub(crate) ctx: &'a CausalContext,
}

/// The decoded shape of a state, before its invariants are checked.
#[derive(Deserialize)]
pub(crate) struct Wire {
    pub(crate) regs: BTreeMap<RegKey, DotFun<Registration>>,
    pub(crate) leases: BTreeMap<ProviderId, DotFun<Lease>>,
    pub(crate) ctx: CausalContext,
}

impl State {
    pub(crate) fn wire(&self) -> WireRef<'_> {
        WireRef {
            regs: &self.regs,
            leases: &self.leases,
            ctx: &self.ctx,
        }
    }
}
