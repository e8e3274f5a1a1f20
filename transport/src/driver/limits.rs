//! The limits the driver puts on peers, and the counters of how often each was hit.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::chunk::MIN_FRAME;

/// Limits on what a peer may send or hold. Going over one closes that connection with a
/// reason, counts it in [`DriverCounters`] and logs it; the node and its replica are
/// untouched.
///
/// Messages larger than a frame cross in chunks (see the driver's docs): the frame limits
/// cap each WebSocket message, [`Limits::max_envelope_bytes`] the protocol message the
/// chunks carry. Peers should share the frame limits: a node sends chunks as large as its
/// own limits allow, and a peer with smaller ones refuses them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The largest WebSocket message accepted, in bytes; also the largest chunk sent.
    pub max_message_size: usize,
    /// The largest WebSocket frame accepted, in bytes (tungstenite writes one frame per
    /// message, so this also caps a peer's messages); also the largest chunk sent.
    pub max_frame_size: usize,
    /// The largest protocol message (an encoded envelope, such as a full state) sent or
    /// accepted, in bytes, however many chunks it takes. A peer holds at most one partial
    /// message of up to this size per connection. A larger one is refused at its first
    /// chunk; this node does not send one (it closes the connection instead).
    pub max_envelope_bytes: usize,
    /// How long a connection may take from TCP accept (or dial) to an authenticated peer.
    pub handshake_timeout: Duration,
    /// Frames a peer may send per second, on average. A chunked message counts once: its
    /// continuation chunks ride on the first chunk's token when they are at least half a
    /// frame (or complete the message); smaller ones count as frames. A peer that sends
    /// faster is read more slowly (back-pressure through TCP), not cut: its own send queue
    /// then fills, and it is the one to decide its reader is too slow.
    pub frames_per_second: u32,
    /// Frames a peer may send in a burst above the average.
    pub frame_burst: u32,
    /// Messages queued to one peer before it counts as too slow and is dropped.
    pub send_queue_depth: usize,
    /// Bytes of messages queued to one peer before it counts as too slow and is dropped.
    /// At least `max_envelope_bytes`; twice that leaves room for a full state queued
    /// behind other traffic.
    pub send_queue_bytes: usize,
    /// How long a graceful shutdown may take before the remaining connections are cut.
    pub shutdown_deadline: Duration,
    /// Peer connections accepted per second from one address, on average; over it the
    /// upgrade is refused with `503` and a `Retry-After` hint the dialer honours (load
    /// shedding when a fleet reconnects at once).
    pub peer_accepts_per_second: u32,
    /// Peer connections one address may open in a burst above the average.
    pub peer_accept_burst: u32,
    /// Client connections accepted per second from one address, on average (a bucket of
    /// its own: a program that asks often is not a reconnecting fleet); over it the
    /// upgrade is refused with `503` and a `Retry-After` hint.
    pub client_accepts_per_second: u32,
    /// Client connections one address may open in a burst above the average.
    pub client_accept_burst: u32,
    /// Connections one address may hold that have not authenticated yet (a peer before the
    /// end of its handshake, a client before the application has its proof or request),
    /// so one address cannot take every inbound slot. Over it a new connection is
    /// dropped at once.
    pub max_unauthenticated_per_address: usize,
    /// A connection on which nothing arrived for this long gets a WebSocket ping (from the
    /// side that dialed it; the side that accepted it waits until halfway to `dead_after`),
    /// so a quiet link proves it is alive.
    pub ping_after: Duration,
    /// A connection on which nothing (no frame, no pong) arrived for this long is closed as
    /// dead, and its slot is redialed: a silent partition drops packets without closing
    /// anything. More than one and a half times `ping_after`, so a pong has time to come.
    pub dead_after: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_message_size: 1 << 20,
            max_frame_size: 1 << 20,
            max_envelope_bytes: 64 << 20,
            handshake_timeout: Duration::from_secs(5),
            frames_per_second: 400,
            frame_burst: 800,
            send_queue_depth: 1_024,
            send_queue_bytes: 128 << 20,
            shutdown_deadline: Duration::from_secs(2),
            peer_accepts_per_second: 5,
            peer_accept_burst: 20,
            client_accepts_per_second: 50,
            client_accept_burst: 100,
            max_unauthenticated_per_address: 8,
            // Three packets cross an idle link per ping (ping, pong, the ping's side's
            // acknowledgement): every 5 s, about 2.4 kB a minute per link. A silent node is
            // found within `dead_after` plus a probe: under 10 s.
            ping_after: Duration::from_secs(5),
            dead_after: Duration::from_secs(8),
        }
    }
}

impl Limits {
    /// The largest WebSocket message this node sends or accepts: the smaller frame limit.
    pub(super) fn frame(&self) -> usize {
        self.max_message_size.min(self.max_frame_size)
    }

    /// Checks that the limits work together.
    ///
    /// # Errors
    /// What is wrong, for [`super::StartError::Config`].
    pub(super) fn check(&self) -> Result<(), String> {
        if self.frame() < MIN_FRAME {
            return Err(format!(
                "max_message_size and max_frame_size must be at least {MIN_FRAME} bytes"
            ));
        }
        if self.send_queue_bytes < self.max_envelope_bytes {
            return Err(format!(
                "send_queue_bytes ({}) must be at least max_envelope_bytes ({}), or a message \
                 of that size could never be queued",
                self.send_queue_bytes, self.max_envelope_bytes
            ));
        }
        if self.max_unauthenticated_per_address == 0 {
            return Err(
                "max_unauthenticated_per_address must be at least 1, or no peer or client could \
                 ever connect"
                    .to_string(),
            );
        }
        if self.ping_after.is_zero() || self.dead_after <= self.ping_after.saturating_mul(3) / 2 {
            return Err(format!(
                "dead_after ({:?}) must be more than one and a half times ping_after ({:?}), \
                 which must not be zero, or a quiet link would be closed before its pong came",
                self.dead_after, self.ping_after
            ));
        }
        Ok(())
    }

    /// When a quiet connection is pinged, and closed (see [`crate::keepalive`]).
    pub fn keepalive(&self) -> crate::keepalive::Timing {
        crate::keepalive::Timing {
            ping_after: self.ping_after,
            dead_after: self.dead_after,
        }
    }
}

/// How often the driver refused or cut a peer, by reason. Each count is also a log line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DriverCounters {
    /// Inbound connections taken up (before the handshake), peers and clients.
    pub inbound_accepted: u64,
    /// Of those, client connections handed to the application.
    pub clients_accepted: u64,
    /// Inbound connections dropped at once because `max_inbound` were already open.
    pub inbound_over_cap: u64,
    /// Inbound connections dropped at once because their address already held
    /// `max_unauthenticated_per_address` connections not yet authenticated.
    pub unauthenticated_over_cap: u64,
    /// Connections that did not authenticate within the handshake timeout.
    pub handshake_timeouts: u64,
    /// Handshakes this node refused (wrong version, cluster, secret, skew, malformed).
    pub handshakes_refused: u64,
    /// Handshakes a peer refused (it names the reason in the log).
    pub handshakes_rejected: u64,
    /// Messages or frames over the size limit (a frame, or a chunked message's declared
    /// total).
    pub oversize: u64,
    /// Messages this node would not send because they are over `max_envelope_bytes`
    /// (the connection was closed instead).
    pub oversize_sent: u64,
    /// Messages that did not decode, broke the chunk format, and text frames.
    pub malformed: u64,
    /// Frames read late because the peer sent faster than the rate limit: the connection
    /// is slowed (its frames wait in TCP's buffers, so the peer's writes wait too), not cut.
    pub frames_throttled: u64,
    /// Connections cut because the peer read too slowly (its send queue filled up, in
    /// messages or in bytes).
    pub slow_peers: u64,
    /// Dials that failed (network, handshake, or another node answering).
    pub dial_failures: u64,
    /// Peer connections refused with a retry-after hint (one address connected too often).
    pub peers_shed: u64,
    /// Client connections refused with a retry-after hint (one address connected too often).
    pub clients_shed: u64,
    /// WebSocket frames sent to peers after their handshake.
    pub frames_sent: u64,
    /// Bytes of those frames (payload).
    pub bytes_sent: u64,
    /// WebSocket frames received from peers after their handshake.
    pub frames_received: u64,
    /// Bytes of those frames (payload).
    pub bytes_received: u64,
    /// WebSocket pings sent on quiet connections.
    pub pings_sent: u64,
    /// Connections closed because nothing arrived on them for `dead_after`.
    pub dead_links: u64,
}

/// The live counters, shared by the driver's tasks.
#[derive(Debug, Default)]
pub(super) struct Counts {
    pub inbound_accepted: AtomicU64,
    pub clients_accepted: AtomicU64,
    pub inbound_over_cap: AtomicU64,
    pub unauthenticated_over_cap: AtomicU64,
    pub handshake_timeouts: AtomicU64,
    pub handshakes_refused: AtomicU64,
    pub handshakes_rejected: AtomicU64,
    pub oversize: AtomicU64,
    pub oversize_sent: AtomicU64,
    pub malformed: AtomicU64,
    pub frames_throttled: AtomicU64,
    pub slow_peers: AtomicU64,
    pub dial_failures: AtomicU64,
    pub peers_shed: AtomicU64,
    pub clients_shed: AtomicU64,
    pub frames_sent: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub frames_received: AtomicU64,
    pub bytes_received: AtomicU64,
    pub pings_sent: AtomicU64,
    pub dead_links: AtomicU64,
}

/// Adds one to a counter.
pub(super) fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl Counts {
    pub(super) fn snapshot(&self) -> DriverCounters {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        DriverCounters {
            inbound_accepted: g(&self.inbound_accepted),
            clients_accepted: g(&self.clients_accepted),
            inbound_over_cap: g(&self.inbound_over_cap),
            unauthenticated_over_cap: g(&self.unauthenticated_over_cap),
            handshake_timeouts: g(&self.handshake_timeouts),
            handshakes_refused: g(&self.handshakes_refused),
            handshakes_rejected: g(&self.handshakes_rejected),
            oversize: g(&self.oversize),
            oversize_sent: g(&self.oversize_sent),
            malformed: g(&self.malformed),
            frames_throttled: g(&self.frames_throttled),
            slow_peers: g(&self.slow_peers),
            dial_failures: g(&self.dial_failures),
            peers_shed: g(&self.peers_shed),
            clients_shed: g(&self.clients_shed),
            frames_sent: g(&self.frames_sent),
            bytes_sent: g(&self.bytes_sent),
            frames_received: g(&self.frames_received),
            bytes_received: g(&self.bytes_received),
            pings_sent: g(&self.pings_sent),
            dead_links: g(&self.dead_links),
        }
    }
}

/// A token bucket of frames: `rate` a second on average, `burst` at once. Counts in
/// millionths of a frame so that a rate of a few frames a second refills smoothly.
#[derive(Debug)]
pub(super) struct TokenBucket {
    rate: u64,
    cap: u64,
    tokens: u64,
    last: Instant,
}

const UNIT: u64 = 1_000_000;

impl TokenBucket {
    pub(super) fn new(rate: u32, burst: u32, now: Instant) -> Self {
        let cap = u64::from(burst.max(1)) * UNIT;
        Self {
            rate: u64::from(rate),
            cap,
            tokens: cap,
            last: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let micros = u64::try_from(now.saturating_duration_since(self.last).as_micros()).unwrap_or(u64::MAX);
        self.last = self.last.max(now);
        self.tokens = self
            .tokens
            .saturating_add(micros.saturating_mul(self.rate))
            .min(self.cap);
    }

    /// How long from `now` until the bucket holds a frame's token (zero if it does).
    pub(super) fn wait(&mut self, now: Instant) -> Duration {
        self.refill(now);
        let missing = UNIT.saturating_sub(self.tokens);
        Duration::from_micros(missing.div_ceil(self.rate.max(1)))
    }

    /// Takes one frame's token at `now`; `false` when the bucket is empty.
    pub(super) fn take(&mut self, now: Instant) -> bool {
        self.refill(now);
        if self.tokens >= UNIT {
            self.tokens -= UNIT;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_pass_their_own_check_and_bad_mixes_do_not() {
        assert_eq!(Limits::default().check(), Ok(()));
        assert_eq!(Limits::default().frame(), 1 << 20);
        let tiny = Limits {
            max_frame_size: 100,
            ..Limits::default()
        };
        assert!(tiny.check().unwrap_err().contains("at least 4096"));
        let starved = Limits {
            send_queue_bytes: 1 << 20,
            ..Limits::default()
        };
        assert!(starved.check().unwrap_err().contains("send_queue_bytes"));
        let hasty = Limits {
            dead_after: Duration::from_secs(4),
            ..Limits::default()
        };
        assert!(hasty.check().unwrap_err().contains("dead_after"));
        let closed = Limits {
            max_unauthenticated_per_address: 0,
            ..Limits::default()
        };
        assert!(closed
            .check()
            .unwrap_err()
            .contains("max_unauthenticated_per_address"));
    }

    #[test]
    fn a_bucket_allows_its_burst_then_its_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(200, 400, t0);
        assert_eq!((0..1_000).filter(|_| b.take(t0)).count(), 400);
        // A second later, 200 more.
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!((0..1_000).filter(|_| b.take(t1)).count(), 200);
        // 5 ms buys one frame.
        let t2 = t1 + Duration::from_millis(5);
        assert!(b.take(t2));
        assert!(!b.take(t2));
        // A long pause refills only up to the burst.
        let t3 = t2 + Duration::from_secs(3_600);
        assert_eq!((0..1_000).filter(|_| b.take(t3)).count(), 400);
    }
}
