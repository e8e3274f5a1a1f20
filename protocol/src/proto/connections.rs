//! Connections: dialing members and seeds, healing partitions, rotating, accepting, closing.

use std::collections::{BTreeMap, BTreeSet};

use rand::RngExt;
use roster_registry::ReplicaId;

use super::{Conn, ConnId, DialTarget, Node, NodeInfo, Now, Output, GUARDED_FAILURES, SEED_SETTLE_ROUNDS};
use crate::backoff::Failure;
use crate::message::{self, Message};

impl Node {
    /// Live members we may dial: not connected, not being dialed, past their backoff.
    pub(super) fn dial_more(&mut self, now: Now) {
        if !self.cfg.dial || self.stopping || (self.guarded && now.mono_ms < self.guard_dial_at) {
            return;
        }
        let room = self.outbound_room(now);
        if room == 0 {
            return;
        }
        let connected: BTreeSet<ReplicaId> = self.conns.values().map(|c| c.peer).collect();
        let members = self.members(now.wall_ms);
        let knows_members = !members.is_empty();
        let seeds_early = now.mono_ms < self.seed_retry_until && !self.seeds.is_empty();
        // Where every node we know or knew stands (only while seeds may be retried): a seed
        // there is no stranger, even once its lease has ended here (behind a partition).
        let known_urls: BTreeSet<String> = if seeds_early {
            self.known_urls(&members)
        } else {
            BTreeSet::new()
        };
        let candidates = self.dial_candidates(members, &connected, now);
        let room = self.dial_by_zone(candidates, room, now);
        // Seeds bootstrap a node that knows no member yet. For its first minutes, a node
        // also dials each seed it has not reached and at which no node it knows stands:
        // nodes started together can join as two groups, each having reached only its own
        // while the others were not up yet, and then nothing joined the groups (a Jepsen
        // start, seed 981752295: {a,b,e} and {c,d} for good).
        let alone = connected.is_empty() && !knows_members;
        if alone || seeds_early {
            self.dial_seeds(alone, &known_urls, room, now);
        }
    }

    /// How many more outbound connections may be dialed: the cap less those open and the
    /// dials that still hold a slot (see `Config::dial_slot_ms`), and never more than
    /// twice the cap in flight.
    pub(super) fn outbound_room(&self, now: Now) -> usize {
        let open = self.conns.values().filter(|c| c.outbound && !c.sync).count();
        // Full whatever the dials: answered without reading every peer's record (each
        // gossip round asks; two thirds of an idle simulated node's work at 1,000 nodes).
        let cap = if self.guarded { 1 } else { self.cfg.max_outbound };
        if open >= cap {
            return 0;
        }
        let dials: Vec<u64> = self
            .peers
            .values()
            .filter(|p| !p.sync_dial)
            .filter_map(|p| p.dialing)
            .chain(self.seeds.values().filter_map(|s| s.dialing))
            .collect();
        // Under the crash-loop guard, one connection is enough to keep what it owns alive
        // and to receive deltas, and a slow dial keeps its slot.
        if self.guarded {
            return 1usize.saturating_sub(open + dials.len());
        }
        let slot = self.cfg.dial_slot_ms;
        let holding = dials
            .iter()
            .filter(|&&at| slot == 0 || now.mono_ms < at.saturating_add(slot))
            .count();
        let max = self.cfg.max_outbound;
        (max.saturating_sub(open + holding)).min((2 * max).saturating_sub(open + dials.len()))
    }

    /// The URLs of every live member and of every peer we know or knew (where it is dialed,
    /// and where it said it was).
    fn known_urls(&self, members: &[(ReplicaId, String, String)]) -> BTreeSet<String> {
        members
            .iter()
            .map(|(_, url, _)| url.clone())
            .chain(self.contacts.lost.values().filter_map(|c| c.url.clone()))
            .chain(self.peers.values().filter_map(|p| p.advertised.clone()))
            .collect()
    }

    /// The peers that may be dialed now, by id, each once: live members, peers lately
    /// written dead and, when alone, lost peers; none connected, none at our own address,
    /// none dialing or backing off; only those with the fewest failed attempts.
    fn dial_candidates(
        &self,
        members: Vec<(ReplicaId, String, String)>,
        connected: &BTreeSet<ReplicaId>,
        now: Now,
    ) -> Vec<(ReplicaId, String)> {
        // Alone, a node also dials peers that were members and are not now: their leases
        // ended while it heard nobody. In a partition, the peers on its side are among
        // them; left to `reconnect_lost` (one dial per 30 s), a side whose links all
        // crossed the cut stayed without a link that long.
        let lost = if connected.is_empty() {
            self.lost_peers(&members, connected, now.wall_ms)
        } else {
            Vec::new()
        };
        let mut candidates: Vec<(ReplicaId, String)> = members
            .into_iter()
            .chain(
                self.lately_written_dead(now)
                    .into_iter()
                    .chain(lost)
                    .map(|(id, url)| (id, url, String::new())),
            )
            .filter(|(id, _, _)| !connected.contains(id))
            // An old identity at our own address (a restart that lost its data) is us.
            .filter(|(_, url, _)| *url != self.me.url)
            // A seed dial on its way to that address will reach it (see `dial_seeds`).
            .filter(|(_, url, _)| self.seeds.get(url).is_none_or(|s| s.dialing.is_none()))
            .filter(|(id, _, _)| {
                self.peers
                    .get(id)
                    .is_none_or(|p| p.dialing.is_none() && p.backoff.ready(now.mono_ms))
            })
            .map(|(id, url, _)| (id, url))
            .collect();
        candidates.sort();
        candidates.dedup_by_key(|(id, _)| *id);
        // The peers that failed longest ago go first, those that never failed (or have
        // been healthy since) before all: after a cut, the links across it die of silence
        // together, so a slot goes to a peer on this side, not to one that will hold it
        // for a handshake timeout. Counting failures instead misled: a peer on this side
        // whose connections a lossy spell had reset a few times came after the peers that
        // had just died of silence once (a Jepsen run, seed 398904396: a write waited over
        // 10 s to reach a node of its side).
        let failed_at = |id: &ReplicaId| self.peers.get(id).and_then(|p| p.failed_at);
        if let Some(first) = candidates.iter().map(|(id, _)| failed_at(id)).min() {
            candidates.retain(|(id, _)| failed_at(id) == first);
        }
        candidates
    }

    /// Dials up to `room` of `candidates`, drawn at random; returns the room left.
    pub(super) fn dial_peers(
        &mut self,
        mut candidates: Vec<(ReplicaId, String)>,
        mut room: usize,
        now: Now,
    ) -> usize {
        while room > 0 && !candidates.is_empty() {
            let i = self.rng.random_range(0..candidates.len());
            let (id, url) = candidates.swap_remove(i);
            self.peers.entry(id).or_default().dialing = Some(now.mono_ms);
            self.counters.dials += 1;
            self.outputs.push_back(Output::Dial(DialTarget::Peer { id, url }));
            room -= 1;
        }
        room
    }

    /// Dials up to `room` seeds, drawn at random among those not dialing and past their
    /// backoff: any of them when `alone`, else only those not reached yet at which no node
    /// in `known_urls` stands.
    fn dial_seeds(&mut self, alone: bool, known_urls: &BTreeSet<String>, mut room: usize, now: Now) {
        // Not a seed that a dial of its node is already on the way to: alone after a cut,
        // a node dialed a lost peer and, in the same round, the seed at its address (two
        // connections to one peer; a Jepsen run).
        let dialing: BTreeSet<String> = self
            .peers
            .iter()
            .filter(|(_, p)| p.dialing.is_some())
            .filter_map(|(id, _)| self.url_of(*id, now.wall_ms))
            .collect();
        let mut ready: Vec<String> = self
            .seeds
            .iter()
            .filter(|(u, s)| s.dialing.is_none() && s.backoff.ready(now.mono_ms) && !dialing.contains(*u))
            .map(|(u, _)| u.clone())
            .filter(|u| {
                alone || !(self.seeds_reached.contains(u) || known_urls.contains(u) || *u == self.me.url)
            })
            .collect();
        while room > 0 && !ready.is_empty() {
            room -= 1;
            let url = ready.swap_remove(self.rng.random_range(0..ready.len()));
            if let Some(s) = self.seeds.get_mut(&url) {
                s.dialing = Some(now.mono_ms);
            }
            self.counters.dials += 1;
            self.outputs.push_back(Output::Dial(DialTarget::Seed { url }));
        }
    }

    /// Notes where every live member is, then dials one peer that was a member once but is
    /// not now (its entry expired while we could not hear it): a partition that outlived
    /// the leases heals through this. One dial per interval, each peer under its backoff.
    pub(super) fn reconnect_lost(&mut self, now: Now) {
        if !self.cfg.dial || self.stopping {
            return;
        }
        let live: BTreeSet<ReplicaId> = self.live_others(now.wall_ms).iter().copied().collect();
        let connected: BTreeSet<ReplicaId> = self.conns.values().map(|c| c.peer).collect();
        self.forget_lost(&live, &connected, now);
        let lost: Vec<(ReplicaId, String)> = self
            .lost_peers_of(&live, &connected, now.wall_ms)
            .into_iter()
            .filter(|(id, _)| {
                self.peers
                    .get(id)
                    .is_none_or(|p| p.dialing.is_none() && p.backoff.ready(now.mono_ms))
            })
            .filter(|(_, url)| self.seeds.get(url).is_none_or(|s| s.dialing.is_none()))
            .collect();
        if lost.is_empty() {
            return;
        }
        let (id, url) = lost[self.rng.random_range(0..lost.len())].clone();
        self.peers.entry(id).or_default().dialing = Some(now.mono_ms);
        self.counters.dials += 1;
        self.outputs.push_back(Output::Dial(DialTarget::Peer { id, url }));
    }

    /// Forgets the nodes that have been neither live members nor connected for
    /// `forget_lost_after_ms`: their contacts, and their records unless they are members.
    fn forget_lost(&mut self, live: &BTreeSet<ReplicaId>, connected: &BTreeSet<ReplicaId>, now: Now) {
        let forget_before = now.wall_ms.saturating_sub(self.cfg.forget_lost_after_ms);
        // A live member's contact is its membership.
        self.contacts.lost.retain(|id, c| {
            !live.contains(id) && (connected.contains(id) || c.last_seen_ms >= forget_before)
        });
        let lost = &self.contacts.lost;
        self.peers.retain(|id, p| {
            live.contains(id)
                || connected.contains(id)
                || lost.contains_key(id)
                || p.last_seen_ms >= forget_before
        });
    }

    /// Peers that were members and are not now (not `members`, not `connected`), with the
    /// URL they had, other than our own.
    fn lost_peers(
        &self,
        members: &[(ReplicaId, String, String)],
        connected: &BTreeSet<ReplicaId>,
        now_ms: u64,
    ) -> Vec<(ReplicaId, String)> {
        let live: BTreeSet<ReplicaId> = members.iter().map(|(id, _, _)| *id).collect();
        self.lost_peers_of(&live, connected, now_ms)
    }

    /// The nodes lost lately (by their contacts) and the members only shown as unreachable
    /// (at their membership's URL), neither `live` nor `connected`, other than our own
    /// address; by id, each once.
    pub(super) fn lost_peers_of(
        &self,
        live: &BTreeSet<ReplicaId>,
        connected: &BTreeSet<ReplicaId>,
        now_ms: u64,
    ) -> Vec<(ReplicaId, String)> {
        let lost = self
            .contacts
            .lost
            .iter()
            .filter_map(|(id, c)| Some((*id, c.url.clone()?)));
        let unreachable = self
            .live_all(now_ms)
            .iter()
            .filter(|m| m.unreachable && m.id != self.me.id)
            .filter_map(|m| Some((m.id, self.member_contact(m.id, now_ms)?.0)))
            .collect::<Vec<_>>();
        let all: BTreeMap<ReplicaId, String> = lost.chain(unreachable).collect();
        all.into_iter()
            .filter(|(id, _)| !live.contains(id) && !connected.contains(id))
            .filter(|(_, url)| *url != self.me.url)
            .collect()
    }

    pub(super) fn rotate(&mut self, now: Now) {
        if self.guarded {
            return;
        }
        let outbound: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| c.outbound && !c.sync)
            .map(|(id, _)| *id)
            .collect();
        let others = self.live_others(now.wall_ms).len();
        if outbound.len() < self.cfg.max_outbound || others <= outbound.len() {
            return;
        }
        let conn = outbound[self.rng.random_range(0..outbound.len())];
        self.close(conn, "rotating to another peer", now);
    }

    /// A connection dialed as a seed was for finding the cluster. Once it has had
    /// [`SEED_SETTLE_ROUNDS`] gossip rounds for its first exchange and this node knows more
    /// members than it keeps outbound connections, it is closed, and the next gossip round
    /// dials a random member instead: otherwise every node that joined through a seed keeps
    /// a connection to it, and the seed receives every delta once per such node.
    pub(super) fn release_seed(&mut self, now: Now) {
        if self.guarded {
            return;
        }
        let settle = self.cfg.gossip_interval_ms * SEED_SETTLE_ROUNDS;
        let Some(conn) = self
            .conns
            .iter()
            .find(|(_, c)| c.outbound && c.seed.is_some() && c.opened_at + settle <= now.mono_ms)
            .map(|(id, _)| *id)
        else {
            return;
        };
        let outbound = self.conns.values().filter(|c| c.outbound && !c.sync).count();
        if self.live_others(now.wall_ms).len() <= outbound {
            return;
        }
        self.close(conn, "joined; moving from the seed to a random member", now);
    }

    pub(super) fn close(&mut self, conn: ConnId, reason: &str, now: Now) {
        self.send(conn, Message::goodbye(reason), now);
        self.outputs.push_back(Output::Close {
            conn,
            reason: reason.to_string(),
        });
        self.forget_conn(conn, now);
    }

    /// Forgets connection `conn`, however it closed. Only a peer's oldest connection
    /// carries what we send it, and its acknowledgements are cumulative: what went on a
    /// connection that closed may be lost while a later delta, sent on the next one, is
    /// acknowledged past it. So when the carrying connection closes, sending to the peer
    /// starts again from its last acknowledgement, and a full state or digest in flight on
    /// it is no longer awaited. When it was the peer's last connection, its digest goes too.
    pub(super) fn forget_conn(&mut self, conn: ConnId, now: Now) -> Option<Conn> {
        let c = self.conns.remove(&conn)?;
        let carried = !self.conns.iter().any(|(id, o)| o.peer == c.peer && *id < conn);
        let last = !self.conns.values().any(|o| o.peer == c.peer);
        if let Some(p) = self.peers.get_mut(&c.peer).filter(|_| carried) {
            p.sent = None;
            p.numbered = None;
            p.full_sent_at = None;
            p.resend_at = None;
            p.resends = 0;
            p.unacked_since = None;
            p.digest_sent_at = None;
            if last {
                // It may come back from an older disk: its next digest tells.
                p.digest = None;
            }
        }
        if last {
            self.seen(c.peer, now);
        }
        if last {
            self.trees.forget_peer(c.peer);
        }
        Some(c)
    }

    /// A dial failed (or its handshake did). `draw` feeds the backoff jitter.
    pub fn handle_dial_failed(&mut self, target: &DialTarget, failure: Failure, now: impl Into<Now>) {
        let now = self.input_time(now.into());
        let draw = self.rng.random::<u64>();
        let policy = self.cfg.backoff;
        match target {
            DialTarget::Peer { id, .. } => {
                self.zone_test_ended(*id, false, now);
                let p = self.peers.entry(*id).or_default();
                p.dialing = None;
                p.sync_dial = false;
                p.clock_refused = failure == Failure::Clock;
                if self.guarded {
                    p.backoff.failures = p.backoff.failures.max(GUARDED_FAILURES);
                }
                p.fail(&policy, failure, now.mono_ms, draw);
                self.tried_dial_failed(*id, now);
            }
            DialTarget::Seed { url } => {
                if let Some(s) = self.seeds.get_mut(url) {
                    s.dialing = None;
                    s.clock_refused = failure == Failure::Clock;
                    if self.guarded {
                        s.backoff.failures = s.backoff.failures.max(GUARDED_FAILURES);
                    }
                    s.backoff.fail(&policy, failure, now.mono_ms, draw);
                }
            }
        }
    }

    /// A connection is open and authenticated: `peer` is who answered. `seed` is the seed
    /// URL it was dialed as, if any.
    ///
    /// Returns `false` (and asks the driver to close it) when the node refuses it: too many
    /// inbound connections, or it is ourselves.
    pub fn handle_connected(
        &mut self,
        conn: ConnId,
        peer: &NodeInfo,
        outbound: bool,
        seed: Option<&str>,
        now: impl Into<Now>,
    ) -> bool {
        let now = self.input_time(now.into());
        if let Some(url) = seed {
            if let Some(s) = self.seeds.get_mut(url) {
                s.dialing = None;
                s.clock_refused = false;
            }
            self.seeds_reached.insert(url.to_string());
        }
        let mut sync = false;
        self.zone_test_ended(peer.id, true, now);
        if let Some(p) = self.peers.get_mut(&peer.id) {
            p.dialing = None;
            p.clock_refused = false;
            sync = outbound && std::mem::take(&mut p.sync_dial);
        }
        let inbound = self.conns.values().filter(|c| !c.outbound).count();
        let refuse = if peer.id == self.me.id {
            Some("connected to itself")
        } else if !outbound && inbound >= self.cfg.max_inbound {
            Some("too many inbound connections")
        } else if self.stopping {
            Some("shutting down")
        } else {
            None
        };
        self.conns.insert(
            conn,
            Conn {
                peer: peer.id,
                outbound,
                opened_at: now.mono_ms,
                seed: seed.map(str::to_string),
                ack_owed: None,
                sync,
            },
        );
        if let Some(reason) = refuse {
            if !outbound && !self.stopping {
                // Full: point the newcomer at other members, so a bootstrap storm on one
                // seed spreads over the cluster instead of retrying the same door.
                let mut urls: Vec<String> = self
                    .members(now.wall_ms)
                    .into_iter()
                    .map(|(_, url, _)| url)
                    .collect();
                let mut picked = Vec::new();
                while picked.len() < message::MAX_REDIRECT_URLS && !urls.is_empty() {
                    let i = self.rng.random_range(0..urls.len());
                    picked.push(urls.swap_remove(i));
                }
                picked.retain(|u| u.len() <= message::MAX_URL_LEN);
                self.send(conn, Message::Redirect { urls: picked }, now);
            }
            self.close(conn, reason, now);
            return false;
        }
        self.counters.connections += 1;
        self.heard_from(peer.id);
        if self.damping.zoned {
            let view = self.zone_view(now.wall_ms);
            self.cost_links_by_zone(&view);
        }
        let p = self.peers.entry(peer.id).or_default();
        // Remembered to name it in `members` after it leaves. Not as a URL to dial again:
        // that comes from its membership, and a seed's own backoff covers the rest.
        p.advertised = Some(peer.url.clone());
        p.name = Some(peer.name.clone());
        p.hashes_sent_at = Some(now.mono_ms);
        p.state_checked = false;
        self.seen(peer.id, now);
        // Dialed for an exchange: the peer pushes nothing on it either.
        if sync {
            self.send(conn, Message::ExchangeOnly, now);
        }
        // Each side says what it has seen, as hashes: the other answers with its digest when
        // they differ, and the exchange goes on from there; nodes in step stop here.
        let state = self.state_hash();
        self.send_to_peer(
            peer.id,
            Message::digest_hash(self.replica.context(), Some(state)),
            now,
        );
        self.note_leases_shipped();
        true
    }

    /// A connection closed because nothing arrived on it (pings unanswered): as
    /// [`Node::handle_disconnected`], and its peer counts a failed attempt, however long the
    /// link lived, so the slot is redialed to another peer first. In a silent partition the
    /// peer behind a dead link is likely still unreachable; dialed again at once, it would
    /// hold the slot for a handshake timeout while a reachable peer waits.
    pub fn handle_dead_link(&mut self, conn: ConnId, now: impl Into<Now>) {
        let now = self.input_time(now.into());
        let peer = self.conns.get(&conn).map(|c| c.peer);
        self.disconnected(conn, true, now);
        if let Some(peer) = peer {
            let draw = self.rng.random::<u64>();
            let policy = self.cfg.backoff;
            let p = self.peers.entry(peer).or_default();
            p.fail(&policy, Failure::Network, now.mono_ms, draw);
        }
    }

    /// A connection closed (by the peer, the network, or us). Without a goodbye, its peer
    /// is suspected until it shows it is alive (see `liveness`).
    pub fn handle_disconnected(&mut self, conn: ConnId, now: impl Into<Now>) {
        let now = self.input_time(now.into());
        self.disconnected(conn, false, now);
    }

    /// `silent`: the link was closed for silence (a dead link), not by its peer.
    fn disconnected(&mut self, conn: ConnId, silent: bool, now: Now) {
        let Some(c) = self.forget_conn(conn, now) else {
            return;
        };
        self.suspect(c.peer, silent, now);
        if c.outbound && !c.sync {
            let draw = self.rng.random::<u64>();
            let policy = self.cfg.backoff;
            let p = self.peers.entry(c.peer).or_default();
            let lived_ms = now.mono_ms.saturating_sub(c.opened_at);
            p.failed_at = (lived_ms < policy.healthy_after_ms).then_some(now.mono_ms);
            p.backoff.closed(&policy, lived_ms, now.mono_ms, draw);
        }
    }
}
