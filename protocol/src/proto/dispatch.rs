//! Inputs from peers: a message on a connection, checked, then handed to what handles its
//! kind.

use rand::RngExt;
use roster_registry::{CausalContext, ElidedError, ReplicaId};

use super::{ConnId, Node, Now, Output, ProtocolError, MAX_SEEDS};
use crate::backoff::Failure;
use crate::message::{self, Envelope, Message, MessageError};

impl Node {
    /// The peer on `conn`, if the connection is open.
    pub fn peer_on(&self, conn: ConnId) -> Option<ReplicaId> {
        self.conns.get(&conn).map(|c| c.peer)
    }

    /// A message arrived on `conn`.
    ///
    /// # Errors
    /// [`ProtocolError`] when it cannot be used; the driver closes the connection with the
    /// error as reason. Nothing in the replica changed.
    pub fn handle_message(
        &mut self,
        conn: ConnId,
        envelope: Envelope,
        now: impl Into<Now>,
    ) -> Result<(), ProtocolError> {
        let now = self.input_time(now.into());
        let Some(peer) = self.conns.get(&conn).map(|c| c.peer) else {
            return Err(ProtocolError::UnknownConnection(conn));
        };
        self.counters.messages_received += 1;
        let result = self.handle(conn, peer, envelope, now);
        self.note_synced(peer);
        if let Err(e) = &result {
            if let ProtocolError::Refused(_) = e {
                self.counters.states_refused += 1;
            }
            if e.closes() {
                self.counters.refused += 1;
                self.close(conn, &e.to_string(), now);
            }
        }
        result
    }

    pub(super) fn handle(
        &mut self,
        conn: ConnId,
        peer: ReplicaId,
        envelope: Envelope,
        now: Now,
    ) -> Result<(), ProtocolError> {
        if let Some(sent_at) = envelope.sent_at {
            self.clock.observe(sent_at, now.wall_ms, self.cfg.max_skew_ms)?;
            self.time.heard(peer, sent_at.millis(), now.mono_ms);
        }
        self.heard_from(peer);
        match envelope.message {
            Message::Digest { ctx, reply, state } => self.on_digest(conn, peer, &ctx, reply, state, now)?,
            Message::Delta { seq, delta } => self.on_delta(conn, peer, seq, &delta, now)?,
            Message::Elided { seq, elided } => self.on_elided(conn, peer, seq, &elided, now)?,
            Message::Ack { seq } => self.on_ack(peer, seq, now),
            // At most one full state per pause, however often a peer asks: a request of a
            // few bytes must not buy a registry's worth of them each time.
            Message::NeedFull if !self.full_in_flight(peer, now) => {
                self.send_full(peer, &CausalContext::new(), now)
            }
            Message::NeedFull => {}
            Message::Redirect { urls } => self.on_redirect(conn, peer, urls, now),
            // The periodic exchange: a digest only when the contexts differ.
            Message::DigestHash { hash, state } => self.on_digest_hash(peer, hash, state, now),
            Message::ProbeReq { node } => self.on_probe_req(peer, node, now),
            Message::ProbeAck { node, connected } => self.on_probe_ack(node, connected),
            Message::Push {
                seq,
                delta,
                ids,
                announced,
                resend,
            } => {
                self.on_push(conn, peer, seq, &delta, ids, resend, now)?;
                self.on_ihave(conn, peer, None, announced, now);
            }
            Message::IHave { seq, ids } => self.on_ihave(conn, peer, seq, ids, now),
            Message::Graft { ids } => self.on_graft(peer, ids, now),
            Message::Prune { roots } => self.on_prune(peer, roots),
            Message::ExchangeOnly => {
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.sync = true;
                }
            }
            Message::Goodbye { .. } => {
                self.forget_conn(conn, now);
                self.outputs.push_back(Output::Close {
                    conn,
                    reason: "peer said goodbye".to_string(),
                });
            }
        }
        Ok(())
    }

    /// A peer's digest: note it, answer a peer in step with the hashes, send what it
    /// lacks, and ask for what we lack (unless it is a reply).
    fn on_digest(
        &mut self,
        conn: ConnId,
        peer: ReplicaId,
        ctx: &[u8],
        reply: bool,
        state: Option<[u8; 16]>,
        now: Now,
    ) -> Result<(), ProtocolError> {
        let theirs = message::decode_digest(ctx)?;
        self.refute(&theirs, now);
        let ours = self.replica.context().clone();
        self.note_digest(peer, &theirs);
        // A digest that asks, from a peer in step: answer with the hashes, or it
        // would ask again every repair round (see `on_digest_hash`).
        if let Some(hash) = state {
            if self.adopt_equal(peer, &theirs, &ours, hash) {
                if !reply {
                    self.send_to_peer(peer, Message::digest_hash(&ours, Some(hash)), now);
                }
            } else if theirs.includes(&ours) && ours.includes(&theirs) {
                self.on_diverged(conn, peer, &theirs, reply, now);
            }
        }
        if !theirs.includes(&ours) {
            // They lack something: from the buffer if it covers them, else in full.
            // A full state already on its way (not yet acknowledged) is not sent
            // again: a large one takes the peer a while to join, and digests it
            // sent meanwhile would otherwise each cost another.
            let acked = self.peers.get(&peer).and_then(|p| p.acked);
            let in_flight = self.full_in_flight(peer, now);
            match acked {
                // Only if what came after its acknowledgement is all it lacks: a
                // peer that acknowledged a delta and was killed before saving it
                // comes back without it, and the deltas after would never bring it.
                Some(a)
                    if self.buffer.covers(a)
                        && a < self.buffer.head()
                        && self.deltas_since_fill(a, peer, &theirs, &ours) =>
                {
                    self.check_state_after_catch_up(peer);
                    self.sync_peer(peer, false, now)
                }
                // Under the crash-loop guard, no full state unless the peer asks.
                None if self.adopt_base(peer, &theirs) => {
                    self.check_state_after_catch_up(peer);
                    self.sync_peer(peer, false, now)
                }
                _ if in_flight || self.guarded => {}
                _ => self.send_full(peer, &theirs, now),
            }
        }
        if !reply && !ours.includes(&theirs) {
            self.send(conn, Message::digest(&ours, true, None), now);
        }
        Ok(())
    }

    /// Keeps a peer's digest. It may be newer than the peer's acknowledgement: a peer back
    /// on a new connection, killed before it acknowledged what it had saved, holds more
    /// than it acknowledged. Pushed from that acknowledgement untrimmed, it was sent all
    /// of it again by every peer (133 kB for a 53 kB registry). So what goes to it is
    /// trimmed by the digest (`State::trimmed_for`, which keeps removals) until it
    /// acknowledges again. Its digest holding all of ours would not make it up to date:
    /// a removal mints no dot.
    fn note_digest(&mut self, peer: ReplicaId, theirs: &CausalContext) {
        let head = self.buffer.head();
        let p = self.peers.entry(peer).or_default();
        p.digest = Some(Box::new(theirs.compacted()));
        p.digest_sent_at = None;
        if p.acked.is_some_and(|a| a < head) {
            p.adopted = true;
        }
    }

    /// A delta (number `seq` of the peer's buffer): admitted, joined, acknowledged.
    fn on_delta(
        &mut self,
        conn: ConnId,
        peer: ReplicaId,
        seq: u64,
        delta: &[u8],
        now: Now,
    ) -> Result<(), ProtocolError> {
        let delta = message::decode_delta(delta)?;
        self.peers.entry(peer).or_default().digest_sent_at = None;
        self.admit(&delta, now)?;
        self.apply(peer, delta, now);
        self.owe_ack(conn, seq, now);
        Ok(())
    }

    /// An elided full state: completed from our own state, admitted, joined and
    /// acknowledged; when ours lacks what it elided, we ask for the whole of it.
    fn on_elided(
        &mut self,
        conn: ConnId,
        peer: ReplicaId,
        seq: u64,
        elided: &[u8],
        now: Now,
    ) -> Result<(), ProtocolError> {
        let elided = message::decode_elided(elided)?;
        self.peers.entry(peer).or_default().digest_sent_at = None;
        self.counters.full_syncs_received += 1;
        match elided.into_state(self.replica.state()) {
            Ok(full) => {
                self.admit(&full, now)?;
                self.apply(peer, full, now);
                self.owe_ack(conn, seq, now);
            }
            Err(ElidedError::Missing(_)) => self.send(conn, Message::NeedFull, now),
            Err(ElidedError::Invalid(e)) => return Err(MessageError::Payload(e.into()).into()),
        }
        Ok(())
    }

    /// A peer with no room for us (too many inbound connections) named members to dial
    /// instead.
    fn on_redirect(&mut self, conn: ConnId, peer: ReplicaId, urls: Vec<String>, now: Now) {
        // Learn them as seeds (bounded), and come back to this peer later.
        for url in urls {
            if self.seeds.len() >= MAX_SEEDS {
                break;
            }
            self.seeds.entry(url).or_default();
        }
        let draw = self.rng.random::<u64>();
        let policy = self.cfg.backoff;
        let full = Failure::RetryAfter(policy.cap_ms);
        let p = self.peers.entry(peer).or_default();
        p.fail(&policy, full, now.mono_ms, draw);
        // Dialed as a seed: that address waits too, so we try the others first.
        let seed = self.conns.get(&conn).and_then(|c| c.seed.clone());
        if let Some(s) = seed.and_then(|u| self.seeds.get_mut(&u)) {
            s.backoff.fail(&policy, full, now.mono_ms, draw);
        }
    }
}
