//! A replica: one node's copy of the registry, with the mutators that mint its dots and the
//! queries that read it.
//!
//! Every mutator returns the delta it made after joining it locally (`m(X) = X ⊔ mδ(X)`),
//! so the caller can ship the delta as is. Reads take `now_ms` and hide what has expired at
//! once; [`Replica::expire`] only collects it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::context::CausalContext;
use crate::endpoint::Endpoint;
use crate::error::{InvalidInput, RetireError};
use crate::hlc::Hlc;
use crate::id::RegKey;
use crate::id::{dot, Dot, ProviderId, ReplicaId, ServiceName};
use crate::meta::Metadata;
use crate::state::{Elided, State};
use crate::value::{Lease, Registration};

mod apply;
mod bulk;
mod lapse;
mod sweep;
mod unreachable;

pub use bulk::NewRegistration;

/// One node's replica of the registry.
#[derive(Clone, Debug)]
pub struct Replica {
    id: ReplicaId,
    state: State,
    /// No dot at or below this counter will be minted (a floor saved on disk, so a node
    /// that lost its last writes in a crash never reuses a dot).
    counter_floor: u64,
    /// The keys changed since they were last taken, when tracked (see `persist`).
    pub(crate) changed: Option<crate::persist::ChangedKeys>,
    /// Nodes that reads still show, as unreachable, although their lease ended or was
    /// removed, each with a stand-in lease that ends when they stop being shown (see
    /// [`Replica::set_unreachable`]). Not replicated: each node's own judgement.
    unreachable: Arc<BTreeMap<ReplicaId, Lease>>,
    /// No lease ends before this (wall ms), as far as [`Replica::lapsed_due`] knows: until
    /// then it finds nothing without looking. 0 until it first looked.
    lapse_floor: u64,
    /// How many times this replica changed (see [`Replica::version`]).
    version: u64,
    /// What the last sweep that found nothing knew (see [`Replica::expire_holding`]).
    sweep: Option<Box<sweep::SweepFloor>>,
}

/// A live service instance as a read sees it, borrowed from the replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InstanceRef<'a> {
    /// The service.
    pub service: &'a ServiceName,
    /// The provider offering it.
    pub provider: &'a ProviderId,
    /// The dot of the winning write.
    pub dot: &'a Dot,
    /// The registration.
    pub registration: &'a Registration,
    /// The lease of the node that wrote it, which keeps it alive (for an unreachable
    /// node, a stand-in that ends when reads stop showing it).
    pub lease: &'a Lease,
    /// Whether its node is unreachable: its lease ended or was removed, and this replica
    /// shows it all the same (see [`Replica::set_unreachable`]).
    pub unreachable: bool,
}

impl InstanceRef<'_> {
    /// The node (replica) that wrote this registration.
    pub fn node(&self) -> ReplicaId {
        self.dot.actor
    }

    /// Copies the instance out of the replica.
    pub fn to_owned(&self) -> Instance {
        Instance {
            service: self.service.clone(),
            provider: self.provider.clone(),
            endpoint: self.registration.endpoint.clone(),
            meta: self.registration.meta.clone(),
            status: self.registration.status.clone(),
            since_ms: self.registration.since_ms,
            written: self.registration.written,
            node: self.node(),
            lease_deadline_ms: self.lease.deadline_ms(),
            unreachable: self.unreachable,
        }
    }
}

/// A live service instance, owned (as carried by a [`Change`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instance {
    /// The service.
    pub service: ServiceName,
    /// The provider offering it.
    pub provider: ProviderId,
    /// Where it listens.
    pub endpoint: Endpoint,
    /// Its metadata.
    pub meta: Metadata,
    /// How it is doing, as its owner last judged it.
    pub status: crate::Status,
    /// When its owner first registered it (wall ms).
    pub since_ms: u64,
    /// When it was last written (registered, updated, or its status changed).
    pub written: Hlc,
    /// The node that wrote it.
    pub node: ReplicaId,
    /// When the lease of the node that wrote it ends, in milliseconds since the epoch,
    /// unless renewed.
    pub lease_deadline_ms: u64,
    /// Whether its node is unreachable (see [`InstanceRef::unreachable`]).
    pub unreachable: bool,
}

/// A change in what a read would return: an instance came up (or changed), or went down.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// The instance is now visible with this value (new, or updated).
    Up(Instance),
    /// The instance is no longer visible (deregistered, or its lease ended).
    Down {
        /// The service.
        service: ServiceName,
        /// The provider.
        provider: ProviderId,
    },
}

/// Everything known about one registration: what `roster explain` shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Provenance {
    /// Every write the register holds (more than one only while concurrent writes meet).
    pub writes: Vec<(Dot, Registration)>,
    /// The winning write, the greatest `(written, dot)`.
    pub winner: Option<Dot>,
    /// The lease dots and values of the nodes that wrote it.
    pub leases: Vec<(Dot, Lease)>,
    /// Whether a read at the given time shows the instance.
    pub live: bool,
}

/// The result of a mutation: the delta to ship, and what changed for readers.
#[derive(Clone, Debug)]
pub struct Applied {
    /// The delta; ship it to peers.
    pub delta: State,
    /// What became visible or invisible.
    pub changes: Vec<Change>,
}

impl Replica {
    /// A new, empty replica minting dots as `id`.
    pub fn new(id: ReplicaId) -> Self {
        Self::from_state(id, State::new(), 0)
    }

    /// A replica resumed from a saved state, never minting a counter at or below
    /// `counter_floor` (nor below what the state shows `id` already minted).
    pub fn from_state(id: ReplicaId, state: State, counter_floor: u64) -> Self {
        Self {
            id,
            state,
            counter_floor,
            changed: None,
            unreachable: Arc::default(),
            lapse_floor: 0,
            version: 0,
            sweep: None,
        }
    }

    /// How many times this replica changed: its state (a join that changed it, a sweep,
    /// a forgotten retirement) or the nodes it shows unreachable. While it stays the same,
    /// so do they, and what was computed from them (a hash of the state, a sweep that
    /// found nothing, the live members) still holds.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// This replica's id.
    pub fn id(&self) -> ReplicaId {
        self.id
    }

    /// The full state.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// The registrations as they are now, kept unchanged by what the replica does next
    /// (`O(1)`; see [`Registrations`]).
    pub fn registrations(&self) -> crate::regstore::Registrations {
        crate::regstore::Registrations::of(&self.state.regs)
    }

    /// The causal context: the digest peers compare against.
    pub fn context(&self) -> &CausalContext {
        self.state.context()
    }

    /// The greatest counter this replica has minted or seen minted in its name.
    pub fn counter(&self) -> u64 {
        self.counter_floor.max(self.state.ctx.max_counter(self.id))
    }

    pub(crate) fn mint(&mut self) -> Dot {
        let c = self.counter() + 1;
        // A dot minted twice would be two writes a peer takes for one.
        debug_assert!(
            c > self.state.ctx.max_counter(self.id),
            "a minted counter lies above every counter of this node in the context"
        );
        self.counter_floor = c;
        dot(self.id, c)
    }

    /// Registers (or updates) `provider`'s instance of `service`, passing and first
    /// registered now (see [`Replica::register_many`] for the rest), and makes sure this node
    /// holds a lease of `lease_ttl_ms`: the registration lives by this node's lease, as
    /// every registration lives by the lease of the node that wrote it.
    ///
    /// The lease is written too only when this node has no live lease at `now` (issued no
    /// later than `now`), so registering costs one registration, not a registration and a
    /// lease; a lease of another TTL gets the new one at its next renewal. (Re-issuing it
    /// whenever the wanted TTL changed, which follows the cluster's size, put a removal in
    /// a burst of registrations, and a peer catching up on that burst then got a key hint
    /// for every registration in it: 34 KB instead of 2 for a restart after ten changes.)
    ///
    /// # Errors
    /// [`InvalidInput`] when the metadata or the TTL break a limit; nothing is changed.
    pub fn register(
        &mut self,
        service: ServiceName,
        provider: ProviderId,
        endpoint: Endpoint,
        meta: Metadata,
        lease_ttl_ms: u64,
        now: Hlc,
    ) -> Result<Applied, InvalidInput> {
        let item = NewRegistration::new(service, provider, endpoint, meta, now.millis());
        self.register_many(vec![item], lease_ttl_ms, now)
            .map_err(|(_, e)| e)
    }

    /// Renews this node's lease: one small delta, whatever the number of its
    /// registrations.
    ///
    /// # Errors
    /// [`InvalidInput::LeaseTtl`] when the TTL is out of range; nothing is changed.
    pub fn renew(&mut self, lease_ttl_ms: u64, now: Hlc) -> Result<Applied, InvalidInput> {
        let lease = Lease::new(now, lease_ttl_ms)?;
        let mut seen = self.state.lease_dots(self.id);
        let d = self.mint();
        seen.push(d.clone());
        let mut delta = State::new_delta();
        delta.insert_lease(self.id, d, lease);
        Ok(self.apply_own(delta.with_context(CausalContext::from_dots(seen)), now.millis()))
    }

    /// Removes `provider`'s instance of `service`. `None` when there is nothing to remove.
    pub fn deregister(&mut self, service: ServiceName, provider: ProviderId, now_ms: u64) -> Option<Applied> {
        let key = RegKey { service, provider };
        let dots = self.state.reg_dots(&key);
        (!dots.is_empty()).then(|| self.apply_removal(dots, [key].into(), BTreeSet::new(), now_ms))
    }

    /// The counters this replica will never mint but has not seen either: the part of its
    /// counter floor above what its state shows. After a crash, the floor on disk is ahead
    /// of the saved state; some of those dots were minted and shipped before the crash
    /// (peers may hold them), the rest never were.
    pub fn unclaimed_gap(&self) -> u64 {
        let seen = self.state.ctx.seen_through(self.id);
        (seen + 1..=self.counter_floor)
            .filter(|c| !self.state.ctx.contains(&dot(self.id, *c)))
            .count() as u64
    }

    /// Claims every counter up to the floor that this replica's context lacks, as
    /// removed from `regs` and from this node's lease: the keys this replica could have
    /// written before a crash (its own registrations, those it removed lately, and its
    /// lease). Peers drop any value they hold under those dots (an old
    /// write of ours, superseded by what the caller rewrote at start) and their version
    /// vectors close the gap, so the context stays compact.
    ///
    /// Call it after rewriting this node's own registrations. `None` when there is no gap.
    pub fn close_gap(&mut self, regs: BTreeSet<RegKey>, now_ms: u64) -> Option<Applied> {
        let seen = self.state.ctx.seen_through(self.id);
        let gap: Vec<Dot> = (seen + 1..=self.counter_floor)
            .map(|c| dot(self.id, c))
            .filter(|d| !self.state.ctx.contains(d))
            .collect();
        (!gap.is_empty()).then(|| self.apply_removal(gap, regs, [self.id].into(), now_ms))
    }

    /// Leaves the cluster (a graceful exit): removes every registration this node wrote and
    /// its lease, and writes its farewell in their place ([`Lease::farewell`], issued
    /// `now`), so every replica tells it left rather than failed. One delta; the
    /// farewell's dot is the removal's own (see `apply_removal`). A renewal or a
    /// registration later (the node back) replaces the farewell like any lease.
    pub fn deregister_all(&mut self, now: Hlc) -> Applied {
        let me: BTreeSet<ReplicaId> = [self.id].into();
        let mut dots = self.state.lease_dots(self.id);
        let mut regs = BTreeSet::new();
        for (key, f) in &self.state.regs {
            for d in f.dots().filter(|d| d.actor == self.id) {
                dots.push(d.clone());
                regs.insert(key.clone());
            }
        }
        let farewell = self.mint();
        dots.push(farewell.clone());
        let mut delta = State::removal(dots, regs, me);
        delta.insert_lease(self.id, farewell, Lease::farewell(now));
        self.apply_own(delta, now.millis())
    }

    /// Writes `node` dead: removes the dots of its lease among `seen` (those its lease held
    /// when the caller began to suspect it), so its registrations disappear from every read
    /// and a later sweep collects them. A renewal the node wrote meanwhile has a dot not in
    /// `seen` and survives (add-wins), as does the node's own answer to this removal: a
    /// live node written dead renews its lease and is back. A farewell
    /// ([`Lease::farewell`]) is never removed: the node left, it did not fail. `None` when
    /// none of `seen` is still stored as a lease, or `node` is this replica.
    pub fn write_dead(&mut self, node: ReplicaId, seen: &[Dot], now_ms: u64) -> Option<Applied> {
        if node == self.id {
            return None;
        }
        let stored = self.state.lease(node)?;
        let dots: Vec<Dot> = seen
            .iter()
            .filter(|d| stored.get(d).is_some_and(|l| !l.is_farewell()))
            .cloned()
            .collect();
        (!dots.is_empty()).then(|| self.apply_removal(dots, BTreeSet::new(), [node].into(), now_ms))
    }

    /// The dots of `node`'s lease (what [`Replica::write_dead`] is given later).
    pub fn lease_dots(&self, node: ReplicaId) -> Vec<Dot> {
        self.state.lease_dots(node)
    }

    /// Retires `replica`, a node gone for good: its version-vector entry becomes a
    /// retirement record, and its dots, should any arrive late, are dropped on arrival.
    ///
    /// The caller decides when a node is gone for good (its own lease ended longer ago than
    /// any lease and message can last); this checks only what the state can tell.
    ///
    /// # Errors
    /// [`RetireError`] when `replica` is this replica, was never seen, or still has
    /// entries stored here (its farewell aside, which the retirement removes). Nothing is
    /// changed.
    pub fn retire(&mut self, replica: ReplicaId, now: Hlc) -> Result<Applied, RetireError> {
        if replica == self.id {
            return Err(RetireError::Itself);
        }
        let counter = self.state.ctx.max_counter(replica);
        if counter == 0 {
            return Err(RetireError::Unknown(replica.to_string()));
        }
        // Its farewell (it left) is no entry to wait for: the retirement removes it.
        let farewells = self
            .state
            .lease(replica)
            .map_or(0, |f| f.iter().filter(|(_, l)| l.is_farewell()).count());
        let dots = self.state.dots_of(replica) - farewells;
        if dots > 0 {
            return Err(RetireError::StillHolds {
                replica: replica.to_string(),
                dots,
            });
        }
        let delta = State::new().with_context(CausalContext::retiring(replica, counter, now));
        Ok(self.apply_own(delta, now.millis()))
    }

    /// Forgets retirement records made before `before` (see
    /// [`CausalContext::forget_retired`]). Returns how many were forgotten.
    pub fn forget_retired(&mut self, before: Hlc) -> usize {
        let forgotten = self.state.ctx.forget_retired(before);
        if forgotten > 0 {
            self.version += 1;
        }
        forgotten
    }

    /// A removal of `dots` from these keys, carrying one new dot of this replica in its
    /// context: a removal is an event too, so a replica that has seen it has a larger
    /// context than one that has not, and comparing digests finds the difference.
    /// (Without it, a replica that missed a removal has the same context as one that saw
    /// it, and no digest exchange would ever repair it.)
    fn apply_removal(
        &mut self,
        mut dots: Vec<Dot>,
        regs: BTreeSet<RegKey>,
        leases: BTreeSet<ReplicaId>,
        now_ms: u64,
    ) -> Applied {
        dots.push(self.mint());
        self.apply_own(State::removal(dots, regs, leases), now_ms)
    }

    /// Never mint a counter at or below `floor` (see [`Replica::refute`]).
    pub(crate) fn raise_floor(&mut self, floor: u64) {
        self.counter_floor = self.counter_floor.max(floor);
    }

    /// Joins `delta`, a state that may remove dots from any key (it names none), with one
    /// new dot of ours in its context (a removal is an event: see `apply_removal`).
    pub(crate) fn apply_removal_to_every_key(&mut self, delta: State, now_ms: u64) -> Applied {
        let mut ctx = delta.context().clone();
        ctx.insert(self.mint());
        self.apply_own(delta.with_context(ctx), now_ms)
    }

    fn lease_live(&self, node: ReplicaId, now_ms: u64) -> bool {
        self.lease_of(node).is_some_and(|l| l.is_live(now_ms))
    }

    /// The winning lease of a node, live or not.
    pub fn lease_of(&self, node: ReplicaId) -> Option<&Lease> {
        self.state.lease(node)?.winner(|l| l.issued).map(|(_, l)| l)
    }

    /// The live instance under `key` at `now_ms`, if any.
    pub fn visible(&self, key: &RegKey, now_ms: u64) -> Option<InstanceRef<'_>> {
        let (k, f) = self.state.regs.get_key_value(key)?;
        self.live_instance(k, f, now_ms)
    }

    fn live_instance<'a>(
        &'a self,
        k: &'a RegKey,
        f: &'a crate::dotfun::DotFun<Registration>,
        now_ms: u64,
    ) -> Option<InstanceRef<'a>> {
        // The greatest `(written, dot)` among the writes whose node's lease is live: a write
        // lives by the lease of the node that made it.
        let (dot, registration, (lease, unreachable)) = f
            .iter()
            .filter_map(|(d, r)| Some((d, r, self.live_lease(d.actor, now_ms)?)))
            .max_by(|a, b| (a.1.written, a.0).cmp(&(b.1.written, b.0)))?;
        Some(InstanceRef {
            service: &k.service,
            provider: &k.provider,
            dot,
            registration,
            lease,
            unreachable,
        })
    }

    /// The live instances of `service` at `now_ms`, sorted by provider id.
    pub fn instances<'a>(
        &'a self,
        service: &'a ServiceName,
        now_ms: u64,
    ) -> impl Iterator<Item = InstanceRef<'a>> + 'a {
        self.state
            .regs_of(service)
            .filter_map(move |(k, f)| self.live_instance(k, f, now_ms))
    }

    /// Every service with at least one live instance at `now_ms`, with its instance count,
    /// sorted by name.
    pub fn services(&self, now_ms: u64) -> Vec<(ServiceName, usize)> {
        let mut out: Vec<(ServiceName, usize)> = Vec::new();
        for (k, f) in &self.state.regs {
            if self.live_instance(k, f, now_ms).is_none() {
                continue;
            }
            match out.last_mut() {
                Some((s, n)) if s == &k.service => *n += 1,
                _ => out.push((k.service.clone(), 1)),
            }
        }
        out
    }

    /// Whether the store holds any write of `key`, live or not (a removal leaves none).
    pub fn holds(&self, key: &RegKey) -> bool {
        self.state.reg(key).is_some()
    }

    /// Everything known about one registration, live or not; `None` if the store has no
    /// write for it.
    pub fn explain(&self, service: &ServiceName, provider: &ProviderId, now_ms: u64) -> Option<Provenance> {
        let key = RegKey {
            service: service.clone(),
            provider: provider.clone(),
        };
        let f = self.state.reg(&key)?;
        let writers: BTreeSet<ReplicaId> = f.dots().map(|d| d.actor).collect();
        let leases = writers
            .into_iter()
            .filter_map(|n| self.state.lease(n))
            .flat_map(|lf| lf.iter().map(|(d, l)| (d.clone(), *l)))
            .collect();
        Some(Provenance {
            writes: f.iter().map(|(d, r)| (d.clone(), r.clone())).collect(),
            winner: f.winner(|r| r.written).map(|(d, _)| d.clone()),
            leases,
            live: self.visible(&key, now_ms).is_some(),
        })
    }

    /// The state as the peer with digest `peer` needs it (see [`State::elide_for`]).
    pub fn elide_for(&self, peer: &CausalContext) -> Elided {
        self.state.elide_for(peer)
    }
}
