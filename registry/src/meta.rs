//! A service instance's metadata: a small map of strings, kept as a sorted `Vec`.
//!
//! Metadata is read far more than written and holds a handful of pairs, so a sorted vector
//! of exact capacity is both the smallest and the fastest representation (a `BTreeMap`
//! allocates a node of eleven slots for the first pair). It encodes as a map.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{Deserialize, Deserializer, Error as _, MapAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, Serializer};

/// A service instance's metadata: string keys to string values, sorted by key.
///
/// ```
/// use roster_registry::Metadata;
/// let mut m: Metadata = [("zone", "eu-1a"), ("version", "1.4")].into();
/// m.insert("zone", "eu-1b");
/// assert_eq!(m.get("zone"), Some("eu-1b"));
/// assert_eq!(m.iter().map(|(k, _)| k).collect::<Vec<_>>(), ["version", "zone"]);
/// ```
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Metadata(Vec<(Box<str>, Box<str>)>);

impl Metadata {
    /// No metadata.
    pub fn new() -> Self {
        Self::default()
    }

    fn find(&self, key: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| (**k).cmp(key))
    }

    /// Sets `key` to `value`, returning the value it replaces.
    pub fn insert(&mut self, key: impl Into<String>, value: impl Into<String>) -> Option<String> {
        let (key, value): (String, String) = (key.into(), value.into());
        match self.find(&key) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i].1, value.into()).into()),
            Err(i) => {
                self.0.reserve_exact(1);
                self.0.insert(i, (key.into(), value.into()));
                None
            }
        }
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.find(key).ok().map(|i| &*self.0[i].1)
    }

    /// Removes `key`, returning its value.
    pub fn remove(&mut self, key: &str) -> Option<String> {
        self.find(key).ok().map(|i| self.0.remove(i).1.into())
    }

    /// How many pairs.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The pairs, sorted by key.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (&**k, &**v))
    }

    /// The keys, sorted.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(k, _)| &**k)
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for Metadata {
    /// Collects pairs; a later pair wins over an earlier one with the same key.
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let map: BTreeMap<String, String> = iter.into_iter().map(|(k, v)| (k.into(), v.into())).collect();
        Self::from(map)
    }
}

impl From<BTreeMap<String, String>> for Metadata {
    fn from(map: BTreeMap<String, String>) -> Self {
        Self(map.into_iter().map(|(k, v)| (k.into(), v.into())).collect())
    }
}

impl<K: Into<String>, V: Into<String>, const N: usize> From<[(K, V); N]> for Metadata {
    fn from(pairs: [(K, V); N]) -> Self {
        pairs.into_iter().collect()
    }
}

impl From<Metadata> for BTreeMap<String, String> {
    fn from(m: Metadata) -> Self {
        m.0.into_iter().map(|(k, v)| (k.into(), v.into())).collect()
    }
}

impl fmt::Debug for Metadata {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl Serialize for Metadata {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Metadata {
    /// Reads a map whose keys are strictly increasing: one encoding per value, so a
    /// decoded state re-encodes to the same bytes.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Metadata;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of strings with sorted, unique keys")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Metadata, A::Error> {
                let mut pairs: Vec<(Box<str>, Box<str>)> = Vec::new();
                while let Some((k, v)) = access.next_entry::<String, String>()? {
                    if pairs.last().is_some_and(|(last, _)| **last >= *k) {
                        return Err(A::Error::custom("metadata keys are not sorted and unique"));
                    }
                    pairs.push((k.into(), v.into()));
                }
                pairs.shrink_to_fit();
                Ok(Metadata(pairs))
            }
        }
        d.deserialize_map(V)
    }
}
