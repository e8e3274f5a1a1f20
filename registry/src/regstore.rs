//! The registrations of a state, with a count of registrations per provider.
//!
//! Reads go straight to the map (through `Deref`); every change of its keys goes through
//! the methods here, which keep the counts in step. When a lease comes alive or dies, a join
//! must report every registration of that provider; the count tells it whether the ones it
//! already looked at are all of them (nearly always), so it scans the store only when they
//! are not. A count per provider costs a few bytes per registration; a full
//! (provider, service) index cost about 60.

use std::collections::{BTreeMap, HashMap};

use rustc_hash::FxBuildHasher;
use std::ops::Deref;

use crate::dotfun::DotFun;
use crate::id::ProviderId;
use crate::state::RegKey;
use crate::value::Registration;

/// Registrations by `(service, provider)`, indexed by provider.
#[derive(Clone, Default)]
pub(crate) struct RegStore {
    map: BTreeMap<RegKey, DotFun<Registration>>,
    per_provider: HashMap<ProviderId, u32, FxBuildHasher>,
}

impl Deref for RegStore {
    type Target = BTreeMap<RegKey, DotFun<Registration>>;
    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl PartialEq for RegStore {
    fn eq(&self, other: &Self) -> bool {
        // The index derives from the map.
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
        let mut per_provider: HashMap<ProviderId, u32, FxBuildHasher> = HashMap::default();
        for k in map.keys() {
            *per_provider.entry(k.provider.clone()).or_default() += 1;
        }
        Self { map, per_provider }
    }
}

impl IntoIterator for RegStore {
    type Item = (RegKey, DotFun<Registration>);
    type IntoIter = std::collections::btree_map::IntoIter<RegKey, DotFun<Registration>>;
    fn into_iter(self) -> Self::IntoIter {
        self.map.into_iter()
    }
}

impl RegStore {
    /// How many registrations `provider` has.
    pub(crate) fn count_of(&self, provider: &ProviderId) -> u32 {
        self.per_provider.get(provider).copied().unwrap_or(0)
    }

    fn uncount(per_provider: &mut HashMap<ProviderId, u32, FxBuildHasher>, provider: &ProviderId) {
        if let Some(n) = per_provider.get_mut(provider) {
            *n -= 1;
            if *n == 0 {
                per_provider.remove(provider);
            }
        }
    }

    pub(crate) fn get_mut(&mut self, k: &RegKey) -> Option<&mut DotFun<Registration>> {
        self.map.get_mut(k)
    }

    pub(crate) fn insert(&mut self, k: RegKey, f: DotFun<Registration>) {
        let provider = k.provider.clone();
        if self.map.insert(k, f).is_none() {
            *self.per_provider.entry(provider).or_default() += 1;
        }
    }

    pub(crate) fn remove(&mut self, k: &RegKey) {
        if self.map.remove(k).is_some() {
            Self::uncount(&mut self.per_provider, &k.provider);
        }
    }

    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (&RegKey, &mut DotFun<Registration>)> {
        self.map.iter_mut()
    }

    /// Drops the keys whose dot function emptied.
    pub(crate) fn drop_empty(&mut self) {
        let per_provider = &mut self.per_provider;
        self.map.retain(|k, f| {
            let keep = !f.is_empty();
            if !keep {
                Self::uncount(per_provider, &k.provider);
            }
            keep
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
