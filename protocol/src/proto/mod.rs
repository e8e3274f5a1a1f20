//! The replication protocol as a state machine: it performs no I/O, reads no clock and
//! draws no ambient random number.
//!
//! A driver feeds it inputs (`handle_*`, and the local writes) with the current time
//! ([`Now`]: a monotonic clock for its timers, the wall clock for HLC stamps and leases, in
//! milliseconds), then drains its outputs with [`Node::poll_output`] and calls
//! [`Node::handle_timeout`] when [`Node::poll_timeout`] (monotonic) says. Outputs are messages to send,
//! connections to open or close, and events (what readers see change). The tokio driver and
//! the simulator are two such drivers.
//!
//! What it does (docs/design.md, "Replication", says why):
//! - every node registers itself under the reserved service [`MEMBERS_SERVICE`], so the
//!   member list is registry data; seeds only bootstrap it;
//! - a new delta (a local write, or a received one that taught us something) is pushed after
//!   `push_delay` to every connected peer that lacks it, never back to where it came from;
//! - each gossip tick (jittered) `fanout` random connected peers get the join of what they
//!   have not acknowledged; a peer the buffer no longer covers gets the elided full state;
//! - a digest exchange with one random peer is the backstop; equal digests send nothing;
//! - at most `max_outbound` outbound connections, rotated now and then; dials back off with
//!   jitter ([`crate::backoff`]).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use roster_registry::{
    Bounds, CausalContext, Dot, Hlc, HlcClock, InvalidInput, ProviderId, Replica, ReplicaId, ServiceName,
};

use crate::backoff::Backoff;
use crate::buffer::DeltaBuffer;
use crate::message::Message;

/// The anti-entropy exchange with random members.
mod anti_entropy;
/// Links across zone borders: which links cross, and what crossing costs the trees.
mod borders;
/// Many owned registrations written in one delta.
mod bulk;
mod clock_back;
mod config;
/// Dialing, accepting, rotating and closing connections.
mod connections;
/// Where other nodes are dialed: live members at their membership, lost ones by contact.
mod contacts;
/// Damping per failure domain: a zone cut off is shown unreachable, not written off.
mod damping;
mod dispatch;
mod divergence;
mod force;
mod guard;
mod liveness;
mod member_view;
mod membership;
mod overdue;
mod ownership;
mod pacing;
/// What a node keeps of a connection, of another node it deals with, and of a seed.
mod peer;
mod resume;
mod resume_types;
/// Pushes, gossip rounds, full states, and forwarding what a delta taught.
mod sync;
#[cfg(test)]
mod test_support;
/// The monotonic clock for timers and the wall clock for stamps and leases.
mod time;
mod timers;
/// Per-origin dissemination trees: what a node knows of them.
mod tree;
/// What the node does with its trees: its writes named, pushes, announcements, grafts.
mod tree_sync;
mod types;
mod zone;

use peer::{Conn, Peer, Seed};

pub use force::ForcedDeath;
pub use guard::CrashGuard;
use guard::{GUARDED_FAILURES, GUARDED_LEASE_FACTOR};
pub use membership::{has_left, live_members, url_endpoint, LiveMember, MEMBERS_SERVICE};
use membership::{member_meta, member_provider, members_service};

pub use config::{Config, Dissemination};
pub use resume_types::{KnownPeer, Memory, OwnedRegistration, PeerMemory, Resume, Resumed};

pub use time::Now;
use time::WallGuard;
pub use types::{ConnId, Counters, DialTarget, NodeInfo, Output, PeerProgress, ProtocolError};
pub use zone::{InvalidZone, Zone, MAX_ZONE_LEN};

/// The most dots a full sync may teach us for us to forward what it taught as a delta;
/// past that, peers are asked for their digests instead.
pub const MAX_FORWARD_DOTS: usize = 100_000;

/// The most seed URLs a node keeps (given at start, or learnt from redirects).
pub const MAX_SEEDS: usize = 32;

/// A digest to a peer that has not answered for this long may be sent again; until then,
/// every reason to ask that peer (start-up, a timer, `roster sync`, a repair) shares the
/// one in flight.
pub const DIGEST_COALESCE_MS: u64 = 2_000;

/// The gossip rounds a connection dialed as a seed is kept once the node knows other
/// members (see `release_seed`).
const SEED_SETTLE_ROUNDS: u64 = 5;

/// The outputs the queue keeps room for once it is empty.
const OUTPUTS_KEPT: usize = 1_024;

/// For this long after its start, a node dials the seeds it has not reached and no known
/// member stands at, even while connected (see `dial_more`).
const SEED_RETRY_MS: u64 = 5 * 60 * 1000;

/// The protocol state machine of one roster node.
#[derive(Debug)]
pub struct Node {
    me: NodeInfo,
    cfg: Config,
    replica: Replica,
    clock: HlcClock,
    rng: SmallRng,
    buffer: DeltaBuffer,
    conns: BTreeMap<ConnId, Conn>,
    /// Every live member has an entry (its URL, to dial it again should it stop being
    /// one), most of them never connected: boxed, so the map's nodes stay small.
    peers: BTreeMap<ReplicaId, Box<Peer>>,
    seeds: BTreeMap<String, Seed>,
    /// The seeds a connection reached (whoever answered).
    seeds_reached: BTreeSet<String>,
    /// Until when unreached seeds are dialed even while connected (monotonic ms).
    seed_retry_until: u64,
    /// The registrations this node owns and keeps alive: what it writes, shared with
    /// whoever handed it over (an agent keeps the same one for its own records), so an
    /// owner holds one copy besides the replica's, to write again when a peer's sweep or
    /// another node's write takes it.
    owned: BTreeMap<(ServiceName, ProviderId), Arc<OwnedRegistration>>,
    /// When an overwrite of an owned registration by another node was last repaired
    /// (monotonic ms; rare, so kept apart from `owned`).
    overwrites_repaired: BTreeMap<(ServiceName, ProviderId), u64>,
    /// Peers lost and not heard from since (see `liveness`).
    suspects: BTreeMap<ReplicaId, liveness::Suspicion>,
    /// Other zones' losses, and the zones judged cut off (see `damping`).
    damping: damping::Damping,
    /// Whether this node keeps a link to another zone, as the last reconnect round found
    /// (see `borders`).
    border_node: bool,
    /// When this border node last dialed its target zone past a backoff.
    border_redialed_at: Option<u64>,
    push_at: Option<u64>,
    /// When the last push went out (`None`: never).
    pushed_at: Option<u64>,
    pacer: pacing::Pacer,
    trees: tree::Trees,
    /// When announcements that waited (see `Config::announce_spacing_ms`) may go.
    announce_at: Option<u64>,
    /// When the acknowledgements owed go out.
    ack_at: Option<u64>,
    gossip_at: u64,
    digest_at: u64,
    /// When the last dial for an anti-entropy exchange went (monotonic ms).
    sync_dial_at: Option<u64>,
    renew_at: u64,
    rotate_at: u64,
    reconnect_at: u64,
    expire_from: u64,
    /// Up to when instances whose lease ended have been reported down.
    lapse_checked: u64,
    outputs: VecDeque<Output>,
    counters: Counters,
    stopping: bool,
    /// Whether this node has caught up with a peer once (see [`Node::synced`]).
    synced: bool,
    /// The crash-loop guard: one outbound connection, no rotation, the long backoff, no
    /// full state sent unasked.
    guarded: bool,
    /// Whether the registrations the replica holds as saved stand as they are (see
    /// `Node::resume`): the lease of the process before was still live when this one
    /// started (they are live at its peers), and its saved state holds every counter it
    /// could have minted (it stopped; it did not crash with writes unsaved).
    saved_stands: bool,
    /// Under the guard, no dial before this time (drawn at start within a third of the
    /// member lease): most launches of a tight crash loop end before they connect, while
    /// the last live process's lease still covers what it owns.
    guard_dial_at: u64,
    /// The earliest end and the TTL of its own leases as last shipped to a connected peer.
    leases_shipped: Option<(u64, u64)>,
    /// The time of the last input, and the wall time the node goes by.
    time: WallGuard,
    /// The context this process started from, and whether the buffer has held every
    /// delta since: a peer with no known acknowledgement whose digest includes it needs
    /// only the buffer (trimmed by its digest), not a full state.
    start_ctx: CausalContext,
    base_valid: bool,
    /// The hash of the state (see [`Node::state_hash`]) and the replica version it is of.
    state_hash: Option<(u64, [u8; 16])>,
    /// The live members, as last read (see `member_view`).
    member_view: member_view::MemberView,
    /// Pushes awaiting acknowledgement past their time (see `overdue`).
    overdue: overdue::Overdue,
    /// The contacts of nodes lost lately (see `contacts`).
    contacts: contacts::Contacts,
}

impl Node {
    /// A node resuming `replica` (empty for a new node), known as `me`, that will dial
    /// `seeds` to join. `seed` drives every random choice; `now` is the time (both clocks,
    /// or one `u64` for both).
    ///
    /// It registers itself as a member at once.
    ///
    /// # Errors
    /// [`InvalidInput`] when `me.url` has no host and port, or `me.name` is too long.
    pub fn new(
        me: NodeInfo,
        replica: Replica,
        seeds: impl IntoIterator<Item = String>,
        cfg: Config,
        seed: u64,
        now: impl Into<Now>,
    ) -> Result<Self, InvalidInput> {
        Self::with_resume(me, replica, seeds, cfg, seed, now, Resume::default()).map(|(n, _)| n)
    }

    /// The node [`Node::with_deferred_resume`] makes, with its membership written, before it writes
    /// its own registrations again; gives back the `resume` it was given.
    fn build(
        me: NodeInfo,
        replica: Replica,
        seeds: impl IntoIterator<Item = String>,
        cfg: Config,
        seed: u64,
        now: Now,
        resume: Resume,
    ) -> Result<(Self, Resume), InvalidInput> {
        let time = WallGuard::new(now, cfg.max_skew_ms);
        let endpoint = url_endpoint(&me.url)?;
        let meta = member_meta(&me);
        roster_registry::validate_metadata(&meta)?;
        // A clock resumes after the newest time it stored, so its writes order after its
        // old ones; but never after now: a history stamped ahead by a clock since fixed
        // would keep every write of this node ahead of its peers' clocks (refused by them
        // until real time caught up). Its own registrations are stamped again below.
        let last_seen = replica.state().latest_time().min(Hlc::new(now.wall_ms, 0));
        let mut rng = SmallRng::seed_from_u64(seed);
        let jitter = |rng: &mut SmallRng, d: u64| d * 3 / 4 + rng.random_range(0..=d / 2);
        let mono = now.mono_ms;
        let gossip_at = mono + jitter(&mut rng, cfg.gossip_interval_ms);
        let digest_at = mono + jitter(&mut rng, cfg.digest_interval_ms);
        let rotate_at = mono + jitter(&mut rng, cfg.rotate_interval_ms.max(1));
        // No rotation: no timer (a 1 ms one woke an idle agent a thousand times a second).
        let rotate_at = if cfg.rotate_interval_ms == 0 {
            u64::MAX
        } else {
            rotate_at
        };
        let mut node = Self {
            me,
            cfg,
            replica,
            clock: HlcClock::resume_after(last_seen),
            rng,
            buffer: DeltaBuffer::new(cfg.buffer_capacity),
            conns: BTreeMap::new(),
            peers: BTreeMap::new(),
            seeds: seeds.into_iter().map(|u| (u, Seed::default())).collect(),
            seeds_reached: BTreeSet::new(),
            seed_retry_until: mono + SEED_RETRY_MS,
            owned: BTreeMap::new(),
            overwrites_repaired: BTreeMap::new(),
            suspects: BTreeMap::new(),
            damping: damping::Damping::default(),
            border_node: false,
            border_redialed_at: None,
            push_at: None,
            pushed_at: None,
            pacer: pacing::Pacer::new(cfg.push_rate, cfg.push_burst, mono),
            trees: tree::Trees::default(),
            announce_at: None,
            ack_at: None,
            gossip_at,
            digest_at,
            sync_dial_at: None,
            renew_at: mono,
            rotate_at,
            reconnect_at: mono + cfg.reconnect_interval_ms,
            expire_from: mono + cfg.expire_holdoff_ms,
            lapse_checked: now.wall_ms,
            outputs: VecDeque::new(),
            counters: Counters::default(),
            stopping: false,
            synced: false,
            guarded: resume.crash_guard.is_some(),
            saved_stands: false,
            guard_dial_at: 0,
            leases_shipped: resume.leases_shipped,
            start_ctx: CausalContext::new(),
            base_valid: true,
            state_hash: None,
            member_view: member_view::MemberView::default(),
            overdue: overdue::Overdue::default(),
            contacts: contacts::Contacts::default(),
            time,
        };
        node.start_ctx = node.replica.context().clone();
        node.remember(&resume, now);
        if node.guarded {
            node.guard_dial_at = node.guarded_dial_at(now);
        }
        node.saved_stands = node.own_lease_live(now) && node.replica.unclaimed_gap() == 0;
        node.register_membership(endpoint, meta, now)?;
        Ok((node, resume))
    }

    /// Takes what the process before it remembered of its peers and seeds: their URLs and
    /// names, and their backoffs and last full states (saved in wall time, kept in
    /// monotonic time).
    fn remember(&mut self, resume: &Resume, now: Now) {
        for m in &resume.peers {
            if m.id == self.me.id {
                continue;
            }
            // A live member's contact goes at the first look at the members.
            let contact = contacts::Contact {
                url: m.url.clone(),
                name: m.name.clone(),
                last_seen_ms: now.wall_ms,
            };
            self.contacts.lost.insert(m.id, contact);
            if m.backoff != Backoff::default() || m.full_sent_at.is_some() {
                let p = self.peers.entry(m.id).or_default();
                // Saved in wall time; kept in monotonic time.
                p.backoff = self.time.backoff_to_mono(m.backoff);
                p.full_sent_at = m.full_sent_at.map(|t| self.time.mono_of(t));
            }
        }
        for (url, b) in &resume.seeds {
            if let Some(s) = self.seeds.get_mut(url) {
                s.backoff = self.time.backoff_to_mono(*b);
            }
        }
    }

    /// Under the crash-loop guard, when the node may first dial (monotonic ms).
    fn guarded_dial_at(&self, now: Now) -> u64 {
        // What the processes before it shipped is alive at its peers until its lease
        // ends: dial only when a third of it is left (at once when nothing is known).
        let due = self
            .leases_shipped
            .map_or(now.wall_ms, |(end, ttl)| end.saturating_sub(ttl / 3));
        self.time.mono_of(due).max(now.mono_ms)
    }

    /// Who this node is.
    pub fn info(&self) -> &NodeInfo {
        &self.me
    }

    /// The replica: read it for lookups (no network involved).
    pub fn replica(&self) -> &Replica {
        &self.replica
    }

    /// The keys the replica changed since last asked, when it tracks its changes (see
    /// [`Replica::track_changes`]).
    pub fn take_changed(&mut self) -> Option<roster_registry::ChangedKeys> {
        self.replica.take_changed()
    }

    /// What the node has done so far.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Our newest delta number, and how far each peer we track has come: what `roster
    /// status` shows of replication.
    pub fn replication_state(&self) -> (u64, Vec<PeerProgress>) {
        let peers = self
            .peers
            .iter()
            .map(|(id, p)| PeerProgress {
                peer: *id,
                acked: p.acked,
                sent: p.sent,
            })
            .collect();
        (self.buffer.head(), peers)
    }

    /// Whether this node has caught up with a peer at least once since it started: it held
    /// everything in some peer's digest (the peer's context when it sent it), a peer's state
    /// hash equalled its own, or it has no seeds (nobody to catch up with). Sticky: later
    /// changes arrive as deltas. What `Node::ready` in the `roster` crate waits for.
    pub fn synced(&self) -> bool {
        self.synced || self.seeds.is_empty()
    }

    /// The newest buffered delta (0 before any).
    pub fn buffer_head(&self) -> u64 {
        self.buffer.head()
    }

    /// How far every connected peer that takes pushes has been sent (or has acknowledged)
    /// the buffered deltas: a local change at or below this has been handed to each of
    /// their connections. Peers with no exchange yet on their connection (they catch up by
    /// digest instead) are not waited for; with none, `u64::MAX`.
    pub fn pushed_through(&self) -> u64 {
        self.linked_peers()
            .iter()
            .filter_map(|p| self.peers.get(p))
            .filter_map(|p| p.sent.max(p.acked))
            .min()
            .unwrap_or(u64::MAX)
    }

    fn note_synced(&mut self, peer: ReplicaId) {
        if self.synced {
            return;
        }
        let digest = self.peers.get(&peer).and_then(|p| p.digest.as_deref());
        if digest.is_some_and(|d| self.replica.context().includes(d)) {
            self.synced = true;
        }
    }

    /// The peers with an open link, and whether we dialed it. A connection dialed for one
    /// anti-entropy exchange (it lives two gossip rounds, and carries no pushes) is not a
    /// link.
    pub fn connected(&self) -> Vec<(ReplicaId, bool)> {
        self.conns
            .values()
            .filter(|c| !c.sync)
            .map(|c| (c.peer, c.outbound))
            .collect()
    }

    /// Asks a connected peer for an anti-entropy round (a digest exchange) at once.
    /// Returns whether a peer was connected to ask.
    pub fn sync_now(&mut self, now: impl Into<Now>) -> bool {
        let now = self.input_time(now.into());
        match self.random_connected(1, None).pop() {
            Some(p) if !self.stopping => {
                self.send_digest(p, now);
                true
            }
            _ => false,
        }
    }

    /// Whether the buffered deltas after `acked` (but those learnt from `peer`) bring a peer
    /// whose digest is `theirs` up to `ours`.
    fn deltas_since_fill(
        &self,
        acked: u64,
        peer: ReplicaId,
        theirs: &CausalContext,
        ours: &CausalContext,
    ) -> bool {
        let mut after = theirs.clone();
        if let Some(d) = self.buffer.since(acked, peer) {
            after.join(d.context());
        }
        after.includes(ours)
    }

    /// Sends `peer` our digest, unless one is already in flight to it (sent less than
    /// [`DIGEST_COALESCE_MS`] ago and not answered, or the hashes a new connection opens
    /// with): every reason to ask shares it.
    pub(super) fn send_digest(&mut self, peer: ReplicaId, now: Now) {
        let in_flight = self.peers.get(&peer).is_some_and(|p| {
            [p.digest_sent_at, p.hashes_sent_at]
                .into_iter()
                .flatten()
                .any(|t| now.mono_ms < t + DIGEST_COALESCE_MS)
        });
        if in_flight {
            self.counters.digests_coalesced += 1;
            return;
        }
        self.peers.entry(peer).or_default().digest_sent_at = Some(now.mono_ms);
        let state = self.state_hash();
        self.send_to_peer(
            peer,
            Message::digest(self.replica.context(), false, Some(state)),
            now,
        );
    }

    /// The peers whose last digest shows they hold `dot`.
    pub fn acknowledged(&self, dot: &Dot) -> Vec<ReplicaId> {
        self.peers
            .iter()
            .filter(|(_, p)| p.digest.as_ref().is_some_and(|d| d.contains(dot)))
            .map(|(id, _)| *id)
            .collect()
    }

    /// The next output, if any. Call until `None` after every input.
    pub fn poll_output(&mut self) -> Option<Output> {
        let out = self.outputs.pop_front();
        if out.is_none() && self.outputs.capacity() > OUTPUTS_KEPT {
            // A join that changed 100,000 registrations queued an event each: the queue's
            // room for them (2 MiB) is not kept once they are taken.
            self.outputs.shrink_to(OUTPUTS_KEPT);
        }
        out
    }

    /// Whether a full state sent to `peer` is still waiting for its acknowledgement.
    fn full_in_flight(&self, peer: ReplicaId, now: Now) -> bool {
        let sent = self.peers.get(&peer).and_then(|p| p.full_sent_at);
        sent.is_some_and(|t| now.mono_ms < t + self.cfg.full_sync_pause_ms)
    }

    /// What a state from a peer may hold at `now`.
    pub(super) fn bounds(&self, now: Now) -> Bounds {
        Bounds {
            now_ms: now.wall_ms,
            max_clock_skew_ms: self.cfg.max_skew_ms,
            max_counter_jump: self.cfg.max_counter_jump,
        }
    }

    /// Leaves the cluster gracefully: removes everything this node owns (its membership
    /// too) and writes its farewell (every replica then lists it as left, not failed:
    /// see [`has_left`]), pushes that to every connected peer at once, and says goodbye. The driver then
    /// flushes the outputs and closes within its deadline.
    pub fn shutdown(&mut self, now: impl Into<Now>) {
        self.depart(now.into(), true);
    }

    /// Stops to start again: pushes every change connected peers lack (a deregistration
    /// made just before included) and says goodbye, but removes nothing. Peers keep this
    /// node and what it owns for the rest of its lease (a goodbye is not suspected), so a
    /// restart within it shows them no change; a node that never comes back lapses with
    /// its lease.
    pub fn stop(&mut self, now: impl Into<Now>) {
        self.depart(now.into(), false);
    }

    fn depart(&mut self, now: Now, leave: bool) {
        let now = self.input_time(now);
        self.stopping = true;
        let mut farewell = None;
        if leave {
            self.owned.clear();
            self.overwrites_repaired.clear();
            let stamp = self.clock.tick(now.wall_ms);
            let applied = self.replica.deregister_all(stamp);
            farewell = Some(applied.delta.clone());
            self.buffer_own(applied.delta, now);
            for c in applied.changes {
                self.outputs.push_back(Output::Event(c));
            }
        }
        // Every connected peer hears what it lacks now, not at the next push or gossip
        // round: what is buffered, in order, the farewell last.
        self.push(now);
        let head = self.buffer.head();
        let peers: BTreeSet<ReplicaId> = self.conns.values().map(|c| c.peer).collect();
        for p in peers {
            // A peer the push skipped (no exchange yet on its connection) still gets the
            // removals.
            let pushed = self
                .peers
                .get(&p)
                .and_then(|x| x.sent.max(x.acked))
                .is_some_and(|s| s >= head);
            if let Some(f) = farewell.as_ref().filter(|_| !pushed) {
                self.send_to_peer(p, Message::delta(head, f), now);
            }
        }
        let conns: Vec<ConnId> = self.conns.keys().copied().collect();
        for c in conns {
            self.close(c, if leave { "leaving" } else { "stopping" }, now);
        }
        self.push_at = None;
    }
}
