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

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{SplitSink, SplitStream};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::error::CapacityError;
use tokio_tungstenite::tungstenite::http::StatusCode;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message as WsMessage};
use tokio_tungstenite::WebSocketStream;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::limits::{bump, Counts, Limits, TokenBucket};
use super::tls::Tls;
use super::unauthenticated::{LogGate, PendingGuard, Unauthenticated};
use crate::backoff::Failure;
use crate::handshake::{HandshakeConfig, HandshakeError};
use crate::message::Envelope;
use crate::proto::{ConnId, CrashGuard, DialTarget, NodeInfo};
use tokio_rustls::rustls::pki_types::CertificateDer;

mod accept;
mod dial;
mod frames;
mod outbox;
mod session;

use accept::bounded;
pub(super) use accept::{inbound, InboundGuard};
pub(super) use dial::dial;
use frames::{client_handshake, close_frame, refuse, server_handshake};
use outbox::Link;
pub(super) use outbox::{Cut, Outbox, Outgoing};
use session::run;

/// The WebSocket subprotocol roster peers speak; the server echoes it.
pub(super) const SUBPROTOCOL: &str = "roster.v1";
/// The application's own protocol, served on the node's listener beside the peers'
/// (`roster.v1`): a connection that asks for `name` is upgraded and handed to `conns`.
/// The transport knows nothing else of it (the agent's client protocol lives in `node/`).
#[derive(Debug, Clone)]
pub struct ClientProtocol {
    /// The WebSocket subprotocol clients ask for; not the peers' `roster.v1`.
    pub name: &'static str,
    /// Where its connections go after the upgrade.
    pub conns: mpsc::Sender<ClientConn>,
}
/// Source addresses tracked for the peer accept rate (the map is reset past it).
const MAX_ACCEPT_BUCKETS: usize = 4_096;
/// How long a node that another node answered for is left alone.
const WRONG_PEER_RETRY_MS: u64 = 5 * 60 * 1000;
/// The most a connection reads from its socket at a time. tungstenite zero-fills that much
/// of its read buffer before every read: at its default (128 KiB), 5% of a writing agent's
/// CPU under churn went to that, for messages of a few hundred bytes.
const READ_BUFFER_BYTES: usize = 16 * 1024;
/// How long a closing connection waits for the peer's close frame.
const CLOSE_LINGER: Duration = Duration::from_secs(1);
/// The longest close reason a WebSocket close frame carries, in bytes.
const MAX_CLOSE_REASON: usize = 123;

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
    pub clients: Option<ClientProtocol>,
    /// Told what each published snapshot cost.
    pub on_snapshot: Option<super::SnapshotObserver>,
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
    /// The least retry-after, in seconds, peers are given meanwhile (the guard's window,
    /// `CrashGuard::peer_retry_after_s`).
    pub guard_retry_s: u64,
    /// Cleared by [`super::Handle::stop`]: the shutdown that follows keeps what the node
    /// owns (peers keep it within its lease) instead of leaving.
    pub leave: AtomicBool,
    next_conn: AtomicU64,
}

/// A byte stream a client connection runs over (TCP, or TLS over TCP).
pub trait ClientStream: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> ClientStream for T {}

/// A client connection (of the [`ClientProtocol`]), upgraded and handed to the
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
        clients: Option<ClientProtocol>,
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
            on_snapshot: None,
            accepts: std::sync::Mutex::new(std::collections::HashMap::new()),
            client_accepts: std::sync::Mutex::new(std::collections::HashMap::new()),
            unauthenticated: Arc::new(Unauthenticated::default()),
            log_gate: LogGate::default(),
            refuse_peers: AtomicBool::new(false),
            guard_retry_s: CrashGuard::DEFAULT.peer_retry_after_s(),
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
    /// A certificate expired, or not valid yet, by one side's clock: while certificates
    /// are valid by the true time, a clock that runs far ahead or behind (`TlsClock`).
    TlsClock(String),
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
            // One out of its dates by a clock: it verifies again once the clock is set
            // right, as a refusal for clock skew does (a node a year ahead, back without a
            // restart, waited out two-minute backoffs toward every peer).
            Fail::TlsClock(_) => Failure::Clock,
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
            | Fail::TlsClock(_)
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
            Fail::TlsClock(e) => format!(
                "TLS handshake failed: {e}: a certificate is out of its dates by one side's clock; check NTP on both hosts"
            ),
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
            Fail::Timeout
            | Fail::Network(_)
            | Fail::Tls(_)
            | Fail::TlsClock(_)
            | Fail::Busy(_)
            | Fail::Cancelled => None,
        }
    }
}

/// A dial's TLS handshake that failed: rustls reports its own errors (certificates,
/// alerts) as invalid data; a certificate out of its dates, ours by the peer's clock
/// (its alert) or the peer's by ours, is the clock's failure, not the credentials'.
fn tls_dial_fail(e: std::io::Error) -> Fail {
    use tokio_rustls::rustls::{AlertDescription, CertificateError, Error as TlsError};
    if e.kind() != std::io::ErrorKind::InvalidData {
        return Fail::Network(format!("TLS: {e}"));
    }
    let dates = match e.get_ref().and_then(|inner| inner.downcast_ref::<TlsError>()) {
        Some(TlsError::InvalidCertificate(c)) => matches!(
            c,
            CertificateError::Expired
                | CertificateError::ExpiredContext { .. }
                | CertificateError::NotValidYet
                | CertificateError::NotValidYetContext { .. }
        ),
        Some(TlsError::AlertReceived(a)) => *a == AlertDescription::CertificateExpired,
        _ => false,
    };
    if dates {
        Fail::TlsClock(e.to_string())
    } else {
        Fail::Tls(e.to_string())
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

type WsRead<S> = SplitStream<WebSocketStream<S>>;
type WsWrite<S> = SplitSink<WebSocketStream<S>, WsMessage>;

#[cfg(test)]
mod tests {
    use super::*;

    /// The fault soak: a node whose clock ran a year ahead found every certificate expired
    /// (and its peers got its `CertificateExpired` alert), and those dials backed off as
    /// bad credentials, two minutes at the first failure, on both sides and across its
    /// restart; back at the true time, it waited them out (a side of a partition with no
    /// link for a minute, a write not across it in 5 s). Out of its dates by a clock, a
    /// certificate is the clock's failure: reset when the clock comes back.
    #[test]
    fn a_certificate_out_of_its_dates_fails_a_dial_as_the_clock_and_a_bad_one_as_credentials() {
        use tokio_rustls::rustls::{AlertDescription, CertificateError, Error as TlsError};
        let io = |e: TlsError| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
        let clock = [
            TlsError::InvalidCertificate(CertificateError::Expired),
            TlsError::InvalidCertificate(CertificateError::NotValidYet),
            TlsError::AlertReceived(AlertDescription::CertificateExpired),
        ];
        for e in clock {
            let fail = tls_dial_fail(io(e));
            assert!(matches!(fail, Fail::TlsClock(_)), "{fail:?}");
            assert_eq!(fail.failure(), Failure::Clock);
        }
        let credentials = [
            TlsError::InvalidCertificate(CertificateError::UnknownIssuer),
            TlsError::AlertReceived(AlertDescription::BadCertificate),
        ];
        for e in credentials {
            assert_eq!(tls_dial_fail(io(e)).failure(), Failure::Auth);
        }
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        assert_eq!(tls_dial_fail(reset).failure(), Failure::Network);
    }

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
