//! The load: a preload of `n` instances, watches on every agent recording when each change
//! shows, and paced changes through one client connection.

use std::collections::HashMap;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use roster::api::{EventView, RegisterItem, Request, ServerMessage};
use roster::client::Client;

use crate::cluster::Cluster;
use crate::item::item;
pub use crate::item::SERVICE;
use crate::Error;

/// Instances per `RegisterMany` of the preload.
const PRELOAD_BATCH: usize = 5_000;
/// How long changes may take to show everywhere after the last was sent, before the
/// missing ones count as unseen.
const GRACE: Duration = Duration::from_secs(5);

/// When each node's watch first showed each change, by its seq.
pub type Sightings = Arc<Mutex<HashMap<u64, [Option<Instant>; 3]>>>;

/// Registers instances `c0`..`c<n-1>` through agent `a` in batches, and waits until every
/// agent holds them all.
pub async fn preload(cluster: &Cluster, n: usize) -> Result<(), Error> {
    let mut client = cluster.agents[0].client().await?;
    let seq0 = |i: usize| RegisterItem {
        meta: vec![("seq".into(), "0".into())],
        ..item(n, i as u64)
    };
    let items: Vec<RegisterItem> = (0..n).map(seq0).collect();
    for chunk in items.chunks(PRELOAD_BATCH) {
        let req = Request::RegisterMany {
            items: chunk.to_vec(),
        };
        acked(client.request(req).await?)?;
    }
    let limit = Duration::from_secs(60 + n as u64 / 500);
    cluster.wait_for(SERVICE, n as u64, limit).await
}

/// An answer that says the change was made, or the agent's error.
fn acked(answer: ServerMessage) -> Result<(), Error> {
    match answer {
        ServerMessage::Registered { .. } | ServerMessage::RegisteredMany { .. } => Ok(()),
        ServerMessage::Error { message, .. } => Err(message.into()),
        other => Err(format!("the agent answered {}", other.name()).into()),
    }
}

/// Opens a watch of [`SERVICE`] on every agent and waits until each has shown the `n`
/// instances held (the watch's first events); then changes are recorded in the result.
pub async fn watch_all(cluster: &Cluster, n: usize) -> Result<Sightings, Error> {
    let seen: Sightings = Arc::default();
    let mut counts = Vec::new();
    for (node, agent) in cluster.agents.iter().enumerate() {
        let mut client = agent.client().await?;
        client
            .start(Request::Watch {
                service: SERVICE.into(),
                all: false,
            })
            .await?;
        let count = Arc::new(AtomicU64::new(0));
        counts.push(count.clone());
        tokio::spawn(watch(client, node, seen.clone(), count));
    }
    let deadline = Instant::now() + Duration::from_secs(60 + n as u64 / 500);
    while counts.iter().any(|c| c.load(Ordering::Relaxed) < n as u64) {
        if Instant::now() > deadline {
            return Err("the watches did not show the instances held within the limit".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(seen)
}

/// `k` more watches on every agent, each of a service nobody writes (`other-0`...): what
/// watches of other services cost a node per change. They live as long as the process.
pub async fn watch_others(cluster: &Cluster, k: usize) -> Result<(), Error> {
    for agent in &cluster.agents {
        for i in 0..k {
            let mut client = agent.client().await?;
            client
                .start(Request::Watch {
                    service: format!("other-{i}"),
                    all: false,
                })
                .await?;
            tokio::spawn(async move { while client.recv().await.is_ok() {} });
        }
    }
    Ok(())
}

/// One watch: counts its events and records the first sighting of each seq above 0.
async fn watch(mut client: Client, node: usize, seen: Sightings, count: Arc<AtomicU64>) {
    while let Ok(msg) = client.recv().await {
        let at = Instant::now();
        let ServerMessage::Event(EventView::Up(i)) = msg else {
            continue;
        };
        count.fetch_add(1, Ordering::Relaxed);
        let seq = i
            .meta
            .iter()
            .find(|(k, _)| k == "seq")
            .and_then(|(_, v)| v.parse().ok());
        if let Some(seq) = seq.filter(|&s: &u64| s > 0) {
            if let Ok(mut seen) = seen.lock() {
                seen.entry(seq).or_default()[node].get_or_insert(at);
            }
        }
    }
}

/// The changes of one run: `rate` a second for `secs`, `batch` per request, up to
/// `window` requests awaiting their answer.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    pub rate: f64,
    pub secs: f64,
    pub batch: usize,
    pub window: usize,
}

/// What a run sent: each acknowledged change's seq and when its request was written; how
/// many requests failed; how long sending took.
pub struct Sent {
    pub changes: Vec<(u64, Instant)>,
    pub errors: u64,
    pub took: Duration,
    /// Each request's round trip, until the agent's answer (ms, in order).
    pub acks: Vec<f64>,
}

/// Sends `load` through one connection to agent `a`, each request at its due time, or as
/// soon as fewer than `window` requests await their answers (with a window of 1: request
/// after request). Seqs start at `first`.
pub async fn drive(cluster: &Cluster, n: usize, first: u64, load: Load) -> Result<Sent, Error> {
    let mut client = cluster.agents[0].client().await?;
    let per_request = load.batch as f64 / load.rate;
    let requests = (load.rate * load.secs / load.batch as f64).round() as u64;
    let start = tokio::time::Instant::now();
    let mut sent = Sent {
        changes: Vec::new(),
        errors: 0,
        took: Duration::ZERO,
        acks: Vec::new(),
    };
    let mut waiting: VecDeque<(Vec<u64>, Instant)> = VecDeque::new();
    let mut j = 0;
    loop {
        // Answers slower than the pace: stop at the time given, not at the count.
        let more = j < requests && start.elapsed().as_secs_f64() < load.secs;
        if !more && waiting.is_empty() {
            break;
        }
        let due = start + Duration::from_secs_f64(per_request * j as f64);
        tokio::select! {
            () = tokio::time::sleep_until(due), if more && waiting.len() < load.window => {
                let seqs: Vec<u64> = (0..load.batch as u64)
                    .map(|k| first + j * load.batch as u64 + k)
                    .collect();
                client.start(request(n, &seqs)).await?;
                waiting.push_back((seqs, Instant::now()));
                j += 1;
            }
            answer = client.recv(), if !waiting.is_empty() => {
                let Some((seqs, at)) = waiting.pop_front() else { continue };
                sent.acks.push(at.elapsed().as_secs_f64() * 1e3);
                match answer.map_err(Error::from).and_then(acked) {
                    Ok(()) => sent.changes.extend(seqs.iter().map(|&s| (s, at))),
                    Err(_) => sent.errors += 1,
                }
            }
        }
    }
    sent.took = start.elapsed();
    Ok(sent)
}

/// One `Register`, or a `RegisterMany` for more than one change.
fn request(n: usize, seqs: &[u64]) -> Request {
    match seqs {
        [seq] => Request::from(item(n, *seq)),
        _ => Request::RegisterMany {
            items: seqs.iter().map(|&s| item(n, s)).collect(),
        },
    }
}

/// Waits until every sent change has shown on every node, or [`GRACE`] has passed.
pub async fn settle(seen: &Sightings, sent: &Sent) {
    let deadline = Instant::now() + GRACE;
    while Instant::now() < deadline {
        let all = seen.lock().is_ok_and(|seen| {
            sent.changes
                .iter()
                .all(|(s, _)| seen.get(s).is_some_and(|n| n.iter().all(Option::is_some)))
        });
        if all {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// How long changes took to show (ms, sorted), and how many did not.
pub struct Lags {
    /// Until the last of the three nodes showed each change.
    pub last: Vec<f64>,
    /// Until the writer (`a`) showed it.
    pub writer: Vec<f64>,
    /// Changes some node never showed.
    pub unseen: u64,
}

/// The lags of the changes sent.
pub fn lags(seen: &Sightings, sent: &Sent) -> Lags {
    let mut out = Lags {
        last: Vec::new(),
        writer: Vec::new(),
        unseen: 0,
    };
    let Ok(seen) = seen.lock() else {
        out.unseen = sent.changes.len() as u64;
        return out;
    };
    let ms = |at: Instant, sent: Instant| at.saturating_duration_since(sent).as_secs_f64() * 1e3;
    for (seq, at) in &sent.changes {
        let nodes = seen.get(seq).copied().unwrap_or_default();
        match nodes.iter().copied().collect::<Option<Vec<_>>>() {
            Some(all) => out.last.extend(all.into_iter().max().map(|l| ms(l, *at))),
            None => out.unseen += 1,
        }
        out.writer.extend(nodes[0].map(|l| ms(l, *at)));
    }
    out.last.sort_by(f64::total_cmp);
    out.writer.sort_by(f64::total_cmp);
    out
}

/// The `q` quantile of sorted values (nearest rank); 0 when empty.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}
