//! Zones in the simulator: links that stay in their zone but for a few border nodes, and
//! trees that cross each zone border about once per change.
//!
//! Each test prints its seed; `ROSTER_SEED=N` replays one.

use roster_transport::proto::{Config, Dissemination, Zone};
use roster_transport::sim::{Faults, Sim};

use crate::support::sim_seed;
use crate::transport_sim::config;
use crate::transport_trees::{change, payload, settled};

pub(crate) const ZONES: usize = 3;
pub(crate) const PER_ZONE: usize = 7;

fn zone_of(i: usize) -> Zone {
    Zone::new(&format!("zone-{}", i % ZONES)).unwrap()
}

/// `ZONES` zones of `PER_ZONE` nodes, machine `i` in zone `i % ZONES`, in step, with a
/// reconnect round behind them (links priced by zone, border links in place).
pub(crate) fn zoned(cfg: Config, seed: u64) -> Sim {
    let cfg = Config {
        dissemination: Dissemination::Tree,
        rotate_interval_ms: 0,
        ..cfg
    };
    let sim = Sim::in_zones(ZONES * PER_ZONE, cfg, Faults::NONE, seed, zone_of);
    let mut sim = settled(sim, seed);
    sim.run_for(cfg.reconnect_interval_ms * 2);
    sim
}

/// Payload copies that crossed a zone border while each of a few roots made its second
/// change (the first forms its tree), per change and per zone it had to enter.
fn border_copies_per_zone(sim: &mut Sim, seed: u64) -> f64 {
    let roots = [0, 4, 8, 13, 17];
    let mut crossed = 0;
    for root in roots {
        change(sim, root, &format!("first-{root}"), seed);
        let before = payload(sim.border_traffic_by_kind());
        change(sim, root, &format!("second-{root}"), seed);
        crossed += payload(sim.border_traffic_by_kind()) - before;
    }
    crossed as f64 / (roots.len() * (ZONES - 1)) as f64
}

#[test]
fn a_change_enters_each_other_zone_about_once_and_reaches_every_node() {
    let seed = sim_seed("zone_borders");
    let ignoring = Config {
        zone_border_cost: 1,
        border_links: 0,
        ..config()
    };
    let flat = border_copies_per_zone(&mut zoned(ignoring, seed), seed);
    let aware = border_copies_per_zone(&mut zoned(config(), seed), seed);
    eprintln!("payload copies into each other zone per change: {aware:.2} by zone, {flat:.2} ignoring zones (seed {seed})");
    assert!(
        aware <= 1.3,
        "{aware:.2} copies into each other zone per change (seed {seed})"
    );
}

/// With three zones the ring has three pairs, and only the first node of each zone (by id)
/// links out, to the next zone by name: each pair of zones is linked once. (A node already
/// connected to every member of its zone, by their links to it, has no one left to dial
/// there, and fills its room across the border: it may hold one more link out.)
#[test]
fn outbound_links_stay_in_their_zone_but_for_one_link_per_pair_of_zones() {
    let seed = sim_seed("zone_links");
    let sim = zoned(config(), seed);
    for i in 0..ZONES * PER_ZONE {
        let zone = i % ZONES;
        let links = sim.node(i).unwrap().connected();
        let machine = |peer: roster_registry::ReplicaId| (peer.0 - 0x1000) as usize;
        let mut far: Vec<usize> = links
            .iter()
            .filter(|(_, outbound)| *outbound)
            .map(|(peer, _)| machine(*peer) % ZONES)
            .filter(|&z| z != zone)
            .collect();
        let whole_zone = (0..ZONES * PER_ZONE)
            .filter(|&j| j != i && j % ZONES == zone)
            .all(|j| links.iter().any(|(peer, _)| machine(*peer) == j));
        // The first node of each zone by id: machines 0, 1 and 2.
        let expected = if i < ZONES {
            vec![(zone + 1) % ZONES]
        } else {
            vec![]
        };
        if whole_zone && far.len() == expected.len() + 1 {
            // Its room filled across the border: the rest must be what the ring wants.
            far.retain(|z| expected.contains(z));
            far.truncate(expected.len());
        }
        assert_eq!(
            far, expected,
            "machine {i}'s outbound links into other zones (seed {seed}): {links:?}"
        );
    }
}
