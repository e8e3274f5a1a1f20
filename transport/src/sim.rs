//! A deterministic simulator: many protocol state machines in one thread, virtual time, and
//! a network that loses, duplicates, delays and reorders messages, cuts partitions, and
//! crashes and restarts nodes.
//!
//! One seed drives everything, so a run is reproduced exactly by its seed. Nothing here
//! reads a clock or the OS: it is a driver of [`crate::proto::Node`] like the tokio one,
//! with the network replaced by a priority queue.

mod links;

use std::collections::{BTreeMap, BTreeSet};

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use roster_registry::{Replica, ReplicaId, State};

use crate::backoff::Failure;
use crate::driver::Limits;
use crate::message::Envelope;
use crate::proto::{Config, ConnId, DialTarget, Node, NodeInfo, Now, Output};

/// The network's behaviour. Probabilities in per mille; delays in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Faults {
    /// Chance a message is lost.
    pub loss_permille: u32,
    /// Chance a message is delivered twice.
    pub dup_permille: u32,
    /// The shortest one-way delay.
    pub min_delay_ms: u64,
    /// The longest one-way delay (messages overtake each other within the spread).
    pub max_delay_ms: u64,
}

impl Faults {
    /// A clean network: no loss, no duplication, 1 ms delay.
    pub const NONE: Faults = Faults {
        loss_permille: 0,
        dup_permille: 0,
        min_delay_ms: 1,
        max_delay_ms: 1,
    };

    /// The worse of each of two behaviours: a link is as lossy and as slow as its worse end.
    fn worst(self, other: Faults) -> Faults {
        Faults {
            loss_permille: self.loss_permille.max(other.loss_permille),
            dup_permille: self.dup_permille.max(other.dup_permille),
            min_delay_ms: self.min_delay_ms.max(other.min_delay_ms),
            max_delay_ms: self.max_delay_ms.max(other.max_delay_ms),
        }
    }

    /// A one-way delay drawn from this behaviour's range.
    fn delay(self, rng: &mut SmallRng) -> u64 {
        rng.random_range(self.min_delay_ms..=self.max_delay_ms.max(self.min_delay_ms))
    }
}

/// What the simulated network carried, per node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Messages sent.
    pub messages_sent: u64,
    /// Bytes sent (encoded envelopes; framing not counted).
    pub bytes_sent: u64,
    /// Messages received.
    pub messages_received: u64,
    /// Bytes received.
    pub bytes_received: u64,
    /// Connections this node opened.
    pub dials: u64,
}

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
}

/// The bytes of an emulated ping or pong: an empty WebSocket control frame, masked (the
/// larger of the two directions).
const CONTROL_FRAME_BYTES: u64 = 6;

/// The URL of machine `i` in the simulation.
pub fn url(i: usize) -> String {
    format!("ws://10.{}.{}.{}:7420", (i >> 16) & 255, (i >> 8) & 255, i & 255)
}

fn machine_of(url: &str) -> Option<usize> {
    let host = url.strip_prefix("ws://")?.split(':').next()?;
    let mut parts = host.split('.').skip(1).map(|p| p.parse::<usize>().ok());
    let (a, b, c) = (parts.next()??, parts.next()??, parts.next()??);
    Some((a << 16) | (b << 8) | c)
}

impl Sim {
    /// `n` machines, all started at time 0, each given machine 0 as its seed (machine 0 has
    /// none). `seed` drives every random choice of the network and of the nodes.
    pub fn new(n: usize, proto: Config, faults: Faults, seed: u64) -> Self {
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
            timers: BTreeSet::new(),
            timer_of: vec![None; n],
            keepalives: None,
        };
        for i in 0..n {
            let info = NodeInfo {
                id: ReplicaId(0x1000 + i as u64),
                name: format!("m{i}"),
                url: url(i),
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

    /// The traffic of machine `i` so far.
    pub fn traffic(&self, i: usize) -> Traffic {
        self.machines[i].traffic
    }

    /// Sets the network's behaviour from now on.
    pub fn set_faults(&mut self, faults: Faults) {
        self.faults = faults;
    }

    /// Gives machine `i`'s links their own behaviour from now on (`None`: the
    /// simulation's): a slow or lossy machine. A link takes the worse of its ends'.
    pub fn set_machine_faults(&mut self, i: usize, faults: Option<Faults>) {
        self.machines[i].faults = faults;
    }

    /// Emulates the driver's keepalive on every connection from now on: quiet links
    /// are pinged (a ping and a pong, 6 bytes each, lost and delayed like any message) and
    /// a link on which nothing arrived for `limits.dead_after` is closed as dead
    /// ([`Node::handle_dead_link`] on that side; the other side sees it close). Without it,
    /// a simulated link never dies of silence.
    pub fn emulate_keepalive(&mut self, limits: Limits) {
        let mut k = links::Keepalives::new(limits);
        for (conn, end) in &self.ends {
            k.opened(*conn, end.outbound, self.now_ms);
        }
        self.keepalives = Some(k);
    }

    /// The behaviour of a link between machines `a` and `b`.
    fn link_faults(&self, a: usize, b: usize) -> Faults {
        [a, b]
            .iter()
            .filter_map(|&m| self.machines[m].faults)
            .fold(self.faults, Faults::worst)
    }

    fn start(&mut self, i: usize) {
        let seeds = if i == 0 { vec![] } else { vec![url(0)] };
        let m = &self.machines[i];
        let replica = Replica::from_state(m.info.id, m.disk.clone(), m.counter_floor);
        let seed = self.rng.random::<u64>();
        let proto = m.proto.unwrap_or(self.proto);
        match Node::new(m.info.clone(), replica, seeds, proto, seed, self.now_of(i)) {
            Ok(node) => self.machines[i].node = Some(node),
            Err(e) => unreachable!("simulated node info is valid: {e}"),
        }
        self.drain(i);
    }

    /// Crashes machine `i`: its connections drop; its disk keeps the replica.
    pub fn crash(&mut self, i: usize) {
        let Some(node) = self.machines[i].node.take() else {
            return;
        };
        self.refresh_timer(i);
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

    /// Restarts machine `i` from its disk.
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

    /// Splits the network: machines on different sides cannot talk, and connections across
    /// sides drop.
    pub fn partition(&mut self, side_of: impl Fn(usize) -> u32) {
        for i in 0..self.machines.len() {
            self.machines[i].side = side_of(i);
        }
        let cut: Vec<ConnId> = self
            .ends
            .iter()
            .filter(|(_, e)| {
                let other = self.ends.get(&e.other).map(|o| o.node);
                other.is_some_and(|o| self.machines[o].side != self.machines[e.node].side)
            })
            .map(|(c, _)| *c)
            .collect();
        for c in cut {
            self.drop_conn(c);
        }
    }

    /// Heals every partition.
    pub fn heal(&mut self) {
        for m in &mut self.machines {
            m.side = 0;
        }
    }

    /// Closes a connection at both ends, telling both nodes.
    fn drop_conn(&mut self, c: ConnId) {
        let Some(end) = self.ends.remove(&c) else { return };
        let mut ends = vec![(end.node, c)];
        if let Some(other) = self.ends.remove(&end.other) {
            ends.push((other.node, end.other));
        }
        if let Some(k) = self.keepalives.as_mut() {
            k.closed(c);
            k.closed(end.other);
        }
        for (node, conn) in ends {
            let now = self.now_of(node);
            if let Some(n) = self.machines[node].node.as_mut() {
                n.handle_disconnected(conn, now);
            }
            self.drain(node);
        }
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

    /// Closes `conn` (an end of machine `i`) once what was sent on it before has arrived
    /// (a driver flushes before closing); then both ends learn of it.
    fn close_later(&mut self, i: usize, conn: ConnId) {
        let other = self
            .ends
            .get(&conn)
            .and_then(|e| self.ends.get(&e.other))
            .map_or(i, |o| o.node);
        let f = self.link_faults(i, other);
        self.next_event += 1;
        let at = self.now_ms + f.max_delay_ms.max(f.min_delay_ms) + 1;
        self.queue.insert((at, self.next_event), Event::Close { conn });
    }

    fn send(&mut self, from: usize, conn: ConnId, envelope: Envelope) {
        let bytes = envelope.encoded_len() as u64;
        let kind = match &envelope.message {
            crate::message::Message::Delta { delta, .. }
                if self.classify_deltas
                    && crate::message::decode_delta(delta).is_ok_and(|d| d.registration_count() == 0) =>
            {
                "delta-leases"
            }
            m => m.kind(),
        };
        let k = self.by_kind.entry(kind).or_default();
        k.0 += 1;
        k.1 += bytes;
        let t = &mut self.machines[from].traffic;
        t.messages_sent += 1;
        t.bytes_sent += bytes;
        let Some(end) = self.ends.get(&conn).copied() else {
            return;
        };
        let to = self.ends.get(&end.other).map_or(from, |e| e.node);
        let f = self.link_faults(from, to);
        if self.rng.random_range(0..1_000) < f.loss_permille {
            return;
        }
        let copies = if self.rng.random_range(0..1_000) < f.dup_permille {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let delay = f.delay(&mut self.rng);
            self.next_event += 1;
            self.queue.insert(
                (self.now_ms + delay, self.next_event),
                Event::Deliver {
                    to: end.other,
                    envelope: envelope.clone(),
                    bytes,
                },
            );
        }
    }

    fn dial(&mut self, from: usize, target: DialTarget, work: &mut Vec<usize>) {
        let url = match &target {
            DialTarget::Peer { url, .. } | DialTarget::Seed { url } => url.clone(),
        };
        self.machines[from].traffic.dials += 1;
        let now = self.now_ms;
        let to = machine_of(&url).filter(|&j| j < self.machines.len() && j != from);
        self.dials.push((now, from, to));
        let reachable = to.filter(|&j| {
            self.machines[j].node.is_some() && self.machines[j].side == self.machines[from].side
        });
        let Some(to) = reachable else {
            let now = self.now_of(from);
            if let Some(n) = self.machines[from].node.as_mut() {
                n.handle_dial_failed(&target, Failure::Network, now);
            }
            work.push(from);
            return;
        };
        let (a, b) = (self.next_conn, self.next_conn + 1);
        self.next_conn += 2;
        self.ends.insert(
            a,
            End {
                node: from,
                other: b,
                outbound: true,
            },
        );
        self.ends.insert(
            b,
            End {
                node: to,
                other: a,
                outbound: false,
            },
        );
        if let Some(k) = self.keepalives.as_mut() {
            k.opened(a, true, now);
            k.opened(b, false, now);
        }
        let (info_from, info_to) = (self.machines[from].info.clone(), self.machines[to].info.clone());
        let seed = match &target {
            DialTarget::Seed { url } => Some(url.as_str()),
            DialTarget::Peer { .. } => None,
        };
        let (now_to, now_from) = (self.now_of(to), self.now_of(from));
        if let Some(n) = self.machines[to].node.as_mut() {
            n.handle_connected(b, &info_from, false, None, now_to);
        }
        if let Some(n) = self.machines[from].node.as_mut() {
            n.handle_connected(a, &info_to, true, seed, now_from);
        }
        work.push(to);
        work.push(from);
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

    /// Pings the quiet links that are due, and closes the dead ones: the dead side's node
    /// is told its link died of silence; the other side sees the close arrive.
    fn run_keepalives(&mut self) {
        let Some(k) = self.keepalives.as_mut() else { return };
        for (conn, due) in k.take_due(self.now_ms) {
            let Some(end) = self.ends.get(&conn).copied() else {
                continue;
            };
            match due {
                links::Due::Ping => self.send_control(conn, true),
                links::Due::Dead => {
                    self.ends.remove(&conn);
                    let now = self.now_of(end.node);
                    if let Some(n) = self.machines[end.node].node.as_mut() {
                        n.handle_dead_link(conn, now);
                    }
                    self.drain(end.node);
                    self.close_later(end.node, end.other);
                }
            }
        }
    }

    /// Sends a ping (or a pong) from end `from`, lost and delayed as messages are.
    fn send_control(&mut self, from: ConnId, ping: bool) {
        let Some(end) = self.ends.get(&from).copied() else {
            return;
        };
        let Some(to) = self.ends.get(&end.other).map(|e| e.node) else {
            return;
        };
        let k = self
            .by_kind
            .entry(if ping { "ping" } else { "pong" })
            .or_default();
        k.0 += 1;
        k.1 += CONTROL_FRAME_BYTES;
        let t = &mut self.machines[end.node].traffic;
        t.messages_sent += 1;
        t.bytes_sent += CONTROL_FRAME_BYTES;
        let f = self.link_faults(end.node, to);
        if self.rng.random_range(0..1_000) < f.loss_permille {
            return;
        }
        let delay = f.delay(&mut self.rng);
        self.next_event += 1;
        let event = Event::Control { to: end.other, ping };
        self.queue.insert((self.now_ms + delay, self.next_event), event);
    }

    /// A ping or pong arrives: a sign of life; a ping is answered.
    fn deliver_control(&mut self, to: ConnId, ping: bool) {
        if self.arrive(to, CONTROL_FRAME_BYTES).is_some() && ping {
            self.send_control(to, false);
        }
    }

    /// `bytes` arrive at end `to`: counted, and a sign of life for its keepalive. `None`
    /// (nothing counted) when the connection is gone or a partition lies across it.
    fn arrive(&mut self, to: ConnId, bytes: u64) -> Option<End> {
        let end = self.ends.get(&to).copied()?;
        let from = self.ends.get(&end.other).map(|e| e.node)?;
        if self.machines[from].side != self.machines[end.node].side {
            return None;
        }
        let t = &mut self.machines[end.node].traffic;
        t.messages_received += 1;
        t.bytes_received += bytes;
        if let Some(k) = self.keepalives.as_mut() {
            k.heard(to, self.now_ms);
        }
        Some(end)
    }

    /// Runs for `ms` more milliseconds of virtual time.
    pub fn run_for(&mut self, ms: u64) {
        self.run_until(self.now_ms + ms);
    }

    fn deliver(&mut self, to: ConnId, envelope: Envelope, bytes: u64) {
        let Some(end) = self.arrive(to, bytes) else {
            return;
        };
        let now = self.now_of(end.node);
        if let Some(n) = self.machines[end.node].node.as_mut() {
            // A refusal closes the connection through the node's outputs.
            let _ = n.handle_message(to, envelope, now);
        }
        self.drain(end.node);
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
