//! The sweep of ended leases: every node whose lease ended (past a grace) goes, with every
//! registration it wrote, in one observed-remove delta; a sweep that found nothing lets
//! the next read nothing until something can have changed.

use std::collections::BTreeSet;

use super::{Applied, Replica};
use crate::id::{Dot, ReplicaId};
use crate::value::Registration;

/// What a sweep that found nothing knew: until the state changes, the nodes it spares
/// change, or `due_ms` comes, the next finds nothing either.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct SweepFloor {
    /// The replica's version then.
    version: u64,
    /// The nodes it spared, and the grace it gave.
    spared: BTreeSet<ReplicaId>,
    grace_ms: u64,
    /// The earliest time (wall ms) a lease it did not spare ends, with the grace.
    due_ms: u64,
}

impl Replica {
    /// Collects every node whose lease ended more than `grace_ms` before `now_ms`, with
    /// every write of its registrations, and any registration written under a lease that
    /// was collected before it arrived.
    ///
    /// An ordinary observed-remove delta: any node may run it, sweeps need no coordination,
    /// and a concurrent renewal (a new dot) survives it. The grace must be at least the
    /// clock skew allowed between nodes. `None` when nothing has expired.
    pub fn expire(&mut self, now_ms: u64, grace_ms: u64) -> Option<Applied> {
        self.expire_holding(now_ms, grace_ms, &BTreeSet::new())
    }

    /// As [`Replica::expire`], but leaves the nodes of `hold`, and the nodes shown as
    /// unreachable ([`Replica::set_unreachable`]), and their writes, to a later sweep: a
    /// node whose removal may yet be judged an unreachable zone's keeps what reads would
    /// show of it.
    pub fn expire_holding(
        &mut self,
        now_ms: u64,
        grace_ms: u64,
        hold: &BTreeSet<ReplicaId>,
    ) -> Option<Applied> {
        let spared: BTreeSet<ReplicaId> = hold.iter().chain(self.unreachable.keys()).copied().collect();
        let quiet = |s: &SweepFloor| {
            s.version == self.version && s.spared == spared && s.grace_ms == grace_ms && now_ms < s.due_ms
        };
        // Reading every lease each gossip round was half of an idle simulated node's work
        // at 1,000 members.
        if self.sweep.as_deref().is_some_and(quiet) {
            return None;
        }
        let mut due_ms = u64::MAX;
        let mut ended = BTreeSet::new();
        for (n, f) in self.state.leases.iter().filter(|(n, _)| !spared.contains(n)) {
            let Some((_, l)) = f.winner(|l| l.issued) else {
                continue;
            };
            match l.deadline_ms().saturating_add(grace_ms) {
                end if end <= now_ms => _ = ended.insert(*n),
                end => due_ms = due_ms.min(end),
            }
        }
        let applied = self.remove_nodes(ended, Some(&spared), now_ms);
        self.sweep = applied.is_none().then(|| {
            Box::new(SweepFloor {
                version: self.version,
                spared,
                grace_ms,
                due_ms,
            })
        });
        applied
    }

    /// Removes the leases of `nodes` and every registration write they made, and with
    /// `orphans` also every write whose node holds no lease here although this replica has
    /// seen the lease it was written under: that lease was collected by a sweep that did
    /// not know of the write (made concurrently), or written dead. One whose lease has not
    /// arrived yet stays, and so do those of the nodes `orphans` spares.
    fn remove_nodes(
        &mut self,
        nodes: BTreeSet<ReplicaId>,
        orphans: Option<&BTreeSet<ReplicaId>>,
        now_ms: u64,
    ) -> Option<Applied> {
        let mut dots = Vec::new();
        let mut leases = BTreeSet::new();
        for n in &nodes {
            let ds = self.state.lease_dots(*n);
            if !ds.is_empty() {
                dots.extend(ds);
                leases.insert(*n);
            }
        }
        // Only writes of nodes that hold no lease here can be orphans: the count of each
        // node's writes names those nodes without reading every registration, and when
        // there are none (nearly always) and no node's lease ended, nothing is read.
        let orphan_writers: BTreeSet<ReplicaId> = match orphans {
            Some(spared) => (self.state.regs.writers())
                .filter(|w| !spared.contains(w) && self.state.lease(*w).is_none())
                .collect(),
            None => BTreeSet::new(),
        };
        if nodes.is_empty() && orphan_writers.is_empty() {
            return None;
        }
        let orphan = |d: &Dot, r: &Registration| {
            orphan_writers.contains(&d.actor) && self.state.ctx.contains(&r.lease_dot)
        };
        let goes = |d: &Dot, r: &Registration| nodes.contains(&d.actor) || orphan(d, r);
        let mut regs = BTreeSet::new();
        for (key, f) in &self.state.regs {
            for (d, _) in f.iter().filter(|(d, r)| goes(d, r)) {
                dots.push(d.clone());
                regs.insert(key.clone());
            }
        }
        (!dots.is_empty()).then(|| self.apply_removal(dots, regs, leases, now_ms))
    }
}
