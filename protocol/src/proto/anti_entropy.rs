//! The anti-entropy exchange: every `digest_interval_ms` (jittered) a node compares the
//! hash of its context with one member drawn from the whole membership, not from its
//! links, so a change a tree or a partition kept from a part of the cluster is found
//! wherever it is (Serf's push-pull with a random member, Riak's and Corrosion's syncs).
//!
//! A member on a link gets the hash on it. One that is not is dialed for the exchange
//! alone, at most once per `sync_dial_interval_ms` (scaled up past 32 members as
//! memberlist scales its push-pull): such a connection carries no pushes, holds no
//! outbound slot, and is closed two gossip rounds after it opened (every new connection
//! opens with both sides' hashes; a difference starts the digest exchange at once). Other
//! rounds go to a random linked peer.

use std::collections::BTreeSet;

use rand::RngExt;
use roster_registry::ReplicaId;

use super::{ConnId, DialTarget, Message, Node, Now, Output};

/// The gossip rounds a connection dialed for an exchange stays open.
const SYNC_ROUNDS: u64 = 2;

/// Members up to this many keep the configured spacing of exchange dials; past it, the
/// spacing grows by one interval per doubling (memberlist's push-pull scale).
const SYNC_SCALE_FROM: usize = 32;

impl Node {
    /// The exchange's round: the hash to a random member.
    pub(super) fn anti_entropy(&mut self, now: Now) {
        let members = self.live_others(now.wall_ms);
        let connected: BTreeSet<ReplicaId> = self.linked_peers();
        let pick = (!members.is_empty()).then(|| members[self.rng.random_range(0..members.len())]);
        let pick = pick.map(|id| (id, self.member_contact(id, now.wall_ms).map(|(url, _)| url)));
        let hash = Message::digest_hash(self.replica.context(), None);
        match pick {
            Some((id, _)) if connected.contains(&id) => self.send_to_peer(id, hash, now),
            Some((id, Some(url))) if self.may_dial_for_sync(id, members.len(), now) => {
                self.sync_dial_at = Some(now.mono_ms);
                self.dial_for_exchange(id, url, now);
            }
            _ => {
                if let Some(p) = self.random_connected(1, None).pop() {
                    self.send_to_peer(p, hash, now);
                }
            }
        }
    }

    /// Whether `id` (a member with no link) may be dialed for an exchange now.
    fn may_dial_for_sync(&self, id: ReplicaId, members: usize, now: Now) -> bool {
        let scale = members
            .max(1)
            .div_ceil(SYNC_SCALE_FROM)
            .next_power_of_two()
            .trailing_zeros() as u64
            + 1;
        let spacing = self.cfg.sync_dial_interval_ms.saturating_mul(scale);
        let spaced = self.sync_dial_at.is_none_or(|t| now.mono_ms >= t + spacing);
        spaced && self.may_dial_for_exchange(id, now)
    }

    /// Whether `id` may be dialed for an exchange, spacing aside: dials are on, no guard
    /// holds them, and no dial to it is in flight or backing off.
    pub(super) fn may_dial_for_exchange(&self, id: ReplicaId, now: Now) -> bool {
        self.may_dial_for_exchange_past_backoff(id) && self.backoff_over(id, now)
    }

    /// Whether `id` may be dialed for an exchange, its dial backoff aside: dials are on,
    /// no guard holds them, and no dial to it is in flight.
    pub(super) fn may_dial_for_exchange_past_backoff(&self, id: ReplicaId) -> bool {
        let idle = self.peers.get(&id).is_none_or(|p| p.dialing.is_none());
        self.cfg.dial && self.cfg.sync_dial_interval_ms > 0 && !self.guarded && !self.stopping && idle
    }

    /// Whether the dial backoff toward `id` is over.
    pub(super) fn backoff_over(&self, id: ReplicaId, now: Now) -> bool {
        self.peers.get(&id).is_none_or(|p| p.backoff.ready(now.mono_ms))
    }

    /// Dials member `id` at `url` for one exchange: the connection carries no pushes and
    /// closes after `SYNC_ROUNDS` gossip rounds.
    pub(super) fn dial_for_exchange(&mut self, id: ReplicaId, url: String, now: Now) {
        let p = self.peers.entry(id).or_default();
        p.dialing = Some(now.mono_ms);
        p.sync_dial = true;
        self.counters.dials += 1;
        self.counters.exchange_dials += 1;
        self.outputs.push_back(Output::Dial(DialTarget::Peer { id, url }));
    }

    /// Peers with a connection that carries pushes (not one dialed for an exchange).
    pub(super) fn linked_peers(&self) -> BTreeSet<ReplicaId> {
        self.conns.values().filter(|c| !c.sync).map(|c| c.peer).collect()
    }

    /// Closes the connections dialed for an exchange once they had their rounds.
    pub(super) fn close_synced(&mut self, now: Now) {
        let done = self.cfg.gossip_interval_ms * SYNC_ROUNDS;
        let old: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| c.sync && c.opened_at + done <= now.mono_ms)
            .map(|(id, _)| *id)
            .collect();
        for conn in old {
            self.close(conn, "anti-entropy exchange done", now);
        }
    }
}
