//! Times a deploy through a running agent on one client connection: N registrations one
//! request each, or in batches (`RegisterMany`).
//!
//! ```sh
//! cargo run --release -p roster --example bulk_register -- ws://127.0.0.1:7420 one 10000
//! cargo run --release -p roster --example bulk_register -- ws://127.0.0.1:7420 batch 10000 1000
//! ```
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
        _ => args.get(4).map_or(Ok(1_000), |s| s.parse())?,
    };
    let mut client = Client::connect(&url, None).await?;
    let started = Instant::now();
    let items: Vec<RegisterItem> = (0..n).map(item).collect();
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
    let took = started.elapsed();
    println!(
        "{mode} {n} {batch} {:.3} {:.1}",
        took.as_secs_f64(),
        took.as_secs_f64() * 1e6 / n as f64
    );
    Ok(())
}
