//! Registrations this node owns: writing and removing them, writing them again when a
//! peer's sweep or another node's write takes them, and renewing the lease they live by.

use std::collections::BTreeSet;
use std::sync::Arc;

use rand::RngExt;
use roster_registry::{
    Change, Endpoint, InvalidInput, Metadata, NewRegistration, ProviderId, RegKey, ServiceName, State, Status,
};

use super::{member_provider, members_service, Node, Now, Output, OwnedRegistration, GUARDED_LEASE_FACTOR};

/// The least time between two repairs of an overwrite of one owned instance by another
/// node: two nodes that both believe they own it (registered at the same moment through
/// two agents) take it from each other at this pace, not in a storm.
pub(super) const OVERWRITE_REPAIR_MS: u64 = 10_000;

impl Node {
    /// Registers (or updates) an instance this node owns and keeps alive: it lives by this
    /// node's lease (which the node renews, one renewal for all it owns), and is written
    /// again if a peer's sweep removes it or another node writes over it.
    ///
    /// # Errors
    /// [`InvalidInput`] when the metadata or TTL break a limit; nothing changes.
    pub fn register(
        &mut self,
        service: ServiceName,
        provider: ProviderId,
        endpoint: Endpoint,
        meta: Metadata,
        now: impl Into<Now>,
    ) -> Result<(), InvalidInput> {
        let now = self.input_time(now.into());
        let key = (service, provider);
        let (status, since_ms) = self
            .owned
            .get(&key)
            .map_or((Status::passing(), now.wall_ms), |o| {
                (o.status.clone(), o.since_ms)
            });
        let item = OwnedRegistration {
            service: key.0,
            provider: key.1,
            endpoint,
            meta,
            status,
            since_ms,
        };
        self.register_many(vec![Arc::new(item)], now).map_err(|(_, e)| e)
    }

    /// Removes an instance this node owns. Returns whether there was one.
    pub fn deregister(&mut self, service: &ServiceName, provider: &ProviderId, now: impl Into<Now>) -> bool {
        let now = self.input_time(now.into());
        let key = (service.clone(), provider.clone());
        self.overwrites_repaired.remove(&key);
        let owned = self.owned.remove(&key).is_some();
        match self
            .replica
            .deregister(service.clone(), provider.clone(), now.wall_ms)
        {
            Some(applied) => {
                self.local_delta(applied.delta, applied.changes, now);
                true
            }
            None => owned,
        }
    }

    pub(super) fn local_delta(&mut self, delta: State, changes: Vec<Change>, now: Now) {
        self.buffer_own(delta, now);
        self.schedule_push(now);
        self.emit_changes(changes, now);
    }

    pub(super) fn emit_changes(&mut self, changes: Vec<Change>, now: Now) {
        // Members that went while still in the replica (a lease that lapsed, a zone no
        // longer shown unreachable); changes that removed them noted theirs before.
        let regs = self.replica.registrations();
        self.note_departures(&regs, &changes, now);
        let mut lost = Vec::new();
        let mut refute = false;
        for c in changes {
            self.note_zone_of(&c);
            match &c {
                Change::Down { service, provider } => {
                    if let Some(o) = self.owned.get(&(service.clone(), provider.clone())) {
                        refute |= self.lease_gone(now);
                        if !self.holds_own_write(service, provider, now) {
                            lost.push((service.clone(), provider.clone(), o.clone()));
                        }
                    }
                }
                Change::Up(i) if i.node != self.me.id => {
                    let key = (i.service.clone(), i.provider.clone());
                    if let Some(o) = self.owned.get(&key) {
                        let due = self
                            .overwrites_repaired
                            .get(&key)
                            .is_none_or(|t| now.mono_ms >= t + OVERWRITE_REPAIR_MS);
                        if due {
                            lost.push((key.0.clone(), key.1.clone(), o.clone()));
                            self.overwrites_repaired.insert(key, now.mono_ms);
                            self.counters.overwrites_repaired += 1;
                        }
                    }
                }
                Change::Up(_) => {}
            }
            self.outputs.push_back(Output::Event(c));
        }
        // Written dead: renew first (what our held writes were hid comes back as it was),
        // then write again only what a sweep took.
        if refute {
            self.refute_death(now);
        }
        // A peer's sweep removed a registration we still hold (its lease looked ended
        // there), or another node wrote over it: write it again. Our own replica is the
        // source of truth for what we own.
        self.write_again(lost, now);
    }

    /// Owned registrations among `touched` (by a peer's delta just joined) of which the
    /// replica holds no write any more: removed by a peer's sweep, or an operator, while
    /// our read hid them already (our lease had ended here: a clock set right after a
    /// restart behind it), so no `Down` told of it. Written again, as a `Down` would have
    /// had them: the owner is the source of truth for what it owns, and nothing else
    /// would ever write them (the soak saw five gone from every node for 53 s).
    pub(super) fn write_again_removed(&mut self, touched: &BTreeSet<RegKey>, now: Now) {
        let lost: Vec<_> = touched
            .iter()
            .filter(|k| !self.replica.holds(k))
            .filter_map(|k| {
                let key = (k.service.clone(), k.provider.clone());
                let o = self.owned.get(&key)?.clone();
                Some((key.0, key.1, o))
            })
            .collect();
        self.write_again(lost, now);
    }

    /// Writes `lost` again at now, under this node's lease.
    fn write_again(&mut self, lost: Vec<(ServiceName, ProviderId, Arc<OwnedRegistration>)>, now: Now) {
        for (s, p, o) in lost {
            if self.stopping {
                break;
            }
            let stamp = self.clock.tick(now.wall_ms);
            let ttl = self.lease_ttl(now.wall_ms);
            let item = NewRegistration {
                service: s,
                provider: p,
                ..OwnedRegistration::clone(&o)
            };
            if let Ok(applied) = self.replica.register_many(vec![item], ttl, stamp) {
                self.buffer_own(applied.delta, now);
                self.schedule_push(now);
                for c in applied.changes {
                    self.outputs.push_back(Output::Event(c));
                }
            }
        }
    }

    /// Whether this node's lease is gone here (written dead, or ended).
    fn lease_gone(&self, now: Now) -> bool {
        !self
            .replica
            .lease_of(self.me.id)
            .is_some_and(|l| l.is_live(now.wall_ms))
    }

    /// Whether our write of `service`/`provider` is still held: then a renewal of our lease
    /// brings it back as it was, everywhere it was not swept, and it is not written again
    /// (a healed zone would otherwise write every registration it holds anew).
    fn holds_own_write(&self, service: &ServiceName, provider: &ProviderId, now: Now) -> bool {
        self.replica
            .explain(service, provider, now.wall_ms)
            .is_some_and(|p| p.writes.iter().any(|(d, _)| d.actor == self.me.id))
    }

    /// Writes this node's membership at its start. A lease kept from the process before is
    /// renewed at the first tick (it may be near its end, or of another length); one the
    /// membership just wrote is not renewed again until about half of it has passed.
    pub(super) fn register_membership(
        &mut self,
        endpoint: Endpoint,
        meta: Metadata,
        now: Now,
    ) -> Result<(), InvalidInput> {
        let kept = self.replica.lease_of(self.me.id).copied();
        self.register(
            members_service(),
            member_provider(self.me.id),
            endpoint,
            meta,
            now,
        )?;
        if let Some(fresh) = self.replica.lease_of(self.me.id).filter(|l| Some(**l) != kept) {
            self.renew_at = self.renewal_after(now.mono_ms, fresh.ttl_ms);
        }
        Ok(())
    }

    /// Renews this node's lease: one small delta for everything it owns.
    pub(super) fn renew(&mut self, now: Now) {
        let mut next = u64::MAX;
        if !self.owned.is_empty() {
            let stamp = self.clock.tick(now.wall_ms);
            let ttl = self.lease_ttl(now.wall_ms);
            if let Ok(applied) = self.replica.renew(ttl, stamp) {
                self.buffer_own(applied.delta, now);
                self.schedule_push(now);
                // What a lease written dead hid comes back (nothing, for a renewal on time).
                self.emit_changes(applied.changes, now);
            }
            next = self.renewal_after(now.mono_ms, ttl);
        }
        self.note_leases_shipped();
        self.renew_at = next;
    }

    /// When a lease of `ttl_ms` issued at `mono_ms` is next renewed: three eighths to a
    /// half of it later, drawn anew each time, so nodes started together (a fleet
    /// rollout, a healed partition) do not renew in lockstep. Half a lease is left for
    /// the renewal to arrive: a push takes milliseconds, and a lost one is sent again at
    /// the next gossip round. (Renewing every third of the lease cost a third more idle
    /// traffic, for margin nobody needed.)
    pub(super) fn renewal_after(&mut self, mono_ms: u64, ttl_ms: u64) -> u64 {
        let half = ttl_ms / 2;
        mono_ms + half - self.rng.random_range(0..=half / 4)
    }

    /// The TTL of this node's lease: the member lease, or more in a large cluster (see
    /// [`Config::lease_per_member_ms`]), and longer under the crash guard.
    pub(super) fn lease_ttl(&self, now_ms: u64) -> u64 {
        // The live members this node sees (itself among them), counted without copying
        // their URLs and names: this runs on every registration.
        let seen = self.replica.instances(&members_service(), now_ms).count() as u64;
        let members = seen.max(1).next_power_of_two();
        let ttl_ms = self
            .cfg
            .member_lease_ttl_ms
            .max(members.saturating_mul(self.cfg.lease_per_member_ms))
            .min(roster_registry::MAX_LEASE_TTL_MS);
        if self.guarded {
            ttl_ms
                .saturating_mul(GUARDED_LEASE_FACTOR)
                .min(roster_registry::MAX_LEASE_TTL_MS)
        } else {
            ttl_ms
        }
    }

    /// Notes how long connected peers will hold this node's lease (called when it changes
    /// while connected, and when a connection opens: the push ships it).
    pub(super) fn note_leases_shipped(&mut self) {
        if self.conns.is_empty() || self.owned.is_empty() {
            return;
        }
        self.leases_shipped = self
            .replica
            .lease_of(self.me.id)
            .map(|l| (l.deadline_ms(), l.ttl_ms));
    }
}
