//! States that differ where contexts do not: a removal one side never joined.
//!
//! A removal mints no dot, so a digest cannot tell a peer that missed one. A node killed
//! after it acknowledged deltas and before it saved them comes back without them, and its
//! peers, trusting the acknowledgement, send it only what came after: a write it lost
//! reaches it again as a dot in the context of a later delta, not as the delta that wrote
//! over the older value it still holds, so it keeps that value for good with a context
//! equal to every peer's (the fault soak's finding 4: a deregistered instance shown with
//! an older value for 100 s). Digests then match and nothing else would repair it.
//!
//! The state hash a new connection opens with tells it: contexts equal, hashes not. Each
//! side then sends the other its state elided against the other's digest, whose join
//! visits every key and drops what the sender removed; a digest that asks, with the
//! state's hash, gets the same from the other side. And a peer brought up to date from
//! its acknowledgement on a connection is asked for its state's hash once more when it
//! acknowledges that catch-up, so a removal it lost is found then too: once a
//! connection, so two nodes under churn do not trade hashes for good.

use roster_registry::{CausalContext, ReplicaId};

use super::{ConnId, Node, Now};
use crate::message::Message;

impl Node {
    /// `peer`'s digest (`theirs`, with its state's `hash`) names what ours names, but the
    /// states differ: sends it our state elided against its digest, and, unless this is an
    /// answer, asks for its own the same way.
    pub(super) fn on_diverged(
        &mut self,
        conn: ConnId,
        peer: ReplicaId,
        theirs: &CausalContext,
        reply: bool,
        now: Now,
    ) {
        self.counters.diverged_states += 1;
        if !self.full_in_flight(peer, now) && !self.guarded {
            self.send_full(peer, theirs, now);
        }
        if !reply {
            let state = self.state_hash();
            self.send(
                conn,
                Message::digest(self.replica.context(), true, Some(state)),
                now,
            );
        }
    }

    /// Notes that `peer` is being brought up to date from the buffer after its digest
    /// showed what it lacked: its state is checked when it acknowledges (once a connection).
    pub(super) fn check_state_after_catch_up(&mut self, peer: ReplicaId) {
        let head = self.buffer.head();
        if let Some(p) = self.peers.get_mut(&peer).filter(|p| !p.state_checked) {
            p.state_checked = true;
            p.check_state_at = Some(head);
        }
    }

    /// `peer` acknowledged up to `seq`: if that covers a catch-up whose state is to be
    /// checked, sends it our hashes with the state's (it answers with its digest if they
    /// differ, see `on_digest_hash`).
    pub(super) fn check_state_on_ack(&mut self, peer: ReplicaId, seq: u64, now: Now) {
        let due = self
            .peers
            .get(&peer)
            .and_then(|p| p.check_state_at)
            .is_some_and(|at| seq >= at);
        if !due {
            return;
        }
        if let Some(p) = self.peers.get_mut(&peer) {
            p.check_state_at = None;
        }
        let state = self.state_hash();
        let hashes = Message::digest_hash(self.replica.context(), Some(state));
        self.send_to_peer(peer, hashes, now);
    }
}
