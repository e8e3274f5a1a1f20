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
use crate::id::{Dot, ProviderId, ServiceName};
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
    pub(crate) leases: BTreeSet<ProviderId>,
}

/// A registry state, or a delta (a state of the same type).
///
/// A delta also names the keys its context reaches into (`touched`), so a join visits only
/// those. A full state names none (`None`): joining it visits every key. `None` is the
/// safe default; equality and the lattice ignore the hint.
#[derive(Clone, Default)]
pub struct State {
    pub(crate) regs: BTreeMap<RegKey, DotFun<Registration>>,
    pub(crate) leases: BTreeMap<ProviderId, DotFun<Lease>>,
    pub(crate) ctx: CausalContext,
    pub(crate) touched: Option<Touched>,
}

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

/// Our dots in one dot function that `other` has seen but does not store: removals.
fn removed_dots<V>(mine: &DotFun<V>, theirs: Option<&DotFun<V>>, their_ctx: &CausalContext) -> Vec<Dot> {
    mine.dots()
        .filter(|d| their_ctx.contains(d) && !theirs.is_some_and(|f| f.contains(d)))
        .cloned()
        .collect()
}

/// Removes dots from one dot function; drops the key if it empties.
fn remove_from<K: Ord + Clone, V>(map: &mut BTreeMap<K, DotFun<V>>, key: &K, dots: &[Dot]) {
    if let Some(f) = map.get_mut(key) {
        for d in dots {
            f.remove(d);
        }
        if f.is_empty() {
            map.remove(key);
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
        self.regs.len()
    }

    /// How many provider leases the store holds, live or not.
    pub fn lease_count(&self) -> usize {
        self.leases.len()
    }

    /// How many dots the store holds.
    pub fn dot_count(&self) -> usize {
        self.regs.values().map(|f| f.dots().count()).sum::<usize>()
            + self.leases.values().map(|f| f.dots().count()).sum::<usize>()
    }

    pub(crate) fn reg(&self, key: &RegKey) -> Option<&DotFun<Registration>> {
        self.regs.get(key)
    }

    pub(crate) fn lease(&self, provider: &ProviderId) -> Option<&DotFun<Lease>> {
        self.leases.get(provider)
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

    /// The keys (registrations, then providers) a join with `other` may touch; `None` when
    /// `other` is a full state and every key may be touched.
    pub(crate) fn keys_touched_by(other: &State) -> Option<(BTreeSet<RegKey>, BTreeSet<ProviderId>)> {
        let t = other.touched.as_ref()?;
        let regs = t.regs.iter().chain(other.regs.keys()).cloned().collect();
        let leases = t.leases.iter().chain(other.leases.keys()).cloned().collect();
        Some((regs, leases))
    }

    /// Inserts a dot into a registration; the caller guarantees the dot is new.
    pub(crate) fn insert_reg(&mut self, key: RegKey, d: Dot, v: Registration) {
        match self.regs.get_mut(&key) {
            Some(f) => {
                f.insert(d, v);
            }
            None => {
                self.regs.insert(key, DotFun::single(d, v));
            }
        }
    }

    /// Inserts a dot into a provider's lease; the caller guarantees the dot is new.
    pub(crate) fn insert_lease(&mut self, provider: ProviderId, d: Dot, v: Lease) {
        match self.leases.get_mut(&provider) {
            Some(f) => {
                f.insert(d, v);
            }
            None => {
                self.leases.insert(provider, DotFun::single(d, v));
            }
        }
    }

    /// Joins `other` into this state: the least upper bound of the two.
    ///
    /// Idempotent, commutative and associative, so deltas may arrive in any order, twice, or
    /// never (a later join of a full state repairs the loss). A delta costs
    /// `O(|delta| log |self|)`; a full state visits every key of both.
    pub fn join(&mut self, other: State) -> JoinReport {
        let mut report = JoinReport {
            context_grew: !self.ctx.includes(&other.ctx),
            ..JoinReport::default()
        };
        // 1. Removals: our dots that `other` has seen but does not store.
        let mut removed_regs: Vec<(RegKey, Vec<Dot>)> = Vec::new();
        let mut removed_leases: Vec<(ProviderId, Vec<Dot>)> = Vec::new();
        match Self::keys_touched_by(&other) {
            Some((regs, leases)) => {
                for k in regs {
                    if let Some(f) = self.regs.get(&k) {
                        let ds = removed_dots(f, other.regs.get(&k), &other.ctx);
                        if !ds.is_empty() {
                            removed_regs.push((k, ds));
                        }
                    }
                }
                for p in leases {
                    if let Some(f) = self.leases.get(&p) {
                        let ds = removed_dots(f, other.leases.get(&p), &other.ctx);
                        if !ds.is_empty() {
                            removed_leases.push((p, ds));
                        }
                    }
                }
            }
            None => {
                for (k, f) in &self.regs {
                    let ds = removed_dots(f, other.regs.get(k), &other.ctx);
                    if !ds.is_empty() {
                        removed_regs.push((k.clone(), ds));
                    }
                }
                for (p, f) in &self.leases {
                    let ds = removed_dots(f, other.leases.get(p), &other.ctx);
                    if !ds.is_empty() {
                        removed_leases.push((p.clone(), ds));
                    }
                }
            }
        }
        // 2. Additions: `other`'s dots that we have never seen. Decided against our context
        // before it is joined, independently of step 1 (which only looks at `other`).
        if let Some(mine) = &mut self.touched {
            match &other.touched {
                // A delta joined with a full state is a full state.
                None => self.touched = None,
                Some(theirs) => {
                    mine.regs.extend(theirs.regs.iter().cloned());
                    mine.regs.extend(other.regs.keys().cloned());
                    mine.regs.extend(removed_regs.iter().map(|(k, _)| k.clone()));
                    mine.leases.extend(theirs.leases.iter().cloned());
                    mine.leases.extend(other.leases.keys().cloned());
                    mine.leases.extend(removed_leases.iter().map(|(p, _)| p.clone()));
                }
            }
        }
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
        for (k, ds) in removed_regs {
            remove_from(&mut self.regs, &k, &ds);
            report.regs.insert(k);
        }
        for (p, ds) in removed_leases {
            remove_from(&mut self.leases, &p, &ds);
            report.leases.insert(p);
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

    /// Builds a state from decoded parts, checking every invariant.
    pub(crate) fn from_parts(
        regs: BTreeMap<RegKey, DotFun<Registration>>,
        leases: BTreeMap<ProviderId, DotFun<Lease>>,
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
        for (key, f) in &regs {
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
        for (p, f) in &leases {
            if f.is_empty() || !f.is_sorted_unique() {
                return Err(InvalidState::EmptyEntry(format!("lease of {p}")));
            }
            for (d, v) in f.iter() {
                v.validate()?;
                check(d)?;
            }
        }
        Ok(Self {
            regs,
            leases,
            ctx,
            touched,
        })
    }

    /// A delta that removes exactly these dots from these keys.
    pub(crate) fn removal(dots: Vec<Dot>, regs: BTreeSet<RegKey>, leases: BTreeSet<ProviderId>) -> Self {
        Self {
            ctx: CausalContext::from_dots(dots),
            touched: Some(Touched { regs, leases }),
            ..Self::default()
        }
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
        Ok(State::from_parts(regs, leases, self.ctx, None)?)
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
    pub(crate) regs: &'a BTreeMap<RegKey, DotFun<Registration>>,
    pub(crate) leases: &'a BTreeMap<ProviderId, DotFun<Lease>>,
    pub(crate) ctx: &'a CausalContext,
    pub(crate) touched: Option<Touched>,
}

/// The decoded shape of a state, before its invariants are checked.
#[derive(Deserialize)]
pub(crate) struct Wire {
    pub(crate) regs: BTreeMap<RegKey, DotFun<Registration>>,
    pub(crate) leases: BTreeMap<ProviderId, DotFun<Lease>>,
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
            leases: &self.leases,
            ctx: &self.ctx,
            touched,
        }
    }
}
