//! The memory a node holds per member of its cluster, part by part: the replica's
//! membership registration and lease of each member, the peer record the node keeps for
//! each, and the digests of the peers it is connected to. Issue 29's first figure: under
//! 200 bytes a member.
//!
//! `--n` members (default 10,000) are made synthetically, each by a `proto::Node` of its
//! own that writes its membership and is dropped; their states are joined into the replica
//! of the node measured, `b`. A counting global allocator gives the live heap bytes:
//! 1. of the replica holding every member (`Replica::from_state`);
//! 2. of the node started on it after a minute of virtual time, connected to `--links`
//!    peers (default 4; nodes that hold the same members, exchanging with `b` by hand, as
//!    `core_allocs` does), with a record for every member it may dial and the peers'
//!    digests. The peers are dropped before the count. Run with `--links 0` to tell the
//!    digests from the rest.
//!
//! ```sh
//! cargo run --release -p roster-transport --example member_footprint -- --n 10000
//! ```

#![allow(unsafe_code)] // a counting global allocator cannot be written without it
#![allow(clippy::unwrap_used)] // fixed, valid inputs: a failure is a bug in the benchmark

mod support;
use support::arg;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use roster_registry::codec::{decode_state, encode_state};
use roster_registry::{Replica, ReplicaId, State};
use roster_transport::message::Envelope;
use roster_transport::proto::{Config, ConnId, Node, NodeInfo, Now, Output};

/// Counts the bytes currently allocated.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed to the system allocator unchanged; counting allocates nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}

fn info(id: u64) -> NodeInfo {
    NodeInfo {
        id: ReplicaId(id),
        name: format!("node-{id}"),
        url: format!("ws://10.{}.{}.{}:7420", id >> 16, (id >> 8) & 255, id & 255),
        zone: Default::default(),
    }
}

fn node(id: u64, replica: Replica, now: Now) -> Node {
    Node::new(
        info(id),
        replica,
        Vec::<String>::new(),
        Config::default(),
        id,
        now,
    )
    .unwrap()
}

/// The frames `n` asks to send on `conn`; other outputs (dials, events) are dropped.
fn frames_on(n: &mut Node, conn: ConnId) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while let Some(o) = n.poll_output() {
        if let Output::Send { conn: c, envelope } = o {
            if c == conn {
                out.push(envelope.encode());
            }
        }
    }
    out
}

/// Every member's membership, as the members wrote it and as it reaches a node: encoded
/// and decoded, so no string is shared that a node would not share (every member here
/// writes the same static service name).
fn members(n: u64, now: Now) -> State {
    let mut all = State::new();
    for id in 1..=n {
        let member = node(id, Replica::new(ReplicaId(id)), now);
        let bytes = encode_state(member.replica().state());
        all.join(decode_state(&bytes).unwrap());
    }
    all
}

fn main() {
    let n = arg("--n", 10_000) as u64;
    let links = arg("--links", 4) as u64;
    let mut t = 1_800_000_000_000u64;
    let now = |t: u64| Now {
        mono_ms: t,
        wall_ms: t,
    };
    let me = n + 1;

    // Nothing of `b` exists yet; the peers are built after, each from members of its own
    // (persistent maps share what is cloned: a clone would hide what `b` holds).
    let start = live();
    let replica = Replica::from_state(ReplicaId(me), members(n, now(t)), 0);
    let replica_bytes = live() - start;
    let mut b = node(me, replica, now(t));

    let mut others: Vec<Node> = (1..=links)
        .map(|id| {
            node(
                id,
                Replica::from_state(ReplicaId(id), members(n, now(t)), 0),
                now(t),
            )
        })
        .collect();
    for (i, o) in others.iter_mut().enumerate() {
        let conn = i as ConnId + 1;
        let id = i as u64 + 1;
        b.handle_connected(conn, &info(id), true, None, now(t));
        o.handle_connected(conn, &info(me), false, None, now(t));
    }
    for _ in 0..600 {
        t += 100;
        exchange(&mut b, &mut others, now(t));
    }
    // What is left counted is `b`'s: the peers, and every frame, are gone.
    drop(others);
    let total = live() - start;
    let per = |bytes: usize| bytes as f64 / n as f64;
    println!(
        "members={n} links={links} | the replica {:.0} B/member | the node after 60 s (peer records, digests, buffers) {:.0} B/member more | total {:.0} B/member, {:.1} MiB",
        per(replica_bytes),
        per(total - replica_bytes),
        per(total),
        total as f64 / (1024.0 * 1024.0)
    );
}

/// One tick of every node, and every frame between `b` and its peers delivered.
fn exchange(b: &mut Node, others: &mut [Node], now: Now) {
    b.handle_timeout(now);
    for (i, o) in others.iter_mut().enumerate() {
        o.handle_timeout(now);
        let conn = i as ConnId + 1;
        for f in frames_on(o, conn) {
            let _ = b.handle_message(conn, Envelope::decode(&f).unwrap(), now);
        }
    }
    let mut to_others: Vec<Vec<Vec<u8>>> = vec![Vec::new(); others.len()];
    while let Some(out) = b.poll_output() {
        if let Output::Send { conn, envelope } = out {
            if let Some(slot) = to_others.get_mut(conn as usize - 1) {
                slot.push(envelope.encode());
            }
        }
    }
    for (i, fs) in to_others.into_iter().enumerate() {
        for f in fs {
            let _ = others[i].handle_message(i as ConnId + 1, Envelope::decode(&f).unwrap(), now);
        }
    }
}
