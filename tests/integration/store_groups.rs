//! Peer-learnt changes saved in groups, own writes committed before they are answered:
//! after any sequence of peer deltas, own writes, saves and crashes, the context a store
//! loads never claims a dot whose data it did not load, and no acknowledged own write is
//! lost.
//!
//! The simulation's replica 0 is the node under test, as `roster::Node` drives its store:
//! a peer's delta joins its replica and waits for the saver's next save (one transaction
//! per interval, or per count of changes: any schedule of `Save` steps), while an own
//! write goes into the replica first and is committed to the `owned` table, with the
//! counter floor raised past its dot, before it counts as acknowledged (the group commit).
//! A crash drops the process, keeping the files as they were (own writes are durable in
//! the journal, the database's commits of them are not synced); the restart loads the
//! store and writes its own registrations again, as `Node::finish_resume` does.

use std::collections::BTreeMap;

use quickcheck::{Arbitrary, Gen};
use roster::store::{OwnedRecord, Store, COUNTER_RESERVE, JOURNAL_FILE, STORE_FILE};
use roster_registry::{ProviderId, ReplicaId, State, Status};

use crate::support::{check, endpoint, meta, service, Op, Rules, Sim, REPLICAS, SERVICES};

/// Own instances the node writes.
const OWN: u8 = 3;
const LEASE_TTL_MS: u64 = 5_000;

/// One step of the node's life.
#[derive(Clone, Debug)]
enum Step {
    /// Something happens elsewhere in the cluster, or a peer's delta reaches the node.
    Peer(Op),
    /// A client registers an own instance: answered once it is committed, or (not
    /// `answered`) it reached the replica and its peers but the process did not live to
    /// make its commit.
    Own {
        service: u8,
        instance: u8,
        port: u16,
        meta: u8,
        answered: bool,
    },
    /// The saver writes the peer-learnt (and every other) change since its last save.
    Save,
    /// SIGKILL, then a restart from the store.
    Crash,
}

impl Arbitrary for Step {
    fn arbitrary(g: &mut Gen) -> Self {
        let u = |g: &mut Gen| u8::arbitrary(g);
        match u8::arbitrary(g) % 10 {
            0..=3 => Step::Peer(elsewhere(Op::arbitrary(g))),
            n @ 4..=6 => Step::Own {
                service: u(g),
                instance: u(g),
                port: u16::arbitrary(g),
                meta: u(g),
                answered: n < 6,
            },
            7 | 8 => Step::Save,
            _ => Step::Crash,
        }
    }
}

/// `op` as another replica than the node would make it (the node's own writes are
/// [`Step::Own`]); deliveries and syncs reach the node as they come.
fn elsewhere(op: Op) -> Op {
    let other = |at: u8| 1 + at % (REPLICAS - 1);
    match op {
        Op::Register {
            at,
            service,
            provider,
            port,
            meta,
        } => Op::Register {
            at: other(at),
            service,
            provider,
            port,
            meta,
        },
        Op::Deregister {
            at,
            service,
            provider,
        } => Op::Deregister {
            at: other(at),
            service,
            provider,
        },
        Op::Renew { at, provider } => Op::Renew {
            at: other(at),
            provider,
        },
        op => op,
    }
}

/// The node: its store, what it acknowledged, and what it owns.
struct NodeUnderTest {
    dir: tempfile::TempDir,
    store: Option<Store>,
    /// The last acknowledged write of each own instance (by store key).
    acked: BTreeMap<String, OwnedRecord>,
    /// The highest counter the node had minted when it answered a write.
    acked_counter: u64,
    now_ms: u64,
}

fn record(s: u8, instance: u8, port: u16, m: u8, at_ms: u64) -> OwnedRecord {
    OwnedRecord {
        service: SERVICES[usize::from(s) % SERVICES.len()].to_string(),
        instance: format!("own{}", instance % OWN),
        address: format!("10.0.0.1:{}", port.max(1)),
        meta: meta(m)
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        lease_ttl_ms: LEASE_TTL_MS,
        registered_at_ms: at_ms,
        expires_at_ms: None,
        status: Status::passing(),
        maintenance: None,
        checks: Vec::new(),
    }
}

impl NodeUnderTest {
    fn new(sim: &mut Sim) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (store, loaded) = Store::open(dir.path(), sim.replicas[0].id(), 1).unwrap();
        sim.replicas[0] = loaded.replica;
        NodeUnderTest {
            dir,
            store: Some(store),
            acked: BTreeMap::new(),
            acked_counter: 0,
            now_ms: 1,
        }
    }

    fn store(&self) -> &Store {
        self.store.as_ref().unwrap()
    }

    /// Into the replica and on its way to peers; with `commit`, then on disk and answered.
    fn write(&mut self, sim: &mut Sim, rec: OwnedRecord, commit: bool) {
        into_replica(sim, &rec);
        if !commit {
            return;
        }
        let floor = sim.replicas[0].counter() + COUNTER_RESERVE;
        self.store()
            .write_owned(std::slice::from_ref(&rec), &[], Some(floor))
            .unwrap();
        self.acked_counter = sim.replicas[0].counter();
        self.acked.insert(rec.key(), rec);
    }

    fn save(&mut self, sim: &mut Sim) {
        let r = &mut sim.replicas[0];
        let changed = r.take_changed().expect("a loaded replica tracks its changes");
        self.store().save_replica(r, &changed, false).unwrap();
    }

    /// SIGKILL and restart; `Err` says which promise the loaded store broke.
    fn crash(&mut self, sim: &mut Sim) -> Result<(), String> {
        let truth: State = sim.replicas[0].state().clone();
        // What a SIGKILL leaves: the files as they are now (a process that closes its store
        // syncs what it committed unsynced; a killed one does not).
        let killed = tempfile::tempdir().unwrap();
        for name in [STORE_FILE, JOURNAL_FILE] {
            std::fs::copy(self.dir.path().join(name), killed.path().join(name)).unwrap();
        }
        drop(self.store.take());
        self.dir = killed;
        self.now_ms += 1;
        let (store, loaded) = Store::open(self.dir.path(), ReplicaId(0), self.now_ms).unwrap();
        self.store = Some(store);
        // The loaded state is a past state of the replica: joined into the replica it came
        // from, it takes nothing away. A context that claimed a dot whose entry was not
        // saved with it would take that entry away (an unsaved dot reads as a removal).
        let mut joined = truth.clone();
        joined.join(loaded.replica.state().clone());
        if joined != truth {
            return Err(format!(
                "the loaded context claims dots whose data was not loaded:\nloaded {:?}\ntruth  {truth:?}",
                loaded.replica.state()
            ));
        }
        let owned: BTreeMap<String, OwnedRecord> =
            loaded.owned.iter().map(|r| (r.key(), r.clone())).collect();
        for (key, rec) in &self.acked {
            if owned.get(key) != Some(rec) {
                return Err(format!(
                    "acknowledged write {key} lost: loaded {:?}",
                    owned.get(key)
                ));
            }
        }
        if loaded.replica.counter() < self.acked_counter {
            return Err(format!(
                "the counter restarts at {} below {} minted by an acknowledged write",
                loaded.replica.counter(),
                self.acked_counter
            ));
        }
        sim.replicas[0] = loaded.replica;
        // The resume: own registrations written again before anything else.
        for rec in loaded.owned {
            into_replica(sim, &rec);
        }
        Ok(())
    }
}

/// Registers `rec` at replica 0 and puts the delta in flight to the others.
fn into_replica(sim: &mut Sim, rec: &OwnedRecord) {
    let s = SERVICES.iter().position(|s| *s == rec.service).unwrap() as u8;
    let port: u16 = rec.address.rsplit_once(':').unwrap().1.parse().unwrap();
    let now = sim.clocks[0].tick(sim.now_ms);
    let applied = sim.replicas[0]
        .register(
            service(s),
            ProviderId::new(&rec.instance).unwrap(),
            endpoint(port),
            rec.meta.iter().cloned().collect(),
            LEASE_TTL_MS,
            now,
        )
        .expect("a valid registration");
    for to in 1..sim.replicas.len() {
        sim.flight.push((to, applied.delta.clone()));
    }
}

fn keeps_its_promises(steps: Vec<Step>) -> bool {
    let rules = Rules {
        // A retired node that writes again loses its earlier writes: not this property's.
        retire: false,
        ..Rules::default()
    };
    let mut sim = Sim::new(rules);
    let mut node = NodeUnderTest::new(&mut sim);
    let mut outcome = Ok(());
    for step in steps.iter().chain([&Step::Crash]) {
        outcome = match step {
            Step::Peer(op) => {
                sim.step(op);
                Ok(())
            }
            Step::Own {
                service,
                instance,
                port,
                meta,
                answered,
            } => {
                let rec = record(*service, *instance, *port, *meta, sim.now_ms);
                node.write(&mut sim, rec, *answered);
                Ok(())
            }
            Step::Save => {
                node.save(&mut sim);
                Ok(())
            }
            Step::Crash => node.crash(&mut sim),
        };
        if let Err(why) = &outcome {
            eprintln!("{why}");
            break;
        }
    }
    outcome.is_ok()
}

#[test]
fn a_restart_loads_no_dot_without_its_data_and_every_acknowledged_own_write() {
    check(
        "a_restart_loads_no_dot_without_its_data_and_every_acknowledged_own_write",
        200,
        keeps_its_promises as fn(Vec<Step>) -> bool,
    );
}

#[test]
fn an_own_write_answered_after_the_last_save_survives_a_crash_that_loses_peer_changes() {
    let peer_write = |port| Op::Register {
        at: 1,
        service: 0,
        provider: 1,
        port,
        meta: 1,
    };
    let steps = vec![
        Step::Peer(peer_write(80)),
        Step::Peer(Op::Deliver { pick: 0 }),
        Step::Save,
        Step::Peer(peer_write(81)),
        Step::Peer(Op::Deliver { pick: 1 }),
        Step::Own {
            service: 1,
            instance: 0,
            port: 8080,
            meta: 2,
            answered: true,
        },
        Step::Own {
            service: 1,
            instance: 1,
            port: 8081,
            meta: 0,
            answered: false,
        },
        Step::Crash,
        Step::Save,
        Step::Crash,
    ];
    assert!(keeps_its_promises(steps));
}
