//! roster's integration tests: one test binary, one module per area.
//!
//! Property tests are seeded: each prints its seed on stderr, and `ROSTER_SEED=N`
//! replays one. A failing seed, or the shrunk schedule quickcheck prints, becomes a named
//! regression test in the module it came from.

#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a test failure with a backtrace

/// Shared helpers: seeded runs and the schedule simulator the registry properties use.
mod support;

/// The CRDT laws and the registry's semantic properties, over reachable states.
mod registry_props;

/// What a join forwards and what a peer is sent, over reachable states.
mod registry_deltas;

/// The encoding: round trips, golden vectors, and refusal of bad bytes.
mod registry_codec;

/// Size stays bounded by live services however long the churn.
mod registry_size;

/// Admission against arbitrary (not only reachable) deltas: no poison sticks.
mod registry_hostile;

/// A crashed node resumes under its counter floor and closes the gap.
mod registry_restart;

/// The replication protocol in the deterministic simulator: many nodes, faults, then healing.
mod transport_sim;

/// Pushes and acknowledgements in the simulator.
mod transport_pushes;

/// Changes on per-origin trees: copies per node against the flood, holes repaired.
mod transport_trees;

/// Zones: links that stay in their zone but for a few border nodes, trees that cross each
/// border about once.
mod transport_zones;

/// Damping: a zone cut off is shown unreachable, never removed, and back after the heal.
mod transport_damping;

/// Two nodes driven message by message: acknowledgements across a peer's connections,
/// and dialing a peer again after losing it.
mod transport_pair;

/// One node driven by hand: which peer a free slot goes to, and how long a hanging dial
/// holds it.
mod transport_redial;

/// Lost nodes written dead within seconds; quick restarts never shown gone; refutation.
mod transport_liveness;

/// Real nodes over loopback WebSockets: convergence, authentication, limits.
mod transport_loopback;

/// Large messages between real nodes: chunked states, and chunks that break the rules.
mod transport_chunks;

/// Real nodes over TLS.
mod transport_tls;

/// A hostile peer with the secret sends poisoned deltas; the cluster keeps every live
/// owner's registrations.
mod hostile_peer;

/// Real nodes at the edges of their links: silent links found dead and redialed, and
/// connections that never authenticate kept to a few per address.
mod transport_links;

/// The embedded `roster::Node` API: register, lookup, watch, resume, client authentication.
mod node_api;

/// Golden vectors of every format that crosses a process boundary.
mod wire_golden;

/// A watch through an agent that goes on across the agent's restart.
mod remote_watch;

/// The replica saved entry by entry loads as it was saved, whatever the changes and crashes.
mod store_props;

/// Peer-learnt changes saved in groups and own writes committed before their answer: a
/// restart loads no dot without its data, and every acknowledged own write.
mod store_groups;

/// The restart-economy rules: resume with deltas, single flight, saved backoff, spread
/// reconnects, idle quiet, off switches.
mod restart_economy;
