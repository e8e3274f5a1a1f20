//! The registrations of a state, with a count of registrations per writer.
//!
//! Reads go straight to the map (through `Deref`); every change goes through the methods
//! here, which keep the counts in step. A registration lives by the lease of the node that
//! wrote it, so when a node's lease comes alive or dies, a join must report every
//! registration holding a write of that node; the count tells it whether the ones it already
//! looked at are all of them (nearly always), so it scans the store only when they are not.
//! A count per writer costs a few bytes per node; a full (writer, key) index would cost
//! about 60 per registration.

use std::collections::{BTreeMap, HashMap};

use rustc_hash::FxBuildHasher;
use std::ops::Deref;

use crate::dotfun::DotFun;
use crate::id::ReplicaId;
use crate::state::RegKey;
use crate::value::Registration;

type Counts = HashMap<ReplicaId, u32, FxBuildHasher>;

/// Registrations by `(service, provider)`, with how many hold a write of each node.
#[derive(Clone, Default)]
pub(crate) struct RegStore {
    map: BTreeMap<RegKey, DotFun<Registration>>,
    per_writer: Counts,
}

impl Deref for RegStore {
    type Target = BTreeMap<RegKey, DotFun<Registration>>;
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

impl From<BTreeMap<RegKey, DotFun<Registration>>> for RegStore {
    fn from(map: BTreeMap<RegKey, DotFun<Registration>>) -> Self {
        let mut per_writer = Counts::default();
        for f in map.values() {
            count(&mut per_writer, f, 1);
        }
        Self { map, per_writer }
    }
}

impl IntoIterator for RegStore {
    type Item = (RegKey, DotFun<Registration>);
    type IntoIter = std::collections::btree_map::IntoIter<RegKey, DotFun<Registration>>;
    fn into_iter(self) -> Self::IntoIter {
        self.map.into_iter()
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
        let n = counts.entry(w).or_default();
        *n = n.saturating_add_signed(by);
        if *n == 0 {
            counts.remove(&w);
        }
    }
}

impl RegStore {
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
        let f = self.map.get_mut(k)?;
        count(&mut self.per_writer, f, -1);
        let r = op(f);
        if f.is_empty() {
            self.map.remove(k);
        } else {
            count(&mut self.per_writer, f, 1);
        }
        Some(r)
    }

    pub(crate) fn insert(&mut self, k: RegKey, f: DotFun<Registration>) {
        count(&mut self.per_writer, &f, 1);
        if let Some(old) = self.map.insert(k, f) {
            count(&mut self.per_writer, &old, -1);
        }
    }

    /// Runs `op` on every registration, dropping those it empties.
    pub(crate) fn update_all(&mut self, mut op: impl FnMut(&RegKey, &mut DotFun<Registration>)) {
        let per_writer = &mut self.per_writer;
        self.map.retain(|k, f| {
            count(per_writer, f, -1);
            op(k, f);
            count(per_writer, f, 1);
            !f.is_empty()
        });
    }

    /// The map, for encoding.
    pub(crate) fn map(&self) -> &BTreeMap<RegKey, DotFun<Registration>> {
        &self.map
    }
}

impl<'a> IntoIterator for &'a RegStore {
    type Item = (&'a RegKey, &'a DotFun<Registration>);
    type IntoIter = std::collections::btree_map::Iter<'a, RegKey, DotFun<Registration>>;
    fn into_iter(self) -> Self::IntoIter {
        self.map.iter()
    }
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
        s.update_all(|_, f| {
            f.retain_unseen_or_stored(&crate::CausalContext::from_dots([dot(a, 2)]), None);
        });
        assert_eq!(s.len(), 1);
        assert_eq!(s.count_of(a), 1);
        s.update(&key("x"), |f| {
            f.retain_unseen_or_stored(&crate::CausalContext::from_dots([dot(a, 1)]), None)
        });
        assert_eq!(s.count_of(a), 0);
        assert!(s.per_writer.is_empty());
    }
}
