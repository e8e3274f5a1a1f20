//! The node's timers: when [`Node::handle_timeout`] is next due, what runs when it is
//! (pushes, acknowledgements, renewals, suspicions, gossip rounds, digests, redials,
//! rotation), and the sweep of what expired.

use rand::RngExt;

use super::{ConnId, Message, Node, Now};

impl Node {
    /// Pushes are spaced `push_delay` apart and paced to `push_rate`: a delta after a
    /// quiet spell is due at once (the push runs when the driver next asks for timeouts,
    /// so everything the current input made goes in one message); one during a burst
    /// waits for the batch.
    pub(super) fn schedule_push(&mut self, now: Now) {
        if self.push_at.is_none() {
            let spaced = self.pushed_at.map_or(now.mono_ms, |t| t + self.cfg.push_delay_ms);
            let paced = self.pacer.next_at(now.mono_ms);
            self.push_at = Some(spaced.max(paced).max(now.mono_ms));
        }
    }

    /// Acknowledges delta `seq` from `conn` after `ack_delay_ms`, with whatever else
    /// arrives on it meanwhile: one acknowledgement for a burst.
    pub(super) fn owe_ack(&mut self, conn: ConnId, seq: u64, now: Now) {
        if let Some(c) = self.conns.get_mut(&conn) {
            c.ack_owed = Some(c.ack_owed.map_or(seq, |s| s.max(seq)));
            self.ack_at.get_or_insert(now.mono_ms + self.cfg.ack_delay_ms);
        }
    }

    fn send_acks(&mut self, now: Now) {
        let owed: Vec<(ConnId, u64)> = self
            .conns
            .iter_mut()
            .filter_map(|(id, c)| c.ack_owed.take().map(|seq| (*id, seq)))
            .collect();
        for (conn, seq) in owed {
            self.send(conn, Message::Ack { seq }, now);
        }
    }

    /// When [`Node::handle_timeout`] should next be called, on the monotonic clock
    /// ([`Now::mono_ms`]): the earliest deadline it serves.
    pub fn poll_timeout(&self) -> u64 {
        let mut t = self
            .gossip_at
            .min(self.digest_at)
            .min(self.renew_at)
            .min(self.reconnect_at)
            .min(self.rotate_at);
        if let Some(p) = self.push_at {
            t = t.min(p);
        }
        if let Some(a) = self.ack_at {
            t = t.min(a);
        }
        if let Some(s) = self.next_suspicion_deadline() {
            t = t.min(s);
        }
        if let Some(g) = self.trees.next_graft_at() {
            t = t.min(g);
        }
        if let Some(a) = self.announce_at {
            t = t.min(a);
        }
        if let Some(o) = self.overdue.check_at {
            t = t.min(o);
        }
        t
    }

    /// Runs whatever timers are due at `now` (on its monotonic clock).
    pub fn handle_timeout(&mut self, now: impl Into<Now>) {
        let now = self.input_time(now.into());
        let mono = now.mono_ms;
        if self.push_at.is_some_and(|t| t <= mono) {
            self.push_at = None;
            self.pushed_at = Some(mono);
            self.pacer.spend(mono);
            self.push(now);
        }
        if self.ack_at.is_some_and(|t| t <= mono) {
            self.ack_at = None;
            self.send_acks(now);
        }
        if self.trees.next_graft_at().is_some_and(|t| t <= mono) {
            self.run_grafts(now);
        }
        if self.announce_at.is_some_and(|t| t <= mono) {
            // Announcements that waited go now; a delta due with them goes along,
            // unpaced (at most once per spacing).
            self.announce_at = None;
            self.push(now);
        }
        if self.overdue.check_at.is_some_and(|t| t <= mono) {
            self.check_overdue(now);
        }
        if self.renew_at <= mono {
            self.renew(now);
        }
        self.run_suspicions(now);
        if self.gossip_at <= mono {
            self.gossip_at = mono + self.jitter(self.cfg.gossip_interval_ms);
            self.gossip(now);
            self.report_lapsed(now);
            self.tend_damping(now);
            self.expire(now);
            self.release_seed(now);
            self.close_synced(now);
            self.dial_more(now);
            self.tend_border_link(now);
        }
        if self.digest_at <= mono {
            self.digest_at = mono + self.jitter(self.cfg.digest_interval_ms);
            self.anti_entropy(now);
        }
        if self.reconnect_at <= mono {
            self.reconnect_at = mono + self.jitter(self.cfg.reconnect_interval_ms.max(1));
            self.reconnect_lost(now);
            self.tend_borders(now);
        }
        if self.rotate_at <= mono {
            self.rotate_at = mono + self.jitter(self.cfg.rotate_interval_ms.max(1));
            self.rotate(now);
        }
    }

    fn jitter(&mut self, d: u64) -> u64 {
        (d * 3 / 4 + self.rng.random_range(0..=d / 2)).max(1)
    }

    /// Tells watchers of instances whose lease ended since the last check: reads hide them
    /// at once, but no delta says so until a sweep (after the hold-off, and then the join
    /// sees them already hidden). Called before every input too (`input_time`): a removal
    /// joined after a lease ended and before the node looked would otherwise tell them
    /// nothing, the instance being hidden already and then gone.
    pub(super) fn report_lapsed(&mut self, now: Now) {
        if now.wall_ms <= self.lapse_checked {
            return;
        }
        let lapsed = self.replica.lapsed_due(self.lapse_checked, now.wall_ms);
        self.lapse_checked = now.wall_ms;
        if lapsed.is_empty() {
            return;
        }
        self.counters.instances_lapsed += lapsed.len() as u64;
        self.emit_changes(lapsed, now);
    }

    fn expire(&mut self, now: Now) {
        if now.mono_ms < self.expire_from {
            return;
        }
        let hold = self.held_from_sweep(now);
        let before = self.replica.registrations();
        if let Some(applied) = self
            .replica
            .expire_holding(now.wall_ms, self.cfg.expire_grace_ms, &hold)
        {
            self.note_departures(&before, &applied.changes, now);
            self.local_delta(applied.delta, applied.changes, now);
        }
    }
}
