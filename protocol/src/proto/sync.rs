//! Moving deltas: pushes, gossip rounds, full states, and what a received delta taught.

use std::collections::BTreeSet;

use rand::RngExt;
use roster_registry::{CausalContext, Refusal, ReplicaId, State};

use super::{ConnId, Node, Now, Output, MAX_FORWARD_DOTS};
use crate::buffer::Recipient;
use crate::message::{self, Envelope, Message, Tagged, MAX_DELTA_ENTRIES, MAX_TREE_IDS};
use roster_registry::codec::encode_state;

/// How often a resend's wait may double: 2^5 times `resend_after_ms`, about a minute at
/// the default, so a peer that stopped acknowledging is still tried, rarely.
const MAX_RESEND_DOUBLINGS: u32 = 5;

impl Node {
    /// Up to `n` distinct random peers with an open connection, other than `except`.
    pub(super) fn random_connected(&mut self, n: usize, except: Option<ReplicaId>) -> Vec<ReplicaId> {
        let mut peers: Vec<ReplicaId> = self
            .linked_peers()
            .into_iter()
            .filter(|p| Some(*p) != except)
            .collect();
        let mut chosen = Vec::new();
        while chosen.len() < n && !peers.is_empty() {
            let i = self.rng.random_range(0..peers.len());
            chosen.push(peers.swap_remove(i));
        }
        chosen
    }

    /// Pushes new deltas to every connected peer that lacks them.
    pub(super) fn push(&mut self, now: Now) {
        // Every connected peer that lacks it (the connections are few: about twice the
        // fanout), so a change floods the connection graph in milliseconds; a peer that
        // already has it forwards nothing, so the flood stops by itself.
        for p in self.linked_peers() {
            self.sync_peer(p, false, now);
        }
    }

    pub(super) fn gossip(&mut self, now: Now) {
        for p in self.random_connected(self.cfg.fanout, None) {
            self.sync_peer(p, true, now);
        }
    }

    /// Sends `peer` what it has not acknowledged: from the buffer when it covers the peer's
    /// acknowledgement, else (on a gossip round) the state elided against its digest.
    pub(super) fn sync_peer(&mut self, peer: ReplicaId, repair: bool, now: Now) {
        let head = self.buffer.head();
        // The peer's digest (a context naming every node) is cloned only where it is used:
        // a clone per push would cost O(nodes) per message.
        let (acked, sent, full_sent_at, resend_at) = match self.peers.get(&peer) {
            Some(p) => (p.acked, p.sent, p.full_sent_at, p.resend_at),
            None => return,
        };
        // A push sends what came after the last send; a repair round what came after the
        // last acknowledgement (what was sent may have been lost), once it has waited
        // `resend_after_ms` for that acknowledgement, twice as long after each resend.
        // Acknowledgements wait `ack_delay_ms` to cover many deltas, so a round that
        // resent whatever was not acknowledged yet sent a second copy of it; and resent
        // every round, a bulk load a peer takes seconds to join queued copies faster than
        // it joined them, and it stopped answering (the acknowledgements waited behind
        // the copies).
        let in_flight = matches!((acked, sent), (Some(a), Some(s)) if s > a);
        let waited = resend_at.is_none_or(|t| now.mono_ms >= t);
        let from = if repair && waited { acked } else { acked.max(sent) };
        if repair && in_flight && waited {
            self.resent(peer, now);
        }
        match from {
            Some(a) if a >= head => {}
            Some(a) if self.buffer.covers(a) => self.send_from_buffer(peer, a, acked, repair, now),
            _ if repair => {
                let paused = full_sent_at.is_some_and(|t| now.mono_ms < t + self.cfg.full_sync_pause_ms);
                let digest = self.peers.get(&peer).and_then(|p| p.digest.clone());
                match digest {
                    // Under the crash-loop guard, no full state unless the peer asks.
                    Some(d) if self.adopt_base(peer, &d) => self.sync_peer(peer, true, now),
                    _ if paused || self.guarded => {}
                    Some(digest) => self.send_full(peer, &digest, now),
                    None => self.send_digest(peer, now),
                }
            }
            _ => {}
        }
    }

    /// Sends `peer` the buffered deltas after `a` (its acknowledgement `acked`, or the last
    /// send), or the state when they are more than a delta may hold. On the trees, what it
    /// is held back from (off those roots' trees here) is announced instead; `repair` says
    /// the deltas may have been sent before.
    fn send_from_buffer(&mut self, peer: ReplicaId, a: u64, acked: Option<u64>, repair: bool, now: Now) {
        let head = self.buffer.head();
        let held = if self.on_trees() {
            self.trees.held_for(peer)
        } else {
            None
        };
        let to = Recipient { peer, held };
        // At most what a peer takes in one delta (a bulk load a new peer missed can
        // be more): the rest in the next push, numbered so its acknowledgement says how
        // far it got. Counted before joining anything: joining 100,000 entries per round
        // to find them too many kept an agent from answering for 30 s, and sending the
        // whole state instead, which the peer took seconds to join and acknowledge, made
        // it fall further behind.
        let Some(until) = self.buffer.fits_until(a, to, MAX_DELTA_ENTRIES) else {
            // One buffered delta alone holds more: the state, elided.
            self.send_full_unless_in_flight(peer, now);
            return;
        };
        let messages = self.buffered_messages(peer, a, until, to, repair);
        if self.announcement_waits(peer, &messages, now) {
            return;
        }
        if messages.is_empty() && acked == Some(a) {
            // Everything up to there was learnt from the peer itself.
            if let Some(p) = self.peers.get_mut(&peer) {
                p.acked = Some(until);
            }
        }
        let messages_empty = messages.is_empty();
        let acknowledged = messages.iter().any(Message::is_acknowledged);
        for message in messages {
            self.counters.changes_announced += match &message {
                Message::Push { announced, .. } => announced.len() as u64,
                Message::IHave { ids, .. } => ids.len() as u64,
                _ => 0,
            };
            self.send_to_peer(peer, message, now);
        }
        let wait = self.cfg.resend_after_ms;
        let numbered = !messages_empty;
        let mut awaited = false;
        if let Some(p) = self.peers.get_mut(&peer) {
            if !p.in_flight() {
                // Whatever was awaited was acknowledged, one way or another.
                p.unacked_since = None;
            }
            p.sent = Some(until);
            if numbered {
                p.numbered = Some(until);
            }
            if p.acked.is_some_and(|a| a < until) {
                p.resend_at.get_or_insert(now.mono_ms + wait);
            }
            awaited = acknowledged && p.acked.is_none_or(|a| a < until);
        }
        if awaited {
            self.await_ack(peer, now);
        }
        if until < head {
            self.schedule_push(now);
        }
    }

    /// The messages carrying the buffered deltas after `a` up to `until` to `to`, and on
    /// the trees announcing those held back from it: inside the push when one goes, so
    /// they share its fate; alone, and acknowledged like a delta, when none does. A
    /// repair round announces again what it resends (a lost announcement would leave a
    /// hole no graft mends); a push announces only what was not announced yet.
    fn buffered_messages(
        &self,
        peer: ReplicaId,
        a: u64,
        until: u64,
        to: Recipient<'_>,
        repair: bool,
    ) -> Vec<Message> {
        // Since the start of this process, to a peer whose digest says it has most
        // of it already: only what it lacks, trimmed delta by delta.
        let seen = self
            .peers
            .get(&peer)
            .filter(|p| p.adopted)
            .and_then(|p| p.digest.as_deref());
        let bytes = match seen {
            // One delta, untrimmed, goes as it was buffered.
            None => self.buffer.single_between(a, until, to).map(<[u8]>::to_vec),
            Some(_) => None,
        }
        .or_else(|| {
            self.buffer
                .between_for(a, until, to, seen)
                .map(|delta| encode_state(&delta))
        });
        if !self.on_trees() {
            return bytes
                .map(|b| Message::encoded_delta(until, &b))
                .into_iter()
                .collect();
        }
        let from = match repair {
            true => a,
            false => a.max(self.peers.get(&peer).and_then(|p| p.sent).unwrap_or(a)),
        };
        let announce = self.buffer.tags_between(from, until, to, true);
        if announce.len() > MAX_TREE_IDS {
            // More than one announcement may name: push it all instead.
            return self.buffered_messages(peer, a, until, Recipient { held: None, ..to }, repair);
        }
        let ids = self.buffer.tags_between(a, until, to, false);
        // A catch-up trimmed by the peer's digest (a restart's) or one naming more changes
        // than a push may goes as a plain delta: its names would outweigh what it carries
        // (a restart that missed 10 changes moved 27 KB of them for a 53 KB registry).
        let plain = ids.is_empty() || seen.is_some() || ids.len() > MAX_TREE_IDS;
        match (bytes, plain) {
            (Some(delta), false) => vec![Message::Push {
                seq: Some(until),
                delta,
                ids,
                announced: announce,
                resend: repair,
            }],
            (Some(delta), true) => {
                let mut out = vec![Message::encoded_delta(until, &delta)];
                if !announce.is_empty() {
                    out.push(Message::IHave {
                        seq: None,
                        ids: announce,
                    });
                }
                out
            }
            (None, _) if !announce.is_empty() => vec![Message::IHave {
                seq: Some(until),
                ids: announce,
            }],
            (None, _) => Vec::new(),
        }
    }

    /// Whether `messages` are an announcement alone that must wait: one goes to a peer at
    /// most every `announce_spacing_ms`, so under churn it names many changes, not one
    /// (with its acknowledgement, one per push round and link cost about as many packets
    /// as the flood's copies). Nothing is marked sent, and the announcement timer is set
    /// for when it may go.
    fn announcement_waits(&mut self, peer: ReplicaId, messages: &[Message], now: Now) -> bool {
        let alone = matches!(messages, [Message::IHave { seq: Some(_), .. }]);
        let spacing = self.cfg.announce_spacing_ms;
        let last = self.peers.get(&peer).and_then(|p| p.announced_at);
        match last
            .map(|t| t + spacing)
            .filter(|&due| alone && now.mono_ms < due)
        {
            Some(due) => {
                // Its own timer: a push's would spend the pacing meant for deltas.
                self.announce_at = Some(self.announce_at.map_or(due, |t| t.min(due)));
                true
            }
            None => {
                if let Some(p) = self.peers.get_mut(&peer).filter(|_| alone) {
                    p.announced_at = Some(now.mono_ms);
                }
                false
            }
        }
    }

    /// A repair round sends `peer` again what it has not acknowledged: the next resend
    /// waits twice as long, up to 32 times `resend_after_ms` (a stuck peer is still tried about every minute).
    fn resent(&mut self, peer: ReplicaId, now: Now) {
        let wait = self.cfg.resend_after_ms;
        if let Some(p) = self.peers.get_mut(&peer) {
            p.resends = p.resends.saturating_add(1);
            p.resend_at = Some(now.mono_ms + (wait << p.resends.min(MAX_RESEND_DOUBLINGS)));
        }
    }

    /// `peer` acknowledged our delta `seq`.
    pub(super) fn on_ack(&mut self, peer: ReplicaId, seq: u64, now: Now) {
        let wait = self.cfg.resend_after_ms;
        let p = self.peers.entry(peer).or_default();
        if p.acked.is_none_or(|a| a < seq) {
            // What was sent after the last numbered message carried nothing for it: with
            // acknowledgements 1 s apart, left unacknowledged it was resent with the next
            // change (a second copy at a node in three).
            let covered = match p.numbered {
                Some(n) if n <= seq => p.sent.map_or(seq, |s| s.max(seq)),
                _ => seq,
            };
            p.acked = Some(covered);
            p.resends = 0;
            // What is still unacknowledged gets a fresh wait.
            p.resend_at = p.sent.filter(|&s| s > covered).map(|_| now.mono_ms + wait);
            if let Some(took) = p.ack_arrived(now.mono_ms) {
                self.overdue.took(took);
            }
        }
        p.full_sent_at = None;
        p.adopted = false;
        if p.resend_at.is_some() && p.unacked_since.is_none() {
            // What is still in flight is awaited afresh.
            self.await_ack(peer, now);
        }
        self.check_state_on_ack(peer, seq, now);
        self.trim_buffer();
    }

    /// Past the buffer's bytes, drops the oldest deltas that every peer still to be sent
    /// them holds: every connected one (those on connections for one exchange are pushed
    /// nothing), and every one that acknowledged some, connected or not (one that comes
    /// back resumes from its acknowledgement: a restart costs what it missed, in pieces).
    /// A delta dropped is one a peer back from a restart cannot be sent from the buffer
    /// (`adopt_base`), as one past the buffer's capacity.
    pub(super) fn trim_buffer(&mut self) {
        if !self.buffer.over_bytes() {
            return;
        }
        let acked = |p: ReplicaId| self.peers.get(&p).and_then(|p| p.acked);
        let connected = (self.conns.values())
            .filter(|c| !c.sync)
            .map(|c| (c.peer, acked(c.peer).unwrap_or(0)));
        let acknowledged = (self.peers.iter()).filter_map(|(&id, p)| Some((id, p.acked?)));
        let peers: Vec<(ReplicaId, u64)> = connected.chain(acknowledged).collect();
        // With no peer at all (a restart, before it connects), nothing is held anywhere
        // yet: the buffer is what a peer that resumes from our start is sent (`adopt_base`).
        if !peers.is_empty() {
            self.buffer.trim_held(&peers);
        }
    }

    /// The state elided against the peer's digest (all of it without one), unless one is
    /// on its way and not yet acknowledged, or the crash-loop guard holds.
    fn send_full_unless_in_flight(&mut self, peer: ReplicaId, now: Now) {
        if self.full_in_flight(peer, now) || self.guarded {
            return;
        }
        let digest = self
            .peers
            .get(&peer)
            .and_then(|p| p.digest.as_deref().cloned())
            .unwrap_or_default();
        self.send_full(peer, &digest, now);
    }

    pub(super) fn send_full(&mut self, peer: ReplicaId, digest: &CausalContext, now: Now) {
        let elided = self.replica.elide_for(digest);
        self.counters.full_syncs_sent += 1;
        let head = self.buffer.head();
        if let Some(p) = self.peers.get_mut(&peer) {
            p.full_sent_at = Some(now.mono_ms);
            p.sent = Some(head);
            p.numbered = Some(head);
        }
        self.send_to_peer(peer, Message::elided(head, &elided), now);
    }

    /// Sends on one of the peer's connections (the oldest).
    pub(super) fn send_to_peer(&mut self, peer: ReplicaId, message: Message, now: Now) {
        if let Some((&conn, _)) = self.conns.iter().find(|(_, c)| c.peer == peer) {
            self.send(conn, message, now);
        }
    }

    pub(super) fn send(&mut self, conn: ConnId, message: Message, now: Now) {
        let envelope = Envelope {
            sent_at: message.carries_state().then(|| self.clock.tick(now.wall_ms)),
            message,
        };
        self.counters.messages_sent += 1;
        self.counters.bytes_sent += envelope.encoded_len() as u64;
        self.outputs.push_back(Output::Send { conn, envelope });
    }

    /// Checks a state from a peer before it is joined (`Replica::admit`). A state that
    /// says untrue things about our own dots (forged ones, or a retirement of us) is
    /// answered at once with the truth, so peers that took it drop it.
    pub(super) fn admit(&mut self, state: &State, now: Now) -> Result<(), Refusal> {
        let refused = self.replica.admit(state, &self.bounds(now));
        if let Err(Refusal::OwnDotAhead { .. } | Refusal::RetiresReceiver(_)) = &refused {
            self.refute(state.context(), now);
        }
        refused
    }

    /// Answers a peer whose context claims dots of ours we never minted, or retires us
    /// over writes we hold: ships the truth about our dots (`Replica::refute`).
    pub(super) fn refute(&mut self, peer: &CausalContext, now: Now) {
        let jump = self.cfg.max_counter_jump;
        if let Some(applied) = self.replica.refute(peer, jump, now.wall_ms) {
            self.counters.forgeries_refuted += 1;
            self.local_delta(applied.delta, applied.changes, now);
        }
    }

    pub(super) fn apply(&mut self, from: ReplicaId, delta: State, now: Now) {
        self.apply_tagged(from, delta, Vec::new(), now);
    }

    /// [`Node::apply`] of a delta carrying the named changes (those new to us): what it
    /// taught is buffered under their names, to travel on on their trees.
    pub(super) fn apply_tagged(&mut self, from: ReplicaId, delta: State, tags: Vec<Tagged>, now: Now) {
        let before = self.replica.registrations();
        let (report, changes, learnt) = self
            .replica
            .apply_collecting(delta, now.wall_ms, MAX_FORWARD_DOTS);
        self.note_departures(&before, &changes, now);
        if report.changed() {
            self.counters.deltas_applied += 1;
            if report.left_out > 0 {
                // Dots a full state taught without their writes are not forwarded (they
                // name no key): the buffer no longer holds all this process learnt, and
                // the other connected peers are told the hash of our context: one that
                // differs sends its digest, and is sent what it lacks (left to the
                // exchange rounds, a peer lacked such a dot for minutes: seed
                // 1796004742916956014). A hash, not a digest: asking with digests, each
                // with the state's hash, cost a fifth of a join and a kill at 1,000
                // simulated nodes.
                self.base_valid = false;
                self.hash_to_linked_peers(from, now);
            }
            match learnt {
                // Forward only what it taught us, never the rest of what it carried.
                Some(delta) => {
                    self.buffer.push_tagged(Some(from), delta, tags);
                    self.trim_buffer();
                    self.schedule_push(now);
                }
                None => self.learnt_out_of_band(now),
            }
        } else if !tags.is_empty() {
            // New changes whose values came first unnamed (an exchange's catch-up names
            // nothing): their names go on along the trees, with nothing to carry. Without
            // them the copy that went on unnamed left our children unable to tell it
            // came, and each grafted it from an announcer.
            self.buffer.push_tagged(Some(from), State::new_delta(), tags);
            self.trim_buffer();
            self.schedule_push(now);
        }
        // What the join hid goes down first: a refutation's renewal brings our own back.
        self.emit_changes(changes, now);
        self.write_again_removed(&report.regs, now);
        if report.changed() {
            self.clear_suspects_that_wrote();
            self.refute_death(now);
        }
    }

    /// A full sync taught us things the buffer does not hold: peers' acknowledgements no
    /// longer mean they have everything we have, so ask each what it lacks.
    pub(super) fn learnt_out_of_band(&mut self, now: Now) {
        // The buffer no longer holds everything learnt since this process started.
        self.base_valid = false;
        for p in self.peers.values_mut() {
            p.acked = None;
        }
        let connected: BTreeSet<ReplicaId> = self.conns.values().map(|c| c.peer).collect();
        for peer in connected {
            self.send_digest(peer, now);
        }
    }

    /// Sends each connected peer but `except` the hash of our context.
    fn hash_to_linked_peers(&mut self, except: ReplicaId, now: Now) {
        let connected: BTreeSet<ReplicaId> = self.conns.values().map(|c| c.peer).collect();
        let hash = Message::digest_hash(self.replica.context(), None);
        for peer in connected.into_iter().filter(|p| *p != except) {
            self.send_to_peer(peer, hash.clone(), now);
        }
    }

    /// The hash of the replica's state that a new connection and a digest carry: computed
    /// again only once the state changed. It encodes the whole state, and a cluster
    /// starting at once opens connections by the thousand (9% of the work at 1,000
    /// simulated nodes).
    pub(super) fn state_hash(&mut self) -> [u8; 16] {
        let version = self.replica.version();
        match self.state_hash {
            Some((v, hash)) if v == version => hash,
            _ => {
                let hash = message::state_hash(self.replica.state());
                self.state_hash = Some((version, hash));
                hash
            }
        }
    }

    /// A peer whose state hash (sent with its digest) equals ours holds exactly what we
    /// hold: take our head as its acknowledgement, and say whether it does. A connection
    /// between two nodes in step, say a rotation's, then costs a digest each way. Before,
    /// it cost an elided state (an entry per registration) once this process had buffered
    /// more deltas than its buffer holds, or every delta since an old acknowledgement from
    /// an earlier connection.
    pub(super) fn adopt_equal(
        &mut self,
        peer: ReplicaId,
        theirs: &CausalContext,
        ours: &CausalContext,
        hash: [u8; 16],
    ) -> bool {
        if theirs != ours || self.state_hash() != hash {
            return false;
        }
        let head = self.buffer.head();
        if self.peers.get(&peer).and_then(|p| p.acked) != Some(head) {
            self.in_step(peer, head);
        }
        true
    }

    /// A peer's hashes: of its context (the periodic exchange), and of its state on a new
    /// connection. Any difference asks for its digest by sending ours; both the same make
    /// it up to date, and its digest is taken to be ours (as it is).
    ///
    /// Hashes with the state's, arriving while a digest of ours waits for an answer, are
    /// that answer (a peer in step answers an asking digest so): they end the exchange
    /// whatever they say. Equal, the peer is up to date; different, something changed on
    /// one side since, which pushes and the next repair round carry. Asking again on a
    /// difference would let two nodes under churn bounce digests back and forth.
    pub(super) fn on_digest_hash(
        &mut self,
        peer: ReplicaId,
        hash: [u8; 16],
        state: Option<[u8; 16]>,
        now: Now,
    ) {
        let answer = state.is_some() && self.peers.get(&peer).is_some_and(|p| p.digest_sent_at.is_some());
        if answer {
            self.peers.entry(peer).or_default().digest_sent_at = None;
        }
        if state.is_some() {
            self.peers.entry(peer).or_default().hashes_sent_at = None;
        }
        let differs = hash != message::context_hash(self.replica.context())
            || state.is_some_and(|s| s != self.state_hash());
        if differs && !answer {
            self.send_digest(peer, now);
        }
        if differs || state.is_none() {
            return;
        }
        let head = self.buffer.head();
        self.in_step(peer, head);
        let ours = self.replica.context().compacted();
        if let Some(p) = self.peers.get_mut(&peer) {
            p.digest = Some(Box::new(ours));
        }
    }

    /// `peer` holds what we hold at `head`.
    fn in_step(&mut self, peer: ReplicaId, head: u64) {
        self.counters.equal_states_adopted += 1;
        if let Some(p) = self.peers.get_mut(&peer) {
            p.acked = Some(head);
            p.sent = Some(head);
        }
    }

    /// A peer with no acknowledgement from this process (it, or we, restarted) whose
    /// digest includes what this process started from lacks only what the buffer holds
    /// since: take that as its acknowledgement, and send the buffer trimmed by its digest
    /// (`State::trimmed_for`), not a full state. A restart after missing k changes then
    /// costs about k deltas each way, not the registry.
    pub(super) fn adopt_base(&mut self, peer: ReplicaId, digest: &CausalContext) -> bool {
        if !(self.base_valid && self.buffer.covers(0) && digest.includes(&self.start_ctx)) {
            return false;
        }
        match self.peers.get_mut(&peer) {
            Some(p) if p.acked.is_none() => {
                p.acked = Some(0);
                p.adopted = true;
                true
            }
            _ => false,
        }
    }
}
