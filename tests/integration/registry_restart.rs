//! A node that crashes resumes from an older saved state with a counter floor above it:
//! it never reuses a dot, and closing the gap keeps every context compact and removes the
//! writes of its that were lost with the crash.

use std::collections::BTreeSet;

use roster_registry::{HlcClock, Metadata, RegKey, Replica, ReplicaId, State};

use crate::support::{endpoint, provider, service};

const TTL: u64 = 60_000;

#[test]
fn a_crashed_node_resumes_under_its_floor_and_closing_the_gap_compacts_every_context() {
    let me = ReplicaId(1);
    let mut clock = HlcClock::default();
    let mut a = Replica::new(me);
    let mut b = Replica::new(ReplicaId(2));
    let (web, db) = (service(0), service(1));
    let p = provider(0);
    let mut at = 1_000;
    let ship = |delta: State, b: &mut Replica, at: u64| b.apply(delta, at);

    let d = a
        .register(
            web.clone(),
            p.clone(),
            endpoint(1),
            Metadata::default(),
            TTL,
            clock.tick(at),
        )
        .unwrap();
    ship(d.delta, &mut b, at);
    // What was saved on disk: the state as of now, with a floor reserved 64 ahead.
    let saved = a.state().clone();
    let floor = a.counter() + 64;
    // After the save, before the crash: an update of web and a registration of db reach b.
    at += 10;
    let d = a
        .register(
            web.clone(),
            p.clone(),
            endpoint(2),
            Metadata::default(),
            TTL,
            clock.tick(at),
        )
        .unwrap();
    ship(d.delta, &mut b, at);
    let d = a
        .register(
            db.clone(),
            p.clone(),
            endpoint(3),
            Metadata::default(),
            TTL,
            clock.tick(at),
        )
        .unwrap();
    ship(d.delta, &mut b, at);
    assert_eq!(b.instances(&db, at).count(), 1);

    // The restart: the saved state, the floor from disk; it rewrites what it owns (web
    // only: db was deregistered in the durable list of own registrations), then closes the
    // gap over the keys it could have written.
    at += 10;
    let mut a = Replica::from_state(me, saved, floor);
    assert!(a.unclaimed_gap() > 0);
    let d = a
        .register(
            web.clone(),
            p.clone(),
            endpoint(4),
            Metadata::default(),
            TTL,
            clock.tick(at),
        )
        .unwrap();
    assert!(
        d.delta.context().max_counter(me) > floor,
        "no dot at or below the floor is minted again"
    );
    ship(d.delta, &mut b, at);
    let regs: BTreeSet<RegKey> = [
        RegKey {
            service: web.clone(),
            provider: p.clone(),
        },
        RegKey {
            service: db.clone(),
            provider: p.clone(),
        },
    ]
    .into();
    let gap = a.close_gap(regs, at).unwrap();
    assert_eq!(a.unclaimed_gap(), 0);
    assert!(a.close_gap(BTreeSet::new(), at).is_none());
    ship(gap.delta, &mut b, at);

    // b drops the lost registration of db, shows web as rewritten, and both contexts are
    // a version vector with no cloud.
    assert_eq!(b.instances(&db, at).count(), 0);
    let webs: Vec<_> = b
        .instances(&web, at)
        .map(|i| i.registration.endpoint.port())
        .collect();
    assert_eq!(webs, vec![4]);
    assert_eq!(b.context().cloud_len(), 0, "{:?}", b.context());
    assert_eq!(a.context().cloud_len(), 0, "{:?}", a.context());
    // And a full join each way changes nothing visible.
    let mut b2 = b.clone();
    b2.apply(a.state().clone(), at);
    assert_eq!(b2.instances(&web, at).count(), 1);
    assert_eq!(b2.instances(&db, at).count(), 0);
}
