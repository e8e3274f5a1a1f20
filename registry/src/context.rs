//! The causal context: every dot a replica has seen, as a version vector (all counters up
//! to N from each replica) plus a dot cloud (the dots seen out of order).
//!
//! A dot in the context but not in the store is a dot that was removed: this is how the
//! registry remembers deletions without keeping a tombstone per key. As gaps fill, dots move
//! from the cloud into the vector, so after convergence the cloud is empty and the context
//! is one counter per replica.

use std::collections::{BTreeMap, BTreeSet};

use crdts::VClock;
use serde::ser::{SerializeSeq, SerializeStruct};
use serde::{Deserialize, Serialize, Serializer};

use crate::error::InvalidState;
use crate::hlc::Hlc;
use crate::id::{dot, Dot, ReplicaId};

/// The largest counter a dot may carry. Far above what any node mints (2^62 writes), so a
/// counter plus anything a replica adds to it never overflows.
pub const MAX_COUNTER: u64 = 1 << 62;

/// A causal context: a version vector, a dot cloud, and the retired replicas. Also the
/// registry's digest.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(try_from = "ContextWire")]
pub struct CausalContext {
    vv: VClock<ReplicaId>,
    cloud: BTreeSet<Dot>,
    retired: BTreeMap<ReplicaId, Retirement>,
}

/// The encoded shape of a context: the cloud grouped by replica, so a delta about several
/// dots of one node names that node once.
#[derive(Deserialize)]
struct ContextWire {
    vv: VClock<ReplicaId>,
    cloud: Vec<(ReplicaId, Vec<u64>)>,
    retired: BTreeMap<ReplicaId, Retirement>,
}

impl Serialize for CausalContext {
    /// The shape of [`ContextWire`], written from the context itself: every delta sent
    /// or saved carries a context, and building the wire form copied it (twice: once to
    /// size the encoding, once to write it).
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("ContextWire", 3)?;
        st.serialize_field("vv", &self.vv)?;
        st.serialize_field("cloud", &CloudWire(&self.cloud))?;
        st.serialize_field("retired", &self.retired)?;
        st.end()
    }
}

/// A dot cloud as `[(replica, [counter, ...]), ...]`, grouped without copying.
struct CloudWire<'a>(&'a BTreeSet<Dot>);

/// The counters of one replica's dots in a cloud.
struct CountersWire<'a>(std::collections::btree_set::Range<'a, Dot>);

impl CloudWire<'_> {
    /// The dots of the replica after `after` (of the first, for `None`), if any.
    fn group_after(&self, after: Option<ReplicaId>) -> Option<(ReplicaId, CountersWire<'_>)> {
        let first = match after {
            None => self.0.first()?,
            Some(a) => self.0.range(dot(a, u64::MAX)..).find(|d| d.actor != a)?,
        };
        let a = first.actor;
        Some((a, CountersWire(self.0.range(dot(a, 0)..=dot(a, u64::MAX)))))
    }
}

impl Serialize for CloudWire<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut last = None;
        let count = self
            .0
            .iter()
            .filter(|d| last.replace(d.actor) != Some(d.actor))
            .count();
        let mut seq = s.serialize_seq(Some(count))?;
        let groups = std::iter::successors(self.group_after(None), |(a, _)| self.group_after(Some(*a)));
        for g in groups {
            seq.serialize_element(&g)?;
        }
        seq.end()
    }
}

impl Serialize for CountersWire<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.clone().count()))?;
        for d in self.0.clone() {
            seq.serialize_element(&d.counter)?;
        }
        seq.end()
    }
}

impl TryFrom<ContextWire> for CausalContext {
    type Error = &'static str;
    fn try_from(w: ContextWire) -> Result<Self, Self::Error> {
        let mut cloud = BTreeSet::new();
        let mut last_actor = None;
        for (a, counters) in w.cloud {
            if last_actor.is_some_and(|l| l >= a) || counters.is_empty() {
                return Err("dot cloud groups are not sorted, unique and non-empty");
            }
            last_actor = Some(a);
            if counters.windows(2).any(|p| p[0] >= p[1]) {
                return Err("dot cloud counters are not strictly increasing");
            }
            cloud.extend(counters.into_iter().map(|c| dot(a, c)));
        }
        Ok(Self {
            vv: w.vv,
            cloud,
            retired: w.retired,
        })
    }
}

/// A retired replica: all its dots up to `counter` count as seen and are never stored.
///
/// Retiring a replica that is gone for good replaces its version-vector entry with this
/// record, which every replica forgets once it is older than the longest a message may
/// travel ([`CausalContext::forget_retired`]); so the context stays bounded by live nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Retirement {
    /// Every dot of the replica up to this counter is retired.
    pub counter: u64,
    /// When it was retired.
    pub at: Hlc,
}

impl std::fmt::Debug for CausalContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CausalContext")
            .field("vv", &self.vv.dots)
            .field("cloud", &self.cloud)
            .field("retired", &self.retired)
            .finish()
    }
}

impl CausalContext {
    /// An empty context: nothing seen.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same context in full B-tree nodes, for one kept long (a peer's digest): one
    /// decoded or grown entry by entry fills its nodes about half, and holds about twice
    /// the bytes per node it names.
    pub fn compacted(&self) -> Self {
        Self {
            vv: VClock {
                dots: self.vv.dots.iter().map(|(a, c)| (*a, *c)).collect(),
            },
            cloud: self.cloud.iter().cloned().collect(),
            retired: self.retired.iter().map(|(a, r)| (*a, *r)).collect(),
        }
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

    /// Every counter of `replica` up to this one has been seen (by the vector, or retired).
    fn base(&self, replica: &ReplicaId) -> u64 {
        let retired = self.retired.get(replica).map_or(0, |r| r.counter);
        self.vv.get(replica).max(retired)
    }

    /// The counter up to which every dot of `replica` has been seen (by the vector, or
    /// retired).
    pub fn seen_through(&self, replica: ReplicaId) -> u64 {
        self.base(&replica)
    }

    /// Whether the context has seen `d`.
    pub fn contains(&self, d: &Dot) -> bool {
        d.counter <= self.base(&d.actor) || self.cloud.contains(d)
    }

    /// Whether the context has seen `d` other than through a retirement: in its vector or
    /// its cloud.
    pub(crate) fn contains_unretired(&self, d: &Dot) -> bool {
        d.counter <= self.vv.get(&d.actor) || self.cloud.contains(d)
    }

    /// The greatest counter seen from `replica` (0 if none).
    pub fn max_counter(&self, replica: ReplicaId) -> u64 {
        let in_cloud = self
            .cloud
            .range(dot(replica, 0)..=dot(replica, u64::MAX))
            .next_back()
            .map_or(0, |d| d.counter);
        self.base(&replica).max(in_cloud)
    }

    /// Every range `1..=n` of one replica's counters that this context has seen whole: the
    /// version vector's entries, then the retirements.
    pub fn ranges(&self) -> impl Iterator<Item = (ReplicaId, u64)> + '_ {
        self.vector()
            .chain(self.retired.iter().map(|(a, r)| (*a, r.counter)))
    }

    /// The retired replicas.
    pub fn retired(&self) -> impl Iterator<Item = (ReplicaId, Retirement)> + '_ {
        self.retired.iter().map(|(r, x)| (*r, *x))
    }

    /// A context that retires `replica` up to `counter` (the context of a retiring delta).
    pub fn retiring(replica: ReplicaId, counter: u64, at: Hlc) -> Self {
        let mut ctx = Self::new();
        if counter > 0 {
            ctx.retired.insert(replica, Retirement { counter, at });
        }
        ctx
    }

    /// A context that has seen every counter of `replica` up to `counter`.
    pub(crate) fn through(replica: ReplicaId, counter: u64) -> Self {
        let mut ctx = Self::new();
        if counter > 0 {
            ctx.vv.dots.insert(replica, counter);
        }
        ctx
    }

    /// The part of this context about `replicas` only: for a dot of one of them,
    /// [`CausalContext::contains`], [`CausalContext::seen_through`] and
    /// [`CausalContext::max_counter`] answer as on the whole context. Costs
    /// `O(|replicas| log n)`, where a clone costs `O(n)`.
    pub fn restricted_to(&self, replicas: &BTreeSet<ReplicaId>) -> Self {
        let mut out = Self::new();
        for a in replicas {
            if let Some(&n) = self.vv.dots.get(a) {
                out.vv.dots.insert(*a, n);
            }
            if let Some(r) = self.retired.get(a) {
                out.retired.insert(*a, *r);
            }
            out.cloud
                .extend(self.cloud.range(dot(*a, 0)..=dot(*a, u64::MAX)).cloned());
        }
        out
    }

    /// Forgets retirements made before `before`. A local clean-up, not a delta: every
    /// replica forgets a retirement at about the same age, since its time travels with it.
    /// Returns how many were forgotten.
    pub fn forget_retired(&mut self, before: Hlc) -> usize {
        let n = self.retired.len();
        self.retired.retain(|_, r| r.at >= before);
        n - self.retired.len()
    }

    /// Drops vector entries and cloud dots that a retirement covers.
    fn normalize_retired(&mut self) {
        for (a, r) in &self.retired {
            if self.vv.get(a) <= r.counter {
                self.vv.dots.remove(a);
            }
            let covered: Vec<Dot> = self
                .cloud
                .range(dot(*a, 0)..=dot(*a, r.counter))
                .cloned()
                .collect();
            for d in covered {
                self.cloud.remove(&d);
            }
        }
    }

    /// Adds one dot.
    pub fn insert(&mut self, d: Dot) {
        self.insert_no_compact(d.clone());
        self.compact_replica(d.actor);
    }

    fn insert_no_compact(&mut self, d: Dot) {
        if d.counter > self.base(&d.actor) {
            self.cloud.insert(d);
        }
    }

    /// Joins `other` into this context (set union).
    pub fn join(&mut self, other: &CausalContext) {
        if !other.retired.is_empty() {
            for (a, r) in &other.retired {
                let e = self.retired.entry(*a).or_insert(*r);
                *e = (*e).max(*r);
            }
            self.normalize_retired();
        }
        for (actor, &n) in &other.vv.dots {
            if n > self.base(actor) {
                self.vv.dots.insert(*actor, n);
            }
        }
        for d in &other.cloud {
            self.insert_no_compact(d.clone());
        }
        // Only the replicas `other` names can have gaps to close (a retirement raises the
        // base under the cloud too).
        let mut last = None;
        let named = other.vv.dots.keys().chain(other.retired.keys());
        for a in named.chain(other.cloud.iter().map(|d| &d.actor)) {
            if last != Some(a) {
                self.compact_replica(*a);
                last = Some(a);
            }
        }
    }

    /// Whether every dot of `other` is in this context, and every retirement too.
    pub fn includes(&self, other: &CausalContext) -> bool {
        let covers = |a: &ReplicaId, n: u64| {
            let base = self.base(a);
            n <= base || (base + 1..=n).all(|c| self.cloud.contains(&dot(*a, c)))
        };
        other.vv.dots.iter().all(|(a, &n)| covers(a, n))
            && other.cloud.iter().all(|d| self.contains(d))
            && other
                .retired
                .iter()
                .all(|(a, r)| self.retired.get(a).is_some_and(|x| x >= r))
    }

    /// Moves dots from the cloud into the vector where they close a gap.
    pub fn compact(&mut self) {
        let actors: BTreeSet<ReplicaId> = self.cloud.iter().map(|d| d.actor).collect();
        for a in actors {
            self.compact_replica(a);
        }
    }

    fn compact_replica(&mut self, a: ReplicaId) {
        let base = self.base(&a);
        let mut n = base;
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
        if n > base {
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
        self.vv.dots.is_empty() && self.cloud.is_empty() && self.retired.is_empty()
    }

    /// Checks the invariants a decoded context must hold: counters start at 1 and the cloud
    /// is compact.
    pub(crate) fn validate(&self) -> Result<(), InvalidState> {
        if let Some((a, _)) = self.vv.dots.iter().find(|(_, &n)| n == 0) {
            return Err(InvalidState::ZeroCounter(a.to_string()));
        }
        let counters = self.vv.dots.iter().map(|(a, n)| (*a, *n));
        let counters = counters
            .chain(self.cloud.iter().map(|d| (d.actor, d.counter)))
            .chain(self.retired.iter().map(|(a, r)| (*a, r.counter)));
        for (a, n) in counters {
            if n > MAX_COUNTER {
                return Err(InvalidState::CounterTooLarge(format!("{a}:{n}")));
            }
        }
        for d in &self.cloud {
            if d.counter == 0 {
                return Err(InvalidState::ZeroCounter(d.actor.to_string()));
            }
            if d.counter <= self.base(&d.actor) + 1 {
                return Err(InvalidState::CloudNotCompact(format!("{d}")));
            }
        }
        for (a, r) in &self.retired {
            if r.counter == 0 {
                return Err(InvalidState::ZeroCounter(a.to_string()));
            }
            if self.vv.dots.get(a).is_some_and(|&n| n <= r.counter) {
                return Err(InvalidState::CloudNotCompact(format!(
                    "{a} is both counted and retired"
                )));
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

    /// The wire shape as it was first written: the context converted to an owned copy.
    #[derive(Serialize)]
    struct CopiedWire {
        vv: VClock<ReplicaId>,
        cloud: Vec<(ReplicaId, Vec<u64>)>,
        retired: BTreeMap<ReplicaId, Retirement>,
    }

    fn copied(c: &CausalContext) -> CopiedWire {
        let mut cloud: Vec<(ReplicaId, Vec<u64>)> = Vec::new();
        for d in &c.cloud {
            match cloud.last_mut() {
                Some((a, counters)) if *a == d.actor => counters.push(d.counter),
                _ => cloud.push((d.actor, vec![d.counter])),
            }
        }
        CopiedWire {
            vv: c.vv.clone(),
            cloud,
            retired: c.retired.clone(),
        }
    }

    /// A context of these dots (of `actors` nodes), with node 7 retired at `retire`.
    fn context_of(dots: &[(u8, u8)], actors: u8, retire: Option<u8>) -> CausalContext {
        let mut c = CausalContext::from_dots(
            dots.iter()
                .map(|&(a, n)| dot(ReplicaId(u64::from(a % actors)), u64::from(n) + 1)),
        );
        if let Some(r) = retire {
            let r = Retirement {
                counter: u64::from(r),
                at: Hlc::new(1_000, 0),
            };
            c.retired.insert(ReplicaId(7), r);
        }
        c
    }

    quickcheck::quickcheck! {
        /// Written from borrowed parts, a context encodes to the same bytes as its copied
        /// wire form did, and reads back as itself.
        fn a_context_encodes_as_its_copied_wire_form(dots: Vec<(u8, u8)>, retire: Option<u8>) -> bool {
            let c = context_of(&dots, 5, retire);
            let ours = postcard::to_allocvec(&c).unwrap();
            let back: CausalContext = postcard::from_bytes(&ours).unwrap();
            ours == postcard::to_allocvec(&copied(&c)).unwrap() && back == c
        }

        /// A compacted context is the same context: equal, and so every dot it holds.
        fn a_compacted_context_is_the_same_context(dots: Vec<(u8, u8)>, retire: Option<u8>) -> bool {
            let c = context_of(&dots, 9, retire);
            let k = c.compacted();
            k == c
                && k.includes(&c)
                && c.includes(&k)
                && dots.iter().all(|&(a, n)| k.contains(&dot(ReplicaId(u64::from(a % 9)), u64::from(n) + 1)))
        }
    }

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
    fn a_restricted_context_answers_as_the_whole_for_its_replicas() {
        const C: ReplicaId = ReplicaId(3);
        let mut whole = CausalContext::from_dots([dot(A, 1), dot(A, 2), dot(A, 5), dot(B, 1), dot(C, 4)]);
        whole.join(&CausalContext::retiring(C, 2, Hlc::new(1, 0)));
        let part = whole.restricted_to(&[A, C].into());
        for r in [A, C] {
            assert_eq!(part.seen_through(r), whole.seen_through(r));
            assert_eq!(part.max_counter(r), whole.max_counter(r));
            for c in 0..8 {
                assert_eq!(part.contains(&dot(r, c)), whole.contains(&dot(r, c)), "{r} {c}");
            }
        }
        assert!(!part.contains(&dot(B, 1)));
    }

    #[test]
    fn validate_refuses_a_non_compact_cloud() {
        let mut c = CausalContext::from_dots([dot(A, 1)]);
        c.cloud.insert(dot(A, 2));
        assert!(c.validate().is_err());
    }
}
