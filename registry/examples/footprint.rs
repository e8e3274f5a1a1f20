//! Prints the registry's sizes: the encoded size of typical deltas and digests, and the
//! resident bytes per live registration, counted by a global allocator.
//!
//! Run: `cargo run --release -p roster-registry --example footprint`.

#![allow(unsafe_code)] // a counting global allocator cannot be written without it
#![allow(clippy::unwrap_used)] // fixed, valid inputs: a failure is a bug here

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use roster_registry::codec::{encode_context, encode_state};
use roster_registry::{Endpoint, Hlc, HlcClock, Metadata, ProviderId, Replica, ReplicaId, ServiceName};

/// Counts the bytes currently allocated.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn meta() -> Metadata {
    [
        ("zone".to_string(), "eu-1a".to_string()),
        ("version".to_string(), "1.4.2".to_string()),
    ]
    .into()
}

/// Heap bytes and encoded bytes of a replica holding `services` x `per_service`
/// registrations, each provider offering `offers` of those services (sharing one lease).
fn resident(services: usize, per_service: usize, offers: usize) -> (usize, usize) {
    let n = services * per_service;
    let names: Vec<ServiceName> = (0..services)
        .map(|i| ServiceName::new(&format!("svc-{i}.prod")).unwrap())
        .collect();
    let providers: Vec<ProviderId> = (0..n / offers)
        .map(|i| ProviderId::new(&format!("host-{i}")).unwrap())
        .collect();
    let mut clock = HlcClock::new();
    let before = LIVE.load(Ordering::Relaxed);
    let mut r = Replica::new(ReplicaId(0x5eed_0000_0000_0001));
    for i in 0..n {
        let ep = Endpoint::new("10.20.30.40", 8080).unwrap();
        let (service, provider) = (names[i % services].clone(), providers[i / offers].clone());
        r.register(service, provider, ep, meta(), 30_000, clock.tick(1_000))
            .unwrap();
    }
    let bytes = LIVE.load(Ordering::Relaxed) - before;
    let encoded = encode_state(r.state()).len();
    drop(r);
    (bytes, encoded)
}

fn main() {
    let mut r = Replica::new(ReplicaId(0x5eed_0000_0000_0001));
    let web = ServiceName::new("web").unwrap();
    let p = ProviderId::new("web-1").unwrap();
    let ep = Endpoint::parse("10.0.0.7:8080").unwrap();
    let now = Hlc::new(1_764_460_800_000, 0);
    let first = r
        .register(web.clone(), p.clone(), ep.clone(), meta(), 30_000, now)
        .unwrap()
        .delta;
    let update = r
        .register(
            web.clone(),
            p.clone(),
            ep,
            meta(),
            30_000,
            Hlc::new(1_764_460_801_000, 0),
        )
        .unwrap()
        .delta;
    let renewal = r.renew(30_000, Hlc::new(1_764_460_810_000, 0)).unwrap().delta;
    let dereg = r.deregister(web, p, 1_764_460_811_000).unwrap().delta;
    println!("encoded sizes (bytes), two metadata pairs, a random 64-bit node id:");
    println!(
        "  first registration (registration + lease): {}",
        encode_state(&first).len()
    );
    println!(
        "  update of a registration (lease still live): {}",
        encode_state(&update).len()
    );
    println!("  lease renewal: {}", encode_state(&renewal).len());
    println!("  deregistration: {}", encode_state(&dereg).len());
    println!(
        "  digest of a replica that heard from 1 node: {}",
        encode_context(r.context()).len()
    );
    println!();
    println!("resident bytes per live registration (heap, counted by the allocator):");
    for (services, per, offers) in [(10_000, 1, 1), (100, 100, 1), (1_000, 10, 1), (1_000, 10, 10)] {
        let (bytes, encoded) = resident(services, per, offers);
        let n = services * per;
        println!(
            "  {services:>6} services x {per:>3} instances, {offers:>2} services per provider: \
             {:>4} B resident, {:>3} B encoded per registration",
            bytes / n,
            encoded / n
        );
    }
}
