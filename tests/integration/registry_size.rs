//! The registry's size is bounded by live services and live nodes: no tombstone per key
//! survives a removal, however many there were.

use roster_registry::codec::encode_state;
use roster_registry::{Endpoint, HlcClock, ProviderId, Replica, ReplicaId, ServiceName};

fn names(n: usize) -> Vec<ServiceName> {
    (0..n)
        .map(|i| ServiceName::new(&format!("svc-{i}")).unwrap())
        .collect()
}

#[test]
fn a_million_register_deregister_cycles_leave_the_size_of_the_live_services() {
    let services = names(1_000);
    let live = ProviderId::new("live").unwrap();
    let churn = ProviderId::new("churn").unwrap();
    let ep = Endpoint::parse("10.1.2.3:8080").unwrap();
    let mut clock = HlcClock::new();
    let ttl = 3_600_000;

    let mut fresh = Replica::new(ReplicaId(0xDEAD_BEEF));
    for s in &services {
        fresh
            .register(
                s.clone(),
                live.clone(),
                ep.clone(),
                Default::default(),
                ttl,
                clock.tick(1_000),
            )
            .unwrap();
    }
    let baseline = encode_state(fresh.state()).len();

    let mut churned = fresh.clone();
    let mut now = 1_000;
    for i in 0..1_000_000usize {
        now += 1;
        let s = &services[i % services.len()];
        churned
            .register(
                s.clone(),
                churn.clone(),
                ep.clone(),
                Default::default(),
                ttl,
                clock.tick(now),
            )
            .unwrap();
        churned.deregister(s.clone(), churn.clone(), now).unwrap();
    }
    // Every registration lives by the node's one lease: what is left is the live
    // services and that lease, as before the churn.
    let after = encode_state(churned.state()).len();
    eprintln!("live services alone: {baseline} bytes; after 1,000,000 cycles: {after} bytes");
    assert_eq!(churned.context().cloud_len(), 0);
    assert_eq!(churned.context().vector_len(), 1);
    assert_eq!(churned.state().registration_count(), services.len());
    assert!(
        after * 10 <= baseline * 11,
        "{after} bytes is more than 10% over {baseline}"
    );
}
