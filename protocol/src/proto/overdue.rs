//! Pushes a peer has not acknowledged in time: other members are tried at once.
//!
//! A peer acknowledges what it is sent within `ack_delay_ms` (an acknowledgement waits to
//! cover a burst). A push still unacknowledged past that and a margin for the round trip
//! went into a link that may be dead without a sign: across a silent partition (no FIN,
//! no RST) only the keepalive finds it, after `dead_after` (about 8 s). Meanwhile the
//! change goes nowhere past that link, so a node whose links all crossed the cut passed
//! its writes to no one on its own side, not even to a node there it had no link to.
//!
//! Where acknowledgements come slower (long round trips, peers busy joining), a push is
//! given half as long again as the slowest acknowledgement lately, so a slow link is not
//! taken for a dead one.
//!
//! So an overdue push starts exchanges with members the node has no link to, as the
//! anti-entropy round does (`anti_entropy.rs`), without waiting for the round: a few at
//! once, since a dial across a silent cut hangs, and another for each dial that fails,
//! while the push stays overdue. Each new connection opens with both sides' hashes, and a
//! difference starts the digest exchange at once. At most one such round per
//! `resend_after_ms` while pushes stay overdue.

use std::collections::BTreeSet;

use rand::seq::SliceRandom;
use rand::RngExt;
use roster_registry::ReplicaId;

use super::{Message, Node, Now};

/// Members dialed at once when a push becomes overdue: a dial across a silent cut hangs
/// for the handshake timeout (5 s), so tries cannot wait for failures; with two, a node
/// of a side of two among nine found the other in 0.6 to 5.6 s in the simulator (its
/// other members across the cut were dialed first, or in its stead), with eight in 0.6
/// to 1.6 s. The first exchange that opens ends the dialing (see `try_others`).
const TRIES: usize = 8;

/// The margin past `ack_delay_ms` for the acknowledgement's round trip and a busy peer.
const ACK_MARGIN_MS: u64 = 250;

/// The node's watch over unacknowledged pushes.
#[derive(Debug, Default)]
pub(super) struct Overdue {
    /// When the next push may become overdue (monotonic ms).
    pub(super) check_at: Option<u64>,
    /// When the next round of tries may start.
    round_at: Option<u64>,
    /// The members tried in this round.
    tried: BTreeSet<ReplicaId>,
    /// The slowest acknowledgement lately (ms from the push it answered; the slowest
    /// decays by a 32nd at each acknowledgement).
    took_ms: u64,
}

impl Overdue {
    /// An acknowledgement took `ms`.
    pub(super) fn took(&mut self, ms: u64) {
        self.took_ms = ms.max(self.took_ms - self.took_ms / 32);
    }
}

impl Node {
    /// A push to `peer` awaits its acknowledgement: when none was awaited, it is due within
    /// `ack_wait`.
    pub(super) fn await_ack(&mut self, peer: ReplicaId, now: Now) {
        let wait = self.ack_wait();
        if let Some(p) = self.peers.get_mut(&peer) {
            if p.unacked_since.is_none() {
                p.unacked_since = Some(now.mono_ms);
                let deadline = now.mono_ms + wait;
                let at = self.overdue.check_at.map_or(deadline, |t| t.min(deadline));
                self.overdue.check_at = Some(at);
            }
        }
    }

    /// How long a push may wait for its acknowledgement.
    fn ack_wait(&self) -> u64 {
        let took = self.overdue.took_ms;
        (self.cfg.ack_delay_ms + ACK_MARGIN_MS).max(took + took / 2)
    }

    /// The linked peers with a push overdue at `now`, and when the next one falls due.
    fn overdue_peers(&self, now: Now) -> (BTreeSet<ReplicaId>, Option<u64>) {
        let mut overdue = BTreeSet::new();
        let mut next: Option<u64> = None;
        for peer in self.linked_peers() {
            let awaited = self.peers.get(&peer).filter(|p| p.in_flight());
            let Some(since) = awaited.and_then(|p| p.unacked_since) else {
                continue;
            };
            let wait = self.ack_wait();
            if since + wait <= now.mono_ms {
                overdue.insert(peer);
            } else {
                next = Some(next.map_or(since + wait, |n| n.min(since + wait)));
            }
        }
        (overdue, next)
    }

    /// The timer: a push overdue starts a round of tries (at most one per
    /// `resend_after_ms`).
    pub(super) fn check_overdue(&mut self, now: Now) {
        let (overdue, mut next) = self.overdue_peers(now);
        if overdue.is_empty() {
            self.overdue.tried.clear();
        } else {
            if self.overdue.round_at.is_none_or(|t| now.mono_ms >= t) {
                self.overdue.round_at = Some(now.mono_ms + self.cfg.resend_after_ms);
                self.overdue.tried.clear();
                self.counters.overdue_rounds += 1;
                self.try_others(&overdue, TRIES, now);
            }
            next = next.min(self.overdue.round_at).or(self.overdue.round_at);
        }
        self.overdue.check_at = next;
    }

    /// A dial failed: if it was one of this round's tries and a push is still overdue,
    /// another member is tried.
    pub(super) fn tried_dial_failed(&mut self, id: ReplicaId, now: Now) {
        if !self.overdue.tried.contains(&id) {
            return;
        }
        let (overdue, _) = self.overdue_peers(now);
        if !overdue.is_empty() {
            self.try_others(&overdue, 1, now);
        }
    }

    /// Dials up to `n` random members with no connection, not tried in this round, for
    /// an exchange, whether their dial backoff is over or not (earlier faults leave long
    /// backoffs toward the very members a side of a partition has left, and a round is
    /// bounded already; tried first, the members ready were most often those across the
    /// cut); with none to dial, sends the hash to a linked peer whose pushes are
    /// acknowledged. Nothing while an exchange is open: it carries what this node holds
    /// to a member it reached, which passes it on.
    fn try_others(&mut self, overdue: &BTreeSet<ReplicaId>, n: usize, now: Now) {
        if self.conns.values().any(|c| c.sync) {
            return;
        }
        let linked = self.linked_peers();
        let mut members: Vec<ReplicaId> = (self.live_others(now.wall_ms).iter())
            .copied()
            .filter(|id| !linked.contains(id) && !self.overdue.tried.contains(id))
            .filter(|&id| self.may_dial_for_exchange_past_backoff(id))
            .collect();
        members.shuffle(&mut self.rng);
        let mut dialed = 0;
        for id in members {
            if dialed == n {
                break;
            }
            if let Some((url, _)) = self.member_contact(id, now.wall_ms) {
                self.overdue.tried.insert(id);
                self.dial_for_exchange(id, url, now);
                dialed += 1;
            }
        }
        if dialed == 0 {
            let acking: Vec<ReplicaId> = linked.difference(overdue).copied().collect();
            if !acking.is_empty() {
                let peer = acking[self.rng.random_range(0..acking.len())];
                let hash = Message::digest_hash(self.replica.context(), None);
                self.send_to_peer(peer, hash, now);
            }
        }
    }
}
