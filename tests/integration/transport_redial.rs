//! One node driven by hand, its dials answered (or left hanging) by the test: which peer a
//! free slot goes to, and how long a dial that hangs holds its slot.

use roster_registry::{Replica, ReplicaId};
use roster_transport::backoff::Failure;
use roster_transport::proto::{Config, ConnId, DialTarget, Node, NodeInfo, Output};
use roster_transport::sim::url;

const T0: u64 = 1_000_000;

fn info(i: u64) -> NodeInfo {
    NodeInfo {
        id: ReplicaId(i),
        name: format!("n{i}"),
        url: url(i as usize),
        zone: Default::default(),
    }
}

fn config() -> Config {
    Config {
        rotate_interval_ms: 0,
        ..Config::default()
    }
}

/// Node 1, which knows nodes `2..=n` as members (their states joined into its replica) and
/// is connected to none of them.
fn node_knowing(n: u64, cfg: Config) -> Node {
    let mut replica = Replica::new(ReplicaId(1));
    for i in 2..=n {
        let other = Node::new(info(i), Replica::new(ReplicaId(i)), vec![], cfg, i, T0).unwrap();
        replica.apply(other.replica().state().clone(), T0);
    }
    let node = Node::new(info(1), replica, vec![], cfg, 1, T0).unwrap();
    assert_eq!(
        node.members(T0).len(),
        n as usize - 1,
        "node 1 knows every other node"
    );
    node
}

/// The peers node 1 asks to dial, draining its outputs.
fn dials(node: &mut Node) -> Vec<ReplicaId> {
    let mut out = Vec::new();
    while let Some(o) = node.poll_output() {
        if let Output::Dial(DialTarget::Peer { id, .. }) = o {
            out.push(id);
        }
    }
    out
}

fn peer(id: ReplicaId) -> DialTarget {
    DialTarget::Peer {
        id,
        url: url(id.0 as usize),
    }
}

#[test]
fn after_a_cut_a_free_slot_goes_to_the_peer_that_failed_longest_ago() {
    // Node 1 has links to 3 and 4; its dials to 2, on its own side, failed three times in a
    // lossy spell (resets). Then a silent cut: the links to 3 and 4 die of silence, each
    // one failure. Counting failures, the slots went to 3 and 4, whose handshakes hang
    // across the cut for a handshake timeout, while 2 waited.
    let mut node = node_knowing(4, config());
    let mut now = T0 + 1_000;
    node.handle_timeout(now);
    let _ = dials(&mut node);
    for (conn, p) in [(3 as ConnId, 3), (4, 4)] {
        node.handle_dial_failed(&peer(ReplicaId(p)), Failure::Network, now);
        assert!(node.handle_connected(conn, &info(p), true, None, now));
    }
    for _ in 0..3 {
        now += 1_000;
        node.handle_dial_failed(&peer(ReplicaId(2)), Failure::Network, now);
    }
    now += 10_000;
    node.handle_dead_link(3, now);
    node.handle_dead_link(4, now);
    // Every backoff is over; the next round dials 2 first.
    now += 30_000;
    node.handle_timeout(now);
    let d = dials(&mut node);
    assert_eq!(d.first(), Some(&ReplicaId(2)), "the slots went to {d:?}");
}

#[test]
fn a_dial_that_hangs_gives_up_its_slot_after_dial_slot_ms_and_at_most_twice_the_cap_fly() {
    let cfg = config();
    let mut node = node_knowing(7, cfg);
    let mut now = T0;
    node.handle_timeout(now);
    let first = dials(&mut node);
    assert_eq!(
        first.len(),
        cfg.max_outbound,
        "a node alone dials its fanout: {first:?}"
    );
    // Nothing answers: the handshakes hang. Within dial_slot_ms, no other dial.
    now += cfg.dial_slot_ms / 2;
    node.handle_timeout(now);
    let d = dials(&mut node);
    assert!(d.is_empty(), "a young dial holds its slot: {first:?} then {d:?}");
    // Past it, two more peers are dialed, and then no more while all four hang.
    let mut more = Vec::new();
    for _ in 0..10 {
        now += cfg.gossip_interval_ms;
        node.handle_timeout(now);
        more.extend(dials(&mut node));
    }
    assert_eq!(
        more.len(),
        cfg.max_outbound,
        "two more dials, then none: {more:?}"
    );
    assert!(
        more.iter().all(|p| !first.contains(p)),
        "other peers: {first:?} then {more:?}"
    );
    // The second pair connects: the slots are full, the first pair's dials may end as they will.
    for (conn, p) in more.iter().enumerate() {
        assert!(node.handle_connected(conn as ConnId + 10, &info(p.0), true, None, now));
    }
    for _ in 0..10 {
        now += cfg.gossip_interval_ms;
        node.handle_timeout(now);
        assert!(dials(&mut node).is_empty(), "no dial while the slots are full");
    }
}

#[test]
fn without_dial_slot_ms_a_hanging_dial_holds_its_slot_until_it_ends() {
    let cfg = Config {
        dial_slot_ms: 0,
        ..config()
    };
    let mut node = node_knowing(7, cfg);
    let mut now = T0 + 1_000;
    node.handle_timeout(now);
    let first = dials(&mut node);
    assert_eq!(first.len(), cfg.max_outbound);
    for _ in 0..10 {
        now += cfg.gossip_interval_ms;
        node.handle_timeout(now);
        assert!(dials(&mut node).is_empty(), "a hanging dial holds its slot");
    }
    node.handle_dial_failed(&peer(first[0]), Failure::Network, now);
    now += cfg.gossip_interval_ms;
    node.handle_timeout(now);
    assert_eq!(dials(&mut node).len(), 1, "its end frees the slot");
}

#[test]
fn a_node_left_alone_does_not_dial_a_peer_and_the_seed_at_its_address_together() {
    // Node 1 joined through node 2's address. The link dies and node 2's lease ends at
    // node 1 (a cut that outlived it): alone, node 1 dials its lost peers and its seeds,
    // and here both are node 2. One dial on the way to an address is enough.
    let cfg = config();
    let other = Node::new(info(2), Replica::new(ReplicaId(2)), vec![], cfg, 2, T0).unwrap();
    let lease_ends = other.replica().lease_of(ReplicaId(2)).unwrap().deadline_ms();
    let mut replica = Replica::new(ReplicaId(1));
    replica.apply(other.replica().state().clone(), T0);
    let mut node = Node::new(info(1), replica, vec![url(2)], cfg, 1, T0).unwrap();
    let mut now = T0;
    node.handle_timeout(now);
    let _ = node_dials(&mut node);
    assert!(node.handle_connected(7, &info(2), true, Some(&url(2)), now));
    // Connected past a reconnect round (it notes where members stand); then the link dies,
    // and every dial fails until node 2's lease has ended.
    while now < T0 + 40_000 {
        now += 250;
        node.handle_timeout(now);
        let _ = node_dials(&mut node);
    }
    node.handle_dead_link(7, now);
    while now < lease_ends + cfg.expire_grace_ms {
        now += 250;
        node.handle_timeout(now);
        for target in node_dials(&mut node) {
            node.handle_dial_failed(&target, Failure::Network, now);
        }
    }
    assert!(node.members(now).is_empty(), "node 2 is no longer a member");
    // Alone: the dials from here on hang (a silent cut); none goes out while another to
    // the same address is on its way.
    let mut hanging = Vec::new();
    for _ in 0..240 {
        now += 250;
        node.handle_timeout(now);
        hanging.extend(node_dials(&mut node));
    }
    let to_2 = hanging
        .iter()
        .filter(
            |t| matches!(t, DialTarget::Peer { url: u, .. } | DialTarget::Seed { url: u } if *u == url(2)),
        )
        .count();
    assert_eq!(to_2, 1, "dials to node 2's address while one hangs: {hanging:?}");
}

/// Every dial node 1 asks for, draining its outputs.
fn node_dials(node: &mut Node) -> Vec<DialTarget> {
    let mut out = Vec::new();
    while let Some(o) = node.poll_output() {
        if let Output::Dial(t) = o {
            out.push(t);
        }
    }
    out
}
