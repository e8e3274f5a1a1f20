//! The flood and the trees side by side, in the simulator, from one seed.
//!
//! Run: `cargo run --release -p roster-transport --features sim --example sim_trees -- 100 1000`
//! (sizes as arguments; `ROSTER_SEED` fixes the seed, `SIM_IDLE_S` the idle spell before
//! the changes, an hour by default; `SIM_MODES=flood` or `tree` runs one; `SIM_ACK_MS`,
//! `SIM_ANNOUNCE_MS` and `SIM_PARENT_SAVING` override those settings). For each size and each dissemination it bootstraps a
//! cluster, lets it settle, idles (so most origins have not written for a long while),
//! then makes 20 changes from random origins, one at a time, and measures per change:
//! - payload copies received per node (messages carrying the registration);
//! - bytes received per node: payload, announcements (announce, graft, prune) and
//!   acknowledgements, apart;
//! - the time until every node shows it (median and worst).
//!
//! Then ten seconds of churn, 20 changes a second from one origin, and the messages and
//! bytes each node received per change (`SIM_KINDS` prints them by kind).
//!
//! Then it cuts the cluster in two for `SIM_CUT_S` (60 s by default), writes one change
//! on each side, heals, and measures the time until each side shows the other's change.
//! It prints its seed; the wall time of each phase goes to stderr.
#![allow(clippy::unwrap_used)] // fixed, valid inputs: a failure is a bug in the benchmark

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use roster_registry::codec::encode_state;
use roster_registry::{Change, Endpoint, Hlc, Metadata, ProviderId, Replica, ReplicaId, ServiceName};
use roster_transport::proto::{Config, Dissemination};
use roster_transport::sim::{Faults, Sim};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let sizes: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let sizes = if sizes.is_empty() { vec![100] } else { sizes };
    let seed = env_u64("ROSTER_SEED", 42);
    let idle_s = env_u64("SIM_IDLE_S", 3_600);
    let cut_s = env_u64("SIM_CUT_S", 60);
    println!(
        "seed {seed}; one-way delay 1-5 ms; {idle_s} s idle before 20 changes from random origins; a cut of {cut_s} s"
    );
    println!("| nodes | dissemination | outbound links | copies per node per change | payload B | announce B | ack B | all B per node per change | delta B | to every node, median / worst ms | heal after the cut, each side ms | wall s |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for n in sizes {
        for mode in modes() {
            let t0 = std::time::Instant::now();
            let d = Config::default();
            let links = match mode {
                Dissemination::Flood => env_u64("SIM_FLOOD_OUTBOUND", 2) as usize,
                Dissemination::Tree => env_u64("SIM_TREE_OUTBOUND", d.max_outbound as u64) as usize,
            };
            let cfg = Config {
                dissemination: mode,
                max_outbound: links,
                fanout: links,
                sync_dial_interval_ms: env_u64("SIM_SYNC_DIAL_MS", d.sync_dial_interval_ms),
                ack_delay_ms: env_u64("SIM_ACK_MS", d.ack_delay_ms),
                announce_spacing_ms: env_u64("SIM_ANNOUNCE_MS", d.announce_spacing_ms),
                parent_saving: env_u64("SIM_PARENT_SAVING", d.parent_saving.into()).min(u16::MAX.into())
                    as u16,
                ..d
            };
            let mut sim = settled(n, cfg, seed);
            eprintln!("{n} {mode:?}: settled, {:.1} s wall", t0.elapsed().as_secs_f64());
            if std::env::var("SIM_WARM").is_ok() {
                warm(&mut sim, n);
            }
            let opened_of = |sim: &Sim| {
                (0..n).filter_map(|i| sim.node(i)).fold((0, 0), |(c, x), node| {
                    let k = node.counters();
                    (c + k.connections, x + k.exchange_dials)
                })
            };
            let (c0, x0) = opened_of(&sim);
            let sent0: u64 = (0..n).map(|i| sim.traffic(i).bytes_sent).sum();
            sim.run_for(idle_s * 1_000);
            let (c1, x1) = opened_of(&sim);
            let sent1: u64 = (0..n).map(|i| sim.traffic(i).bytes_sent).sum();
            let hours = idle_s as f64 / 3_600.0;
            // Each connection opens at both its ends; an exchange's connection is no link.
            let opened = (c1 - c0) as f64 / 2.0 - (x1 - x0) as f64;
            eprintln!(
                "{n} {mode:?}: idle {idle_s} s: {:.2} links opened per node per hour, {:.2} exchange dials per node per hour, {:.0} bytes sent per node per minute",
                opened / n as f64 / hours,
                (x1 - x0) as f64 / n as f64 / hours,
                (sent1 - sent0) as f64 / n as f64 / (idle_s as f64 / 60.0)
            );
            eprintln!("{n} {mode:?}: idled, {:.1} s wall", t0.elapsed().as_secs_f64());
            let sum = |sim: &Sim| {
                (0..n)
                    .filter_map(|i| sim.node(i))
                    .fold((0, 0, 0), |(g, d, a), node| {
                        let c = node.counters();
                        (
                            g + c.changes_grafted,
                            d + c.duplicate_pushes,
                            a + c.changes_announced,
                        )
                    })
            };
            let before = sum(&sim);
            let c = changes(&mut sim, n, seed);
            let after = sum(&sim);
            eprintln!(
                "{n} {mode:?}: during the changes, {} changes grafted, {} duplicate pushes, {} announced",
                after.0 - before.0,
                after.1 - before.1,
                after.2 - before.2
            );
            if std::env::var("SIM_TIMES").is_ok() {
                eprintln!("{n} {mode:?}: times {:?}", c.times);
            }
            let (churn_msgs, churn_bytes) = churn(&mut sim, n);
            eprintln!(
                "{n} {mode:?}: churn of {CHURN_RATE}/s from one origin: {churn_msgs:.2} messages and {churn_bytes:.0} B received per node per change"
            );
            let heal = cut_and_heal(&mut sim, n, cut_s);
            println!(
                "| {n} | {mode:?} | {links} | {:.2} | {:.0} | {:.0} | {:.0} | {:.0} | {} | {} / {} | {} | {:.0} |",
                c.copies,
                c.payload,
                c.announce,
                c.acks,
                c.payload + c.announce + c.acks,
                c.delta_size,
                c.median_ms.map_or("not all".into(), |m| m.to_string()),
                c.worst_ms.map_or("not all".into(), |m| m.to_string()),
                heal,
                t0.elapsed().as_secs_f64()
            );
        }
    }
}

/// The disseminations to run: both, or the one `SIM_MODES` names (`flood`, `tree`).
fn modes() -> Vec<Dissemination> {
    match std::env::var("SIM_MODES").as_deref() {
        Ok("flood") => vec![Dissemination::Flood],
        Ok("tree") => vec![Dissemination::Tree],
        _ => vec![Dissemination::Flood, Dissemination::Tree],
    }
}

/// `n` nodes bootstrapped and settled past their first renewals.
fn settled(n: usize, cfg: Config, seed: u64) -> Sim {
    let faults = Faults {
        loss_permille: 0,
        dup_permille: 0,
        min_delay_ms: 1,
        max_delay_ms: 5,
    };
    let mut sim = Sim::new(n, cfg, faults, seed);
    for _ in 0..600 {
        sim.run_for(1_000);
        if (0..n).all(|i| sim.node(i).unwrap().members(sim.now_ms()).len() == n - 1) && sim.converged() {
            sim.run_for(30_000);
            return sim;
        }
    }
    panic!("{n} nodes did not settle in 600 s (seed {seed})");
}

/// Every node writes once (its trees form), a few ms apart.
fn warm(sim: &mut Sim, n: usize) {
    let ep = Endpoint::new("10.7.7.7", 80).unwrap();
    let service = ServiceName::new("warm").unwrap();
    for i in 0..n {
        let provider = ProviderId::new(&format!("w{i}")).unwrap();
        sim.with_node(i, |node, now| {
            node.register(service.clone(), provider, ep.clone(), Metadata::default(), now)
                .unwrap()
        });
        sim.run_for(20);
    }
    sim.run_for(5_000);
}

/// What the changes cost, per node and per change.
struct Changes {
    copies: f64,
    payload: f64,
    announce: f64,
    acks: f64,
    delta_size: usize,
    median_ms: Option<u64>,
    worst_ms: Option<u64>,
    times: Vec<u64>,
}

const PAYLOAD: [&str; 2] = ["delta", "push"];
const ANNOUNCE: [&str; 3] = ["ihave", "graft", "prune"];

fn kinds(sim: &Sim, which: &[&str]) -> (u64, u64) {
    let by = sim.traffic_by_kind();
    which
        .iter()
        .filter_map(|k| by.get(k))
        .fold((0, 0), |(m, b), (m2, b2)| (m + m2, b + b2))
}

fn changes(sim: &mut Sim, n: usize, seed: u64) -> Changes {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x7733);
    let ep = Endpoint::new("10.1.2.3", 8080).unwrap();
    let meta: Metadata = [("zone", "eu-1a"), ("version", "1.4.2")].into();
    sim.classify_deltas(true);
    let (p0, a0, k0) = (kinds(sim, &PAYLOAD), kinds(sim, &ANNOUNCE), kinds(sim, &["ack"]));
    let mut times = Vec::new();
    let mut all = true;
    let mut delta_size = 0;
    for c in 0..20 {
        let origin = rng.random_range(0..n);
        let service = ServiceName::new(&format!("bench-{c}")).unwrap();
        let provider = ProviderId::new("bench-1").unwrap();
        delta_size = {
            let mut r = Replica::new(ReplicaId(0x1000));
            let d = r.register(
                service.clone(),
                provider.clone(),
                ep.clone(),
                meta.clone(),
                30_000,
                Hlc::new(sim.now_ms(), 0),
            );
            encode_state(&d.unwrap().delta).len()
        };
        sim.keep_log(true);
        let start = sim.now_ms();
        sim.with_node(origin, |node, now| {
            node.register(service.clone(), provider.clone(), ep.clone(), meta.clone(), now)
                .unwrap()
        });
        sim.run_for(2_000);
        let mut reached = vec![None; n];
        reached[origin] = Some(start);
        for (i, t, ch) in sim.log() {
            if let Change::Up(inst) = ch {
                if inst.service == service && reached[*i].is_none() {
                    reached[*i] = Some(*t);
                }
            }
        }
        sim.keep_log(false);
        all &= reached.iter().all(Option::is_some);
        times.push(reached.iter().flatten().max().copied().unwrap_or(start) - start);
        // Renewals, digests and sweeps go on between the changes; a gap lets them be.
        sim.run_for(1_000);
    }
    let per = |now: (u64, u64), then: (u64, u64)| {
        let k = 20.0 * n as f64;
        ((now.0 - then.0) as f64 / k, (now.1 - then.1) as f64 / k)
    };
    let (copies, payload) = per(kinds(sim, &PAYLOAD), p0);
    let (_, announce) = per(kinds(sim, &ANNOUNCE), a0);
    let (_, acks) = per(kinds(sim, &["ack"]), k0);
    let in_order = times.clone();
    times.sort_unstable();
    Changes {
        times: in_order,
        copies,
        payload,
        announce,
        acks,
        delta_size,
        median_ms: all.then(|| times[times.len() / 2]),
        worst_ms: all.then(|| times[times.len() - 1]),
    }
}

/// Changes a second in the churn phase, all from one origin, as `bench/compare`'s churn
/// writes through one agent.
const CHURN_RATE: u64 = 20;

/// Ten seconds of `CHURN_RATE` changes a second made at node 0 (updates of 50
/// registrations in turn): the messages and bytes each node received per change, of
/// every kind (renewals and digests meanwhile included), as the kernel counts them at a
/// real node's interface (TCP's own segments aside).
fn churn(sim: &mut Sim, n: usize) -> (f64, f64) {
    let service = ServiceName::new("churn").unwrap();
    let meta: Metadata = [("zone", "eu-1a"), ("version", "1.4.2")].into();
    let received = |sim: &Sim| {
        (0..n).fold((0, 0), |(m, b), i| {
            let t = sim.traffic(i);
            (m + t.messages_received, b + t.bytes_received)
        })
    };
    let before = received(sim);
    let kinds0 = sim.traffic_by_kind().clone();
    let count = CHURN_RATE * 10;
    for c in 0..count {
        let provider = ProviderId::new(&format!("churn-{}", c % 50)).unwrap();
        let ep = Endpoint::new("10.4.4.4", 1_000 + c as u16).unwrap();
        sim.with_node(0, |node, now| {
            node.register(service.clone(), provider, ep, meta.clone(), now)
                .unwrap()
        });
        sim.run_for(1_000 / CHURN_RATE);
    }
    sim.run_for(2_000);
    let after = received(sim);
    let k = (count * (n as u64 - 1)) as f64;
    if std::env::var("SIM_KINDS").is_ok() {
        for (kind, (m, b)) in sim.traffic_by_kind() {
            let (m0, b0) = kinds0.get(kind).copied().unwrap_or_default();
            eprintln!(
                "  {kind}: {:.2} messages, {:.0} B per node per change",
                (m - m0) as f64 / k,
                (b - b0) as f64 / k
            );
        }
    }
    ((after.0 - before.0) as f64 / k, (after.1 - before.1) as f64 / k)
}

/// Cuts the cluster in two halves for `cut_s`, writes a change on each side, heals, and
/// returns when each side first showed the other's change everywhere, in ms after the heal.
fn cut_and_heal(sim: &mut Sim, n: usize, cut_s: u64) -> String {
    let half = n / 2;
    sim.partition(|i| u32::from(i >= half));
    sim.run_for(cut_s * 1_000);
    let ep = Endpoint::new("10.9.9.9", 80).unwrap();
    let names = ["cut-left", "cut-right"];
    for (side, origin) in [0, n - 1].into_iter().enumerate() {
        let service = ServiceName::new(names[side]).unwrap();
        let provider = ProviderId::new("x").unwrap();
        sim.with_node(origin, |node, now| {
            node.register(service, provider, ep.clone(), Metadata::default(), now)
                .unwrap()
        });
    }
    sim.run_for(5_000);
    sim.keep_log(true);
    sim.heal();
    let healed = sim.now_ms();
    let mut seen: [Option<u64>; 2] = [None, None];
    for _ in 0..600 {
        sim.run_for(500);
        for (side, name) in names.iter().enumerate() {
            let other_side = |i: usize| if side == 0 { i >= half } else { i < half };
            let everywhere = (0..n).filter(|&i| other_side(i)).all(|i| {
                sim.node(i)
                    .unwrap()
                    .replica()
                    .instances(&ServiceName::new(name).unwrap(), sim.now_ms())
                    .count()
                    > 0
            });
            if everywhere && seen[side].is_none() {
                seen[side] = Some(sim.now_ms() - healed);
            }
        }
        if seen.iter().all(Option::is_some) {
            break;
        }
    }
    sim.keep_log(false);
    let show = |s: Option<u64>| s.map_or("not in 300 s".to_string(), |t| t.to_string());
    format!("{} / {}", show(seen[0]), show(seen[1]))
}
