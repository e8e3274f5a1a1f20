//! The CRDT laws and the registry's semantic properties, checked over reachable states:
//! states built by random schedules of writes, expiries and faulty deliveries, never from
//! arbitrary structs (which could be states no replica can reach).

use std::collections::BTreeMap;

use quickcheck::TestResult;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use roster_registry::{Replica, ReplicaId, State};

use crate::support::{check, provider, Op, Rules, Schedule, Sim};

pub(crate) const CASES: u64 = 2_000;

/// The final states of three replicas after a schedule.
pub(crate) fn three_states(schedule: &Schedule) -> (State, State, State) {
    let sim = Sim::run(Rules::default(), schedule);
    let s = |i: usize| sim.replicas[i].state().clone();
    (s(0), s(1), s(2))
}

pub(crate) fn join(a: &State, b: &State) -> State {
    let mut out = a.clone();
    out.join(b.clone());
    out
}

#[test]
fn join_is_idempotent() {
    check(
        "join_is_idempotent",
        CASES,
        (|s: Schedule| {
            let (x, _, _) = three_states(&s);
            let report = x.clone().join(x.clone());
            join(&x, &x) == x && !report.changed()
        }) as fn(Schedule) -> bool,
    );
}

#[test]
fn join_is_commutative() {
    check(
        "join_is_commutative",
        CASES,
        (|s: Schedule| {
            let (x, y, _) = three_states(&s);
            join(&x, &y) == join(&y, &x)
        }) as fn(Schedule) -> bool,
    );
}

#[test]
fn join_is_associative() {
    check(
        "join_is_associative",
        CASES,
        (|s: Schedule| {
            let (x, y, z) = three_states(&s);
            join(&join(&x, &y), &z) == join(&x, &join(&y, &z))
        }) as fn(Schedule) -> bool,
    );
}

#[test]
fn a_mutation_equals_the_join_of_its_delta() {
    // `Sim::publish` asserts m(X) = X ⊔ mδ(X) at every mutation when asked to.
    check(
        "a_mutation_equals_the_join_of_its_delta",
        CASES,
        (|s: Schedule| {
            let rules = Rules {
                check_mutators: true,
                ..Rules::default()
            };
            Sim::run(rules, &s);
            true
        }) as fn(Schedule) -> bool,
    );
}

#[test]
fn deltas_in_any_order_and_duplicated_equal_the_full_join() {
    check(
        "deltas_in_any_order_and_duplicated_equal_the_full_join",
        CASES,
        (|s: Schedule, order: u64| {
            let sim = Sim::run(Rules::default(), &s);
            let mut full = State::new();
            for r in &sim.replicas {
                full.join(r.state().clone());
            }
            let mut rng = SmallRng::seed_from_u64(order);
            let mut deltas = sim.minted.clone();
            let dups: Vec<State> = deltas.iter().filter(|_| rng.random_bool(0.3)).cloned().collect();
            deltas.extend(dups);
            deltas.shuffle(&mut rng);
            let mut folded = State::new();
            for d in deltas {
                // Through the wire, as a peer would receive it.
                let bytes = roster_registry::codec::encode_state(&d);
                folded.join(roster_registry::codec::decode_state(&bytes).unwrap());
            }
            folded == full
        }) as fn(Schedule, u64) -> bool,
    );
}

#[test]
fn a_single_replica_matches_a_btreemap_model() {
    check(
        "a_single_replica_matches_a_btreemap_model",
        CASES,
        (|s: Schedule| {
            use crate::support::{endpoint, meta, service};
            let (ttl, grace) = (5_000u64, 1_000u64);
            let mut r = Replica::new(ReplicaId(7));
            let mut clock = roster_registry::HlcClock::new();
            let mut now = 1_000_000u64;
            // The model: registrations by key, and the deadline of the node's lease, which
            // every registration of this one writer lives by.
            let mut regs = BTreeMap::new();
            let mut deadline: Option<u64> = None;
            for op in &s.0 {
                match *op {
                    Op::Register {
                        service: sv,
                        provider: p,
                        port,
                        meta: m,
                        ..
                    } => {
                        let hlc = clock.tick(now);
                        r.register(service(sv), provider(p), endpoint(port), meta(m), ttl, hlc)
                            .unwrap();
                        regs.insert((service(sv), provider(p)), (endpoint(port), meta(m)));
                        let d = deadline.get_or_insert(0);
                        if *d <= now {
                            *d = now + ttl;
                        }
                    }
                    Op::Deregister {
                        service: sv,
                        provider: p,
                        ..
                    } => {
                        r.deregister(service(sv), provider(p), now);
                        regs.remove(&(service(sv), provider(p)));
                    }
                    Op::Renew { .. } => {
                        let hlc = clock.tick(now);
                        r.renew(ttl, hlc).unwrap();
                        deadline = Some(now + ttl);
                    }
                    Op::Expire { .. } => {
                        r.expire(now, grace);
                        if deadline.is_some_and(|d| d + grace <= now) {
                            deadline = None;
                            regs.clear();
                        }
                    }
                    Op::Tick { ms } => now += u64::from(ms),
                    _ => {}
                }
                // After every step, a read of each service equals the model's.
                for i in 0..3u8 {
                    let sv = service(i);
                    let got: Vec<_> = r
                        .instances(&sv, now)
                        .map(|x| {
                            (
                                x.provider.clone(),
                                x.registration.endpoint.clone(),
                                x.registration.meta.clone(),
                            )
                        })
                        .collect();
                    let want: Vec<_> = regs
                        .iter()
                        .filter(|((rs, _), _)| rs == &sv && deadline.is_some_and(|d| now < d))
                        .map(|((_, rp), (e, m))| (rp.clone(), e.clone(), m.clone()))
                        .collect();
                    if got != want {
                        return TestResult::error(format!("at {now}: {sv} shows {got:?}, model {want:?}"));
                    }
                }
                let counts: usize = r.services(now).iter().map(|(_, n)| n).sum();
                let want: usize = regs.keys().filter(|_| deadline.is_some_and(|d| now < d)).count();
                if counts != want {
                    return TestResult::error(format!("services() counts {counts}, model {want}"));
                }
            }
            TestResult::passed()
        }) as fn(Schedule) -> TestResult,
    );
}

#[test]
fn no_live_registration_is_lost_under_loss_duplication_reordering_and_one_sync() {
    check(
        "no_live_registration_is_lost",
        CASES,
        (|s: Schedule| {
            // Owners write their own providers; leases outlast the run, so the owners' last
            // writes are exactly what every replica must show after one sync round.
            let rules = Rules {
                owner_only: true,
                lease_ttl_ms: 3_600_000,
                retire: false,
                ..Rules::default()
            };
            let mut sim = Sim::run(rules, &s);
            sim.converge();
            let want: BTreeMap<_, _> = sim
                .model
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), v.clone()?)))
                .collect();
            for r in 0..sim.replicas.len() {
                let got = sim.visible(r);
                if got != want {
                    return TestResult::error(format!("replica {r} shows {got:?}, owners wrote {want:?}"));
                }
            }
            TestResult::passed()
        }) as fn(Schedule) -> TestResult,
    );
}

#[test]
fn nothing_deregistered_or_expired_comes_back_from_a_late_delta_or_a_stale_state() {
    check(
        "nothing_comes_back",
        CASES,
        (|s: Schedule| {
            let mut sim = Sim::run(Rules::default(), &s);
            sim.converge();
            // Everything minted or captured earlier is included in the converged state, so
            // joining any of it late is a no-op: no removed dot returns.
            let converged = sim.replicas[0].state().clone();
            let now = sim.now_ms;
            let before = sim.visible(0);
            let mut late = sim.replicas[0].clone();
            for d in sim.minted.iter().chain(&sim.snapshots) {
                let (report, changes) = late.apply(d.clone(), now);
                if report.changed() || !changes.is_empty() {
                    return TestResult::error(format!("a late state changed the replica: {changes:?}"));
                }
            }
            if late.state() != &converged || sim.visible(0) != before {
                return TestResult::error("late joins changed the converged state");
            }
            TestResult::passed()
        }) as fn(Schedule) -> TestResult,
    );
}

#[test]
fn an_expired_provider_stays_gone_when_its_old_lease_arrives_late() {
    check(
        "expired_provider_stays_gone",
        CASES,
        (|s: Schedule| {
            let mut sim = Sim::run(Rules::default(), &s);
            sim.converge();
            let old = sim.replicas[0].state().clone();
            // Every lease ends; one replica collects; the collection spreads.
            sim.now_ms += Rules::default().lease_ttl_ms + Rules::default().grace_ms + 1;
            sim.step(&Op::Expire { at: 1 });
            sim.converge();
            for r in 0..sim.replicas.len() {
                if sim.replicas[r].state().lease_count() != 0
                    || sim.replicas[r].state().registration_count() != 0
                {
                    return TestResult::error(format!("replica {r} kept expired entries"));
                }
                // A stale full state from before the expiry arrives late.
                let (_, changes) = sim.replicas[r].apply(old.clone(), sim.now_ms);
                if !changes.is_empty() || !sim.replicas[r].state().is_store_empty() {
                    return TestResult::error(format!("replica {r}: a stale state revived {changes:?}"));
                }
            }
            TestResult::passed()
        }) as fn(Schedule) -> TestResult,
    );
}

#[test]
fn after_convergence_the_cloud_is_empty_and_the_context_has_one_entry_per_writer() {
    check(
        "converged_context_is_compact",
        CASES,
        (|s: Schedule| {
            let mut sim = Sim::run(Rules::default(), &s);
            sim.converge();
            // A writer is counted by the vector unless a retirement covers all it wrote.
            let mut minted: BTreeMap<ReplicaId, u64> = BTreeMap::new();
            for d in &sim.minted {
                for (r, n) in d.context().vector() {
                    let e = minted.entry(r).or_default();
                    *e = (*e).max(n);
                }
                for x in d.context().cloud() {
                    let e = minted.entry(x.actor).or_default();
                    *e = (*e).max(x.counter);
                }
            }
            let ctx = sim.replicas[0].context();
            let retired: BTreeMap<_, _> = ctx.retired().collect();
            let counted = minted
                .iter()
                .filter(|(r, &n)| retired.get(r).is_none_or(|x| x.counter < n))
                .count();
            sim.replicas
                .iter()
                .all(|r| r.context().cloud_len() == 0 && r.context().vector_len() == counted)
                && counted <= sim.replicas.len()
                && sim.replicas.windows(2).all(|w| w[0].state() == w[1].state())
        }) as fn(Schedule) -> bool,
    );
}

#[test]
fn an_elided_sync_equals_a_full_join() {
    check(
        "an_elided_sync_equals_a_full_join",
        CASES,
        (|s: Schedule| {
            let sim = Sim::run(Rules::default(), &s);
            let (a, b) = (&sim.replicas[0], &sim.replicas[1]);
            let mut via_full = b.clone();
            via_full.apply(a.state().clone(), sim.now_ms);
            let mut via_elided = b.clone();
            let e = a.elide_for(b.context());
            let (_, changes_e) = via_elided.apply_elided(e, sim.now_ms).unwrap();
            let (_, changes_f) = b.clone().apply(a.state().clone(), sim.now_ms);
            via_full.state() == via_elided.state() && changes_e == changes_f
        }) as fn(Schedule) -> bool,
    );
}

/// What a watcher sees of an instance: everything but its lease deadline.
fn seen(i: roster_registry::Instance) -> roster_registry::Instance {
    roster_registry::Instance {
        lease_deadline_ms: 0,
        ..i
    }
}

/// Joins replica 0's state into replica 1 after `s`, and checks that the reported changes,
/// applied to the read before, give the read after.
fn join_reports_exactly(s: &Schedule) -> bool {
    let sim = Sim::run(Rules::default(), s);
    let mut b = sim.replicas[1].clone();
    let now = sim.now_ms;
    let read = |b: &Replica| {
        let mut out = BTreeMap::new();
        for i in 0..3u8 {
            let sv = crate::support::service(i);
            for x in b.instances(&sv, now) {
                out.insert((x.service.clone(), x.provider.clone()), seen(x.to_owned()));
            }
        }
        out
    };
    let before = read(&b);
    let (_, changes) = b.apply(sim.replicas[0].state().clone(), now);
    let mut after = before.clone();
    for c in &changes {
        match c {
            roster_registry::Change::Up(i) => {
                after.insert((i.service.clone(), i.provider.clone()), seen(i.clone()));
            }
            roster_registry::Change::Down { service, provider } => {
                after.remove(&(service.clone(), provider.clone()));
            }
        }
    }
    let actual = read(&b);
    if after != actual {
        eprintln!("before {before:#?}\nchanges {changes:#?}\nactual {actual:#?}");
    }
    after == actual
}

#[test]
fn join_reports_exactly_the_visible_changes() {
    // Each change a join reports is real (the read differs), and each real difference is
    // reported: watches are fed from these reports. A renewal moves a lease deadline but is
    // no change to a watcher, so deadlines are left out of the comparison.
    check(
        "join_reports_exactly_the_visible_changes",
        CASES,
        (|s: Schedule| join_reports_exactly(&s)) as fn(Schedule) -> bool,
    );
}

#[test]
fn renewal_cost_does_not_grow_with_the_number_of_services() {
    let r = Replica::new(ReplicaId(1));
    let mut clock = roster_registry::HlcClock::new();
    let p = provider(0);
    let mut sizes = Vec::new();
    for n in [1usize, 10, 100] {
        let mut r2 = r.clone();
        for i in 0..n {
            let name = roster_registry::ServiceName::new(&format!("svc-{i}")).unwrap();
            r2.register(
                name,
                p.clone(),
                crate::support::endpoint(80),
                Default::default(),
                10_000,
                clock.tick(1_000),
            )
            .unwrap();
        }
        let delta = r2.renew(10_000, clock.tick(2_000)).unwrap().delta;
        sizes.push(roster_registry::codec::encode_state(&delta).len());
    }
    assert!(
        sizes.windows(2).all(|w| w[0] == w[1]),
        "renewal delta sizes {sizes:?} grow with services"
    );
}

#[test]
fn retiring_a_departed_node_bounds_the_context_and_drops_its_late_deltas() {
    use crate::support::{endpoint, service};
    let mut clock = roster_registry::HlcClock::new();
    let mut nodes: Vec<Replica> = (1..=4).map(|i| Replica::new(ReplicaId(i))).collect();
    // Every node writes; node 4 then leaves gracefully.
    let mut late = Vec::new();
    for (i, n) in nodes.iter_mut().enumerate() {
        let d = n.register(
            service(0),
            provider(i as u8),
            endpoint(80),
            Default::default(),
            60_000,
            clock.tick(1_000),
        );
        late.push(d.unwrap().delta);
    }
    let sync = |nodes: &mut Vec<Replica>| {
        for i in 1..nodes.len() {
            let s = nodes[i].state().clone();
            nodes[0].apply(s, 2_000);
        }
        for i in 1..nodes.len() {
            let s = nodes[0].state().clone();
            nodes[i].apply(s, 2_000);
        }
    };
    sync(&mut nodes);
    nodes[3].deregister_all(clock.tick(2_000));
    sync(&mut nodes);
    assert_eq!(nodes[0].context().vector_len(), 4);
    // Node 1 retires node 4; a node still holding node 4's entries is refused.
    let mut holder = Replica::new(ReplicaId(9));
    holder.apply(late[3].clone(), 2_000);
    assert!(holder.retire(ReplicaId(4), clock.tick(3_000)).is_err());
    nodes[0].retire(ReplicaId(4), clock.tick(3_000)).unwrap();
    nodes.pop();
    sync(&mut nodes);
    for n in &nodes {
        assert_eq!(n.context().vector_len(), 3, "the departed node left the vector");
        // Its registration, delivered late, is dropped on arrival.
        let mut m = n.clone();
        let (report, changes) = m.apply(late[3].clone(), 2_500);
        assert!(
            changes.is_empty() && !report.changed(),
            "a retired node's late delta changed {changes:?}"
        );
    }
    // Once no message can be older, the record is forgotten: one entry per live node.
    for n in &mut nodes {
        assert_eq!(n.forget_retired(clock.tick(9_000_000)), 1);
        assert_eq!((n.context().vector_len(), n.context().retired().count()), (3, 0));
    }
    // A node retired by mistake that writes again is heard: its new dots are above the
    // retired range.
    let mut back = Replica::from_state(ReplicaId(4), nodes[0].state().clone(), 0);
    let mut other = nodes[1].clone();
    other.retire(ReplicaId(3), clock.tick(9_000_001)).unwrap_err(); // still holds node 3's entry
    let d = back.register(
        service(1),
        provider(3),
        endpoint(81),
        Default::default(),
        60_000,
        clock.tick(9_000_002),
    );
    let (_, changes) = other.apply(d.unwrap().delta, 9_000_002);
    assert_eq!(changes.len(), 1);
}

/// Regressions: schedules quickcheck found, kept by name.
mod regressions;

#[test]
fn explain_shows_the_winning_write_its_node_and_its_lease() {
    use crate::support::{endpoint, service};
    let mut a = Replica::new(ReplicaId(0xA));
    let mut b = Replica::new(ReplicaId(0xB));
    let (s, p) = (service(0), provider(0));
    let d1 = a.register(
        s.clone(),
        p.clone(),
        endpoint(80),
        Default::default(),
        10_000,
        roster_registry::Hlc::new(1_000, 0),
    );
    let d2 = b.register(
        s.clone(),
        p.clone(),
        endpoint(81),
        Default::default(),
        10_000,
        roster_registry::Hlc::new(1_001, 0),
    );
    a.apply(d2.unwrap().delta, 1_001);
    b.apply(d1.unwrap().delta, 1_001);
    // Two concurrent writes meet: both are kept, the later one wins everywhere.
    for r in [&a, &b] {
        let e = r.explain(&s, &p, 1_500).unwrap();
        assert_eq!(e.writes.len(), 2);
        assert_eq!(e.winner.as_ref().map(|d| d.actor), Some(ReplicaId(0xB)));
        assert_eq!(e.leases.len(), 2);
        assert!(e.live);
        assert_eq!(
            r.instances(&s, 1_500)
                .next()
                .unwrap()
                .registration
                .endpoint
                .port(),
            81
        );
        // Each write lives by its own node's lease: A's ends first (B's write still wins
        // then, but the read must be looked at again).
        assert_eq!(r.next_deadline_ms(1_500), Some(11_000));
    }
    // After the leases end, explain still shows the writes, and says they are not live.
    assert!(!a.explain(&s, &p, 11_001).unwrap().live);
    assert!(a.explain(&service(1), &p, 0).is_none());
}

/// Joins each state the schedule's replicas passed through into a fresh replica, one every
/// `every` steps, with time passing in between (`steps`, each up to `max_step` ms), and
/// asks `holds` at each step, with the time before and after it.
fn replay(
    s: &Schedule,
    steps: &[u16],
    every: usize,
    max_step: u16,
    mut holds: impl FnMut(&mut Replica, u64, u64) -> bool,
) -> bool {
    let sim = Sim::run(Rules::default(), s);
    let mut r = Replica::new(ReplicaId(0xBB));
    let mut t = 1_000_000u64;
    let mut states = sim
        .snapshots
        .iter()
        .chain(sim.replicas.iter().map(Replica::state));
    for (i, &step) in steps.iter().enumerate() {
        if i % every == 0 {
            if let Some(st) = states.next() {
                r.apply(st.clone(), t);
            }
        }
        let next = t + u64::from(step % max_step);
        if !holds(&mut r, t, next) {
            return false;
        }
        t = next;
    }
    true
}

/// What lapsed at each step of a replay: `lapsed_due`, which skips the look while no lease
/// can have ended, finds what `lapsed` finds.
fn lapsed_due_finds_what_lapsed_finds(s: &Schedule, steps: &[u16]) -> bool {
    replay(s, steps, 2, 4_000, |r, t, next| {
        let expected = r.lapsed(t, next);
        let got = r.lapsed_due(t, next);
        if got != expected {
            eprintln!("from {t} to {next}: lapsed_due {got:?}, lapsed {expected:?}");
        }
        got == expected
    })
}

#[test]
fn lapsed_due_finds_what_lapsed_finds_whatever_joins_and_time_do() {
    check(
        "lapsed_due_finds_what_lapsed_finds_whatever_joins_and_time_do",
        CASES,
        (|s: Schedule, steps: Vec<u16>| lapsed_due_finds_what_lapsed_finds(&s, &steps))
            as fn(Schedule, Vec<u16>) -> bool,
    );
}

/// As above, for the sweep of ended leases: `expire`, which skips the read while the
/// replica is unchanged and no lease it read can have ended, removes what a sweep by a
/// fresh replica of the same state (which remembers nothing) removes, at every step.
fn expire_finds_what_a_fresh_sweep_finds(s: &Schedule, steps: &[u16]) -> bool {
    let grace = Rules::default().grace_ms;
    replay(s, steps, 3, 8_000, |r, _, t| {
        let mut fresh = Replica::from_state(r.id(), r.state().clone(), 0);
        let expected = fresh.expire(t, grace).map(|a| a.changes);
        let got = r.expire(t, grace).map(|a| a.changes);
        if got != expected || r.state() != fresh.state() {
            eprintln!("at {t}: expire {got:?}, a fresh sweep {expected:?}");
            return false;
        }
        true
    })
}

#[test]
fn expire_finds_what_a_fresh_sweep_finds_whatever_joins_and_time_do() {
    check(
        "expire_finds_what_a_fresh_sweep_finds_whatever_joins_and_time_do",
        CASES,
        (|s: Schedule, steps: Vec<u16>| expire_finds_what_a_fresh_sweep_finds(&s, &steps))
            as fn(Schedule, Vec<u16>) -> bool,
    );
}

#[test]
fn an_instance_whose_lease_ends_is_reported_lapsed_once() {
    use roster_registry::{Change, Hlc, Metadata, Replica, ReplicaId};
    let mut r = Replica::new(ReplicaId(1));
    r.register(
        crate::support::service(0),
        crate::support::provider(0),
        crate::support::endpoint(80),
        Metadata::default(),
        1_000,
        Hlc::new(10_000, 0),
    )
    .unwrap();
    assert!(r.lapsed(10_000, 10_999).is_empty(), "still live");
    let down = r.lapsed(10_999, 11_000);
    assert!(matches!(down.as_slice(), [Change::Down { .. }]), "{down:?}");
    assert!(r.lapsed(11_000, 20_000).is_empty(), "reported once");
}

#[test]
fn a_node_renews_one_lease_whatever_the_number_of_instances_it_owns() {
    use crate::support::{endpoint, service};
    let mut r = Replica::new(ReplicaId(1));
    let mut clock = roster_registry::HlcClock::new();
    for i in 0..100u32 {
        let p = roster_registry::ProviderId::new(&format!("inst-{i}")).unwrap();
        let d = r
            .register(
                service((i % 3) as u8),
                p,
                endpoint(80),
                Default::default(),
                10_000,
                clock.tick(1_000),
            )
            .unwrap()
            .delta;
        // Only the first registration writes the lease; the others ride on it.
        assert_eq!(d.lease_count(), usize::from(i == 0), "registration {i}");
    }
    assert_eq!(r.state().lease_count(), 1);
    let renewal = r.renew(10_000, clock.tick(6_000)).unwrap().delta;
    assert_eq!((renewal.lease_count(), renewal.registration_count()), (1, 0));
    let live = |r: &Replica, now| r.services(now).iter().map(|(_, n)| n).sum::<usize>();
    assert_eq!(live(&r, 15_999), 100);
    assert_eq!(live(&r, 16_000), 0, "they end with the node's lease, all at once");
    let swept = r.expire(16_000, 0).unwrap().delta;
    assert_eq!(r.state().registration_count(), 0);
    assert_eq!(r.state().lease_count(), 0);
    assert!(swept.is_delta(), "the sweep names the keys it removes");
}

#[test]
fn every_write_lives_by_the_lease_of_the_node_that_made_it() {
    use crate::support::{endpoint, service};
    let (s, p) = (service(0), provider(0));
    let mut a = Replica::new(ReplicaId(0xA));
    let mut b = Replica::new(ReplicaId(0xB));
    // Concurrent writes of one instance: A's lease lasts 60 s, B's (the later write) 10 s.
    let hlc = roster_registry::Hlc::new;
    let da = a.register(
        s.clone(),
        p.clone(),
        endpoint(80),
        Default::default(),
        60_000,
        hlc(1_000, 0),
    );
    let db = b.register(
        s.clone(),
        p.clone(),
        endpoint(81),
        Default::default(),
        10_000,
        hlc(1_001, 0),
    );
    a.apply(db.unwrap().delta, 1_001);
    b.apply(da.unwrap().delta, 1_001);
    let port = |r: &Replica, now| {
        r.visible(
            &roster_registry::RegKey {
                service: s.clone(),
                provider: p.clone(),
            },
            now,
        )
        .map(|i| i.registration.endpoint.port())
    };
    for r in [&a, &b] {
        assert_eq!(
            port(r, 5_000),
            Some(81),
            "the later write wins while its node lives"
        );
        assert_eq!(
            port(r, 11_001),
            Some(80),
            "then the write of the node still alive shows"
        );
    }
    // A's sweep collects B's lease and B's write only; A's write stays, and the read with it.
    let changes = a.expire(11_001, 0).unwrap().changes;
    assert!(changes.is_empty(), "the read did not change: {changes:?}");
    assert_eq!(port(&a, 11_001), Some(80));
    let e = a.explain(&s, &p, 11_001).unwrap();
    assert_eq!(e.writes.len(), 1);
    assert_eq!(e.writes[0].0.actor, ReplicaId(0xA));
    // B's time-lapse report at the end of its lease says the value changed, not that the
    // instance went down.
    let lapsed = b.lapsed(11_000, 11_001);
    assert!(
        matches!(lapsed.as_slice(), [roster_registry::Change::Up(i)] if i.endpoint.port() == 80),
        "{lapsed:?}"
    );
}
