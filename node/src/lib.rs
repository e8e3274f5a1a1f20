//! roster: a replicated service registry you embed.
//!
//! A service starts a [`Node`], registers itself, and finds others from its local replica:
//!
//! ```no_run
//! # async fn run() -> Result<(), roster::Error> {
//! use roster::{Node, Service};
//!
//! let node = Node::builder()
//!     .listen("127.0.0.1:0")
//!     .join(["ws://127.0.0.1:7420"])
//!     .data_dir("/var/lib/myservice/roster")
//!     .start()
//!     .await?;
//! let reg = node.register(Service::new("web", "10.0.0.7:8080").meta("zone", "a")).await?;
//! let dbs = node.lookup("db"); // the local replica: no network
//! let mut changes = node.watch("db"); // a Stream of up/down events, pushed
//! # let _ = (dbs, changes.recv().await);
//! reg.deregister().await?; // dropping the handle deregisters too
//! node.shutdown().await?; // deregister what it owns, tell peers, flush, save
//! # Ok(()) }
//! ```
//!
//! Operators run the same node as `roster agent` and query it with the `roster` CLI,
//! which speaks the client protocol of [`api`] through [`client::Client`].
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod api;
pub mod check;
pub mod client;
mod node;
mod server;
pub mod store;

pub use check::Check;
pub use node::{
    check_ttl, Changes, CrashGuard, Damping, Error, Event, Instance, Member, MemberState, Node, NodeBuilder,
    RegistrationHandle, Service, StatusCounts, Watch, DEFAULT_AGENT_URL, DEFAULT_CLUSTER,
    DEFAULT_CRASH_GUARD, DEFAULT_LEASE_TTL, DEFAULT_LISTEN, DEFAULT_SYNC_MIN_INTERVAL, MAX_BATCH_ITEMS,
    MAX_REGISTRATION_TTL, MIN_REGISTRATION_TTL, NEAR_AGENT, UNREACHABLE,
};
pub use roster_registry as registry;
pub use roster_transport as transport;
pub use roster_transport::proto::{InvalidZone, Zone};
