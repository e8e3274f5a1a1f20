//! A connection after its handshake: frames both ways, keepalive pings, the read budget,
//! and how it ends.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::error::CapacityError;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::{Error as WsError, Message as WsMessage};
use tokio_tungstenite::WebSocketStream;
use tracing::{debug, warn};

use super::{close_frame, ConnEvent, Cut, Link, Outbox, Outgoing, Shared, WsRead, WsWrite, CLOSE_LINGER};
use crate::driver::chunk::{self, ChunkError, Reassembler, Step};
use crate::driver::limits::{bump, Counts, TokenBucket};
use crate::keepalive::{Check, Liveness};
use crate::message::Envelope;
use crate::proto::{ConnId, NodeInfo};

/// How a connection ended.
#[derive(Debug)]
pub(super) enum End {
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
pub(super) async fn run<S>(
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
    let live = std::sync::Mutex::new(Liveness::new(
        shared.limits.keepalive(),
        outbound,
        std::time::Instant::now(),
    ));
    let ping = PingSignal::default();
    let end = tokio::select! {
        () = kill.cancelled() => End::Killed,
        end = read_loop(&mut stream, conn, &shared, &live) => end,
        end = write_loop(&mut sink, &mut rx, &link, shared.limits.frame(), &shared.counts, &ping) => end,
        silent = keepalive(&live, &ping) => End::Dead(silent),
    };
    let (frame, reason) = end.counted(&shared, &link);
    end.log(shared.node(), &who, conn, &reason);
    // A dead link would only hold the close for the linger: nothing answers on it.
    let linger = !matches!(end, End::Failed(_) | End::Dead(_)) && !shared.abort.is_cancelled();
    if linger {
        close_gently(&mut sink, &mut stream, frame, &shared).await;
    }
    let dead = matches!(end, End::Dead(_));
    let _ = shared.events.send(ConnEvent::Down { conn, reason, dead }).await;
}

impl End {
    /// Counts how it ended (the node task counted its own cuts), and what to tell the peer
    /// and the log: the close frame to send, if any, and the reason.
    fn counted(&self, shared: &Shared, link: &Link) -> (Option<CloseFrame>, String) {
        let c = &shared.counts;
        let limits = &shared.limits;
        match self {
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
        }
    }

    /// Logs it: a warning when the connection was closed for cause, a debug line when
    /// either side closed it or the network failed.
    fn log(&self, node: &str, who: &str, conn: ConnId, reason: &str) {
        match self {
            End::Oversize { .. } | End::Chunk(_) | End::Malformed(_) | End::Killed | End::Dead(_) => {
                warn!(node, peer = %who, conn, "closed the connection: {reason}")
            }
            End::Closed(_) | End::PeerClosed(_) | End::Failed(_) => {
                debug!(node, peer = %who, conn, "{reason}")
            }
        }
    }
}

/// Closes the connection gently: our close frame (or a plain close), then the peer's close
/// frame is let in, so the close handshake completes; at most for [`CLOSE_LINGER`], and
/// not past the shutdown deadline.
async fn close_gently<S>(
    sink: &mut WsWrite<S>,
    stream: &mut WsRead<S>,
    frame: Option<CloseFrame>,
    shared: &Shared,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
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

/// The keepalive's request for a ping, to the writer: sent when it is idle, or between two
/// chunks of a long message (a peer receiving a large state still answers, in order).
#[derive(Debug, Default)]
pub(super) struct PingSignal {
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
pub(super) async fn ping_if_asked<S>(
    sink: &mut WsWrite<S>,
    ping: &PingSignal,
    counts: &Counts,
) -> Result<(), WsError>
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
pub(super) async fn keepalive(live: &std::sync::Mutex<Liveness>, ping: &PingSignal) -> Duration {
    loop {
        let now = std::time::Instant::now();
        let check = match live.lock() {
            Ok(mut l) => l.check(now),
            Err(poisoned) => poisoned.into_inner().check(now),
        };
        match check {
            Check::Dead(silent) => return silent,
            Check::Ping(next) => {
                ping.ask();
                tokio::time::sleep_until(next.into()).await;
            }
            Check::Wait(next) => tokio::time::sleep_until(next.into()).await,
        }
    }
}

/// Notes that something arrived on the connection.
pub(super) fn heard(live: &std::sync::Mutex<Liveness>) {
    let now = std::time::Instant::now();
    match live.lock() {
        Ok(mut l) => l.heard(now),
        Err(poisoned) => poisoned.into_inner().heard(now),
    }
}

/// Reads frames, rate-limited, puts chunked messages back together, and hands decoded
/// envelopes to the node task. Every frame (pongs too) is a sign of life.
pub(super) async fn read_loop<S>(
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
pub(super) async fn throttle(bucket: &mut TokenBucket, counts: &Counts) {
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
pub(super) async fn write_loop<S>(
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
