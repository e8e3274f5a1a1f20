//! Watches: a service's instances, then its changes, as a stream of events.

use std::collections::{BTreeMap, VecDeque};
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::Stream;
use roster_registry::{Change, ServiceName};
use tokio::sync::broadcast;

use super::{now_ms, Event, Instance, Node};

impl Node {
    /// The instances of `service` now (as `Up` events), then every change as it arrives:
    /// pushed by peers, no polling. A watch that falls behind re-reads the replica and
    /// reports the difference, so it never misses a final state.
    pub fn watch(&self, service: &str) -> Watch {
        self.watch_from(service, &BTreeMap::new())
    }

    /// As [`Node::watch`], for a watcher that already shows `shown` (instance id to the
    /// [`crate::api::fingerprint`] of its address and metadata): first an `Up` for each
    /// instance new or changed since, and a `Down` for each one gone, then every change.
    pub(crate) fn watch_from(&self, service: &str, shown: &BTreeMap<String, u64>) -> Watch {
        let rx = self.inner.handle.subscribe();
        let name = ServiceName::new(service).ok();
        let mut known = BTreeMap::new();
        let mut pending = VecDeque::new();
        if let Some(name) = &name {
            let replica = self.inner.handle.replica();
            for i in replica.instances(name, now_ms()) {
                let i = Instance::from_registry(&i.to_owned());
                known.insert(i.id.clone(), i.clone());
                // The fingerprint of what a client shows: the view it was sent.
                let v = i.view();
                if shown.get(&i.id) != Some(&crate::api::fingerprint(&v.address, &v.meta)) {
                    pending.push_back(Event::Up(i));
                }
            }
            for id in shown.keys().filter(|id| !known.contains_key(*id)) {
                pending.push_back(Event::Down {
                    service: service.to_string(),
                    id: id.clone(),
                    address: String::new(),
                });
            }
        }
        let state = WatchState {
            node: self.clone(),
            rx,
            name,
            known,
            pending,
        };
        Watch {
            inner: Box::pin(futures_util::stream::unfold(state, |mut st| async move {
                let e = st.next().await?;
                Some((e, st))
            })),
        }
    }
}

struct WatchState {
    node: Node,
    rx: broadcast::Receiver<Change>,
    name: Option<ServiceName>,
    known: BTreeMap<String, Instance>,
    pending: VecDeque<Event>,
}

impl WatchState {
    async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(e) = self.pending.pop_front() {
                return Some(e);
            }
            let name = self.name.clone()?;
            let handle = self.node.inner.handle.clone();
            let received = tokio::select! {
                r = self.rx.recv() => r,
                () = handle.stopped() => return None,
            };
            match received {
                Ok(Change::Up(i)) if i.service == name => {
                    let i = Instance::from_registry(&i);
                    if self.known.get(&i.id) != Some(&i) {
                        self.known.insert(i.id.clone(), i.clone());
                        return Some(Event::Up(i));
                    }
                }
                Ok(Change::Down { service, provider }) if service == name => {
                    if let Some(gone) = self.known.remove(provider.as_str()) {
                        return Some(Event::Down {
                            service: service.as_str().to_string(),
                            id: provider.as_str().to_string(),
                            address: gone.address,
                        });
                    }
                }
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => self.resync(&name),
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }

    /// After falling behind: report the difference between what this watch showed and the
    /// replica now.
    fn resync(&mut self, name: &ServiceName) {
        let replica = self.node.inner.handle.replica();
        let now: BTreeMap<String, Instance> = replica
            .instances(name, now_ms())
            .map(|i| {
                let i = Instance::from_registry(&i.to_owned());
                (i.id.clone(), i)
            })
            .collect();
        for (id, gone) in &self.known {
            if !now.contains_key(id) {
                self.pending.push_back(Event::Down {
                    service: name.as_str().to_string(),
                    id: id.clone(),
                    address: gone.address.clone(),
                });
            }
        }
        for (id, i) in &now {
            if self.known.get(id) != Some(i) {
                self.pending.push_back(Event::Up(i.clone()));
            }
        }
        self.known = now;
    }
}

/// The changes of one service: a [`Stream`] of [`Event`]s. See [`Node::watch`].
pub struct Watch {
    inner: Pin<Box<dyn Stream<Item = Event> + Send>>,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Watch")
    }
}

impl Watch {
    /// The next change; `None` when the node stopped.
    pub async fn recv(&mut self) -> Option<Event> {
        futures_util::StreamExt::next(self).await
    }
}

impl Stream for Watch {
    type Item = Event;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        self.inner.as_mut().poll_next(cx)
    }
}
