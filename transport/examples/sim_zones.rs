//! Zones in the simulator: links and trees that know the zones, against the same cluster
//! ignoring them (`Config::border_links` 0, `zone_border_cost` 1), from one seed.
//!
//! Run: `cargo run --release -p roster-transport --features sim --example sim_zones -- 3 7`
//! (zones, then nodes per zone; `ROSTER_SEED` fixes the seed). Machine `i` is in zone
//! `i % zones`. Each cluster settles, then makes 20 changes from random origins, one at a
//! time (an origin's first change forms its tree, so each origin writes twice and the
//! second counts), then idles 10 minutes. It prints, per change: payload copies that
//! crossed a zone border, per zone the change had to enter; all bytes that crossed a
//! border; the time until every node shows it; and, idle, the bytes crossing borders and
//! the bytes each node sent, per minute.
#![allow(clippy::unwrap_used)] // fixed, valid inputs: a failure is a bug in the benchmark

use std::collections::BTreeMap;

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use roster_registry::{Endpoint, Metadata, ProviderId, ServiceName};
use roster_transport::proto::{Config, Zone};
use roster_transport::sim::{Faults, Sim};

type ByKind = BTreeMap<&'static str, (u64, u64)>;

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (zones, per_zone) = (
        args.first().copied().unwrap_or(3),
        args.get(1).copied().unwrap_or(7),
    );
    let seed = std::env::var("ROSTER_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(42);
    println!("seed {seed}; {zones} zones of {per_zone} nodes; one-way delay 1-5 ms");
    println!("| links and trees | payload copies into each other zone per change | bytes across borders per change | to every node, median / worst ms | idle: bytes across borders per minute | idle: bytes sent per node per minute |");
    println!("|---|---|---|---|---|---|");
    let d = Config::default();
    let ignoring = Config {
        border_links: 0,
        zone_border_cost: 1,
        ..d
    };
    for (name, cfg) in [("ignoring zones", ignoring), ("by zone", d)] {
        let row = run(zones, per_zone, cfg, seed);
        println!("| {name} | {row} |");
    }
}

fn run(zones: usize, per_zone: usize, cfg: Config, seed: u64) -> String {
    let n = zones * per_zone;
    let faults = Faults {
        min_delay_ms: 1,
        max_delay_ms: 5,
        ..Faults::NONE
    };
    let zone_of = |i: usize| Zone::new(&format!("zone-{}", i % zones)).unwrap();
    let mut sim = Sim::in_zones(n, cfg, faults, seed, zone_of);
    sim.classify_deltas(true);
    let settled = (0..300).any(|_| {
        sim.run_for(1_000);
        sim.converged() && (0..n).all(|i| sim.node(i).unwrap().members(sim.now_ms()).len() == n - 1)
    });
    assert!(settled, "did not settle (seed {seed})");
    sim.run_for(2 * cfg.reconnect_interval_ms);
    let mut rng = SmallRng::seed_from_u64(seed);
    let (mut copies, mut bytes, mut times) = (0, 0, Vec::new());
    for c in 0..20 {
        let origin = rng.random_range(0..n);
        change(&mut sim, origin, &format!("form-{c}"));
        let before = sim.border_traffic_by_kind().clone();
        times.push(change(&mut sim, origin, &format!("change-{c}")));
        let after = sim.border_traffic_by_kind();
        copies += payload(after) - payload(&before);
        bytes += all_bytes(after) - all_bytes(&before);
    }
    times.sort_unstable();
    let (border0, sent0) = (all_bytes(sim.border_traffic_by_kind()), sent(&sim, n));
    sim.run_for(600_000);
    let border_idle = (all_bytes(sim.border_traffic_by_kind()) - border0) / 10;
    let sent_idle = (sent(&sim, n) - sent0) / 10 / n as u64;
    format!(
        "{:.2} | {} | {} / {} | {border_idle} | {sent_idle}",
        copies as f64 / (20 * (zones - 1)) as f64,
        bytes / 20,
        times[times.len() / 2],
        times[times.len() - 1],
    )
}

/// Registers `service` on `origin`; returns the ms until every node shows it.
fn change(sim: &mut Sim, origin: usize, service: &str) -> u64 {
    let name = ServiceName::new(service).unwrap();
    let ep = Endpoint::new("10.1.1.1", 80).unwrap();
    sim.with_node(origin, |node, now| {
        node.register(
            name.clone(),
            ProviderId::new("p").unwrap(),
            ep,
            Metadata::default(),
            now,
        )
        .unwrap()
    });
    let start = sim.now_ms();
    for _ in 0..10_000 {
        let t = sim.now_ms();
        if (0..sim.len()).all(|i| sim.node(i).unwrap().replica().instances(&name, t).count() == 1) {
            let took = t - start;
            sim.run_for(3_000);
            return took;
        }
        sim.run_for(1);
    }
    panic!("{service} did not reach every node");
}

fn payload(by: &ByKind) -> u64 {
    ["delta", "push"]
        .iter()
        .filter_map(|k| by.get(k))
        .map(|k| k.0)
        .sum()
}

fn all_bytes(by: &ByKind) -> u64 {
    by.values().map(|k| k.1).sum()
}

fn sent(sim: &Sim, n: usize) -> u64 {
    (0..n).map(|i| sim.traffic(i).bytes_sent).sum()
}
