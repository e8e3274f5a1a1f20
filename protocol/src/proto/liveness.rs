//! Liveness without flooding: a node found dead is written dead, so its lease can be long.
//!
//! A node's connections are its failure detector. When one closes without a goodbye (the
//! peer's process died: its kernel closes its sockets at once) or goes silent (the driver
//! closes a link on which nothing arrived for a few seconds), the node *suspects* that
//! peer, unless it is still connected to it another way. A suspicion ends as soon as the
//! peer shows it is alive: a new connection to it, a message from it, or any new write of
//! it (a restarted node writes its membership again before it dials). Otherwise, after
//! `suspect_after_ms` (longer than a quick restart takes; at once for a silent link, which
//! has already been silent that long), the node asks a few connected peers whether they
//! are connected to it (SWIM's indirect probe, over the links already open). If none is
//! within `probe_timeout_ms`, it writes the peer dead: an observed removal of the lease
//! dots it saw, so the peer's registrations vanish from every read at once and sweeps
//! collect them.
//!
//! A live node written dead (a partition, a lost probe) sees its own lease removed and
//! renews it at once: the refutation. Its registrations come back as sweeps had not yet
//! collected them, or are written again by their owner, which repairs what a peer removed.
//! The lease stays as the backstop for a node no detector could judge (one with no
//! connection at all).

use roster_registry::{Dot, ReplicaId};

use super::{Node, Now};
use crate::message::Message;

/// How many connected peers a suspicion asks.
const PROBE_HELPERS: usize = 3;

/// A peer this node lost and has not yet heard from again.
#[derive(Debug, Clone)]
pub(super) struct Suspicion {
    /// The greatest counter of the peer in our context when the suspicion began: any
    /// greater one is a write it made since, so it lives.
    seen_counter: u64,
    /// Its lease dots when the suspicion began: what a death removes.
    lease: Vec<Dot>,
    /// Its URL as a member, to dial it again after it is written dead.
    url: String,
    /// When to ask the helpers (monotonic ms).
    probe_at: u64,
    /// When to decide, once the helpers were asked.
    decide_at: Option<u64>,
    /// Helpers that answered they are connected to it.
    alive: u32,
}

impl Node {
    /// Suspects `peer`, lost at `now`: at once (`silent`: its link was already silent for
    /// the driver's dead-link time) or after `suspect_after_ms`. Nothing when it is not a
    /// live member, we are still connected to it, or we are stopping.
    pub(super) fn suspect(&mut self, peer: ReplicaId, silent: bool, now: Now) {
        if self.stopping || self.suspects.contains_key(&peer) || self.conns.values().any(|c| c.peer == peer) {
            return;
        }
        let Some((_, url, _)) = self
            .members(now.wall_ms)
            .into_iter()
            .find(|(id, _, _)| *id == peer)
        else {
            return;
        };
        let wait = if silent { 0 } else { self.cfg.suspect_after_ms };
        self.suspects.insert(
            peer,
            Suspicion {
                seen_counter: self.replica.context().max_counter(peer),
                lease: self.replica.lease_dots(peer),
                url,
                probe_at: now.mono_ms + wait,
                decide_at: None,
                alive: 0,
            },
        );
    }

    /// `peer` showed it is alive (it connected, or spoke).
    pub(super) fn heard_from(&mut self, peer: ReplicaId) {
        self.suspects.remove(&peer);
        if let Some(p) = self.peers.get_mut(&peer) {
            p.written_dead_at = None;
        }
    }

    /// Ends the suspicions of peers that wrote something since they began.
    pub(super) fn clear_suspects_that_wrote(&mut self) {
        if self.suspects.is_empty() {
            return;
        }
        let ctx = self.replica.context();
        self.suspects
            .retain(|peer, s| ctx.max_counter(*peer) <= s.seen_counter);
    }

    /// Peers we wrote dead lately, with their URLs: still dialed like members (see
    /// `Peer::written_dead_at`).
    pub(super) fn lately_written_dead(&self, now: Now) -> Vec<(ReplicaId, String)> {
        let window = self.cfg.member_lease_ttl_ms;
        self.peers
            .iter()
            .filter(|(_, p)| {
                p.written_dead_at
                    .is_some_and(|t| now.mono_ms < t.saturating_add(window))
            })
            .filter_map(|(id, _)| Some((*id, self.url_of(*id, now.wall_ms)?)))
            .collect()
    }

    /// The earliest suspicion deadline, if any.
    pub(super) fn next_suspicion_deadline(&self) -> Option<u64> {
        self.suspects
            .values()
            .map(|s| s.decide_at.unwrap_or(s.probe_at))
            .min()
    }

    /// Asks the helpers of suspicions that are due, and decides those whose answers had
    /// their time.
    pub(super) fn run_suspicions(&mut self, now: Now) {
        let due: Vec<ReplicaId> = self
            .suspects
            .iter()
            .filter(|(_, s)| s.decide_at.unwrap_or(s.probe_at) <= now.mono_ms)
            .map(|(p, _)| *p)
            .collect();
        for peer in due {
            let asked = self.suspects.get(&peer).is_some_and(|s| s.decide_at.is_some());
            if asked {
                self.decide(peer, now);
            } else {
                self.probe(peer, now);
            }
        }
    }

    fn probe(&mut self, peer: ReplicaId, now: Now) {
        let helpers = self.random_connected(PROBE_HELPERS, Some(peer));
        for h in &helpers {
            self.send_to_peer(*h, Message::ProbeReq { node: peer }, now);
        }
        if let Some(s) = self.suspects.get_mut(&peer) {
            // With nobody to ask, decide now on what we saw.
            s.decide_at = Some(match helpers.is_empty() {
                true => now.mono_ms,
                false => now.mono_ms + self.cfg.probe_timeout_ms,
            });
        }
        if helpers.is_empty() {
            self.decide(peer, now);
        }
    }

    fn decide(&mut self, peer: ReplicaId, now: Now) {
        let Some(s) = self.suspects.remove(&peer) else {
            return;
        };
        if s.alive > 0 || self.stopping {
            // Others still reach it: only our link to it broke. Our dials go on.
            return;
        }
        let before = self.replica.registrations();
        if let Some(applied) = self.replica.write_dead(peer, &s.lease, now.wall_ms) {
            self.counters.deaths_written += 1;
            self.peers.entry(peer).or_default().written_dead_at = Some(now.mono_ms);
            self.note_departures(&before, &applied.changes, now);
            // Dialed again where it was last reached, whatever its membership said.
            let c = self.contacts.lost.entry(peer).or_default();
            c.url = Some(s.url);
            c.last_seen_ms = now.wall_ms;
            self.local_delta(applied.delta, applied.changes, now);
            self.test_zone_of(peer, now);
        }
    }

    /// A peer asks whether we are connected to `node`.
    pub(super) fn on_probe_req(&mut self, from: ReplicaId, node: ReplicaId, now: Now) {
        let connected = self.conns.values().any(|c| c.peer == node);
        self.send_to_peer(from, Message::ProbeAck { node, connected }, now);
    }

    /// A helper answered.
    pub(super) fn on_probe_ack(&mut self, node: ReplicaId, connected: bool) {
        if let Some(s) = self.suspects.get_mut(&node) {
            if connected {
                s.alive += 1;
            }
        }
    }

    /// A peer wrote this node dead (or a sweep took its lease): renew at once, so it is
    /// back everywhere within a push. Its owned registrations that sweeps removed are
    /// written again by the owner repair.
    pub(super) fn refute_death(&mut self, now: Now) {
        if self.stopping || self.owned.is_empty() || self.replica.lease_of(self.me.id).is_some() {
            return;
        }
        self.counters.deaths_refuted += 1;
        self.renew(now);
    }
}
