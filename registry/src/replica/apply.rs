//! Joins into a replica: a delta or a full state from a peer, or the replica's own delta,
//! and what a read shows differently after it (the [`Change`]s at `now_ms`).

use std::collections::{BTreeMap, BTreeSet};

use super::{Applied, Change, Replica};
use crate::context::CausalContext;
use crate::error::ElidedError;
use crate::id::{Dot, ReplicaId};
use crate::state::{Elided, JoinReport, RegKey, State};

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
        let brings_retirements = full
            .ctx
            .retired()
            .any(|(r, x)| self.state.ctx.retired().all(|(b, y)| b != r || y < x));
        // Only replicas the other side's context names can teach us dots: note what we had
        // seen of those (not the whole context, which names every node that ever wrote).
        let replicas: BTreeSet<ReplicaId> = full
            .ctx
            .ranges()
            .map(|(r, _)| r)
            .chain(full.ctx.cloud().map(|d| d.actor))
            .collect();
        let before_ctx = self.state.ctx.restricted_to(&replicas);
        // Only the keys the join may touch can change: note their dots before.
        let incoming = State::keys_touched_by(&full);
        let (reg_keys, lease_keys): (Vec<RegKey>, Vec<ReplicaId>) = match &incoming {
            Some((r, l)) => (r.iter().cloned().collect(), l.iter().copied().collect()),
            None => (
                self.state.regs.keys().cloned().collect(),
                self.state.leases.keys().copied().collect(),
            ),
        };
        let reg_dots: BTreeMap<RegKey, Vec<Dot>> = reg_keys
            .into_iter()
            .map(|k| {
                let dots = self.state.reg_dots(&k);
                (k, dots)
            })
            .collect();
        let lease_dots: BTreeMap<ReplicaId, Vec<Dot>> = lease_keys
            .into_iter()
            .map(|n| (n, self.state.lease_dots(n)))
            .collect();
        let (report, changes) = self.join_and_diff(full, now_ms);
        if !report.changed() {
            return (report, changes, Some(State::new_delta()));
        }
        if brings_retirements {
            return (report, changes, None);
        }
        let mut delta = State::new_delta();
        let mut dots: Vec<Dot> = Vec::new();
        let mut hint = (BTreeSet::new(), BTreeSet::new());
        for k in &report.regs {
            let before = reg_dots.get(k).map(Vec::as_slice).unwrap_or_default();
            dots.extend(
                before
                    .iter()
                    .filter(|d| !self.state.reg(k).is_some_and(|f| f.contains(d)))
                    .cloned(),
            );
            if let Some(f) = self.state.reg(k) {
                for (d, v) in f.iter().filter(|(d, _)| !before.contains(d)) {
                    delta.insert_reg(k.clone(), d.clone(), v.clone());
                    dots.push(d.clone());
                }
            }
            hint.0.insert(k.clone());
        }
        for &n in &report.leases {
            let before = lease_dots.get(&n).map(Vec::as_slice).unwrap_or_default();
            dots.extend(
                before
                    .iter()
                    .filter(|d| !self.state.lease(n).is_some_and(|f| f.contains(d)))
                    .cloned(),
            );
            if let Some(f) = self.state.lease(n) {
                for (d, v) in f.iter().filter(|(d, _)| !before.contains(d)) {
                    delta.insert_lease(n, d.clone(), *v);
                    dots.push(d.clone());
                }
            }
            hint.1.insert(n);
        }
        // The dots newly seen without a value (removals we never saw the writes of): for
        // each replica, between what we had seen whole and the newest dot now seen.
        let keyed: BTreeSet<Dot> = dots.iter().cloned().collect();
        let mut unknown_keys = false;
        let after = &self.state.ctx;
        // Only replicas the other side's context names can have taught us dots.
        for r in replicas {
            let (lo, hi) = (before_ctx.seen_through(r), after.max_counter(r));
            if hi.saturating_sub(lo) > max_new_dots as u64 {
                return (report, changes, None);
            }
            let new = (lo + 1..=hi)
                .map(|c| crate::id::dot(r, c))
                .filter(|d| after.contains(d) && !before_ctx.contains(d));
            for d in new {
                unknown_keys |= !keyed.contains(&d);
                dots.push(d);
            }
        }
        dots.sort();
        dots.dedup();
        if dots.len() > max_new_dots {
            return (report, changes, None);
        }
        let mut delta = delta.with_context(CausalContext::from_dots(dots));
        // A dot seen without its write has no key we know. If what we joined was a delta,
        // the keys it named (its store's and its hint's) hold every dot its context reaches,
        // ours among them: name those too (our join visited no others). After a full state,
        // the delta cannot name every key it reaches into: it then joins like a full state
        // (every key visited, at every peer it reaches).
        delta.touched = match (unknown_keys, incoming) {
            (false, _) => Some(crate::state::Touched {
                regs: hint.0,
                leases: hint.1,
            }),
            (true, Some((regs, leases))) => Some(crate::state::Touched {
                regs: hint.0.into_iter().chain(regs).collect(),
                leases: hint.1.into_iter().chain(leases).collect(),
            }),
            (true, None) => None,
        };
        (report, changes, Some(delta))
    }

    fn join_and_diff(&mut self, delta: State, now_ms: u64) -> (JoinReport, Vec<Change>) {
        // What a read shows of a registration is its winning write among those whose node's
        // lease is live. The join can change the writes only of the registrations it
        // touches, and the liveness only of the leases it touches: note both before,
        // compare after.
        let (regs, leases) = State::keys_touched_by(&delta).unwrap_or_else(|| {
            let regs = self.state.regs.keys().chain(delta.regs.keys()).cloned().collect();
            let leases = self
                .state
                .leases
                .keys()
                .chain(delta.leases.keys())
                .copied()
                .collect();
            (regs, leases)
        });
        let live_before: Vec<(ReplicaId, bool)> = leases
            .into_iter()
            .map(|n| (n, self.lease_live(n, now_ms)))
            .collect();
        let visible_before: BTreeMap<RegKey, Option<Dot>> = regs
            .into_iter()
            .map(|k| {
                let v = self.visible(&k, now_ms).map(|i| i.dot.clone());
                (k, v)
            })
            .collect();
        let report = self.state.join(delta);
        if let Some(changed) = &mut self.changed {
            changed.record(&report);
        }
        let mut changes = Vec::new();
        for (k, was) in &visible_before {
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
        let flipped: BTreeSet<ReplicaId> = live_before
            .into_iter()
            .filter(|(n, was)| self.lease_live(*n, now_ms) != *was)
            .map(|(n, _)| n)
            .collect();
        if flipped.is_empty() {
            return (report, changes);
        }
        // Nearly always the join already looked at every registration such a node wrote
        // (they came in the same delta, or went with the lease); the counts say when it did
        // not, and only then is the store scanned.
        let mut looked_at: BTreeMap<ReplicaId, u32> = BTreeMap::new();
        for f in visible_before.keys().filter_map(|k| self.state.reg(k)) {
            for n in flipped.iter().filter(|n| f.dots().any(|d| d.actor == **n)) {
                *looked_at.entry(*n).or_default() += 1;
            }
        }
        let unseen = flipped
            .iter()
            .any(|n| looked_at.get(n).copied().unwrap_or(0) < self.state.registrations_by(*n));
        if unseen {
            for (k, f) in &self.state.regs {
                if visible_before.contains_key(k) || !f.dots().any(|d| flipped.contains(&d.actor)) {
                    continue;
                }
                changes.push(match self.live_instance(k, f, now_ms) {
                    Some(i) => Change::Up(i.to_owned()),
                    None => Change::Down {
                        service: k.service.clone(),
                        provider: k.provider.clone(),
                    },
                });
            }
        }
        (report, changes)
    }
}
