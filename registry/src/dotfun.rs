//! A dot function: the few `(dot, value)` pairs of one register, sorted by dot.
//!
//! A register normally holds one dot (its last write) and briefly more while concurrent
//! writes meet, so a sorted `Vec` of exact capacity beats a `BTreeMap`, whose smallest node
//! holds eleven slots.

use serde::{Deserialize, Serialize};

use crate::id::Dot;

/// The `(dot, value)` pairs of one register, sorted by dot, never empty in a valid state.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct DotFun<V>(Vec<(Dot, V)>);

impl<V> DotFun<V> {
    pub(crate) fn single(d: Dot, v: V) -> Self {
        Self(vec![(d, v)])
    }

    /// Wraps pairs already sorted by dot (checked by `is_sorted_unique` where it matters).
    pub(crate) fn from_vec(mut pairs: Vec<(Dot, V)>) -> Self {
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

    pub(crate) fn remove(&mut self, d: &Dot) -> Option<V> {
        let i = self.0.binary_search_by(|(x, _)| x.cmp(d)).ok()?;
        let (_, v) = self.0.remove(i);
        self.0.shrink_to_fit();
        Some(v)
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

impl<V: std::fmt::Debug> std::fmt::Debug for DotFun<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.0.iter().map(|(d, v)| (d, v))).finish()
    }
}
