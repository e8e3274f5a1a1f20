//! A service instance's metadata: a small map of strings, packed in one string.
//!
//! Metadata is read far more than written and holds a handful of pairs. Every member of a
//! cluster has some (its URL and name) at every node, so its size is multiplied by the
//! cluster's size squared across the cluster: a sorted `Vec` of boxed strings cost one
//! allocation for the vector and two per pair (about 100 bytes for a member's two pairs,
//! and five allocator headers). The pairs are packed instead, sorted by key, each string
//! written as its length in decimal, a `:` and its bytes (a netstring without the
//! comma): one allocation, and a lookup reads a few lengths. Any strings can be packed
//! (validation is `validate_metadata`'s job), so a decoded value is kept as it came. It
//! encodes as a map, as it always did.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{Deserialize, DeserializeSeed, Deserializer, Error as _, MapAccess, Visitor};
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
// Equal metadata pack to equal strings (keys sorted and unique), so the string's equality
// and hash are the pairs'.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Metadata(Box<str>);

impl Metadata {
    /// No metadata.
    pub fn new() -> Self {
        Self::default()
    }

    /// Packs pairs already sorted by key, each key once.
    fn pack<'a>(pairs: impl Iterator<Item = (&'a str, &'a str)> + Clone) -> Self {
        let size: usize = pairs.clone().map(|(k, v)| packed_len(k) + packed_len(v)).sum();
        let mut s = String::with_capacity(size);
        for (k, v) in pairs {
            push_packed(&mut s, k);
            push_packed(&mut s, v);
        }
        Self(s.into_boxed_str())
    }

    /// Sets `key` to `value`, returning the value it replaces.
    pub fn insert(&mut self, key: impl Into<String>, value: impl Into<String>) -> Option<String> {
        let (key, value): (String, String) = (key.into(), value.into());
        let old = self.get(&key).map(str::to_string);
        let mut pairs: BTreeMap<&str, &str> = self.iter().collect();
        pairs.insert(&key, &value);
        *self = Self::pack(pairs.iter().map(|(k, v)| (*k, *v)));
        old
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    /// Removes `key`, returning its value.
    pub fn remove(&mut self, key: &str) -> Option<String> {
        let old = self.get(key)?.to_string();
        let packed = Self::pack(self.iter().filter(|(k, _)| *k != key));
        *self = packed;
        Some(old)
    }

    /// How many pairs.
    pub fn len(&self) -> usize {
        self.iter().count()
    }

    /// Whether there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The pairs, sorted by key.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> + Clone {
        Pairs { rest: &self.0 }
    }

    /// The keys, sorted.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.iter().map(|(k, _)| k)
    }
}

/// Appends `part`, packed.
fn push_packed(s: &mut String, part: &str) {
    // The length's digits, written by hand (the formatting machinery cost a tenth of a
    // one-registration delta's decoding).
    let (mut n, mut digits, mut at) = (part.len(), [b'0'; 20], 20);
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    s.extend(digits[at..].iter().map(|&d| char::from(d)));
    s.push(':');
    s.push_str(part);
}

/// The bytes a string takes packed.
fn packed_len(s: &str) -> usize {
    s.len().to_string().len() + 1 + s.len()
}

/// The pairs of a packed string, in order.
#[derive(Clone)]
struct Pairs<'a> {
    rest: &'a str,
}

impl<'a> Pairs<'a> {
    /// The next packed string. Only `Metadata::pack` writes what is read here.
    fn next_str(&mut self) -> Option<&'a str> {
        let digits = self.rest.bytes().take_while(u8::is_ascii_digit).count();
        let len = self.rest.as_bytes()[..digits].iter().try_fold(0usize, |n, d| {
            n.checked_mul(10)?.checked_add(usize::from(d - b'0'))
        })?;
        let rest = self.rest[digits..].strip_prefix(':')?;
        let s = rest.get(..len)?;
        self.rest = &rest[len..];
        Some(s)
    }
}

impl<'a> Iterator for Pairs<'a> {
    type Item = (&'a str, &'a str);
    fn next(&mut self) -> Option<Self::Item> {
        Some((self.next_str()?, self.next_str()?))
    }
}

impl PartialOrd for Metadata {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Metadata {
    /// By pairs, as a sorted list of them compares.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.iter().cmp(other.iter())
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
        Self::pack(map.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    }
}

impl<K: Into<String>, V: Into<String>, const N: usize> From<[(K, V); N]> for Metadata {
    fn from(pairs: [(K, V); N]) -> Self {
        pairs.into_iter().collect()
    }
}

impl From<Metadata> for BTreeMap<String, String> {
    fn from(m: Metadata) -> Self {
        m.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }
}

impl fmt::Debug for Metadata {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl Serialize for Metadata {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.len()))?;
        for (k, v) in self.iter() {
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
                // Each string is packed as it is read: no string of its own on the way.
                let mut s = String::new();
                let mut last: Option<std::ops::Range<usize>> = None;
                while let Some(key) = access.next_key_seed(Append(&mut s))? {
                    if last.is_some_and(|l| s[l] >= s[key.clone()]) {
                        return Err(A::Error::custom("metadata keys are not sorted and unique"));
                    }
                    last = Some(key);
                    access.next_value_seed(Append(&mut s))?;
                }
                Ok(Metadata(s.into_boxed_str()))
            }
        }
        d.deserialize_map(V)
    }
}

/// Reads a string into a packed one; gives where its text went.
struct Append<'s>(&'s mut String);

impl<'de> DeserializeSeed<'de> for Append<'_> {
    type Value = std::ops::Range<usize>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for Append<'_> {
    type Value = std::ops::Range<usize>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
        push_packed(self.0, v);
        Ok(self.0.len() - v.len()..self.0.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    quickcheck::quickcheck! {
        /// Whatever strings (colons, digits, any characters, empty ones), packed metadata
        /// reads back as the map it was made from, and inserts and removals keep it so.
        fn packed_pairs_read_back_as_the_map_they_came_from(
            pairs: Vec<(String, String)>,
            ops: Vec<(bool, String, String)>
        ) -> bool {
            let mut map: BTreeMap<String, String> = pairs.into_iter().collect();
            let mut m = Metadata::from(map.clone());
            for (insert, k, v) in ops {
                let (a, b) = match insert {
                    true => (m.insert(k.clone(), v.clone()), map.insert(k, v)),
                    false => (m.remove(&k), map.remove(&k)),
                };
                if a != b {
                    return false;
                }
            }
            let read: BTreeMap<String, String> = m.clone().into();
            read == map
                && m.len() == map.len()
                && map.iter().all(|(k, v)| m.get(k) == Some(v.as_str()))
                && m.get("\u{0}absent") == map.get("\u{0}absent").map(String::as_str)
        }

        /// Encoded as a map, metadata decodes to what it was; a map whose keys are not
        /// strictly increasing is refused.
        fn metadata_encodes_as_a_map_and_decodes_to_itself(map: BTreeMap<String, String>) -> bool {
            let m = Metadata::from(map.clone());
            let bytes = postcard::to_stdvec(&m).unwrap();
            let back: Metadata = postcard::from_bytes(&bytes).unwrap();
            let reversed: Vec<(&String, &String)> = map.iter().rev().collect();
            let unsorted = postcard::to_stdvec(&reversed).unwrap();
            let as_map = postcard::to_stdvec(&map).unwrap();
            back == m
                && as_map == bytes
                && (map.len() < 2 || postcard::from_bytes::<Metadata>(&unsorted).is_err())
        }

        /// Packed metadata orders as the sorted list of its pairs did.
        fn metadata_orders_as_its_pairs_do(a: BTreeMap<String, String>, b: BTreeMap<String, String>) -> bool {
            let pairs = |m: &BTreeMap<String, String>| m.clone().into_iter().collect::<Vec<_>>();
            Metadata::from(a.clone()).cmp(&Metadata::from(b.clone())) == pairs(&a).cmp(&pairs(&b))
        }
    }

    #[test]
    fn a_member_s_metadata_is_one_allocation_of_its_strings_and_their_lengths() {
        let m: Metadata = [("url", "ws://10.0.0.7:7420"), ("name", "n7")].into();
        assert_eq!(&*m.0, "4:name2:n73:url18:ws://10.0.0.7:7420");
        assert_eq!(m.get("url"), Some("ws://10.0.0.7:7420"));
        assert_eq!(m.get("ur"), None);
    }
}
