//! A running node's [`Handle`]: what it reads (the replica, counters, peers), the writes
//! and requests it sends the node task and why one failed ([`DriverError`]), and how it
//! stops the node.

use std::net::SocketAddr;
use std::sync::Arc;

use roster_registry::{
    Change, ChangedKeys, Endpoint, InvalidInput, Metadata, ProviderId, Replica, ReplicaId, ServiceName,
};
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use super::conn::Shared;
use super::limits::DriverCounters;
use super::node::{self, Command, Status};
use super::unsaved;
use crate::proto::{self, Node, NodeInfo};

/// Why a handle's request failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DriverError {
    /// The node is shutting down or has stopped; nothing changed.
    #[error("the node has stopped")]
    Stopped,
    /// The registration broke a limit; nothing changed.
    #[error(transparent)]
    Invalid(#[from] InvalidInput),
    /// An item of a bulk write broke a limit; nothing changed.
    #[error("item {index}: {source}")]
    InvalidItem {
        /// Its index in the batch, from 0.
        index: usize,
        /// Why.
        source: InvalidInput,
    },
}

/// What a node has done: the protocol's counters and the driver's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeCounters {
    /// Messages, connections and syncs, from the state machine.
    pub protocol: proto::Counters,
    /// Refusals and limits hit, from the driver.
    pub driver: DriverCounters,
}

/// A running node: register and deregister instances, read the replica, watch changes,
/// read counters, and shut down. Cheap to clone; every clone drives the same node.
///
/// Dropping every handle does not stop the node: cancel its token or call
/// [`Handle::shutdown`].
#[derive(Debug, Clone)]
pub struct Handle {
    pub(super) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(super) struct Inner {
    pub(super) info: NodeInfo,
    pub(super) local_addr: SocketAddr,
    pub(super) commands: mpsc::Sender<Command>,
    pub(super) replica: watch::Receiver<Arc<Replica>>,
    pub(super) changes: broadcast::Sender<Arc<Change>>,
    pub(super) by_service: Arc<super::by_service::ByService>,
    pub(super) status: watch::Receiver<Status>,
    pub(super) unsaved: unsaved::Unsaved,
    pub(super) shared: Arc<Shared>,
    pub(super) shutdown: CancellationToken,
    pub(super) done: watch::Receiver<bool>,
    pub(super) resumed: watch::Receiver<bool>,
}

impl Handle {
    /// Who this node is (its id, name and advertise URL).
    pub fn info(&self) -> &NodeInfo {
        &self.inner.info
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr
    }

    /// The replica as of now: read it for lookups (`instances`, `services`...). No network
    /// is involved; a local write is visible at once, a peer's within milliseconds of its
    /// arrival.
    pub fn replica(&self) -> Arc<Replica> {
        Arc::clone(&self.inner.replica.borrow())
    }

    /// The latest replica snapshot and the keys of the entries changed since the last
    /// call (all empty unless the replica given to [`start`](super::start) tracks its
    /// changes, see [`Replica::track_changes`]): what a store that saves entry by entry must
    /// write for this snapshot, besides its context. Keys a save could not write go back
    /// with [`Handle::give_back_unsaved`].
    pub fn take_unsaved(&self) -> (Arc<Replica>, ChangedKeys) {
        self.inner.unsaved.take(&self.inner.replica)
    }

    /// Keys a save taken with [`Handle::take_unsaved`] did not write: the next take hands
    /// them out again, with a snapshot that holds their latest entries.
    pub fn give_back_unsaved(&self, changed: ChangedKeys) {
        self.inner.unsaved.give_back(changed);
    }

    /// Returns once at least `n` keys changed since the last [`Handle::take_unsaved`] (at
    /// once if they have): a saver that saves once per interval saves a burst sooner. The
    /// node task wakes it once, when the count is reached, not at every change.
    pub async fn unsaved_reached(&self, n: usize) {
        self.inner.unsaved.reached(n).await;
    }

    /// A receiver that sees each new replica snapshot (`changed().await`).
    pub fn watch_replica(&self) -> watch::Receiver<Arc<Replica>> {
        self.inner.replica.clone()
    }

    /// The change events from now on: instances that came up (or changed) or went down.
    /// A subscriber that falls more than 1,024 events behind gets `Lagged` and should
    /// re-read the replica. Each change is shared by every subscriber, not copied for each.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Change>> {
        self.inner.changes.subscribe()
    }

    /// As [`Handle::subscribe`], for the changes of `service` only: a watch of one service
    /// is not woken by the others'.
    pub fn subscribe_service(&self, service: &ServiceName) -> broadcast::Receiver<Arc<Change>> {
        self.inner.by_service.subscribe(service)
    }

    /// What the node has done so far.
    pub fn counters(&self) -> NodeCounters {
        NodeCounters {
            protocol: self.inner.status.borrow().counters,
            driver: self.inner.shared.counts.snapshot(),
        }
    }

    /// The peers with an open, authenticated connection, and whether we dialed it.
    pub fn connected(&self) -> Vec<(ReplicaId, bool)> {
        self.inner.status.borrow().connected.clone()
    }

    /// Waits until every change this node has made so far was handed to the connection
    /// of every connected peer that takes pushes (`proto::Node::pushed_through`): within a
    /// push, a few milliseconds; at most a second, for a peer that catches up by digest
    /// instead. Returns at once if the node has stopped.
    pub async fn pushed(&self) {
        let (reply, answer) = oneshot::channel();
        if self.inner.commands.send(Command::Pushed(reply)).await.is_ok() {
            let _ = answer.await;
        }
    }

    /// Whether the node has caught up with a peer once (or has no seeds): see
    /// `proto::Node::synced`.
    pub fn is_synced(&self) -> bool {
        self.inner.status.borrow().synced
    }

    /// Waits until [`Handle::is_synced`]. Returns at once if it is; never if no peer is
    /// ever reached (bound it with a timeout). Returns early, unsynced, if the node stops.
    pub async fn synced(&self) {
        let mut status = self.inner.status.clone();
        let _ = status.wait_for(|s| s.synced).await;
    }

    /// Registers (or updates) an instance this node owns; it lives by the node's lease
    /// (`Config::member_lease_ttl_ms`), which the node renews. The cluster hears of it
    /// within a push delay.
    ///
    /// # Errors
    /// [`DriverError::Invalid`] when the metadata break a limit, or
    /// [`DriverError::Stopped`]; nothing changed either way.
    pub async fn register(
        &self,
        service: ServiceName,
        provider: ProviderId,
        endpoint: Endpoint,
        meta: Metadata,
    ) -> Result<(), DriverError> {
        let (reply, answer) = oneshot::channel();
        let cmd = Command::Register {
            service,
            provider,
            endpoint,
            meta,
            reply,
        };
        self.ask(cmd, answer).await?
    }

    /// Registers (or updates) many instances this node owns in one delta: one push to
    /// peers and one published snapshot for the lot (see [`Handle::register`]).
    ///
    /// # Errors
    /// [`DriverError::InvalidItem`] naming the first item whose metadata break a limit, or
    /// [`DriverError::Stopped`]; nothing changed either way.
    pub async fn register_many(
        &self,
        items: Vec<std::sync::Arc<proto::OwnedRegistration>>,
    ) -> Result<(), DriverError> {
        let (reply, answer) = oneshot::channel();
        self.ask(Command::RegisterMany { items, reply }, answer).await?
    }

    /// Removes an instance this node owns. Returns whether there was one.
    ///
    /// # Errors
    /// [`DriverError::Stopped`] when the node has stopped.
    pub async fn deregister(&self, service: ServiceName, provider: ProviderId) -> Result<bool, DriverError> {
        let (reply, answer) = oneshot::channel();
        self.ask(
            Command::Deregister {
                service,
                provider,
                reply,
            },
            answer,
        )
        .await?
    }

    /// Writes `node` dead for every replica now (an operator's force-leave); refused for
    /// a node that answers. See [`proto::Node::force_dead`].
    ///
    /// # Errors
    /// [`DriverError::Stopped`] when the node has stopped.
    pub async fn force_dead(&self, node: ReplicaId) -> Result<proto::ForcedDeath, DriverError> {
        let (reply, answer) = oneshot::channel();
        self.ask(Command::ForceDead { node, reply }, answer).await?
    }

    /// Removes an instance whatever node owns it (an operator's removal). Returns whether
    /// there was one. See [`proto::Node::remove_as_operator`].
    ///
    /// # Errors
    /// [`DriverError::Stopped`] when the node has stopped.
    pub async fn remove_as_operator(
        &self,
        service: ServiceName,
        provider: ProviderId,
    ) -> Result<bool, DriverError> {
        let (reply, answer) = oneshot::channel();
        let cmd = Command::RemoveAsOperator {
            service,
            provider,
            reply,
        };
        self.ask(cmd, answer).await?
    }

    /// Runs `f` on the node task with the protocol state machine and the wall time, and
    /// returns what it returns: for reads the replica snapshot does not answer (members,
    /// acknowledgements).
    ///
    /// # Errors
    /// [`DriverError::Stopped`] when the node has stopped.
    pub async fn inspect<T, F>(&self, f: F) -> Result<T, DriverError>
    where
        T: Send + 'static,
        F: FnOnce(&Node, u64) -> T + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let run = Box::new(move |node: &Node, now: u64| {
            let _ = reply.send(f(node, now));
        });
        self.ask(Command::Inspect(node::Inspect(run)), answer).await
    }

    /// When this node last exchanged state with each peer: the wall time (ms) of the last
    /// message from it the state machine took (a change, an acknowledgement, a digest or a
    /// state hash; WebSocket pings are not counted), since this process started. Peers it
    /// never had a connection with are absent.
    ///
    /// # Errors
    /// [`DriverError::Stopped`] when the node has stopped.
    pub async fn exchanged(&self) -> Result<Vec<(ReplicaId, u64)>, DriverError> {
        let (reply, answer) = oneshot::channel();
        self.ask(Command::Exchanged(reply), answer).await
    }

    /// Asks a connected peer for an anti-entropy round now. Returns whether one was
    /// connected.
    ///
    /// # Errors
    /// [`DriverError::Stopped`] when the node has stopped.
    pub async fn sync_now(&self) -> Result<bool, DriverError> {
        let (reply, answer) = oneshot::channel();
        self.ask(Command::SyncNow(reply), answer).await
    }

    async fn ask<T>(&self, cmd: Command, answer: oneshot::Receiver<T>) -> Result<T, DriverError> {
        self.inner
            .commands
            .send(cmd)
            .await
            .map_err(|_| DriverError::Stopped)?;
        answer.await.map_err(|_| DriverError::Stopped)
    }

    /// Leaves the cluster gracefully and waits until the node has stopped: stop accepting
    /// and dialing, remove this node's registrations and push that to every connected
    /// peer, say goodbye, flush and close every connection, all within
    /// [`Limits::shutdown_deadline`](super::Limits::shutdown_deadline) (then the rest is
    /// cut).
    pub async fn shutdown(&self) {
        self.inner.shutdown.cancel();
        let mut done = self.inner.done.clone();
        // An error means the node task is gone already.
        let _ = done.wait_for(|d| *d).await;
    }

    /// Stops to start again, and waits until the node has stopped: as
    /// [`Handle::shutdown`], but this node's registrations are not removed. Every change
    /// connected peers lack is pushed before the goodbye, and peers keep the node and what
    /// it owns for the rest of its lease (see `proto::Node::stop`). A shutdown already
    /// under way goes on as it began.
    pub async fn stop(&self) {
        if !self.inner.shutdown.is_cancelled() {
            self.inner
                .shared
                .leave
                .store(false, std::sync::atomic::Ordering::SeqCst);
        }
        self.inner.shutdown.cancel();
        let mut done = self.inner.done.clone();
        // An error means the node task is gone already.
        let _ = done.wait_for(|d| *d).await;
    }

    /// Turns the crash-loop guard on or off (see `proto::Node::set_crash_guard`). Under it
    /// the node also turns dialing peers away (`503`, a `Retry-After` of the guard's window
    /// to half as long again): it dials out itself when its lease needs renewing.
    ///
    /// # Errors
    /// [`DriverError::Stopped`] when the node has stopped.
    pub async fn set_crash_guard(&self, on: bool) -> Result<(), DriverError> {
        self.inner
            .shared
            .refuse_peers
            .store(on, std::sync::atomic::Ordering::Relaxed);
        self.inner
            .commands
            .send(Command::CrashGuard(on))
            .await
            .map_err(|_| DriverError::Stopped)
    }

    /// Waits until the node has written its own registrations again (at start, before it
    /// talks to any peer), so a read shows them; until then reads show the replica as
    /// it was loaded. Returns at once after that, and when the node has stopped.
    pub async fn resumed(&self) {
        let mut resumed = self.inner.resumed.clone();
        let _ = resumed.wait_for(|r| *r).await;
    }

    /// Waits until the node has stopped (without asking it to).
    pub async fn stopped(&self) {
        let mut done = self.inner.done.clone();
        let _ = done.wait_for(|d| *d).await;
    }

    /// Whether the node has stopped.
    pub fn is_stopped(&self) -> bool {
        *self.inner.done.borrow()
    }
}
