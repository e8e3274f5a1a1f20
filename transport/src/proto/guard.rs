//! The crash-loop guard: what a node that restarts too often keeps to.

use super::{Node, Now};

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
        let now = self.time.input(now.into());
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
