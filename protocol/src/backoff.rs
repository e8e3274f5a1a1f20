//! The retry policy: exponential backoff with jitter and a cap, used by every retry.
//!
//! A pure function of the failure history and a random draw the caller passes in, so it is
//! tested without a clock. It follows the restart-economy rules: jitter spreads a fleet's
//! retries; a connection counts as healthy only after it has lived `healthy_after`, so a
//! proxy that cuts connections every few seconds keeps escalating the backoff instead of
//! resetting it; an authentication failure backs off for minutes.

use serde::{Deserialize, Serialize};

/// The knobs of the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffPolicy {
    /// The first delay, in milliseconds.
    pub base_ms: u64,
    /// The longest delay after an ordinary failure.
    pub cap_ms: u64,
    /// The longest delay after an authentication failure (and the delay such a failure
    /// starts at: a wrong secret will not fix itself in seconds).
    pub auth_cap_ms: u64,
    /// How long a connection must live to count as healthy and reset the backoff.
    pub healthy_after_ms: u64,
    /// The jitter, as a fraction of the delay in per mille: the delay is drawn uniformly
    /// from `d * (1 - j)` to `d * (1 + j)`.
    pub jitter_permille: u64,
    /// After a healthy connection ends (the peer restarted, say), the next attempt waits
    /// `base_ms` plus a delay drawn uniformly up to this: the peers of a node that went
    /// away come back to it spread over this window, not in one instant.
    pub reconnect_spread_ms: u64,
}

impl Default for BackoffPolicy {
    fn default() -> Self {
        Self {
            base_ms: 500,
            cap_ms: 30_000,
            auth_cap_ms: 300_000,
            healthy_after_ms: 60_000,
            jitter_permille: 500,
            reconnect_spread_ms: 20_000,
        }
    }
}

/// Why an attempt failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Failure {
    /// The peer could not be reached, refused, timed out, or dropped the connection.
    Network,
    /// The peer refused our credentials, or we refused theirs (wrong secret or cluster).
    Auth,
    /// The peer told us to come back later (it sheds load); the hint is in milliseconds.
    RetryAfter(u64),
    /// One of the two clocks runs further ahead of the other than the cluster allows. A
    /// clock is set right while the node runs (NTP, an operator) or by the restart that
    /// follows the fix, so this backs off as a network failure, not for minutes.
    Clock,
}

/// The retry state of one target (a peer, a seed, a sync). Small and serialisable, so it can
/// be saved on disk and honoured by the next process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backoff {
    /// Consecutive failures (a short-lived connection counts as one).
    pub failures: u32,
    /// No attempt before this time (milliseconds since the epoch).
    pub not_before_ms: u64,
}

impl Backoff {
    /// Whether an attempt may be made at `now_ms`.
    pub fn ready(&self, now_ms: u64) -> bool {
        now_ms >= self.not_before_ms
    }

    /// Records a failure at `now_ms` and returns the delay chosen. `draw` is a uniform random
    /// number (any `u64`), passed in so the policy stays deterministic under test.
    pub fn fail(&mut self, policy: &BackoffPolicy, failure: Failure, now_ms: u64, draw: u64) -> u64 {
        self.failures = self.failures.saturating_add(1);
        let delay = policy.delay(self.failures, failure, draw);
        self.not_before_ms = now_ms.saturating_add(delay);
        delay
    }

    /// Records that a connection closed after living `lived_ms`: a healthy one resets the
    /// backoff; a short one counts as a failure, so repeated short connections escalate.
    /// Returns the delay before the next attempt.
    pub fn closed(&mut self, policy: &BackoffPolicy, lived_ms: u64, now_ms: u64, draw: u64) -> u64 {
        if lived_ms >= policy.healthy_after_ms {
            self.failures = 0;
            // Even after a healthy connection, do not reconnect in the same instant as
            // every other peer of a node that just went away: spread over a window.
            let delay = policy
                .base_ms
                .saturating_add(draw % policy.reconnect_spread_ms.saturating_add(1));
            self.not_before_ms = now_ms.saturating_add(delay);
            delay
        } else {
            self.fail(policy, Failure::Network, now_ms, draw)
        }
    }
}

impl BackoffPolicy {
    /// The delay after the `failures`-th consecutive failure.
    pub fn delay(&self, failures: u32, failure: Failure, draw: u64) -> u64 {
        let (start, cap) = match failure {
            Failure::Auth => (
                self.auth_cap_ms.min(self.cap_ms.max(self.base_ms) * 4),
                self.auth_cap_ms,
            ),
            Failure::Network | Failure::Clock | Failure::RetryAfter(_) => (self.base_ms, self.cap_ms),
        };
        let exp = failures.saturating_sub(1).min(32);
        let nominal = start.saturating_mul(1u64 << exp).min(cap);
        let jittered = self.jittered(nominal, draw);
        match failure {
            // The peer's hint is a floor: never come back sooner than it asked.
            Failure::RetryAfter(hint) => jittered.max(hint),
            _ => jittered,
        }
    }

    /// `d` scaled by a factor drawn uniformly from `1 - j` to `1 + j`.
    pub fn jittered(&self, d: u64, draw: u64) -> u64 {
        let j = self.jitter_permille.min(1_000);
        let low = d.saturating_mul(1_000 - j) / 1_000;
        let span = d.saturating_mul(2 * j) / 1_000;
        low.saturating_add(if span == 0 { 0 } else { draw % (span + 1) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: BackoffPolicy = BackoffPolicy {
        base_ms: 500,
        cap_ms: 30_000,
        auth_cap_ms: 300_000,
        healthy_after_ms: 60_000,
        jitter_permille: 500,
        reconnect_spread_ms: 10_000,
    };

    #[test]
    fn delays_grow_exponentially_within_the_jitter_and_stop_at_the_cap() {
        let mut b = Backoff::default();
        let mut nominal = 500u64;
        for _ in 0..12 {
            // The smallest and the largest draws bound the delay.
            let lo = P.delay(b.failures + 1, Failure::Network, 0);
            let hi = P.delay(b.failures + 1, Failure::Network, u64::MAX - 1);
            assert!(
                lo >= nominal / 2 && hi <= nominal * 3 / 2,
                "{lo}..{hi} around {nominal}"
            );
            b.fail(&P, Failure::Network, 0, 7);
            nominal = (nominal * 2).min(30_000);
        }
        assert!(P.delay(40, Failure::Network, u64::MAX) <= 45_000);
    }

    #[test]
    fn jitter_spreads_a_fleet_over_the_whole_window() {
        let delays: Vec<u64> = (0..1_000u64)
            .map(|i| P.jittered(10_000, i * 7_919 + 13))
            .collect();
        let (min, max) = (*delays.iter().min().unwrap(), *delays.iter().max().unwrap());
        assert!(min < 5_500 && max > 14_500, "{min}..{max}");
        assert!(delays.iter().all(|&d| (5_000..=15_000).contains(&d)));
    }

    #[test]
    fn a_short_lived_connection_escalates_and_a_healthy_one_resets() {
        let mut b = Backoff::default();
        // A proxy that cuts every connection at 11 s: each counts as a failure.
        let mut last = 0;
        for i in 0..6 {
            let d = b.closed(&P, 11_000, i * 100_000, 0);
            assert!(d >= last, "backoff went down: {d} < {last}");
            last = d;
        }
        assert_eq!(b.failures, 6);
        // A healthy one resets, and the next attempt is spread over the reconnect window.
        assert_eq!(b.closed(&P, 60_000, 1_000_000, 0), 500);
        assert_eq!(b.failures, 0);
        assert_eq!(b.closed(&P, 60_000, 1_000_000, 10_000), 10_500);
        assert_eq!(b.closed(&P, 60_000, 1_000_000, 10_001), 500);
    }

    #[test]
    fn an_auth_failure_backs_off_for_minutes() {
        let mut b = Backoff::default();
        let first = b.fail(&P, Failure::Auth, 0, 0);
        assert!(first >= 60_000, "{first}");
        for _ in 0..10 {
            b.fail(&P, Failure::Auth, 0, u64::MAX);
        }
        assert!(P.delay(11, Failure::Auth, 0) >= 150_000);
        assert!(!b.ready(first) && b.ready(b.not_before_ms));
    }

    #[test]
    fn a_retry_after_hint_is_a_floor() {
        assert!(P.delay(1, Failure::RetryAfter(20_000), 0) >= 20_000);
    }
}
