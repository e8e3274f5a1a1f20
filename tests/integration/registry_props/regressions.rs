//! Regressions: schedules quickcheck found, kept by name.

use super::*;
use crate::support::Op::*;

/// A replica learns that it was itself retired while a peer holds a concurrent lease
/// for one of its providers: the join must report every instance that went down.
#[test]
fn retirement_of_the_receiver_reports_every_instance_it_hides() {
    let s = Schedule(vec![
        Renew {
            at: 65,
            provider: 183,
        },
        Register {
            at: 157,
            service: 31,
            provider: 84,
            port: 9479,
            meta: 150,
        },
        Sync { from: 115, to: 170 },
        Register {
            at: 196,
            service: 150,
            provider: 14,
            port: 21602,
            meta: 220,
        },
        Register {
            at: 76,
            service: 54,
            provider: 72,
            port: 18386,
            meta: 57,
        },
        Register {
            at: 67,
            service: 13,
            provider: 255,
            port: 46057,
            meta: 139,
        },
        Register {
            at: 176,
            service: 109,
            provider: 0,
            port: 32509,
            meta: 140,
        },
        Deliver { pick: 154 },
        Retire { at: 51, replica: 76 },
    ]);
    assert!(join_reports_exactly(&s));
}

/// Found by a fresh seed: a retirement met a replica whose vector already had the
/// retired node's entry below the retired counter, and joins disagreed by order.
#[test]
fn join_with_a_retirement_is_commutative() {
    let s = Schedule(vec![
        Register {
            at: 27,
            service: 1,
            provider: 251,
            port: 48463,
            meta: 206,
        },
        Renew { at: 88, provider: 54 },
        Deliver { pick: 9 },
        Register {
            at: 132,
            service: 49,
            provider: 57,
            port: 1606,
            meta: 19,
        },
        Register {
            at: 99,
            service: 212,
            provider: 100,
            port: 54067,
            meta: 212,
        },
        Register {
            at: 124,
            service: 118,
            provider: 255,
            port: 44639,
            meta: 231,
        },
        Register {
            at: 23,
            service: 255,
            provider: 53,
            port: 52145,
            meta: 150,
        },
        Register {
            at: 176,
            service: 5,
            provider: 41,
            port: 61408,
            meta: 199,
        },
        Deliver { pick: 198 },
        Register {
            at: 178,
            service: 42,
            provider: 48,
            port: 51712,
            meta: 50,
        },
        Deliver { pick: 1 },
        Deliver { pick: 153 },
        Deliver { pick: 159 },
        Register {
            at: 52,
            service: 62,
            provider: 1,
            port: 30700,
            meta: 222,
        },
        Deliver { pick: 122 },
        Register {
            at: 207,
            service: 205,
            provider: 196,
            port: 8723,
            meta: 49,
        },
        Retire { at: 1, replica: 137 },
        Register {
            at: 32,
            service: 197,
            provider: 35,
            port: 24622,
            meta: 190,
        },
        Register {
            at: 64,
            service: 172,
            provider: 113,
            port: 49945,
            meta: 131,
        },
        Duplicate { pick: 136 },
    ]);
    let (x, y, _) = three_states(&s);
    let (xy, yx) = (join(&x, &y), join(&y, &x));
    assert_eq!(xy, yx, "\nx = {x:#?}\ny = {y:#?}");
}
