//! How the protocol's cost grows with cluster size, measured in the simulator.
//!
//! Run: `cargo run --release -p roster-transport --features sim --example sim_scale -- 10 100 1000`
//! (sizes as arguments; `ROSTER_SEED` fixes the seed). For each size it bootstraps a
//! cluster, lets it settle, then measures:
//! - how long a new registration takes to reach every node (virtual ms, and gossip ticks);
//! - the bytes each node receives for that one update (the messages that carried it), as a
//!   multiple of its encoded delta;
//! - the bytes each node sends per second when nothing changes (digests, lease renewals);
//! - how long a new node (an empty disk, held back until then) takes to hold every member
//!   and be held by every node;
//! - how long a killed node takes to be gone from every node's members (written dead).
//!
//! It prints its seed, and on stderr the wall time of each phase; the last column is the
//! process's peak memory (run one size per process to read it per size).
#![allow(clippy::unwrap_used)] // fixed, valid inputs: a failure is a bug in the benchmark

use roster_registry::codec::encode_state;
use roster_registry::{Change, Endpoint, Metadata, ProviderId, Replica, ReplicaId, ServiceName};
use roster_transport::proto::Config;
use roster_transport::sim::{Faults, Sim};

fn total_received(sim: &Sim) -> u64 {
    (0..sim.len()).map(|i| sim.traffic(i).bytes_received).sum()
}

fn total_sent(sim: &Sim) -> u64 {
    (0..sim.len()).map(|i| sim.traffic(i).bytes_sent).sum()
}

/// The process's peak resident memory so far, in MiB (Linux; `None` elsewhere). Run one
/// size per process to read it per size.
fn peak_rss_mib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}

/// The process's CPU time so far (user and system), in seconds (Linux; `None` elsewhere).
fn cpu_s() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // After the command name in parentheses: state is field 3, utime 14, stime 15, in
    // clock ticks of 1/100 s (USER_HZ).
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

fn main() {
    let sizes: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let sizes = if sizes.is_empty() {
        vec![10, 100, 1000]
    } else {
        sizes
    };
    let seed = std::env::var("ROSTER_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(42);
    let d = Config::default();
    let member_ttl: u64 = std::env::var("SIM_MEMBER_TTL")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(d.member_lease_ttl_ms);
    println!(
        "seed {seed}; gossip tick {} ms, fanout {}, {} outbound connections, push spacing {} ms, member lease {} ms; one-way delay 1-5 ms",
        d.gossip_interval_ms, d.fanout, d.max_outbound, d.push_delay_ms, member_ttl
    );
    println!("| nodes | to every node (ms) | ticks | bytes received per node for the update | messages that carried it, per node | as a multiple of the delta | idle bytes sent per node per s | per min | a new node joined and synced (ms) | a killed node gone everywhere (ms) | wall s | CPU s | peak RSS MiB |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for n in sizes {
        let t0 = std::time::Instant::now();
        let cfg = Config {
            member_lease_ttl_ms: member_ttl,
            ..Config::default()
        };
        let mut sim = settled(n, cfg, seed, t0);
        let idle = measure_idle(&mut sim, n);
        eprintln!(
            "{n} nodes: idle measured, {:.1} s of wall time",
            t0.elapsed().as_secs_f64()
        );
        let u = measure_update(&mut sim, n);
        let joined = measure_join(&mut sim, n);
        let killed = measure_kill(&mut sim);
        let ms = |t: Option<u64>| t.map_or("not all".to_string(), |t| t.to_string());
        println!(
            "| {n} | {} | {:.3} | {:.0} | {:.1} | {:.1} | {:.0} | {:.0} | {} | {} | {:.1} | {} | {} |",
            u.last_ms.map_or("not all".to_string(), |l| l.to_string()),
            u.last_ms.unwrap_or(u.slowest_ms) as f64 / cfg.gossip_interval_ms as f64,
            u.per_node,
            u.copies_per_node,
            u.per_node / u.delta_size as f64,
            idle,
            idle * 60.0,
            ms(joined),
            ms(killed),
            t0.elapsed().as_secs_f64(),
            cpu_s().map_or("?".to_string(), |c| format!("{c:.1}")),
            peak_rss_mib().map_or("?".to_string(), |m| m.to_string())
        );
    }
}

/// `n` nodes bootstrapped and settled past their first renewals, and one more machine
/// (the last) held back with an empty disk, to join later (`measure_join`).
fn settled(n: usize, cfg: Config, seed: u64, t0: std::time::Instant) -> Sim {
    let faults = Faults {
        loss_permille: 0,
        dup_permille: 0,
        min_delay_ms: 1,
        max_delay_ms: 5,
    };
    let mut sim = Sim::new(n + 1, cfg, faults, seed);
    sim.crash_unsaved(n, roster_registry::State::new());
    let start_ms = sim.now_ms();
    let mut settled = false;
    for _ in 0..600 {
        sim.run_for(1_000);
        if members_everywhere(&sim, n - 1) && sim.converged() {
            settled = true;
            break;
        }
    }
    assert!(settled, "{n} nodes did not settle in 600 s");
    eprintln!(
        "{n} nodes: settled after {} s of virtual time, {:.1} s of wall time, {:.1} s of CPU",
        (sim.now_ms() - start_ms) / 1_000,
        t0.elapsed().as_secs_f64(),
        cpu_s().unwrap_or_default()
    );
    sim.run_for(30_000);
    sim
}

/// Whether every running node lists `others` members besides itself.
fn members_everywhere(sim: &Sim, others: usize) -> bool {
    sim.running()
        .into_iter()
        .all(|i| sim.node(i).unwrap().member_count(sim.now_ms()) == others)
}

/// A new node (the held-back machine, its disk empty) starts: how long until it lists
/// every member, has synced, and every node lists it (virtual ms, followed for 60 s).
fn measure_join(sim: &mut Sim, n: usize) -> Option<u64> {
    let start = sim.now_ms();
    sim.restart(n);
    while sim.now_ms() < start + 60_000 {
        sim.run_for(10);
        let synced = sim.node(n).is_some_and(|node| node.synced());
        if synced && members_everywhere(sim, n) {
            return Some(sim.now_ms() - start);
        }
    }
    None
}

/// A node (machine 1, not the seed) is killed: how long until no running node lists it
/// (virtual ms, followed for 60 s).
fn measure_kill(sim: &mut Sim) -> Option<u64> {
    let others = sim.running().len() - 2;
    let start = sim.now_ms();
    sim.crash(1);
    while sim.now_ms() < start + 60_000 {
        sim.run_for(10);
        if members_everywhere(sim, others) {
            return Some(sim.now_ms() - start);
        }
    }
    None
}

/// Idle: nothing changes but lease renewals, digest hashes and what they find. Returns
/// the bytes each node sends per second.
fn measure_idle(sim: &mut Sim, n: usize) -> f64 {
    let before = total_sent(sim);
    sim.classify_deltas(std::env::var("SIM_KINDS").is_ok());
    let kinds_before = sim.traffic_by_kind().clone();
    // Long enough to hold every node's renewal (SIM_IDLE_S; the lease grows with N).
    let idle_s: u64 = std::env::var("SIM_IDLE_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(120);
    sim.run_for(idle_s * 1_000);
    let idle = (total_sent(sim) - before) as f64 / n as f64 / idle_s as f64;
    if std::env::var("SIM_KINDS").is_ok() {
        // What the idle bytes were: messages and bytes of each kind, per node per minute.
        let per_min = |v: u64| v as f64 * 60.0 / idle_s as f64 / n as f64;
        for (kind, (m, b)) in sim.traffic_by_kind() {
            let (m0, b0) = kinds_before.get(kind).copied().unwrap_or_default();
            eprintln!(
                "idle {kind}: {:.1} messages, {:.0} bytes per node per minute",
                per_min(m - m0),
                per_min(b - b0)
            );
        }
        let (dead, refuted) = (0..n).filter_map(|i| sim.node(i)).fold((0, 0), |(d, r), node| {
            let c = node.counters();
            (d + c.deaths_written, r + c.deaths_refuted)
        });
        eprintln!("deaths written {dead}, refuted {refuted} (all nodes, whole run)");
    }
    idle
}

/// What one update cost to reach every node.
struct Update {
    /// When the last node had it (ms after the write); `None` when some never did.
    last_ms: Option<u64>,
    /// When the last node that had it got it.
    slowest_ms: u64,
    /// Bytes received per node in the messages that carried it.
    per_node: f64,
    /// Messages that carried it, per node.
    copies_per_node: f64,
    /// The size of its delta alone.
    delta_size: usize,
}

/// One update, from the middle of a renewal period.
fn measure_update(sim: &mut Sim, n: usize) -> Update {
    let service = ServiceName::new("bench").unwrap();
    let provider = ProviderId::new("bench-1").unwrap();
    let ep = Endpoint::new("10.1.2.3", 8080).unwrap();
    let meta: Metadata = [("zone", "eu-1a"), ("version", "1.4.2")].into();
    let delta_size = {
        let mut r = Replica::new(ReplicaId(0x1000));
        let d = r.register(
            service.clone(),
            provider.clone(),
            ep.clone(),
            meta.clone(),
            30_000,
            roster_registry::Hlc::new(sim.now_ms(), 0),
        );
        encode_state(&d.unwrap().delta).len()
    };
    // The bytes of the messages that carried it: deltas holding a registration (none
    // other is written meanwhile; a lease renewal batched with it counts too). Lease
    // renewals never stop, so the network's total over the window would mostly be them.
    let window_ms = 2_000;
    sim.classify_deltas(true);
    // Deltas and pushes (a change's copies on its tree); those of leases alone are
    // counted apart while deltas are classified.
    let carrying = |sim: &Sim| {
        let kinds = sim.traffic_by_kind();
        let of = |k: &str| kinds.get(k).copied().unwrap_or_default();
        let (d, p) = (of("delta"), of("push"));
        (d.0 + p.0, d.1 + p.1)
    };
    let carried_before = carrying(sim);
    sim.keep_log(true);
    let start = sim.now_ms();
    let rx_before = total_received(sim);
    sim.with_node(0, |node, now| {
        node.register(service.clone(), provider.clone(), ep.clone(), meta.clone(), now)
            .unwrap()
    });
    sim.run_for(window_ms);
    let (copies, rx) = {
        let after = carrying(sim);
        (after.0 - carried_before.0, after.1 - carried_before.1)
    };
    if std::env::var("SIM_KINDS").is_ok() {
        eprintln!(
            "update window: {} bytes received in all, kinds {:?}",
            total_received(sim) - rx_before,
            sim.traffic_by_kind()
        );
    }
    let mut reached = vec![None; n];
    reached[0] = Some(start);
    for (i, t, c) in sim.log() {
        if let Change::Up(inst) = c {
            if inst.service == service && reached[*i].is_none() {
                reached[*i] = Some(*t);
            }
        }
    }
    let all = reached.iter().all(Option::is_some);
    let slowest_ms = reached.iter().flatten().max().copied().unwrap_or(start) - start;
    Update {
        last_ms: all.then_some(slowest_ms),
        slowest_ms,
        per_node: rx as f64 / n as f64,
        copies_per_node: copies as f64 / n as f64,
        delta_size,
    }
}
