//! # roster-protocol: replication between roster nodes, without I/O
//!
//! - [`proto`]: the replication protocol as a state machine that performs no I/O: inputs
//!   in, outputs (messages, dials, closes, events) out, time and randomness passed in.
//! - [`message`]: the messages nodes exchange and their encoding.
//! - [`buffer`]: the numbered buffer of recent deltas each peer is brought up to date from.
//! - [`backoff`]: the retry policy every retry uses (exponential, jittered, capped).
//! - `sim` (feature `sim`, for tests and benchmarks): a deterministic simulator that drives
//!   many nodes through faults in one thread.
//! - [`handshake`]: how two nodes authenticate each other (a challenge-response over the
//!   cluster secret) before any protocol message.
//! - [`keepalive`]: when a quiet link is pinged, and when a silent one is dead.
//!
//! It depends on `roster-registry` (the pure core) and nothing that does I/O, reads a clock
//! or draws entropy (`.ci/check-pure-core` checks its dependency tree). The tokio driver
//! that runs it over WebSockets is `roster-transport`.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod backoff;
pub mod buffer;
pub mod handshake;
pub mod keepalive;
pub mod message;
pub mod proto;
#[cfg(feature = "sim")]
pub mod sim;

pub use roster_registry as registry;
