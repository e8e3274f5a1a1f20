//! Benchmarks of the registry core on one core: joins, reads, encoding.
//!
//! Run: `cargo bench -p roster-registry --bench core`. Figures and what limits them are in
//! docs/benchmarks.md. Sizes and memory are printed by
//! `cargo run --release -p roster-registry --example footprint`.

#![allow(clippy::unwrap_used)] // fixed, valid inputs: a failure is a bug in the benchmark

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use roster_registry::codec::{decode_state, encode_state};
use roster_registry::{Endpoint, HlcClock, Metadata, ProviderId, Replica, ReplicaId, ServiceName, State};

const LIVE_SERVICES: usize = 10_000;
const TTL_MS: u64 = 3_600_000;
const NOW_MS: u64 = 2_000_000;

fn meta() -> Metadata {
    [
        ("zone".to_string(), "eu-1a".to_string()),
        ("version".to_string(), "1.4.2".to_string()),
    ]
    .into()
}

/// A writer and a reader that both hold `LIVE_SERVICES` services, one provider each, and
/// `n` single-registration update deltas from the writer.
fn setup(n: usize) -> (Replica, Vec<State>) {
    let mut clock = HlcClock::new();
    let mut writer = Replica::new(ReplicaId(1));
    let names: Vec<ServiceName> = (0..LIVE_SERVICES)
        .map(|i| ServiceName::new(&format!("svc-{i}.prod")).unwrap())
        .collect();
    let providers: Vec<ProviderId> = (0..LIVE_SERVICES)
        .map(|i| ProviderId::new(&format!("host-{i}")).unwrap())
        .collect();
    for i in 0..LIVE_SERVICES {
        let ep = Endpoint::new("10.0.0.1", 8000).unwrap();
        writer
            .register(
                names[i].clone(),
                providers[i].clone(),
                ep,
                meta(),
                TTL_MS,
                clock.tick(1_000_000),
            )
            .unwrap();
    }
    let reader = Replica::from_state(ReplicaId(2), writer.state().clone(), 0);
    let deltas = (0..n)
        .map(|k| {
            let i = (k * 7919) % LIVE_SERVICES;
            let ep = Endpoint::new("10.0.0.2", 9000 + (k % 1000) as u16).unwrap();
            let at = clock.tick(1_000_001);
            writer
                .register(names[i].clone(), providers[i].clone(), ep, meta(), TTL_MS, at)
                .unwrap()
                .delta
        })
        .collect();
    (reader, deltas)
}

fn joins(c: &mut Criterion) {
    const N: usize = 10_000;
    let (reader, deltas) = setup(N);
    let bytes: Vec<Vec<u8>> = deltas.iter().map(encode_state).collect();
    let mut g = c.benchmark_group("join one-registration deltas into 10k live services");
    g.throughput(Throughput::Elements(N as u64));
    g.sample_size(20);
    g.bench_function("State::join", |b| {
        b.iter_batched(
            || (reader.state().clone(), deltas.clone()),
            |(mut s, ds)| {
                for d in ds {
                    black_box(s.join(d));
                }
                s
            },
            BatchSize::LargeInput,
        )
    });
    g.bench_function("Replica::apply (join + visible changes)", |b| {
        b.iter_batched(
            || (reader.clone(), deltas.clone()),
            |(mut r, ds)| {
                for d in ds {
                    black_box(r.apply(d, NOW_MS));
                }
                r
            },
            BatchSize::LargeInput,
        )
    });
    g.bench_function("decode + Replica::apply", |b| {
        b.iter_batched(
            || reader.clone(),
            |mut r| {
                for bs in &bytes {
                    let d = decode_state(bs).unwrap();
                    black_box(r.apply(d, NOW_MS));
                }
                r
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

fn lookups(c: &mut Criterion) {
    let (mut reader, _) = setup(0);
    let web = ServiceName::new("web").unwrap();
    let mut clock = HlcClock::new();
    for i in 0..100 {
        let p = ProviderId::new(&format!("web-{i:03}")).unwrap();
        let ep = Endpoint::new("10.0.1.1", 8080).unwrap();
        reader
            .register(web.clone(), p, ep, meta(), TTL_MS, clock.tick(1_500_000))
            .unwrap();
    }
    assert_eq!(reader.instances(&web, NOW_MS).count(), 100);
    let mut g = c.benchmark_group("lookup a service with 100 instances among 10k services");
    g.bench_function("instances().collect()", |b| {
        b.iter(|| black_box(reader.instances(black_box(&web), NOW_MS).collect::<Vec<_>>()))
    });
    g.bench_function("services() (10,001 services)", |b| {
        b.iter(|| black_box(reader.services(NOW_MS)))
    });
    g.finish();
}

fn encoding(c: &mut Criterion) {
    let (_, deltas) = setup(1);
    let d = &deltas[0];
    let bytes = encode_state(d);
    let mut g = c.benchmark_group("encoding of a one-registration delta");
    g.bench_function("encode", |b| b.iter(|| black_box(encode_state(black_box(d)))));
    g.bench_function("decode", |b| {
        b.iter(|| black_box(decode_state(black_box(&bytes)).unwrap()))
    });
    g.finish();
}

criterion_group!(benches, joins, lookups, encoding);
criterion_main!(benches);
