//! The client protocol: what `roster` commands (and other tools) say to an agent.
//!
//! A client opens a WebSocket to the agent's listener with the subprotocol
//! [`CLIENT_SUBPROTOCOL`]. Every message is one binary frame: a version byte
//! ([`CLIENT_PROTOCOL_VERSION`]) and a postcard-encoded value.
//!
//! 1. The agent speaks first: [`ServerHello`] (its node, a fresh nonce, and whether the
//!    client must prove the cluster secret: it must when the agent has a secret and the
//!    client is not on loopback).
//! 2. When asked to, and always when it holds the secret, the client sends
//!    [`ClientMessage::Auth`]: its own nonce and
//!    `HMAC(secret, "roster client v1", server nonce, client nonce)`. Only if that proof is
//!    right does the agent answer [`ServerMessage::AuthOk`] with its own proof over the same
//!    nonces, which the client checks: a client that holds the secret never trusts an agent
//!    that cannot prove it, and a client without it never gets a proof to guess against.
//!    An agent without a secret answers an `Auth` with an error.
//! 3. The client sends one [`Request`]; the agent answers with one [`ServerMessage`], or,
//!    for [`Request::Watch`], a stream of them until either side closes.

use serde::{Deserialize, Serialize};

use crate::check::Check;

/// The WebSocket subprotocol of clients (the CLI, tools). The agent registers it with the
/// transport, which hands over each connection that asks for it after the upgrade.
pub const CLIENT_SUBPROTOCOL: &str = "roster.client.v1";
/// The version byte every client-protocol message starts with.
pub const CLIENT_PROTOCOL_VERSION: u8 = 5;
/// The nonce length of the client authentication.
pub const NONCE_LEN: usize = 32;
/// The label of the client's proof.
pub const CLIENT_LABEL: &[u8] = b"roster client v1";
/// The label of the agent's proof.
pub const AGENT_LABEL: &[u8] = b"roster agent v1";
/// The largest request an agent reads (one frame), but for a batch.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;
/// The largest batch request ([`Request::RegisterMany`]) an agent reads (one frame): the
/// WebSocket message size the transport accepts (1 MiB). A batch also holds at most
/// [`crate::MAX_BATCH_ITEMS`] items; a client splits a larger deploy into batches.
pub const MAX_BATCH_REQUEST_BYTES: usize = 1 << 20;
/// The largest answer a client reads.
pub const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;

/// The agent's first message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerHello {
    /// The agent's node id (16 hex digits).
    pub node: String,
    /// The agent's node name.
    pub name: String,
    /// A fresh nonce for the authentication.
    pub nonce: [u8; NONCE_LEN],
    /// Whether the client must prove the cluster secret.
    pub auth_required: bool,
}

/// What a client sends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClientMessage {
    /// Proof of the cluster secret.
    Auth {
        /// The client's nonce.
        nonce: [u8; NONCE_LEN],
        /// `HMAC(secret, CLIENT_LABEL, server nonce, client nonce)`.
        proof: [u8; 32],
    },
    /// A request.
    Request(Request),
}

/// A request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// Register (or update) an instance the agent owns and renews.
    Register {
        /// The service.
        service: String,
        /// `host:port`.
        address: String,
        /// Metadata pairs.
        meta: Vec<(String, String)>,
        /// The instance id; `None`: the agent's default for the service.
        instance: Option<String>,
        /// End it after this long without another `Register`; `None`: never.
        ttl_ms: Option<u64>,
        /// Its health checks, run by the agent.
        checks: Vec<Check>,
    },
    /// Remove an instance the agent owns.
    Deregister {
        /// The service.
        service: String,
        /// The instance id.
        instance: String,
    },
    /// Services and their live instance counts.
    Services,
    /// The served (passing or warning) instances of a service.
    Instances {
        /// The service.
        service: String,
        /// Every live instance, whatever its status.
        all: bool,
        /// Put first the instances owned by nodes of this zone ([`crate::NEAR_AGENT`]:
        /// the agent's); `None`: by id only.
        near: Option<String>,
    },
    /// The served instances of a service, then changes as they happen.
    Watch {
        /// The service.
        service: String,
        /// Every live instance, whatever its status.
        all: bool,
    },
    /// The nodes of the cluster.
    Members,
    /// This agent.
    Status,
    /// Where a registration came from.
    Explain {
        /// The service.
        service: String,
        /// The instance id.
        instance: String,
    },
    /// An anti-entropy round now (throttled).
    Sync,
    /// Register (or update) many instances the agent owns and renews, all or none: one
    /// write to the replica, one delta to peers, one commit on disk. At most
    /// [`crate::MAX_BATCH_ITEMS`] items and [`MAX_BATCH_REQUEST_BYTES`] bytes; a bad item
    /// refuses the batch with an error naming it (`item 17: ...`, from 0).
    RegisterMany {
        /// The instances, each as a [`Request::Register`] names one.
        items: Vec<RegisterItem>,
    },
    /// Leave the cluster and stop the agent: its registrations are removed everywhere at
    /// once (they stay on its disk, and come back if it is started again). Answered with
    /// [`ServerMessage::Left`] before the agent leaves.
    Leave,
    /// A watch that picks up where an earlier one left off: the agent first sends what
    /// differs from `known` (an `Up` for each instance new or changed, a `Down` for each
    /// one gone), then every change, as [`Request::Watch`] does. With `known` empty it is a
    /// `Watch`. At most [`MAX_BATCH_REQUEST_BYTES`] bytes.
    WatchFrom {
        /// The service.
        service: String,
        /// The instances the client shows, each with the [`fingerprint`] of what it shows.
        known: Vec<(String, u64)>,
        /// Every live instance, whatever its status.
        all: bool,
    },
    /// A TTL check's pass: the instance is alive (`roster pass`). Moves a deadline on the
    /// agent only: no write, no event, unless the instance was critical.
    Pass {
        /// The service.
        service: String,
        /// The instance id.
        instance: String,
    },
    /// Takes instances of this agent out of reads without deregistering them, or puts
    /// them back (`roster maint`).
    Maintenance {
        /// One instance (service, instance id); `None`: every instance the agent owns.
        instance: Option<(String, String)>,
        /// Why, shown with the instance; `None`: put them back in service.
        reason: Option<String>,
    },
    /// Writes a live member dead for every replica (`roster force-leave`): its
    /// registrations leave every read at once. Refused for a node that answers (this agent,
    /// or one connected to it). Answered with [`ServerMessage::ForcedLeave`].
    ForceLeave {
        /// Its name, or its id (16 hex digits).
        node: String,
    },
    /// Removes an instance whatever node owns it (`roster deregister --any-owner`): an
    /// operator's exception to the owner check of [`Request::Deregister`], logged and
    /// counted by the agent. Answered with [`ServerMessage::Deregistered`].
    RemoveAsOperator {
        /// The service.
        service: String,
        /// The instance id.
        instance: String,
    },
}

/// What a watcher shows of an instance, in 8 bytes: the first 8 bytes of SHA-256 over
/// its address, metadata, status and note, postcard-encoded. Stable across versions and
/// platforms, so a client and an agent compute the same.
pub fn fingerprint(i: &InstanceView) -> u64 {
    use sha2::Digest;
    let bytes = postcard::to_stdvec(&(&i.address, &i.meta, &i.status, &i.note)).unwrap_or_default();
    let digest = sha2::Sha256::digest(&bytes);
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(first)
}

/// One instance of a [`Request::RegisterMany`]: the fields of a [`Request::Register`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterItem {
    /// The service.
    pub service: String,
    /// `host:port`.
    pub address: String,
    /// Metadata pairs.
    pub meta: Vec<(String, String)>,
    /// The instance id; `None`: the agent's default for the service.
    pub instance: Option<String>,
    /// End it after this long without another registration; `None`: never.
    pub ttl_ms: Option<u64>,
    /// Its health checks.
    pub checks: Vec<Check>,
}

/// One item of a batch, asked alone.
impl From<RegisterItem> for Request {
    fn from(i: RegisterItem) -> Self {
        Request::Register {
            service: i.service,
            address: i.address,
            meta: i.meta,
            instance: i.instance,
            ttl_ms: i.ttl_ms,
            checks: i.checks,
        }
    }
}

/// One live instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceView {
    /// The service.
    pub service: String,
    /// The instance id.
    pub instance: String,
    /// `host:port`.
    pub address: String,
    /// Metadata.
    pub meta: Vec<(String, String)>,
    /// `passing`, `warning`, `critical` or `maintenance`; `unreachable` for an instance of
    /// a node of a zone judged cut off.
    pub status: String,
    /// Why (a check's output, a maintenance reason); empty when there is nothing to say.
    pub note: String,
    /// The node that wrote it (16 hex digits).
    pub node: String,
    /// When it was first registered (wall ms), kept across updates and restarts.
    pub registered_at_ms: u64,
    /// When its lease ends unless renewed (wall ms).
    pub lease_expires_at_ms: u64,
}

/// A change seen by a watch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventView {
    /// The instance is up (new, or updated).
    Up(InstanceView),
    /// Only the instance's status (or note) changed.
    Status(InstanceView),
    /// The instance is down (deregistered, or its lease ended).
    Down {
        /// The service.
        service: String,
        /// The instance id.
        instance: String,
    },
}

/// One node of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberView {
    /// Its id (16 hex digits).
    pub node: String,
    /// Its name.
    pub name: String,
    /// Its URL.
    pub address: String,
    /// Its zone (`default` when it set none); `None` (JSON `null`) for a node gone.
    pub zone: Option<String>,
    /// `alive`, `suspect` (its renewal is late), `left` (it left the cluster) or `failed`
    /// (it was written dead, or its lease ended).
    pub state: String,
    /// Milliseconds since it was last heard of.
    pub last_heard_ms: u64,
    /// Milliseconds its membership lease has left unless renewed; `None` (JSON `null`)
    /// for a node that left or failed.
    pub lease_left_ms: Option<u64>,
    /// Milliseconds since this agent last exchanged state with it directly (took a
    /// change, an acknowledgement, a digest or a state hash from it over a connection);
    /// `None` for the agent itself and for a node it has had no connection with since it
    /// started.
    pub synced_ms: Option<u64>,
}

/// A connected peer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerView {
    /// Its id.
    pub node: String,
    /// Its name, if it is a live member.
    pub name: String,
    /// Its URL, if known.
    pub address: String,
    /// `outbound` (we dialed) or `inbound`.
    pub direction: String,
}

/// What the node has done since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CountersView {
    /// Dials made.
    pub connections_opened: u64,
    /// Inbound connections from peers accepted (clients not counted).
    pub connections_accepted: u64,
    /// WebSocket frames sent to peers.
    pub frames_sent: u64,
    /// Their bytes.
    pub bytes_sent: u64,
    /// WebSocket frames received from peers.
    pub frames_received: u64,
    /// Their bytes.
    pub bytes_received: u64,
    /// Deltas that taught this node something.
    pub deltas_applied: u64,
    /// Full states sent.
    pub full_syncs_sent: u64,
    /// Full states received.
    pub full_syncs_received: u64,
    /// States from peers refused before they were joined (a retirement of a live node, a
    /// runaway counter, a time too far ahead).
    pub states_refused: u64,
    /// Times peers claimed writes forged under this node's id, or retired it, and the node
    /// answered with the truth about its writes.
    pub forgeries_refuted: u64,
    /// Times another node wrote over an instance this node owns and it wrote it again.
    pub overwrites_repaired: u64,
    /// Peers this node lost, found unreachable by the peers it asked, and wrote dead.
    #[serde(default)]
    pub deaths_written: u64,
    /// Times this node found itself written dead and renewed its lease.
    #[serde(default)]
    pub deaths_refuted: u64,
    /// Instances of other nodes an operator removed through this agent.
    #[serde(default)]
    pub operator_removals: u64,
    /// Times this node's wall clock came back from ahead of its peers' and it wrote what
    /// it owns again at the true time.
    #[serde(default)]
    pub clock_steps_back: u64,
}

/// This agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusView {
    /// Its id.
    pub node: String,
    /// Its name.
    pub name: String,
    /// Its URL.
    pub address: String,
    /// Its zone (`default` when it set none).
    pub zone: String,
    /// The roster version.
    pub version: String,
    /// Milliseconds since it started.
    pub uptime_ms: u64,
    /// Connected peers.
    pub peers: Vec<PeerView>,
    /// Launches within the crash-guard window (5 minutes when the guard is off).
    pub launches_recent: u64,
    /// Whether the crash-loop guard is on.
    pub crash_guard: bool,
    /// Its data directory, if it has one.
    pub data_dir: Option<String>,
    /// Live services and instances in its replica.
    pub services: u64,
    /// Live instances in its replica.
    pub instances: u64,
    /// Counters.
    pub counters: CountersView,
    /// `None` while the data directory can be written; after a write failed, since when,
    /// the last error and when the agent tries again.
    pub store: Option<StoreView>,
    /// Whether it has caught up with a peer since it started (or has no `--join` seeds);
    /// false while no seed could be reached.
    #[serde(default)]
    pub synced: bool,
}

/// A data directory that cannot be written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreView {
    /// When writes started to fail (wall ms).
    pub since_ms: u64,
    /// The last error.
    pub last_error: String,
    /// Failures since then.
    pub failures: u32,
    /// When the agent next tries to reopen the file (wall ms).
    pub next_retry_ms: u64,
}

/// One write a register holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteView {
    /// The dot, `node:counter`.
    pub dot: String,
    /// The node that wrote it.
    pub node: String,
    /// That node's name, if it is a member.
    pub node_name: String,
    /// The hybrid logical time of the write: wall ms.
    pub written_ms: u64,
    /// And its logical counter.
    pub written_logical: u16,
    /// `host:port`.
    pub address: String,
    /// The dot of the lease it was written under.
    pub lease_dot: String,
}

/// Where a registration came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExplainView {
    /// The service.
    pub service: String,
    /// The instance.
    pub instance: String,
    /// Whether a read shows it now.
    pub live: bool,
    /// The winning write's dot.
    pub winner: Option<String>,
    /// Every write the register holds.
    pub writes: Vec<WriteView>,
    /// The provider's lease: its dot, when it was issued (wall ms) and when it ends.
    pub lease: Option<(String, u64, u64)>,
    /// Peers whose last digest holds the winning write.
    pub acknowledged_by: Vec<String>,
}

/// Why a request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorKind {
    /// Nothing by that name.
    NotFound,
    /// The request broke a rule (a name, an address, a limit).
    Invalid,
    /// Throttled: try again later.
    Throttled,
    /// The agent could not do it.
    Failed,
    /// Authentication failed.
    Unauthorized,
}

/// What an agent sends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServerMessage {
    /// The first message.
    Hello(ServerHello),
    /// The client's proof was right; the agent's own proof.
    AuthOk {
        /// `HMAC(secret, AGENT_LABEL, server nonce, client nonce)`.
        proof: [u8; 32],
    },
    /// The request failed; nothing changed.
    Error {
        /// Why.
        kind: ErrorKind,
        /// One line saying what to do.
        message: String,
        /// For [`ErrorKind::Throttled`]: when to try again, in milliseconds.
        retry_after_ms: Option<u64>,
    },
    /// Registered: the instance id.
    Registered {
        /// The instance id.
        instance: String,
    },
    /// Deregistered.
    Deregistered,
    /// Services and live instance counts.
    Services(Vec<(String, u64)>),
    /// Live instances.
    Instances(Vec<InstanceView>),
    /// A watch's change.
    Event(EventView),
    /// Members.
    Members(Vec<MemberView>),
    /// Status.
    Status(Box<StatusView>),
    /// Provenance.
    Explain(Box<ExplainView>),
    /// A sync was asked of a peer (`false`: no peer was connected).
    Synced {
        /// Whether a peer was asked.
        asked: bool,
    },
    /// A batch registered: the instance ids, in the order of the items.
    RegisteredMany {
        /// The instance ids.
        instances: Vec<String>,
    },
    /// The agent is leaving the cluster and stopping (the answer to [`Request::Leave`]).
    Left,
    /// A pass was taken.
    Passed,
    /// Maintenance set or cleared: the instances whose status changed, as `service/id`.
    Maintenance {
        /// The instances.
        changed: Vec<String>,
    },
    /// A member was written dead (the answer to [`Request::ForceLeave`]).
    ForcedLeave {
        /// Its id.
        node: String,
    },
}

impl ServerMessage {
    /// What kind of message it is, in a word or two (for error messages).
    pub fn name(&self) -> &'static str {
        match self {
            Self::Hello(_) => "a hello",
            Self::AuthOk { .. } => "a proof",
            Self::Error { .. } => "an error",
            Self::Registered { .. } => "registered",
            Self::Deregistered => "deregistered",
            Self::Services(_) => "services",
            Self::Instances(_) => "instances",
            Self::Event(_) => "an event",
            Self::Members(_) => "members",
            Self::Status(_) => "a status",
            Self::Explain(_) => "an explanation",
            Self::Synced { .. } => "synced",
            Self::RegisteredMany { .. } => "registered many",
            Self::Left => "left",
            Self::Passed => "passed",
            Self::Maintenance { .. } => "maintenance",
            Self::ForcedLeave { .. } => "forced leave",
        }
    }
}

/// Why bytes are not a message.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// Empty.
    #[error("an empty message")]
    Empty,
    /// Another protocol version.
    #[error("client protocol version {0}, this roster speaks {CLIENT_PROTOCOL_VERSION}; use the same roster version on both sides")]
    Version(u8),
    /// Not a message.
    #[error("a malformed message: {0}")]
    Malformed(String),
}

/// Splits an agent's error about one item of a batch (`item 17: why`) into the item's
/// index (from 0) and why; `None` for an error about the whole request.
pub fn item_error(message: &str) -> Option<(usize, &str)> {
    let rest = message.strip_prefix("item ")?;
    let (n, why) = rest.split_once(": ")?;
    Some((n.parse().ok()?, why))
}

/// Encodes a message: the version byte, then postcard.
pub fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    // Sized first: one allocation, where encoding apart and growing from empty took one
    // per doubling and a copy. Postcard fails only for types serde cannot describe; ours
    // are plain data.
    let size = postcard::experimental::serialized_size(msg).unwrap_or(0);
    let mut out = Vec::with_capacity(1 + size);
    out.push(CLIENT_PROTOCOL_VERSION);
    postcard::to_extend(msg, out).unwrap_or_else(|_| vec![CLIENT_PROTOCOL_VERSION])
}

/// Decodes a message, refusing another version and trailing bytes.
///
/// # Errors
/// [`WireError`].
pub fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, WireError> {
    let (&v, body) = bytes.split_first().ok_or(WireError::Empty)?;
    if v != CLIENT_PROTOCOL_VERSION {
        return Err(WireError::Version(v));
    }
    let (msg, rest) = postcard::take_from_bytes(body).map_err(|e| WireError::Malformed(e.to_string()))?;
    if !rest.is_empty() {
        return Err(WireError::Malformed(format!("{} trailing bytes", rest.len())));
    }
    Ok(msg)
}
