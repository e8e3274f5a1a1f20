//! Own removals that could not be saved. A registration whose `ttl` passed is taken out of
//! the cluster at once even when the disk cannot be written (it is not left live), and its
//! removal is saved when the store can write again. Until then the record on disk still
//! carries the passed `ttl`, so a restart removes it too.

use std::sync::Arc;

use roster_registry::{ProviderId, ServiceName};
use tracing::{info, warn};

use super::held::key_of;
use super::{now_ms, Error, Node};
use crate::store::StoreError;

impl Node {
    /// Ends an own registration whose `ttl` passed: off disk, then out of the cluster; when
    /// the disk cannot be written, out of the cluster now and off disk later.
    pub(super) async fn expire(&self, service: &str, instance: &str) {
        let e = match self.deregister(service, instance).await {
            Ok(()) | Err(Error::NotFound(_)) => return,
            Err(Error::Store(e)) => e,
            Err(e) => {
                warn!(service, instance, "could not deregister: {e}");
                return;
            }
        };
        let Some(key) = key_of(service, instance) else {
            return;
        };
        let mut owned = self.inner.owned.lock().await;
        if owned
            .get(&key)
            .is_none_or(|r| r.expires_at_ms().is_none_or(|t| t > now_ms()))
        {
            return; // registered again meanwhile
        }
        owned.remove(&key);
        if let Ok(mut pending) = self.inner.pending_removals.lock() {
            pending.insert(crate::store::key(service, instance));
        }
        warn!(
            service,
            instance,
            "its ttl passed: removed from the cluster, but not yet from disk ({}); saved once the disk can be written again",
            reason(&e)
        );
        if let (Ok(s), Ok(p)) = (ServiceName::new(service), ProviderId::new(instance)) {
            let _ = self.inner.handle.deregister(s, p).await;
        }
    }

    /// Saves the removals [`Node::expire`] could not, once the store writes again.
    pub(super) async fn save_pending_removals(&self) {
        let Some(store) = self.inner.store() else { return };
        if store.health().is_some() {
            return; // the saver reopens it; try after that
        }
        let keys: Vec<String> = match self.inner.pending_removals.lock() {
            Ok(p) => p.iter().cloned().collect(),
            Err(_) => return,
        };
        for key in keys {
            let owned = self.inner.owned.lock().await;
            let Some((service, instance)) = key.split_once('/') else {
                continue;
            };
            // Registered again meanwhile: that write replaced the record on disk.
            if !key_of(service, instance).is_some_and(|k| owned.contains_key(&k)) {
                let (s, i, store) = (service.to_string(), instance.to_string(), Arc::clone(&store));
                match tokio::task::spawn_blocking(move || store.remove_owned(&s, &i, now_ms())).await {
                    Ok(Ok(_)) => info!(service, instance, "the removal of its passed ttl is saved"),
                    _ => return, // the store logged it; tried again after the next reopen
                }
            }
            if let Ok(mut pending) = self.inner.pending_removals.lock() {
                pending.remove(&key);
            }
        }
    }
}

/// The error without the advice the store's message repeats.
fn reason(e: &StoreError) -> String {
    match e {
        StoreError::Unwritable { why, .. } | StoreError::Io { why, .. } => why.clone(),
        other => other.to_string(),
    }
}
