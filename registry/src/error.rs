//! The core's errors. None of them leaves the replica changed: every check runs before
//! the first write.

/// Input from a client, a flag or a peer broke a rule. Nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidInput {
    /// A service name broke the DNS rules.
    #[error("invalid service name {name:?}: {why}; use 1-253 bytes of [a-z0-9.-] in labels of 1-63 bytes")]
    ServiceName {
        /// The name, shortened and escaped for display.
        name: String,
        /// The rule it broke.
        why: &'static str,
    },
    /// A provider id broke the rules.
    #[error("invalid instance id {id:?}: {why}")]
    ProviderId {
        /// The id, shortened and escaped for display.
        id: String,
        /// The rule it broke.
        why: &'static str,
    },
    /// An endpoint could not be parsed or broke the rules.
    #[error("invalid address {endpoint:?}: {why}")]
    Endpoint {
        /// The endpoint, shortened and escaped for display.
        endpoint: String,
        /// The rule it broke.
        why: &'static str,
    },
    /// Metadata exceeded a limit.
    #[error("metadata too large or malformed: {why}")]
    Metadata {
        /// What was exceeded.
        why: String,
    },
    /// A status was malformed.
    #[error("invalid status: {why}")]
    Status {
        /// What is wrong.
        why: String,
    },
    /// A lease TTL was out of range.
    #[error("lease ttl {ttl_ms} ms is out of range; use 100 ms to 24 h")]
    LeaseTtl {
        /// The TTL asked for.
        ttl_ms: u64,
    },
}

/// Bytes could not be decoded into a registry state. Nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The input was empty.
    #[error("empty input: expected a roster registry encoding")]
    Empty,
    /// The format version byte is not one this build reads.
    #[error("registry encoding version {found} is not supported (this build reads version {supported}); upgrade roster on this node")]
    UnsupportedVersion {
        /// The version found.
        found: u8,
        /// The version this build reads.
        supported: u8,
    },
    /// postcard could not decode the bytes (truncated, or not a registry state).
    #[error("malformed registry encoding: {0}")]
    Malformed(postcard::Error),
    /// The bytes decoded but more followed.
    #[error("{0} unexpected bytes after the registry encoding")]
    TrailingBytes(usize),
    /// The bytes decoded into a value that breaks an invariant of the registry.
    #[error("registry encoding is well-formed but invalid: {0}")]
    Invalid(#[from] InvalidState),
}

/// A decoded state breaks an invariant of the registry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidState {
    /// A value inside broke an input rule.
    #[error(transparent)]
    Input(#[from] InvalidInput),
    /// A dot in the store is not covered by the state's own causal context.
    #[error("dot {0} is in the store but not in the causal context")]
    DotNotInContext(String),
    /// The same dot names two different entries.
    #[error("dot {0} appears under two keys")]
    DuplicateDot(String),
    /// A key is present with no dots (the store keeps no empty keys).
    #[error("empty entry for {0}")]
    EmptyEntry(String),
    /// A stored dot belongs to a replica the context retired.
    #[error("dot {0} is stored but its replica is retired")]
    RetiredDot(String),
    /// A dot has counter 0 (counters start at 1).
    #[error("dot with counter 0 from replica {0}")]
    ZeroCounter(String),
    /// A counter is above [`crate::MAX_COUNTER`]: no node mints that many dots.
    #[error("counter {0} is above the largest a node may mint (2^62)")]
    CounterTooLarge(String),
    /// A node's lease holds a write of another node: only a node renews its own lease.
    #[error("the lease of node {node} holds {dot}, a write of another node")]
    ForeignLease {
        /// The node whose lease it is.
        node: String,
        /// The foreign dot.
        dot: String,
    },
    /// The dot cloud holds a dot the version vector already covers.
    #[error("dot cloud holds {0}, which the version vector already covers")]
    CloudNotCompact(String),
}

/// An elided state could not be joined: it leaves out a value this replica does not hold.
///
/// The sender elided it because our digest said we had seen that dot; we have not (our
/// digest was stale or our disk lost it). Nothing was changed; ask for a full state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("elided state leaves out the value of dot {dot}, which this replica has never seen; request a full state (nothing was changed)")]
pub struct MissingValue {
    /// The dot whose value is missing.
    pub dot: String,
}

/// An elided state could not be rebuilt. Nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ElidedError {
    /// It leaves out a value this replica never had.
    #[error(transparent)]
    Missing(#[from] MissingValue),
    /// The rebuilt state breaks an invariant.
    #[error("elided state is invalid: {0}")]
    Invalid(#[from] InvalidState),
}

/// A replica could not be retired. Nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RetireError {
    /// A replica cannot retire itself.
    #[error("a replica cannot retire itself")]
    Itself,
    /// The store still holds dots the replica minted: its writes are still live here.
    #[error(
        "replica {replica} still has {dots} live entries here; retire it only after its writes are gone"
    )]
    StillHolds {
        /// The replica.
        replica: String,
        /// How many of its dots are stored.
        dots: usize,
    },
    /// Nothing of that replica was ever seen.
    #[error("replica {0} was never seen here; nothing to retire")]
    Unknown(String),
}

/// Two states hold the same dot with different values: a node reused a dot (it lost its
/// disk and its counter floor). Found by `CvRDT::validate_merge`; nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("dot {dot} names two different writes; the node that minted it reused a counter (restore its data directory or give it a new id)")]
pub struct ConflictingDot {
    /// The dot.
    pub dot: String,
}
