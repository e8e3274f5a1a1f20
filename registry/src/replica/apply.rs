//! Joins into a replica: a delta or a full state from a peer, or the replica's own delta,
//! and what a read shows differently after it (the [`Change`]s at `now_ms`).

use std::collections::{BTreeMap, BTreeSet};

use super::{Applied, Change, Replica};
use crate::error::ElidedError;
use crate::id::RegKey;
use crate::id::{Dot, ReplicaId};
use crate::state::{Elided, JoinReport, Keys, State};

impl Replica {
    pub(super) fn apply_own(&mut self, delta: State, now_ms: u64) -> Applied {
        let changes = self.join_and_diff(delta.clone(), now_ms).1;
        Applied { delta, changes }
    }

    /// Joins a delta or a full state received from a peer.
    ///
    /// Returns what the join did (`report.changed()` is false when the state already
    /// included it: nothing to forward) and what became visible or invisible at `now_ms`.
    pub fn apply(&mut self, delta: State, now_ms: u64) -> (JoinReport, Vec<Change>) {
        self.join_and_diff(delta, now_ms)
    }

    /// Joins an elided state from a peer (see [`State::elide_for`]).
    ///
    /// # Errors
    /// [`ElidedError`] when it leaves out a value this replica never had, or is invalid;
    /// nothing is changed.
    pub fn apply_elided(
        &mut self,
        elided: Elided,
        now_ms: u64,
    ) -> Result<(JoinReport, Vec<Change>), ElidedError> {
        let full = elided.into_state(&self.state)?;
        Ok(self.join_and_diff(full, now_ms))
    }

    /// Joins a delta or a full state (an elided one, rebuilt) and returns, besides the report
    /// and the changes, the **effective delta**: a small state holding exactly what the join
    /// taught this replica (the writes it added, the dots it removed, the dots it newly saw),
    /// which a node forwards to its peers instead of everything it received.
    ///
    /// The delta is `None` when the join taught more than `max_new_dots` new dots, or brought
    /// retirements: the caller then falls back to full syncs with its peers.
    pub fn apply_collecting(
        &mut self,
        full: State,
        now_ms: u64,
        max_new_dots: usize,
    ) -> (JoinReport, Vec<Change>, Option<State>) {
        if !self.state.learns_from(&full) {
            return (JoinReport::default(), Vec::new(), Some(State::new_delta()));
        }
        let incoming = State::keys_touched_by(&full);
        let before = match &incoming {
            Some(keys) => self.note_visible(keys, now_ms),
            None => self.note_visible(&self.state.keys_a_join_may_touch(&full), now_ms),
        };
        let (report, effective) = self.state.join_collecting(full, incoming, max_new_dots);
        let changes = self.after_join(before, &report, now_ms);
        (report, changes, effective)
    }

    /// Joins `delta` and returns what the join did and what a read at `now_ms` shows
    /// differently.
    fn join_and_diff(&mut self, delta: State, now_ms: u64) -> (JoinReport, Vec<Change>) {
        if !self.state.learns_from(&delta) {
            return (JoinReport::default(), Vec::new());
        }
        let before = self.note_visible(&self.state.keys_a_join_may_touch(&delta), now_ms);
        let report = self.state.join(delta);
        let changes = self.after_join(before, &report, now_ms);
        (report, changes)
    }

    /// What a read shows, before a join that may touch `keys` (see
    /// [`State::keys_a_join_may_touch`]), of what the join may change.
    fn note_visible(&self, (regs, leases): &Keys, now_ms: u64) -> VisibleBefore {
        // What a read shows of a registration is its winning write among those whose node's
        // lease is live. The join can change the writes only of the registrations it
        // touches, and the liveness only of the leases it touches: note both before,
        // compare after.
        let live: Vec<(ReplicaId, bool)> = leases.iter().map(|&n| (n, self.lease_live(n, now_ms))).collect();
        let visible: BTreeMap<RegKey, Option<Dot>> = regs
            .iter()
            .map(|k| (k.clone(), self.visible(k, now_ms).map(|i| i.dot.clone())))
            .collect();
        VisibleBefore { live, visible }
    }

    /// After a join that gave `report`: notes the keys it changed (when tracked) and
    /// returns what a read at `now_ms` shows differently from `before`.
    fn after_join(&mut self, before: VisibleBefore, report: &JoinReport, now_ms: u64) -> Vec<Change> {
        if report.changed() {
            self.version += 1;
        }
        if let Some(changed) = &mut self.changed {
            changed.record(report);
        }
        self.note_lease_ends(&report.leases);
        let VisibleBefore { live, visible } = before;
        let mut changes = Vec::new();
        for (k, was) in &visible {
            match (was, self.visible(k, now_ms)) {
                (Some(a), Some(b)) if a == b.dot => {}
                (None, None) => {}
                (_, Some(b)) => changes.push(Change::Up(b.to_owned())),
                (Some(_), None) => changes.push(Change::Down {
                    service: k.service.clone(),
                    provider: k.provider.clone(),
                }),
            }
        }
        // Nodes whose lease came alive or died: the other registrations they wrote (whose
        // writes the join did not touch) appear or disappear with it.
        let flipped: BTreeSet<ReplicaId> = live
            .into_iter()
            .filter(|(n, was)| self.lease_live(*n, now_ms) != *was)
            .map(|(n, _)| n)
            .collect();
        if !flipped.is_empty() {
            changes.extend(self.changes_with_flipped_leases(&flipped, &visible, now_ms));
        }
        changes
    }

    /// What a read at `now_ms` shows of the registrations written by the `flipped` nodes
    /// (whose lease came alive or died) that a join did not touch (`looked_at` holds those
    /// it did).
    fn changes_with_flipped_leases(
        &self,
        flipped: &BTreeSet<ReplicaId>,
        looked_at: &BTreeMap<RegKey, Option<Dot>>,
        now_ms: u64,
    ) -> Vec<Change> {
        // Nearly always the join already looked at every registration such a node wrote
        // (they came in the same delta, or went with the lease); the counts say when it did
        // not, and only then is the store scanned.
        // By each registration's writers, not by each flipped node: a batch of members
        // coming up at a cluster's start is hundreds of both.
        let mut counts: BTreeMap<ReplicaId, u32> = BTreeMap::new();
        for f in looked_at.keys().filter_map(|k| self.state.reg(k)) {
            let mut writers: Vec<ReplicaId> = f
                .dots()
                .map(|d| d.actor)
                .filter(|n| flipped.contains(n))
                .collect();
            writers.sort_unstable();
            writers.dedup();
            for n in writers {
                *counts.entry(n).or_default() += 1;
            }
        }
        let unseen = flipped
            .iter()
            .any(|n| counts.get(n).copied().unwrap_or(0) < self.state.registrations_by(*n));
        if !unseen {
            return Vec::new();
        }
        self.state
            .regs_with_writes_of(flipped)
            .filter(|(k, _)| !looked_at.contains_key(*k))
            .map(|(k, f)| match self.live_instance(k, f, now_ms) {
                Some(i) => Change::Up(i.to_owned()),
                None => Change::Down {
                    service: k.service.clone(),
                    provider: k.provider.clone(),
                },
            })
            .collect()
    }
}

/// What a read showed, before a join, of what the join may change.
struct VisibleBefore {
    /// Whether each node whose lease the join may touch held a live lease.
    live: Vec<(ReplicaId, bool)>,
    /// The dot of the visible write of each registration the join may touch.
    visible: BTreeMap<RegKey, Option<Dot>>,
}
