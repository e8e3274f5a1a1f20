//! A state stored entry by entry: what a data directory needs to save only what changed.
//!
//! A replica that tracks its changes ([`Replica::track_changes`]) notes the key of every
//! registration and lease whose dots a join changed; [`Replica::take_changed`] hands those
//! over. A store then writes each such entry ([`State::encode_reg_entry`],
//! [`State::encode_lease_entry`]; `None` means the key is gone) together with the whole
//! context, and rebuilds the state from its entries with an [`EntryLoader`], which checks
//! every invariant as decoding a whole state does.
//!
//! Every change to a state goes through [`State::join`], whose report names exactly the keys
//! whose dots changed; the context changes besides (retirements forgotten), so a store writes
//! it whole each time (its size follows the nodes, not the registry).

use std::collections::BTreeSet;

use crate::codec;
use crate::context::CausalContext;
use crate::dotfun::DotFun;
use crate::error::DecodeError;
use crate::id::RegKey;
use crate::id::ReplicaId;
use crate::regstore::RegMap;
use crate::replica::Replica;
use crate::state::{JoinReport, LeaseMap, State};
use crate::value::Lease;

/// The keys whose entries changed: the registrations and the nodes' leases.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChangedKeys {
    /// Registrations that gained or lost a dot (possibly emptied: gone).
    pub regs: BTreeSet<RegKey>,
    /// Nodes whose lease gained or lost a dot (possibly emptied: gone).
    pub leases: BTreeSet<ReplicaId>,
}

impl ChangedKeys {
    /// Whether no key changed.
    pub fn is_empty(&self) -> bool {
        self.regs.is_empty() && self.leases.is_empty()
    }

    /// How many keys changed.
    pub fn len(&self) -> usize {
        self.regs.len() + self.leases.len()
    }

    /// Adds the keys of `other` (a save that failed gives its keys back this way).
    pub fn merge(&mut self, other: ChangedKeys) {
        self.regs.extend(other.regs);
        self.leases.extend(other.leases);
    }

    pub(crate) fn record(&mut self, report: &JoinReport) {
        self.regs.extend(report.regs.iter().cloned());
        self.leases.extend(report.leases.iter().copied());
    }
}

impl Replica {
    /// From now on, notes the keys every change touches, until [`Replica::take_changed`]
    /// takes them. Without it nothing is noted (and nothing grows).
    pub fn track_changes(&mut self) {
        self.changed.get_or_insert_with(ChangedKeys::default);
    }

    /// The keys changed since the last call (or since tracking began); `None` when this
    /// replica does not track its changes.
    pub fn take_changed(&mut self) -> Option<ChangedKeys> {
        self.changed.as_mut().map(std::mem::take)
    }
}

impl State {
    /// The keys of every registration stored.
    pub fn reg_keys(&self) -> impl Iterator<Item = &RegKey> + '_ {
        self.regs.keys()
    }

    /// The nodes whose lease is stored.
    pub fn lease_nodes(&self) -> impl Iterator<Item = ReplicaId> + '_ {
        self.leases.keys().copied()
    }

    /// The encoded entry (every write) of one registration; `None` when none is stored.
    pub fn encode_reg_entry(&self, key: &RegKey) -> Option<Vec<u8>> {
        self.regs.get(key).map(codec::encode_value)
    }

    /// The encoded entry (every lease write) of one node's lease; `None` when none is stored.
    pub fn encode_lease_entry(&self, node: ReplicaId) -> Option<Vec<u8>> {
        self.leases.get(&node).map(codec::encode_value)
    }
}

/// Rebuilds a state from its stored entries and its context (see the module docs).
#[derive(Default)]
pub struct EntryLoader {
    regs: RegMap,
    leases: LeaseMap,
}

impl std::fmt::Debug for EntryLoader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EntryLoader")
            .field("regs", &self.regs.size())
            .field("leases", &self.leases.size())
            .finish()
    }
}

impl EntryLoader {
    /// An empty loader.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the stored entry of one registration.
    ///
    /// # Errors
    /// [`DecodeError`] for bytes that are not such an entry.
    pub fn add_reg(&mut self, mut key: RegKey, bytes: &[u8]) -> Result<(), DecodeError> {
        let f = codec::decode_registrations(bytes)?;
        // Entries come in key order: one copy of each service name, as a join keeps.
        let last = self.regs.last().map(|(k, _)| &k.service);
        if let Some(s) = last.filter(|s| **s == key.service) {
            key.service = s.clone();
        }
        self.regs.insert_mut(key, f);
        Ok(())
    }

    /// Adds the stored entry of one node's lease.
    ///
    /// # Errors
    /// [`DecodeError`] for bytes that are not such an entry.
    pub fn add_lease(&mut self, node: ReplicaId, bytes: &[u8]) -> Result<(), DecodeError> {
        // Unchanged since format 2.
        let f: DotFun<Lease> = codec::decode_since(bytes, 2)?;
        self.leases.insert_mut(node, f);
        Ok(())
    }

    /// The state, with the encoded context (`None`: nothing seen yet), every invariant
    /// checked.
    ///
    /// # Errors
    /// [`DecodeError`] for a context that does not decode, or a state that breaks an
    /// invariant (an entry whose dot the context never saw, say).
    pub fn finish(self, ctx: Option<&[u8]>) -> Result<State, DecodeError> {
        let ctx = match ctx {
            Some(bytes) => codec::decode_context(bytes)?,
            None => CausalContext::default(),
        };
        Ok(State::from_parts(self.regs, self.leases, ctx, None)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Endpoint, Hlc, ProviderId, ServiceName};

    fn loaded(r: &Replica) -> State {
        let s = r.state();
        let mut l = EntryLoader::new();
        for k in s.reg_keys() {
            l.add_reg(k.clone(), &s.encode_reg_entry(k).unwrap()).unwrap();
        }
        for n in s.lease_nodes() {
            l.add_lease(n, &s.encode_lease_entry(n).unwrap()).unwrap();
        }
        l.finish(Some(&codec::encode_context(s.context()))).unwrap()
    }

    #[test]
    fn loaded_keys_of_one_service_hold_one_copy_of_its_name() {
        let mut r = Replica::new(ReplicaId(1));
        for p in ["a", "b", "c"] {
            let (web, p) = (ServiceName::new("web").unwrap(), ProviderId::new(p).unwrap());
            let ep = Endpoint::new("10.0.0.1", 80).unwrap();
            r.register(web, p, ep, Default::default(), 60_000, Hlc::new(1_000, 0))
                .unwrap();
        }
        // Each key read from its row: a name of its own.
        let mut l = EntryLoader::new();
        for k in r.state().reg_keys() {
            let fresh = RegKey {
                service: ServiceName::new(k.service.as_str()).unwrap(),
                provider: k.provider.clone(),
            };
            l.add_reg(fresh, &r.state().encode_reg_entry(k).unwrap()).unwrap();
        }
        for n in r.state().lease_nodes() {
            l.add_lease(n, &r.state().encode_lease_entry(n).unwrap()).unwrap();
        }
        let s = l.finish(Some(&codec::encode_context(r.context()))).unwrap();
        assert_eq!(s, *r.state());
        let names: Vec<*const u8> = s.reg_keys().map(|k| k.service.as_str().as_ptr()).collect();
        assert_eq!(names.len(), 3);
        assert!(names.windows(2).all(|w| w[0] == w[1]));
    }

    #[test]
    fn a_tracked_replica_names_the_keys_it_changed_and_its_entries_rebuild_it() {
        let mut r = Replica::new(ReplicaId(1));
        assert_eq!(r.take_changed(), None);
        r.track_changes();
        let web = ServiceName::new("web").unwrap();
        let p = ProviderId::new("p").unwrap();
        let ep = Endpoint::new("10.0.0.1", 80).unwrap();
        r.register(
            web.clone(),
            p.clone(),
            ep,
            Default::default(),
            30_000,
            Hlc::new(5, 0),
        )
        .unwrap();
        let c = r.take_changed().unwrap();
        assert_eq!(c.regs.len(), 1);
        assert_eq!(c.leases, BTreeSet::from([ReplicaId(1)]));
        assert_eq!(r.take_changed(), Some(ChangedKeys::default()));
        assert_eq!(loaded(&r), *r.state());
        r.deregister(web, p, 6).unwrap();
        let c = r.take_changed().unwrap();
        assert_eq!(c.regs.len(), 1);
        assert!(r.state().encode_reg_entry(c.regs.first().unwrap()).is_none());
        assert_eq!(loaded(&r), *r.state());
    }

    #[test]
    fn an_entry_whose_dot_the_context_never_saw_is_refused() {
        let mut r = Replica::new(ReplicaId(1));
        let web = ServiceName::new("web").unwrap();
        let p = ProviderId::new("p").unwrap();
        let ep = Endpoint::new("10.0.0.1", 80).unwrap();
        r.register(web, p, ep, Default::default(), 30_000, Hlc::new(5, 0))
            .unwrap();
        let s = r.state();
        let mut l = EntryLoader::new();
        let k = s.reg_keys().next().unwrap();
        l.add_reg(k.clone(), &s.encode_reg_entry(k).unwrap()).unwrap();
        assert!(matches!(l.finish(None), Err(DecodeError::Invalid(_))));
        assert!(EntryLoader::new().add_reg(k.clone(), &[2, 9]).is_err());
    }
}
