//! Writes in bulk: many owned registrations in one delta (one push, one snapshot).

use std::sync::Arc;

use roster_registry::InvalidInput;

use super::{Node, Now, OwnedRegistration};

impl Node {
    /// Registers (or updates) many instances this node owns, in one delta: as
    /// [`Node::register`] for each, at the cost of one.
    ///
    /// # Errors
    /// The index of the first item whose metadata break a limit, with why; nothing changes.
    pub fn register_many(
        &mut self,
        items: Vec<impl Into<Arc<OwnedRegistration>>>,
        now: impl Into<Now>,
    ) -> Result<(), (usize, InvalidInput)> {
        let now = self.input_time(now.into());
        let stamp = self.clock.tick(now.wall_ms);
        let ttl_ms = self.lease_ttl(now.wall_ms);
        let items: Vec<Arc<OwnedRegistration>> = items.into_iter().map(Into::into).collect();
        let writes = items.iter().map(|o| OwnedRegistration::clone(o)).collect();
        let applied = self.replica.register_many(writes, ttl_ms, stamp)?;
        for o in items {
            self.own(o);
        }
        self.renew_at = self.renew_at.min(now.mono_ms + ttl_ms / 2);
        self.local_delta(applied.delta, applied.changes, now);
        self.note_leases_shipped();
        Ok(())
    }

    /// Takes `o` as owned: kept alive, and written again if a peer's sweep removes it.
    pub(super) fn own(&mut self, reg: Arc<OwnedRegistration>) {
        let key = (reg.service.clone(), reg.provider.clone());
        self.overwrites_repaired.remove(&key);
        self.owned.insert(key, reg);
    }
}

#[cfg(test)]
mod tests {
    use roster_registry::{Endpoint, ProviderId, Replica, ServiceName, Status};

    use super::super::test_support::info;
    use super::super::{Config, Node, Now};
    use super::OwnedRegistration;

    /// A bulk load past the buffer's bytes at a node with no peer yet (a restart, before
    /// it connects) drops nothing: a peer that comes back resumes from the buffer, which
    /// must still hold all since the start (a first version trimmed it to the newest
    /// delta, and a restarted owner of 100,000 sent its peer a full state).
    #[test]
    fn with_no_peer_a_bulk_load_past_the_buffer_bytes_drops_nothing_from_it() {
        let now = Now {
            mono_ms: 1_000,
            wall_ms: 1_800_000_000_000,
        };
        let mut n = Node::new(
            info(1),
            Replica::new(info(1).id),
            Vec::<String>::new(),
            Config::default(),
            1,
            now,
        )
        .unwrap();
        let bulk = ServiceName::new("bulk").unwrap();
        let items: Vec<OwnedRegistration> = (0..30_000)
            .map(|i| OwnedRegistration {
                service: bulk.clone(),
                provider: ProviderId::new(&format!("b{i}")).unwrap(),
                endpoint: Endpoint::new("10.0.0.1", 80).unwrap(),
                meta: Default::default(),
                status: Status::passing(),
                since_ms: 1,
            })
            .collect();
        n.register_many(items, now).unwrap();
        assert!(n.buffer.over_bytes(), "the load is past the buffer's bytes");
        assert!(n.buffer.covers(0), "a delta since the start was dropped");
    }
}
