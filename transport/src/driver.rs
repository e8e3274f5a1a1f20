//! The tokio driver: it runs a [`Node`] (the protocol state machine) over WebSockets.
//!
//! [`start`] takes an already-bound listener and a shutdown token, and returns a [`Handle`].
//! Inside:
//! - one **node task** owns the [`Node`]: it feeds it connection events, the handle's
//!   commands and timeouts, and carries out its outputs (sends, dials, closes, events);
//! - an **accept task** takes inbound TCP connections (up to `max_inbound`, counted before
//!   the handshake, and up to `max_unauthenticated_per_address` not yet authenticated from
//!   one address);
//! - one task per **connection** (inbound, or dialed when the node says `Dial`) does the
//!   WebSocket upgrade (subprotocol `roster.v1`), the [`crate::handshake`], then moves
//!   frames both ways. The per-connection code is generic over the byte stream.
//!
//! Everything from outside is bounded ([`Limits`]): frame size, message size, the handshake
//! time, inbound connections, frames per second per connection, the send queue per
//! connection (in messages and in bytes), and entries per delta (checked by
//! [`crate::message::decode_delta`]). Going over a limit closes that connection with a
//! reason, counts it ([`DriverCounters`]) and logs it (refusals from one address once a
//! minute); the node and its replica are untouched. A connection on which nothing arrived
//! for [`Limits::dead_after`] (a quiet one is pinged first) is closed as dead, so a silent
//! partition frees its slot.
//!
//! Messages larger than a frame (a full state of a large registry, say) cross in chunks:
//! after the handshake, each binary WebSocket message starts with a tag byte, `0x00` for a
//! whole message, `0x01` for a first chunk (followed by the message's total length, a
//! little-endian `u64`), `0x02` for the chunks that follow. The receiver holds at most one
//! partial message per connection, refuses one announced over
//! [`Limits::max_envelope_bytes`] at its first chunk, and decodes it only when complete.
//! Details and the reasons for this format are in the `chunk` module.
//!
//! Shutdown is a protocol step ([`Handle::shutdown`], or cancelling the token): stop
//! accepting and dialing, [`Node::shutdown`] (which removes what this node owns and pushes
//! that farewell delta to every connected peer, then says goodbye), let each connection
//! flush its queue and close, and cut whatever is left at [`Limits::shutdown_deadline`].
//! [`Handle::stop`] does the same with [`Node::stop`]: nothing removed, every pending
//! change pushed, then goodbye (a restart, which peers do not see as a departure).
//!
//! With a [`TlsConfig`] the node serves `wss://` only (rustls, `ring` provider): TLS under the
//! WebSocket, the handshake inside it. TLS is mutual: a peer without a certificate of the
//! CA is refused (a client too, unless on loopback), and a peer may speak only as the node
//! its certificate names (the DNS name `node-<id>`).
//!
//! Reads are local: [`Handle::replica`] is a snapshot shared with the node task, published
//! after each local write and at most every few milliseconds while deltas arrive.

mod admit;
mod chunk;
mod conn;
mod limits;
mod node;
mod quiet_log;
mod tls;
mod unsaved;

use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use roster_registry::{
    Change, ChangedKeys, Endpoint, InvalidInput, Metadata, ProviderId, Replica, ReplicaId, ServiceName,
};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn, Instrument};

pub use conn::{ClientConn, ClientProtocol, ClientStream};
pub use limits::{DriverCounters, Limits};
pub use tls::{ClientTls, TlsConfig};

use crate::handshake::{HandshakeConfig, Secret, MAX_CLUSTER_LEN, MAX_NAME_LEN, MAX_URL_LEN};
use crate::proto::{self, Node, NodeInfo, Resumed};
use conn::{ConnEvent, InboundGuard, Shared};
use node::{Command, NodeTask, Publish, Status};

/// Change events a subscriber may fall behind by before it is told it lagged.
const EVENT_CAPACITY: usize = 1_024;
/// Connection events queued to the node task (readers wait when it is full).
const EVENT_QUEUE: usize = 1_024;
/// Commands queued from handles.
const COMMAND_QUEUE: usize = 256;
/// Pause after a failed accept (out of file descriptors, say) before trying again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The wall clock in milliseconds since the epoch, as the state machine takes it.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The two clocks the state machine takes: a monotonic one (tokio's, which tests may pause)
/// for its timers, counted from the wall time at start so both read alike until the wall
/// clock steps; and the wall clock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clocks {
    start: tokio::time::Instant,
    start_wall_ms: u64,
}

impl Clocks {
    pub(crate) fn start() -> Self {
        Self {
            start: tokio::time::Instant::now(),
            start_wall_ms: now_ms(),
        }
    }

    /// Both clocks now.
    pub(crate) fn now(&self) -> proto::Now {
        let ran = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        proto::Now {
            mono_ms: self.start_wall_ms.saturating_add(ran),
            wall_ms: now_ms(),
        }
    }
}

/// How to run a node.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    /// The cluster name; peers of another cluster are refused.
    pub cluster: String,
    /// This node's name (for people and logs).
    pub name: String,
    /// The URL peers dial; `None` uses the listener's address, as `ws://`, or `wss://`
    /// with TLS.
    pub advertise_url: Option<String>,
    /// The cluster secret. Without one, the node runs unauthenticated and may listen on
    /// loopback only.
    pub secret: Option<Secret>,
    /// The protocol's knobs.
    pub protocol: proto::Config,
    /// Limits on peers.
    pub limits: Limits,
    /// TLS: when set, the node serves `wss://` only and can dial `wss://` peers.
    pub tls: Option<TlsConfig>,
    /// What a node resuming from disk writes again before it talks to a peer
    /// ([`Node::finish_resume`]).
    pub resume: proto::Resume,
    /// The application's protocol for clients: connections that ask for it go there after
    /// the upgrade; `None` refuses them. They count under the inbound cap.
    pub clients: Option<ClientProtocol>,
}

impl DriverConfig {
    /// A configuration with default protocol knobs and limits, no secret, and the
    /// listener's address as advertise URL.
    pub fn new(cluster: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            cluster: cluster.into(),
            name: name.into(),
            advertise_url: None,
            secret: None,
            protocol: proto::Config::default(),
            limits: Limits::default(),
            tls: None,
            resume: proto::Resume::default(),
            clients: None,
        }
    }
}

/// Why a node could not start. Nothing was spawned.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// No secret, and the listener is not on loopback.
    #[error(
        "no cluster secret: a node without one may listen on loopback only, not on {addr}; \
         configure a secret"
    )]
    Unauthenticated {
        /// The listener's address.
        addr: SocketAddr,
    },
    /// The listener has no local address.
    #[error("the listener has no local address: {0}")]
    Listener(#[source] std::io::Error),
    /// A name or URL is empty or too long.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The state machine refused the node's identity (its URL has no host and port, say).
    #[error(transparent)]
    Node(#[from] InvalidInput),
    /// A TLS file could not be read or used.
    #[error("TLS: {0}")]
    Tls(String),
    /// The OS gave no random seed.
    #[error("no random seed from the OS: {0}")]
    Random(getrandom::Error),
}

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
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    info: NodeInfo,
    local_addr: SocketAddr,
    commands: mpsc::Sender<Command>,
    replica: watch::Receiver<Arc<Replica>>,
    changes: broadcast::Sender<Change>,
    status: watch::Receiver<Status>,
    unsaved: unsaved::Unsaved,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    done: watch::Receiver<bool>,
    resumed: watch::Receiver<bool>,
}

/// Starts a node on `listener` (already bound: tests bind `127.0.0.1:0`), resuming
/// `replica` (empty for a new node, its id the node's), and joining through `seeds`
/// (`ws://host:port` URLs). It runs until `shutdown` is cancelled or
/// [`Handle::shutdown`] is called. Call it within a tokio runtime.
///
/// # Errors
/// [`StartError`] when the configuration is refused; nothing was spawned.
pub fn start(
    listener: TcpListener,
    config: DriverConfig,
    replica: Replica,
    seeds: Vec<String>,
    shutdown: CancellationToken,
) -> Result<Handle, StartError> {
    let (local_addr, tls, url) = checked(&listener, &config)?;
    let info = NodeInfo {
        id: replica.id(),
        name: config.name.clone(),
        url: url.clone(),
    };
    let seed = getrandom::u64().map_err(StartError::Random)?;
    let guarded = config.resume.crash_guard;
    let clocks = Clocks::start();
    // Own registrations are written again by the node task, first thing: reads are served
    // from the replica as loaded meanwhile (see `Handle::resumed`).
    let (node, pending) = Node::with_deferred_resume(
        info.clone(),
        replica,
        seeds,
        config.protocol,
        seed,
        clocks.now(),
        config.resume,
    )?;

    let shutdown = shutdown.child_token();
    let (events_tx, events_rx) = mpsc::channel(EVENT_QUEUE);
    let handshake = HandshakeConfig {
        cluster: config.cluster.clone(),
        node: info.clone(),
        secret: config.secret.clone(),
        max_skew_ms: config.protocol.max_skew_ms,
    };
    let shared = Arc::new(Shared::new(
        handshake,
        config.limits,
        config.protocol.max_inbound,
        events_tx,
        shutdown.clone(),
        tls,
        config.clients,
    ));
    shared
        .refuse_peers
        .store(guarded, std::sync::atomic::Ordering::Relaxed);
    if config.secret.is_none() {
        warn!(node = info.name, %local_addr, "no cluster secret: peers are not authenticated (loopback only)");
    }
    info!(node = info.name, id = %info.id, %url, cluster = config.cluster, "listening");
    let launch = Launch {
        node,
        pending,
        clocks,
        info,
        local_addr,
        shared,
        events: events_rx,
        shutdown,
    };
    Ok(launch.spawn(listener))
}

/// The listener's address, the TLS files loaded, and the advertised URL, once the
/// configuration is found sound.
fn checked(
    listener: &TcpListener,
    config: &DriverConfig,
) -> Result<(SocketAddr, Option<tls::Tls>, String), StartError> {
    let local_addr = listener.local_addr().map_err(StartError::Listener)?;
    if config.secret.is_none() && !local_addr.ip().is_loopback() {
        return Err(StartError::Unauthenticated { addr: local_addr });
    }
    config.limits.check().map_err(StartError::Config)?;
    let tls = config
        .tls
        .as_ref()
        .map(tls::Tls::load)
        .transpose()
        .map_err(StartError::Tls)?;
    let scheme = if tls.is_some() { "wss" } else { "ws" };
    let url = config
        .advertise_url
        .clone()
        .unwrap_or_else(|| format!("{scheme}://{local_addr}"));
    for (what, value, max) in [
        ("cluster name", &config.cluster, MAX_CLUSTER_LEN),
        ("node name", &config.name, MAX_NAME_LEN),
        ("advertise URL", &url, MAX_URL_LEN),
    ] {
        if value.is_empty() || value.len() > max {
            return Err(StartError::Config(format!(
                "the {what} must have 1 to {max} bytes"
            )));
        }
    }
    Ok((local_addr, tls, url))
}

/// What a node's tasks start from, once its configuration was accepted.
struct Launch {
    node: Node,
    /// What it writes again first (see [`Node::finish_resume`]).
    pending: proto::Resume,
    clocks: Clocks,
    info: NodeInfo,
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    events: mpsc::Receiver<ConnEvent>,
    shutdown: CancellationToken,
}

impl Launch {
    /// Spawns the accept loop and the node task; the handle reads what they publish.
    fn spawn(mut self, listener: TcpListener) -> Handle {
        let (commands_tx, commands_rx) = mpsc::channel(COMMAND_QUEUE);
        let (changes, _) = broadcast::channel(EVENT_CAPACITY);
        // What resuming changed is the first snapshot's to save.
        let unsaved = unsaved::Unsaved::default();
        if let Some(changed) = self.node.take_changed() {
            unsaved.give_back(changed);
        }
        let (replica_tx, replica_rx) = watch::channel(Arc::new(self.node.replica().clone()));
        let (status_tx, status_rx) = watch::channel(Status::default());
        let (done_tx, done_rx) = watch::channel(false);
        let (resumed_tx, resumed_rx) = watch::channel(false);
        let tracker = TaskTracker::new();
        let span = tracing::info_span!("roster", node = %self.info.name);
        tracker
            .spawn(accept_loop(listener, Arc::clone(&self.shared), tracker.clone()).instrument(span.clone()));
        let mut task = NodeTask::new(
            self.node,
            self.clocks,
            Arc::clone(&self.shared),
            tracker,
            commands_rx,
            self.events,
            Publish {
                changes: changes.clone(),
                replica: replica_tx,
                status: status_tx,
                unsaved: unsaved.clone(),
            },
        );
        let (name, pending) = (self.info.name.clone(), self.pending);
        tokio::spawn(
            async move {
                log_resumed(&name, &task.finish_resume(pending));
                resumed_tx.send_replace(true);
                task.run().await;
                done_tx.send_replace(true);
            }
            .instrument(span),
        );
        Handle {
            inner: Arc::new(Inner {
                info: self.info,
                local_addr: self.local_addr,
                commands: commands_tx,
                replica: replica_rx,
                changes,
                status: status_rx,
                unsaved,
                shared: self.shared,
                shutdown: self.shutdown,
                done: done_rx,
                resumed: resumed_rx,
            }),
        }
    }
}

fn log_resumed(node: &str, resumed: &Resumed) {
    if resumed.rewritten + resumed.refused + resumed.removed > 0 || resumed.gap > 0 {
        info!(
            node,
            rewritten = resumed.rewritten,
            refused = resumed.refused,
            removed = resumed.removed,
            gap = resumed.gap,
            "resumed: own registrations written again"
        );
    }
}

/// Takes inbound connections until shutdown, dropping at once those over the inbound cap.
async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, tracker: TaskTracker) {
    let inbound = Arc::new(AtomicUsize::new(0));
    let node = shared.handshake.node.name.clone();
    loop {
        let accepted = tokio::select! {
            () = shared.shutdown.cancelled() => break,
            r = listener.accept() => r,
        };
        let (tcp, addr) = match accepted {
            Ok(x) => x,
            Err(e) => {
                warn!(node, "accept failed: {e}");
                tokio::select! {
                    () = shared.shutdown.cancelled() => break,
                    () = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                }
            }
        };
        // Repeated refusals from one address make one log line a minute.
        let gated = |shared: &Shared| shared.log_gate.admit(addr.ip(), tokio::time::Instant::now());
        let max_pending = shared.limits.max_unauthenticated_per_address;
        let Some(pending) = shared.unauthenticated.admit(addr.ip(), max_pending) else {
            limits::bump(&shared.counts.unauthenticated_over_cap);
            if let Some(n) = gated(&shared) {
                warn!(
                    node,
                    peer = %addr,
                    "dropped an inbound connection: {max_pending} from that address are not \
                     authenticated yet (max_unauthenticated_per_address; {n} more refusals from \
                     it in the last minute not logged)"
                );
            }
            continue;
        };
        if inbound.load(std::sync::atomic::Ordering::Relaxed) >= shared.max_inbound {
            limits::bump(&shared.counts.inbound_over_cap);
            if let Some(n) = gated(&shared) {
                warn!(
                    node,
                    peer = %addr,
                    "dropped an inbound connection: {} already open (max_inbound; {n} more \
                     refusals from that address in the last minute not logged)",
                    shared.max_inbound
                );
            }
            continue;
        }
        limits::bump(&shared.counts.inbound_accepted);
        let _ = tcp.set_nodelay(true);
        let guard = InboundGuard::new(Arc::clone(&inbound));
        tracker.spawn(conn::inbound(tcp, addr, Arc::clone(&shared), guard, pending).in_current_span());
    }
    info!(node, "stopped accepting connections");
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
    /// call (all empty unless the replica given to [`start`] tracks its changes, see
    /// [`Replica::track_changes`]): what a store that saves entry by entry must write for
    /// this snapshot, besides its context. Keys a save could not write go back with
    /// [`Handle::give_back_unsaved`].
    pub fn take_unsaved(&self) -> (Arc<Replica>, ChangedKeys) {
        self.inner.unsaved.take(&self.inner.replica)
    }

    /// Keys a save taken with [`Handle::take_unsaved`] did not write: the next take hands
    /// them out again, with a snapshot that holds their latest entries.
    pub fn give_back_unsaved(&self, changed: ChangedKeys) {
        self.inner.unsaved.give_back(changed);
    }

    /// A receiver that sees each new replica snapshot (`changed().await`).
    pub fn watch_replica(&self) -> watch::Receiver<Arc<Replica>> {
        self.inner.replica.clone()
    }

    /// The change events from now on: instances that came up (or changed) or went down.
    /// A subscriber that falls more than 1,024 events behind gets `Lagged` and should
    /// re-read the replica.
    pub fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.inner.changes.subscribe()
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
    pub async fn register_many(&self, items: Vec<proto::OwnedRegistration>) -> Result<(), DriverError> {
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
    /// [`Limits::shutdown_deadline`] (then the rest is cut).
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
    /// the node also turns dialing peers away (`503`, `Retry-After` of 5 to 7.5 minutes):
    /// it dials out itself when its lease needs renewing.
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
