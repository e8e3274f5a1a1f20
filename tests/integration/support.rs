//! Seeded property runs, and a small simulator that builds reachable registry states from
//! random schedules of operations and deliveries (drop, duplicate, reorder, full sync).

use std::collections::BTreeMap;

use quickcheck::{Arbitrary, Gen, QuickCheck, Testable};
use roster_registry::{
    Endpoint, Hlc, HlcClock, Metadata, ProviderId, Replica, ReplicaId, ServiceName, State,
};

/// The seed in the environment variable `var`, or one from the clock.
pub fn seed_from_env(var: &str) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0)
        })
}

/// The seed of a simulation named `name`, printed with how to replay it: from
/// `ROSTER_SEED`, or from the clock.
pub fn sim_seed(name: &str) -> u64 {
    let seed = seed_from_env("ROSTER_SEED");
    eprintln!("{name}: seed {seed}; replay with ROSTER_SEED={seed}");
    seed
}

/// Runs a quickcheck property with a printed, replayable seed.
///
/// The seed comes from `ROSTER_SEED`, or from the clock; the number of cases from
/// `ROSTER_PROP_CASES`, or `cases`.
pub fn check<A: Testable>(name: &str, cases: u64, prop: A) {
    let seed = seed_from_env("ROSTER_SEED");
    let cases = std::env::var("ROSTER_PROP_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(cases);
    eprintln!("{name}: seed {seed} ({cases} cases); replay with ROSTER_SEED={seed}");
    QuickCheck::new()
        .rng(Gen::from_size_and_seed(40, seed))
        .tests(cases)
        .max_tests(cases * 10)
        .quickcheck(prop);
}

/// The service names schedules use.
pub const SERVICES: [&str; 3] = ["web", "db", "cache.eu-1"];
/// How many distinct providers schedules use.
pub const PROVIDERS: u8 = 4;
/// How many replicas a simulation runs.
pub const REPLICAS: u8 = 3;

pub fn service(i: u8) -> ServiceName {
    ServiceName::new(SERVICES[usize::from(i) % SERVICES.len()]).expect("valid name")
}

pub fn provider(i: u8) -> ProviderId {
    ProviderId::new(&format!("p{}", i % PROVIDERS)).expect("valid id")
}

pub fn endpoint(port: u16) -> Endpoint {
    Endpoint::new("10.0.0.1", port.max(1)).expect("valid endpoint")
}

pub fn meta(v: u8) -> Metadata {
    match v % 3 {
        0 => Metadata::new(),
        1 => [("zone".to_string(), format!("z{v}"))].into(),
        _ => [
            ("zone".to_string(), "a".to_string()),
            ("v".to_string(), v.to_string()),
        ]
        .into(),
    }
}

/// One step of a schedule. Indices are taken modulo the number of things they pick from.
#[derive(Clone, Debug)]
pub enum Op {
    Register {
        at: u8,
        service: u8,
        provider: u8,
        port: u16,
        meta: u8,
    },
    Deregister {
        at: u8,
        service: u8,
        provider: u8,
    },
    Renew {
        at: u8,
        provider: u8,
    },
    Expire {
        at: u8,
    },
    /// Advance the shared wall clock.
    Tick {
        ms: u16,
    },
    /// Deliver an in-flight delta and forget it.
    Deliver {
        pick: u8,
    },
    /// Deliver an in-flight delta and keep it in flight (it will arrive again).
    Duplicate {
        pick: u8,
    },
    /// Lose an in-flight delta.
    Drop {
        pick: u8,
    },
    /// One replica joins another's full state.
    Sync {
        from: u8,
        to: u8,
    },
    /// One replica joins another's state elided against its own digest.
    SyncElided {
        from: u8,
        to: u8,
    },
    /// One replica retires another (refused while it holds that replica's entries).
    Retire {
        at: u8,
        replica: u8,
    },
}

impl Arbitrary for Op {
    fn arbitrary(g: &mut Gen) -> Self {
        let u = |g: &mut Gen| u8::arbitrary(g);
        match u8::arbitrary(g) % 16 {
            0..=3 => Op::Register {
                at: u(g),
                service: u(g),
                provider: u(g),
                port: u16::arbitrary(g),
                meta: u(g),
            },
            4 => Op::Deregister {
                at: u(g),
                service: u(g),
                provider: u(g),
            },
            5 => Op::Renew {
                at: u(g),
                provider: u(g),
            },
            6 => Op::Expire { at: u(g) },
            7 | 8 => Op::Tick {
                ms: u16::arbitrary(g) % 3_000,
            },
            9..=11 => Op::Deliver { pick: u(g) },
            12 => Op::Duplicate { pick: u(g) },
            13 => Op::Drop { pick: u(g) },
            14 => Op::Sync { from: u(g), to: u(g) },
            15 if bool::arbitrary(g) => Op::Retire {
                at: u(g),
                replica: u(g),
            },
            _ => Op::SyncElided { from: u(g), to: u(g) },
        }
    }
}

/// A schedule: the steps a simulation takes.
#[derive(Clone, Debug)]
pub struct Schedule(pub Vec<Op>);

impl Arbitrary for Schedule {
    fn arbitrary(g: &mut Gen) -> Self {
        Schedule(Vec::arbitrary(g))
    }
    fn shrink(&self) -> Box<dyn Iterator<Item = Self>> {
        Box::new(self.0.shrink().map(Schedule))
    }
}

/// How a simulation treats its schedule.
#[derive(Clone, Copy, Debug)]
pub struct Rules {
    /// Only a provider's owner replica (`provider % REPLICAS`) writes its registrations.
    pub owner_only: bool,
    /// The lease every write takes.
    pub lease_ttl_ms: u64,
    /// The grace `expire` allows past a deadline.
    pub grace_ms: u64,
    /// Check `m(X) = X ⊔ mδ(X)` at every mutation.
    pub check_mutators: bool,
    /// Carry out `Retire` steps (a retired replica that writes again loses the writes it
    /// made before, so properties about owners' writes turn this off).
    pub retire: bool,
}

impl Default for Rules {
    fn default() -> Self {
        Rules {
            owner_only: false,
            lease_ttl_ms: 5_000,
            grace_ms: 1_000,
            check_mutators: false,
            retire: true,
        }
    }
}

/// The simulation: replicas, their clocks, one shared wall clock, and the network.
pub struct Sim {
    pub rules: Rules,
    pub replicas: Vec<Replica>,
    pub clocks: Vec<HlcClock>,
    pub now_ms: u64,
    /// Deltas in flight: (destination, delta).
    pub flight: Vec<(usize, State)>,
    /// Every delta ever minted, in minting order.
    pub minted: Vec<State>,
    /// Full states captured along the way (stale copies for resurrection checks).
    pub snapshots: Vec<State>,
    /// The owners' view (valid with `owner_only`): the last write per key, `None` once
    /// deregistered.
    pub model: BTreeMap<(ServiceName, ProviderId), Option<(Endpoint, Metadata)>>,
}

impl Sim {
    pub fn new(rules: Rules) -> Self {
        let n = usize::from(REPLICAS);
        Sim {
            rules,
            replicas: (0..n).map(|i| Replica::new(ReplicaId(0xA0 + i as u64))).collect(),
            clocks: vec![HlcClock::new(); n],
            now_ms: 1_000_000,
            flight: Vec::new(),
            minted: Vec::new(),
            snapshots: Vec::new(),
            model: BTreeMap::new(),
        }
    }

    fn at(&self, at: u8, provider: u8) -> usize {
        if self.rules.owner_only {
            usize::from(provider % PROVIDERS) % self.replicas.len()
        } else {
            usize::from(at) % self.replicas.len()
        }
    }

    fn tick(&mut self, r: usize) -> Hlc {
        self.clocks[r].tick(self.now_ms)
    }

    fn publish(&mut self, from: usize, before: State, delta: State) {
        if self.rules.check_mutators {
            let mut joined = before;
            joined.join(delta.clone());
            assert_eq!(&joined, self.replicas[from].state(), "m(X) != X join m-delta(X)");
        }
        for to in 0..self.replicas.len() {
            if to != from {
                self.flight.push((to, delta.clone()));
            }
        }
        self.minted.push(delta);
    }

    pub fn step(&mut self, op: &Op) {
        let n = self.replicas.len();
        match *op {
            Op::Register {
                at,
                service: s,
                provider: p,
                port,
                meta: m,
            } => {
                let r = self.at(at, p);
                let now = self.tick(r);
                let before = self.replicas[r].state().clone();
                let applied = self.replicas[r]
                    .register(
                        service(s),
                        provider(p),
                        endpoint(port),
                        meta(m),
                        self.rules.lease_ttl_ms,
                        now,
                    )
                    .expect("valid registration");
                self.model
                    .insert((service(s), provider(p)), Some((endpoint(port), meta(m))));
                self.publish(r, before, applied.delta);
            }
            Op::Deregister {
                at,
                service: s,
                provider: p,
            } => {
                let r = self.at(at, p);
                let before = self.replicas[r].state().clone();
                if let Some(applied) = self.replicas[r].deregister(service(s), provider(p), self.now_ms) {
                    self.publish(r, before, applied.delta);
                }
                if self.model.contains_key(&(service(s), provider(p))) {
                    self.model.insert((service(s), provider(p)), None);
                }
            }
            Op::Renew { at, provider: p } => {
                let r = self.at(at, p);
                let now = self.tick(r);
                let before = self.replicas[r].state().clone();
                let applied = self.replicas[r]
                    .renew(self.rules.lease_ttl_ms, now)
                    .expect("valid ttl");
                self.publish(r, before, applied.delta);
            }
            Op::Expire { at } => {
                let r = usize::from(at) % n;
                let before = self.replicas[r].state().clone();
                if let Some(applied) = self.replicas[r].expire(self.now_ms, self.rules.grace_ms) {
                    self.publish(r, before, applied.delta);
                }
            }
            Op::Tick { ms } => self.now_ms += u64::from(ms),
            Op::Deliver { pick } | Op::Duplicate { pick } | Op::Drop { pick } => {
                if self.flight.is_empty() {
                    return;
                }
                let i = usize::from(pick) % self.flight.len();
                let (to, delta) = if matches!(op, Op::Duplicate { .. }) {
                    self.flight[i].clone()
                } else {
                    self.flight.remove(i)
                };
                if !matches!(op, Op::Drop { .. }) {
                    self.replicas[to].apply(delta, self.now_ms);
                }
            }
            Op::Sync { from, to } => {
                let (from, to) = (usize::from(from) % n, usize::from(to) % n);
                let s = self.replicas[from].state().clone();
                self.snapshots.push(s.clone());
                self.replicas[to].apply(s, self.now_ms);
            }
            Op::SyncElided { from, to } => {
                let (from, to) = (usize::from(from) % n, usize::from(to) % n);
                let e = self.replicas[from].elide_for(self.replicas[to].context());
                self.replicas[to]
                    .apply_elided(e, self.now_ms)
                    .expect("an elided state made against the receiver's own digest joins");
            }
            Op::Retire { at, replica } => {
                let r = usize::from(at) % n;
                if !self.rules.retire {
                    return;
                }
                let now = self.tick(r);
                let target = self.replicas[usize::from(replica) % n].id();
                let before = self.replicas[r].state().clone();
                if let Ok(applied) = self.replicas[r].retire(target, now) {
                    self.publish(r, before, applied.delta);
                }
            }
        }
    }

    pub fn run(rules: Rules, schedule: &Schedule) -> Sim {
        let mut sim = Sim::new(rules);
        for op in &schedule.0 {
            sim.step(op);
        }
        sim
    }

    /// One full-state sync round: everyone into replica 0, then replica 0 into everyone.
    pub fn converge(&mut self) {
        for i in 1..self.replicas.len() {
            let s = self.replicas[i].state().clone();
            self.replicas[0].apply(s, self.now_ms);
        }
        let s0 = self.replicas[0].state().clone();
        for i in 1..self.replicas.len() {
            self.replicas[i].apply(s0.clone(), self.now_ms);
        }
    }

    /// What a read of every service shows at one replica: key -> (endpoint, metadata).
    pub fn visible(&self, r: usize) -> BTreeMap<(ServiceName, ProviderId), (Endpoint, Metadata)> {
        let mut out = BTreeMap::new();
        for i in 0..SERVICES.len() as u8 {
            let s = service(i);
            for inst in self.replicas[r].instances(&s, self.now_ms) {
                out.insert(
                    (inst.service.clone(), inst.provider.clone()),
                    (inst.registration.endpoint.clone(), inst.registration.meta.clone()),
                );
            }
        }
        out
    }
}
