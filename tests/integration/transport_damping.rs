//! Damping per failure domain, in the simulator: a zone cut off is shown unreachable on
//! the other zones, never removed, and is back without a registration once the cut heals;
//! a node that dies alone in a healthy zone is gone as before; a cold start of the whole
//! cluster removes nothing.
//!
//! Each test prints its seed; `ROSTER_SEED=N` replays one.

use std::collections::BTreeMap;

use roster_registry::{Dot, Endpoint, Metadata, ProviderId, ServiceName};
use roster_transport::proto::Config;
use roster_transport::sim::Sim;

use crate::support::sim_seed;
use crate::transport_sim::config;
use crate::transport_zones::{zoned, PER_ZONE, ZONES};

const N: usize = ZONES * PER_ZONE;
/// The zone cut off: machines 2, 5, 8, ...
const CUT: usize = 2;

fn svc() -> ServiceName {
    ServiceName::new("web").unwrap()
}

fn provider(i: usize) -> ProviderId {
    ProviderId::new(&format!("w{i}")).unwrap()
}

/// Every machine registers one instance of `web`, seen everywhere.
fn registered(seed: u64) -> Sim {
    registered_with(config(), seed)
}

fn registered_with(cfg: Config, seed: u64) -> Sim {
    let mut sim = zoned(cfg, seed);
    for i in 0..N {
        let ep = Endpoint::new("10.1.1.1", 8000 + i as u16).unwrap();
        sim.with_node(i, |n, now| {
            n.register(svc(), provider(i), ep, Metadata::default(), now)
                .unwrap()
        });
    }
    sim.run_for(5_000);
    assert!(sim.converged(), "the registrations did not spread (seed {seed})");
    sim
}

/// What machine `at` shows of `web`: instance -> (its dot, whether unreachable).
fn shown(sim: &Sim, at: usize) -> BTreeMap<String, (Dot, bool)> {
    sim.node(at)
        .unwrap()
        .replica()
        .instances(&svc(), sim.now_ms())
        .map(|i| (i.provider.to_string(), (i.dot.clone(), i.unreachable)))
        .collect()
}

fn in_zone(i: usize, zone: usize) -> bool {
    i % ZONES == zone
}

/// A zone cut off for 60 s, and a node of a healthy zone killed 10 s into the cut: on the
/// other zones the cut zone's instances are listed all along from 20 s in, marked
/// unreachable, and the killed node's are gone; after the heal every instance of a live
/// node is shown as it was, by the same write (no owner registered it again), and the
/// killed node's are gone from the cut zone too. No sweep runs in the whole test (as in
/// the first 90 s of a real cluster): the killed node must go from the cut zone by the
/// damping's lifting, not by its own zone's sweep (a damped zone stayed damped while any
/// member was lost, and showed it until that sweep).
#[test]
fn a_zone_cut_off_is_shown_unreachable_never_removed_and_is_back_after_the_heal_as_written() {
    let seed = sim_seed("damping_cut");
    let cfg = Config {
        expire_holdoff_ms: 3_600_000,
        ..config()
    };
    let mut sim = registered_with(cfg, seed);
    let before = shown(&sim, 0);
    let killed = 3; // zone 0
    sim.partition(|i| u32::from(in_zone(i, CUT)));
    sim.run_for(10_000);
    sim.crash(killed);
    for second in 10..60 {
        sim.run_for(1_000);
        if second < 20 {
            continue;
        }
        for at in (0..N).filter(|&i| !in_zone(i, CUT) && i != killed) {
            let now = shown(&sim, at);
            for cut in (0..N).filter(|&i| in_zone(i, CUT)) {
                let w = format!("w{cut}");
                assert_eq!(
                    now.get(&w).map(|s| s.1),
                    Some(true),
                    "{second} s into the cut, machine {at} shows {w} as {:?} (seed {seed})",
                    now.get(&w)
                );
            }
            assert!(
                !now.contains_key(&format!("w{killed}")),
                "machine {at} still shows the killed node's instance {second} s into the cut (seed {seed})"
            );
            let healthy = (0..N).filter(|&i| !in_zone(i, CUT) && i != killed);
            assert!(
                healthy
                    .clone()
                    .all(|i| now.get(&format!("w{i}")).is_some_and(|s| !s.1)),
                "machine {at} does not show a healthy zone's instances as reachable (seed {seed})"
            );
        }
        for at in (0..N).filter(|&i| in_zone(i, CUT)) {
            let now = shown(&sim, at);
            let own = (0..N).filter(|&i| in_zone(i, CUT));
            assert!(
                own.clone()
                    .all(|i| now.get(&format!("w{i}")).is_some_and(|s| !s.1)),
                "machine {at} of the cut zone does not show its own zone as reachable (seed {seed})"
            );
        }
    }
    sim.heal();
    let mut took = None;
    for second in 0..30 {
        let expected: BTreeMap<String, (Dot, bool)> = before
            .iter()
            .filter(|(w, _)| **w != format!("w{killed}"))
            .map(|(w, (d, _))| (w.clone(), (d.clone(), false)))
            .collect();
        if (0..N)
            .filter(|&i| i != killed)
            .all(|at| shown(&sim, at) == expected)
        {
            took = Some(second);
            break;
        }
        sim.run_for(1_000);
    }
    eprintln!("after the heal, every node shows every live node's instance as written, reachable, in {took:?} s (seed {seed})");
    if took.is_none() {
        // What each node shows amiss: instance -> (its write's counter, unreachable).
        for at in (0..N).filter(|&i| i != killed) {
            let now = shown(&sim, at);
            let amiss: Vec<_> = before
                .iter()
                .filter(|(w, (d, _))| **w != format!("w{killed}") && now.get(*w) != Some(&(d.clone(), false)))
                .map(|(w, _)| (w.clone(), now.get(w).map(|x| (x.0.counter, x.1))))
                .collect();
            let extra: Vec<&String> = now.keys().filter(|w| **w == format!("w{killed}")).collect();
            eprintln!("machine {at} shows amiss: {amiss:?}, and the killed node's: {extra:?}");
        }
    }
    assert!(took.is_some(), "30 s after the heal, not every node shows every live node's instance as it was written (seed {seed})");
}

/// One node dies in a healthy zone: it is gone everywhere as before, its zone not damped.
#[test]
fn a_node_that_dies_alone_in_a_healthy_zone_is_gone_everywhere() {
    let seed = sim_seed("damping_single");
    let mut sim = registered(seed);
    let killed = 4; // zone 1
    sim.crash(killed);
    let w = format!("w{killed}");
    let mut took = None;
    for second in 0..30 {
        if (0..N)
            .filter(|&i| i != killed)
            .all(|at| !shown(&sim, at).contains_key(&w))
        {
            took = Some(second);
            break;
        }
        sim.run_for(1_000);
    }
    eprintln!("a node killed in a healthy zone: gone everywhere in {took:?} s (seed {seed})");
    assert!(
        took.is_some(),
        "30 s after the kill, {w} is still shown somewhere (seed {seed})"
    );
    sim.run_for(40_000);
    for at in (0..N).filter(|&i| i != killed) {
        assert!(
            !shown(&sim, at).contains_key(&w),
            "machine {at} shows {w} again (seed {seed})"
        );
    }
}

/// Every node restarted within seconds: nothing is removed, and nothing is left unreachable.
#[test]
fn a_cold_start_of_the_whole_cluster_removes_nothing() {
    let seed = sim_seed("damping_cold");
    let mut sim = registered(seed);
    let before = shown(&sim, 0);
    for i in 0..N {
        sim.crash(i);
    }
    sim.run_for(2_000);
    for i in 0..N {
        sim.restart(i);
        sim.run_for(200);
    }
    for _ in 0..60 {
        sim.run_for(1_000);
        for at in 0..N {
            let now = shown(&sim, at);
            assert!(
                before.keys().all(|w| now.get(w).is_some_and(|s| !s.1)),
                "machine {at} lost or damped an instance after a cold start: {now:?} (seed {seed})"
            );
        }
    }
}
