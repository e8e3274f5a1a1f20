//! What a join forwards and what a peer is sent: the effective delta, deltas and states
//! trimmed for a peer, and removals a replica missed. Checked over reachable states, as
//! registry_props does.

use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use std::collections::BTreeSet;

use roster_registry::{dot, CausalContext, Dot, ReplicaId, State};

use crate::registry_props::{join, three_states, CASES};
use crate::support::{check, Op, Rules, Schedule, Sim};

#[test]
fn the_effective_delta_of_a_full_join_brings_any_peer_that_had_our_old_state_to_our_new_one() {
    // A node forwards what a full sync taught it as a delta. A peer that held everything
    // the node held before (and maybe more) must end where the node's new state would take
    // it, but for the dots the delta leaves out: those the full state taught without their
    // writes, which no key can be named for. The delta names its keys (a peer's join
    // visits only those), and what it leaves out is context alone, exactly
    // `report.left_out` dots, which a context-only full state (a peer's anti-entropy)
    // brings.
    check(
        "effective_delta_of_a_full_join",
        CASES,
        (|s: Schedule| {
            let sim = Sim::run(Rules::default(), &s);
            let (x, y, z) = (
                &sim.replicas[1],
                sim.replicas[0].state().clone(),
                sim.replicas[2].state().clone(),
            );
            let mut after = x.clone();
            let (report, _, delta) = after.apply_collecting(y, sim.now_ms, 1_000_000);
            // The only fallback small states may take: the join brought a retirement.
            let Some(delta) = delta else {
                return sim.replicas[0].context().retired().count() > 0;
            };
            if !delta.is_delta() {
                return false;
            }
            // X ⊔ D ⊔ L = X' and D ⊑ X', L the left-out dots.
            let mut x_plus_d = x.state().clone();
            x_plus_d.join(delta.clone());
            let left = dots_missing(after.context(), x_plus_d.context());
            if left.len() != report.left_out {
                return false;
            }
            let left = State::context_only(CausalContext::from_dots(left));
            x_plus_d.join(left.clone());
            let mut x2_plus_d = after.state().clone();
            x2_plus_d.join(delta.clone());
            // A peer holding X and more (X ⊔ Z): joining D and L equals joining X'.
            let mut peer = x.state().clone();
            peer.join(z);
            let mut via_delta = peer.clone();
            via_delta.join(delta.clone());
            via_delta.join(left);
            let mut via_state = peer;
            via_state.join(after.state().clone());
            &x_plus_d == after.state() && &x2_plus_d == after.state() && via_delta == via_state
        }) as fn(Schedule) -> bool,
    );
}

/// The dots `a` has seen and `b` has not.
fn dots_missing(a: &CausalContext, b: &CausalContext) -> Vec<Dot> {
    let replicas: BTreeSet<ReplicaId> = a
        .ranges()
        .map(|(r, _)| r)
        .chain(a.cloud().map(|d| d.actor))
        .collect();
    replicas
        .into_iter()
        .flat_map(|r| (1..=a.max_counter(r)).map(move |c| dot(r, c)))
        .filter(|d| a.contains(d) && !b.contains(d))
        .collect()
}

#[test]
fn the_effective_delta_of_each_delta_join_brings_any_peer_that_had_our_old_state_to_our_new_one() {
    // The same for deltas, received in any order (a delta may then teach dots whose writes
    // we never held): the effective delta names only the keys the received delta named, so
    // a peer's join must visit no others.
    check(
        "effective_delta_of_each_delta_join",
        CASES,
        (|s: Schedule, order: u64| {
            let sim = Sim::run(Rules::default(), &s);
            let mut rng = SmallRng::seed_from_u64(order);
            let mut deltas = sim.minted.clone();
            deltas.shuffle(&mut rng);
            let z = sim.replicas[2].state().clone();
            let mut x = sim.replicas[1].clone();
            for d in deltas {
                let before = x.state().clone();
                let (_, _, delta) = x.apply_collecting(d, sim.now_ms, 1_000_000);
                let Some(delta) = delta else {
                    if sim.replicas.iter().any(|r| r.context().retired().count() > 0) {
                        continue;
                    }
                    return false;
                };
                // Through the wire, as a peer would receive it.
                let delta =
                    roster_registry::codec::decode_state(&roster_registry::codec::encode_state(&delta))
                        .unwrap();
                let mut peer = before;
                peer.join(z.clone());
                let mut via_delta = peer.clone();
                via_delta.join(delta);
                let mut via_state = peer;
                via_state.join(x.state().clone());
                if via_delta != via_state {
                    return false;
                }
            }
            true
        }) as fn(Schedule, u64) -> bool,
    );
}

#[test]
fn a_delta_the_replica_already_holds_is_told_apart_without_a_join_and_one_it_lacks_never_is() {
    // A flood delivers most deltas two or three times: a copy the replica holds skips the
    // join (`State::learns_from`). Whatever the order, applying must change the replica
    // exactly as a join would, and say so.
    check(
        "learns_from_agrees_with_join",
        CASES,
        (|s: Schedule, order: u64| {
            let sim = Sim::run(Rules::default(), &s);
            let mut rng = SmallRng::seed_from_u64(order);
            let mut deltas = sim.minted.clone();
            deltas.extend(sim.minted.iter().cloned());
            deltas.shuffle(&mut rng);
            let mut x = sim.replicas[1].clone();
            let mut y = sim.replicas[2].clone();
            for d in deltas {
                let mut joined = x.state().clone();
                let changed = joined.join(d.clone()).changed();
                let (report, _, _) = x.apply_collecting(d.clone(), sim.now_ms, 1_000_000);
                let mut joined_y = y.state().clone();
                let changed_y = joined_y.join(d.clone()).changed();
                let (report_y, _) = y.apply(d, sim.now_ms);
                if report.changed() != changed || x.state() != &joined {
                    return false;
                }
                if report_y.changed() != changed_y || y.state() != &joined_y {
                    return false;
                }
            }
            true
        }) as fn(Schedule, u64) -> bool,
    );
}

#[test]
fn a_replica_that_missed_a_removal_has_a_smaller_context() {
    // Digests compare contexts; a removal must show in them, or a replica that missed
    // one would look up to date forever.
    use roster_registry::{Hlc, Metadata, Replica, ReplicaId};
    let mut a = Replica::new(ReplicaId(1));
    let mut b = Replica::new(ReplicaId(2));
    let (s, p) = (crate::support::service(0), crate::support::provider(0));
    let w = a
        .register(
            s.clone(),
            p.clone(),
            crate::support::endpoint(80),
            Metadata::default(),
            60_000,
            Hlc::new(1_000, 0),
        )
        .unwrap();
    b.apply(w.delta, 1_000);
    assert_eq!(a.context(), b.context());
    let removal = a.deregister(s.clone(), p.clone(), 2_000).unwrap();
    assert!(
        !b.context().includes(a.context()),
        "b missed the removal and its digest must say so"
    );
    assert!(a.context().includes(b.context()));
    b.apply(removal.delta, 2_000);
    assert_eq!(a.context(), b.context());
    assert_eq!(b.instances(&s, 2_000).count(), 0);
    // The same for a sweep of an expired lease, by a replica that never wrote. (A's first
    // lease, 60 s from 1 s, has ended: this registration writes a lease of 1 s.)
    let mut c = Replica::new(ReplicaId(3));
    let w = a
        .register(
            s.clone(),
            p.clone(),
            crate::support::endpoint(81),
            Metadata::default(),
            1_000,
            Hlc::new(61_000, 0),
        )
        .unwrap();
    c.apply(w.delta.clone(), 61_000);
    b.apply(w.delta, 61_000);
    let sweep = c.expire(70_000, 0).unwrap();
    assert!(!b.context().includes(c.context()));
    b.apply(sweep.delta, 70_000);
    assert!(b.context().includes(c.context()));
}

/// What a node sends a peer that has no acknowledgement from it: each buffered delta
/// trimmed for the peer's digest, then joined (trimming one by one keeps only the key hints
/// of the deltas that remove something). True when the peer, and any state that has seen
/// more, joins that as it joins the whole.
fn trimmed_one_by_one_joins_as_the_whole(s: &Schedule) -> bool {
    let sim = Sim::run(Rules::default(), s);
    let y = sim.replicas[1].state().clone();
    let later = join(&y, sim.replicas[2].state());
    let n = sim.minted.len();
    // The buffer: the last deltas minted, as a node would hold them.
    let tail = &sim.minted[n.saturating_sub(12)..];
    let mut whole = State::new_delta();
    let mut trimmed = State::new_delta();
    for d in tail {
        whole.join(d.clone());
        trimmed.join(d.trimmed_for(y.context()));
    }
    join(&y, &trimmed) == join(&y, &whole) && join(&later, &trimmed) == join(&later, &whole)
}

#[test]
fn deltas_trimmed_one_by_one_for_a_peer_join_into_it_as_their_whole_join_does() {
    check(
        "deltas_trimmed_one_by_one",
        CASES,
        (|s: Schedule| trimmed_one_by_one_joins_as_the_whole(&s)) as fn(Schedule) -> bool,
    );
}

/// Seed 1796020580560911580 of the property above, found while building it: a write the
/// peer lacked, overwritten by one it had. Trimming the overwrite dropped its value and
/// with it the only name of the key, so the old write, sent by the first delta, survived
/// the join. Trimmed deltas that remove something now keep the keys of the values they
/// leave out.
#[test]
fn a_trimmed_overwrite_still_removes_the_write_it_replaced() {
    let schedule = Schedule(vec![
        Op::Register {
            at: 21,
            service: 56,
            provider: 115,
            port: 0,
            meta: 1,
        },
        Op::Deliver { pick: 63 },
        Op::Register {
            at: 22,
            service: 1,
            provider: 221,
            port: 57732,
            meta: 127,
        },
        Op::Register {
            at: 207,
            service: 44,
            provider: 175,
            port: 48990,
            meta: 3,
        },
        Op::Deliver { pick: 237 },
        Op::Deliver { pick: 215 },
        Op::Register {
            at: 0,
            service: 83,
            provider: 255,
            port: 51042,
            meta: 11,
        },
        Op::Register {
            at: 224,
            service: 18,
            provider: 186,
            port: 60828,
            meta: 234,
        },
        Op::Duplicate { pick: 157 },
    ]);
    assert!(trimmed_one_by_one_joins_as_the_whole(&schedule));
}

#[test]
fn a_state_trimmed_for_a_peer_joins_into_it_as_the_whole_does() {
    check(
        "trimmed_for_equals_the_whole",
        CASES,
        (|s: Schedule| {
            let (x, y, z) = three_states(&s);
            // Into the peer itself, and into any state that has seen at least as much.
            let later = join(&y, &z);
            join(&y, &x.trimmed_for(y.context())) == join(&y, &x)
                && join(&later, &x.trimmed_for(y.context())) == join(&later, &x)
        }) as fn(Schedule) -> bool,
    );
}
