//! What an operator may write over the owner checks: `force-leave`, a node written dead
//! for every replica now, as the failure detector writes one once the peers it asks cannot
//! reach it (see `liveness`); and the removal of an instance whatever node owns it.

use roster_registry::{ProviderId, ReplicaId, ServiceName};

use super::{Node, Now};

/// What [`Node::force_dead`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForcedDeath {
    /// Written dead: its registrations are gone from every read, here now and on every
    /// replica the delta reaches.
    Written,
    /// Refused: this node, or a node connected to it, which answers.
    Answers,
    /// Nothing to write: no lease of it is stored (not a member, or gone already).
    Unknown,
}

impl Node {
    /// Writes `peer` dead now: removes every dot of its lease, so its registrations leave
    /// every read and a later sweep collects them. A node that is in fact alive renews its
    /// lease when it hears of it (a refutation) and is back, so refusing a connected node
    /// only spares a pointless round.
    pub fn force_dead(&mut self, peer: ReplicaId, now: impl Into<Now>) -> ForcedDeath {
        let now = self.input_time(now.into());
        if peer == self.me.id || self.conns.values().any(|c| c.peer == peer) {
            return ForcedDeath::Answers;
        }
        let seen = self.replica.lease_dots(peer);
        let before = self.replica.registrations();
        let Some(applied) = self.replica.write_dead(peer, &seen, now.wall_ms) else {
            return ForcedDeath::Unknown;
        };
        self.note_departures(&before, &applied.changes, now);
        self.counters.deaths_written += 1;
        let p = self.peers.entry(peer).or_default();
        p.written_dead_at = Some(now.mono_ms);
        self.suspects.remove(&peer);
        self.local_delta(applied.delta, applied.changes, now);
        ForcedDeath::Written
    }
}

impl Node {
    /// Removes an instance whatever node wrote it (an operator's removal of a stranded
    /// instance), counted in [`Counters::operator_removals`](super::Counters). Its owner,
    /// if alive, writes it again (its repair of overwrites). Returns whether there was one.
    pub fn remove_as_operator(
        &mut self,
        service: &ServiceName,
        provider: &ProviderId,
        now: impl Into<Now>,
    ) -> bool {
        if self.owned.contains_key(&(service.clone(), provider.clone())) {
            return self.deregister(service, provider, now);
        }
        let now = self.input_time(now.into());
        let before = self.replica.registrations();
        let Some(applied) = self
            .replica
            .deregister(service.clone(), provider.clone(), now.wall_ms)
        else {
            return false;
        };
        self.note_departures(&before, &applied.changes, now);
        self.counters.operator_removals += 1;
        self.local_delta(applied.delta, applied.changes, now);
        true
    }
}
