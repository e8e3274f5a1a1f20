//! # roster-transport: replication between roster nodes, over WebSockets
//!
//! - [`driver`]: the tokio driver: WebSockets (tokio-tungstenite), the listener, dials,
//!   limits, and graceful shutdown.
//! - The protocol it drives, from `roster-protocol` (a crate of its own, which does no
//!   I/O), under the same names: [`proto`], [`message`], [`buffer`], [`backoff`],
//!   [`handshake`], [`keepalive`], and `sim` (feature `sim`).
//!
//! It depends on `roster-registry` (the pure core) and `roster-protocol`, and is used by
//! the `roster` crate.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod driver;

#[cfg(feature = "sim")]
pub use roster_protocol::sim;
pub use roster_protocol::{backoff, buffer, handshake, keepalive, message, proto};

pub use roster_registry as registry;
