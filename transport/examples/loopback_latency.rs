//! Time from a registration on one node until every node of a 5-node cluster sees it,
//! observed through each node's change stream, over real WebSockets on loopback.
//!
//! Run: `cargo run --release -p roster-transport --example loopback_latency [ROUNDS]`.
//! The five nodes run in one process (one tokio runtime, two worker threads), each with
//! its own listener and connections; the `roster` binary that would run them as separate
//! processes comes with the agent.
#![allow(clippy::unwrap_used)] // fixed, valid inputs: a failure is a bug in the benchmark

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use roster_registry::{Change, Endpoint, Metadata, ProviderId, Replica, ReplicaId, ServiceName};
use roster_transport::driver::{self, DriverConfig, Handle};
use roster_transport::handshake::Secret;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const NODES: usize = 5;

async fn start(i: usize, seed: Option<String>, cancel: &CancellationToken) -> Handle {
    let mut config = DriverConfig::new("bench", format!("n{i}"));
    config.secret = Some(Secret::new("a benchmark secret of 32 bytes..").unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let replica = Replica::new(ReplicaId(0xB000 + i as u64));
    driver::start(
        listener,
        config,
        replica,
        seed.into_iter().collect(),
        cancel.clone(),
    )
    .unwrap()
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(500);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let cancel = CancellationToken::new();
        let first = start(0, None, &cancel).await;
        let mut nodes = vec![first.clone()];
        for i in 1..NODES {
            nodes.push(start(i, Some(first.info().url.clone()), &cancel).await);
        }
        let members = ServiceName::new("roster").unwrap();
        let now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
        while !nodes.iter().all(|n| n.replica().instances(&members, now()).count() == NODES) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Every node's change stream feeds one channel: (node, provider, when seen).
        let (tx, mut rx) = mpsc::unbounded_channel::<(usize, String, Instant)>();
        let service = ServiceName::new("latency").unwrap();
        for (i, n) in nodes.iter().enumerate() {
            let mut events = n.subscribe();
            let (tx, service) = (tx.clone(), service.clone());
            tokio::spawn(async move {
                while let Ok(c) = events.recv().await {
                    if let Change::Up(inst) = &*c {
                        if inst.service == service {
                            let _ = tx.send((i, inst.provider.to_string(), Instant::now()));
                        }
                    }
                }
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut latencies = Vec::with_capacity(rounds);
        for k in 0..rounds {
            let origin = &nodes[k % NODES];
            let provider = format!("p{k}");
            let start = Instant::now();
            origin
                .register(
                    service.clone(),
                    ProviderId::new(&provider).unwrap(),
                    Endpoint::new("10.0.0.1", 8080).unwrap(),
                    Metadata::new(),
                )
                .await
                .unwrap();
            let mut seen: BTreeMap<usize, Instant> = BTreeMap::new();
            while seen.len() < NODES {
                let (i, p, at) = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.unwrap().unwrap();
                if p == provider {
                    seen.entry(i).or_insert(at);
                }
            }
            let last = seen.values().max().unwrap().duration_since(start);
            latencies.push(last);
            origin.deregister(service.clone(), ProviderId::new(&provider).unwrap()).await.unwrap();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        latencies.sort();
        let pct = |p: f64| latencies[((latencies.len() as f64 - 1.0) * p).round() as usize];
        println!(
            "{rounds} registrations, 5 nodes: until every node's change stream shows it: median {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            pct(0.5).as_secs_f64() * 1e3,
            pct(0.9).as_secs_f64() * 1e3,
            pct(0.99).as_secs_f64() * 1e3,
            pct(1.0).as_secs_f64() * 1e3
        );
        for n in &nodes {
            n.shutdown().await;
        }
        cancel.cancel();
    });
}
