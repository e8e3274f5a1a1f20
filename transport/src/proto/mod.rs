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
//!   `push_delay` to `fanout` random connected peers, never back to where it came from;
//! - each gossip tick (jittered) `fanout` random connected peers get the join of what they
//!   have not acknowledged; a peer the buffer no longer covers gets the elided full state;
//! - a digest exchange with one random peer is the backstop; equal digests send nothing;
//! - at most `max_outbound` outbound connections, rotated now and then; dials back off with
//!   jitter ([`crate::backoff`]).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use roster_registry::{
    validate_metadata, Bounds, CausalContext, Change, ClockSkew, Dot, ElidedError, Endpoint, Hlc, HlcClock,
    InvalidInput, Metadata, NewRegistration, ProviderId, Refusal, RegKey, Replica, ReplicaId, ServiceName,
    State, Status,
};

use crate::backoff::{Backoff, Failure};
use crate::buffer::DeltaBuffer;
use crate::message::{self, Envelope, Message, MessageError};

/// Pushes, gossip rounds, full states, and forwarding what a delta taught.
mod bulk;
mod config;
/// Dialing, accepting, rotating and closing connections.
mod connections;
mod liveness;
mod pacing;
mod resume_types;
mod sync;
/// The monotonic clock for timers and the wall clock for stamps and leases.
mod time;

pub use config::Config;
pub use resume_types::{KnownPeer, Memory, OwnedRegistration, PeerMemory, Resume, Resumed};

pub use time::Now;
use time::WallGuard;

/// The service every roster node registers itself under.
pub const MEMBERS_SERVICE: &str = "roster";

/// The most dots a full sync may teach us for us to forward what it taught as a delta;
/// past that, peers are asked for their digests instead.
pub const MAX_FORWARD_DOTS: usize = 100_000;

/// The most own registrations a resuming node writes again in one delta (well within
/// what a peer takes in one, `MAX_DELTA_ENTRIES`).
const RESUME_BATCH: usize = 10_000;

/// The most seed URLs a node keeps (given at start, or learnt from redirects).
pub const MAX_SEEDS: usize = 32;

/// A digest to a peer that has not answered for this long may be sent again; until then,
/// every reason to ask that peer (start-up, a timer, `roster sync`, a repair) shares the
/// one in flight.
pub const DIGEST_COALESCE_MS: u64 = 2_000;

/// The gossip rounds a connection dialed as a seed is kept once the node knows other
/// members (see `release_seed`).
const SEED_SETTLE_ROUNDS: u64 = 5;

/// For this long after its start, a node dials the seeds it has not reached and no known
/// member stands at, even while connected (see `dial_more`).
const SEED_RETRY_MS: u64 = 5 * 60 * 1000;

/// Under the crash-loop guard, a failed dial backs off as if it had failed this many times
/// already: the long backoff (the cap) from the first failure.
const GUARDED_FAILURES: u32 = 8;

/// Under the crash-loop guard, this node's leases are written this many times longer,
/// so a connection now and then keeps what it owns alive (at most 24 h).
const GUARDED_LEASE_FACTOR: u64 = 4;

/// A connection, as the driver numbers it.
pub type ConnId = u64;

/// Who a node is: its replica id, its name, and the URL peers dial.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// The replica id (stable across restarts).
    pub id: ReplicaId,
    /// A human name.
    pub name: String,
    /// Where peers reach it (`ws://host:port` or `wss://host:port`).
    pub url: String,
}

/// What the driver should dial.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum DialTarget {
    /// A member, by id and URL.
    Peer {
        /// Its replica id.
        id: ReplicaId,
        /// Its URL.
        url: String,
    },
    /// A seed URL given at start (its node is not known yet).
    Seed {
        /// The URL.
        url: String,
    },
}

/// Something the driver must do, or report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Send a message on a connection.
    Send {
        /// The connection.
        conn: ConnId,
        /// The message, stamped with our clock.
        envelope: Envelope,
    },
    /// Open a connection (dial, then authenticate); report with `handle_connected` or
    /// `handle_dial_failed`.
    Dial(DialTarget),
    /// Close a connection after sending what is queued on it.
    Close {
        /// The connection.
        conn: ConnId,
        /// Why, for the log.
        reason: String,
    },
    /// What a read shows changed.
    Event(Change),
}

/// Why a message from a peer was refused. The driver closes the connection with this
/// reason; the replica is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// The message or its payload could not be used.
    #[error(transparent)]
    Message(#[from] MessageError),
    /// The peer's clock runs too far ahead.
    #[error(transparent)]
    Skew(#[from] ClockSkew),
    /// A message arrived on a connection the node does not know.
    #[error("message on unknown connection {0}")]
    UnknownConnection(ConnId),
    /// A state it carried was refused by [`Replica::admit`]: it would have retired a live
    /// node, planted a forged or runaway counter, or a time too far ahead. Not joined, not
    /// acknowledged; the connection is closed unless the refusal is transient.
    #[error("refused a state from the peer: {0}")]
    Refused(#[from] Refusal),
}

impl ProtocolError {
    /// Whether the connection is closed for it: every error but a refusal that time can
    /// mend (a write stamped a little ahead of our clock is admitted once it catches up).
    pub fn closes(&self) -> bool {
        !matches!(self, ProtocolError::Refused(r) if r.is_transient())
    }
}

/// How far one peer has come in our delta buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerProgress {
    /// The peer.
    pub peer: ReplicaId,
    /// The last of our delta numbers it acknowledged.
    pub acked: Option<u64>,
    /// The last of our delta numbers sent to it on its current connection.
    pub sent: Option<u64>,
}

/// Counters of what the node did, for `roster status` and the benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Dials asked of the driver.
    pub dials: u64,
    /// Connections established (either direction).
    pub connections: u64,
    /// Messages queued to send.
    pub messages_sent: u64,
    /// Encoded bytes of those messages.
    pub bytes_sent: u64,
    /// Messages handled.
    pub messages_received: u64,
    /// Deltas that taught us something.
    pub deltas_applied: u64,
    /// Elided full states sent.
    pub full_syncs_sent: u64,
    /// Elided full states received.
    pub full_syncs_received: u64,
    /// Messages refused (the connection was closed).
    pub refused: u64,
    /// States (deltas, full states) refused by [`Replica::admit`], closed or not.
    pub states_refused: u64,
    /// Times a peer claimed dots forged under our id and we shipped the truth about them.
    pub forgeries_refuted: u64,
    /// Times another node's write over an instance we own was written over again.
    pub overwrites_repaired: u64,
    /// Digests not sent because one to the same peer was in flight.
    pub digests_coalesced: u64,
    /// Peers found in step by their state hash, so sent no elided state.
    pub equal_states_adopted: u64,
    /// Peers this node wrote dead (see `liveness`).
    pub deaths_written: u64,
    /// Times this node found itself written dead and renewed its lease.
    pub deaths_refuted: u64,
}

#[derive(Debug, Clone)]
struct Conn {
    peer: ReplicaId,
    outbound: bool,
    opened_at: u64,
    /// The seed URL it was dialed as, if any.
    seed: Option<String>,
    /// The last delta number received and not acknowledged yet (see `ack_delay_ms`).
    ack_owed: Option<u64>,
}

/// What we know of another node.
#[derive(Debug, Clone, Default)]
struct Peer {
    /// The last of our buffer's numbers it acknowledged.
    acked: Option<u64>,
    /// The last of our buffer's numbers sent to it on its oldest connection, which carries
    /// all we send it (pushes send only what came after; gossip rounds resend from
    /// `acked`). Cleared when that connection closes (`Node::forget_conn`).
    sent: Option<u64>,
    /// When we last sent it a full state (not again before the ack or a pause); monotonic
    /// ms, like every time kept for a timer.
    full_sent_at: Option<u64>,
    /// When what was sent and not acknowledged may be sent again (see `Config::resend_after_ms`).
    resend_at: Option<u64>,
    /// Resends since its acknowledgement last advanced.
    resends: u32,
    /// Its last digest (boxed: most peers, members never connected, have none).
    digest: Option<Box<CausalContext>>,
    /// Its dial backoff, in monotonic time (saved in wall time).
    backoff: Backoff,
    dialing: bool,
    /// Its URL, kept after it stops being a live member, to try it again later (a
    /// partition that outlived its lease must still heal).
    url: Option<String>,
    /// When we wrote it dead (monotonic ms): for `member_lease_ttl_ms` after, it is still
    /// dialed like a member, under its backoff, so a live node behind a healed cut is
    /// found again as fast as before deaths were written.
    written_dead_at: Option<u64>,
    /// Its name, as last known.
    name: Option<String>,
    /// The URL it advertised when it connected (for people; dials use `url`).
    advertised: Option<String>,
    /// When we sent it a digest it has not answered yet (single flight).
    digest_sent_at: Option<u64>,
    /// Its acknowledgement was taken from its digest (see `adopt_base`), not from an ack:
    /// until it acks, what it is sent is trimmed by that digest.
    adopted: bool,
    /// When it was last a live member or connected.
    last_seen_ms: u64,
}

/// One registration this node owns and keeps alive.
#[derive(Debug, Clone)]
struct Owned {
    endpoint: Endpoint,
    meta: Metadata,
    status: Status,
    since_ms: u64,
    /// When an overwrite of it by another node was last repaired (monotonic ms).
    overwrite_repaired_at: Option<u64>,
}

/// The least time between two repairs of an overwrite of one owned instance by another
/// node: two nodes that both believe they own it (registered at the same moment through
/// two agents) take it from each other at this pace, not in a storm.
const OVERWRITE_REPAIR_MS: u64 = 10_000;

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
    seeds: BTreeMap<String, (Backoff, bool)>,
    /// The seeds a connection reached (whoever answered).
    seeds_reached: BTreeSet<String>,
    /// Until when unreached seeds are dialed even while connected (monotonic ms).
    seed_retry_until: u64,
    owned: BTreeMap<(ServiceName, ProviderId), Owned>,
    /// Peers lost and not heard from since (see `liveness`).
    suspects: BTreeMap<ReplicaId, liveness::Suspicion>,
    push_at: Option<u64>,
    /// When the last push went out (`None`: never).
    pushed_at: Option<u64>,
    pacer: pacing::Pacer,
    /// When the acknowledgements owed go out.
    ack_at: Option<u64>,
    gossip_at: u64,
    digest_at: u64,
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
}

fn member_provider(id: ReplicaId) -> ProviderId {
    match ProviderId::new(&format!("node-{id}")) {
        Ok(p) => p,
        Err(e) => unreachable!("a hex replica id is a valid provider id: {e}"),
    }
}

fn members_service() -> ServiceName {
    match ServiceName::new(MEMBERS_SERVICE) {
        Ok(s) => s,
        Err(e) => unreachable!("the members service name is valid: {e}"),
    }
}

/// The host and port of a `ws://` or `wss://` URL.
///
/// # Errors
/// [`InvalidInput::Endpoint`] when the URL has no host or port.
pub fn url_endpoint(url: &str) -> Result<Endpoint, InvalidInput> {
    let rest = url
        .strip_prefix("ws://")
        .or_else(|| url.strip_prefix("wss://"))
        .unwrap_or(url);
    let authority = rest.split('/').next().unwrap_or(rest);
    Endpoint::parse(authority)
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

    /// A node picking up where a previous process of it left off, before it talks to any
    /// peer (it dials only after): it takes back what that process knew of its peers
    /// (backoffs, so it dials no sooner than the old one would have), writes its own
    /// registrations again (peers see an update, never a removal), removes registrations
    /// it wrote but no longer owns (a removal lost in a crash), and claims the counters
    /// between its saved state and its floor (`Replica::close_gap`) over every key it
    /// could have written.
    ///
    /// # Errors
    /// As [`Node::new`].
    pub fn with_resume(
        me: NodeInfo,
        replica: Replica,
        seeds: impl IntoIterator<Item = String>,
        cfg: Config,
        seed: u64,
        now: impl Into<Now>,
        resume: Resume,
    ) -> Result<(Self, Resumed), InvalidInput> {
        let now: Now = now.into();
        let (mut node, resume) = Self::with_deferred_resume(me, replica, seeds, cfg, seed, now, resume)?;
        let resumed = node.finish_resume(resume, now);
        Ok((node, resumed))
    }

    /// [`Node::with_resume`] without writing its own registrations again yet: a caller
    /// that serves reads from the replica as loaded meanwhile (a restart with 100,000
    /// owned spent about 1.3 s of its 2 s before the first read on that). Gives back the
    /// `resume` for [`Node::finish_resume`], which must come before any other input and
    /// before any output is acted on: the node must not talk to a peer before.
    ///
    /// # Errors
    /// As [`Node::with_resume`].
    pub fn with_deferred_resume(
        me: NodeInfo,
        replica: Replica,
        seeds: impl IntoIterator<Item = String>,
        cfg: Config,
        seed: u64,
        now: impl Into<Now>,
        resume: Resume,
    ) -> Result<(Self, Resume), InvalidInput> {
        let now: Now = now.into();
        let (mut node, resume) = Self::build(me, replica, seeds, cfg, seed, now, resume)?;
        node.dial_more(now);
        Ok((node, resume))
    }

    /// Writes again the registrations `resume` names as owned (see
    /// [`Node::with_deferred_resume`]); its other fields were taken at the start.
    pub fn finish_resume(&mut self, resume: Resume, now: impl Into<Now>) -> Resumed {
        let now = self.time.input(now.into());
        self.resume(resume, now)
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
        let time = WallGuard::new(now);
        let endpoint = url_endpoint(&me.url)?;
        let meta: Metadata = [("url", me.url.as_str()), ("name", me.name.as_str())].into();
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
        let mut node = Self {
            me,
            cfg,
            replica,
            clock: HlcClock::resume_after(last_seen),
            rng,
            buffer: DeltaBuffer::new(cfg.buffer_capacity),
            conns: BTreeMap::new(),
            peers: BTreeMap::new(),
            seeds: seeds
                .into_iter()
                .map(|u| (u, (Backoff::default(), false)))
                .collect(),
            seeds_reached: BTreeSet::new(),
            seed_retry_until: mono + SEED_RETRY_MS,
            owned: BTreeMap::new(),
            suspects: BTreeMap::new(),
            push_at: None,
            pushed_at: None,
            pacer: pacing::Pacer::new(cfg.push_rate, cfg.push_burst, mono),
            ack_at: None,
            gossip_at,
            digest_at,
            renew_at: mono,
            rotate_at,
            reconnect_at: mono + cfg.reconnect_interval_ms,
            expire_from: mono + cfg.expire_holdoff_ms,
            lapse_checked: now.wall_ms,
            outputs: VecDeque::new(),
            counters: Counters::default(),
            stopping: false,
            synced: false,
            guarded: resume.crash_guard,
            guard_dial_at: 0,
            leases_shipped: resume.leases_shipped,
            start_ctx: CausalContext::new(),
            base_valid: true,
            time,
        };
        node.start_ctx = node.replica.context().clone();
        for m in &resume.peers {
            if m.id == node.me.id {
                continue;
            }
            let p = node.peers.entry(m.id).or_default();
            p.url = m.url.clone();
            p.name = m.name.clone();
            // Saved in wall time; kept in monotonic time.
            p.backoff = time.backoff_to_mono(m.backoff);
            p.full_sent_at = m.full_sent_at.map(|t| time.mono_of(t));
            p.last_seen_ms = now.wall_ms;
        }
        for (url, b) in &resume.seeds {
            if let Some(s) = node.seeds.get_mut(url) {
                s.0 = time.backoff_to_mono(*b);
            }
        }
        if node.guarded {
            // What the processes before it shipped is alive at its peers until its lease
            // ends: dial only when a third of it is left (at once when nothing is known).
            let due = node
                .leases_shipped
                .map_or(now.wall_ms, |(end, ttl)| end.saturating_sub(ttl / 3));
            node.guard_dial_at = time.mono_of(due).max(now.mono_ms);
        }
        node.register(
            members_service(),
            member_provider(node.me.id),
            endpoint,
            meta,
            now,
        )?;
        Ok((node, resume))
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
        let connected: BTreeSet<ReplicaId> = self.conns.values().map(|c| c.peer).collect();
        connected
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

    /// The peers with an open connection, and whether we dialed it.
    pub fn connected(&self) -> Vec<(ReplicaId, bool)> {
        self.conns.values().map(|c| (c.peer, c.outbound)).collect()
    }

    /// The live members other than this node, by id, with their URL and name.
    pub fn members(&self, now_ms: u64) -> Vec<(ReplicaId, String, String)> {
        let service = members_service();
        self.replica
            .instances(&service, now_ms)
            .filter_map(|i| {
                let id = i
                    .provider
                    .as_str()
                    .strip_prefix("node-")
                    .and_then(|h| u64::from_str_radix(h, 16).ok())?;
                let id = ReplicaId(id);
                let url = i.registration.meta.get("url")?.to_string();
                let name = i.registration.meta.get("name").unwrap_or_default().to_string();
                (id != self.me.id).then_some((id, url, name))
            })
            .collect()
    }

    /// Registers (or updates) an instance this node owns and keeps alive: it lives by this
    /// node's lease (which the node renews, one renewal for all it owns), and is written
    /// again if a peer's sweep removes it or another node writes over it.
    ///
    /// # Errors
    /// [`InvalidInput`] when the metadata or TTL break a limit; nothing changes.
    pub fn register(
        &mut self,
        service: ServiceName,
        provider: ProviderId,
        endpoint: Endpoint,
        meta: Metadata,
        now: impl Into<Now>,
    ) -> Result<(), InvalidInput> {
        let now = self.time.input(now.into());
        let key = (service, provider);
        let (status, since_ms) = self
            .owned
            .get(&key)
            .map_or((Status::passing(), now.wall_ms), |o| {
                (o.status.clone(), o.since_ms)
            });
        let item = OwnedRegistration {
            service: key.0,
            provider: key.1,
            endpoint,
            meta,
            status,
            since_ms,
        };
        self.register_many(vec![item], now).map_err(|(_, e)| e)
    }

    /// The registry part of [`Node::with_resume`].
    fn resume(&mut self, resume: Resume, now: Now) -> Resumed {
        let mut done = Resumed::default();
        let me = self.me.id;
        let member = (members_service(), member_provider(me));
        let mut keys: BTreeSet<RegKey> = resume.removed.into_iter().collect();
        keys.insert(RegKey {
            service: member.0.clone(),
            provider: member.1.clone(),
        });
        // In bulk: one delta per batch, not one per registration (100,000 one by one took
        // about 2 s before a restarted node served reads).
        let (mut owned, refused): (Vec<_>, Vec<_>) = resume
            .owned
            .into_iter()
            .partition(|o| validate_metadata(&o.meta).is_ok() && o.status.validate().is_ok());
        done.refused = refused.len();
        keys.extend(owned.iter().map(|o| RegKey {
            service: o.service.clone(),
            provider: o.provider.clone(),
        }));
        while !owned.is_empty() {
            let batch: Vec<OwnedRegistration> = owned.drain(..owned.len().min(RESUME_BATCH)).collect();
            let n = batch.len();
            match self.register_many(batch, now) {
                Ok(()) => done.rewritten += n,
                Err(_) => done.refused += n,
            }
        }
        let stale: Vec<RegKey> = if resume.drop_unowned {
            self.replica.state().written_by(me)
        } else {
            Vec::new()
        };
        let stale: Vec<(ServiceName, ProviderId)> = stale
            .into_iter()
            .filter(|k| !self.owned.contains_key(&(k.service.clone(), k.provider.clone())))
            .map(|k| (k.service, k.provider))
            .collect();
        for (s, p) in stale {
            keys.insert(RegKey {
                service: s.clone(),
                provider: p.clone(),
            });
            if self.deregister(&s, &p, now) {
                done.removed += 1;
            }
        }
        // A lease of ours issued after now (by a clock that ran ahead, since fixed) was
        // issued again at now when the membership was registered, before this.
        done.gap = self.replica.unclaimed_gap();
        if let Some(applied) = self.replica.close_gap(keys, now.wall_ms) {
            self.local_delta(applied.delta, applied.changes, now);
        }
        done
    }

    /// Asks a connected peer for an anti-entropy round (a digest exchange) at once.
    /// Returns whether a peer was connected to ask.
    pub fn sync_now(&mut self, now: impl Into<Now>) -> bool {
        let now = self.time.input(now.into());
        match self.random_connected(1, None).pop() {
            Some(p) if !self.stopping => {
                self.send_digest(p, now);
                true
            }
            _ => false,
        }
    }

    /// Turns the crash-loop guard on or off. Under it the node keeps only the essential
    /// work (its own registrations and lease, reads, receiving deltas): at most one
    /// outbound connection, no rotation, the long backoff after a failed dial, and no full
    /// state sent unless a peer asks for one (`NeedFull`).
    pub fn set_crash_guard(&mut self, on: bool, now: impl Into<Now>) {
        let now = self.time.input(now.into());
        self.guarded = on;
        if !on {
            self.dial_more(now);
        }
    }

    /// The TTL of this node's lease: the member lease, or more in a large cluster (see
    /// [`Config::lease_per_member_ms`]), and longer under the crash guard.
    fn lease_ttl(&self, now_ms: u64) -> u64 {
        // The live members this node sees (itself among them), counted without copying
        // their URLs and names: this runs on every registration.
        let seen = self.replica.instances(&members_service(), now_ms).count() as u64;
        let members = seen.max(1).next_power_of_two();
        let ttl_ms = self
            .cfg
            .member_lease_ttl_ms
            .max(members.saturating_mul(self.cfg.lease_per_member_ms))
            .min(roster_registry::MAX_LEASE_TTL_MS);
        if self.guarded {
            ttl_ms
                .saturating_mul(GUARDED_LEASE_FACTOR)
                .min(roster_registry::MAX_LEASE_TTL_MS)
        } else {
            ttl_ms
        }
    }

    /// Whether the crash-loop guard is on.
    pub fn crash_guard(&self) -> bool {
        self.guarded
    }

    /// What this process knows of its peers and seeds, to save for the next one.
    pub fn memory(&self) -> Memory {
        let peers = self
            .peers
            .iter()
            .map(|(id, p)| PeerMemory {
                id: *id,
                url: p.url.clone(),
                name: p.name.clone(),
                // Kept in monotonic time; saved in wall time, by the last input's offset.
                backoff: self.time.backoff_to_wall(p.backoff),
                full_sent_at: p.full_sent_at.map(|t| self.time.wall_of(t)),
            })
            .collect();
        let seeds = self
            .seeds
            .iter()
            .map(|(u, (b, _))| (u.clone(), self.time.backoff_to_wall(*b)))
            .collect();
        Memory {
            peers,
            seeds,
            leases_shipped: self.leases_shipped,
        }
    }

    /// Notes how long connected peers will hold this node's lease (called when it changes
    /// while connected, and when a connection opens: the push ships it).
    pub(super) fn note_leases_shipped(&mut self) {
        if self.conns.is_empty() || self.owned.is_empty() {
            return;
        }
        self.leases_shipped = self
            .replica
            .lease_of(self.me.id)
            .map(|l| (l.deadline_ms(), l.ttl_ms));
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
    /// [`DIGEST_COALESCE_MS`] ago and not answered): every reason to ask shares it.
    pub(super) fn send_digest(&mut self, peer: ReplicaId, now: Now) {
        let in_flight = self
            .peers
            .get(&peer)
            .and_then(|p| p.digest_sent_at)
            .is_some_and(|t| now.mono_ms < t + DIGEST_COALESCE_MS);
        if in_flight {
            self.counters.digests_coalesced += 1;
            return;
        }
        self.peers.entry(peer).or_default().digest_sent_at = Some(now.mono_ms);
        let state = message::state_hash(self.replica.state());
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

    /// Every other node this node knows of: live members, connected peers, and peers it
    /// lost lately.
    pub fn known_peers(&self) -> Vec<KnownPeer> {
        let connected: BTreeSet<ReplicaId> = self.conns.values().map(|c| c.peer).collect();
        self.peers
            .iter()
            .map(|(id, p)| KnownPeer {
                id: *id,
                url: p.url.clone().or_else(|| p.advertised.clone()),
                name: p.name.clone(),
                last_seen_ms: p.last_seen_ms,
                connected: connected.contains(id),
            })
            .collect()
    }

    /// Removes an instance this node owns. Returns whether there was one.
    pub fn deregister(&mut self, service: &ServiceName, provider: &ProviderId, now: impl Into<Now>) -> bool {
        let now = self.time.input(now.into());
        let owned = self.owned.remove(&(service.clone(), provider.clone())).is_some();
        match self
            .replica
            .deregister(service.clone(), provider.clone(), now.wall_ms)
        {
            Some(applied) => {
                self.local_delta(applied.delta, applied.changes, now);
                true
            }
            None => owned,
        }
    }

    pub(super) fn local_delta(&mut self, delta: State, changes: Vec<Change>, now: Now) {
        self.buffer.push(None, delta);
        self.schedule_push(now);
        self.emit_changes(changes, now);
    }

    fn emit_changes(&mut self, changes: Vec<Change>, now: Now) {
        let mut lost = Vec::new();
        for c in changes {
            match &c {
                Change::Down { service, provider } => {
                    if let Some(o) = self.owned.get(&(service.clone(), provider.clone())) {
                        lost.push((service.clone(), provider.clone(), o.clone()));
                    }
                }
                Change::Up(i) if i.node != self.me.id => {
                    let key = (i.service.clone(), i.provider.clone());
                    if let Some(o) = self.owned.get_mut(&key) {
                        let due = o
                            .overwrite_repaired_at
                            .is_none_or(|t| now.mono_ms >= t + OVERWRITE_REPAIR_MS);
                        if due {
                            o.overwrite_repaired_at = Some(now.mono_ms);
                            self.counters.overwrites_repaired += 1;
                            lost.push((key.0, key.1, o.clone()));
                        }
                    }
                }
                Change::Up(_) => {}
            }
            self.outputs.push_back(Output::Event(c));
        }
        // A peer's sweep removed a registration we still hold (its lease looked ended
        // there), or another node wrote over it: write it again. Our own replica is the
        // source of truth for what we own.
        for (s, p, o) in lost {
            if self.stopping {
                break;
            }
            let stamp = self.clock.tick(now.wall_ms);
            let ttl = self.lease_ttl(now.wall_ms);
            let item = NewRegistration {
                service: s,
                provider: p,
                endpoint: o.endpoint,
                meta: o.meta,
                status: o.status,
                since_ms: o.since_ms,
            };
            if let Ok(applied) = self.replica.register_many(vec![item], ttl, stamp) {
                self.buffer.push(None, applied.delta);
                self.schedule_push(now);
                for c in applied.changes {
                    self.outputs.push_back(Output::Event(c));
                }
            }
        }
    }

    /// Pushes are spaced `push_delay` apart and paced to `push_rate`: a delta after a
    /// quiet spell is due at once (the push runs when the driver next asks for timeouts,
    /// so everything the current input made goes in one message); one during a burst
    /// waits for the batch.
    fn schedule_push(&mut self, now: Now) {
        if self.push_at.is_none() {
            let spaced = self.pushed_at.map_or(now.mono_ms, |t| t + self.cfg.push_delay_ms);
            let paced = self.pacer.next_at(now.mono_ms);
            self.push_at = Some(spaced.max(paced).max(now.mono_ms));
        }
    }

    /// Acknowledges delta `seq` from `conn` after `ack_delay_ms`, with whatever else
    /// arrives on it meanwhile: one acknowledgement for a burst.
    fn owe_ack(&mut self, conn: ConnId, seq: u64, now: Now) {
        if let Some(c) = self.conns.get_mut(&conn) {
            c.ack_owed = Some(c.ack_owed.map_or(seq, |s| s.max(seq)));
            self.ack_at.get_or_insert(now.mono_ms + self.cfg.ack_delay_ms);
        }
    }

    fn send_acks(&mut self, now: Now) {
        let owed: Vec<(ConnId, u64)> = self
            .conns
            .iter_mut()
            .filter_map(|(id, c)| c.ack_owed.take().map(|seq| (*id, seq)))
            .collect();
        for (conn, seq) in owed {
            self.send(conn, Message::Ack { seq }, now);
        }
    }

    /// The next output, if any. Call until `None` after every input.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    /// When [`Node::handle_timeout`] should next be called, on the monotonic clock
    /// ([`Now::mono_ms`]): the earliest deadline it serves.
    pub fn poll_timeout(&self) -> u64 {
        let mut t = self
            .gossip_at
            .min(self.digest_at)
            .min(self.renew_at)
            .min(self.reconnect_at)
            .min(self.rotate_at);
        if let Some(p) = self.push_at {
            t = t.min(p);
        }
        if let Some(a) = self.ack_at {
            t = t.min(a);
        }
        if let Some(s) = self.next_suspicion_deadline() {
            t = t.min(s);
        }
        t
    }

    /// Runs whatever timers are due at `now` (on its monotonic clock).
    pub fn handle_timeout(&mut self, now: impl Into<Now>) {
        let now = self.time.input(now.into());
        let mono = now.mono_ms;
        if self.push_at.is_some_and(|t| t <= mono) {
            self.push_at = None;
            self.pushed_at = Some(mono);
            self.pacer.spend(mono);
            self.push(now);
        }
        if self.ack_at.is_some_and(|t| t <= mono) {
            self.ack_at = None;
            self.send_acks(now);
        }
        if self.renew_at <= mono {
            self.renew(now);
        }
        self.run_suspicions(now);
        if self.gossip_at <= mono {
            self.gossip_at = mono + self.jitter(self.cfg.gossip_interval_ms);
            self.gossip(now);
            self.report_lapsed(now);
            self.expire(now);
            self.release_seed(now);
            self.dial_more(now);
        }
        if self.digest_at <= mono {
            self.digest_at = mono + self.jitter(self.cfg.digest_interval_ms);
            if let Some(p) = self.random_connected(1, None).pop() {
                let hash = Message::digest_hash(self.replica.context(), None);
                self.send_to_peer(p, hash, now);
            }
        }
        if self.reconnect_at <= mono {
            self.reconnect_at = mono + self.jitter(self.cfg.reconnect_interval_ms.max(1));
            self.reconnect_lost(now);
        }
        if self.rotate_at <= mono {
            self.rotate_at = mono + self.jitter(self.cfg.rotate_interval_ms.max(1));
            if self.cfg.rotate_interval_ms > 0 {
                self.rotate(now);
            }
        }
    }

    fn jitter(&mut self, d: u64) -> u64 {
        (d * 3 / 4 + self.rng.random_range(0..=d / 2)).max(1)
    }

    /// Renews this node's lease: one small delta for everything it owns.
    fn renew(&mut self, now: Now) {
        let mut next = u64::MAX;
        if !self.owned.is_empty() {
            let stamp = self.clock.tick(now.wall_ms);
            let ttl = self.lease_ttl(now.wall_ms);
            if let Ok(applied) = self.replica.renew(ttl, stamp) {
                self.buffer.push(None, applied.delta);
                self.schedule_push(now);
            }
            next = ttl / 2;
        }
        self.note_leases_shipped();
        // Three eighths to a half of the TTL, drawn anew each time: nodes started
        // together (a fleet rollout, a healed partition) do not renew in lockstep. Half a
        // lease is left for the renewal to arrive: a push takes milliseconds, and a lost
        // one is sent again at the next gossip round. (Renewing every third of the lease
        // cost a third more idle traffic, for margin nobody needed.)
        self.renew_at = match next {
            u64::MAX => u64::MAX,
            half => now.mono_ms + half - self.rng.random_range(0..=half / 4),
        };
    }

    /// Tells watchers of instances whose lease ended since the last check: reads hide them
    /// at once, but no delta says so until a sweep (after the hold-off, and then the join
    /// sees them already hidden).
    fn report_lapsed(&mut self, now: Now) {
        if now.wall_ms <= self.lapse_checked {
            return;
        }
        let lapsed = self.replica.lapsed(self.lapse_checked, now.wall_ms);
        self.lapse_checked = now.wall_ms;
        self.emit_changes(lapsed, now);
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

    fn expire(&mut self, now: Now) {
        if now.mono_ms < self.expire_from {
            return;
        }
        if let Some(applied) = self.replica.expire(now.wall_ms, self.cfg.expire_grace_ms) {
            self.local_delta(applied.delta, applied.changes, now);
        }
    }

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
        let now = self.time.input(now.into());
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

    fn handle(
        &mut self,
        conn: ConnId,
        peer: ReplicaId,
        envelope: Envelope,
        now: Now,
    ) -> Result<(), ProtocolError> {
        self.clock
            .observe(envelope.sent_at, now.wall_ms, self.cfg.max_skew_ms)?;
        self.heard_from(peer);
        match envelope.message {
            Message::Digest { ctx, reply, state } => {
                let theirs = message::decode_digest(&ctx)?;
                self.refute(&theirs, now);
                let ours = self.replica.context().clone();
                let p = self.peers.entry(peer).or_default();
                p.digest = Some(Box::new(theirs.clone()));
                p.digest_sent_at = None;
                // A digest that asks, from a peer in step: answer with the hashes, or it
                // would ask again every repair round (see `on_digest_hash`).
                if let Some(hash) = state {
                    if self.adopt_equal(peer, &theirs, &ours, hash) && !reply {
                        self.send_to_peer(peer, Message::digest_hash(&ours, Some(hash)), now);
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
                            self.sync_peer(peer, false, now)
                        }
                        // Under the crash-loop guard, no full state unless the peer asks.
                        None if self.adopt_base(peer, &theirs) => self.sync_peer(peer, false, now),
                        _ if in_flight || self.guarded => {}
                        _ => self.send_full(peer, &theirs, now),
                    }
                }
                if !reply && !ours.includes(&theirs) {
                    self.send(conn, Message::digest(&ours, true, None), now);
                }
            }
            Message::Delta { seq, delta } => {
                let delta = message::decode_delta(&delta)?;
                self.peers.entry(peer).or_default().digest_sent_at = None;
                self.admit(&delta, now)?;
                self.apply(peer, delta, now);
                self.owe_ack(conn, seq, now);
            }
            Message::Elided { seq, elided } => {
                let elided = message::decode_elided(&elided)?;
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
            }
            Message::Ack { seq } => self.on_ack(peer, seq, now),
            // At most one full state per pause, however often a peer asks: a request of a
            // few bytes must not buy a registry's worth of them each time.
            Message::NeedFull if !self.full_in_flight(peer, now) => {
                self.send_full(peer, &CausalContext::new(), now)
            }
            Message::NeedFull => {}
            Message::Redirect { urls } => {
                // Learn them as seeds (bounded), and come back to this peer later.
                for url in urls {
                    if self.seeds.len() >= MAX_SEEDS {
                        break;
                    }
                    self.seeds.entry(url).or_insert((Backoff::default(), false));
                }
                let draw = self.rng.random::<u64>();
                let policy = self.cfg.backoff;
                let full = Failure::RetryAfter(policy.cap_ms);
                let p = self.peers.entry(peer).or_default();
                p.backoff.fail(&policy, full, now.mono_ms, draw);
                // Dialed as a seed: that address waits too, so we try the others first.
                let seed = self.conns.get(&conn).and_then(|c| c.seed.clone());
                if let Some((b, _)) = seed.and_then(|u| self.seeds.get_mut(&u)) {
                    b.fail(&policy, full, now.mono_ms, draw);
                }
            }
            // The periodic exchange: a digest only when the contexts differ.
            Message::DigestHash { hash, state } => self.on_digest_hash(peer, hash, state, now),
            Message::ProbeReq { node } => self.on_probe_req(peer, node, now),
            Message::ProbeAck { node, connected } => self.on_probe_ack(node, connected),
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

    /// Leaves the cluster gracefully: removes everything this node owns (its membership
    /// too), pushes that to every connected peer at once, and says goodbye. The driver then
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
        let now = self.time.input(now);
        self.stopping = true;
        let mut farewell = None;
        if leave {
            self.owned.clear();
            if let Some(applied) = self.replica.deregister_all(now.wall_ms) {
                farewell = Some(applied.delta.clone());
                self.buffer.push(None, applied.delta);
                for c in applied.changes {
                    self.outputs.push_back(Output::Event(c));
                }
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
