//! Hybrid logical clock timestamps: 48 bits of milliseconds since the Unix epoch and a
//! 16-bit logical counter, in one `u64`.
//!
//! The clock reads no time itself: the caller passes the wall time in, so the core stays
//! deterministic and a simulator can drive it with virtual time.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A point in hybrid logical time. Orders like `(millis, logical)`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
pub struct Hlc(u64);

const LOGICAL_BITS: u32 = 16;
const LOGICAL_MASK: u64 = (1 << LOGICAL_BITS) - 1;
/// The largest wall time an HLC can carry, in milliseconds since the epoch (year 10889).
pub const MAX_MILLIS: u64 = (1 << 48) - 1;

impl Hlc {
    /// Makes a timestamp from its parts. Milliseconds above [`MAX_MILLIS`] saturate.
    pub fn new(millis: u64, logical: u16) -> Self {
        Self((millis.min(MAX_MILLIS) << LOGICAL_BITS) | u64::from(logical))
    }

    /// Milliseconds since the Unix epoch.
    pub fn millis(self) -> u64 {
        self.0 >> LOGICAL_BITS
    }

    /// The logical counter.
    pub fn logical(self) -> u16 {
        (self.0 & LOGICAL_MASK) as u16
    }

    /// The raw 64-bit value, as encoded on the wire.
    pub fn as_u64(self) -> u64 {
        self.0
    }

    /// Rebuilds a timestamp from its raw value.
    pub fn from_u64(raw: u64) -> Self {
        Self(raw)
    }
}

impl fmt::Debug for Hlc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.millis(), self.logical())
    }
}

impl fmt::Display for Hlc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A remote timestamp was refused because it runs too far ahead of our wall clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("remote clock is {ahead_ms} ms ahead of ours, more than the {max_skew_ms} ms allowed; check NTP on both hosts (nothing was changed)")]
pub struct ClockSkew {
    /// How far ahead the remote timestamp is.
    pub ahead_ms: u64,
    /// The allowed skew.
    pub max_skew_ms: u64,
}

/// A hybrid logical clock: never goes backwards, and stays close to wall time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HlcClock {
    last: Hlc,
}

impl HlcClock {
    /// A clock that has issued nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A clock that will never issue a timestamp at or below `last` (for example the
    /// greatest timestamp found in a replica loaded from disk).
    pub fn resume_after(last: Hlc) -> Self {
        Self { last }
    }

    /// The greatest timestamp this clock has issued or observed.
    pub fn last(&self) -> Hlc {
        self.last
    }

    /// Issues a new timestamp, greater than every one issued or observed before.
    pub fn tick(&mut self, wall_ms: u64) -> Hlc {
        let wall = wall_ms.min(MAX_MILLIS);
        let next = if wall > self.last.millis() {
            Hlc::new(wall, 0)
        } else if self.last.logical() < u16::MAX {
            Hlc(self.last.0 + 1)
        } else {
            // The logical counter is spent: borrow the next millisecond.
            Hlc::new(self.last.millis() + 1, 0)
        };
        self.last = next;
        next
    }

    /// Takes in a timestamp from a peer, so later ticks order after it.
    ///
    /// # Errors
    /// [`ClockSkew`] when `remote` is more than `max_skew_ms` ahead of `wall_ms`; the clock
    /// is then unchanged, so a peer with a runaway clock cannot drag ours forward.
    pub fn observe(&mut self, remote: Hlc, wall_ms: u64, max_skew_ms: u64) -> Result<(), ClockSkew> {
        let ahead_ms = remote.millis().saturating_sub(wall_ms);
        if ahead_ms > max_skew_ms {
            return Err(ClockSkew {
                ahead_ms,
                max_skew_ms,
            });
        }
        if remote > self.last {
            self.last = remote;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_strictly_increasing_even_when_wall_time_stalls_or_goes_back() {
        let mut c = HlcClock::new();
        let a = c.tick(1_000);
        let b = c.tick(1_000);
        let d = c.tick(900);
        let e = c.tick(2_000);
        assert!(a < b && b < d && d < e);
        assert_eq!(e, Hlc::new(2_000, 0));
    }

    #[test]
    fn logical_overflow_borrows_the_next_millisecond() {
        let mut c = HlcClock::resume_after(Hlc::new(5, u16::MAX));
        assert_eq!(c.tick(5), Hlc::new(6, 0));
    }

    #[test]
    fn a_clock_far_ahead_is_refused_and_changes_nothing() {
        let mut c = HlcClock::new();
        c.tick(1_000);
        let before = c.last();
        let err = c.observe(Hlc::new(70_000, 0), 1_000, 500).unwrap_err();
        assert_eq!(err.ahead_ms, 69_000);
        assert_eq!(c.last(), before);
        c.observe(Hlc::new(1_400, 3), 1_000, 500).unwrap();
        assert!(c.tick(1_000) > Hlc::new(1_400, 3));
    }
}
