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

mod by_service;
mod chunk;
mod config;
mod conn;
mod handle;
mod limits;
mod node;
mod quiet_log;
mod tls;
mod unauthenticated;
mod unsaved;

use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use roster_registry::Replica;
use tokio::net::TcpListener;
use tokio::sync::{broadcast, mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn, Instrument};

pub use config::{DriverConfig, SnapshotObserver, StartError};
pub use conn::{ClientConn, ClientProtocol, ClientStream};
pub use handle::{DriverError, Handle, NodeCounters};
pub use limits::{DriverCounters, Limits};
pub use tls::{ClientTls, TlsConfig};

use crate::handshake::HandshakeConfig;
use crate::proto::{self, Node, NodeInfo, Resumed};
use config::checked;
use conn::{ConnEvent, InboundGuard, Shared};
use handle::Inner;
use node::{NodeTask, Publish, Status};

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
        zone: config.zone.clone(),
    };
    let seed = getrandom::u64().map_err(StartError::Random)?;
    let guard = config.resume.crash_guard;
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
    let mut shared = Shared::new(
        handshake,
        config.limits,
        config.protocol.max_inbound,
        events_tx,
        shutdown.clone(),
        tls,
        config.clients,
    );
    if let Some(guard) = guard {
        shared.guard_retry_s = guard.peer_retry_after_s();
    }
    shared.on_snapshot = config.on_snapshot;
    let shared = Arc::new(shared);
    shared
        .refuse_peers
        .store(guard.is_some(), std::sync::atomic::Ordering::Relaxed);
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
        let by_service = Arc::new(by_service::ByService::new(EVENT_CAPACITY));
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
                by_service: Arc::clone(&by_service),
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
                by_service,
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
            kept = resumed.kept,
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
