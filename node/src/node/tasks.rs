//! The node's background tasks: saving the replica, ending passed `ttl`s, warning while
//! no peer is reached.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_client::metrics::histogram::Histogram;
use roster_transport::driver::Handle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{now_ms, Inner, Node};
use crate::store::{Store, StoreError};

/// How often what the node knows of its peers (backoffs) is compared with what was saved.
const MEMORY_CHECK: Duration = Duration::from_millis(250);
/// The least time between two saves of the replica (group commit): what a crash may lose
/// of what peers sent, fetched again from them at the restart. (At 100 ms, the nine saves
/// a second of a node receiving 100 changes a second cost it about a tenth of its CPU, each
/// a synced commit; a save costs the same for one change as for a hundred.)
const SAVE_INTERVAL: Duration = Duration::from_secs(1);
/// Changed entries that end the wait for the rest of a save's interval: a burst of
/// peer-learnt changes is saved at this count, so a crash loses at most about this many
/// or one interval of them, whichever is fewer (a large replica's saves are spaced to
/// several seconds, see [`SAVE_COST_FACTOR`]).
const SAVE_AT_CHANGES: usize = 1_000;
/// Saves of a large replica are spaced further: writing may take at most a tenth of the time.
const SAVE_COST_FACTOR: u32 = 10;
/// How often own registrations with a `ttl` are checked for their end.
const TTL_CHECK: Duration = Duration::from_millis(250);

/// Saves the replica after changes, in batches (group commit): what peers sent in one
/// transaction per interval or per [`SAVE_AT_CHANGES`], whichever comes first. (Own writes
/// are on disk before they are answered: `group.rs`; this saves their replica entries.)
/// After a failed write it reopens the store on its backoff, and saves what is unsaved
/// once it can.
pub(super) async fn saver(handle: Handle, store: Arc<Store>, latency: Histogram, cancel: CancellationToken) {
    let mut rx = handle.watch_replica();
    let mut interval = SAVE_INTERVAL;
    let mut saved_memory: Vec<u8> = Vec::new();
    // What the node knows of its peers is compared with what was saved this often, not
    // after every save (each comparison is a round trip to the node task).
    let mut memory_due = Instant::now();
    // A change the last save attempt did not write.
    let mut unsaved = false;
    loop {
        let replica_changed = tokio::select! {
            () = cancel.cancelled() => return,
            r = rx.changed() => {
                if r.is_err() {
                    return;
                }
                true
            }
            () = tokio::time::sleep(MEMORY_CHECK) => false,
        };
        unsaved |= replica_changed;
        if store.health().is_some() {
            // Closed after a failed write (the store logged it): nothing is written until
            // it reopens on its backoff; then the save below is the write that proves it.
            let s = Arc::clone(&store);
            match tokio::task::spawn_blocking(move || s.reopen_if_due()).await {
                Ok(Some(false)) | Err(_) => continue,
                Ok(_) => unsaved = true,
            }
        }
        if unsaved {
            if replica_changed {
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep(interval) => {}
                    () = handle.unsaved_reached(SAVE_AT_CHANGES) => {}
                }
            }
            rx.borrow_and_update();
            let started = Instant::now();
            match save_changes(&handle, &store).await {
                Ok(()) => {
                    unsaved = false;
                    latency.observe(started.elapsed().as_secs_f64());
                }
                Err(StoreError::Unwritable { .. }) => continue,
                Err(e) => warn!("could not save the replica: {e}"),
            }
            interval = (started.elapsed() * SAVE_COST_FACTOR).max(SAVE_INTERVAL);
        }
        // Backoffs change without the replica changing (a dial that fails): save them
        // when they differ from what is on disk, so the next process honours them.
        if Instant::now() < memory_due {
            continue;
        }
        memory_due = Instant::now() + MEMORY_CHECK;
        let Ok(memory) = handle.inspect(|n, _| n.memory()).await else {
            return;
        };
        let Ok(bytes) = postcard::to_stdvec(&memory) else {
            continue;
        };
        if bytes != saved_memory {
            let store = Arc::clone(&store);
            let b = bytes.clone();
            match tokio::task::spawn_blocking(move || store.save_memory(&b)).await {
                Ok(Ok(())) => saved_memory = bytes,
                Ok(Err(StoreError::Unwritable { .. })) => {}
                Ok(Err(e)) => warn!("could not save the peer backoffs: {e}"),
                Err(e) => warn!("the save task failed: {e}"),
            }
        }
    }
}

/// Saves the latest replica snapshot: the entries changed since the last save, and the
/// context. Keys it could not write are given back, to be written by the next save.
async fn save_changes(handle: &Handle, store: &Arc<Store>) -> Result<(), StoreError> {
    let (replica, changed) = handle.take_unsaved();
    // Kept here too: a save task that panicked must not lose them.
    let kept = changed.clone();
    let s = Arc::clone(store);
    let saved = tokio::task::spawn_blocking(move || s.save_replica(&replica, &changed, false))
        .await
        .unwrap_or_else(|e| {
            Err(StoreError::Io {
                path: store.path().to_path_buf(),
                why: format!("the save task failed: {e}"),
            })
        });
    if saved.is_err() {
        handle.give_back_unsaved(kept);
    }
    saved
}

/// How long after its start a node with seeds says it has reached none, and then how
/// often it says so again while that lasts.
const UNSYNCED_WARN_AFTER: Duration = Duration::from_secs(10);
const UNSYNCED_WARN_EVERY: Duration = Duration::from_secs(300);

/// Logs a warning while the node has caught up with no peer: its seeds are all
/// unreachable (a wrong `--join`, agents not started, a secret or TLS mismatch), and its
/// reads show only what it had on disk.
pub(super) async fn warn_unsynced(handle: Handle, seeds: Vec<String>, cancel: CancellationToken) {
    let mut wait = UNSYNCED_WARN_AFTER;
    let mut waited = Duration::ZERO;
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = handle.synced() => return,
            () = tokio::time::sleep(wait) => {}
        }
        waited += wait;
        warn!(
            "no peer reached {} after the start: none of the seeds ({}) answered; reads show only what this node had on disk; still trying: check --join, that those agents run, and the cluster secret or TLS files",
            humantime::format_duration(waited),
            seeds.join(", ")
        );
        wait = UNSYNCED_WARN_EVERY;
    }
}

impl Node {
    /// Notes the `ttl` of a record about to be put in `owned` (call it under its lock).
    pub(super) fn note_ttl(&self, expires_at_ms: Option<u64>) {
        if let Some(t) = expires_at_ms {
            self.inner.ttl_due.fetch_min(t, Ordering::Relaxed);
        }
    }

    /// The own registrations whose `ttl` passed by `now`. Reads them only once the
    /// earliest `ttl` it knows has come (an owner of 100,000 read them all four times a
    /// second, and that was nearly all its idle work).
    async fn ttls_passed(&self, now: u64) -> Vec<(String, String)> {
        if now < self.inner.ttl_due.load(Ordering::Relaxed) {
            return Vec::new();
        }
        let owned = self.inner.owned.lock().await;
        let mut next = u64::MAX;
        let mut passed = Vec::new();
        for r in owned.values() {
            match r.expires_at_ms() {
                Some(t) if t <= now => passed.push((r.reg.service.to_string(), r.reg.provider.to_string())),
                Some(t) => next = next.min(t),
                None => {}
            }
        }
        // Those that passed are looked at again until they are gone.
        let due = if passed.is_empty() { next } else { now };
        self.inner.ttl_due.store(due, Ordering::Relaxed);
        passed
    }
}

/// Ends own registrations whose `ttl` passed without a new `register`.
pub(super) async fn ttl_keeper(inner: std::sync::Weak<Inner>, cancel: CancellationToken) {
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(TTL_CHECK) => {}
        }
        let Some(inner) = inner.upgrade() else { return };
        let node = Node { inner };
        node.save_pending_removals().await;
        for (service, instance) in node.ttls_passed(now_ms()).await {
            info!(
                service,
                instance, "registration TTL passed without a new register: deregistering"
            );
            node.expire(&service, &instance).await;
        }
    }
}
