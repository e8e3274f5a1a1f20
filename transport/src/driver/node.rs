//! The node task: the one owner of the protocol state machine. It feeds it connection
//! events, commands from handles and timeouts, and carries out what it outputs.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use roster_registry::{
    CausalContext, Change, Endpoint, Metadata, ProviderId, Replica, ReplicaId, ServiceName,
};
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::time::{sleep_until, Instant};
use tokio_util::task::TaskTracker;
use tracing::{debug, info, trace, warn, Instrument};

use super::conn::{self, ConnEvent, Cut, Outbox, Outgoing, Shared};
use super::limits::bump;
use super::quiet_log::QuietLog;
use super::{Clocks, DriverError};
use crate::message::Message;
use crate::proto::{ConnId, Counters, Node, Output, ProtocolError, Resume, Resumed};

/// The least time between two published replica snapshots, so a burst of deltas costs
/// one copy, not one per delta. A handle's own writes are published at once.
const SNAPSHOT_INTERVAL: Duration = Duration::from_millis(10);
/// Snapshots are spaced further if copying is slow: it may take at most a tenth of the
/// node task's time. (A copy shares the replica's maps, so it costs microseconds.)
const SNAPSHOT_COST_FACTOR: u32 = 10;
/// The longest the node task sleeps without asking the state machine again.
const MAX_SLEEP: Duration = Duration::from_secs(1);
/// How long cut connections get to finish after the shutdown deadline.
const ABORT_GRACE: Duration = Duration::from_millis(500);

/// What a handle asks of the node task.
#[derive(Debug)]
pub(super) enum Command {
    Register {
        service: ServiceName,
        provider: ProviderId,
        endpoint: Endpoint,
        meta: Metadata,
        reply: oneshot::Sender<Result<(), DriverError>>,
    },
    RegisterMany {
        items: Vec<std::sync::Arc<crate::proto::OwnedRegistration>>,
        reply: oneshot::Sender<Result<(), DriverError>>,
    },
    Deregister {
        service: ServiceName,
        provider: ProviderId,
        reply: oneshot::Sender<Result<bool, DriverError>>,
    },
    Inspect(Inspect),
    /// An operator's force-leave of a node (see [`crate::proto::Node::force_dead`]).
    ForceDead {
        node: ReplicaId,
        reply: oneshot::Sender<Result<crate::proto::ForcedDeath, DriverError>>,
    },
    /// An operator's removal of an instance whatever node owns it.
    RemoveAsOperator {
        service: ServiceName,
        provider: ProviderId,
        reply: oneshot::Sender<Result<bool, DriverError>>,
    },
    /// Answered once what the node wrote so far was handed to every connected peer.
    Pushed(oneshot::Sender<()>),
    SyncNow(oneshot::Sender<bool>),
    CrashGuard(bool),
    /// When each peer last sent a message the state machine took (see `Handle::exchanged`).
    Exchanged(oneshot::Sender<Vec<(ReplicaId, u64)>>),
}

/// A read run on the node task, given the state machine and the wall time.
pub(super) type InspectFn = dyn FnOnce(&Node, u64) + Send;

/// A read run on the node task.
pub(super) struct Inspect(pub Box<InspectFn>);

impl std::fmt::Debug for Inspect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Inspect")
    }
}

/// What handles read of the node besides its replica.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Status {
    pub counters: Counters,
    pub connected: Vec<(ReplicaId, bool)>,
    /// See `proto::Node::synced`.
    pub synced: bool,
}

/// The channels the node task publishes on.
#[derive(Debug)]
pub(super) struct Publish {
    /// Shared: a subscriber that does not look at a change (a watch of another service,
    /// a signal) does not copy it.
    pub changes: broadcast::Sender<Arc<Change>>,
    /// The same changes, on a channel per watched service.
    pub by_service: Arc<super::by_service::ByService>,
    pub replica: watch::Sender<Arc<Replica>>,
    pub status: watch::Sender<Status>,
    /// The keys changed since the last save, published with the snapshots.
    pub unsaved: super::unsaved::Unsaved,
}

/// The node task's state.
#[derive(Debug)]
pub(super) struct NodeTask {
    node: Node,
    clocks: Clocks,
    shared: Arc<Shared>,
    tracker: TaskTracker,
    commands: mpsc::Receiver<Command>,
    events: mpsc::Receiver<ConnEvent>,
    publish: Publish,
    conns: HashMap<ConnId, Outbox>,
    dirty: bool,
    published: Instant,
    published_ctx: CausalContext,
    snapshot_interval: Duration,
    /// What the last snapshot cost to copy.
    snapshot_cost: Duration,
    stopping: bool,
    /// Change events waiting for the snapshot that shows them: a subscriber that reads
    /// the replica on an event always finds the change there.
    events_due: Vec<Change>,
    /// One line per peer per minute about the messages it sent that were refused.
    refusals: QuietLog<ReplicaId>,
    /// Callers of `Handle::pushed`, answered once the buffer up to `head` was handed to
    /// every connected peer, or at the deadline (a peer that catches up otherwise).
    awaiting_push: Vec<AwaitingPush>,
    /// When each peer last sent a message the state machine took (wall ms): when the two
    /// last exchanged state. One entry per peer the state machine still knows.
    exchanged: HashMap<ReplicaId, u64>,
}

#[derive(Debug)]
struct AwaitingPush {
    head: u64,
    deadline: Instant,
    reply: oneshot::Sender<()>,
}

/// The longest `Handle::pushed` waits before it is answered anyway.
const PUSH_WAIT: Duration = Duration::from_secs(1);

/// How often the log may speak of refusals from the same peer.
const REFUSAL_LOG_EVERY_MS: u64 = 60_000;

impl NodeTask {
    pub(super) fn new(
        node: Node,
        clocks: Clocks,
        shared: Arc<Shared>,
        tracker: TaskTracker,
        commands: mpsc::Receiver<Command>,
        events: mpsc::Receiver<ConnEvent>,
        publish: Publish,
    ) -> Self {
        let published_ctx = node.replica().context().clone();
        Self {
            node,
            clocks,
            shared,
            tracker,
            commands,
            events,
            publish,
            conns: HashMap::new(),
            dirty: false,
            published: Instant::now(),
            published_ctx,
            snapshot_interval: SNAPSHOT_INTERVAL,
            snapshot_cost: Duration::ZERO,
            stopping: false,
            events_due: Vec::new(),
            awaiting_push: Vec::new(),
            refusals: QuietLog::new(REFUSAL_LOG_EVERY_MS),
            exchanged: HashMap::new(),
        }
    }

    /// Writes the node's own registrations again (`Node::finish_resume`), before anything
    /// else, and publishes the replica that shows them.
    pub(super) fn finish_resume(&mut self, resume: Resume) -> Resumed {
        let resumed = self.node.finish_resume(resume, self.clocks.now());
        self.flush();
        self.publish_replica();
        resumed
    }

    /// Runs until a graceful shutdown has finished (or run out of time).
    pub(super) async fn run(mut self) {
        let mut deadline: Option<Instant> = None;
        loop {
            self.flush();
            self.answer_pushed();
            let now = Instant::now();
            // Events wait for the snapshot that shows them, but only as long as copying
            // takes a tenth of the time; other changes are batched for the full interval.
            let spacing = if self.events_due.is_empty() {
                self.snapshot_interval
            } else {
                self.snapshot_cost * SNAPSHOT_COST_FACTOR
            };
            let publish_at = self.dirty.then_some(self.published + spacing);
            if publish_at.is_some_and(|t| t <= now) {
                self.publish_replica();
            }
            let wake = self.timer();
            let wake = match publish_at {
                Some(p) if self.dirty => wake.min(p),
                _ => wake,
            };
            let wake = self
                .awaiting_push
                .iter()
                .map(|a| a.deadline)
                .fold(wake, Instant::min);
            tokio::select! {
                biased;
                () = self.shared.shutdown.cancelled(), if deadline.is_none() => {
                    deadline = Some(Instant::now() + self.shared.limits.shutdown_deadline);
                    self.begin_shutdown();
                }
                () = self.tracker.wait(), if deadline.is_some() => break,
                () = sleep_until(deadline.unwrap_or(now)), if deadline.is_some() => {
                    warn!(
                        node = self.shared.handshake.node.name,
                        "shutdown deadline of {:?} passed; cutting {} remaining tasks",
                        self.shared.limits.shutdown_deadline,
                        self.tracker.len()
                    );
                    break;
                }
                // A due timer is served after each event too: a stream of events (a bulk
                // load arriving) must not hold back the acknowledgements a timer sends. Not
                // before events: a timer that stays due would starve them.
                Some(ev) = self.events.recv() => {
                    self.on_event(ev);
                    self.on_timer();
                }
                Some(cmd) = self.commands.recv() => self.on_command(cmd),
                () = sleep_until(wake) => self.on_timer(),
            }
        }
        self.flush();
        self.answer_pushed();
        self.shared.abort.cancel();
        if !self.tracker.is_empty() {
            let _ = tokio::time::timeout(ABORT_GRACE, self.tracker.wait()).await;
        }
        self.publish_replica();
        self.publish_status();
        info!(node = self.shared.handshake.node.name, "stopped");
    }

    /// Answers the waits whose changes every connected peer has been sent, those past
    /// their deadline, and all of them once the node stops.
    fn answer_pushed(&mut self) {
        if self.awaiting_push.is_empty() {
            return;
        }
        let through = self.node.pushed_through();
        let now = Instant::now();
        let stopping = self.stopping;
        let (due, wait): (Vec<_>, Vec<_>) = self
            .awaiting_push
            .drain(..)
            .partition(|a| stopping || a.head <= through || a.deadline <= now);
        self.awaiting_push = wait;
        for a in due {
            let _ = a.reply.send(());
        }
    }

    /// When the state machine's next timer is due, as a tokio instant.
    fn timer(&self) -> Instant {
        let wait = self.node.poll_timeout().saturating_sub(self.clocks.now().mono_ms);
        Instant::now() + Duration::from_millis(wait).min(MAX_SLEEP)
    }

    fn on_timer(&mut self) {
        let now = self.clocks.now();
        if self.node.poll_timeout() <= now.mono_ms {
            self.node.handle_timeout(now);
            // Renewals mint dots; a sweep's visible effects come as events.
            if self.node.replica().context() != &self.published_ctx {
                self.dirty = true;
            }
        }
    }

    fn on_event(&mut self, ev: ConnEvent) {
        let now = self.clocks.now();
        let node = self.shared.handshake.node.name.as_str();
        match ev {
            ConnEvent::Up {
                conn,
                peer,
                outbound,
                seed,
                outbox,
            } => {
                self.conns.insert(conn, outbox);
                if self
                    .node
                    .handle_connected(conn, &peer, outbound, seed.as_deref(), now)
                {
                    let way = if outbound { "to" } else { "from" };
                    info!(node, conn, "connected {way} {} ({})", peer.name, peer.id);
                }
            }
            ConnEvent::Message { conn, envelope } => {
                let m = &envelope.message;
                trace!(node, conn, seq = m.seq(), "received {}", m.kind());
                let mutates = m.carries_delta() || matches!(m, Message::Elided { .. });
                let peer = self.node.peer_on(conn);
                match self.node.handle_message(conn, envelope, now) {
                    Ok(()) => {
                        self.dirty |= mutates;
                        if let Some(p) = peer {
                            self.exchanged.insert(p, now.wall_ms);
                        }
                    }
                    Err(ProtocolError::UnknownConnection(_)) => {
                        debug!(node, conn, "a message after the connection closed; dropped")
                    }
                    Err(e) => {
                        let held = peer.and_then(|p| self.refusals.allow(p, now.mono_ms));
                        if let (Some(p), Some(held)) = (peer, held) {
                            let what = if e.closes() {
                                "closed the connection"
                            } else {
                                "kept the connection"
                            };
                            warn!(node, conn, peer = %p, held_back = held, "refused a message and {what}: {e}");
                        }
                    }
                }
            }
            ConnEvent::Down { conn, reason, dead } => {
                self.conns.remove(&conn);
                if dead {
                    self.node.handle_dead_link(conn, now);
                } else {
                    self.node.handle_disconnected(conn, now);
                }
                debug!(node, conn, "connection gone: {reason}");
            }
            ConnEvent::DialFailed { target, failure } => self.node.handle_dial_failed(&target, failure, now),
        }
    }

    fn on_command(&mut self, cmd: Command) {
        let now = self.clocks.now();
        match cmd {
            Command::Register {
                service,
                provider,
                endpoint,
                meta,
                reply,
            } => {
                let r = self.write(|n| {
                    n.register(service, provider, endpoint, meta, now)
                        .map_err(DriverError::Invalid)
                });
                let _ = reply.send(r);
            }
            Command::RegisterMany { items, reply } => {
                let r = self.write(|n| {
                    n.register_many(items, now)
                        .map_err(|(index, source)| DriverError::InvalidItem { index, source })
                });
                let _ = reply.send(r);
            }
            Command::Deregister {
                service,
                provider,
                reply,
            } => {
                let r = self.write(|n| Ok(n.deregister(&service, &provider, now)));
                let _ = reply.send(r);
            }
            Command::ForceDead { node, reply } => {
                let r = self.write(|n| Ok(n.force_dead(node, now)));
                let _ = reply.send(r);
            }
            Command::RemoveAsOperator {
                service,
                provider,
                reply,
            } => {
                let r = self.write(|n| Ok(n.remove_as_operator(&service, &provider, now)));
                let _ = reply.send(r);
            }
            Command::Inspect(Inspect(f)) => f(&self.node, now.wall_ms),
            Command::Pushed(reply) => {
                self.awaiting_push.push(AwaitingPush {
                    head: self.node.buffer_head(),
                    deadline: Instant::now() + PUSH_WAIT,
                    reply,
                });
                self.answer_pushed();
            }
            Command::SyncNow(reply) => {
                let _ = reply.send(self.node.sync_now(now));
            }
            Command::CrashGuard(on) => self.node.set_crash_guard(on, now),
            Command::Exchanged(reply) => {
                // Peers the state machine forgot (gone a day) are forgotten here too.
                let known: std::collections::HashSet<ReplicaId> =
                    self.node.known_peers().into_iter().map(|p| p.id).collect();
                self.exchanged.retain(|id, _| known.contains(id));
                let _ = reply.send(self.exchanged.iter().map(|(id, t)| (*id, *t)).collect());
            }
        }
    }

    /// Stops accepting (the accept loop watches the same token), pushes what peers lack
    /// (and, leaving, the farewell delta) and says goodbye; the run loop then waits for the
    /// connections to flush and close.
    fn begin_shutdown(&mut self) {
        let leave = self.shared.leave.load(std::sync::atomic::Ordering::SeqCst);
        info!(
            node = self.shared.handshake.node.name,
            "{}: goodbye to {} connections",
            if leave {
                "leaving the cluster"
            } else {
                "stopping (registrations kept within the lease)"
            },
            self.conns.len()
        );
        self.stopping = true;
        self.tracker.close();
        if leave {
            self.node.shutdown(self.clocks.now());
        } else {
            self.node.stop(self.clocks.now());
        }
        self.dirty = true;
    }

    /// Carries out every output the state machine has queued.
    /// A write asked by a command: refused once stopping; then what it sent is flushed
    /// and the snapshot published before the caller hears back (read-your-writes).
    fn write<T>(&mut self, f: impl FnOnce(&mut Node) -> Result<T, DriverError>) -> Result<T, DriverError> {
        let r = match self.stopping {
            true => Err(DriverError::Stopped),
            false => f(&mut self.node),
        };
        self.flush();
        self.publish_replica();
        r
    }

    fn flush(&mut self) {
        // First: whoever sees an effect of these outputs (a connection closed for a
        // forgery, say) finds the counters that explain it already published.
        self.publish_status();
        while let Some(out) = self.node.poll_output() {
            match out {
                Output::Send { conn, envelope } => {
                    let m = &envelope.message;
                    trace!(
                        node = self.shared.handshake.node.name,
                        conn,
                        seq = m.seq(),
                        "send {}",
                        m.kind()
                    );
                    self.queue(conn, Outgoing::Message(envelope.encode()));
                }
                Output::Close { conn, reason } => self.queue(conn, Outgoing::Close(reason)),
                Output::Dial(target) => {
                    if !self.stopping {
                        self.tracker
                            .spawn(conn::dial(target, Arc::clone(&self.shared)).in_current_span());
                    }
                }
                Output::Event(change) => {
                    self.dirty = true;
                    self.events_due.push(change);
                }
            }
        }
    }

    /// Queues `out` to a connection, or cuts it (a slow reader, or a message over the
    /// size limit); the connection task logs why.
    fn queue(&mut self, conn: ConnId, out: Outgoing) {
        let Some(outbox) = self.conns.get(&conn) else {
            return;
        };
        if let Err(cut) = outbox.send(out) {
            let c = &self.shared.counts;
            match cut {
                Cut::QueueFull { .. } | Cut::QueueBytes { .. } => bump(&c.slow_peers),
                Cut::TooLarge { .. } => bump(&c.oversize_sent),
            }
            outbox.cut(cut);
        }
    }

    fn publish_replica(&mut self) {
        let started = Instant::now();
        let changed = self.node.take_changed();
        let replica = self.node.replica();
        self.published_ctx = replica.context().clone();
        let snapshot = Arc::new(replica.clone());
        self.publish
            .unsaved
            .publish(changed, &self.publish.replica, snapshot);
        // No subscriber is fine; a lagging one learns it from its receiver.
        // Taken, not drained: the room for a join's 100,000 events (4.5 MiB) goes with them.
        let due = std::mem::take(&mut self.events_due);
        let changes: Vec<Arc<Change>> = due.into_iter().map(Arc::new).collect();
        self.publish.by_service.send(&changes);
        for change in changes {
            let _ = self.publish.changes.send(change);
        }
        self.published = Instant::now();
        let cost = self.published.saturating_duration_since(started);
        if let Some(observe) = &self.shared.on_snapshot {
            (observe.0)(cost);
        }
        self.snapshot_cost = cost;
        self.snapshot_interval = (cost * SNAPSHOT_COST_FACTOR).max(SNAPSHOT_INTERVAL);
        self.dirty = false;
        // Synced shows only with the snapshot that holds what the node caught up with.
        self.publish_status();
    }

    fn publish_status(&self) {
        let counters = self.node.counters();
        let connected = self.node.connected();
        // Said only once the replica readers see holds what the node caught up with; and
        // once said, kept.
        let caught_up = self.node.synced() && !self.dirty;
        self.publish.status.send_if_modified(|s| {
            let synced = s.synced || caught_up;
            if s.counters == counters && s.connected == connected && s.synced == synced {
                return false;
            }
            *s = Status {
                counters,
                connected,
                synced,
            };
            true
        });
    }
}
