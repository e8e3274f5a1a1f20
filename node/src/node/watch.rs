//! Watches: a service's instances, then its changes, as a stream of events.

use std::collections::{BTreeMap, VecDeque};
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::Stream;
use roster_registry::{Change, ServiceName};
use tokio::sync::broadcast;

use super::{now_ms, Event, Instance, Node};

impl Node {
    /// The served instances of `service` now (as `Up` events), then every change as it
    /// arrives: pushed by peers, no polling. An instance that turns critical or goes into
    /// maintenance is `Down` for this watch, and `Up` again when it is served; a change of
    /// status between passing and warning is a `Status` event. A watch that falls behind
    /// re-reads the replica and reports the difference, so it never misses a final state.
    pub fn watch(&self, service: &str) -> Watch {
        self.watch_from(service, &BTreeMap::new(), false)
    }

    /// As [`Node::watch`], for every instance whatever its status: a change of status is
    /// a `Status` event.
    pub fn watch_all(&self, service: &str) -> Watch {
        self.watch_from(service, &BTreeMap::new(), true)
    }

    /// As [`Node::watch`] (or [`Node::watch_all`]), for a watcher that already shows
    /// `shown` (instance id to the [`crate::api::fingerprint`] of what it shows): first an
    /// `Up` for each instance new or changed since, and a `Down` for each one gone, then
    /// every change. `all`: as [`Node::watch_all`].
    pub fn watch_from(&self, service: &str, shown: &BTreeMap<String, u64>, all: bool) -> Watch {
        let name = ServiceName::new(service).ok();
        // Subscribed before the read below, so no change falls between the two.
        let rx = match &name {
            Some(name) => self.inner.handle.subscribe_service(name),
            None => self.inner.handle.subscribe(),
        };
        let mut known = BTreeMap::new();
        let mut pending = VecDeque::new();
        if let Some(name) = &name {
            known = read(self, name, all);
            for i in known.values() {
                // The fingerprint of what a client shows: the view it was sent.
                if shown.get(&i.id) != Some(&crate::api::fingerprint(&i.view())) {
                    pending.push_back(Event::Up(i.clone()));
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
            all,
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

/// The instances of `name` a watch shows: every live one with `all`, else the served ones.
fn read(node: &Node, name: &ServiceName, all: bool) -> BTreeMap<String, Instance> {
    node.inner
        .handle
        .replica()
        .instances(name, now_ms())
        .map(|i| Instance::from_ref(&i))
        .filter(|i| all || node.serves(i))
        .map(|i| (i.id.clone(), i))
        .collect()
}

struct WatchState {
    node: Node,
    rx: broadcast::Receiver<std::sync::Arc<Change>>,
    name: Option<ServiceName>,
    all: bool,
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
            let change = match received {
                Ok(c) => c,
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    self.resync(&name);
                    continue;
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            };
            // Its service's channel brings only its changes; the names are checked anyway.
            match &*change {
                Change::Up(i) if i.service == name => {
                    let i = Instance::from_registry(i);
                    if self.all || self.node.serves(&i) {
                        if let Some(e) = self.show(i) {
                            return Some(e);
                        }
                    } else if let Some(e) = self.hide(&i.id) {
                        return Some(e);
                    }
                }
                Change::Down { service, provider } if *service == name => {
                    if let Some(e) = self.hide(provider.as_str()) {
                        return Some(e);
                    }
                }
                _ => {}
            }
        }
    }

    /// The event for `i` shown now: `Up` when it is new to the watch or its address or
    /// metadata changed, `Status` when only its status did, nothing when nothing shown did.
    fn show(&mut self, i: Instance) -> Option<Event> {
        let e = match self.known.get(&i.id) {
            Some(was) if was.shows_as(&i) => None,
            Some(was) if (&was.address, &was.meta) == (&i.address, &i.meta) => Some(Event::Status(i.clone())),
            _ => Some(Event::Up(i.clone())),
        };
        self.known.insert(i.id.clone(), i);
        e
    }

    /// The `Down` for instance `id` when this watch showed it.
    fn hide(&mut self, id: &str) -> Option<Event> {
        let gone = self.known.remove(id)?;
        Some(Event::Down {
            service: gone.service,
            id: gone.id,
            address: gone.address,
        })
    }

    /// After falling behind: report the difference between what this watch showed and the
    /// replica now.
    fn resync(&mut self, name: &ServiceName) {
        let now = read(&self.node, name, self.all);
        let gone: Vec<String> = self
            .known
            .keys()
            .filter(|id| !now.contains_key(*id))
            .cloned()
            .collect();
        for id in gone {
            let e = self.hide(&id);
            self.pending.extend(e);
        }
        for i in now.into_values() {
            let e = self.show(i);
            self.pending.extend(e);
        }
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
