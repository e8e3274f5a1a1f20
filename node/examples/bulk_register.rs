//! Times a deploy through a running agent on one client connection: N registrations one
//! request each, or in batches (`RegisterMany`).
//!
//! ```sh
//! cargo run --release -p roster --example bulk_register -- ws://127.0.0.1:7420 one 10000
//! cargo run --release -p roster --example bulk_register -- ws://127.0.0.1:7420 batch 10000 1000
//! cargo run --release -p roster --example bulk_register -- ws://127.0.0.1:7420 pipe 10000 64
//! ```
//!
//! `one` sends a `Register` and waits for its answer before the next; `pipe N W` sends one
//! `Register` per instance too, with up to `W` awaiting their answers (the agent answers in
//! order and commits those that wait together); `batch N B` sends `RegisterMany` of `B`.
//!
//! Registers instances `i0`..`i<N-1>` of service `bulk` (address `10.0.0.1:<port>`, one
//! metadata pair) and prints `<mode> <n> <batch> <seconds> <per-instance µs>`. Run each mode
//! against a fresh agent: the cost of a write grows with what the agent already holds.

#![allow(clippy::unwrap_used)]

use std::time::Instant;

use roster::api::{RegisterItem, Request, ServerMessage};
use roster::client::Client;

fn item(i: usize) -> RegisterItem {
    RegisterItem {
        service: "bulk".into(),
        address: format!("10.0.0.1:{}", 1 + i % 60_000),
        meta: vec![("zone".into(), "a".into())],
        instance: Some(format!("i{i}")),
        ttl_ms: None,
        checks: vec![],
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let url = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| roster::DEFAULT_AGENT_URL.to_string());
    let mode = args.get(2).map_or("batch", String::as_str).to_string();
    let n: usize = args.get(3).map_or(Ok(10_000), |s| s.parse())?;
    let batch: usize = match mode.as_str() {
        "one" => 1,
        "pipe" => args.get(4).map_or(Ok(64), |s| s.parse())?,
        _ => args.get(4).map_or(Ok(1_000), |s| s.parse())?,
    };
    let mut client = Client::connect(&url, None).await?;
    let started = Instant::now();
    let items: Vec<RegisterItem> = (0..n).map(item).collect();
    if mode == "pipe" {
        pipelined(&mut client, items, batch).await?;
        report(&mode, n, batch, started);
        return Ok(());
    }
    for chunk in items.chunks(batch) {
        let req = match mode.as_str() {
            "one" => Request::from(chunk[0].clone()),
            _ => Request::RegisterMany {
                items: chunk.to_vec(),
            },
        };
        match client.request(req).await? {
            ServerMessage::Registered { .. } | ServerMessage::RegisteredMany { .. } => {}
            other => return Err(format!("the agent answered {other:?}").into()),
        }
    }
    report(&mode, n, batch, started);
    Ok(())
}

/// Sends a `Register` per item, with up to `window` awaiting their answers.
async fn pipelined(
    client: &mut Client,
    items: Vec<RegisterItem>,
    window: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let (mut sent, mut answered) = (0, 0);
    while answered < items.len() {
        while sent < items.len() && sent - answered < window.max(1) {
            client.start(Request::from(items[sent].clone())).await?;
            sent += 1;
        }
        match client.recv().await? {
            ServerMessage::Registered { .. } => answered += 1,
            other => return Err(format!("the agent answered {other:?}").into()),
        }
    }
    Ok(())
}

fn report(mode: &str, n: usize, batch: usize, started: Instant) {
    let took = started.elapsed();
    println!(
        "{mode} {n} {batch} {:.3} {:.1}",
        took.as_secs_f64(),
        took.as_secs_f64() * 1e6 / n as f64
    );
}
