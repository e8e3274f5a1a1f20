//! A state as a given peer needs it: with the values the peer already holds left out
//! ([`State::elide_for`], for a full state) or trimmed away ([`State::trimmed_for`], for a
//! delta).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{LeaseMap, RegKey, State};
use crate::context::CausalContext;
use crate::dotfun::DotFun;
use crate::error::{ElidedError, MissingValue};
use crate::id::{Dot, ReplicaId};
use crate::regstore::RegMap;
use crate::value::{Lease, Registration};

impl State {
    /// This delta without what a peer whose context is `peer` has already seen: values
    /// whose dots it holds are left out, and so are their dots in the context (so the
    /// join leaves its copies alone); every dot without a value (a removal, or a removed
    /// write) stays, with the delta's key hints, so removals still reach it (a delta with
    /// no such dot keeps none: it removes nothing, so it needs no hint). Joining the
    /// result into any state whose context includes `peer` gives what joining the whole
    /// delta would.
    /// A state carrying retirements is returned whole (they are not dots to trim).
    pub fn trimmed_for(&self, peer: &CausalContext) -> State {
        if self.ctx.retired().next().is_some() {
            return self.clone();
        }
        let mut out = State::new_delta();
        let mut stored = BTreeSet::new();
        // Keys whose values were left out: a removal among the kept dots may be about them
        // (a write the peer lacks, overwritten by one it has), so they stay named.
        let mut dropped_regs = BTreeSet::new();
        let mut dropped_leases = BTreeSet::new();
        for (k, f) in &self.regs {
            for (d, v) in f.iter() {
                stored.insert(d.clone());
                if peer.contains(d) {
                    dropped_regs.insert(k.clone());
                } else {
                    out.insert_reg(k.clone(), d.clone(), v.clone());
                }
            }
        }
        for (p, f) in &self.leases {
            for (d, v) in f.iter() {
                stored.insert(d.clone());
                if peer.contains(d) {
                    dropped_leases.insert(*p);
                } else {
                    out.insert_lease(*p, d.clone(), *v);
                }
            }
        }
        let vector = self
            .ctx
            .vector()
            .flat_map(|(r, base)| (1..=base).map(move |c| crate::id::dot(r, c)));
        let kept: Vec<Dot> = vector
            .chain(self.ctx.cloud().cloned())
            .filter(|d| !stored.contains(d) || !peer.contains(d))
            .collect();
        // The hints are for removals: a receiver drops its copy of a key's dot when the
        // context has the dot and the store does not. If every kept dot is in the output's
        // store (a dot names one write of one key), nothing can be removed: no hint needed.
        let removes = kept.iter().any(|d| !stored.contains(d));
        let mut out = out.with_context(CausalContext::from_dots(kept));
        if !removes {
            return out;
        }
        match (&mut out.touched, &self.touched) {
            (Some(mine), Some(theirs)) => {
                mine.regs.extend(theirs.regs.iter().cloned());
                mine.leases.extend(theirs.leases.iter().cloned());
                mine.regs.extend(dropped_regs);
                mine.leases.extend(dropped_leases);
            }
            // A full-like delta visits every key; so must its trimmed form.
            (_, None) => out.touched = None,
            (None, Some(_)) => {}
        }
        out
    }

    /// The state as a peer with context `peer` needs it: this whole context and every dot
    /// id, with values only for the dots the peer has not seen.
    ///
    /// Joining the result at that peer ([`Elided::into_state`]) equals joining this whole
    /// state, at the cost of ids instead of values for what the peer already holds.
    pub fn elide_for(&self, peer: &CausalContext) -> Elided {
        let regs = self
            .regs
            .iter()
            .map(|(k, f)| {
                let pairs = f
                    .iter()
                    .map(|(d, v)| (d.clone(), (!peer.contains(d)).then(|| v.clone())))
                    .collect();
                (k.clone(), pairs)
            })
            .collect();
        let leases = self
            .leases
            .iter()
            .map(|(p, f)| {
                let pairs = f
                    .iter()
                    .map(|(d, v)| (d.clone(), (!peer.contains(d)).then_some(*v)))
                    .collect();
                (*p, pairs)
            })
            .collect();
        Elided {
            regs,
            leases,
            ctx: self.ctx.clone(),
        }
    }
}

/// A full state with the values a peer already holds left out (see [`State::elide_for`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Elided {
    pub(crate) regs: BTreeMap<RegKey, Vec<(Dot, Option<Registration>)>>,
    pub(crate) leases: BTreeMap<ReplicaId, Vec<(Dot, Option<Lease>)>>,
    pub(crate) ctx: CausalContext,
}

impl Elided {
    /// Rebuilds the full state the sender elided, taking the left-out values from `local`
    /// (the receiver's own state).
    ///
    /// A left-out dot that `local` has seen but no longer stores was removed here; it is
    /// dropped, as a full join would drop it.
    ///
    /// # Errors
    /// [`ElidedError::Missing`] when a left-out dot was never seen by `local`: the sender worked from
    /// a digest we no longer match. Nothing is changed; ask for a full state.
    pub fn into_state(self, local: &State) -> Result<State, ElidedError> {
        let mut regs = RegMap::default();
        for (key, pairs) in self.regs {
            let mut f: Vec<(Dot, Registration)> = Vec::with_capacity(pairs.len());
            for (d, v) in pairs {
                let v = match v {
                    Some(v) => v,
                    None => match local.reg(&key).and_then(|lf| lf.get(&d)) {
                        Some(v) => v.clone(),
                        None if local.ctx.contains(&d) => continue,
                        None => return Err(MissingValue { dot: format!("{d}") }.into()),
                    },
                };
                f.push((d, v));
            }
            if !f.is_empty() {
                regs.insert_mut(key, DotFun::from_vec(f));
            }
        }
        let mut leases = LeaseMap::default();
        for (p, pairs) in self.leases {
            let mut f: Vec<(Dot, Lease)> = Vec::with_capacity(pairs.len());
            for (d, v) in pairs {
                let v = match v {
                    Some(v) => v,
                    None => match local.lease(p).and_then(|lf| lf.get(&d)) {
                        Some(v) => *v,
                        None if local.ctx.contains(&d) => continue,
                        None => return Err(MissingValue { dot: format!("{d}") }.into()),
                    },
                };
                f.push((d, v));
            }
            if !f.is_empty() {
                leases.insert_mut(p, DotFun::from_vec(f));
            }
        }
        Ok(State::from_parts(regs, leases, self.ctx, None)?)
    }

    /// How many entries (registrations plus leases) it names.
    pub fn entry_count(&self) -> usize {
        self.regs.len() + self.leases.len()
    }

    /// How many values were left out.
    pub fn elided_count(&self) -> usize {
        let r = self.regs.values().flatten().filter(|(_, v)| v.is_none()).count();
        let l = self
            .leases
            .values()
            .flatten()
            .filter(|(_, v)| v.is_none())
            .count();
        r + l
    }
}
