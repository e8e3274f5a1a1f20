//! # roster-transport: replication between roster nodes
//!
//! This crate will hold roster's replication protocol: a sans-I/O state machine that decides
//! which deltas go to which peers, and a thin tokio driver that moves its bytes over
//! WebSockets. It depends on `roster-registry` (the pure core) and is used by the `roster`
//! crate (the agent, the embedded API and the CLI).
//!
//! Nothing is here yet: the protocol is the subject of the next piece of work (see
//! `docs/design.md`, "Replication").
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub use roster_registry as registry;
