//! Writes in bulk: many owned registrations in one delta (one push, one snapshot).

use roster_registry::InvalidInput;

use super::{Node, Now, Owned, OwnedRegistration};

impl Node {
    /// Registers (or updates) many instances this node owns, in one delta: as
    /// [`Node::register`] for each, at the cost of one.
    ///
    /// # Errors
    /// The index of the first item whose metadata break a limit, with why; nothing changes.
    pub fn register_many(
        &mut self,
        items: Vec<OwnedRegistration>,
        now: impl Into<Now>,
    ) -> Result<(), (usize, InvalidInput)> {
        let now = self.time.input(now.into());
        let stamp = self.clock.tick(now.wall_ms);
        let ttl_ms = self.lease_ttl(now.wall_ms);
        let applied = self.replica.register_many(items.clone(), ttl_ms, stamp)?;
        for o in items {
            self.own(o);
        }
        self.renew_at = self.renew_at.min(now.mono_ms + ttl_ms / 2);
        self.local_delta(applied.delta, applied.changes, now);
        self.note_leases_shipped();
        Ok(())
    }

    /// Takes `o` as owned: kept alive, and written again if a peer's sweep removes it.
    pub(super) fn own(&mut self, o: OwnedRegistration) {
        let owned = Owned {
            endpoint: o.endpoint,
            meta: o.meta,
            status: o.status,
            since_ms: o.since_ms,
            overwrite_repaired_at: None,
        };
        self.owned.insert((o.service, o.provider), owned);
    }
}
