//! A deterministic simulator: many protocol state machines in one thread, virtual time, and
//! a network that loses, duplicates, delays and reorders messages, cuts partitions, and
//! crashes and restarts nodes.
//!
//! One seed drives everything, so a run is reproduced exactly by its seed. Nothing here
//! reads a clock or the OS: it is a driver of [`crate::proto::Node`] like the tokio one,
//! with the network replaced by a priority queue.

mod links;
mod network;

use std::collections::{BTreeMap, BTreeSet};

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use roster_registry::{Replica, ReplicaId, State};

use crate::message::Envelope;
use crate::proto::{Config, ConnId, DialTarget, Node, NodeInfo, Now, Output, Resume, Zone};
pub use network::{url, Faults, Traffic, SILENT_DIAL_MS};

#[derive(Debug)]
enum Event {
    /// Deliver a message to one end of a connection.
    Deliver {
        to: ConnId,
        envelope: Envelope,
        bytes: u64,
    },
    /// Close a connection, once what was sent on it before has arrived.
    Close { conn: ConnId },
    /// A WebSocket ping (or, `ping` false, its pong) arrives at one end (with
    /// [`Sim::emulate_keepalive`]).
    Control { to: ConnId, ping: bool },
    /// A dial into a silent partition gives up (see [`Sim::partition_silently`]).
    DialTimedOut { from: usize, target: DialTarget },
}

#[derive(Debug, Clone, Copy)]
struct End {
    node: usize,
    other: ConnId,
    /// This end dialed.
    outbound: bool,
}

/// One simulated machine: its identity, its node while it runs, and its disk.
#[derive(Debug)]
struct Machine {
    info: NodeInfo,
    node: Option<Node>,
    /// The replica as saved on disk (all applied state is taken to be durable).
    disk: State,
    counter_floor: u64,
    side: u32,
    traffic: Traffic,
    /// This machine's knobs, when not the simulation's.
    proto: Option<Config>,
    /// How far its wall clock is off the simulation's time (its monotonic clock is not).
    wall_offset_ms: i64,
    /// Its own network behaviour, on every link it has, when worse than the simulation's.
    faults: Option<Faults>,
    /// What a graceful stop saved for the next process (its own registrations, what it
    /// knew of its peers); `None` after a crash: the next start is a fresh node's.
    resume: Option<Resume>,
}

/// The simulator.
#[derive(Debug)]
pub struct Sim {
    now_ms: u64,
    rng: SmallRng,
    proto: Config,
    faults: Faults,
    machines: Vec<Machine>,
    ends: BTreeMap<ConnId, End>,
    next_conn: ConnId,
    /// Pending deliveries, by (time, order of sending): deterministic.
    queue: BTreeMap<(u64, u64), Event>,
    next_event: u64,
    /// Every change event each node emitted, with its time: (node, time, change).
    log: Vec<(usize, u64, roster_registry::Change)>,
    keep_log: bool,
    by_kind: BTreeMap<&'static str, (u64, u64)>,
    /// The same, for messages between machines of different zones.
    border_by_kind: BTreeMap<&'static str, (u64, u64)>,
    /// Every dial: (time, from, the machine its URL names).
    dials: Vec<(u64, usize, Option<usize>)>,
    /// Whether to tell deltas that carry registrations from those with leases only.
    classify_deltas: bool,
    /// Every running node's next timer, as (time, machine), kept up to date after each
    /// input: the next one is the first, without asking every node per event.
    timers: BTreeSet<(u64, usize)>,
    /// Each machine's entry in `timers`.
    timer_of: Vec<Option<u64>>,
    /// The driver's pings and dead links, when emulated.
    keepalives: Option<links::Keepalives>,
    /// Whether the partition drops what crosses it without a word: a dial across it hangs
    /// until the driver's handshake timeout, where a loud one is refused at once.
    silent: bool,
}

impl Sim {
    /// `n` machines, all started at time 0, each given machine 0 as its seed (machine 0 has
    /// none). `seed` drives every random choice of the network and of the nodes.
    pub fn new(n: usize, proto: Config, faults: Faults, seed: u64) -> Self {
        Self::in_zones(n, proto, faults, seed, |_| Zone::default())
    }

    /// As [`Sim::new`], machine `i` in zone `zone_of(i)`.
    pub fn in_zones(
        n: usize,
        proto: Config,
        faults: Faults,
        seed: u64,
        zone_of: impl Fn(usize) -> Zone,
    ) -> Self {
        let mut sim = Sim {
            now_ms: 1_700_000_000_000,
            rng: SmallRng::seed_from_u64(seed),
            proto,
            faults,
            machines: Vec::with_capacity(n),
            ends: BTreeMap::new(),
            next_conn: 1,
            queue: BTreeMap::new(),
            dials: Vec::new(),
            classify_deltas: false,
            next_event: 0,
            log: Vec::new(),
            keep_log: false,
            by_kind: BTreeMap::new(),
            border_by_kind: BTreeMap::new(),
            timers: BTreeSet::new(),
            timer_of: vec![None; n],
            keepalives: None,
            silent: false,
        };
        for i in 0..n {
            let info = NodeInfo {
                id: ReplicaId(0x1000 + i as u64),
                name: format!("m{i}"),
                url: url(i),
                zone: zone_of(i),
            };
            sim.machines.push(Machine {
                info,
                node: None,
                disk: State::new(),
                counter_floor: 0,
                side: 0,
                traffic: Traffic::default(),
                proto: None,
                wall_offset_ms: 0,
                faults: None,
                resume: None,
            });
        }
        for i in 0..n {
            sim.start(i);
        }
        sim
    }

    /// Records every change event from now on (for propagation measurements).
    pub fn keep_log(&mut self, keep: bool) {
        self.keep_log = keep;
        self.log.clear();
    }

    /// The change events recorded: (machine, time, change).
    pub fn log(&self) -> &[(usize, u64, roster_registry::Change)] {
        &self.log
    }

    /// The virtual wall time, in milliseconds since the epoch.
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// How many machines.
    pub fn len(&self) -> usize {
        self.machines.len()
    }

    /// Whether there are no machines.
    pub fn is_empty(&self) -> bool {
        self.machines.is_empty()
    }

    /// The node of machine `i`, if it runs.
    pub fn node(&self, i: usize) -> Option<&Node> {
        self.machines[i].node.as_ref()
    }

    /// Both clocks of machine `i` now: its monotonic clock is the simulation's time, its
    /// wall clock that off by its offset.
    pub fn now_of(&self, i: usize) -> Now {
        let off = self.machines[i].wall_offset_ms;
        let wall_ms = if off >= 0 {
            self.now_ms.saturating_add(off.unsigned_abs())
        } else {
            self.now_ms.saturating_sub(off.unsigned_abs())
        };
        Now {
            mono_ms: self.now_ms,
            wall_ms,
        }
    }

    /// Steps machine `i`'s wall clock to `offset_ms` off the simulation's time (negative:
    /// behind), as an NTP step or an operator would. Its monotonic clock does not move.
    pub fn set_wall_offset(&mut self, i: usize, offset_ms: i64) {
        self.machines[i].wall_offset_ms = offset_ms;
    }

    /// Runs `f` on the node of machine `i` (a local write, say) with its clocks, then
    /// delivers its outputs.
    pub fn with_node<T>(&mut self, i: usize, f: impl FnOnce(&mut Node, Now) -> T) -> Option<T> {
        let now = self.now_of(i);
        let out = self.machines[i].node.as_mut().map(|n| f(n, now));
        self.drain(i);
        out
    }

    /// Messages and bytes sent so far, by kind of message, over all machines.
    pub fn traffic_by_kind(&self) -> &BTreeMap<&'static str, (u64, u64)> {
        &self.by_kind
    }

    /// Messages and bytes sent so far between machines of different zones, by kind.
    pub fn border_traffic_by_kind(&self) -> &BTreeMap<&'static str, (u64, u64)> {
        &self.border_by_kind
    }

    /// The traffic of machine `i` so far.
    pub fn traffic(&self, i: usize) -> Traffic {
        self.machines[i].traffic
    }

    fn start(&mut self, i: usize) {
        let seeds = if i == 0 { vec![] } else { vec![url(0)] };
        let m = &self.machines[i];
        let replica = Replica::from_state(m.info.id, m.disk.clone(), m.counter_floor);
        let seed = self.rng.random::<u64>();
        let proto = m.proto.unwrap_or(self.proto);
        let info = m.info.clone();
        let now = self.now_of(i);
        let started = match self.machines[i].resume.take() {
            Some(resume) => Node::with_resume(info, replica, seeds, proto, seed, now, resume).map(|(n, _)| n),
            None => Node::new(info, replica, seeds, proto, seed, now),
        };
        match started {
            Ok(node) => self.machines[i].node = Some(node),
            Err(e) => unreachable!("simulated node info is valid: {e}"),
        }
        self.drain(i);
    }

    /// Stops machine `i` as an agent does on SIGTERM ([`Node::stop`]: it pushes what its
    /// peers lack and says goodbye); its disk keeps the replica, its own registrations and
    /// what it knew of its peers, and [`Sim::restart`] resumes from them.
    pub fn stop(&mut self, i: usize) {
        let now = self.now_of(i);
        let Some(node) = self.machines[i].node.as_mut() else {
            return;
        };
        node.stop(now);
        let memory = node.memory();
        let resume = Resume {
            owned: node.owned_registrations(),
            removed: Vec::new(),
            drop_unowned: true,
            peers: memory.peers,
            seeds: memory.seeds,
            crash_guard: None,
            leases_shipped: memory.leases_shipped,
        };
        self.drain(i);
        self.crash(i);
        self.machines[i].resume = Some(resume);
    }

    /// Crashes machine `i`: its connections drop; its disk keeps the replica (and the
    /// next start is a fresh node's on it).
    pub fn crash(&mut self, i: usize) {
        self.machines[i].resume = None;
        let Some(node) = self.machines[i].node.take() else {
            return;
        };
        self.refresh_timer(i);
        // Its dials hanging across a silent partition die with the process.
        self.queue
            .retain(|_, e| !matches!(e, Event::DialTimedOut { from, .. } if *from == i));
        self.machines[i].disk = node.replica().state().clone();
        self.machines[i].counter_floor = node.replica().counter();
        let mine: Vec<ConnId> = self
            .ends
            .iter()
            .filter(|(_, e)| e.node == i)
            .map(|(c, _)| *c)
            .collect();
        for c in mine {
            self.drop_conn(c);
        }
    }

    /// Crashes machine `i` as [`Sim::crash`] does, but its disk holds `saved`, an older
    /// state: the process was killed after acknowledging deltas it had not saved yet.
    pub fn crash_unsaved(&mut self, i: usize, saved: State) {
        if self.machines[i].node.is_some() {
            self.crash(i);
            self.machines[i].disk = saved;
        }
    }

    /// Restarts machine `i` from its disk (resuming what it owns after [`Sim::stop`]).
    pub fn restart(&mut self, i: usize) {
        if self.machines[i].node.is_none() {
            self.start(i);
        }
    }

    /// Gives machine `i` its own knobs from its next start.
    pub fn set_machine_config(&mut self, i: usize, proto: Config) {
        self.machines[i].proto = Some(proto);
    }

    /// Every dial so far: (time, dialing machine, dialed machine).
    pub fn dial_log(&self) -> &[(u64, usize, Option<usize>)] {
        &self.dials
    }

    /// Counts deltas that carry no registration (lease renewals and removals) as
    /// `delta-leases` in [`Sim::traffic_by_kind`], apart from `delta` (costs a decode).
    pub fn classify_deltas(&mut self, on: bool) {
        self.classify_deltas = on;
    }

    /// Whether machine `i` runs.
    pub fn is_up(&self, i: usize) -> bool {
        self.machines[i].node.is_some()
    }

    /// Delivers every output node `i` has queued, and those they cause.
    fn drain(&mut self, i: usize) {
        let mut work = vec![i];
        while let Some(i) = work.pop() {
            while let Some(out) = self.machines[i].node.as_mut().and_then(Node::poll_output) {
                match out {
                    Output::Send { conn, envelope } => self.send(i, conn, envelope),
                    Output::Dial(target) => self.dial(i, target, &mut work),
                    Output::Close { conn, .. } => self.close_later(i, conn),
                    Output::Event(change) => {
                        if self.keep_log {
                            self.log.push((i, self.now_ms, change));
                        }
                    }
                }
            }
            self.refresh_timer(i);
        }
    }

    /// Notes when machine `i` next wants [`Node::handle_timeout`] (after any input to it).
    fn refresh_timer(&mut self, i: usize) {
        let next = self.machines[i].node.as_ref().map(Node::poll_timeout);
        if self.timer_of[i] == next {
            return;
        }
        if let Some(t) = self.timer_of[i] {
            self.timers.remove(&(t, i));
        }
        if let Some(t) = next {
            self.timers.insert((t, i));
        }
        self.timer_of[i] = next;
    }

    /// Runs until virtual time `until_ms` (absolute), processing every delivery and timer.
    pub fn run_until(&mut self, until_ms: u64) {
        loop {
            let next_net = self.queue.keys().next().map(|(t, _)| *t);
            let next_timer = self.timers.first().map(|(t, _)| *t);
            let next_link = self.keepalives.as_ref().and_then(links::Keepalives::next_due);
            let Some(next) = [next_net, next_timer, next_link].into_iter().flatten().min() else {
                self.now_ms = self.now_ms.max(until_ms);
                return;
            };
            if next > until_ms {
                self.now_ms = until_ms;
                return;
            }
            self.now_ms = self.now_ms.max(next);
            if next_net == Some(next) {
                match self.queue.pop_first() {
                    Some((_, Event::Deliver { to, envelope, bytes })) => self.deliver(to, envelope, bytes),
                    Some((_, Event::Close { conn })) => self.drop_conn(conn),
                    Some((_, Event::Control { to, ping })) => self.deliver_control(to, ping),
                    Some((_, Event::DialTimedOut { from, target })) => self.dial_failed(from, &target),
                    None => {}
                }
            } else if next_timer == Some(next) {
                self.run_timers();
            } else {
                self.run_keepalives();
            }
        }
    }

    /// Every node whose timer is due now, in machine order (as a scan of all would find them).
    fn run_timers(&mut self) {
        let now = self.now_ms;
        let mut due: Vec<usize> = self.timers.range(..=(now, usize::MAX)).map(|(_, i)| *i).collect();
        due.sort_unstable();
        for i in due {
            let now = self.now_of(i);
            if let Some(n) = self.machines[i].node.as_mut() {
                n.handle_timeout(now);
            }
            self.drain(i);
        }
    }

    /// Runs for `ms` more milliseconds of virtual time.
    pub fn run_for(&mut self, ms: u64) {
        self.run_until(self.now_ms + ms);
    }

    /// Whether every running node holds the same registry state.
    pub fn converged(&self) -> bool {
        let mut states = self
            .machines
            .iter()
            .filter_map(|m| m.node.as_ref())
            .map(|n| n.replica().state());
        match states.next() {
            Some(first) => states.all(|s| s == first),
            None => true,
        }
    }

    /// The ids of the running machines.
    pub fn running(&self) -> BTreeSet<usize> {
        (0..self.machines.len()).filter(|&i| self.is_up(i)).collect()
    }
}
