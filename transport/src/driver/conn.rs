//! One connection: the WebSocket upgrade, the handshake, then frames both ways until either
//! side closes. Generic over the byte stream, so TLS slots in under the WebSocket.
//!
//! A connection task reports to the node task (`ConnEvent`) and takes what to send from its
//! own queue (`Outgoing`, bounded in messages and in bytes by [`Outbox`]). It never touches
//! the node: a bad peer costs a closed connection, a count and a log line.
//!
//! After the handshake every message crosses in the chunk format of [`super::chunk`]: the
//! writer splits what it sends into frames of at most the frame limit, the reader puts
//! them back together before decoding.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::client::ClientRequestBuilder;
use tokio_tungstenite::tungstenite::error::CapacityError;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::{HeaderValue, StatusCode, Uri};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message as WsMessage};
use tokio_tungstenite::WebSocketStream;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::admit::{LogGate, PendingGuard, Unauthenticated};
use super::chunk::{self, ChunkError, Reassembler, Step};
use super::limits::{bump, Counts, Limits, TokenBucket};
use super::now_ms;
use super::tls::{self, Tls};
use crate::backoff::Failure;
use crate::handshake::{self, HandshakeConfig, HandshakeError, HandshakeMessage, RefusalKind, NONCE_LEN};
use crate::keepalive::{Check, Liveness};
use crate::message::Envelope;
use crate::proto::{ConnId, DialTarget, NodeInfo};
use tokio_rustls::rustls::pki_types::CertificateDer;

/// The WebSocket subprotocol roster peers speak; the server echoes it.
pub(super) const SUBPROTOCOL: &str = "roster.v1";
/// The WebSocket subprotocol of clients (the CLI, tools): their connections are handed to
/// the application (`DriverConfig::clients`) after the upgrade.
pub const CLIENT_SUBPROTOCOL: &str = "roster.client.v1";
/// The least retry-after, in seconds, a node under the crash guard gives peers that dial it
/// (the default guard window: it dials out itself when its lease needs it).
const GUARDED_RETRY_S: u64 = 300;
/// Source addresses tracked for the peer accept rate (the map is reset past it).
const MAX_ACCEPT_BUCKETS: usize = 4_096;
/// How long a node that another node answered for is left alone.
const WRONG_PEER_RETRY_MS: u64 = 5 * 60 * 1000;
/// How long a closing connection waits for the peer's close frame.
/// The most a connection reads from its socket at a time. tungstenite zero-fills that much
/// of its read buffer before every read: at its default (128 KiB), 5% of a writing agent's
/// CPU under churn went to that, for messages of a few hundred bytes.
const READ_BUFFER_BYTES: usize = 16 * 1024;

const CLOSE_LINGER: Duration = Duration::from_secs(1);
/// The longest close reason a WebSocket close frame carries, in bytes.
const MAX_CLOSE_REASON: usize = 123;

/// What the node task sends a connection.
#[derive(Debug)]
pub(super) enum Outgoing {
    /// An encoded envelope; the connection sends it in chunks if it is larger than a frame.
    Message(Vec<u8>),
    /// Close after what is queued, with this reason.
    Close(String),
}

/// Why the node task cut a connection without a goodbye.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Cut {
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
struct Link {
    /// The bytes of the messages queued and not yet handed to the WebSocket.
    queued: AtomicUsize,
    /// Why the node task cut the connection, set before it is killed.
    cut: OnceLock<Cut>,
}

/// The node task's end of a connection's queue: bounded in messages (`send_queue_depth`)
/// and in bytes (`send_queue_bytes`).
#[derive(Debug)]
pub(super) struct Outbox {
    tx: mpsc::Sender<Outgoing>,
    link: Arc<Link>,
    kill: CancellationToken,
    depth: usize,
    budget: usize,
    max_envelope: usize,
}

impl Outbox {
    fn new(limits: &Limits, kill: CancellationToken) -> (Self, mpsc::Receiver<Outgoing>, Arc<Link>) {
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
    pub(super) fn send(&self, out: Outgoing) -> Result<(), Cut> {
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
    pub(super) fn cut(&self, why: Cut) {
        let _ = self.link.cut.set(why);
        self.kill.cancel();
    }
}

/// What connection tasks tell the node task.
#[derive(Debug)]
pub(super) enum ConnEvent {
    /// A connection is authenticated.
    Up {
        conn: ConnId,
        peer: NodeInfo,
        outbound: bool,
        seed: Option<String>,
        outbox: Outbox,
    },
    /// A message arrived.
    Message { conn: ConnId, envelope: Envelope },
    /// The connection is closed.
    /// `dead`: closed because nothing arrived (pings unanswered).
    Down {
        conn: ConnId,
        reason: String,
        dead: bool,
    },
    /// A dial did not produce a connection.
    DialFailed { target: DialTarget, failure: Failure },
}

/// What every connection task shares.
#[derive(Debug)]
pub(super) struct Shared {
    pub handshake: HandshakeConfig,
    pub limits: Limits,
    pub max_inbound: usize,
    pub events: mpsc::Sender<ConnEvent>,
    pub counts: Counts,
    /// Stops accepting, dialing and handshakes.
    pub shutdown: CancellationToken,
    /// Cuts every connection (the shutdown deadline passed).
    pub abort: CancellationToken,
    /// Set when the node serves and dials `wss://`.
    pub tls: Option<Tls>,
    /// Where client connections go; `None` refuses them.
    pub clients: Option<mpsc::Sender<ClientConn>>,
    /// Peer accepts per source address (load shedding).
    accepts: std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, TokenBucket>>,
    /// Client accepts per source address.
    client_accepts: std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, TokenBucket>>,
    /// Connections not yet authenticated, per source address.
    pub unauthenticated: Arc<Unauthenticated>,
    /// Refusals and failed handshakes are logged once a minute per address.
    pub log_gate: LogGate,
    /// Under the crash-loop guard, peers are turned away with a long retry-after: the
    /// node dials out itself when its lease needs it.
    pub refuse_peers: AtomicBool,
    /// Cleared by [`super::Handle::stop`]: the shutdown that follows keeps what the node
    /// owns (peers keep it within its lease) instead of leaving.
    pub leave: AtomicBool,
    next_conn: AtomicU64,
}

/// A byte stream a client connection runs over (TCP, or TLS over TCP).
pub trait ClientStream: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> ClientStream for T {}

/// A client connection (subprotocol [`CLIENT_SUBPROTOCOL`]), upgraded and handed to the
/// application, which speaks its own protocol over it. It holds its place under the
/// inbound cap until dropped, and counts as unauthenticated (under
/// `Limits::max_unauthenticated_per_address`) until [`ClientConn::authenticated`].
#[derive(Debug)]
pub struct ClientConn {
    /// The WebSocket, with the node's frame and message limits.
    pub ws: WebSocketStream<Box<dyn ClientStream>>,
    /// Who connected.
    pub peer: SocketAddr,
    _slot: InboundGuard,
    pending: Option<PendingGuard>,
}

impl ClientConn {
    /// Says the client has proved what the application asks of it (the secret, or a valid
    /// first request where none is asked): the connection no longer counts against its
    /// address's cap of unauthenticated connections.
    pub fn authenticated(&mut self) {
        self.pending = None;
    }
}

impl std::fmt::Debug for dyn ClientStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientStream")
    }
}

impl Shared {
    pub(super) fn new(
        handshake: HandshakeConfig,
        limits: Limits,
        max_inbound: usize,
        events: mpsc::Sender<ConnEvent>,
        shutdown: CancellationToken,
        tls: Option<Tls>,
        clients: Option<mpsc::Sender<ClientConn>>,
    ) -> Self {
        Self {
            handshake,
            limits,
            max_inbound,
            events,
            counts: Counts::default(),
            shutdown,
            abort: CancellationToken::new(),
            tls,
            clients,
            accepts: std::sync::Mutex::new(std::collections::HashMap::new()),
            client_accepts: std::sync::Mutex::new(std::collections::HashMap::new()),
            unauthenticated: Arc::new(Unauthenticated::default()),
            log_gate: LogGate::default(),
            refuse_peers: AtomicBool::new(false),
            leave: AtomicBool::new(true),
            next_conn: AtomicU64::new(1),
        }
    }

    /// Whether a connection from `ip` may be accepted now (a token per address; peers and
    /// clients have buckets of their own).
    fn may_accept(&self, ip: std::net::IpAddr, client: bool) -> bool {
        let (buckets, rate, burst) = if client {
            let l = &self.limits;
            (
                &self.client_accepts,
                l.client_accepts_per_second,
                l.client_accept_burst,
            )
        } else {
            let l = &self.limits;
            (&self.accepts, l.peer_accepts_per_second, l.peer_accept_burst)
        };
        let Ok(mut map) = buckets.lock() else {
            return true;
        };
        if map.len() >= MAX_ACCEPT_BUCKETS && !map.contains_key(&ip) {
            map.clear();
        }
        map.entry(ip)
            .or_insert_with(|| TokenBucket::new(rate, burst, Instant::now()))
            .take(Instant::now())
    }

    /// A connection id no other connection of this driver had.
    pub(super) fn next_conn(&self) -> ConnId {
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }

    fn ws_config(&self) -> WebSocketConfig {
        WebSocketConfig::default()
            .read_buffer_size(READ_BUFFER_BYTES)
            .max_message_size(Some(self.limits.max_message_size))
            .max_frame_size(Some(self.limits.max_frame_size))
    }

    fn node(&self) -> &str {
        &self.handshake.node.name
    }
}

/// Counts an inbound connection for the inbound cap while it lives.
#[derive(Debug)]
pub(crate) struct InboundGuard(Arc<AtomicUsize>);

impl InboundGuard {
    pub(super) fn new(count: Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(count)
    }
}

impl Drop for InboundGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Why a connection did not get as far as an authenticated peer.
#[derive(Debug)]
enum Fail {
    /// We refused the peer, or it refused us.
    Handshake(HandshakeError),
    /// A frame over the size limit.
    Oversize { size: usize, max_size: usize },
    /// The network, the WebSocket upgrade, or a peer that hung up.
    Network(String),
    /// Not done within the handshake timeout.
    Timeout,
    /// The peer's TLS certificate was refused (or it refused ours).
    Tls(String),
    /// Over TLS, a peer (or a client not on loopback) showed no client certificate.
    NoClientCertificate { client: bool },
    /// Over TLS, the other side claimed a node id its certificate does not name.
    CertificateNamesAnother { claimed: String },
    /// Another node answered than the one dialed.
    WrongPeer { expected: String, got: String },
    /// The peer sheds load: come back after this many milliseconds.
    Busy(u64),
    /// The node is shutting down.
    Cancelled,
}

impl Fail {
    fn failure(&self) -> Failure {
        match self {
            Fail::Handshake(e) => e.failure(),
            // A certificate that does not verify will not fix itself in seconds.
            Fail::Tls(_) | Fail::CertificateNamesAnother { .. } => Failure::Auth,
            // Another node answers at that address now (the one dialed restarted with a
            // new identity, say): the one dialed is not coming back there soon.
            Fail::WrongPeer { .. } => Failure::RetryAfter(WRONG_PEER_RETRY_MS),
            Fail::Busy(ms) => Failure::RetryAfter(*ms),
            _ => Failure::Network,
        }
    }

    /// Counts and logs the failure. `who` names the peer (its address or URL). With
    /// `from`, the address of an inbound connection, the line goes through the log gate
    /// (once a minute per address, saying how many were left out); the count is always
    /// kept.
    fn record(&self, shared: &Shared, who: &str, from: Option<std::net::IpAddr>) {
        let c = &shared.counts;
        match self {
            Fail::Handshake(HandshakeError::Refused { .. }) => bump(&c.handshakes_rejected),
            Fail::Handshake(_)
            | Fail::Tls(_)
            | Fail::NoClientCertificate { .. }
            | Fail::CertificateNamesAnother { .. } => {
                bump(&c.handshakes_refused);
            }
            Fail::Oversize { .. } => bump(&c.oversize),
            Fail::Timeout => bump(&c.handshake_timeouts),
            Fail::WrongPeer { .. } | Fail::Network(_) | Fail::Busy(_) | Fail::Cancelled => {}
        }
        if matches!(self, Fail::Cancelled) {
            return;
        }
        let suppressed = match from {
            Some(ip) => match shared.log_gate.admit(ip, Instant::now()) {
                Some(n) => n,
                None => return,
            },
            None => 0,
        };
        let node = shared.node();
        let line = match self {
            Fail::Handshake(HandshakeError::Refused { reason, .. }) => {
                format!("the peer refused our handshake: {reason}")
            }
            Fail::Handshake(e) => format!("refused a peer's handshake: {e}"),
            Fail::Oversize { size, max_size } => {
                format!("closed a connection: a {size}-byte message, over the {max_size}-byte limit")
            }
            Fail::Timeout => format!(
                "closed a connection: no authenticated peer within {:?}",
                shared.limits.handshake_timeout
            ),
            Fail::Tls(e) => format!("TLS handshake failed: {e}"),
            Fail::CertificateNamesAnother { .. } => format!("refused a handshake: {}", self.to_line()),
            Fail::NoClientCertificate { client } => format!(
                "refused a {}: it showed no TLS client certificate",
                if *client { "client not on loopback" } else { "peer" }
            ),
            Fail::WrongPeer { expected, got } => {
                format!("dialed node {expected} but {got} answered; closing")
            }
            Fail::Network(e) => format!("connection failed before the handshake completed: {e}"),
            Fail::Busy(ms) => format!("the peer sheds load; retrying after {ms} ms at the earliest"),
            Fail::Cancelled => return,
        };
        let gated = if suppressed > 0 {
            format!(" ({suppressed} more from this address in the last minute not logged)")
        } else {
            String::new()
        };
        match self {
            Fail::Network(_) | Fail::Busy(_) => info!(node, peer = who, "{line}{gated}"),
            _ => warn!(node, peer = who, "{line}{gated}"),
        }
    }

    /// The reason of a certificate refusal, as sent to the other side.
    fn to_line(&self) -> String {
        match self {
            Fail::CertificateNamesAnother { claimed } => format!(
                "the TLS certificate does not name node-{claimed}, the node id claimed; \
                 a node's certificate must carry the DNS name node-<its id>"
            ),
            _ => String::new(),
        }
    }

    /// The close frame to send, if any.
    fn close_frame(&self) -> Option<CloseFrame> {
        match self {
            Fail::Handshake(HandshakeError::Refused { .. }) => {
                Some(close_frame(CloseCode::Normal, "refused"))
            }
            Fail::Handshake(e) => Some(close_frame(CloseCode::Policy, &e.to_string())),
            Fail::Oversize { max_size, .. } => Some(close_frame(
                CloseCode::Size,
                &format!("message over {max_size} bytes"),
            )),
            Fail::WrongPeer { .. } => Some(close_frame(CloseCode::Policy, "not the node dialed")),
            Fail::CertificateNamesAnother { .. } => Some(close_frame(
                CloseCode::Policy,
                "the certificate names another node",
            )),
            Fail::NoClientCertificate { .. } => Some(close_frame(
                CloseCode::Policy,
                "a TLS client certificate of the cluster CA is required",
            )),
            Fail::Timeout | Fail::Network(_) | Fail::Tls(_) | Fail::Busy(_) | Fail::Cancelled => None,
        }
    }
}

fn ws_fail(e: WsError) -> Fail {
    match e {
        WsError::Capacity(CapacityError::MessageTooLong { size, max_size }) => {
            Fail::Oversize { size, max_size }
        }
        // A node shedding load says when to come back; the backoff takes it as a floor.
        WsError::Http(resp) if resp.status() == StatusCode::SERVICE_UNAVAILABLE => {
            let secs = resp
                .headers()
                .get("Retry-After")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(5)
                .min(3_600);
            Fail::Busy(secs * 1_000)
        }
        e => Fail::Network(e.to_string()),
    }
}

fn cut(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn close_frame(code: CloseCode, reason: &str) -> CloseFrame {
    CloseFrame {
        code,
        reason: cut(reason, MAX_CLOSE_REASON).into(),
    }
}

fn nonce() -> Result<[u8; NONCE_LEN], Fail> {
    let mut n = [0u8; NONCE_LEN];
    getrandom::fill(&mut n).map_err(|e| Fail::Network(format!("no random nonce from the OS: {e}")))?;
    Ok(n)
}

/// Reads the next handshake frame, skipping pings.
async fn recv_frame<S>(ws: &mut WebSocketStream<S>) -> Result<HandshakeMessage, Fail>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    loop {
        match ws.next().await {
            None => return Err(Fail::Network("the peer hung up during the handshake".into())),
            Some(Err(e)) => return Err(ws_fail(e)),
            Some(Ok(WsMessage::Binary(b))) => return HandshakeMessage::decode(&b).map_err(Fail::Handshake),
            Some(Ok(WsMessage::Text(_))) => {
                return Err(Fail::Handshake(HandshakeError::Malformed("a text frame".into())))
            }
            Some(Ok(WsMessage::Close(f))) => {
                let why = f.map(|f| f.reason.to_string()).unwrap_or_default();
                return Err(Fail::Network(format!(
                    "the peer closed during the handshake: {why}"
                )));
            }
            Some(Ok(WsMessage::Ping(_) | WsMessage::Pong(_) | WsMessage::Frame(_))) => {}
        }
    }
}

async fn send_frame<S>(ws: &mut WebSocketStream<S>, msg: &HandshakeMessage) -> Result<(), Fail>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    ws.send(WsMessage::binary(msg.encode())).await.map_err(ws_fail)
}

/// Tells the peer why we stop (a refusal frame, then a close frame), briefly.
async fn refuse<S>(ws: &mut WebSocketStream<S>, fail: &Fail)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let goodbye = async {
        if let Fail::Handshake(e) = fail {
            if let Some(refusal) = e.to_refusal() {
                let _ = send_frame(ws, &refusal).await;
            }
        }
        if let Some(frame) = fail.close_frame() {
            let _ = ws.close(Some(frame)).await;
        }
    };
    let _ = tokio::time::timeout(CLOSE_LINGER, goodbye).await;
}

async fn server_handshake<S>(
    ws: &mut WebSocketStream<S>,
    shared: &Shared,
    cert: &PeerCert,
) -> Result<NodeInfo, Fail>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut server = handshake::Server::new(&shared.handshake, nonce()?);
    let hello = recv_frame(ws).await?;
    let challenge = server.on_hello(hello, now_ms()).map_err(Fail::Handshake)?;
    send_frame(ws, &challenge).await?;
    let proof = recv_frame(ws).await?;
    let (peer, welcome) = server.on_proof(proof).map_err(Fail::Handshake)?;
    check_certificate_names(ws, cert, &peer).await?;
    send_frame(ws, &welcome).await?;
    Ok(peer)
}

/// The TLS certificate a connection's other side showed.
#[derive(Debug)]
pub(super) enum PeerCert {
    /// The connection is not TLS.
    NoTls,
    /// TLS, and no certificate.
    Missing,
    /// TLS: the leaf certificate, already verified against the CA by rustls.
    Shown(CertificateDer<'static>),
}

/// With TLS, a peer may speak only as the node its certificate names: a DNS name
/// `node-<id>` (the id as 16 hex digits, as `roster members` shows it). A peer that claims
/// another id is refused with the reason, before any protocol message.
async fn check_certificate_names<S>(
    ws: &mut WebSocketStream<S>,
    cert: &PeerCert,
    peer: &NodeInfo,
) -> Result<(), Fail>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let named = match cert {
        PeerCert::NoTls => true,
        PeerCert::Missing => false,
        PeerCert::Shown(der) => tls::names_node(der, &peer.id.to_string()),
    };
    if named {
        return Ok(());
    }
    let fail = Fail::CertificateNamesAnother {
        claimed: peer.id.to_string(),
    };
    let _ = send_frame(
        ws,
        &HandshakeMessage::refused(RefusalKind::Secret, &fail.to_line()),
    )
    .await;
    Err(fail)
}

async fn client_handshake<S>(
    ws: &mut WebSocketStream<S>,
    shared: &Shared,
    target: &DialTarget,
    cert: &PeerCert,
) -> Result<NodeInfo, Fail>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (mut client, hello) = handshake::Client::start(&shared.handshake, nonce()?, now_ms());
    send_frame(ws, &hello).await?;
    let challenge = recv_frame(ws).await?;
    let (peer, proof) = client
        .on_challenge(challenge, now_ms())
        .map_err(Fail::Handshake)?;
    if let DialTarget::Peer { id, .. } = target {
        if *id != peer.id {
            let _ = send_frame(
                ws,
                &HandshakeMessage::refused(RefusalKind::Unavailable, "not the node dialed"),
            )
            .await;
            return Err(Fail::WrongPeer {
                expected: id.to_string(),
                got: peer.id.to_string(),
            });
        }
    }
    check_certificate_names(ws, cert, &peer).await?;
    send_frame(ws, &proof).await?;
    client
        .on_outcome(recv_frame(ws).await?)
        .map_err(Fail::Handshake)?;
    Ok(peer)
}

/// Accepts the upgrade for peers that ask for [`SUBPROTOCOL`] and, when `clients` is set,
/// for clients that ask for [`CLIENT_SUBPROTOCOL`] (noting it in `clients`); echoes it.
#[allow(clippy::result_large_err)] // the signature is tungstenite's
fn check_subprotocol(
    req: &Request,
    mut resp: Response,
    clients: Option<&AtomicBool>,
    admit: &mut dyn FnMut(bool) -> Option<u64>,
) -> Result<Response, ErrorResponse> {
    let offered: Vec<&str> = req
        .headers()
        .get_all("Sec-WebSocket-Protocol")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect();
    let busy = |retry_s: u64| {
        let mut e = ErrorResponse::new(Some("too many connections from this address; retry later".into()));
        *e.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        if let Ok(v) = HeaderValue::from_str(&retry_s.to_string()) {
            e.headers_mut().insert("Retry-After", v);
        }
        e
    };
    let chosen = if offered.contains(&SUBPROTOCOL) {
        if let Some(retry_s) = admit(false) {
            return Err(busy(retry_s));
        }
        SUBPROTOCOL
    } else if let (Some(flag), true) = (clients, offered.contains(&CLIENT_SUBPROTOCOL)) {
        if let Some(retry_s) = admit(true) {
            return Err(busy(retry_s));
        }
        flag.store(true, Ordering::Relaxed);
        CLIENT_SUBPROTOCOL
    } else {
        let mut e = ErrorResponse::new(Some(format!(
            "roster peers speak the {SUBPROTOCOL} subprotocol, clients {CLIENT_SUBPROTOCOL}"
        )));
        *e.status_mut() = StatusCode::BAD_REQUEST;
        return Err(e);
    };
    resp.headers_mut()
        .insert("Sec-WebSocket-Protocol", HeaderValue::from_static(chosen));
    Ok(resp)
}

/// Runs `work` within the handshake timeout, unless the node shuts down first.
async fn bounded<T>(shared: &Shared, work: impl Future<Output = Result<T, Fail>>) -> Result<T, Fail> {
    tokio::select! {
        () = shared.shutdown.cancelled() => Err(Fail::Cancelled),
        r = tokio::time::timeout(shared.limits.handshake_timeout, work) => r.unwrap_or(Err(Fail::Timeout)),
    }
}

/// Serves one accepted TCP connection: TLS if configured, the upgrade, then the handshake
/// and the connection (a peer), or the hand-off to the application (a client). `guard`
/// holds its place under the inbound cap until it ends.
pub(super) async fn inbound(
    tcp: TcpStream,
    addr: SocketAddr,
    shared: Arc<Shared>,
    guard: InboundGuard,
    pending: PendingGuard,
) {
    let who = addr.to_string();
    let result = match shared.tls.as_ref().map(Tls::acceptor) {
        None => {
            accept_over(
                &shared,
                async { Ok((Box::new(tcp) as Box<dyn ClientStream>, PeerCert::NoTls)) },
                addr,
                (guard, pending),
            )
            .await
        }
        Some(acceptor) => {
            // A client that does not speak TLS is common noise (scanners): a network failure.
            // A certificate that does not verify is refused by rustls here; a connection
            // without one gets through, marked, and is sorted out once we know what it is.
            let tls = async move {
                acceptor
                    .accept(tcp)
                    .await
                    .map(|s| {
                        let cert = tls::leaf(s.get_ref().1.peer_certificates());
                        (Box::new(s) as Box<dyn ClientStream>, cert)
                    })
                    .map_err(|e| Fail::Network(format!("TLS: {e}")))
            };
            accept_over(&shared, tls, addr, (guard, pending)).await
        }
    };
    if let Err(fail) = result {
        fail.record(&shared, &who, Some(addr.ip()));
    }
}

async fn accept_over(
    shared: &Arc<Shared>,
    stream: impl Future<Output = Result<(Box<dyn ClientStream>, PeerCert), Fail>>,
    addr: SocketAddr,
    (guard, pending): (InboundGuard, PendingGuard),
) -> Result<(), Fail> {
    let is_client = AtomicBool::new(false);
    let flag = shared.clients.as_ref().map(|_| &is_client);
    let establish = async {
        let (stream, cert) = stream.await?;
        let uncertified = matches!(cert, PeerCert::Missing);
        let mut ws = tokio_tungstenite::accept_hdr_async_with_config(
            stream,
            #[allow(clippy::result_large_err)] // the signature is tungstenite's
            |req: &Request, resp: Response| {
                let mut admit = |client: bool| {
                    if !client && shared.refuse_peers.load(Ordering::Relaxed) {
                        bump(&shared.counts.peers_shed);
                        // Under the crash guard: come back in five to seven and a half minutes.
                        return Some(GUARDED_RETRY_S + getrandom::u64().unwrap_or(0) % (GUARDED_RETRY_S / 2));
                    }
                    if shared.may_accept(addr.ip(), client) {
                        return None;
                    }
                    let (count, what) = if client {
                        (&shared.counts.clients_shed, "client")
                    } else {
                        (&shared.counts.peers_shed, "peer")
                    };
                    bump(count);
                    if let Some(n) = shared.log_gate.admit(addr.ip(), Instant::now()) {
                        warn!(
                            node = shared.node(),
                            peer = %addr,
                            "shed a {what} connection: too many from that address \
                             ({n} more refusals from it in the last minute not logged)"
                        );
                    }
                    // A peer: come back in 1 to 5 s, spread. A client (a CLI command, a
                    // script): in 1 s, which it spreads itself; its bucket refills in
                    // milliseconds, and a client waits within a 5 s connect timeout.
                    Some(match client {
                        true => 1,
                        false => 1 + getrandom::u64().unwrap_or(0) % 5,
                    })
                };
                check_subprotocol(req, resp, flag, &mut admit)
            },
            Some(shared.ws_config()),
        )
        .await
        .map_err(ws_fail)?;
        let client = is_client.load(Ordering::Relaxed);
        // Mutual TLS: a peer always shows a certificate of the cluster CA; a client does
        // unless it connects from loopback (the local CLI).
        if uncertified && (!client || !addr.ip().is_loopback()) {
            let fail = Fail::NoClientCertificate { client };
            refuse(&mut ws, &fail).await;
            return Err(fail);
        }
        if client {
            return Ok((ws, None));
        }
        match server_handshake(&mut ws, shared, &cert).await {
            Ok(peer) => Ok((ws, Some(peer))),
            Err(fail) => {
                refuse(&mut ws, &fail).await;
                Err(fail)
            }
        }
    };
    match bounded(shared, establish).await? {
        (ws, Some(peer)) => {
            // Authenticated: it no longer counts against its address's cap.
            drop(pending);
            run(ws, shared.next_conn(), peer, false, None, Arc::clone(shared)).await;
            drop(guard);
        }
        (ws, None) => {
            if let Some(clients) = &shared.clients {
                bump(&shared.counts.clients_accepted);
                let conn = ClientConn {
                    ws,
                    peer: addr,
                    _slot: guard,
                    pending: Some(pending),
                };
                if clients.send(conn).await.is_err() {
                    debug!(node = shared.node(), "a client connected while the node stops");
                }
            }
        }
    }
    Ok(())
}

/// The host and port of a `ws://` or `wss://` URL, and whether it is `wss`.
fn parse_url(url: &str) -> Result<(Uri, String, u16, bool), Fail> {
    let bad = |why: &str| Fail::Network(format!("cannot dial {url:?}: {why}"));
    let uri: Uri = url.parse().map_err(|_| bad("not a URL"))?;
    let tls = match uri.scheme_str() {
        Some("ws") => false,
        Some("wss") => true,
        _ => return Err(bad("the scheme is neither ws nor wss")),
    };
    let host = uri.host().ok_or_else(|| bad("no host"))?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
        .to_string();
    let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
    Ok((uri, host, port, tls))
}

/// Dials `target`: TCP, TLS for `wss://`, the upgrade, the handshake, then the connection.
/// A failure before the connection is up is reported as `DialFailed`.
pub(super) async fn dial(target: DialTarget, shared: Arc<Shared>) {
    let url = match &target {
        DialTarget::Peer { url, .. } | DialTarget::Seed { url } => url.clone(),
    };
    let result = match parse_url(&url) {
        Err(fail) => Err(fail),
        Ok((uri, host, port, tls)) => {
            let tcp = async move {
                let tcp = TcpStream::connect((host.as_str(), port))
                    .await
                    .map_err(|e| Fail::Network(e.to_string()))?;
                let _ = tcp.set_nodelay(true);
                Ok((tcp, host))
            };
            match (tls, shared.tls.as_ref().map(Tls::connector)) {
                (false, _) => {
                    dial_over(&shared, &target, uri, async {
                        Ok((tcp.await?.0, PeerCert::NoTls))
                    })
                    .await
                }
                (true, Some(connector)) => {
                    let stream = async move {
                        let (tcp, host) = tcp.await?;
                        let name = tls::server_name(&host).map_err(Fail::Tls)?;
                        let s = connector.connect(name, tcp).await.map_err(|e| {
                            // rustls reports its own errors (certificates, alerts) as invalid data.
                            if e.kind() == std::io::ErrorKind::InvalidData {
                                Fail::Tls(e.to_string())
                            } else {
                                Fail::Network(format!("TLS: {e}"))
                            }
                        })?;
                        let cert = tls::leaf(s.get_ref().1.peer_certificates());
                        Ok((s, cert))
                    };
                    dial_over(&shared, &target, uri, stream).await
                }
                (true, None) => Err(Fail::Network(format!(
                    "cannot dial {url}: this node has no TLS configuration"
                ))),
            }
        }
    };
    match result {
        Ok(()) | Err(Fail::Cancelled) => {}
        Err(fail) => {
            fail.record(&shared, &url, None);
            bump(&shared.counts.dial_failures);
            let failure = fail.failure();
            let _ = shared
                .events
                .send(ConnEvent::DialFailed { target, failure })
                .await;
        }
    }
}

async fn dial_over<S>(
    shared: &Arc<Shared>,
    target: &DialTarget,
    uri: Uri,
    stream: impl Future<Output = Result<(S, PeerCert), Fail>>,
) -> Result<(), Fail>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let establish = async {
        let (stream, cert) = stream.await?;
        let request = ClientRequestBuilder::new(uri).with_sub_protocol(SUBPROTOCOL);
        let (mut ws, _) =
            tokio_tungstenite::client_async_with_config(request, stream, Some(shared.ws_config()))
                .await
                .map_err(ws_fail)?;
        match client_handshake(&mut ws, shared, target, &cert).await {
            Ok(peer) => Ok((ws, peer)),
            Err(fail) => {
                refuse(&mut ws, &fail).await;
                Err(fail)
            }
        }
    };
    let (ws, peer) = bounded(shared, establish).await?;
    let seed = match target {
        DialTarget::Seed { url } => Some(url.clone()),
        DialTarget::Peer { .. } => None,
    };
    run(ws, shared.next_conn(), peer, true, seed, Arc::clone(shared)).await;
    Ok(())
}

/// How a connection ended.
#[derive(Debug)]
enum End {
    /// The node closed it (after its goodbye).
    Closed(String),
    /// The peer closed it.
    PeerClosed(String),
    /// The network failed.
    Failed(String),
    /// The peer sent a frame over the size limit.
    Oversize { size: usize, max_size: usize },
    /// The peer broke the chunk format, or announced a message over the size limit.
    Chunk(ChunkError),
    /// The peer sent something that is not a message.
    Malformed(String),
    /// The node task cut it (see [`Cut`]) or the shutdown deadline passed.
    Killed,
    /// Nothing arrived for this long (`dead_after`), pings unanswered: the peer or the path
    /// to it is gone without a word.
    Dead(Duration),
}

/// Runs an authenticated connection until either side closes it.
async fn run<S>(
    ws: WebSocketStream<S>,
    conn: ConnId,
    peer: NodeInfo,
    outbound: bool,
    seed: Option<String>,
    shared: Arc<Shared>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let kill = shared.abort.child_token();
    let (outbox, mut rx, link) = Outbox::new(&shared.limits, kill.clone());
    let who = format!("{} ({})", peer.name, peer.id);
    let up = ConnEvent::Up {
        conn,
        peer,
        outbound,
        seed,
        outbox,
    };
    if shared.events.send(up).await.is_err() {
        return;
    }
    let (mut sink, mut stream) = ws.split();
    let live = std::sync::Mutex::new(Liveness::new(&shared.limits, outbound, Instant::now()));
    let ping = PingSignal::default();
    let end = tokio::select! {
        () = kill.cancelled() => End::Killed,
        end = read_loop(&mut stream, conn, &shared, &live) => end,
        end = write_loop(&mut sink, &mut rx, &link, shared.limits.frame(), &shared.counts, &ping) => end,
        silent = keepalive(&live, &ping) => End::Dead(silent),
    };
    let node = shared.node();
    let c = &shared.counts;
    let limits = &shared.limits;
    let (frame, reason) = match &end {
        End::Closed(r) => (None, format!("closed: {r}")),
        End::PeerClosed(r) => (None, format!("the peer closed: {r}")),
        End::Failed(e) => (None, format!("failed: {e}")),
        End::Oversize { size, max_size } => {
            bump(&c.oversize);
            let r = format!("a {size}-byte message, over the {max_size}-byte limit");
            (Some(close_frame(CloseCode::Size, &r)), r)
        }
        End::Chunk(e) if e.is_oversize() => {
            bump(&c.oversize);
            let r = e.to_string();
            (Some(close_frame(CloseCode::Size, &r)), r)
        }
        End::Chunk(e) => {
            bump(&c.malformed);
            let r = e.to_string();
            (Some(close_frame(CloseCode::Protocol, &r)), r)
        }
        End::Malformed(e) => {
            bump(&c.malformed);
            (Some(close_frame(CloseCode::Protocol, e)), e.clone())
        }
        End::Killed if shared.abort.is_cancelled() => (None, "the shutdown deadline passed".to_string()),
        End::Killed => {
            // The node task counted it when it cut.
            let cut = link.cut.get();
            let r = cut.map_or_else(|| "cut by the node".to_string(), Cut::to_string);
            let code = match cut {
                Some(Cut::TooLarge { .. }) => CloseCode::Error,
                _ => CloseCode::Policy,
            };
            (Some(close_frame(code, &r)), r)
        }
        End::Dead(silent) => {
            bump(&c.dead_links);
            let r = format!(
                "nothing arrived for {silent:?}, pings unanswered (dead_after {:?}); redialing",
                limits.dead_after
            );
            (None, r)
        }
    };
    match &end {
        End::Oversize { .. } | End::Chunk(_) | End::Malformed(_) | End::Killed | End::Dead(_) => {
            warn!(node, peer = %who, conn, "closed the connection: {reason}")
        }
        End::Closed(_) | End::PeerClosed(_) | End::Failed(_) => debug!(node, peer = %who, conn, "{reason}"),
    }
    // A dead link would only hold the close for the linger: nothing answers on it.
    let linger = !matches!(end, End::Failed(_) | End::Dead(_)) && !shared.abort.is_cancelled();
    if linger {
        let closing = async {
            match frame {
                Some(frame) => {
                    let _ = sink.send(WsMessage::Close(Some(frame))).await;
                }
                None => {
                    let _ = sink.close().await;
                }
            }
            // Let the peer's close frame arrive, so the close handshake completes.
            while let Some(Ok(_)) = stream.next().await {}
        };
        tokio::select! {
            () = shared.abort.cancelled() => {}
            _ = tokio::time::timeout(CLOSE_LINGER, closing) => {}
        }
    }
    let dead = matches!(end, End::Dead(_));
    let _ = shared.events.send(ConnEvent::Down { conn, reason, dead }).await;
}

type WsRead<S> = SplitStream<WebSocketStream<S>>;
type WsWrite<S> = SplitSink<WebSocketStream<S>, WsMessage>;

/// The keepalive's request for a ping, to the writer: sent when it is idle, or between two
/// chunks of a long message (a peer receiving a large state still answers, in order).
#[derive(Debug, Default)]
struct PingSignal {
    pending: AtomicBool,
    wake: Notify,
}

impl PingSignal {
    fn ask(&self) {
        self.pending.store(true, Ordering::Release);
        self.wake.notify_one();
    }

    fn take(&self) -> bool {
        self.pending.swap(false, Ordering::AcqRel)
    }
}

/// Sends a ping if one was asked for.
async fn ping_if_asked<S>(sink: &mut WsWrite<S>, ping: &PingSignal, counts: &Counts) -> Result<(), WsError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    if ping.take() {
        bump(&counts.pings_sent);
        sink.send(WsMessage::Ping(Default::default())).await?;
    }
    Ok(())
}

/// Pings the peer when the connection has been quiet, and returns how long it was silent
/// when it is dead (see [`crate::keepalive`]).
async fn keepalive(live: &std::sync::Mutex<Liveness>, ping: &PingSignal) -> Duration {
    loop {
        let check = match live.lock() {
            Ok(mut l) => l.check(Instant::now()),
            Err(poisoned) => poisoned.into_inner().check(Instant::now()),
        };
        match check {
            Check::Dead(silent) => return silent,
            Check::Ping(next) => {
                ping.ask();
                tokio::time::sleep_until(next).await;
            }
            Check::Wait(next) => tokio::time::sleep_until(next).await,
        }
    }
}

/// Notes that something arrived on the connection.
fn heard(live: &std::sync::Mutex<Liveness>) {
    match live.lock() {
        Ok(mut l) => l.heard(Instant::now()),
        Err(poisoned) => poisoned.into_inner().heard(Instant::now()),
    }
}

/// Reads frames, rate-limited, puts chunked messages back together, and hands decoded
/// envelopes to the node task. Every frame (pongs too) is a sign of life.
async fn read_loop<S>(
    stream: &mut WsRead<S>,
    conn: ConnId,
    shared: &Shared,
    live: &std::sync::Mutex<Liveness>,
) -> End
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let limits = &shared.limits;
    let mut bucket = TokenBucket::new(limits.frames_per_second, limits.frame_burst, Instant::now());
    let mut chunks = Reassembler::new(limits.max_envelope_bytes, limits.frame());
    loop {
        let msg = match stream.next().await {
            None => return End::PeerClosed("the connection ended".into()),
            Some(Err(WsError::Capacity(CapacityError::MessageTooLong { size, max_size }))) => {
                return End::Oversize { size, max_size }
            }
            Some(Err(e)) => return End::Failed(e.to_string()),
            Some(Ok(m)) => m,
        };
        heard(live);
        // A chunk of a message being received may ride on the token its first chunk paid.
        let free = matches!(&msg, WsMessage::Binary(b) if chunks.rides_free(b));
        if let WsMessage::Binary(b) = &msg {
            bump(&shared.counts.frames_received);
            shared
                .counts
                .bytes_received
                .fetch_add(b.len() as u64, Ordering::Relaxed);
        }
        if !free {
            throttle(&mut bucket, &shared.counts).await;
        }
        match msg {
            WsMessage::Binary(bytes) => match chunks.push(&bytes) {
                Err(e) => return End::Chunk(e),
                Ok(Step::Partial) => {}
                Ok(Step::Envelope(bytes)) => match Envelope::decode(&bytes) {
                    Ok(envelope) => {
                        if shared
                            .events
                            .send(ConnEvent::Message { conn, envelope })
                            .await
                            .is_err()
                        {
                            return End::Failed("the node stopped".into());
                        }
                    }
                    Err(e) => return End::Malformed(e.to_string()),
                },
            },
            WsMessage::Text(_) => return End::Malformed("a text frame".into()),
            WsMessage::Close(f) => {
                return End::PeerClosed(f.map(|f| f.reason.to_string()).unwrap_or_default());
            }
            WsMessage::Ping(_) | WsMessage::Pong(_) | WsMessage::Frame(_) => {}
        }
    }
}

/// Takes a frame's token, waiting for one when the peer sends faster than the limit: the
/// frames behind wait in TCP's buffers, and the peer's writes with them.
async fn throttle(bucket: &mut TokenBucket, counts: &Counts) {
    if bucket.take(Instant::now()) {
        return;
    }
    bump(&counts.frames_throttled);
    loop {
        tokio::time::sleep(bucket.wait(Instant::now())).await;
        if bucket.take(Instant::now()) {
            return;
        }
    }
}

/// Writes what the node task queues, each message in chunks of at most `frame` bytes,
/// batching what is already waiting into one flush; and a ping when `ping` says.
async fn write_loop<S>(
    sink: &mut WsWrite<S>,
    rx: &mut mpsc::Receiver<Outgoing>,
    link: &Link,
    frame: usize,
    counts: &Counts,
    ping: &PingSignal,
) -> End
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    loop {
        let first = tokio::select! {
            out = rx.recv() => match out {
                Some(out) => out,
                None => break,
            },
            () = ping.wake.notified() => {
                if let Err(e) = ping_if_asked(sink, ping, counts).await {
                    return End::Failed(e.to_string());
                }
                continue;
            }
        };
        let mut next = Some(first);
        while let Some(out) = next.take() {
            match out {
                Outgoing::Message(bytes) => {
                    for chunk in chunk::split(&bytes, frame) {
                        if let Err(e) = ping_if_asked(sink, ping, counts).await {
                            return End::Failed(e.to_string());
                        }
                        bump(&counts.frames_sent);
                        counts.bytes_sent.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                        if let Err(e) = sink.feed(WsMessage::binary(chunk)).await {
                            return End::Failed(e.to_string());
                        }
                    }
                    link.queued.fetch_sub(bytes.len(), Ordering::AcqRel);
                }
                Outgoing::Close(reason) => {
                    let _ = sink
                        .feed(WsMessage::Close(Some(close_frame(CloseCode::Normal, &reason))))
                        .await;
                    let _ = sink.flush().await;
                    return End::Closed(reason);
                }
            }
            next = rx.try_recv().ok();
        }
        if let Err(e) = sink.flush().await {
            return End::Failed(e.to_string());
        }
    }
    End::Closed("the node dropped the connection".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outbox_bounds_messages_and_bytes_and_refuses_a_message_over_the_limit() {
        let limits = Limits {
            send_queue_depth: 3,
            send_queue_bytes: 1_000,
            max_envelope_bytes: 600,
            ..Limits::default()
        };
        let kill = CancellationToken::new();
        let (outbox, mut rx, link) = Outbox::new(&limits, kill.clone());
        let msg = |n: usize| Outgoing::Message(vec![0; n]);
        assert_eq!(outbox.send(msg(601)), Err(Cut::TooLarge { size: 601, max: 600 }));
        assert_eq!(outbox.send(msg(600)), Ok(()));
        assert_eq!(
            outbox.send(msg(401)),
            Err(Cut::QueueBytes {
                queued: 600,
                size: 401,
                budget: 1_000
            })
        );
        assert_eq!(outbox.send(msg(400)), Ok(()));
        assert_eq!(outbox.send(Outgoing::Close("bye".into())), Ok(()));
        assert_eq!(link.queued.load(Ordering::Acquire), 1_000);
        assert_eq!(outbox.send(msg(0)), Err(Cut::QueueFull { depth: 3 }));
        assert_eq!(
            link.queued.load(Ordering::Acquire),
            1_000,
            "a refused message holds nothing"
        );
        // The writer hands the first message to the WebSocket: its bytes are free again.
        assert!(matches!(rx.try_recv(), Ok(Outgoing::Message(b)) if b.len() == 600));
        link.queued.fetch_sub(600, Ordering::AcqRel);
        assert_eq!(outbox.send(msg(600)), Ok(()));
        // A cut names its reason before the connection task sees the token.
        outbox.cut(Cut::QueueFull { depth: 3 });
        assert!(kill.is_cancelled());
        assert_eq!(link.cut.get(), Some(&Cut::QueueFull { depth: 3 }));
        assert!(Cut::QueueBytes {
            queued: 1,
            size: 2,
            budget: 3
        }
        .to_string()
        .contains("3-byte send queue"));
        // Once cut, it drops what it is sent: the cut is counted once.
        assert_eq!(outbox.send(msg(601)), Ok(()));
        assert_eq!(link.queued.load(Ordering::Acquire), 1_000);
        // A connection that has ended takes messages silently; they hold nothing.
        let (outbox, rx, link) = Outbox::new(&limits, CancellationToken::new());
        drop(rx);
        assert_eq!(outbox.send(msg(10)), Ok(()));
        assert_eq!(link.queued.load(Ordering::Acquire), 0);
    }
}
