//! Allocations per change on the receive path: an embedded `roster::Node` in this process
//! receives changes written through a `roster agent` in another, and a counting global
//! allocator counts what the node's threads allocate.
//!
//! ```sh
//! cargo build --release -p roster-cli     # the writer runs target/release/roster
//! cargo run --release -p roster-cli --example receive_allocs -- --n 1000 --rate 100 --secs 10
//! ```
//!
//! The writer is a `roster agent` (temporary data directory, killed by its pid at the end);
//! the receiver is a node embedded here, with a data directory (so its saves count), that
//! joins it. `--n` instances (default 1,000) of service `churn` are registered through the
//! writer in one `RegisterMany`; once the receiver holds them, it idles for `--secs`
//! (default 10: what the background costs), then `--rate` changes a second (default 100) go
//! to the writer for `--secs`, one `Register` each, on one client connection, and the run
//! ends when the receiver shows the last. Printed: allocations (and bytes allocated) per
//! change on the node's threads (its runtime's workers and blocking threads; the client
//! that drives the writer runs on a thread of its own, not counted), the same per second of
//! idle, and the receiver's CPU per change (the whole process: the client's thread
//! included).

#![allow(unsafe_code)] // a counting global allocator cannot be written without it
#![allow(clippy::unwrap_used)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use roster::api::{RegisterItem, Request, ServerMessage};
use roster::client::Client;

#[path = "churn_cost/item.rs"]
mod item;
use item::{item, SERVICE};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Counts the allocations of threads marked with [`COUNTED`].
struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Whether this thread belongs to the node under measure.
    static COUNTED: Cell<bool> = const { Cell::new(false) };
}

fn count(size: usize) {
    if COUNTED.try_with(Cell::get).unwrap_or(false) {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(size as u64, Ordering::Relaxed);
    }
}

// SAFETY: every call is passed to the system allocator unchanged; counting allocates nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const USAGE: &str = "usage: receive_allocs [--n 1000] [--rate 100] [--secs 10]";

/// The writer agent; dropping it kills it and waits for it.
struct Writer(Child);

impl Drop for Writer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `roster agent` (beside this example's directory) and returns it and its URL.
fn writer(dir: &Path) -> Result<(Writer, String), Error> {
    let exe = std::env::current_exe()?;
    let bin = exe.parent().and_then(Path::parent).map(|d| d.join("roster"));
    let bin = bin
        .filter(|p| p.is_file())
        .ok_or("no roster binary beside this example; run `cargo build --release -p roster-cli` first")?;
    let mut child = Command::new(bin)
        .env("ROSTER_HTTP_LISTEN", "127.0.0.1:0")
        .env("ROSTER_LOG", "error")
        .env_remove("ROSTER_AGENT")
        .args([
            "agent",
            "--listen",
            "127.0.0.1:0",
            "--node-name",
            "w",
            "--crash-guard",
            "off",
        ])
        .arg("--data-dir")
        .arg(dir)
        .stdout(Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let w = Writer(child);
    let mut lines = BufReader::new(stdout).lines();
    for line in lines.by_ref() {
        if let Some(url) = line?.strip_prefix("listening on ") {
            let url = url.to_string();
            std::thread::spawn(move || lines.for_each(drop));
            return Ok((w, url));
        }
    }
    Err("the writer exited before it said where it listens".into())
}

fn acked(m: ServerMessage) -> Result<(), Error> {
    match m {
        ServerMessage::Registered { .. } | ServerMessage::RegisteredMany { .. } => Ok(()),
        other => Err(format!("the writer answered {}", other.name()).into()),
    }
}

/// Drives the writer from a thread of its own (its allocations are not counted): the
/// preload, then, on `go`, `rate` changes a second for `secs`.
fn drive(
    url: String,
    n: usize,
    rate: f64,
    secs: f64,
    go: std::sync::mpsc::Receiver<()>,
) -> Result<u64, Error> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let mut client = Client::connect(&url, None).await?;
        let seq0 = |i: usize| RegisterItem {
            meta: vec![("seq".into(), "0".into())],
            ..item(n, i as u64)
        };
        let items = (0..n).map(seq0).collect();
        acked(client.request(Request::RegisterMany { items }).await?)?;
        go.recv()?;
        let changes = (rate * secs).round() as u64;
        let start = tokio::time::Instant::now();
        for seq in 1..=changes {
            tokio::time::sleep_until(start + Duration::from_secs_f64((seq - 1) as f64 / rate)).await;
            acked(client.request(Request::from(item(n, seq))).await?)?;
        }
        Ok(changes)
    })
}

/// Whether the receiver shows instance `c<seq mod n>` with `seq`.
fn shows(node: &roster::Node, n: usize, seq: u64) -> bool {
    let id = format!("c{}", (seq as usize) % n);
    node.lookup(SERVICE)
        .iter()
        .any(|i| i.id == id && i.meta.get("seq").is_some_and(|s| *s == seq.to_string()))
}

fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = stat.rsplit_once(')').map_or("", |r| r.1);
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    // utime and stime (fields 14 and 15), in clock ticks (100 a second on Linux).
    (f.get(11).unwrap_or(&0.0) + f.get(12).unwrap_or(&0.0)) / 100.0
}

fn counted() -> (u64, u64) {
    (ALLOCS.load(Ordering::Relaxed), BYTES.load(Ordering::Relaxed))
}

fn parse() -> Result<(usize, f64, f64), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut n, mut rate, mut secs) = (1_000, 100.0, 10.0);
    for pair in args.chunks(2) {
        let [flag, v] = pair else { return Err(USAGE.into()) };
        match flag.as_str() {
            "--n" => n = v.parse().map_err(|_| USAGE)?,
            "--rate" => rate = v.parse().map_err(|_| USAGE)?,
            "--secs" => secs = v.parse().map_err(|_| USAGE)?,
            _ => return Err(USAGE.into()),
        }
    }
    if n == 0 || rate <= 0.0 || secs <= 0.0 {
        return Err(USAGE.into());
    }
    Ok((n, rate, secs))
}

fn main() -> Result<(), Error> {
    let (n, rate, secs) = parse()?;
    let dir = tempfile::tempdir()?;
    let (_writer, url) = writer(&dir.path().join("w"))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .on_thread_start(|| COUNTED.with(|c| c.set(true)))
        .build()?;
    let node = rt.block_on(
        roster::Node::builder()
            .join([url.clone()])
            .data_dir(dir.path().join("r"))
            .crash_guard(None)
            .start(),
    )?;
    let (go, wait) = std::sync::mpsc::channel();
    let driver = std::thread::spawn(move || drive(url, n, rate, secs, wait));
    while node.lookup(SERVICE).len() < n {
        std::thread::sleep(Duration::from_millis(20));
    }
    let (a0, _) = counted();
    std::thread::sleep(Duration::from_secs_f64(secs));
    let (a1, b1) = counted();
    let cpu1 = cpu_seconds();
    let started = Instant::now();
    go.send(())?;
    let changes = driver.join().map_err(|_| "the driver panicked")??;
    while !shows(&node, n, changes) {
        if started.elapsed() > Duration::from_secs_f64(secs + 30.0) {
            return Err("the receiver did not show the last change within 30 s".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let (a2, b2) = counted();
    let cpu2 = cpu_seconds();
    let per = changes as f64;
    let idle = (a1 - a0) as f64 / secs;
    println!(
        "N={n} K={rate}/s changes={changes} | receiver allocs/change {:.1} ({:.0} bytes/change) | idle allocs/s {idle:.1} | receiver cpu ms/change {:.3} (process, client thread included)",
        (a2 - a1) as f64 / per,
        (b2 - b1) as f64 / per,
        (cpu2 - cpu1) * 1e3 / per
    );
    rt.block_on(node.shutdown())?;
    Ok(())
}
