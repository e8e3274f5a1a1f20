//! What saving the replica costs, for registries of several sizes: one save of the whole
//! replica as a new store first writes it, then one save after ONE registration changed
//! (median and max of 10, each after its own change), and the time to open the store
//! again and load the replica it holds.
//!
//! ```sh
//! cargo run --release -p roster --example save_cost -- 1000 10000 100000
//! ```

#![allow(clippy::unwrap_used)]

use std::time::Instant;

use roster::registry::{codec, Endpoint, Hlc, Metadata, ProviderId, Replica, ReplicaId, ServiceName};
use roster::store::Store;

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().unwrap())
        .collect::<Vec<_>>();
    let sizes = if sizes.is_empty() {
        vec![1_000, 10_000, 100_000]
    } else {
        sizes
    };
    println!("registrations  encoded bytes  first save  one change, median  one change, max  load");
    for n in sizes {
        measure(n);
    }
}

fn register(r: &mut Replica, i: usize, port: u16, at: u64) {
    let meta: Metadata = [("zone", "eu-1a"), ("version", "1.2.3")].into();
    let service = ServiceName::new(&format!("svc-{}", i % 1000)).unwrap();
    let provider = ProviderId::new(&format!("p-{}", i / 10)).unwrap();
    let endpoint = Endpoint::new("10.1.2.3", port).unwrap();
    r.register(service, provider, endpoint, meta, 60_000, Hlc::new(at, 0))
        .unwrap();
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

fn measure(n: usize) {
    let dir = tempfile::tempdir().unwrap();
    let (store, loaded) = Store::open(dir.path(), ReplicaId(7), 0).unwrap();
    let mut r = loaded.replica;
    for i in 0..n {
        register(&mut r, i, 8000 + (i % 1000) as u16, 1_000 + i as u64);
    }
    let bytes = codec::encode_state(r.state()).len();
    let t = Instant::now();
    save(&store, &mut r);
    let first = ms(t);
    let mut times: Vec<f64> = (0..10)
        .map(|k| {
            // One registration changes its port: one key (its lease is still live).
            register(&mut r, k * 7, 9000 + k as u16, 1_000 + (n + k) as u64);
            let t = Instant::now();
            save(&store, &mut r);
            ms(t)
        })
        .collect();
    times.sort_by(f64::total_cmp);
    drop(store);
    let t = Instant::now();
    let (_store, again) = Store::open(dir.path(), ReplicaId(7), 0).unwrap();
    let load = ms(t);
    assert_eq!(again.replica.state(), r.state());
    println!(
        "{n:>13}  {bytes:>13}  {first:>7.2} ms  {:>15.2} ms  {:>12.2} ms  {load:.0} ms",
        times[5], times[9]
    );
}

fn save(store: &Store, r: &mut Replica) {
    let changed = r.take_changed().unwrap();
    store.save_replica(r, &changed, false).unwrap();
}
