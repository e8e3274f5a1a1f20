//! Writes in bulk: many registrations in one delta, so a deploy of a thousand instances
//! costs one join, one delta in the buffer and one push, not a thousand.

use std::collections::BTreeMap;

use super::{Applied, Replica};
use crate::context::CausalContext;
use crate::endpoint::Endpoint;
use crate::error::InvalidInput;
use crate::hlc::Hlc;
use crate::id::RegKey;
use crate::id::{ProviderId, ServiceName};
use crate::meta::Metadata;
use crate::state::State;
use crate::status::Status;
use crate::value::{validate_metadata, Lease, Registration};

/// One registration of a bulk write ([`Replica::register_many`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewRegistration {
    /// The service.
    pub service: ServiceName,
    /// The provider offering it.
    pub provider: ProviderId,
    /// Where it listens.
    pub endpoint: Endpoint,
    /// Its metadata.
    pub meta: Metadata,
    /// How it is doing.
    pub status: Status,
    /// When it was first registered (wall ms), kept across its updates.
    pub since_ms: u64,
}

impl NewRegistration {
    /// A passing registration first made at `since_ms`.
    pub fn new(
        service: ServiceName,
        provider: ProviderId,
        endpoint: Endpoint,
        meta: Metadata,
        since_ms: u64,
    ) -> Self {
        Self {
            service,
            provider,
            endpoint,
            meta,
            status: Status::passing(),
            since_ms,
        }
    }
}

/// What a registration holds besides where it lives and when it was written.
struct Content {
    endpoint: Endpoint,
    meta: Metadata,
    status: Status,
    since_ms: u64,
}

impl Replica {
    /// Registers (or updates) many instances in one delta: what as many
    /// [`Replica::register`] calls would leave, with one dot per key and at most one lease
    /// write. A key given twice keeps its last value (one write, not two concurrent ones).
    ///
    /// # Errors
    /// The index of the first item whose metadata break a limit, or of none (`0`) when the
    /// TTL is out of range, with why; nothing is changed.
    pub fn register_many(
        &mut self,
        items: Vec<NewRegistration>,
        lease_ttl_ms: u64,
        now: Hlc,
    ) -> Result<Applied, (usize, InvalidInput)> {
        for (i, item) in items.iter().enumerate() {
            validate_metadata(&item.meta).map_err(|e| (i, e))?;
            item.status.validate().map_err(|e| (i, e))?;
        }
        let lease = Lease::new(now, lease_ttl_ms).map_err(|e| (0, e))?;
        let last: BTreeMap<RegKey, Content> = items
            .into_iter()
            .map(|r| {
                let key = RegKey {
                    service: r.service,
                    provider: r.provider,
                };
                let content = Content {
                    endpoint: r.endpoint,
                    meta: r.meta,
                    status: r.status,
                    since_ms: r.since_ms,
                };
                (key, content)
            })
            .collect();
        let mut delta = State::new_delta();
        let mut seen = Vec::new();
        let lease_dot = self.own_live_lease(lease, now, &mut seen, &mut delta);
        for (key, c) in last {
            seen.extend(self.state.reg_dots(&key));
            let d = self.mint();
            seen.push(d.clone());
            let registration = Registration {
                endpoint: c.endpoint,
                meta: c.meta,
                status: c.status,
                since_ms: c.since_ms,
                written: now,
                lease_dot: lease_dot.clone(),
            };
            delta.insert_reg(key, d, registration);
        }
        Ok(self.apply_own(delta.with_context(CausalContext::from_dots(seen)), now.millis()))
    }

    /// The dot of this node's live lease at `now`, or of `lease` written into `delta` when
    /// it has none (as [`Replica::register`] does).
    fn own_live_lease(
        &mut self,
        lease: Lease,
        now: Hlc,
        seen: &mut Vec<crate::id::Dot>,
        delta: &mut State,
    ) -> crate::id::Dot {
        let current = self.state.lease(self.id).and_then(|f| f.winner(|l| l.issued));
        match current {
            Some((d, l)) if l.is_live(now.millis()) && l.issued <= now => d.clone(),
            _ => {
                let d = self.mint();
                seen.extend(self.state.lease_dots(self.id));
                seen.push(d.clone());
                delta.insert_lease(self.id, d.clone(), lease);
                d
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::ReplicaId;

    fn item(service: &str, provider: &str, port: u16) -> NewRegistration {
        NewRegistration::new(
            ServiceName::new(service).unwrap(),
            ProviderId::new(provider).unwrap(),
            Endpoint::new("10.0.0.1", port).unwrap(),
            Metadata::default(),
            // As `Replica::register` at the tests' time: first registered when written.
            1_000,
        )
    }

    fn batch(n: u16) -> Vec<NewRegistration> {
        (0..n).map(|i| item("web", &format!("w{i}"), 1000 + i)).collect()
    }

    #[test]
    fn a_bulk_write_is_one_delta_with_a_write_per_key_and_one_lease() {
        let mut r = Replica::new(ReplicaId(1));
        let applied = r.register_many(batch(100), 10_000, Hlc::new(1_000, 0)).unwrap();
        assert_eq!(applied.delta.registration_count(), 100);
        assert_eq!(applied.delta.lease_count(), 1);
        assert_eq!(applied.changes.len(), 100);
        let web = ServiceName::new("web").unwrap();
        assert_eq!(r.instances(&web, 1_001).count(), 100);
        // The lease is live now: a second batch writes none.
        let again = r.register_many(batch(3), 10_000, Hlc::new(1_002, 0)).unwrap();
        assert_eq!(again.delta.lease_count(), 0);
        assert_eq!(r.instances(&web, 1_003).count(), 100);
    }

    #[test]
    fn a_bulk_write_reads_as_the_same_registrations_written_one_by_one() {
        let (mut bulk, mut single) = (Replica::new(ReplicaId(1)), Replica::new(ReplicaId(1)));
        let now = Hlc::new(1_000, 0);
        bulk.register_many(batch(20), 10_000, now).unwrap();
        for r in batch(20) {
            single
                .register(r.service, r.provider, r.endpoint, r.meta, 10_000, now)
                .unwrap();
        }
        let web = ServiceName::new("web").unwrap();
        let read = |r: &Replica| r.instances(&web, 1_001).map(|i| i.to_owned()).collect::<Vec<_>>();
        assert_eq!(read(&bulk), read(&single));
        assert_eq!(bulk.counter(), single.counter());
    }

    #[test]
    fn a_key_given_twice_keeps_its_last_value_as_one_write() {
        let mut r = Replica::new(ReplicaId(1));
        let items = vec![item("web", "a", 1), item("web", "a", 2)];
        let applied = r.register_many(items, 10_000, Hlc::new(1_000, 0)).unwrap();
        assert_eq!(applied.delta.registration_count(), 1);
        let web = ServiceName::new("web").unwrap();
        let live: Vec<_> = r.instances(&web, 1_001).map(|i| i.to_owned()).collect();
        assert_eq!(live.len(), 1);
        assert_eq!(live[0].endpoint, Endpoint::new("10.0.0.1", 2).unwrap());
    }

    #[test]
    fn an_update_in_bulk_replaces_the_earlier_write_of_its_key() {
        let mut r = Replica::new(ReplicaId(1));
        r.register_many(vec![item("web", "a", 1)], 10_000, Hlc::new(1_000, 0))
            .unwrap();
        r.register_many(vec![item("web", "a", 2)], 10_000, Hlc::new(1_001, 0))
            .unwrap();
        let key = RegKey {
            service: ServiceName::new("web").unwrap(),
            provider: ProviderId::new("a").unwrap(),
        };
        assert_eq!(r.state().reg_dots(&key).len(), 1);
    }

    #[test]
    fn a_bad_item_is_named_by_its_index_and_changes_nothing() {
        let mut r = Replica::new(ReplicaId(1));
        let mut items = batch(5);
        let big: Metadata = (0..100).map(|i| (format!("k{i}"), "v".to_string())).collect();
        items[3].meta = big;
        let before = r.counter();
        let (at, _) = r.register_many(items, 10_000, Hlc::new(1_000, 0)).unwrap_err();
        assert_eq!(at, 3);
        assert_eq!(r.counter(), before);
        assert_eq!(r.state().registration_count(), 0);
    }
}
