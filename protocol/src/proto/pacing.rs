//! The budget of pushes: how often a node may send deltas, whatever the rate of writes.
//!
//! Every push sends one message to each connected peer that lacks something, and a peer
//! reads at most `Limits::frames_per_second` frames from a connection. So a node pushes at
//! most `rate` times a second (and `burst` at once, after a quiet spell); the writes that
//! come faster than that wait for the next push and travel in it, joined into one delta.
//! A quiet node pushes at once: pacing costs a change nothing until writes come in a
//! stream.

/// A token bucket of pushes on the protocol's monotonic milliseconds. Tokens are counted
/// in thousandths of a push, so that `rate` pushes a second refill `rate` of them a
/// millisecond.
#[derive(Debug, Clone)]
pub(super) struct Pacer {
    rate: u64,
    cap: u64,
    tokens: u64,
    last_ms: u64,
}

const PUSH: u64 = 1_000;

impl Pacer {
    /// At most `rate` pushes a second on average (at least one), `burst` at once.
    pub(super) fn new(rate: u32, burst: u32, now_ms: u64) -> Self {
        let cap = u64::from(burst.max(1)) * PUSH;
        Self {
            rate: u64::from(rate.max(1)),
            cap,
            tokens: cap,
            last_ms: now_ms,
        }
    }

    fn refill(&mut self, now_ms: u64) {
        let elapsed = now_ms.saturating_sub(self.last_ms);
        self.last_ms = self.last_ms.max(now_ms);
        self.tokens = self
            .tokens
            .saturating_add(elapsed.saturating_mul(self.rate))
            .min(self.cap);
    }

    /// When the next push may go: `now_ms` if the budget holds one, else when it will.
    pub(super) fn next_at(&mut self, now_ms: u64) -> u64 {
        self.refill(now_ms);
        let missing = PUSH.saturating_sub(self.tokens);
        now_ms + missing.div_ceil(self.rate)
    }

    /// Spends a push at `now_ms` (the budget may run into debt by less than one push when
    /// a push runs a little early; the next one then waits for it).
    pub(super) fn spend(&mut self, now_ms: u64) {
        self.refill(now_ms);
        self.tokens = self.tokens.saturating_sub(PUSH);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_goes_at_once_then_pushes_are_spaced_by_the_rate() {
        let mut p = Pacer::new(100, 3, 0);
        for _ in 0..3 {
            assert_eq!(p.next_at(0), 0);
            p.spend(0);
        }
        // Empty: the next token is 10 ms away at 100 a second.
        assert_eq!(p.next_at(0), 10);
        assert_eq!(p.next_at(4), 10);
        p.spend(10);
        assert_eq!(p.next_at(10), 20);
    }

    #[test]
    fn a_quiet_spell_refills_the_burst_and_no_more() {
        let mut p = Pacer::new(100, 2, 0);
        p.spend(0);
        p.spend(0);
        // A minute later: two pushes at once again, not six thousand.
        assert_eq!(p.next_at(60_000), 60_000);
        p.spend(60_000);
        p.spend(60_000);
        assert_eq!(p.next_at(60_000), 60_010);
    }

    #[test]
    fn a_rate_that_does_not_divide_a_second_still_waits_long_enough() {
        let mut p = Pacer::new(300, 1, 0);
        p.spend(0);
        // A third of a push a millisecond: 4 ms (ceil of 3.33) until a whole one.
        assert_eq!(p.next_at(0), 4);
        assert_eq!(p.next_at(4), 4);
    }
}
