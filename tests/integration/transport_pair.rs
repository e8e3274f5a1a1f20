//! Two nodes driven by hand, message by message: what a connection lost when it closed
//! is sent again, even when a later delta, on another connection to the same peer, was
//! acknowledged past it; a node left alone dials a peer whose lease ended; and a node
//! connected to one group keeps dialing the seeds it has not reached.

use roster_registry::{Endpoint, Metadata, ProviderId, Replica, ReplicaId, ServiceName};
use roster_transport::backoff::Failure;
use roster_transport::proto::{Config, ConnId, DialTarget, Node, NodeInfo, Output};
use roster_transport::sim::url;

const T0: u64 = 1_000_000;

fn config() -> Config {
    Config {
        // No periodic digest exchange within the test: only acknowledgements and repair
        // rounds can bring a lost delta.
        digest_interval_ms: 3_600_000,
        rotate_interval_ms: 0,
        ..Config::default()
    }
}

fn info(i: u64) -> NodeInfo {
    NodeInfo {
        id: ReplicaId(i),
        name: format!("n{i}"),
        url: url(i as usize),
        zone: Default::default(),
    }
}

/// Two nodes and the connections between them: a connection has the same id at both ends.
/// Dials reach nobody: each fails at once, and is recorded (time, dialing node, target).
struct Pair {
    nodes: [Node; 2],
    now: u64,
    dials: Vec<(u64, usize, DialTarget)>,
}

impl Pair {
    fn new() -> Self {
        Self::with(config())
    }

    fn with(cfg: Config) -> Self {
        Self::with_seeds(cfg, vec![])
    }

    /// Node 0 joins through `seeds`.
    fn with_seeds(cfg: Config, seeds: Vec<String>) -> Self {
        let node = |i: u64, seeds| Node::new(info(i), Replica::new(ReplicaId(i)), seeds, cfg, i, T0).unwrap();
        Pair {
            nodes: [node(1, seeds), node(2, vec![])],
            now: T0,
            dials: Vec::new(),
        }
    }

    /// Opens connection `conn`, dialed by node `from`.
    fn connect(&mut self, conn: ConnId, from: usize) {
        let now = self.now;
        for (i, peer) in [(0, 2), (1, 1)] {
            assert!(self.nodes[i].handle_connected(conn, &info(peer), i == from, None, now));
        }
    }

    /// Closes `conn` at both ends; what was in flight on it is lost.
    fn disconnect(&mut self, conn: ConnId) {
        for n in &mut self.nodes {
            n.handle_disconnected(conn, self.now);
        }
    }

    /// Node `i`'s outputs: the messages it sent, by connection. Dials fail (and are
    /// recorded); events are dropped.
    fn sent(&mut self, i: usize) -> Vec<(ConnId, roster_transport::message::Envelope)> {
        let mut out = Vec::new();
        let mut dials = Vec::new();
        while let Some(o) = self.nodes[i].poll_output() {
            match o {
                Output::Send { conn, envelope } => out.push((conn, envelope)),
                Output::Dial(target) => dials.push(target),
                _ => {}
            }
        }
        for target in dials {
            self.nodes[i].handle_dial_failed(&target, Failure::Network, self.now);
            self.dials.push((self.now, i, target));
        }
        out
    }

    /// Delivers everything node `i` sent (on connections still open).
    fn deliver(&mut self, i: usize) {
        let now = self.now;
        for (conn, envelope) in self.sent(i) {
            let _ = self.nodes[1 - i].handle_message(conn, envelope, now);
        }
    }

    /// Runs `ms` of time in 10 ms steps, delivering everything both ways.
    fn run(&mut self, ms: u64) {
        let until = self.now + ms;
        while self.now < until {
            self.now += 10;
            for i in 0..2 {
                self.nodes[i].handle_timeout(self.now);
                self.deliver(i);
            }
        }
    }

    fn register(&mut self, i: usize, provider: &str) {
        let svc = ServiceName::new("web").unwrap();
        let p = ProviderId::new(provider).unwrap();
        let ep = Endpoint::new("10.0.0.1", 80).unwrap();
        self.nodes[i]
            .register(svc, p, ep, Metadata::default(), self.now)
            .unwrap();
    }

    fn shows(&self, i: usize, provider: &str) -> bool {
        let svc = ServiceName::new("web").unwrap();
        let found = self.nodes[i]
            .replica()
            .instances(&svc, self.now)
            .any(|inst| inst.provider.as_str() == provider);
        found
    }
}

#[test]
fn a_delta_lost_with_a_closed_connection_is_sent_again_on_the_next_one() {
    let mut pair = Pair::new();
    // Two connections, one dialed each way (both dial at once, as peers often do).
    pair.connect(1, 0);
    pair.connect(2, 1);
    pair.run(3_000);
    // A write on node 0 goes on its oldest connection to node 1, which closes with the
    // delta in flight.
    pair.register(0, "lost");
    pair.now += 10;
    pair.nodes[0].handle_timeout(pair.now);
    let lost = pair.sent(0);
    assert!(
        lost.iter().any(|(c, e)| *c == 1 && e.message.carries_delta()),
        "the write went on connection 1: {:?}",
        lost.iter()
            .map(|(c, e)| (c, e.message.kind()))
            .collect::<Vec<_>>()
    );
    pair.disconnect(1);
    // A second write goes on the connection left, and is acknowledged.
    pair.register(0, "kept");
    pair.run(500);
    assert!(pair.shows(1, "kept"), "the second write arrived");
    // Repair rounds come every second; the digest exchange not within the test.
    pair.run(5_000);
    assert!(
        pair.shows(1, "lost"),
        "the write lost with connection 1 never came again"
    );
}

#[test]
fn a_node_left_alone_dials_a_peer_whose_lease_ended_without_waiting_for_the_reconnect_round() {
    let cfg = Config {
        member_lease_ttl_ms: 4_000,
        lease_per_member_ms: 0,
        ..config()
    };
    let mut pair = Pair::with(cfg);
    pair.connect(1, 0);
    // Well before the first reconnect round (30 s), which also notes where members are.
    pair.run(3_000);
    // The link dies (a partition): node 1's lease ends at node 0 a few seconds later, and
    // so does the window in which a peer written dead is dialed as a member.
    pair.disconnect(1);
    let lost_at = pair.now;
    pair.run(3 * cfg.member_lease_ttl_ms);
    assert!(
        pair.nodes[0]
            .members(pair.now)
            .iter()
            .all(|(id, _, _)| *id != ReplicaId(2)),
        "node 1 is no longer a member at node 0"
    );
    let quiet_from = pair.now;
    // The next reconnect round is 30 s after the last; alone, node 0 dials sooner.
    pair.run(10_000);
    let dials: Vec<u64> = pair
        .dials
        .iter()
        .filter(|(t, i, target)| {
            *t >= quiet_from
                && *i == 0
                && matches!(target, DialTarget::Peer { id, .. } if *id == ReplicaId(2))
        })
        .map(|(t, _, _)| t - lost_at)
        .collect();
    assert!(
        !dials.is_empty(),
        "node 0, alone, did not dial node 1 within 10 s of its lease ending (dials: {:?})",
        pair.dials
    );
}

#[test]
fn a_node_reached_by_one_peer_still_dials_the_seeds_it_has_not_reached() {
    // Node 0 joins through a seed that is not up yet; node 1 dials node 0 meanwhile. The
    // two know each other and nobody else: without dialing the seed again, a cluster
    // started all at once can stay split in two groups for good.
    let unreached = url(7);
    let mut pair = Pair::with_seeds(config(), vec![unreached.clone()]);
    pair.run(100);
    let first: Vec<_> = pair.dials.iter().filter(|(_, i, _)| *i == 0).cloned().collect();
    assert!(
        matches!(first.as_slice(), [(_, _, DialTarget::Seed { url })] if *url == unreached),
        "node 0 first dials its seed: {first:?}"
    );
    pair.connect(1, 1);
    pair.run(10_000);
    let again = pair
        .dials
        .iter()
        .filter(|(t, i, target)| {
            *i == 0 && *t > T0 + 100 && matches!(target, DialTarget::Seed { url } if *url == unreached)
        })
        .count();
    assert!(
        again > 0,
        "node 0 never dialed its unreached seed again: {:?}",
        pair.dials
    );
    // A seed some connection reached is not dialed again while connected.
    let mut pair = Pair::with_seeds(config(), vec![url(2)]);
    pair.run(100);
    pair.connect(1, 0);
    let reached_at = pair.now;
    pair.nodes[0].handle_connected(9, &info(2), true, Some(&url(2)), pair.now);
    pair.run(10_000);
    let redialed = pair
        .dials
        .iter()
        .filter(|(t, i, target)| *i == 0 && *t > reached_at && matches!(target, DialTarget::Seed { .. }))
        .count();
    assert_eq!(
        redialed, 0,
        "node 0 dialed a seed it had reached: {:?}",
        pair.dials
    );
}

/// Two connected nodes; node 0 registered `a` and `b`, then removed `b` and registered
/// `c` without a push yet (the changes are pending when it departs).
fn pair_with_pending_changes() -> Pair {
    let mut pair = Pair::new();
    pair.connect(1, 0);
    pair.run(3_000);
    pair.register(0, "a");
    pair.register(0, "b");
    pair.run(500);
    assert!(pair.shows(1, "a") && pair.shows(1, "b"));
    let now = pair.now;
    let web = ServiceName::new("web").unwrap();
    assert!(pair.nodes[0].deregister(&web, &ProviderId::new("b").unwrap(), now));
    pair.register(0, "c");
    pair
}

#[test]
fn a_stopped_node_pushes_what_is_pending_and_its_peer_keeps_the_rest_within_the_lease() {
    let mut pair = pair_with_pending_changes();
    let now = pair.now;
    pair.nodes[0].stop(now);
    let kinds: Vec<&str> = pair.sent(0).iter().map(|(_, e)| e.message.kind()).collect();
    assert_eq!(
        kinds,
        vec!["push", "goodbye"],
        "the pending changes, then goodbye"
    );
    let mut pair = pair_with_pending_changes();
    let now = pair.now;
    pair.nodes[0].stop(now);
    pair.deliver(0);
    assert!(
        !pair.shows(1, "b"),
        "the removal made just before the stop arrived"
    );
    assert!(
        pair.shows(1, "c"),
        "the registration made just before the stop arrived"
    );
    // A goodbye is not a death: the peer keeps the node and what it owns while its
    // lease runs (48 s for two members), so a restart within it shows no change.
    pair.run(20_000);
    assert!(pair.shows(1, "a") && pair.shows(1, "c"));
    assert!(
        pair.nodes[1]
            .members(pair.now)
            .iter()
            .any(|(id, _, _)| *id == ReplicaId(1)),
        "node 0 is still a member at node 1"
    );
}

#[test]
fn a_node_that_leaves_removes_what_it_owns_at_its_peer_at_once() {
    let mut pair = pair_with_pending_changes();
    let now = pair.now;
    pair.nodes[0].shutdown(now);
    pair.deliver(0);
    for p in ["a", "b", "c"] {
        assert!(!pair.shows(1, p), "{p} is gone at once");
    }
    assert!(
        pair.nodes[1]
            .members(pair.now)
            .iter()
            .all(|(id, _, _)| *id != ReplicaId(1)),
        "node 0 left the members"
    );
}

#[test]
fn instances_whose_lease_ends_unrenewed_are_counted_as_lapsed() {
    let cfg = Config {
        member_lease_ttl_ms: 4_000,
        lease_per_member_ms: 0,
        ..config()
    };
    let mut pair = Pair::with(cfg);
    pair.connect(1, 0);
    pair.register(1, "p");
    pair.run(1_000);
    assert!(pair.shows(0, "p"));
    assert_eq!(pair.nodes[0].counters().instances_lapsed, 0);
    // A stop says goodbye: no death is written, the lease runs out at the peer.
    let now = pair.now;
    pair.nodes[1].stop(now);
    pair.deliver(1);
    pair.disconnect(1);
    pair.run(3 * cfg.member_lease_ttl_ms);
    assert!(!pair.shows(0, "p"));
    assert!(
        pair.nodes[0].counters().instances_lapsed >= 1,
        "{:?}",
        pair.nodes[0].counters()
    );
    assert_eq!(pair.nodes[0].counters().deaths_written, 0, "a lapse, not a death");
}

#[test]
fn an_idle_node_with_rotation_off_wakes_only_for_its_timers() {
    // With `rotate_interval_ms: 0` (the default) the rotation timer was due every
    // millisecond: an agent alone woke about a thousand times a second.
    let cfg = Config {
        rotate_interval_ms: 0,
        ..Config::default()
    };
    let mut node = Node::new(info(1), Replica::new(ReplicaId(1)), vec![], cfg, 1, T0).unwrap();
    let (mut now, mut wakes) = (T0, 0);
    while now < T0 + 60_000 {
        now = node.poll_timeout().max(now);
        node.handle_timeout(now);
        while node.poll_output().is_some() {}
        wakes += 1;
    }
    // A gossip round a second, a digest round, a renewal, and their jitter.
    assert!(wakes < 200, "{wakes} wake-ups in an idle minute");
}
