//! The registrations of a state, with a count of registrations per writer.
//!
//! Reads go straight to the map (through `Deref`); every change goes through the methods
//! here, which keep the counts in step. A registration lives by the lease of the node that
//! wrote it, so when a node's lease comes alive or dies, a join must report every
//! registration holding a write of that node; the count tells it whether the ones it already
//! looked at are all of them (nearly always), so it scans the store only when they are not.
//! A count per writer costs a few bytes per node; a full (writer, key) index would cost
//! about 60 per registration.
//!
//! Both maps are persistent (`rpds` red-black trees): a clone shares every node, and a
//! change copies only the path to what it changes, so a snapshot costs `O(1)` and the
//! writes after it `O(log n)` each (see "Reads and watches" in docs/design.md).

use std::ops::Deref;

use rpds::RedBlackTreeMapSync;

use crate::dotfun::DotFun;
use crate::id::RegKey;
use crate::id::ReplicaId;
use crate::value::Registration;

/// The registrations by key, as stored.
pub(crate) type RegMap = RedBlackTreeMapSync<RegKey, DotFun<Registration>>;

type Counts = RedBlackTreeMapSync<ReplicaId, u32>;

/// Registrations by `(service, provider)`, with how many hold a write of each node.
#[derive(Clone, Default)]
pub(crate) struct RegStore {
    map: RegMap,
    per_writer: Counts,
}

impl Deref for RegStore {
    type Target = RegMap;
    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl PartialEq for RegStore {
    fn eq(&self, other: &Self) -> bool {
        // The counts derive from the map.
        self.map == other.map
    }
}
impl Eq for RegStore {}

impl std::fmt::Debug for RegStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.map.fmt(f)
    }
}

impl From<RegMap> for RegStore {
    fn from(map: RegMap) -> Self {
        let mut per_writer = Counts::default();
        for f in map.values() {
            count(&mut per_writer, f, 1);
        }
        Self { map, per_writer }
    }
}

impl<'a> IntoIterator for &'a RegStore {
    type Item = (&'a RegKey, &'a DotFun<Registration>);
    type IntoIter = <&'a RegMap as IntoIterator>::IntoIter;
    fn into_iter(self) -> Self::IntoIter {
        self.map.iter()
    }
}

/// The registrations of a replica at one moment, kept as they were whatever the replica
/// does next: a clone of the persistent map, so taking one costs `O(1)` and keeping it
/// costs only what the replica changed since.
#[derive(Clone, Default)]
pub struct Registrations(RegMap);

impl Registrations {
    pub(crate) fn of(store: &RegStore) -> Self {
        Self(store.map.clone())
    }

    /// The winning write under `key` (the greatest `(written, dot)`), live or not.
    pub fn get(&self, key: &RegKey) -> Option<&Registration> {
        self.0.get(key)?.winner(|r| r.written).map(|(_, r)| r)
    }
}

impl std::fmt::Debug for Registrations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Registrations({} keys)", self.0.size())
    }
}

/// The nodes that wrote the dots of `f`, each once (dots sort by node first).
fn writers(f: &DotFun<Registration>) -> impl Iterator<Item = ReplicaId> + '_ {
    let mut last = None;
    f.dots().filter_map(move |d| {
        let new = last != Some(d.actor);
        last = Some(d.actor);
        new.then_some(d.actor)
    })
}

/// Adds (`by` 1) or takes away (`by` -1) the writers of `f` to or from the counts.
fn count(counts: &mut Counts, f: &DotFun<Registration>, by: i32) {
    for w in writers(f) {
        add(counts, w, by);
    }
}

/// Adds `by` to the count of `w`.
fn add(counts: &mut Counts, w: ReplicaId, by: i32) {
    let n = counts.get(&w).copied().unwrap_or(0).saturating_add_signed(by);
    if n == 0 {
        counts.remove_mut(&w);
    } else {
        counts.insert_mut(w, n);
    }
}

/// The node that wrote every dot of `f`, when one did (and `f` is not empty).
fn sole_writer(f: &DotFun<Registration>) -> Option<ReplicaId> {
    let mut w = writers(f);
    let first = w.next()?;
    w.next().is_none().then_some(first)
}

impl RegStore {
    /// The nodes some registration holds a write of.
    pub(crate) fn writers(&self) -> impl Iterator<Item = ReplicaId> + '_ {
        self.per_writer.keys().copied()
    }

    /// How many registrations hold a write of `writer`.
    pub(crate) fn count_of(&self, writer: ReplicaId) -> u32 {
        self.per_writer.get(&writer).copied().unwrap_or(0)
    }

    /// Runs `op` on the registration under `k`, if there is one, dropping it if `op`
    /// empties it. `None` when there is none.
    pub(crate) fn update<R>(
        &mut self,
        k: &RegKey,
        op: impl FnOnce(&mut DotFun<Registration>) -> R,
    ) -> Option<R> {
        // Looked up first: `get_mut` copies the path to a missing key too.
        let old = self.map.get(k)?;
        // Nearly always one node wrote it before and after (a write replacing its own):
        // then the counts stay as they are, and are not copied from the last snapshot.
        let sole = sole_writer(old);
        if sole.is_none() {
            count(&mut self.per_writer, old, -1);
        }
        let f = self.map.get_mut(k)?;
        let r = op(f);
        let same = sole.is_some() && sole_writer(f) == sole;
        if !same {
            if let Some(w) = sole {
                add(&mut self.per_writer, w, -1);
            }
        }
        if f.is_empty() {
            self.map.remove_mut(k);
        } else if !same {
            count(&mut self.per_writer, f, 1);
        }
        Some(r)
    }

    /// Stores `f` under `k`. The key kept shares its strings with the store: the key
    /// already there, or the service name of a neighbour (every key of a service holds
    /// one copy of its name, not one each: a member's registration is about 40 bytes
    /// smaller).
    pub(crate) fn insert(&mut self, k: RegKey, f: DotFun<Registration>) {
        count(&mut self.per_writer, &f, 1);
        let k = match self.map.get_key_value(&k) {
            Some((held, old)) => {
                count(&mut self.per_writer, old, -1);
                held.clone()
            }
            None => self.sharing_service(k),
        };
        self.map.insert_mut(k, f);
    }

    /// `k`, its service name taken from a neighbouring key of the same service if any
    /// (keys sort by service first, so one of its neighbours has it if any key does).
    fn sharing_service(&self, mut k: RegKey) -> RegKey {
        let before = self.map.range(..&k).next_back();
        let after = self.map.range(&k..).next();
        let held = [before, after]
            .into_iter()
            .flatten()
            .find(|(n, _)| n.service == k.service);
        if let Some((n, _)) = held {
            k.service = n.service.clone();
        }
        k
    }

    /// Replaces every registration for which `op` gives a replacement, dropping those it
    /// replaces with an empty one. The others are left shared with earlier clones.
    pub(crate) fn replace_all(
        &mut self,
        op: impl FnMut(&RegKey, &DotFun<Registration>) -> Option<DotFun<Registration>>,
    ) {
        for (k, f) in replacements(self.map.iter(), op) {
            self.update(&k, |old| *old = f);
        }
    }
}

/// The replacements `op` gives for the functions of a map.
pub(crate) fn replacements<'a, K: Clone + 'a, V: 'a>(
    map: impl Iterator<Item = (&'a K, &'a DotFun<V>)>,
    mut op: impl FnMut(&K, &DotFun<V>) -> Option<DotFun<V>>,
) -> Vec<(K, DotFun<V>)> {
    map.filter_map(|(k, f)| Some((k.clone(), op(k, f)?))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::{dot, ProviderId, ServiceName};
    use crate::{Endpoint, Hlc};

    fn reg(lease: crate::id::Dot) -> Registration {
        Registration {
            endpoint: Endpoint::parse("10.0.0.1:80").unwrap(),
            meta: crate::Metadata::default(),
            status: crate::Status::passing(),
            since_ms: 1,
            written: Hlc::new(1, 0),
            lease_dot: lease,
        }
    }

    fn key(p: &str) -> RegKey {
        RegKey {
            service: ServiceName::new("web").unwrap(),
            provider: ProviderId::new(p).unwrap(),
        }
    }

    /// The counts as they must be: recounted from the map.
    fn recount(s: &RegStore) -> Counts {
        RegStore::from(s.map.clone()).per_writer
    }

    quickcheck::quickcheck! {
        /// Whatever writes replace, remove or add to the registrations (one writer or
        /// several before and after), the counts are what a recount gives.
        fn the_counts_are_a_recount_after_any_updates(steps: Vec<(u8, u8, u8, bool)>) -> bool {
            let mut s = RegStore::default();
            for (i, (k, a, b, keep)) in steps.into_iter().enumerate() {
                let k = key(&format!("p{}", k % 4));
                let d = |n: u8| dot(ReplicaId(u64::from(n % 3)), i as u64 + 1);
                let mut f = DotFun::single(d(a), reg(d(a)));
                if a % 3 != b % 3 {
                    f = DotFun::from_vec(vec![(d(a), reg(d(a))), (d(b), reg(d(b)))]);
                }
                if s.get(&k).is_none() {
                    s.insert(k, f);
                } else {
                    s.update(&k, |old| *old = if keep { f } else { DotFun::from_vec(Vec::new()) });
                }
                if s.per_writer != recount(&s) {
                    return false;
                }
            }
            true
        }
    }

    #[test]
    fn keys_of_one_service_hold_one_copy_of_its_name() {
        let mut s = RegStore::default();
        let name = |k: &RegKey| k.service.as_str().as_ptr();
        for p in ["m", "a", "z", "k"] {
            s.insert(
                key(p),
                DotFun::single(dot(ReplicaId(1), 1), reg(dot(ReplicaId(1), 9))),
            );
        }
        let other = RegKey {
            service: ServiceName::new("api").unwrap(),
            provider: ProviderId::new("a").unwrap(),
        };
        s.insert(
            other.clone(),
            DotFun::single(dot(ReplicaId(2), 1), reg(dot(ReplicaId(2), 9))),
        );
        let keys: Vec<&RegKey> = s.keys().collect();
        assert_eq!(keys.len(), 5);
        let web: Vec<_> = keys
            .iter()
            .filter(|k| k.service.as_str() == "web")
            .map(|k| name(k))
            .collect();
        assert!(web.windows(2).all(|w| w[0] == w[1]), "one copy of \"web\"");
        assert_ne!(name(keys[0]), web[0]);
        // Written again, a key keeps the strings the store held.
        let held = s
            .get_key_value(&key("k"))
            .map(|(k, _)| k.provider.as_str().as_ptr());
        s.insert(
            key("k"),
            DotFun::single(dot(ReplicaId(1), 2), reg(dot(ReplicaId(1), 9))),
        );
        let now = s
            .get_key_value(&key("k"))
            .map(|(k, _)| k.provider.as_str().as_ptr());
        assert_eq!(held, now);
        assert_eq!(s.count_of(ReplicaId(1)), 4);
    }

    #[test]
    fn the_counts_follow_every_change_of_the_writers() {
        let (a, b) = (ReplicaId(1), ReplicaId(2));
        let mut s = RegStore::default();
        let two = DotFun::from_vec(vec![(dot(a, 1), reg(dot(a, 9))), (dot(b, 1), reg(dot(b, 9)))]);
        s.insert(key("x"), two);
        s.insert(key("y"), DotFun::single(dot(a, 2), reg(dot(a, 9))));
        assert_eq!((s.count_of(a), s.count_of(b)), (2, 1));
        s.update(&key("x"), |f| {
            f.retain_unseen_or_stored(&crate::CausalContext::from_dots([dot(b, 1)]), None)
        });
        assert_eq!((s.count_of(a), s.count_of(b)), (2, 0));
        let before = s.clone();
        s.replace_all(|_, f| f.without_seen(&crate::CausalContext::from_dots([dot(a, 2)])));
        assert_eq!(s.size(), 1);
        assert_eq!(s.count_of(a), 1);
        s.update(&key("x"), |f| {
            f.retain_unseen_or_stored(&crate::CausalContext::from_dots([dot(a, 1)]), None)
        });
        assert_eq!(s.count_of(a), 0);
        assert!(s.per_writer.is_empty());
        // The clone taken before shares what did not change and kept what did.
        assert_eq!(before.size(), 2);
        assert_eq!((before.count_of(a), before.count_of(b)), (2, 0));
        assert_eq!(before.get(&key("y")).map(|f| f.dots().count()), Some(1));
    }
}
