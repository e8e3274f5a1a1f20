//! The replica saved entry by entry: after any schedule of changes (its own writes,
//! deliveries, syncs, expiries, retirements), saves and crashes, the state a store loads is
//! the replica's state as of its last save.

use quickcheck::{Arbitrary, Gen};
use roster::store::Store;
use roster_registry::{ReplicaId, State};

use crate::support::{check, Op, Rules, Sim};

/// What happens to the saved replica (the simulation's replica 0) after a step.
#[derive(Clone, Debug)]
enum Disk {
    /// Nothing: its changes wait for a later save.
    Wait,
    /// The saver writes what changed since its last save.
    Save,
    /// SIGKILL: the process restarts from its store; what it did not save is lost.
    Crash,
}

impl Arbitrary for Disk {
    fn arbitrary(g: &mut Gen) -> Self {
        match u8::arbitrary(g) % 6 {
            0..=2 => Disk::Wait,
            3 | 4 => Disk::Save,
            _ => Disk::Crash,
        }
    }
}

/// The replica 0 of a simulation, kept in a store.
struct Saved {
    dir: tempfile::TempDir,
    store: Option<Store>,
    /// Its state as of the last save.
    state: State,
    now_ms: u64,
}

impl Saved {
    /// Opens a new store; replica 0 becomes the replica it loads (tracking its changes).
    fn new(sim: &mut Sim) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let id = sim.replicas[0].id();
        let (store, loaded) = Store::open(dir.path(), id, 1).unwrap();
        assert!(loaded.fresh);
        sim.replicas[0] = loaded.replica;
        Saved {
            dir,
            store: Some(store),
            state: State::new(),
            now_ms: 1,
        }
    }

    fn save(&mut self, sim: &mut Sim) {
        let r = &mut sim.replicas[0];
        let changed = r.take_changed().expect("a loaded replica tracks its changes");
        let store = self.store.as_ref().unwrap();
        store.save_replica(r, &changed, false).unwrap();
        self.state = r.state().clone();
    }

    /// Restarts from the store; returns whether it loaded the state last saved.
    fn crash(&mut self, sim: &mut Sim) -> bool {
        drop(self.store.take());
        self.now_ms += 1;
        let (store, loaded) = Store::open(self.dir.path(), ReplicaId(0), self.now_ms).unwrap();
        self.store = Some(store);
        let same = *loaded.replica.state() == self.state;
        if !same {
            eprintln!("loaded {:?}\nsaved  {:?}", loaded.replica.state(), self.state);
        }
        sim.replicas[0] = loaded.replica;
        same
    }
}

fn loads_what_was_saved(steps: Vec<(Op, Disk)>) -> bool {
    let mut sim = Sim::new(Rules::default());
    let mut saved = Saved::new(&mut sim);
    for (op, disk) in &steps {
        sim.step(op);
        match disk {
            Disk::Wait => {}
            Disk::Save => saved.save(&mut sim),
            Disk::Crash => {
                if !saved.crash(&mut sim) {
                    return false;
                }
            }
        }
    }
    saved.save(&mut sim);
    let last = sim.replicas[0].state().clone();
    saved.crash(&mut sim) && *sim.replicas[0].state() == last
}

#[test]
fn the_store_loads_the_replica_as_of_its_last_save_after_any_changes_saves_and_crashes() {
    check(
        "the_store_loads_the_replica_as_of_its_last_save",
        100,
        loads_what_was_saved as fn(Vec<(Op, Disk)>) -> bool,
    );
}
