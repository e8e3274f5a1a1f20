//! Join, the lattice's least upper bound: how one store (registrations or leases) joins
//! another key by key, what a join reports, whether a delta would teach anything
//! (`State::learns_from`), and the `crdts` trait it implements. What a join taught (the
//! effective delta, [`State::join_collecting`]) is in `taught.rs`.

use std::collections::BTreeSet;

use rpds::HashTrieMapSync;

use super::{RegKey, State};
use crate::context::CausalContext;
use crate::dotfun::DotFun;
use crate::error::ConflictingDot;
use crate::id::{Dot, ReplicaId};
use crate::regstore::{replacements, RegStore};
use crate::value::Registration;

/// Keys of a state: registrations, then the nodes of leases.
pub(crate) type Keys = (BTreeSet<RegKey>, BTreeSet<ReplicaId>);

/// What a join touched: the keys whose dots changed, and whether the context grew.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct JoinReport {
    /// Registrations that gained or lost a dot.
    pub regs: BTreeSet<RegKey>,
    /// Nodes whose lease gained or lost a dot.
    pub leases: BTreeSet<ReplicaId>,
    /// Whether the join taught this state a dot it had not seen.
    pub context_grew: bool,
    /// Dots a full state taught this state without their writes, which the effective delta
    /// leaves out (see [`State::join_collecting`]): peers learn them from their own
    /// anti-entropy, not from what this state forwards.
    pub left_out: usize,
}

impl JoinReport {
    /// Whether the join changed anything: false means the other state was already included.
    pub fn changed(&self) -> bool {
        self.context_grew || !self.regs.is_empty() || !self.leases.is_empty()
    }
}

/// A map from keys to dot functions: the registrations ([`RegStore`], which counts their
/// writers) or the leases. Every change goes through `update`, `insert_fun` and
/// `replace_all`, so a map can keep an index in step.
trait FunMap<K: 'static, V: 'static> {
    /// Runs `op` on the function under `k` and drops it if `op` empties it; `None` when
    /// there is none.
    fn update<R>(&mut self, k: &K, op: impl FnOnce(&mut DotFun<V>) -> R) -> Option<R>;
    fn insert_fun(&mut self, k: K, f: DotFun<V>);
    fn funs(&self) -> impl Iterator<Item = (&K, &DotFun<V>)>;
    /// Whether there is a function under `k`.
    fn has(&self, k: &K) -> bool;
    /// Replaces every function for which `op` gives a replacement, dropping the empty ones.
    fn replace_all(&mut self, op: impl FnMut(&K, &DotFun<V>) -> Option<DotFun<V>>);
}

impl FunMap<RegKey, Registration> for RegStore {
    fn update<R>(&mut self, k: &RegKey, op: impl FnOnce(&mut DotFun<Registration>) -> R) -> Option<R> {
        RegStore::update(self, k, op)
    }
    fn insert_fun(&mut self, k: RegKey, f: DotFun<Registration>) {
        self.insert(k, f);
    }
    fn funs(&self) -> impl Iterator<Item = (&RegKey, &DotFun<Registration>)> {
        self.iter()
    }
    fn has(&self, k: &RegKey) -> bool {
        self.contains_key(k)
    }
    fn replace_all(
        &mut self,
        op: impl FnMut(&RegKey, &DotFun<Registration>) -> Option<DotFun<Registration>>,
    ) {
        RegStore::replace_all(self, op);
    }
}
impl<K, V, S> FunMap<K, V> for HashTrieMapSync<K, DotFun<V>, S>
where
    K: std::hash::Hash + Eq + Clone + 'static,
    V: Clone + 'static,
    S: std::hash::BuildHasher + Clone,
{
    fn update<R>(&mut self, k: &K, op: impl FnOnce(&mut DotFun<V>) -> R) -> Option<R> {
        // Looked up first: `get_mut` copies the path to a missing key too.
        if !self.contains_key(k) {
            return None;
        }
        let f = self.get_mut(k)?;
        let r = op(f);
        if f.is_empty() {
            self.remove_mut(k);
        }
        Some(r)
    }
    fn insert_fun(&mut self, k: K, f: DotFun<V>) {
        self.insert_mut(k, f);
    }
    fn funs(&self) -> impl Iterator<Item = (&K, &DotFun<V>)> {
        self.iter()
    }
    fn has(&self, k: &K) -> bool {
        self.contains_key(k)
    }
    fn replace_all(&mut self, op: impl FnMut(&K, &DotFun<V>) -> Option<DotFun<V>>) {
        for (k, f) in replacements(self.iter(), op) {
            if f.is_empty() {
                self.remove_mut(&k);
            } else {
                self.insert_mut(k, f);
            }
        }
    }
}

/// Joins one store (registrations or leases): first every key the other side stores, then
/// the keys its context may reach into: the ones it names (`touched`) or, for a full state,
/// all of ours. Returns the keys that changed.
fn join_store<K: Ord + Clone + 'static, V: Clone + 'static, M: FunMap<K, V>>(
    mine: &mut M,
    theirs: &M,
    touched: Option<&BTreeSet<K>>,
    my_ctx: &CausalContext,
    their_ctx: &CausalContext,
) -> BTreeSet<K> {
    let mut changed = BTreeSet::new();
    // The keys `other` stores are joined with their dots first; the touched keys and (for a
    // full state) our other keys only lose what `other` removed.
    for (k, f) in theirs.funs() {
        if join_key(mine, k, Some(f), my_ctx, their_ctx) {
            changed.insert(k.clone());
        }
    }
    match touched {
        Some(keys) => {
            for k in keys.iter().filter(|k| !theirs.has(k)) {
                if join_key(mine, k, None, my_ctx, their_ctx) {
                    changed.insert(k.clone());
                }
            }
        }
        None => mine.replace_all(|k, f| {
            if theirs.has(k) {
                return None;
            }
            let kept = f.without_seen(their_ctx)?;
            changed.insert(k.clone());
            Some(kept)
        }),
    }
    changed
}

/// Joins one key: keeps our dots that `other` stores too or has never seen, adds theirs that
/// we have never seen, and drops the key if it empties. Returns whether anything changed.
fn join_key<K: Clone + 'static, V: Clone + 'static>(
    map: &mut impl FunMap<K, V>,
    k: &K,
    theirs: Option<&DotFun<V>>,
    my_ctx: &CausalContext,
    their_ctx: &CausalContext,
) -> bool {
    let mut theirs = Some(theirs);
    let joined = map.update(k, |mine| {
        let theirs = theirs.take().flatten();
        let mut changed = mine.retain_unseen_or_stored(their_ctx, theirs);
        for (d, v) in theirs.into_iter().flat_map(DotFun::iter) {
            if !my_ctx.contains(d) {
                changed |= mine.insert(d.clone(), v.clone());
            }
        }
        if changed {
            mine.shrink();
        }
        changed
    });
    match joined {
        Some(changed) => changed,
        None => {
            let theirs = theirs.take().flatten();
            let new: Vec<(Dot, V)> = theirs
                .into_iter()
                .flat_map(DotFun::iter)
                .filter(|(d, _)| !my_ctx.contains(d))
                .map(|(d, v)| (d.clone(), v.clone()))
                .collect();
            if new.is_empty() {
                return false;
            }
            map.insert_fun(k.clone(), DotFun::from_vec(new));
            true
        }
    }
}

impl State {
    /// Joins `other` into this state: the least upper bound of the two.
    ///
    /// Idempotent, commutative and associative, so deltas may arrive in any order, twice, or
    /// never (a later join of a full state repairs the loss). A delta costs
    /// `O(|delta| log |self|)`; a full state visits every key of both.
    pub fn join(&mut self, mut other: State) -> JoinReport {
        let mut report = JoinReport {
            context_grew: !self.ctx.includes(&other.ctx),
            ..JoinReport::default()
        };
        let their_touched = other.touched.take();
        // A delta buffer keeps naming every key it may reach into; a full state names none.
        match (&mut self.touched, &their_touched) {
            (Some(_), None) => self.touched = None,
            (Some(mine), Some(theirs)) => {
                mine.regs.extend(theirs.regs.iter().cloned());
                mine.regs.extend(other.regs.keys().cloned());
                mine.leases.extend(theirs.leases.iter().cloned());
                mine.leases.extend(other.leases.keys().cloned());
            }
            (None, _) => {}
        }
        let (my_ctx, their_ctx) = (&self.ctx, &other.ctx);
        let touched = their_touched.as_ref();
        report.regs = join_store(
            &mut self.regs,
            &other.regs,
            touched.map(|t| &t.regs),
            my_ctx,
            their_ctx,
        );
        report.leases = join_store(
            &mut self.leases,
            &other.leases,
            touched.map(|t| &t.leases),
            my_ctx,
            their_ctx,
        );
        if let Some(mine) = &mut self.touched {
            // Keys this join emptied are no longer in the store but still reached into.
            mine.regs.extend(report.regs.iter().cloned());
            mine.leases.extend(report.leases.iter().cloned());
        }
        // Contexts join by union.
        if report.context_grew {
            self.ctx.join(&other.ctx);
        }
        report
    }

    /// The keys (registrations, then the nodes of leases) a join with `other` may touch;
    /// `None` when `other` is a full state and every key may be touched.
    pub(crate) fn keys_touched_by(other: &State) -> Option<Keys> {
        let t = other.touched.as_ref()?;
        let regs = t.regs.iter().chain(other.regs.keys()).cloned().collect();
        let leases = t.leases.iter().chain(other.leases.keys()).cloned().collect();
        Some((regs, leases))
    }

    /// The keys (registrations, then the nodes of leases) a join of `other` into this
    /// state may touch: those `other` names when it is a delta, else every key of both.
    pub(crate) fn keys_a_join_may_touch(&self, other: &State) -> Keys {
        State::keys_touched_by(other).unwrap_or_else(|| {
            let regs = self.regs.keys().chain(other.regs.keys()).cloned().collect();
            let leases = self.leases.keys().chain(other.leases.keys()).copied().collect();
            (regs, leases)
        })
    }
}

impl State {
    /// Whether joining `other` would change this state (what [`JoinReport::changed`] would
    /// say), told without joining: a flood delivers most deltas more than once (about
    /// three copies each, 3.5 a member at a cluster's start), and a copy already held then
    /// costs the lookups of its keys, not the notes a join takes before and after. Always
    /// true for a full state, which a join visits whole anyway.
    pub(crate) fn learns_from(&self, other: &State) -> bool {
        let Some(t) = &other.touched else {
            return true;
        };
        if !self.ctx.includes(&other.ctx) {
            return true;
        }
        let ctx = &other.ctx;
        let regs = other.regs.keys().chain(&t.regs);
        let leases = other.leases.keys().chain(&t.leases);
        regs.into_iter()
            .any(|k| drops_any(self.reg(k), other.reg(k), ctx))
            || leases
                .into_iter()
                .any(|&n| drops_any(self.lease(n), other.lease(n), ctx))
    }
}

/// Whether a join drops a dot of `mine`: one `theirs` does not store and their context saw.
fn drops_any<V>(mine: Option<&DotFun<V>>, theirs: Option<&DotFun<V>>, their_ctx: &CausalContext) -> bool {
    mine.is_some_and(|m| {
        m.iter()
            .any(|(d, _)| their_ctx.contains(d) && !theirs.is_some_and(|t| t.contains(d)))
    })
}

/// The `crdts` crate's state-based CRDT trait: `merge` is [`State::join`].
impl crdts::CvRDT for State {
    type Validation = ConflictingDot;

    /// Checks that every dot both states store names the same write. A dot names one
    /// write, so a difference means a node reused a counter.
    fn validate_merge(&self, other: &Self) -> Result<(), ConflictingDot> {
        fn check<V: PartialEq>(mine: Option<&DotFun<V>>, theirs: &DotFun<V>) -> Result<(), ConflictingDot> {
            for (d, v) in theirs.iter() {
                if mine.and_then(|m| m.get(d)).is_some_and(|m| m != v) {
                    return Err(ConflictingDot { dot: format!("{d}") });
                }
            }
            Ok(())
        }
        for (k, f) in &other.regs {
            check(self.regs.get(k), f)?;
        }
        for (p, f) in &other.leases {
            check(self.leases.get(p), f)?;
        }
        Ok(())
    }

    fn merge(&mut self, other: Self) {
        self.join(other);
    }
}
