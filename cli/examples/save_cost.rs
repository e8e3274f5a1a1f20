//! What one save of the replica costs: the encoded size and the time of one redb commit,
//! for registries of several sizes.
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
    println!("registrations  encoded bytes  save (median of 10)  save (max)");
    for n in sizes {
        let mut r = Replica::new(ReplicaId(7));
        let meta: Metadata = [("zone", "eu-1a"), ("version", "1.2.3")].into();
        for i in 0..n {
            let service = ServiceName::new(&format!("svc-{}", i % 1000)).unwrap();
            let provider = ProviderId::new(&format!("p-{}", i / 10)).unwrap();
            let endpoint = Endpoint::new("10.1.2.3", 8000 + (i % 1000) as u16).unwrap();
            r.register(
                service,
                provider,
                endpoint,
                meta.clone(),
                60_000,
                Hlc::new(1_000 + i as u64, 0),
            )
            .unwrap();
        }
        let bytes = codec::encode_state(r.state()).len();
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(dir.path(), ReplicaId(7), 0).unwrap();
        let mut times: Vec<f64> = (0..10)
            .map(|_| {
                let t = Instant::now();
                store.save_replica(&r, false).unwrap();
                t.elapsed().as_secs_f64() * 1000.0
            })
            .collect();
        times.sort_by(f64::total_cmp);
        println!(
            "{n:>13}  {bytes:>13}  {:>16.2} ms  {:>7.2} ms",
            times[5], times[9]
        );
    }
}
