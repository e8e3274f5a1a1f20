//! Allocations (and time) per change in the protocol core alone, stage by stage: two `proto::Node`s
//! in this process, joined by hand (no runtime, no sockets), a writer `a` and a receiver
//! `b`. `--n` instances (default 1,000) are registered on `a` and reach `b`; then `--k`
//! changes (default 1,000), one every 10 ms of virtual time, each a new port for one
//! instance. A counting global allocator counts, for each change, what `b` allocates in
//! each stage of its receive path (decoding the frame, handling the message, taking its
//! outputs, encoding what it sends back) and in its timers, and what `a` allocates to write
//! and send it.
//!
//! ```sh
//! cargo run --release -p roster-transport --example core_allocs -- --n 1000 --k 1000
//! ```
//!
//! `--sites` also prints where the last change's allocations on `b`'s receive path are
//! made (the innermost three frames in roster's source). It needs symbols and line tables:
//! build with `CARGO_PROFILE_RELEASE_STRIP=none CARGO_PROFILE_RELEASE_DEBUG=line-tables-only`.
//!
//! The agent's own path around the core (sockets, tasks, snapshot publication, saves,
//! watches) is measured by `cli/examples/receive_allocs.rs`.

#![allow(unsafe_code)] // a counting global allocator cannot be written without it
#![allow(clippy::unwrap_used)] // fixed, valid inputs: a failure is a bug in the benchmark

mod support;
use support::arg;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use roster_registry::{Endpoint, Metadata, ProviderId, Replica, ReplicaId, ServiceName};
use roster_transport::message::Envelope;
use roster_transport::proto::{Config, ConnId, Node, NodeInfo, Now, Output};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

/// Whether allocations are traced to their sites now (`--sites`, one change).
static TRACING: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// Set while a site is being recorded: what that allocates is not traced.
    static IN_TRACE: Cell<bool> = const { Cell::new(false) };
    /// Allocations by site: the innermost three frames in roster's own source.
    static SITES: RefCell<BTreeMap<String, u64>> = const { RefCell::new(BTreeMap::new()) };
}

/// Counts one allocation, and records its site when tracing.
fn count() {
    if IN_TRACE.with(Cell::get) {
        return;
    }
    ALLOCS.fetch_add(1, Ordering::Relaxed);
    if TRACING.load(Ordering::Relaxed) {
        IN_TRACE.with(|c| c.set(true));
        let trace = std::backtrace::Backtrace::force_capture().to_string();
        let mut frames: Vec<&str> = Vec::new();
        for at in trace.lines().filter_map(|l| l.trim().strip_prefix("at ./")) {
            let at = at.rsplit_once(':').map_or(at, |(at, _column)| at);
            let ours = ["registry/", "transport/"].iter().any(|p| at.starts_with(p));
            if ours && !at.contains("/examples/") && frames.last() != Some(&at) && frames.len() < 3 {
                frames.push(at);
            }
        }
        SITES.with(|s| *s.borrow_mut().entry(frames.join(" < ")).or_default() += 1);
        IN_TRACE.with(|c| c.set(false));
    }
}

// SAFETY: every call is passed to the system allocator unchanged; counting allocates
// nothing (recording a site does, and is not counted).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
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

fn allocs() -> u64 {
    ALLOCS.load(Ordering::Relaxed)
}

/// The stages counted, in the order printed.
const STAGES: [&str; 7] = [
    "a: write (register)",
    "a: outputs taken and encoded",
    "b: decode",
    "b: handle_message",
    "b: outputs taken",
    "b: outputs encoded",
    "timers, both nodes",
];

/// Allocations and time per stage, summed over the changes.
#[derive(Default)]
struct Tally {
    allocs: [u64; STAGES.len()],
    nanos: [u128; STAGES.len()],
}

impl Tally {
    /// Runs `f`, adding what it allocates and the time it takes to stage `i`.
    fn count<R>(&mut self, i: usize, f: impl FnOnce() -> R) -> R {
        let before = allocs();
        let started = std::time::Instant::now();
        let r = f();
        self.nanos[i] += started.elapsed().as_nanos();
        self.allocs[i] += allocs() - before;
        r
    }
}

const A: ConnId = 1;
const B: ConnId = 2;

fn info(id: u64) -> NodeInfo {
    NodeInfo {
        id: ReplicaId(id),
        name: format!("n{id}"),
        url: format!("ws://127.0.0.{id}:7420"),
        zone: Default::default(),
    }
}

fn node(id: u64, now: Now) -> Node {
    let cfg = Config {
        rotate_interval_ms: 0,
        ..Config::default()
    };
    Node::new(
        info(id),
        Replica::new(ReplicaId(id)),
        Vec::<String>::new(),
        cfg,
        id,
        now,
    )
    .unwrap()
}

/// The frames a node asks to send, encoded (events and other outputs dropped).
fn frames(n: &mut Node) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while let Some(o) = n.poll_output() {
        if let Output::Send { envelope, .. } = o {
            out.push(envelope.encode());
        }
    }
    out
}

/// Delivers frames both ways until neither node has more to send (nothing counted).
fn settle(a: &mut Node, b: &mut Node, now: Now) {
    loop {
        let to_b = frames(a);
        let to_a = frames(b);
        if to_b.is_empty() && to_a.is_empty() {
            return;
        }
        for f in to_b {
            let _ = b.handle_message(A, Envelope::decode(&f).unwrap(), now);
        }
        for f in to_a {
            let _ = a.handle_message(B, Envelope::decode(&f).unwrap(), now);
        }
    }
}

fn register(a: &mut Node, i: usize, port: u16, now: Now) {
    let service = ServiceName::new("churn").unwrap();
    let provider = ProviderId::new(&format!("inst-{i}")).unwrap();
    let endpoint = Endpoint::new("10.0.0.1", port).unwrap();
    a.register(service, provider, endpoint, Metadata::default(), now)
        .unwrap();
}

fn main() {
    let n = arg("--n", 1_000);
    let k = arg("--k", 1_000);
    let sites = std::env::args().any(|a| a == "--sites");
    let mut t = 1_800_000_000_000u64;
    let now = |t: u64| Now {
        mono_ms: t,
        wall_ms: t,
    };
    let mut a = node(1, now(t));
    let mut b = node(2, now(t));
    // `a` dialed `b` (conn A is a's end, as `b` names it; B is b's end, as `a` names it).
    a.handle_connected(B, &info(2), true, None, now(t));
    b.handle_connected(A, &info(1), false, None, now(t));
    for i in 0..n {
        register(&mut a, i, 1, now(t));
    }
    for _ in 0..300 {
        t += 10;
        a.handle_timeout(now(t));
        b.handle_timeout(now(t));
        settle(&mut a, &mut b, now(t));
    }
    assert_eq!(b.replica().state(), a.replica().state(), "b holds what a holds");

    let mut tally = Tally::default();
    let mut frames_to_b = 0u64;
    for c in 0..k {
        t += 10;
        tally.count(0, || register(&mut a, c % n, 2 + (c / n) as u16, now(t)));
        tally.count(6, || {
            a.handle_timeout(now(t));
            b.handle_timeout(now(t));
        });
        let to_b = tally.count(1, || frames(&mut a));
        frames_to_b += to_b.len() as u64;
        // One change, the last, traced to its sites (after the counts: tracing allocates).
        TRACING.store(sites && c + 1 == k, Ordering::Relaxed);
        for f in to_b {
            let env = tally.count(2, || Envelope::decode(&f).unwrap());
            tally.count(3, || b.handle_message(A, env, now(t))).unwrap();
        }
        let mut back = Vec::new();
        tally.count(4, || {
            while let Some(o) = b.poll_output() {
                back.push(o);
            }
        });
        let to_a: Vec<Vec<u8>> = tally.count(5, || {
            back.into_iter()
                .filter_map(|o| match o {
                    Output::Send { envelope, .. } => Some(envelope.encode()),
                    _ => None,
                })
                .collect()
        });
        TRACING.store(false, Ordering::Relaxed);
        for f in to_a {
            let _ = a.handle_message(B, Envelope::decode(&f).unwrap(), now(t));
        }
    }
    assert_eq!(b.replica().state(), a.replica().state(), "b holds every change");
    println!(
        "n={n} changes={k}, frames to b per change {:.2}",
        frames_to_b as f64 / k as f64
    );
    println!("| stage | allocations per change | µs per change |");
    println!("|---|---:|---:|");
    let per = |n: f64| n / k as f64;
    for (i, s) in STAGES.iter().enumerate() {
        let us = tally.nanos[i] as f64 / 1_000.0;
        println!("| {s} | {:.1} | {:.2} |", per(tally.allocs[i] as f64), per(us));
    }
    let allocs: u64 = tally.allocs[2..6].iter().sum();
    let us = tally.nanos[2..6].iter().sum::<u128>() as f64 / 1_000.0;
    println!(
        "| b: receive path, all | {:.1} | {:.2} |",
        per(allocs as f64),
        per(us)
    );
    if sites {
        print_sites();
    }
}

/// The sites of the last change's allocations on `b`'s receive path, most first.
fn print_sites() {
    let mut sites: Vec<(String, u64)> = SITES.with(|s| s.borrow().clone()).into_iter().collect();
    sites.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    println!("\nthe last change's allocations on b's receive path, by site (innermost first):");
    for (site, n) in sites {
        println!("{n:4}  {site}");
    }
}
