//! The two clocks the protocol is given: a monotonic one for its timers, and the wall clock
//! for what other nodes read (HLC stamps, leases, clock-skew checks).
//!
//! Timers run on the monotonic clock, so a wall clock that steps (an NTP step, a bad RTC,
//! an operator) neither stalls them nor fires them all at once. The wall time the node uses
//! never runs slower than the monotonic clock: a wall clock that steps back is not
//! believed, and the node's wall time keeps running from where it was until the wall clock
//! is ahead of it again. Believed, a step back of an hour would stamp every write and
//! renewal an hour behind the node's own clock (the HLC does not go back, so its leases
//! would stop moving and lapse at every peer), and make every peer's message look an hour
//! ahead, refused as clock skew. A step forward is believed at once: it cannot be told
//! from the correction of a clock that ran slow.
//!
//! A step back further than the clock skew peers allow is believed when it brings the
//! wall clock back to the peers' (as their stamps tell it): the node's wall time was then
//! ahead of every peer's by more than they accept, so each of its writes and renewals
//! would be refused (a clock that ran a year ahead and came back locked its node out for
//! the year). The node then does what a restart does with a clock set right
//! (`Node::clock_came_back`). The peers' clock is the median of what the last peers heard
//! tell by their latest stamps: a peer whose clock ran ahead along with this node's (the
//! same bad NTP source) is outvoted, where the greatest stamp ever heard kept the node
//! waiting for a clock no other peer had. A clock that steps back behind the peers' is
//! still not believed, nor is a step back before any peer was heard.

use roster_registry::ReplicaId;

/// The time of an input to the protocol: both clocks, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// A monotonic clock (any origin; it never goes back): timers run on it.
    pub mono_ms: u64,
    /// The wall clock, in milliseconds since the Unix epoch: HLC stamps and leases.
    pub wall_ms: u64,
}

impl Now {
    /// Both clocks at `ms`: for a driver with one clock that never steps (a test, the
    /// simulator without clock faults).
    pub fn at(ms: u64) -> Self {
        Self {
            mono_ms: ms,
            wall_ms: ms,
        }
    }
}

impl From<u64> for Now {
    /// Both clocks at `ms` (see [`Now::at`]).
    fn from(ms: u64) -> Self {
        Self::at(ms)
    }
}

/// How many peers' clocks the guard keeps (the most recently heard).
const PEER_CLOCKS: usize = 16;

/// The node's wall time: the wall clock, except that it never runs slower than the
/// monotonic clock since the last input.
#[derive(Debug, Clone)]
pub(super) struct WallGuard {
    last: Now,
    /// A step back further than this is believed (the clock skew peers allow).
    believed_back_ms: u64,
    /// How far the wall clock stepped back, believed, since the node last asked.
    stepped_back_ms: Option<u64>,
    /// The clocks of the last peers heard, the latest last: each peer's latest stamp less
    /// the monotonic time it arrived at.
    peer_offsets: Vec<(ReplicaId, i64)>,
}

impl WallGuard {
    pub(super) fn new(now: Now, believed_back_ms: u64) -> Self {
        Self {
            last: now,
            believed_back_ms,
            stepped_back_ms: None,
            peer_offsets: Vec::with_capacity(PEER_CLOCKS),
        }
    }

    /// `peer`'s stamp (wall milliseconds), heard at `mono_ms`.
    pub(super) fn heard(&mut self, peer: ReplicaId, stamp_ms: u64, mono_ms: u64) {
        let offset = i64::try_from(stamp_ms).unwrap_or(i64::MAX) - i64::try_from(mono_ms).unwrap_or(i64::MAX);
        self.peer_offsets.retain(|(p, _)| *p != peer);
        if self.peer_offsets.len() == PEER_CLOCKS {
            self.peer_offsets.remove(0);
        }
        self.peer_offsets.push((peer, offset));
    }

    /// The peers' clock, as an offset from the monotonic clock: the median of the last
    /// peers heard (the lower of the two middle ones); `None` before any is heard.
    fn peers_offset(&self) -> Option<i64> {
        let mut offsets: Vec<i64> = self.peer_offsets.iter().map(|&(_, o)| o).collect();
        offsets.sort_unstable();
        offsets.get(offsets.len().checked_sub(1)? / 2).copied()
    }

    /// Whether `now`'s wall clock is within the allowed skew of the peers' (or ahead).
    fn agrees_with_peers(&self, now: Now) -> bool {
        let Some(offset) = self.peers_offset() else {
            return false;
        };
        let peers_ms = i64::try_from(now.mono_ms)
            .unwrap_or(i64::MAX)
            .saturating_add(offset);
        let wall_ms = i64::try_from(now.wall_ms.saturating_add(self.believed_back_ms)).unwrap_or(i64::MAX);
        wall_ms >= peers_ms
    }

    /// The time of an input, with the wall time the node goes by. A monotonic clock that
    /// went back (a driver bug) is taken as standing still.
    pub(super) fn input(&mut self, now: Now) -> Now {
        let mono_ms = now.mono_ms.max(self.last.mono_ms);
        let ran = mono_ms - self.last.mono_ms;
        let ran_on = self.last.wall_ms.saturating_add(ran);
        let back_ms = ran_on.saturating_sub(now.wall_ms);
        let wall_ms = if back_ms > self.believed_back_ms && self.agrees_with_peers(Now { mono_ms, ..now }) {
            self.stepped_back_ms = Some(back_ms);
            now.wall_ms
        } else {
            now.wall_ms.max(ran_on)
        };
        self.last = Now { mono_ms, wall_ms };
        self.last
    }

    /// How far the wall clock stepped back, believed, since the last call (see the
    /// module's documentation).
    pub(super) fn take_step_back(&mut self) -> Option<u64> {
        self.stepped_back_ms.take()
    }

    /// The wall time of the last input.
    pub(super) fn wall_ms(&self) -> u64 {
        self.last.wall_ms
    }

    /// A monotonic time as a wall time, by the last input's offset (for what outlives the
    /// process: backoffs and times saved to disk).
    pub(super) fn wall_of(&self, mono_ms: u64) -> u64 {
        let (m, w) = (self.last.mono_ms, self.last.wall_ms);
        if mono_ms >= m {
            w.saturating_add(mono_ms - m)
        } else {
            w.saturating_sub(m - mono_ms)
        }
    }

    /// A backoff saved in wall time, in monotonic time.
    pub(super) fn backoff_to_mono(&self, b: crate::backoff::Backoff) -> crate::backoff::Backoff {
        crate::backoff::Backoff {
            not_before_ms: self.mono_of(b.not_before_ms),
            ..b
        }
    }

    /// A backoff kept in monotonic time, in wall time (to save).
    pub(super) fn backoff_to_wall(&self, b: crate::backoff::Backoff) -> crate::backoff::Backoff {
        crate::backoff::Backoff {
            not_before_ms: self.wall_of(b.not_before_ms),
            ..b
        }
    }

    /// A wall time (from disk) as a monotonic time, by the last input's offset.
    pub(super) fn mono_of(&self, wall_ms: u64) -> u64 {
        let (m, w) = (self.last.mono_ms, self.last.wall_ms);
        if wall_ms >= w {
            m.saturating_add(wall_ms - w)
        } else {
            m.saturating_sub(w - wall_ms)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: u64 = 3_600_000;

    #[test]
    fn a_wall_clock_that_steps_back_is_not_believed_and_one_that_steps_forward_is() {
        let t0 = 1_700_000_000_000;
        let mut g = WallGuard::new(Now::at(t0), 2 * H);
        let at = |mono_ms, wall_ms| Now { mono_ms, wall_ms };
        // An hour back: the node's wall time keeps running with the monotonic clock.
        assert_eq!(g.input(at(t0 + 1_000, t0 + 1_000 - H)).wall_ms, t0 + 1_000);
        assert_eq!(g.input(at(t0 + 5_000, t0 + 5_000 - H)).wall_ms, t0 + 5_000);
        // The wall clock runs fast for a while: it is believed once ahead.
        assert_eq!(g.input(at(t0 + 6_000, t0 + 6_500)).wall_ms, t0 + 6_500);
        // An hour forward is believed at once.
        assert_eq!(g.input(at(t0 + 7_000, t0 + 7_000 + H)).wall_ms, t0 + 7_000 + H);
        // A monotonic clock that goes back is taken as standing still.
        let n = g.input(at(t0, t0 + 7_000 + H));
        assert_eq!((n.mono_ms, n.wall_ms), (t0 + 7_000, t0 + 7_000 + H));
    }

    #[test]
    fn a_step_back_to_the_peers_clock_beyond_the_allowed_skew_is_believed_and_reported_once() {
        let t0 = 1_700_000_000_000;
        let skew = 5_000;
        let at = |mono_ms, wall_ms| Now { mono_ms, wall_ms };
        // The node's wall clock runs an hour ahead of its peers' (their stamps say t0 at t0).
        let mut g = WallGuard::new(at(t0, t0 + H), skew);
        g.heard(ReplicaId(2), t0, t0);
        // Back by the skew: not believed, nothing reported.
        assert_eq!(
            g.input(at(t0 + 1_000, t0 + H + 1_000 - skew)).wall_ms,
            t0 + H + 1_000
        );
        assert_eq!(g.take_step_back(), None);
        // Back to the peers' clock: believed, and reported once.
        assert_eq!(g.input(at(t0 + 2_000, t0 + 2_000)).wall_ms, t0 + 2_000);
        assert_eq!(g.take_step_back(), Some(H));
        assert_eq!(g.input(at(t0 + 3_000, t0 + 3_000)).wall_ms, t0 + 3_000);
        assert_eq!(g.take_step_back(), None);
    }

    #[test]
    fn a_step_back_behind_the_peers_clock_is_not_believed() {
        let t0 = 1_700_000_000_000;
        let at = |mono_ms, wall_ms| Now { mono_ms, wall_ms };
        let mut g = WallGuard::new(Now::at(t0), 5_000);
        // No peer heard yet: nothing to believe it by.
        assert_eq!(g.input(at(t0 + 500, t0 + 500 - H)).wall_ms, t0 + 500);
        g.heard(ReplicaId(2), t0 + 500, t0 + 500);
        assert_eq!(g.input(at(t0 + 1_000, t0 + 1_000 - H)).wall_ms, t0 + 1_000);
        assert_eq!(g.take_step_back(), None);
    }

    #[test]
    fn a_peer_whose_clock_ran_ahead_with_this_one_is_outvoted_by_the_others() {
        let t0 = 1_700_000_000_000;
        let at = |mono_ms, wall_ms| Now { mono_ms, wall_ms };
        let mut g = WallGuard::new(Now::at(t0), 5_000);
        for p in 2..5 {
            g.heard(ReplicaId(p), t0, t0);
        }
        // Both clocks two hours ahead: peer 5 is heard stamping two hours ahead.
        assert_eq!(
            g.input(at(t0 + 1_000, t0 + 1_000 + 2 * H)).wall_ms,
            t0 + 1_000 + 2 * H
        );
        g.heard(ReplicaId(5), t0 + 1_000 + 2 * H, t0 + 1_000);
        // Back to the true time: three of four peers agree.
        assert_eq!(g.input(at(t0 + 2_000, t0 + 2_000)).wall_ms, t0 + 2_000);
        assert_eq!(g.take_step_back(), Some(2 * H));
    }

    #[test]
    fn the_guard_keeps_the_latest_stamp_of_the_last_peers_heard() {
        let mut g = WallGuard::new(Now::at(0), 5_000);
        for p in 0..40 {
            g.heard(ReplicaId(p % 20), 1_000 + p, 0);
        }
        assert_eq!(g.peer_offsets.len(), PEER_CLOCKS);
        let latest: Vec<u64> = g.peer_offsets.iter().map(|(p, _)| p.0).collect();
        assert_eq!(latest, (4..20).collect::<Vec<u64>>());
        assert_eq!(g.peer_offsets.last(), Some(&(ReplicaId(19), 1_039)));
    }

    #[test]
    fn times_convert_between_the_clocks_by_the_last_offset() {
        let mut g = WallGuard::new(
            Now {
                mono_ms: 10,
                wall_ms: 1_000,
            },
            5_000,
        );
        g.input(Now {
            mono_ms: 20,
            wall_ms: 1_010,
        });
        assert_eq!(g.wall_of(25), 1_015);
        assert_eq!(g.wall_of(5), 995);
        assert_eq!(g.mono_of(1_015), 25);
        assert_eq!(g.mono_of(900), 0, "saturates");
    }
}
