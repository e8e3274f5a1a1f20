//! The simulated network: its faults (loss, duplication, delay, per machine too), the
//! traffic it carried, partitions, and the connections it opens, carries messages on,
//! closes and, with the driver's keepalive emulated, lets die of silence.

use rand::rngs::SmallRng;
use rand::RngExt;

use super::{links, End, Event, Sim};
use crate::backoff::Failure;
use crate::keepalive::Timing;
use crate::message::Envelope;
use crate::proto::{ConnId, DialTarget};

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

/// How long a dial across a silent partition hangs before it fails: the driver's
/// handshake timeout (`Limits::handshake_timeout`), which bounds a TCP connect too.
pub const SILENT_DIAL_MS: u64 = 5_000;

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
    /// a link on which nothing arrived for `timing.dead_after` is closed as dead
    /// ([`Node::handle_dead_link`](crate::proto::Node::handle_dead_link) on that side; the
    /// other side sees it close). Without it, a simulated link never dies of silence.
    pub fn emulate_keepalive(&mut self, timing: Timing) {
        let mut k = links::Keepalives::new(timing);
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

    /// Splits the network: machines on different sides cannot talk, and connections across
    /// sides drop.
    pub fn partition(&mut self, side_of: impl Fn(usize) -> u32) {
        self.silent = false;
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

    /// Splits the network silently (no FIN, no RST): machines on different sides cannot
    /// talk, but the connections across the sides stay open at both ends, and what is
    /// sent on them is lost, until a keepalive (see [`Sim::emulate_keepalive`]) or the
    /// protocol closes them. Dials across the sides hang and fail after the driver's
    /// handshake timeout ([`SILENT_DIAL_MS`]), as a SYN that is dropped does.
    pub fn partition_silently(&mut self, side_of: impl Fn(usize) -> u32) {
        self.silent = true;
        for i in 0..self.machines.len() {
            self.machines[i].side = side_of(i);
        }
    }

    /// Heals every partition.
    pub fn heal(&mut self) {
        for m in &mut self.machines {
            m.side = 0;
        }
    }

    /// Closes a connection at both ends, telling both nodes.
    pub(super) fn drop_conn(&mut self, c: ConnId) {
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

    /// Closes `conn` (an end of machine `i`) once what was sent on it before has arrived
    /// (a driver flushes before closing); then both ends learn of it.
    pub(super) fn close_later(&mut self, i: usize, conn: ConnId) {
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

    pub(super) fn send(&mut self, from: usize, conn: ConnId, envelope: Envelope) {
        let bytes = envelope.encoded_len() as u64;
        let kind = match &envelope.message {
            crate::message::Message::Delta { delta, .. }
                if self.classify_deltas
                    && crate::message::decode_delta(delta).is_ok_and(|d| d.registration_count() == 0) =>
            {
                "delta-leases"
            }
            crate::message::Message::Push { delta, .. }
                if self.classify_deltas
                    && crate::message::decode_delta(delta).is_ok_and(|d| d.registration_count() == 0) =>
            {
                "push-leases"
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
        if self.machines[from].info.zone != self.machines[to].info.zone {
            let k = self.border_by_kind.entry(kind).or_default();
            k.0 += 1;
            k.1 += bytes;
        }
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

    pub(super) fn dial(&mut self, from: usize, target: DialTarget, work: &mut Vec<usize>) {
        let url = match &target {
            DialTarget::Peer { url, .. } | DialTarget::Seed { url } => url.clone(),
        };
        self.machines[from].traffic.dials += 1;
        let now = self.now_ms;
        let to = machine_of(&url).filter(|&j| j < self.machines.len() && j != from);
        self.dials.push((now, from, to));
        let across = to.filter(|&j| self.machines[j].side != self.machines[from].side);
        if across.is_some() && self.silent {
            self.next_event += 1;
            let at = (now + SILENT_DIAL_MS, self.next_event);
            self.queue.insert(at, Event::DialTimedOut { from, target });
            return;
        }
        let Some(to) = to.filter(|&j| self.machines[j].node.is_some() && across.is_none()) else {
            self.dial_failed_now(from, &target, work);
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

    /// A dial of machine `from` failed: refused, or given up across a silent partition.
    fn dial_failed_now(&mut self, from: usize, target: &DialTarget, work: &mut Vec<usize>) {
        let now = self.now_of(from);
        if let Some(n) = self.machines[from].node.as_mut() {
            n.handle_dial_failed(target, Failure::Network, now);
        }
        work.push(from);
    }

    /// A dial across a silent partition timed out.
    pub(super) fn dial_failed(&mut self, from: usize, target: &DialTarget) {
        let mut work = Vec::new();
        self.dial_failed_now(from, target, &mut work);
        for i in work {
            self.drain(i);
        }
    }

    /// Pings the quiet links that are due, and closes the dead ones: the dead side's node
    /// is told its link died of silence; the other side sees the close arrive.
    pub(super) fn run_keepalives(&mut self) {
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
    pub(super) fn deliver_control(&mut self, to: ConnId, ping: bool) {
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

    pub(super) fn deliver(&mut self, to: ConnId, envelope: Envelope, bytes: u64) {
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
}
