//! Admission against arbitrary deltas: not states a schedule of honest operations reaches,
//! but what a faulty or hostile peer can build with the public API: writes under any node's
//! id (the receiver's, the owner's, a stranger's) with any counter floor (close, 1,000
//! ahead, 2^40, near 2^62) and any time (long ago, now, an hour ahead, the year 2100),
//! removals of what they saw, retirements of any node, and joins of all of these.
//!
//! An owner `O` holds a registration; an observer `N` holds it too. Both admit (with
//! `Replica::admit`) and join every hostile delta they accept. Then, for every case:
//! - the owner still reads its registration and can remove it, everywhere it is admitted;
//! - neither replica holds a deadline further ahead than the skew plus the longest lease,
//!   so nothing is unexpirable;
//! - the observer never took in a retirement of the owner that covers its live writes or
//!   its next ones.

use quickcheck::{Arbitrary, Gen};
use roster_registry::{
    codec, Bounds, CausalContext, Endpoint, Hlc, ProviderId, Refusal, Replica, ReplicaId, ServiceName, State,
    MAX_COUNTER, MAX_LEASE_TTL_MS,
};

use crate::support::check;

const NOW: u64 = 1_800_000_000_000;
const SKEW: u64 = 5_000;
const OWNER: ReplicaId = ReplicaId(1);
const OBSERVER: ReplicaId = ReplicaId(2);
/// Ids a forger may write under: the owner's, the observer's, and two strangers'.
const IDS: [ReplicaId; 4] = [OWNER, OBSERVER, ReplicaId(3), ReplicaId(4)];

/// One hostile piece; a poison joins several.
#[derive(Clone, Debug)]
enum Piece {
    /// A write under `id` minted above `floor` (relative to what the observer saw of `id`,
    /// or absolute when huge), stamped at `at_ms`.
    Write {
        id: u8,
        floor: Floor,
        at_ms: When,
        provider: u8,
        ttl_ms: u64,
    },
    /// A forger that saw the observer's state (and maybe a forged write) removes it all.
    RemoveAll { after: Box<Piece> },
    /// A forger that saw the observer's state (and maybe a forged write) retires `id`.
    Retire { id: u8, after: Box<Piece>, at_ms: When },
}

#[derive(Clone, Copy, Debug)]
enum Floor {
    Seen,
    Ahead(u64),
    Absolute(u64),
}

#[derive(Clone, Copy, Debug)]
enum When {
    LongAgo,
    Now,
    AheadMs(u64),
    Year2100,
}

impl When {
    fn ms(self) -> u64 {
        match self {
            When::LongAgo => NOW - 30 * 24 * 3_600_000,
            When::Now => NOW,
            When::AheadMs(d) => NOW + d,
            When::Year2100 => 4_102_444_800_000,
        }
    }
}

impl Arbitrary for Floor {
    fn arbitrary(g: &mut Gen) -> Self {
        *g.choose(&[
            Floor::Seen,
            Floor::Ahead(1),
            Floor::Ahead(1_000),
            Floor::Ahead(1 << 33),
            Floor::Absolute(1 << 40),
            Floor::Absolute(MAX_COUNTER - 3),
        ])
        .unwrap()
    }
}

impl Arbitrary for When {
    fn arbitrary(g: &mut Gen) -> Self {
        *g.choose(&[
            When::LongAgo,
            When::Now,
            When::AheadMs(SKEW / 2),
            When::AheadMs(3_600_000),
            When::Year2100,
        ])
        .unwrap()
    }
}

impl Arbitrary for Piece {
    fn arbitrary(g: &mut Gen) -> Self {
        let write = |g: &mut Gen| Piece::Write {
            id: u8::arbitrary(g),
            floor: Floor::arbitrary(g),
            at_ms: When::arbitrary(g),
            provider: u8::arbitrary(g) % 3,
            ttl_ms: *g.choose(&[100, 60_000, MAX_LEASE_TTL_MS]).unwrap(),
        };
        match u8::arbitrary(g) % 4 {
            0 | 1 => write(g),
            2 => Piece::RemoveAll {
                after: Box::new(write(g)),
            },
            _ => Piece::Retire {
                id: u8::arbitrary(g),
                after: Box::new(write(g)),
                at_ms: When::arbitrary(g),
            },
        }
    }
}

/// A joined list of hostile pieces.
#[derive(Clone, Debug)]
struct Poison(Vec<Piece>);

impl Arbitrary for Poison {
    fn arbitrary(g: &mut Gen) -> Self {
        let n = 1 + usize::arbitrary(g) % 3;
        Poison((0..n).map(|_| Piece::arbitrary(g)).collect())
    }

    fn shrink(&self) -> Box<dyn Iterator<Item = Self>> {
        Box::new(self.0.shrink().filter(|v| !v.is_empty()).map(Poison))
    }
}

fn web() -> ServiceName {
    ServiceName::new("web").unwrap()
}

fn own_provider() -> ProviderId {
    ProviderId::new("own").unwrap()
}

/// Builds the delta a piece stands for, as a forger with the observer's view would.
fn build(piece: &Piece, seen: &Replica) -> Option<State> {
    match piece {
        Piece::Write {
            id,
            floor,
            at_ms,
            provider,
            ttl_ms,
        } => {
            let id = IDS[usize::from(*id) % IDS.len()];
            let base = seen.context().max_counter(id);
            let floor = match floor {
                Floor::Seen => base,
                Floor::Ahead(k) => base + k,
                Floor::Absolute(c) => *c,
            };
            let mut forger = Replica::from_state(id, State::new(), floor);
            let provider = match provider {
                0 => own_provider(),
                p => ProviderId::new(&format!("forged-{p}")).unwrap(),
            };
            let ep = Endpoint::new("10.6.6.6", 6666).unwrap();
            let at = Hlc::new(at_ms.ms(), 0);
            Some(
                forger
                    .register(web(), provider, ep, Default::default(), *ttl_ms, at)
                    .ok()?
                    .delta,
            )
        }
        Piece::RemoveAll { after } => {
            let mut forger = forger_after(after, seen)?;
            Some(
                forger
                    .expire(When::Year2100.ms() + 2 * MAX_LEASE_TTL_MS, 0)?
                    .delta,
            )
        }
        Piece::Retire { id, after, at_ms } => {
            let mut forger = forger_after(after, seen)?;
            forger.expire(When::Year2100.ms() + 2 * MAX_LEASE_TTL_MS, 0);
            let id = IDS[usize::from(*id) % IDS.len()];
            Some(forger.retire(id, Hlc::new(at_ms.ms(), 0)).ok()?.delta)
        }
    }
}

/// A forger (id 0xbad) that saw `seen`'s state and the delta of `piece`.
fn forger_after(piece: &Piece, seen: &Replica) -> Option<Replica> {
    let mut forger = Replica::new(ReplicaId(0xbad));
    forger.apply(seen.state().clone(), NOW);
    forger.apply(build(piece, seen)?, NOW);
    Some(forger)
}

/// Admits and joins `delta` into `r`; whether it was admitted.
/// Admits and joins `delta` into `r`, as the protocol does: a state that says untrue
/// things about `r`'s own dots is refused and answered (`Replica::refute`). Returns the
/// answer, for the other replica.
fn offer(r: &mut Replica, delta: &State) -> Option<State> {
    match r.admit(delta, &Bounds::new(NOW, SKEW)) {
        Ok(()) => {
            r.apply(delta.clone(), NOW);
            None
        }
        Err(Refusal::OwnDotAhead { .. } | Refusal::RetiresReceiver(_)) => {
            let answer = r.refute(delta.context(), Bounds::DEFAULT_MAX_COUNTER_JUMP, NOW)?;
            Some(answer.delta)
        }
        Err(_) => None,
    }
}

/// The latest deadline any lease in `r` holds.
fn latest_deadline(r: &Replica) -> u64 {
    let mut latest = 0;
    for (s, _) in r.services(0) {
        for i in r.instances(&s, 0) {
            latest = latest.max(i.lease.deadline_ms());
        }
    }
    latest
}

fn owner_and_observer() -> (Replica, Replica) {
    let mut owner = Replica::new(OWNER);
    let ep = Endpoint::new("10.0.0.1", 80).unwrap();
    let own = owner
        .register(
            web(),
            own_provider(),
            ep,
            Default::default(),
            60_000,
            Hlc::new(NOW, 0),
        )
        .unwrap();
    let mut observer = Replica::new(OBSERVER);
    observer.apply(own.delta, NOW);
    (owner, observer)
}

/// Whether a read of the owner's key shows the owner's write.
fn shows_own(r: &Replica, now_ms: u64) -> bool {
    r.instances(&web(), now_ms)
        .any(|i| i.provider == &own_provider() && i.node() == OWNER)
}

/// What the protocol does when a join takes away a registration its node owns, or
/// another node writes over it: write it again (`Node::emit_changes`). Returns the delta
/// to ship.
fn repair(owner: &mut Replica, owned: bool) -> Option<State> {
    if !owned || shows_own(owner, NOW) {
        return None;
    }
    let ep = Endpoint::new("10.0.0.1", 80).unwrap();
    let at = Hlc::new(NOW + 1, 0);
    Some(
        owner
            .register(web(), own_provider(), ep, Default::default(), 60_000, at)
            .unwrap()
            .delta,
    )
}

/// The protocol's answers between the two honest replicas, a few rounds: the owner
/// repairs a lost registration, each refutes dots forged under its id that the other
/// claims, and each offers the other its full state (anti-entropy).
fn settle(owner: &mut Replica, observer: &mut Replica, owned: bool) {
    for _ in 0..3 {
        if let Some(fix) = repair(owner, owned) {
            offer(observer, &fix);
        }
        let jump = Bounds::DEFAULT_MAX_COUNTER_JUMP;
        if let Some(truth) = owner.refute(observer.context(), jump, NOW) {
            offer(observer, &truth.delta);
        }
        if let Some(truth) = observer.refute(owner.context(), jump, NOW) {
            offer(owner, &truth.delta);
        }
        let (a, b) = (owner.state().clone(), observer.state().clone());
        offer(observer, &a);
        offer(owner, &b);
    }
}

fn no_poison_sticks(poison: Poison) -> bool {
    let (mut owner, mut observer) = owner_and_observer();
    for piece in &poison.0 {
        let Some(delta) = build(piece, &observer) else {
            continue;
        };
        if let Some(answer) = offer(&mut owner, &delta) {
            offer(&mut observer, &answer);
        }
        if let Some(answer) = offer(&mut observer, &delta) {
            offer(&mut owner, &answer);
        }
        settle(&mut owner, &mut observer, true);
    }
    for r in [&owner, &observer] {
        if let Err(e) = codec::decode_state(&codec::encode_state(r.state())) {
            eprintln!("replica {} broke an invariant ({e}): {poison:?}", r.id());
            return false;
        }
    }
    if !shows_own(&observer, NOW) {
        eprintln!("the observer lost the owner's registration: {poison:?}");
        return false;
    }
    // The owner reads its registration, and its removal takes everywhere it is admitted.
    if !shows_own(&owner, NOW) {
        eprintln!("the owner lost its registration: {poison:?}");
        return false;
    }
    let bound = NOW + SKEW + MAX_LEASE_TTL_MS;
    if latest_deadline(&owner) > bound || latest_deadline(&observer) > bound {
        eprintln!("a deadline beyond {bound}: {poison:?}");
        return false;
    }
    // A retirement of the live owner is taken only once the owner has written its entries
    // again above it (it then covers nothing live, and the owner mints past it).
    let retired = observer.context().retired().find(|(r, _)| *r == OWNER);
    if retired.is_some_and(|(_, x)| owner.counter() <= x.counter) {
        eprintln!("the observer retired the live owner: {poison:?}");
        return false;
    }
    let removal = owner.deregister(web(), own_provider(), NOW).unwrap().delta;
    if shows_own(&owner, NOW) {
        eprintln!("the owner could not remove its registration: {poison:?}");
        return false;
    }
    offer(&mut observer, &removal);
    settle(&mut owner, &mut observer, false);
    if shows_own(&observer, NOW) || shows_own(&owner, NOW) {
        eprintln!("the owner's removal did not take at the observer: {poison:?}");
        return false;
    }
    true
}

#[test]
fn no_arbitrary_delta_makes_a_live_owners_registration_unreadable_unremovable_or_endless() {
    check(
        "no_arbitrary_delta_makes_a_live_owners_registration_unreadable_unremovable_or_endless",
        2_000,
        no_poison_sticks as fn(Poison) -> bool,
    );
}

#[test]
fn an_empty_context_is_admitted() {
    let (owner, _) = owner_and_observer();
    let empty = State::new();
    assert!(owner.admit(&empty, &Bounds::new(NOW, SKEW)).is_ok());
    assert!(CausalContext::new().is_empty());
}

/// Found by the property (seed 1796076314737450877, 20,000 cases): a forger retires the
/// observer after seeing a write forged under its id, then a removal claims more of it.
#[test]
fn a_retirement_of_the_observer_then_a_removal_of_its_forged_writes_does_not_stick() {
    let forged = |floor, at_ms| Piece::Write {
        id: 1,
        floor,
        at_ms,
        provider: 2,
        ttl_ms: 100,
    };
    let poison = Poison(vec![
        Piece::Retire {
            id: 217,
            after: Box::new(forged(Floor::Ahead(1), When::Now)),
            at_ms: When::AheadMs(2_500),
        },
        Piece::RemoveAll {
            after: Box::new(forged(Floor::Ahead(1_000), When::LongAgo)),
        },
    ]);
    assert!(no_poison_sticks(poison));
}
