//! What the node task sends a connection, and the bounded queue it waits in.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;
use tokio_util::sync::CancellationToken;

use crate::driver::limits::Limits;

/// What the node task sends a connection.
#[derive(Debug)]
pub(in crate::driver) enum Outgoing {
    /// An encoded envelope; the connection sends it in chunks if it is larger than a frame.
    Message(Vec<u8>),
    /// Close after what is queued, with this reason.
    Close(String),
}

/// Why the node task cut a connection without a goodbye.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::driver) enum Cut {
    /// The peer reads too slowly: `send_queue_depth` messages are waiting.
    QueueFull {
        /// `send_queue_depth`.
        depth: usize,
    },
    /// The peer reads too slowly: one more message would put its queue over
    /// `send_queue_bytes`.
    QueueBytes {
        /// The bytes queued already.
        queued: usize,
        /// The message's size.
        size: usize,
        /// `send_queue_bytes`.
        budget: usize,
    },
    /// A message for the peer is over `max_envelope_bytes`: the peer would refuse it.
    TooLarge {
        /// The message's size.
        size: usize,
        /// `max_envelope_bytes`.
        max: usize,
    },
}

impl std::fmt::Display for Cut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cut::QueueFull { depth } => {
                write!(f, "reads too slowly: its send queue is full ({depth} messages)")
            }
            Cut::QueueBytes { queued, size, budget } => write!(
                f,
                "reads too slowly: a {size}-byte message on {queued} queued bytes would go over \
                 the {budget}-byte send queue"
            ),
            Cut::TooLarge { size, max } => {
                write!(
                    f,
                    "would not send a {size}-byte message, over the {max}-byte limit"
                )
            }
        }
    }
}

/// What the node task and a connection task share about the connection's queue.
#[derive(Debug, Default)]
pub(super) struct Link {
    /// The bytes of the messages queued and not yet handed to the WebSocket.
    pub(super) queued: AtomicUsize,
    /// Why the node task cut the connection, set before it is killed.
    pub(super) cut: OnceLock<Cut>,
}

/// The node task's end of a connection's queue: bounded in messages (`send_queue_depth`)
/// and in bytes (`send_queue_bytes`).
#[derive(Debug)]
pub(in crate::driver) struct Outbox {
    tx: mpsc::Sender<Outgoing>,
    link: Arc<Link>,
    kill: CancellationToken,
    depth: usize,
    budget: usize,
    max_envelope: usize,
}

impl Outbox {
    pub(super) fn new(
        limits: &Limits,
        kill: CancellationToken,
    ) -> (Self, mpsc::Receiver<Outgoing>, Arc<Link>) {
        let depth = limits.send_queue_depth.max(1);
        let (tx, rx) = mpsc::channel(depth);
        let link = Arc::new(Link::default());
        let outbox = Self {
            tx,
            link: Arc::clone(&link),
            kill,
            depth,
            budget: limits.send_queue_bytes,
            max_envelope: limits.max_envelope_bytes,
        };
        (outbox, rx, link)
    }

    /// Queues `out` without waiting. A connection that has ended, or is being cut, drops
    /// it silently (its `Down` is on the way).
    ///
    /// # Errors
    /// [`Cut`] when the connection must be cut ([`Outbox::cut`]) instead; nothing was queued.
    pub(in crate::driver) fn send(&self, out: Outgoing) -> Result<(), Cut> {
        if self.kill.is_cancelled() {
            return Ok(());
        }
        let size = match &out {
            Outgoing::Message(bytes) => bytes.len(),
            Outgoing::Close(_) => 0,
        };
        if size > self.max_envelope {
            return Err(Cut::TooLarge {
                size,
                max: self.max_envelope,
            });
        }
        // Only the node task adds, so the count can only have dropped since this load.
        let queued = self.link.queued.load(Ordering::Acquire);
        if queued.saturating_add(size) > self.budget {
            return Err(Cut::QueueBytes {
                queued,
                size,
                budget: self.budget,
            });
        }
        self.link.queued.fetch_add(size, Ordering::AcqRel);
        match self.tx.try_send(out) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.link.queued.fetch_sub(size, Ordering::AcqRel);
                match e {
                    TrySendError::Full(_) => Err(Cut::QueueFull { depth: self.depth }),
                    TrySendError::Closed(_) => Ok(()),
                }
            }
        }
    }

    /// Cuts the connection at once, dropping what is queued; the peer is told `why`.
    pub(in crate::driver) fn cut(&self, why: Cut) {
        let _ = self.link.cut.set(why);
        self.kill.cancel();
    }
}
