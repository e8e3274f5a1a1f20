//! The keys changed since the last save, kept in step with the replica snapshots: a store
//! that saves entry by entry writes exactly the entries a snapshot changed (see
//! [`roster_registry::ChangedKeys`]).
//!
//! The node task adds a snapshot's keys and publishes the snapshot under one lock, and
//! [`Unsaved::take`] reads the snapshot and takes the keys under the same lock: the keys
//! taken always cover every change the snapshot holds that an earlier take did not hand
//! out. (A snapshot newer than its keys would let a saved context claim dots whose entries
//! were not written, which reads as their removal.)
//!
//! A saver that saves once per interval can also ask to be woken when a count of changed
//! keys waits ([`Unsaved::reached`]), so a burst is saved without waiting for the interval
//! to end; the publisher wakes it once, when the count is reached, not at every change.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use roster_registry::{ChangedKeys, Replica};
use tokio::sync::{watch, Notify};

/// The changed keys no save has taken yet. Cheap to clone; clones share them.
#[derive(Debug, Clone, Default)]
pub(super) struct Unsaved(Arc<Shared>);

#[derive(Debug, Default)]
struct Shared {
    keys: Mutex<ChangedKeys>,
    /// The count of keys a waiter of [`Unsaved::reached`] waits for (0: none waits).
    wanted: AtomicUsize,
    reached: Notify,
}

impl Unsaved {
    fn lock(&self) -> MutexGuard<'_, ChangedKeys> {
        // Every holder leaves the set whole: a panic elsewhere leaves nothing to mend.
        self.0
            .keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds `changed` (nothing when the replica does not track changes) and publishes
    /// `snapshot`, as one step for [`Unsaved::take`].
    pub(super) fn publish(
        &self,
        changed: Option<ChangedKeys>,
        tx: &watch::Sender<Arc<Replica>>,
        snapshot: Arc<Replica>,
    ) {
        let mut keys = self.lock();
        if let Some(c) = changed {
            keys.merge(c);
        }
        tx.send_replace(snapshot);
        let wanted = self.0.wanted.load(Ordering::Relaxed);
        if wanted != 0 && keys.len() >= wanted {
            self.0.reached.notify_waiters();
        }
    }

    /// Returns once at least `n` changed keys wait for a save (at once if they do now).
    pub(super) async fn reached(&self, n: usize) {
        let n = n.max(1);
        self.0.wanted.store(n, Ordering::Relaxed);
        loop {
            let notified = self.0.reached.notified();
            tokio::pin!(notified);
            // Registered before the count is read: a publish after the read wakes it.
            notified.as_mut().enable();
            if self.lock().len() >= n {
                return;
            }
            notified.await;
        }
    }

    /// The latest snapshot, and the keys changed since the last take.
    pub(super) fn take(&self, rx: &watch::Receiver<Arc<Replica>>) -> (Arc<Replica>, ChangedKeys) {
        let mut keys = self.lock();
        let snapshot = Arc::clone(&rx.borrow());
        (snapshot, std::mem::take(&mut *keys))
    }

    /// Gives back keys a save did not write, to be taken again with a later snapshot.
    pub(super) fn give_back(&self, changed: ChangedKeys) {
        self.lock().merge(changed);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use roster_registry::{ReplicaId, State};

    use super::*;

    fn keys(nodes: std::ops::Range<u64>) -> ChangedKeys {
        ChangedKeys {
            regs: BTreeSet::new(),
            leases: nodes.map(ReplicaId).collect(),
        }
    }

    #[tokio::test]
    async fn a_saver_waiting_for_a_count_of_changes_wakes_when_it_is_reached_and_not_before() {
        let unsaved = Unsaved::default();
        let replica = Arc::new(Replica::from_state(ReplicaId(1), State::new(), 0));
        let (tx, _rx) = watch::channel(Arc::clone(&replica));
        let waiter = tokio::spawn({
            let unsaved = unsaved.clone();
            async move { unsaved.reached(3).await }
        });
        tokio::task::yield_now().await;
        unsaved.publish(Some(keys(0..2)), &tx, Arc::clone(&replica));
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "woken with 2 of 3 changes");
        unsaved.publish(Some(keys(2..3)), &tx, Arc::clone(&replica));
        waiter.await.unwrap();
        // Already there: no wait.
        unsaved.reached(3).await;
    }
}
