//! Whether a connection is alive: a WebSocket ping when nothing has arrived on it for a
//! while, and a close when nothing (no frame, no pong) arrives for longer.
//!
//! A silent partition (packets dropped, no FIN, no reset) closes no TCP connection, so a
//! link across the cut would keep its slot, and a node dials only when it has fewer
//! outbound connections than it keeps. Every connection must therefore prove it is alive:
//! a connection quiet for [`Timing::ping_after`] is pinged (the peer's WebSocket answers
//! with a pong as it reads), and one on which nothing arrived for
//! [`Timing::dead_after`] is closed and reported to the protocol as a disconnection, which
//! redials the slot with the usual backoff.
//!
//! Idle traffic is a measured figure, so only quiet links are pinged, and only by one side:
//! the side that dialed pings after `ping_after` of silence, the side that accepted halfway
//! between that and `dead_after`. On an idle link the dialer's ping arrives first, and the
//! acceptor, having heard it, has nothing to ask: one ping and one pong per `ping_after`. Any frame counts as
//! a sign of life, so a link that carries traffic sends no ping at all.

use std::ops::Add;
use std::time::{Duration, Instant};

/// How long a quiet connection waits before it is pinged, and before it is closed (the
/// driver's `Limits` give them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// Quiet this long, a connection is pinged (by the side that dialed it; the side that
    /// accepted it waits until halfway to `dead_after`).
    pub ping_after: Duration,
    /// Nothing arrived for this long: the connection is closed as dead.
    pub dead_after: Duration,
}

/// A point in time: the driver's `Instant` (read by the driver, never here), or the simulator's virtual time as a
/// `Duration` since its start.
pub trait Moment: Copy + Ord + Add<Duration, Output = Self> {
    /// How long after `earlier` this is (zero if it is before).
    fn since(self, earlier: Self) -> Duration;
}

impl Moment for Instant {
    fn since(self, earlier: Self) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

impl Moment for Duration {
    fn since(self, earlier: Self) -> Duration {
        self.saturating_sub(earlier)
    }
}

/// What a connection's liveness asks for at a given moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check<T = Instant> {
    /// Nothing to do before this time.
    Wait(T),
    /// Send a ping now; look again at this time.
    Ping(T),
    /// Nothing arrived for this long (at least `dead_after`): close the connection.
    Dead(Duration),
}

/// When a connection last heard from its peer, and when it last pinged it.
#[derive(Debug, Clone, Copy)]
pub struct Liveness<T = Instant> {
    ping_after: Duration,
    dead_after: Duration,
    heard: T,
    pinged: Option<T>,
}

impl<T: Moment> Liveness<T> {
    /// A connection that just opened (`now`). `outbound`: this side dialed it.
    pub fn new(timing: Timing, outbound: bool, now: T) -> Self {
        let ping_after = if outbound {
            timing.ping_after
        } else {
            (timing.ping_after + timing.dead_after) / 2
        };
        Self {
            ping_after,
            dead_after: timing.dead_after,
            heard: now,
            pinged: None,
        }
    }

    /// Something (a frame, a ping, a pong) arrived at `now`.
    pub fn heard(&mut self, now: T) {
        self.heard = now;
        self.pinged = None;
    }

    /// What to do at `now`: wait, ping (at most once per `ping_after` of silence), or close.
    pub fn check(&mut self, now: T) -> Check<T> {
        let silent = now.since(self.heard);
        let dead_at = self.heard + self.dead_after;
        if now >= dead_at {
            return Check::Dead(silent);
        }
        let ping_at = self.pinged.unwrap_or(self.heard) + self.ping_after;
        if now >= ping_at {
            self.pinged = Some(now);
            return Check::Ping((now + self.ping_after).min(dead_at));
        }
        Check::Wait(ping_at.min(dead_at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Timing {
        Timing {
            ping_after: Duration::from_secs(2),
            dead_after: Duration::from_secs(6),
        }
    }

    #[test]
    fn a_quiet_link_is_pinged_by_its_dialer_and_closed_when_nothing_answers() {
        let t0 = Duration::from_secs(1_000);
        let s = Duration::from_secs;
        let mut live = Liveness::new(limits(), true, t0);
        assert_eq!(live.check(t0), Check::Wait(t0 + s(2)));
        assert_eq!(live.check(t0 + s(2)), Check::Ping(t0 + s(4)));
        // One ping per interval of silence, not one per look.
        assert_eq!(live.check(t0 + s(3)), Check::Wait(t0 + s(4)));
        assert_eq!(live.check(t0 + s(4)), Check::Ping(t0 + s(6)));
        assert_eq!(live.check(t0 + s(6)), Check::Dead(s(6)));
    }

    #[test]
    fn anything_heard_keeps_a_link_alive_and_resets_its_ping() {
        let t0 = Duration::from_secs(1_000);
        let s = Duration::from_secs;
        let mut live = Liveness::new(limits(), true, t0);
        assert_eq!(live.check(t0 + s(2)), Check::Ping(t0 + s(4)));
        // The pong arrives: the next ping is a full interval of silence away.
        live.heard(t0 + s(2));
        assert_eq!(live.check(t0 + s(3)), Check::Wait(t0 + s(4)));
        for k in 1..100 {
            live.heard(t0 + s(k));
        }
        assert_eq!(live.check(t0 + s(100)), Check::Wait(t0 + s(101)));
    }

    #[test]
    fn the_accepting_side_waits_longer_so_one_ping_crosses_an_idle_link() {
        let t0 = Duration::from_secs(1_000);
        let s = Duration::from_secs;
        let mut dialer = Liveness::new(limits(), true, t0);
        let mut acceptor = Liveness::new(limits(), false, t0);
        assert_eq!(dialer.check(t0 + s(2)), Check::Ping(t0 + s(4)));
        // The acceptor hears the ping before its own turn comes.
        assert_eq!(acceptor.check(t0 + s(2)), Check::Wait(t0 + s(4)));
        acceptor.heard(t0 + s(2));
        assert_eq!(acceptor.check(t0 + s(4)), Check::Wait(t0 + s(6)));
        // A dialer that stopped pinging: the acceptor pings, then closes.
        assert_eq!(acceptor.check(t0 + s(6)), Check::Ping(t0 + s(8)));
        assert_eq!(acceptor.check(t0 + s(8)), Check::Dead(s(6)));
    }
}
