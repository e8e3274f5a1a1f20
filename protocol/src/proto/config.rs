//! The protocol's knobs and their defaults.

use roster_registry::Bounds;

use crate::backoff::BackoffPolicy;

/// How a change travels to every node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Dissemination {
    /// On every connection to every peer that lacks it: each node receives it about once
    /// per connection it holds.
    Flood,
    /// On per-origin trees (see `proto/tree.rs`): pushed on the links of its root's tree,
    /// announced on the others, grafted where a tree has a hole. About one copy per node.
    #[default]
    Tree,
}

/// The protocol's knobs. Durations in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Peers each gossip round goes to (a push goes to every connected peer that lacks
    /// it).
    pub fanout: usize,
    /// The gossip tick (jittered ±25%).
    pub gossip_interval_ms: u64,
    /// The anti-entropy exchange with a random member (jittered ±25%).
    pub digest_interval_ms: u64,
    /// The least time between two dials of a member with no link for that exchange,
    /// scaled up past 32 members (see `anti_entropy`); 0: members with no link are not
    /// dialed for it.
    pub sync_dial_interval_ms: u64,
    /// The least time between two pushes: the first new delta after a quiet spell goes at
    /// once (after the input that made it), later ones wait to be batched into one push.
    pub push_delay_ms: u64,
    /// The most pushes a second, on average (see `pacing`): writes that come faster travel
    /// together, joined into one delta per push, so a peer's frame limit is never reached
    /// by a burst of writes.
    pub push_rate: u32,
    /// Pushes that may go at once, after a quiet spell, above `push_rate`.
    pub push_burst: u32,
    /// How long an acknowledgement waits for the next deltas from the same connection, so
    /// one acknowledges them all. Acknowledgements only trim what a peer is resent (after
    /// `resend_after_ms`), so they may wait long: under churn each is a packet on every
    /// link a change crosses.
    pub ack_delay_ms: u64,
    /// The most outbound connections.
    pub max_outbound: usize,
    /// How long a dial holds its outbound slot: one that has not connected by then (a
    /// handshake hanging across a silent partition) no longer keeps another peer from
    /// being dialed, up to twice `max_outbound` dials at once. 0: a dial holds its slot
    /// until it ends.
    pub dial_slot_ms: u64,
    /// The most inbound connections.
    pub max_inbound: usize,
    /// How often one outbound connection is swapped for another (jittered ±25%); 0 never.
    pub rotate_interval_ms: u64,
    /// Deltas kept for retransmission.
    pub buffer_capacity: usize,
    /// The shortest lease of this node (its membership and everything it owns live by it).
    pub member_lease_ttl_ms: u64,
    /// The lease grows with the cluster, to this much per member (rounded up to a power of
    /// two members, at most 24 h), so renewals, which reach every node, cost each node the
    /// same at any size. 0: the lease is `member_lease_ttl_ms` whatever the size.
    pub lease_per_member_ms: u64,
    /// How long a peer whose connection closed without a goodbye may take to come back
    /// (a restart) before it is probed and written dead.
    pub suspect_after_ms: u64,
    /// How long the peers asked about a suspect have to answer.
    pub probe_timeout_ms: u64,
    /// Grace past a lease's end before a node collects it (at least the allowed skew).
    pub expire_grace_ms: u64,
    /// No collection of expired leases until this long after start: a node that was down
    /// must first hear the renewals it missed (no mass expiry after a restart).
    pub expire_holdoff_ms: u64,
    /// The most a peer's clock, and any time in what it sends, may run ahead of ours.
    pub max_skew_ms: u64,
    /// How far above the greatest counter seen from a node a dot of that node may lie
    /// (see [`Bounds`]).
    pub max_counter_jump: u64,
    /// How long a full state sent to a peer waits for its acknowledgement before another
    /// may follow.
    pub full_sync_pause_ms: u64,
    /// How long deltas sent to a peer wait for its acknowledgement before a gossip round
    /// sends them again; doubled at each resend without progress, to at most 32 times
    /// this (64 s at the default). A peer still joining what it was sent is not sent it
    /// again every round (see `sync`).
    pub resend_after_ms: u64,
    /// How often one peer that stopped being a member is dialed again (jittered ±25%).
    pub reconnect_interval_ms: u64,
    /// How long such a peer is remembered.
    pub forget_lost_after_ms: u64,
    /// Whether to dial at all (`false`: accept connections only).
    pub dial: bool,
    /// The retry policy for dials.
    pub backoff: BackoffPolicy,
    /// How changes travel: on trees, or flooded (kept to measure one against the other).
    pub dissemination: Dissemination,
    /// The least time between two announcements sent alone to one peer (on a link that
    /// carries no push meanwhile): under churn, each then names many changes. The first
    /// after a quiet spell goes at once; only a hole in a tree under churn waits for it
    /// (Riak's plumtree announces once a second).
    pub announce_spacing_ms: u64,
    /// How long a change announced to us may take to arrive before we graft it from its
    /// announcer: about a round trip and a push's spacing.
    pub graft_timeout_ms: u64,
    /// How long the graft of a change may take to bring it before the next announcer is
    /// asked.
    pub graft_retry_ms: u64,
    /// How much less a copy of a change, or an announcement of it, must have cost than
    /// the copy our parent brought for its link to become the parent (a copy) or be
    /// grafted (an announcement: Plumtree's optimisation threshold). At least 1 (0 counts
    /// as 1: equal copies would move parents back and forth); `u16::MAX` keeps every
    /// node's first parent.
    pub parent_saving: u16,
    /// How many nodes of each zone (the first by id among its live members) keep one
    /// outbound link to another zone: the node of rank `r` to the zone `2^r` places on
    /// along the ring of zones sorted by name, each pair of zones linked once (see
    /// `borders`); the others keep their links in their own zone. With no zones set,
    /// every node is in one zone and this does nothing; 0: links ignore zones.
    pub border_links: usize,
    /// What a link to a member of another zone counts in the trees' choice of parents
    /// (a link within a zone counts 1): a change crosses each border about once. 1
    /// ignores zones.
    pub zone_border_cost: u16,
    /// The share of another zone's members, in percent, that must be lost within
    /// `damping_window_ms` for this node to judge the zone cut off rather than its nodes
    /// dead (see `damping`); 100 never does.
    pub damping_share_pct: u8,
    /// The window those losses must fall in.
    pub damping_window_ms: u64,
    /// How long a member of a zone judged cut off is shown as unreachable before it is
    /// gone as a dead node is.
    pub damping_bound_ms: u64,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            fanout: 2,
            gossip_interval_ms: 1_000,
            digest_interval_ms: 30_000,
            // What the rotation of a link every 5 minutes cost, which it replaces.
            sync_dial_interval_ms: 300_000,
            push_delay_ms: 2,
            push_rate: 200,
            push_burst: 20,
            // At 20 changes a second, 20 ms sent an acknowledgement per change per link,
            // 200 ms one per four, 1 s one per twenty (docs/benchmarks.md). A node killed
            // before it acknowledged loses nothing by the wait: back, its digest trims what
            // its peers push it (`Node::note_digest`).
            ack_delay_ms: 1_000,
            max_outbound: 2,
            dial_slot_ms: 1_000,
            max_inbound: 64,
            // Never: links that last keep the trees that formed on them (a rotation every
            // 5 minutes left every idle origin's tree gone before it wrote again, and each
            // new link costs every root one more copy of its next change); links change
            // on failure, and partitions heal by the anti-entropy exchange with random
            // members.
            rotate_interval_ms: 0,
            buffer_capacity: 1_024,
            member_lease_ttl_ms: 60_000,
            lease_per_member_ms: 24_000,
            suspect_after_ms: 3_000,
            probe_timeout_ms: 1_000,
            expire_grace_ms: 5_000,
            expire_holdoff_ms: 90_000,
            max_skew_ms: 5_000,
            max_counter_jump: Bounds::DEFAULT_MAX_COUNTER_JUMP,
            full_sync_pause_ms: 5_000,
            resend_after_ms: 2_000,
            // A healed partition waits for this round (and the dials' backoff) to find
            // the other side: at 30 s the Jepsen run healed in 11-18 s.
            reconnect_interval_ms: 10_000,
            forget_lost_after_ms: 24 * 60 * 60 * 1000,
            dial: true,
            backoff: BackoffPolicy::default(),
            dissemination: Dissemination::Tree,
            // At 50 ms, 20 changes a second sent an announcement per change per lazy link
            // (1 s, Riak's, saved nothing more measurable beside 200 ms acknowledgements).
            announce_spacing_ms: 500,
            graft_timeout_ms: 80,
            graft_retry_ms: 40,
            // A parent moved for a copy one link shorter at every change, and each move
            // left a link eager for a while: at 300 nodes 1.26 copies a node per change
            // (1.10 at 2, 1.03 never moving), for 25 ms to every node (27 at 2, 31 never).
            parent_saving: 2,
            // The ring and chords to 2 and 4 zones on: every zone within a few borders of
            // every other up to about 16 zones.
            border_links: 3,
            // More than a path across a zone takes (a few links): a tree enters a zone
            // once, by one border, and spreads inside it.
            zone_border_cost: 10,
            // Eureka's self-preservation trips at 15% of renewals missing, registry-wide;
            // per zone, 30% is well above one death in a zone of four (25%) and below a
            // zone's cut (all of it), and a rack's switch or an availability zone's
            // network takes most of a zone at once.
            damping_share_pct: 30,
            // Deaths written by a cut's border nodes and their zone tests, and leases that
            // end, land within seconds of each other; 30 s leaves room for a slow dial.
            damping_window_ms: 30_000,
            // Long enough for a network fault to heal, short enough that a zone really
            // lost is not listed for long.
            damping_bound_ms: 600_000,
        }
    }
}
