//! The crash-loop guard: what a node that restarts too often keeps to.

use std::time::Duration;

use super::{Node, Now};

/// The crash-loop guard's policy, one value for every place that acts on it: more than
/// `launches` launches within `window` put a launch under the guard ([`CrashGuard::judge`],
/// at start) until it has stayed up for `window`. Meanwhile the protocol keeps to the
/// essential ([`Node::set_crash_guard`]) and the driver turns dialing peers away for about
/// `window` ([`CrashGuard::peer_retry_after_s`]): the node dials out itself when its lease
/// needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CrashGuard {
    /// Launches allowed within the window.
    pub launches: u32,
    /// The window.
    pub window: Duration,
}

impl CrashGuard {
    /// More than 5 launches within 5 minutes.
    pub const DEFAULT: CrashGuard = CrashGuard {
        launches: 5,
        window: Duration::from_secs(300),
    };

    /// Whether a launch at `now_ms`, after the launches recorded at `launches` (wall ms,
    /// this one included), is under the guard; and how many fall within the window.
    pub fn judge(&self, launches: &[u64], now_ms: u64) -> (bool, u64) {
        let window_ms = u64::try_from(self.window.as_millis()).unwrap_or(u64::MAX);
        let since = now_ms.saturating_sub(window_ms);
        let recent = launches.iter().filter(|t| **t >= since).count() as u64;
        (recent > u64::from(self.launches), recent)
    }

    /// The least retry-after, in seconds, a node under the guard gives peers that dial it
    /// (the driver adds up to half again, spread): the window.
    pub fn peer_retry_after_s(&self) -> u64 {
        self.window.as_secs().max(1)
    }
}

/// Under the crash-loop guard, a failed dial backs off as if it had failed this many times
/// already: the long backoff (the cap) from the first failure.
pub(super) const GUARDED_FAILURES: u32 = 8;

/// Under the crash-loop guard, this node's leases are written this many times longer,
/// so a connection now and then keeps what it owns alive (at most 24 h).
pub(super) const GUARDED_LEASE_FACTOR: u64 = 4;

impl Node {
    /// Turns the crash-loop guard on or off. Under it the node keeps only the essential
    /// work (its own registrations and lease, reads, receiving deltas): at most one
    /// outbound connection, no rotation, the long backoff after a failed dial, and no full
    /// state sent unless a peer asks for one (`NeedFull`).
    pub fn set_crash_guard(&mut self, on: bool, now: impl Into<Now>) {
        let now = self.input_time(now.into());
        self.guarded = on;
        if !on {
            self.dial_more(now);
        }
    }

    /// Whether the crash-loop guard is on.
    pub fn crash_guard(&self) -> bool {
        self.guarded
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_launch_is_guarded_when_more_than_the_allowed_launches_fall_within_the_window() {
        let g = CrashGuard {
            launches: 2,
            window: Duration::from_secs(60),
        };
        let now = 1_000_000;
        // Two within the window (one at its very start), one before it.
        assert_eq!(g.judge(&[now - 61_000, now - 60_000, now], now), (false, 2));
        assert_eq!(g.judge(&[now - 60_000, now - 1, now], now), (true, 3));
        assert_eq!(g.judge(&[], now), (false, 0));
        assert_eq!(g.peer_retry_after_s(), 60);
    }
}
