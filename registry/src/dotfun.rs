//! A dot function: the few `(dot, value)` pairs of one register, sorted by dot.
//!
//! A register normally holds one dot (its last write) and briefly more while concurrent
//! writes meet, so its one pair is held inline, in the map's entry, and only more spill to
//! the heap: a `Vec` cost an allocation of its own per registration and per lease (120
//! bytes and the allocator's overhead for a registration, beside its 24-byte header), and
//! a `BTreeMap` a node of eleven slots.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use smallvec::SmallVec;

use crate::context::CausalContext;
use crate::id::Dot;

/// The `(dot, value)` pairs of one register, sorted by dot, never empty in a valid state.
/// Encoded as a sequence of pairs, as the `Vec` it was.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct DotFun<V>(SmallVec<[(Dot, V); 1]>);

impl<V> DotFun<V> {
    pub(crate) fn single(d: Dot, v: V) -> Self {
        Self(smallvec::smallvec![(d, v)])
    }

    /// Wraps pairs already sorted by dot (checked by `is_sorted_unique` where it matters).
    pub(crate) fn from_vec(pairs: Vec<(Dot, V)>) -> Self {
        let mut pairs = SmallVec::from_vec(pairs);
        pairs.shrink_to_fit();
        Self(pairs)
    }

    pub(crate) fn get(&self, d: &Dot) -> Option<&V> {
        self.0
            .binary_search_by(|(x, _)| x.cmp(d))
            .ok()
            .map(|i| &self.0[i].1)
    }

    pub(crate) fn contains(&self, d: &Dot) -> bool {
        self.get(d).is_some()
    }

    /// Inserts a pair; returns false (and changes nothing) if the dot was there.
    pub(crate) fn insert(&mut self, d: Dot, v: V) -> bool {
        match self.0.binary_search_by(|(x, _)| x.cmp(&d)) {
            Ok(_) => false,
            Err(i) => {
                self.0.reserve_exact(1);
                self.0.insert(i, (d, v));
                true
            }
        }
    }

    /// Keeps the dots that `their_ctx` has not seen or that `theirs` stores too: the join
    /// rule for our side. Returns whether any dot went.
    pub(crate) fn retain_unseen_or_stored(
        &mut self,
        their_ctx: &CausalContext,
        theirs: Option<&DotFun<V>>,
    ) -> bool {
        let before = self.0.len();
        self.0
            .retain(|(d, _)| !their_ctx.contains(d) || theirs.is_some_and(|t| t.contains(d)));
        self.0.len() != before
    }

    /// This function without the dots `their_ctx` has seen, or `None` if it has seen none
    /// (the join rule for our side of a key the other side does not store).
    pub(crate) fn without_seen(&self, their_ctx: &CausalContext) -> Option<Self>
    where
        V: Clone,
    {
        if !self.dots().any(|d| their_ctx.contains(d)) {
            return None;
        }
        let kept = self.0.iter().filter(|(d, _)| !their_ctx.contains(d)).cloned();
        Some(Self::from_vec(kept.collect()))
    }

    /// Gives back spare capacity (after a join, which may have removed dots).
    pub(crate) fn shrink(&mut self) {
        self.0.shrink_to_fit();
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&Dot, &V)> {
        self.0.iter().map(|(d, v)| (d, v))
    }

    pub(crate) fn dots(&self) -> impl Iterator<Item = &Dot> {
        self.0.iter().map(|(d, _)| d)
    }

    pub(crate) fn into_iter(self) -> impl Iterator<Item = (Dot, V)> {
        self.0.into_iter()
    }

    /// Whether the dots are strictly increasing (the invariant a decoded value must hold).
    pub(crate) fn is_sorted_unique(&self) -> bool {
        self.0.windows(2).all(|w| w[0].0 < w[1].0)
    }

    /// The pair with the greatest `(key(value), dot)`: a total order, so every replica
    /// picks the same winner.
    pub(crate) fn winner<K: Ord>(&self, key: impl Fn(&V) -> K) -> Option<(&Dot, &V)> {
        self.iter().max_by(|a, b| (key(a.1), a.0).cmp(&(key(b.1), b.0)))
    }
}

impl<V: fmt::Debug> fmt::Debug for DotFun<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.0.iter().map(|(d, v)| (d, v))).finish()
    }
}

impl<V: Serialize> Serialize for DotFun<V> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter())
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for DotFun<V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_seq(PairsVisitor(PhantomData))
    }
}

/// Reads the pairs one by one, reserving nothing: the length a peer's bytes claim is not
/// room to set aside (a `Vec` caps what it reserves; `SmallVec`'s own reader does not).
struct PairsVisitor<V>(PhantomData<V>);

impl<'de, V: Deserialize<'de>> Visitor<'de> for PairsVisitor<V> {
    type Value = DotFun<V>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a sequence of (dot, value) pairs")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut pairs = SmallVec::new();
        while let Some(pair) = seq.next_element()? {
            pairs.push(pair);
        }
        pairs.shrink_to_fit();
        Ok(DotFun(pairs))
    }
}
