//! Reads that time alone changes: when the next lease ends, and what a read shows
//! differently because a lease ended in between (no delta says so).

use std::collections::BTreeSet;

use super::{Change, Replica};
use crate::id::ReplicaId;

impl Replica {
    /// The earliest lease deadline after `now_ms`, if any: when a read's answer will next
    /// change by time alone (a driver sets its expiry timer from this).
    pub fn next_deadline_ms(&self, now_ms: u64) -> Option<u64> {
        self.state
            .leases
            .values()
            .filter_map(|f| f.winner(|l| l.issued).map(|(_, l)| l))
            // A farewell's end changes no read.
            .filter(|l| !l.is_farewell())
            // Nor does a stand-in's end, or not only: the nodes shown unreachable.
            .chain(self.unreachable.values())
            .map(|l| l.deadline_ms())
            .filter(|&d| d > now_ms)
            .min()
    }

    /// What a read showed at `after_ms` and shows differently at `upto_ms` because the
    /// lease of a node that wrote it ended in between: time, not a join, took it down (or,
    /// rarely, uncovered a concurrent write of a live node). Call it as time passes (say
    /// every gossip tick) to tell watchers, since no delta will. With `upto_ms` before
    /// `after_ms` (a clock that went back), the leases that looked ended at `after_ms` and
    /// do not at `upto_ms` bring their instances up again.
    pub fn lapsed(&self, after_ms: u64, upto_ms: u64) -> Vec<Change> {
        let ended_between = |l: &crate::value::Lease| l.is_live(after_ms) != l.is_live(upto_ms);
        // Leases, and the stand-ins of nodes shown unreachable: a display that ends, or a
        // lease that ends under one (the node is then shown unreachable), changes reads.
        let ended: BTreeSet<ReplicaId> = self
            .state
            .leases
            .iter()
            .filter_map(|(n, f)| Some((*n, f.winner(|l| l.issued)?.1)))
            .chain(self.unreachable.iter().map(|(n, l)| (*n, l)))
            .filter(|(_, l)| ended_between(l))
            .map(|(n, _)| n)
            .collect();
        if ended.is_empty() {
            return Vec::new();
        }
        let mut changes = Vec::new();
        for (k, f) in &self.state.regs {
            if !f.dots().any(|d| ended.contains(&d.actor)) {
                continue;
            }
            let was = self.live_instance(k, f, after_ms).map(|i| (i.dot, i.unreachable));
            match self.live_instance(k, f, upto_ms) {
                None if was.is_some() => changes.push(Change::Down {
                    service: k.service.clone(),
                    provider: k.provider.clone(),
                }),
                Some(i) if was != Some((i.dot, i.unreachable)) => changes.push(Change::Up(i.to_owned())),
                _ => {}
            }
        }
        changes
    }

    /// [`Replica::lapsed`] from `after_ms` to `upto_ms`, for a caller that asks as time
    /// passes (every gossip tick): it reads every lease only when one may have ended since
    /// it last looked (the earliest end it saw then has passed, or a join brought a lease
    /// that ends sooner), not at every call. At 1,000 members, reading them every second
    /// was the largest part of an idle node's work.
    pub fn lapsed_due(&mut self, after_ms: u64, upto_ms: u64) -> Vec<Change> {
        if upto_ms < self.lapse_floor {
            return Vec::new();
        }
        let changes = self.lapsed(after_ms, upto_ms);
        self.lapse_floor = self.next_deadline_ms(upto_ms).unwrap_or(u64::MAX);
        changes
    }

    /// What reads show differently now that the clock went back from `ahead_ms` to
    /// `now_ms` (see [`Replica::lapsed`]); [`Replica::lapsed_due`] then looks for leases
    /// that end after `now_ms`.
    pub fn clock_went_back(&mut self, ahead_ms: u64, now_ms: u64) -> Vec<Change> {
        let changes = self.lapsed(ahead_ms, now_ms);
        self.lapse_floor = self.next_deadline_ms(now_ms).unwrap_or(u64::MAX);
        changes
    }

    /// Lowers the lapse floor to the ends of these nodes' leases (a join changed them).
    pub(super) fn note_lease_ends(&mut self, nodes: &BTreeSet<ReplicaId>) {
        for n in nodes {
            if let Some(l) = self.lease_of(*n).filter(|l| !l.is_farewell()) {
                self.lapse_floor = self.lapse_floor.min(l.deadline_ms());
            }
        }
    }
}
