//! The limits the driver puts on peers, and the counters of how often each was hit.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// Limits on what a peer may send or hold. Going over one closes that connection with a
/// reason, counts it in [`DriverCounters`] and logs it; the node and its replica are
/// untouched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The largest WebSocket message accepted, in bytes.
    pub max_message_size: usize,
    /// The largest WebSocket frame accepted, in bytes (tungstenite writes one frame per
    /// message, so this also caps a peer's messages).
    pub max_frame_size: usize,
    /// How long a connection may take from TCP accept (or dial) to an authenticated peer.
    pub handshake_timeout: Duration,
    /// Frames a peer may send per second, on average.
    pub frames_per_second: u32,
    /// Frames a peer may send in a burst above the average.
    pub frame_burst: u32,
    /// Frames queued to one peer before it counts as too slow and is dropped.
    pub send_queue_depth: usize,
    /// How long a graceful shutdown may take before the remaining connections are cut.
    pub shutdown_deadline: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_message_size: 1 << 20,
            max_frame_size: 1 << 20,
            handshake_timeout: Duration::from_secs(5),
            frames_per_second: 200,
            frame_burst: 400,
            send_queue_depth: 1_024,
            shutdown_deadline: Duration::from_secs(2),
        }
    }
}

/// How often the driver refused or cut a peer, by reason. Each count is also a log line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DriverCounters {
    /// Inbound connections taken up (before the handshake).
    pub inbound_accepted: u64,
    /// Inbound connections dropped at once because `max_inbound` were already open.
    pub inbound_over_cap: u64,
    /// Connections that did not authenticate within the handshake timeout.
    pub handshake_timeouts: u64,
    /// Handshakes this node refused (wrong version, cluster, secret, skew, malformed).
    pub handshakes_refused: u64,
    /// Handshakes a peer refused (it names the reason in the log).
    pub handshakes_rejected: u64,
    /// Messages or frames over the size limit.
    pub oversize: u64,
    /// Messages that did not decode, and text frames.
    pub malformed: u64,
    /// Connections cut for sending frames faster than the rate limit.
    pub rate_limited: u64,
    /// Connections cut because the peer read too slowly (its send queue filled up).
    pub slow_peers: u64,
    /// Dials that failed (network, handshake, or another node answering).
    pub dial_failures: u64,
}

/// The live counters, shared by the driver's tasks.
#[derive(Debug, Default)]
pub(super) struct Counts {
    pub inbound_accepted: AtomicU64,
    pub inbound_over_cap: AtomicU64,
    pub handshake_timeouts: AtomicU64,
    pub handshakes_refused: AtomicU64,
    pub handshakes_rejected: AtomicU64,
    pub oversize: AtomicU64,
    pub malformed: AtomicU64,
    pub rate_limited: AtomicU64,
    pub slow_peers: AtomicU64,
    pub dial_failures: AtomicU64,
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
            inbound_over_cap: g(&self.inbound_over_cap),
            handshake_timeouts: g(&self.handshake_timeouts),
            handshakes_refused: g(&self.handshakes_refused),
            handshakes_rejected: g(&self.handshakes_rejected),
            oversize: g(&self.oversize),
            malformed: g(&self.malformed),
            rate_limited: g(&self.rate_limited),
            slow_peers: g(&self.slow_peers),
            dial_failures: g(&self.dial_failures),
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

    /// Takes one frame's token at `now`; `false` when the bucket is empty.
    pub(super) fn take(&mut self, now: Instant) -> bool {
        let micros = u64::try_from(now.saturating_duration_since(self.last).as_micros()).unwrap_or(u64::MAX);
        self.last = now;
        self.tokens = self
            .tokens
            .saturating_add(micros.saturating_mul(self.rate))
            .min(self.cap);
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
