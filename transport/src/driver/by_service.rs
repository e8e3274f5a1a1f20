//! Changes by service: a channel per service that someone watches, so a watch is woken by
//! its own service's changes only. (On the one channel of every change, each change woke
//! every watch, to be dropped by all but those of its service: with many watches of
//! other services, that was most of a receiving node's work per change.)

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use roster_registry::{Change, ServiceName};
use tokio::sync::broadcast;

/// The channels, by service; one lives while it has a receiver.
#[derive(Debug)]
pub(super) struct ByService {
    channels: Mutex<BTreeMap<ServiceName, broadcast::Sender<Arc<Change>>>>,
    /// Each channel's capacity: a receiver that falls further behind learns it lagged.
    capacity: usize,
}

impl ByService {
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            channels: Mutex::default(),
            capacity,
        }
    }

    /// A receiver of `service`'s changes from now on.
    pub(super) fn subscribe(&self, service: &ServiceName) -> broadcast::Receiver<Arc<Change>> {
        let mut channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(tx) = channels.get(service) {
            return tx.subscribe();
        }
        let (tx, rx) = broadcast::channel(self.capacity);
        channels.insert(service.clone(), tx);
        rx
    }

    /// Sends each change to its service's receivers, if it has any; a channel found
    /// without receivers is dropped.
    pub(super) fn send<'a>(&self, changes: impl IntoIterator<Item = &'a Arc<Change>>) {
        let mut channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        if channels.is_empty() {
            return;
        }
        for change in changes {
            let service = match &**change {
                Change::Up(i) => &i.service,
                Change::Down { service, .. } => service,
            };
            let unheard = channels
                .get(service)
                .is_some_and(|tx| tx.send(Arc::clone(change)).is_err());
            if unheard {
                channels.remove(service);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use roster_registry::ProviderId;

    use super::*;

    fn down(service: &str) -> Arc<Change> {
        Arc::new(Change::Down {
            service: ServiceName::new(service).unwrap(),
            provider: ProviderId::new("p").unwrap(),
        })
    }

    #[test]
    fn a_receiver_gets_its_services_changes_only_and_an_unheard_channel_is_dropped() {
        let by = ByService::new(8);
        let web = ServiceName::new("web").unwrap();
        let mut rx = by.subscribe(&web);
        let mut rx2 = by.subscribe(&web);
        by.send(&[down("db"), down("web"), down("api")]);
        assert_eq!(rx.try_recv().unwrap(), down("web"));
        assert!(rx.try_recv().is_err(), "nothing of another service");
        assert_eq!(rx2.try_recv().unwrap(), down("web"));
        drop((rx, rx2));
        by.send(&[down("web")]);
        assert!(
            by.channels.lock().unwrap().is_empty(),
            "the channel nobody hears is gone"
        );
        let mut rx = by.subscribe(&web);
        by.send(&[down("web")]);
        assert_eq!(rx.try_recv().unwrap(), down("web"));
    }
}
