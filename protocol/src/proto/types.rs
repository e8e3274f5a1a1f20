//! What the state machine and its drivers say to each other: connection numbers, who a
//! node is, what to dial, the outputs, why a message was refused, and the counters.

use roster_registry::{Change, ClockSkew, Refusal, ReplicaId};

use crate::message::{Envelope, MessageError};

use super::Zone;

/// A connection, as the driver numbers it.
pub type ConnId = u64;

/// Who a node is: its replica id, its name, the URL peers dial, and its zone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// The replica id (stable across restarts).
    pub id: ReplicaId,
    /// A human name.
    pub name: String,
    /// Where peers reach it (`ws://host:port` or `wss://host:port`).
    pub url: String,
    /// The failure domain it runs in.
    pub zone: Zone,
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
    /// A state it carried was refused by [`Replica::admit`](roster_registry::Replica::admit): it would have retired a live
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
    /// States (deltas, full states) refused by [`Replica::admit`](roster_registry::Replica::admit), closed or not.
    pub states_refused: u64,
    /// Times a peer claimed dots forged under our id and we shipped the truth about them.
    pub forgeries_refuted: u64,
    /// Times another node's write over an instance we own was written over again.
    pub overwrites_repaired: u64,
    /// Digests not sent because one to the same peer was in flight.
    pub digests_coalesced: u64,
    /// Peers found in step by their state hash, so sent no elided state.
    pub equal_states_adopted: u64,
    /// Peers whose state differed from ours with the same context (a removal one side
    /// never joined: see `divergence`), each then sent the other's elided state.
    pub diverged_states: u64,
    /// Peers this node wrote dead (see `liveness`).
    pub deaths_written: u64,
    /// Times this node found itself written dead and renewed its lease.
    pub deaths_refuted: u64,
    /// Times this node's wall clock came back from ahead of its peers' and it wrote what
    /// it owns again at the true time (see `Node::clock_came_back`).
    pub clock_steps_back: u64,
    /// Instances reads stopped showing because their lease ended (not renewed in time).
    pub instances_lapsed: u64,
    /// Pushes on the trees that carried only changes we had (each prunes a link).
    pub duplicate_pushes: u64,
    /// Announcements of changes sent (ids, on links off their trees).
    pub changes_announced: u64,
    /// Changes grafted (asked of an announcer after they did not arrive in time).
    pub changes_grafted: u64,
    /// Dials of a member with no link for one anti-entropy exchange.
    pub exchange_dials: u64,
    /// Rounds of exchanges with members with no link, started because a push waited for
    /// its acknowledgement past `ack_delay_ms` (see `overdue`).
    pub overdue_rounds: u64,
    /// Dials of other members of a zone one of whose members was written dead here, to
    /// tell a cut zone from a death (see `damping`).
    pub zone_test_dials: u64,
    /// Instances of other nodes removed by an operator here (see `force`).
    pub operator_removals: u64,
}
