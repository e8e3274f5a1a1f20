//! # roster-registry: the replicated core of roster
//!
//! roster is a replicated service registry. This crate is its heart, and does no I/O: a
//! **delta-state OR-map** in which each provider owns one **last-writer-wins register per
//! service**, plus one **lease** per provider that all its registrations share.
//!
//! - [`State`] is a replica's state and also a delta; [`State::join`] is the only way data
//!   moves between replicas. Join is idempotent, commutative and associative.
//! - [`Replica`] wraps a state with the node's id and offers the mutators
//!   ([`Replica::register`], [`Replica::renew`], [`Replica::deregister`],
//!   [`Replica::expire`]) and the reads ([`Replica::instances`], [`Replica::services`],
//!   [`Replica::explain`]).
//! - [`codec`] encodes states with postcard behind a format version byte.
//!
//! Time comes in as parameters (`now`, as wall milliseconds or an [`Hlc`]); the crate reads
//! no clock, opens no socket, and draws no random number. See `docs/design.md` for the
//! invariants and why they hold.
//!
//! ```
//! use roster_registry::{Endpoint, Hlc, ProviderId, Replica, ReplicaId, ServiceName};
//!
//! let mut a = Replica::new(ReplicaId(1));
//! let mut b = Replica::new(ReplicaId(2));
//! let web = ServiceName::new("web")?;
//! let now = Hlc::new(1_000, 0);
//! let applied = a.register(web.clone(), ProviderId::new("web-1")?, Endpoint::parse("10.0.0.7:8080")?,
//!                          Default::default(), 30_000, now)?;
//! b.apply(applied.delta, 1_000);                       // what the network would carry
//! assert_eq!(b.instances(&web, 1_001).count(), 1);
//! assert_eq!(b.instances(&web, 31_000).count(), 0);    // the lease ended
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod admit;
pub mod codec;
mod context;
mod dotfun;
mod endpoint;
mod error;
mod hlc;
mod id;
mod meta;
mod persist;
mod regstore;
mod replica;
mod state;
mod status;
mod value;

pub use admit::{Bounds, Refusal};
pub use context::{CausalContext, Retirement, MAX_COUNTER};
pub use endpoint::{Endpoint, MAX_HOST_LEN};
pub use error::{
    ConflictingDot, DecodeError, ElidedError, InvalidInput, InvalidState, MissingValue, RetireError,
};
pub use hlc::{ClockSkew, Hlc, HlcClock, MAX_MILLIS};
pub use id::{
    dot, is_printable, Dot, ProviderId, RegKey, ReplicaId, ServiceName, MAX_LABEL_LEN, MAX_PROVIDER_ID_LEN,
    MAX_SERVICE_NAME_LEN,
};
pub use meta::Metadata;
pub use persist::{ChangedKeys, EntryLoader};
pub use regstore::Registrations;
pub use replica::{Applied, Change, Instance, InstanceRef, NewRegistration, Provenance, Replica};
pub use state::{Elided, JoinReport, State};
pub use status::{Health, Status, MAX_NOTE_LEN};
pub use value::{
    metadata_from_pairs, validate_metadata, Lease, Registration, FAREWELL_KEPT_MS, MAX_LEASE_TTL_MS,
    MAX_META_BYTES, MAX_META_KEY_LEN, MAX_META_PAIRS, MIN_LEASE_TTL_MS,
};
