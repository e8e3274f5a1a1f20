//! What a node carries across restarts: what it resumes from, what it saves for the next
//! process, and what it reports of its peers.

use std::sync::Arc;

use roster_registry::{NewRegistration, RegKey, ReplicaId};

use crate::backoff::Backoff;

/// A registration a node owns: what it writes, and writes again when it resumes (the
/// registry's [`NewRegistration`]: service, provider, endpoint, metadata, status, and when
/// it was first registered).
pub type OwnedRegistration = NewRegistration;

/// What a node resuming from disk must write again and may have written before it
/// stopped (see [`super::Node::finish_resume`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resume {
    /// The registrations it owns (shared: the node keeps these, not copies).
    pub owned: Vec<Arc<OwnedRegistration>>,
    /// Keys it owned lately and removed: a removal lost in a crash is redone.
    pub removed: Vec<RegKey>,
    /// Whether `owned` is the whole truth: registrations in the replica written by this
    /// node and not in `owned` are removed (a removal lost in a crash). `false` for a
    /// replica built by hand.
    pub drop_unowned: bool,
    /// What the previous process knew of its peers: backoffs, URLs, last full syncs.
    pub peers: Vec<PeerMemory>,
    /// The backoff of each seed URL.
    pub seeds: Vec<(String, Backoff)>,
    /// Start under this crash-loop guard (see [`super::Node::set_crash_guard`]); `None`:
    /// not under it.
    pub crash_guard: Option<super::CrashGuard>,
    /// [`Memory::leases_shipped`] of the process before.
    pub leases_shipped: Option<(u64, u64)>,
}

/// What a node saves for the process after it: its peers, its seeds, and how long its
/// peers hold its leases.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Memory {
    /// What it knew of each peer.
    pub peers: Vec<PeerMemory>,
    /// The backoff of each seed URL.
    pub seeds: Vec<(String, Backoff)>,
    /// The earliest end (wall ms) and the TTL of the leases it owns, as last shipped to a
    /// connected peer: until then its registrations are alive at its peers.
    pub leases_shipped: Option<(u64, u64)>,
}

/// What a node remembers of a peer across restarts, so a new process does not dial it
/// sooner, or send it a full state sooner, than the old one would have.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PeerMemory {
    /// The peer.
    pub id: ReplicaId,
    /// Its URL, if known.
    pub url: Option<String>,
    /// Its name, if known.
    pub name: Option<String>,
    /// Its dial backoff.
    pub backoff: Backoff,
    /// When a full state was last sent to it (wall ms).
    pub full_sent_at: Option<u64>,
}

/// What [`super::Node::finish_resume`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resumed {
    /// Own registrations written again.
    pub rewritten: usize,
    /// Own registrations the replica held as they were saved, after a stop (not a crash)
    /// within the lease: not written again.
    pub kept: usize,
    /// Own registrations that could not be written again (a limit changed); skipped.
    pub refused: usize,
    /// Registrations written by this node that it no longer owns, removed.
    pub removed: usize,
    /// Counters under the floor claimed (see `Replica::close_gap`).
    pub gap: u64,
}

/// A node this node knows of, for `roster members`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownPeer {
    /// Its id.
    pub id: ReplicaId,
    /// Its last known URL.
    pub url: Option<String>,
    /// Its last known name.
    pub name: Option<String>,
    /// When it was last a live member or connected (wall ms).
    pub last_seen_ms: u64,
    /// Whether a connection to it is open.
    pub connected: bool,
}
