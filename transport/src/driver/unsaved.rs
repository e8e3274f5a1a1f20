//! The keys changed since the last save, kept in step with the replica snapshots: a store
//! that saves entry by entry writes exactly the entries a snapshot changed (see
//! [`roster_registry::ChangedKeys`]).
//!
//! The node task adds a snapshot's keys and publishes the snapshot under one lock, and
//! [`Unsaved::take`] reads the snapshot and takes the keys under the same lock: the keys
//! taken always cover every change the snapshot holds that an earlier take did not hand
//! out. (A snapshot newer than its keys would let a saved context claim dots whose entries
//! were not written, which reads as their removal.)

use std::sync::{Arc, Mutex, MutexGuard};

use roster_registry::{ChangedKeys, Replica};
use tokio::sync::watch;

/// The changed keys no save has taken yet. Cheap to clone; clones share them.
#[derive(Debug, Clone, Default)]
pub(super) struct Unsaved(Arc<Mutex<ChangedKeys>>);

impl Unsaved {
    fn lock(&self) -> MutexGuard<'_, ChangedKeys> {
        // Every holder leaves the set whole: a panic elsewhere leaves nothing to mend.
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
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
