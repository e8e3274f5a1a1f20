//! Pushes in the simulator: a lone change at once, a burst at the push spacing, a stream at
//! the push rate with batched acknowledgements, deltas in pieces within the entry limit,
//! resends to a slow peer, and none before an acknowledgement could come or of what an
//! acknowledgement covered.

use roster_registry::{Endpoint, ProviderId, ServiceName};
use roster_transport::proto::{Config, OwnedRegistration};
use roster_transport::sim::{Faults, Sim};

use crate::support::sim_seed;
use crate::transport_sim::{config, converged, key, settle, Workload};

#[test]
fn a_lone_change_is_pushed_at_once_and_a_burst_waits_for_the_spacing() {
    let seed = sim_seed("push_spacing");
    let spacing = 100;
    let mut sim = Sim::new(
        2,
        Config {
            push_delay_ms: spacing,
            ..config()
        },
        Faults::NONE,
        seed,
    );
    let mut w = Workload::default();
    assert!(
        settle(&mut sim, 30, |s| s
            .node(0)
            .is_some_and(|n| n.known_peers().len() == 1)
            && s.node(1).is_some_and(|n| n.known_peers().len() == 1))
        .is_some(),
        "two nodes did not connect"
    );
    // Quiet for longer than the spacing: the next change goes at once (1 ms each way).
    sim.run_for(5 * spacing);
    w.register(&mut sim, 0, 1);
    sim.run_for(10);
    assert_eq!(
        Workload::visible(&sim, 1).get(&key(0)),
        Some(&1),
        "a lone change waited for the push spacing (seed {seed})"
    );
    // A change right after a push waits for the spacing, so a burst goes in one message.
    w.register(&mut sim, 0, 2);
    sim.run_for(10);
    assert_eq!(
        Workload::visible(&sim, 1).get(&key(0)),
        Some(&1),
        "a change inside the spacing was pushed at once (seed {seed})"
    );
    sim.run_for(spacing);
    assert_eq!(
        Workload::visible(&sim, 1).get(&key(0)),
        Some(&2),
        "the batched change never went (seed {seed})"
    );
}

#[test]
fn a_stream_of_writes_is_pushed_at_the_push_rate_and_acknowledged_in_batches() {
    let seed = sim_seed("paced_pushes");
    let cfg = Config {
        push_rate: 50,
        push_burst: 5,
        ..config()
    };
    let mut sim = converged(3, cfg, seed);
    sim.run_for(5_000);
    let before = sim.traffic_by_kind().clone();
    // One write a millisecond for two seconds: twenty times the push rate.
    let web = ServiceName::new("web").unwrap();
    let p = ProviderId::new("w0").unwrap();
    const WRITES: u64 = 2_000;
    for i in 0..WRITES {
        let ep = Endpoint::new("10.0.0.1", 80).unwrap();
        let meta = [("seq", i.to_string())].into_iter().collect();
        sim.with_node(0, |n, now| n.register(web.clone(), p.clone(), ep, meta, now))
            .unwrap()
            .unwrap();
        sim.run_for(1);
    }
    sim.run_for(1_000);
    let new = |kind: &str| {
        let m = sim.traffic_by_kind().get(kind).map_or(0, |k| k.0);
        m - before.get(kind).map_or(0, |k| k.0)
    };
    // Every node shows the last write.
    for i in 0..3 {
        let replica = sim.node(i).unwrap().replica();
        let seen: Vec<_> = replica
            .instances(&web, sim.now_ms())
            .map(|x| x.registration.meta.get("seq").map(str::to_string))
            .collect();
        assert_eq!(seen, [Some((WRITES - 1).to_string())], "node {i} (seed {seed})");
    }
    // Three nodes, six directions of links; three seconds of pushes at most the rate
    // (and a burst), acknowledgements at most one per delay per direction.
    let secs = 3;
    let pushes = u64::from(cfg.push_rate) * secs + u64::from(cfg.push_burst);
    let acks = secs * 1_000 / cfg.ack_delay_ms + 1;
    // Deltas travel as pushes on the trees.
    let deltas = new("delta") + new("push");
    assert!(deltas <= 6 * pushes, "{deltas} deltas (seed {seed})");
    assert!(new("ack") <= 6 * acks, "{} acks (seed {seed})", new("ack"));
}

#[test]
fn deltas_past_the_entry_limit_go_in_pieces_each_within_it() {
    let seed = sim_seed("joined_past_the_limit");
    // Hour-long leases: the bulk load's lease does not end while the test runs.
    let cfg = Config {
        member_lease_ttl_ms: 3_600_000,
        lease_per_member_ms: 0,
        ..config()
    };
    let mut sim = converged(2, cfg, seed);
    // Node 1 misses a bulk load of seven batches: each delta is within the limit, the
    // seven joined (70,000 registrations) are not.
    sim.partition(|i| i as u32);
    let bulk = ServiceName::new("bulk").unwrap();
    for b in 0..7 {
        let items = bulk_items(&bulk, &format!("b{b}-"), 10_000);
        sim.with_node(0, |n, now| n.register_many(items, now))
            .unwrap()
            .unwrap();
        sim.run_for(10);
    }
    let fulls_before = sim.node(0).unwrap().counters().full_syncs_sent;
    // A slow link: the peer's acknowledgement of a state comes seconds later, as from a
    // real peer joining a large one.
    let slow = Faults {
        min_delay_ms: 2_000,
        max_delay_ms: 2_000,
        ..Faults::NONE
    };
    sim.set_machine_faults(1, Some(slow));
    sim.heal();
    let holds_all = |sim: &Sim| {
        sim.node(1)
            .unwrap()
            .replica()
            .instances(&bulk, sim.now_ms())
            .count()
            == 70_000
    };
    assert!(
        settle(&mut sim, 120, holds_all).is_some(),
        "node 1 never held the bulk load (seed {seed})"
    );
    assert_eq!(
        sim.node(1).unwrap().counters().refused,
        0,
        "a message was refused (seed {seed})"
    );
    // Pieces of the buffer, not the whole state (which, on a slow link, went once per
    // repair round while the peer took it in).
    sim.run_for(10_000);
    let fulls = sim.node(0).unwrap().counters().full_syncs_sent - fulls_before;
    assert_eq!(fulls, 0, "elided states sent (seed {seed})");
}

#[test]
fn deltas_a_slow_peer_has_not_acknowledged_are_resent_with_growing_waits() {
    let seed = sim_seed("slow_acks");
    let cfg = Config {
        member_lease_ttl_ms: 3_600_000,
        lease_per_member_ms: 0,
        ..config()
    };
    let mut sim = converged(2, cfg, seed);
    sim.run_for(5_000);
    // Ten seconds each way: an acknowledgement comes back twenty seconds after the send,
    // as from a peer that takes that long to join what it was sent.
    let slow = Faults {
        min_delay_ms: 10_000,
        max_delay_ms: 10_000,
        ..Faults::NONE
    };
    sim.set_machine_faults(1, Some(slow));
    let deltas = |sim: &Sim| {
        let count = |kind| sim.traffic_by_kind().get(kind).map_or(0, |k| k.0);
        count("delta") + count("push")
    };
    let before = deltas(&sim);
    // A bulk load, which a peer takes long to join.
    let web = ServiceName::new("web").unwrap();
    const BULK: usize = 2_000;
    let items = bulk_items(&web, "w", BULK);
    sim.with_node(0, |n, now| n.register_many(items, now))
        .unwrap()
        .unwrap();
    sim.run_for(19_000);
    // Gossip rounds come every second: resent at each, that is about twenty copies.
    // Resent after 2 s, then 4 and 8 more: the first send and three resends.
    let sent = deltas(&sim) - before;
    assert!(
        (2..=4).contains(&sent),
        "{sent} deltas before the first acknowledgement could come back (seed {seed})"
    );
    // Once acknowledged, nothing more is resent.
    sim.run_for(30_000);
    let after_ack = deltas(&sim) - before;
    assert!(
        after_ack <= sent + 1,
        "{after_ack} deltas after the acknowledgement, {sent} before (seed {seed})"
    );
    let shows = sim
        .node(1)
        .unwrap()
        .replica()
        .instances(&web, sim.now_ms())
        .count();
    assert_eq!(shows, BULK, "the peer never got the writes (seed {seed})");
}

#[test]
fn a_change_not_yet_acknowledged_is_not_sent_again_by_the_next_gossip_round() {
    let seed = sim_seed("no_resend_before_the_ack");
    // Acknowledgements wait longer than a gossip round (1 s ±25%), less than a resend.
    let cfg = Config {
        ack_delay_ms: 1_500,
        ..config()
    };
    assert!(cfg.resend_after_ms > cfg.ack_delay_ms + 100);
    let mut sim = converged(2, cfg, seed);
    sim.run_for(5_000);
    let deltas = |sim: &Sim| {
        let count = |kind| sim.traffic_by_kind().get(kind).map_or(0, |k| k.0);
        count("delta") + count("push")
    };
    let before = deltas(&sim);
    let mut w = Workload::default();
    w.register(&mut sim, 0, 1);
    // Past the ack (1.5 s and a hop), before a resend could go (2 s).
    sim.run_for(1_900);
    assert_eq!(Workload::visible(&sim, 1).get(&key(0)), Some(&1), "seed {seed}");
    let sent = deltas(&sim) - before;
    assert_eq!(
        sent, 1,
        "copies of one change before its acknowledgement came (seed {seed})"
    );
}

#[test]
fn an_acknowledgement_covers_the_changes_learnt_from_the_peer_after_what_it_names() {
    let seed = sim_seed("ack_covers_what_carried_nothing");
    // Acknowledgements 1 s apart, repair rounds every 100 ms, so that one comes between
    // a resend's due time and the next change's acknowledgement.
    let cfg = Config {
        ack_delay_ms: 1_000,
        gossip_interval_ms: 100,
        member_lease_ttl_ms: 3_600_000,
        lease_per_member_ms: 0,
        ..config()
    };
    let mut sim = converged(2, cfg, seed);
    sim.run_for(5_000);
    let deltas = |sim: &Sim| {
        let count = |kind| sim.traffic_by_kind().get(kind).map_or(0, |k| k.0);
        count("delta") + count("push")
    };
    let mut w = Workload::default();
    // Node 0 pushes a change, then buffers one it learns from node 1 before node 1's
    // acknowledgement of the first comes: that one carries nothing to node 1.
    w.register(&mut sim, 0, 1);
    sim.run_for(50);
    w.register(&mut sim, 1, 1);
    // After the acknowledgement (1 s), before the first resend would be due (2 s after it).
    sim.run_for(2_500);
    let before = deltas(&sim);
    w.register(&mut sim, 0, 2);
    // Past the acknowledgement of the new change (1 s and a hop).
    sim.run_for(1_900);
    assert_eq!(Workload::visible(&sim, 1).get(&key(0)), Some(&2), "seed {seed}");
    let sent = deltas(&sim) - before;
    assert_eq!(
        sent, 1,
        "copies of one change pushed after an acknowledgement (seed {seed})"
    );
}

/// `n` registrations of `service`, providers `<prefix>0` to `<prefix>{n-1}`, for a bulk load.
fn bulk_items(service: &ServiceName, prefix: &str, n: usize) -> Vec<OwnedRegistration> {
    (0..n)
        .map(|i| OwnedRegistration {
            service: service.clone(),
            provider: ProviderId::new(&format!("{prefix}{i}")).unwrap(),
            endpoint: Endpoint::new("10.0.0.1", 80).unwrap(),
            meta: Default::default(),
            status: roster_registry::Status::passing(),
            since_ms: 1,
        })
        .collect()
}
