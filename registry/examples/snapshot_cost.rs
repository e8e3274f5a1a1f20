//! What publishing a snapshot of the replica costs readers' writer: one small change (a
//! one-registration delta from a peer, applied), one `clone()` of the replica (what the
//! node task publishes), and dropping the snapshot before it (what the last reader of the
//! old one pays). Also what a read costs, so a cheaper copy is not bought with slow reads.
//!
//! The registrations are spread over 100 writer nodes, 1,000 services and ten per provider.
//!
//! ```sh
//! cargo run --release -p roster-registry --example snapshot_cost -- 1000 10000 100000
//! ```

#![allow(clippy::unwrap_used)] // fixed, valid inputs: a failure is a bug in the example

use std::hint::black_box;
use std::time::Instant;

use roster_registry::{Endpoint, Hlc, NewRegistration, ProviderId, RegKey, Replica, ReplicaId, ServiceName};

const WRITERS: usize = 100;
const SERVICES: usize = 1_000;
const TTL_MS: u64 = 3_600_000;
const START_MS: u64 = 1_000_000;
const ROUNDS: usize = 201;

fn key(i: usize) -> RegKey {
    RegKey {
        service: ServiceName::new(&format!("svc-{}", i % SERVICES)).unwrap(),
        provider: ProviderId::new(&format!("p-{}", i / 10)).unwrap(),
    }
}

fn item(i: usize, port: u16) -> NewRegistration {
    let k = key(i);
    NewRegistration::new(
        k.service,
        k.provider,
        Endpoint::new("10.1.2.3", port).unwrap(),
        [("zone", "eu-1a"), ("version", "1.2.3")].into(),
        1,
    )
}

/// The writers (registration `i` is written by writer `i % WRITERS`) and a replica that
/// has joined them all.
fn build(n: usize) -> (Vec<Replica>, Replica) {
    let mut writers: Vec<Replica> = (0..WRITERS)
        .map(|w| Replica::new(ReplicaId(100 + w as u64)))
        .collect();
    for (w, writer) in writers.iter_mut().enumerate() {
        let items: Vec<NewRegistration> = (w..n).step_by(WRITERS).map(|i| item(i, 8000)).collect();
        writer
            .register_many(items, TTL_MS, Hlc::new(START_MS, 0))
            .unwrap();
    }
    let mut reader = Replica::new(ReplicaId(7));
    for writer in &writers {
        reader.apply(writer.state().clone(), START_MS);
    }
    (writers, reader)
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Microseconds `f` takes.
fn micros(f: impl FnOnce()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64() * 1e6
}

/// Median microseconds of a change, a clone and dropping the previous clone, and of the three.
fn publication(n: usize, writers: &mut [Replica], reader: &mut Replica) -> [f64; 4] {
    let mut previous = reader.clone();
    let mut rows = Vec::with_capacity(ROUNDS);
    for round in 0..ROUNDS {
        let i = (round * 7919) % n;
        let now = Hlc::new(START_MS + 1 + round as u64, 0);
        let delta = writers[i % WRITERS]
            .register_many(vec![item(i, 9000 + (round % 1000) as u16)], TTL_MS, now)
            .unwrap()
            .delta;
        let change = micros(|| {
            black_box(reader.apply(delta, START_MS + 1));
        });
        let mut snapshot = None;
        let clone = micros(|| snapshot = Some(reader.clone()));
        let old = std::mem::replace(&mut previous, snapshot.unwrap());
        let drop = micros(|| drop(old));
        rows.push([change, clone, drop, change + clone + drop]);
    }
    std::array::from_fn(|c| median(rows.iter().map(|r| r[c]).collect()))
}

/// Median microseconds of listing one service's live instances, and of one `visible`.
fn reads(n: usize, reader: &Replica) -> [f64; 2] {
    let now_ms = START_MS + 1;
    let services: Vec<ServiceName> = (0..ROUNDS).map(|r| key(r * 7).service).collect();
    let list = services
        .iter()
        .map(|s| micros(|| assert!(reader.instances(s, now_ms).count() > 0)))
        .collect();
    let keys: Vec<RegKey> = (0..ROUNDS).map(|r| key((r * 7919) % n)).collect();
    let point = keys
        .iter()
        .map(|k| micros(|| assert!(reader.visible(k, now_ms).is_some())))
        .collect();
    [median(list), median(point)]
}

fn main() {
    let sizes: Vec<usize> = std::env::args().skip(1).map(|a| a.parse().unwrap()).collect();
    let sizes = if sizes.is_empty() {
        vec![1_000, 10_000, 100_000]
    } else {
        sizes
    };
    println!("medians of {ROUNDS} rounds, in microseconds; {WRITERS} writer nodes");
    println!("registrations   change    clone  drop old  publish  instances()  visible()");
    for n in sizes {
        let (mut writers, mut reader) = build(n);
        let [change, clone, drop, total] = publication(n, &mut writers, &mut reader);
        let [list, point] = reads(n, &reader);
        println!(
            "{n:>13}  {change:>7.1}  {clone:>7.1}  {drop:>8.1}  {total:>7.1}  {list:>11.2}  {point:>9.2}"
        );
    }
}
