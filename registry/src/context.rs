//! The causal context: every dot a replica has seen, as a version vector (all counters up
//! to N from each replica) plus a dot cloud (the dots seen out of order).
//!
//! A dot in the context but not in the store is a dot that was removed: this is how the
//! registry remembers deletions without keeping a tombstone per key. As gaps fill, dots move
//! from the cloud into the vector, so after convergence the cloud is empty and the context
//! is one counter per replica.

use std::collections::BTreeSet;

use crdts::VClock;
use serde::{Deserialize, Serialize};

use crate::error::InvalidState;
use crate::id::{dot, Dot, ReplicaId};

/// A causal context: a version vector and a dot cloud. Also the registry's digest.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CausalContext {
    vv: VClock<ReplicaId>,
    cloud: BTreeSet<Dot>,
}

impl std::fmt::Debug for CausalContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CausalContext")
            .field("vv", &self.vv.dots)
            .field("cloud", &self.cloud)
            .finish()
    }
}

impl CausalContext {
    /// An empty context: nothing seen.
    pub fn new() -> Self {
        Self::default()
    }

    /// A context holding exactly these dots (the context of a delta).
    pub fn from_dots(dots: impl IntoIterator<Item = Dot>) -> Self {
        let mut ctx = Self::new();
        for d in dots {
            ctx.insert_no_compact(d);
        }
        ctx.compact();
        ctx
    }

    /// Whether the context has seen `d`.
    pub fn contains(&self, d: &Dot) -> bool {
        d.counter <= self.vv.get(&d.actor) || self.cloud.contains(d)
    }

    /// The greatest counter seen from `replica` (0 if none).
    pub fn max_counter(&self, replica: ReplicaId) -> u64 {
        let in_cloud = self
            .cloud
            .range(dot(replica, 0)..=dot(replica, u64::MAX))
            .next_back()
            .map_or(0, |d| d.counter);
        self.vv.get(&replica).max(in_cloud)
    }

    /// Adds one dot.
    pub fn insert(&mut self, d: Dot) {
        self.insert_no_compact(d.clone());
        self.compact_replica(d.actor);
    }

    fn insert_no_compact(&mut self, d: Dot) {
        if d.counter > self.vv.get(&d.actor) {
            self.cloud.insert(d);
        }
    }

    /// Joins `other` into this context (set union).
    pub fn join(&mut self, other: &CausalContext) {
        for (actor, &n) in &other.vv.dots {
            if n > self.vv.get(actor) {
                self.vv.dots.insert(*actor, n);
            }
        }
        for d in &other.cloud {
            self.insert_no_compact(d.clone());
        }
        self.compact();
    }

    /// Whether every dot of `other` is in this context.
    pub fn includes(&self, other: &CausalContext) -> bool {
        other.vv.dots.iter().all(|(a, &n)| {
            n <= self.vv.get(a) || (self.vv.get(a) + 1..=n).all(|c| self.cloud.contains(&dot(*a, c)))
        }) && other.cloud.iter().all(|d| self.contains(d))
    }

    /// Moves dots from the cloud into the vector where they close a gap.
    pub fn compact(&mut self) {
        let actors: BTreeSet<ReplicaId> = self.cloud.iter().map(|d| d.actor).collect();
        for a in actors {
            self.compact_replica(a);
        }
    }

    fn compact_replica(&mut self, a: ReplicaId) {
        let mut n = self.vv.get(&a);
        let start = n;
        loop {
            let first = self.cloud.range(dot(a, 0)..=dot(a, u64::MAX)).next().cloned();
            match first {
                Some(d) if d.counter <= n + 1 => {
                    n = n.max(d.counter);
                    self.cloud.remove(&d);
                }
                _ => break,
            }
        }
        if n > start {
            self.vv.dots.insert(a, n);
        }
    }

    /// The version vector: for each replica, every counter up to this one has been seen.
    pub fn vector(&self) -> impl Iterator<Item = (ReplicaId, u64)> + '_ {
        self.vv.dots.iter().map(|(a, n)| (*a, *n))
    }

    /// The dots seen out of order.
    pub fn cloud(&self) -> impl Iterator<Item = &Dot> + '_ {
        self.cloud.iter()
    }

    /// How many replicas the vector names.
    pub fn vector_len(&self) -> usize {
        self.vv.dots.len()
    }

    /// How many dots the cloud holds.
    pub fn cloud_len(&self) -> usize {
        self.cloud.len()
    }

    /// Whether nothing has been seen.
    pub fn is_empty(&self) -> bool {
        self.vv.dots.is_empty() && self.cloud.is_empty()
    }

    /// Checks the invariants a decoded context must hold: counters start at 1 and the cloud
    /// is compact.
    pub(crate) fn validate(&self) -> Result<(), InvalidState> {
        if let Some((a, _)) = self.vv.dots.iter().find(|(_, &n)| n == 0) {
            return Err(InvalidState::ZeroCounter(a.to_string()));
        }
        for d in &self.cloud {
            if d.counter == 0 {
                return Err(InvalidState::ZeroCounter(d.actor.to_string()));
            }
            if d.counter <= self.vv.get(&d.actor) + 1 {
                return Err(InvalidState::CloudNotCompact(format!("{d}")));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: ReplicaId = ReplicaId(1);
    const B: ReplicaId = ReplicaId(2);

    #[test]
    fn out_of_order_dots_wait_in_the_cloud_until_the_gap_fills() {
        let mut c = CausalContext::new();
        c.insert(dot(A, 2));
        c.insert(dot(A, 3));
        assert_eq!(c.cloud_len(), 2);
        assert!(c.contains(&dot(A, 3)) && !c.contains(&dot(A, 1)));
        c.insert(dot(A, 1));
        assert_eq!(c.cloud_len(), 0);
        assert_eq!(c.vector().collect::<Vec<_>>(), vec![(A, 3)]);
        assert_eq!(c.max_counter(A), 3);
    }

    #[test]
    fn join_is_union_and_compacts() {
        let x = CausalContext::from_dots([dot(A, 1), dot(A, 3), dot(B, 2)]);
        let y = CausalContext::from_dots([dot(A, 2), dot(B, 1)]);
        let mut z = x.clone();
        z.join(&y);
        assert_eq!(z.cloud_len(), 0);
        assert_eq!(z.vector().collect::<Vec<_>>(), vec![(A, 3), (B, 2)]);
        assert!(z.includes(&x) && z.includes(&y) && !x.includes(&y));
        let mut w = y.clone();
        w.join(&x);
        assert_eq!(z, w);
    }

    #[test]
    fn validate_refuses_a_non_compact_cloud() {
        let mut c = CausalContext::from_dots([dot(A, 1)]);
        c.cloud.insert(dot(A, 2));
        assert!(c.validate().is_err());
    }
}
