//! Whether the store can write. After a write fails (a full disk, a failing disk, a file
//! whose permissions changed), redb refuses every later write until the database is
//! opened again; the store closes it and reopens it on a backoff (1 s, doubling to a
//! minute, ±25% jitter) until a reopen works.

use std::time::{Duration, Instant};

/// The first wait before reopening after a failure.
pub const FIRST_RETRY: Duration = Duration::from_secs(1);
/// The longest wait between two reopening attempts.
pub const MAX_RETRY: Duration = Duration::from_secs(60);

/// The store cannot write: since when, the last error, and when it tries again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreHealth {
    /// When writes started to fail (wall ms).
    pub since_ms: u64,
    /// The last error (of a write, or of an attempt to reopen).
    pub last_error: String,
    /// Failures since then: the write, then each attempt to reopen.
    pub failures: u32,
    /// When the store next tries to reopen (wall ms).
    pub next_retry_ms: u64,
}

/// Healthy, or degraded with its backoff.
#[derive(Debug, Default)]
pub(super) struct Health {
    degraded: Option<Degraded>,
}

#[derive(Debug)]
struct Degraded {
    view: StoreHealth,
    delay: Duration,
    next: Instant,
}

impl Health {
    /// Records a failure at `now` (`now_ms` on the wall clock): the next attempt waits the
    /// backoff. Returns whether the store was healthy until now.
    pub(super) fn failed(&mut self, why: String, now: Instant, now_ms: u64) -> bool {
        let was_healthy = self.degraded.is_none();
        let (delay, since_ms, failures) = match &self.degraded {
            None => (FIRST_RETRY, now_ms, 1),
            Some(d) => (
                (d.delay * 2).min(MAX_RETRY),
                d.view.since_ms,
                d.view.failures.saturating_add(1),
            ),
        };
        let wait = jittered(delay);
        self.degraded = Some(Degraded {
            view: StoreHealth {
                since_ms,
                last_error: why,
                failures,
                next_retry_ms: now_ms.saturating_add(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX)),
            },
            delay,
            next: now + wait,
        });
        was_healthy
    }

    /// Whether a degraded store may try to reopen at `now` (a healthy one has nothing to do).
    pub(super) fn due(&self, now: Instant) -> bool {
        self.degraded.as_ref().is_none_or(|d| now >= d.next)
    }

    /// Makes the next attempt due now (a graceful stop tries once more, whatever the backoff).
    pub(super) fn retry_now(&mut self, now: Instant) {
        if let Some(d) = &mut self.degraded {
            d.next = now;
        }
    }

    /// Back to healthy; returns what the degraded spell was.
    pub(super) fn recovered(&mut self) -> Option<StoreHealth> {
        self.degraded.take().map(|d| d.view)
    }

    /// `None` when healthy.
    pub(super) fn view(&self) -> Option<StoreHealth> {
        self.degraded.as_ref().map(|d| d.view.clone())
    }
}

/// `d` times a random factor in 0.75..1.25, so nodes that failed together retry apart.
fn jittered(d: Duration) -> Duration {
    let r = getrandom::u32().unwrap_or(u32::MAX / 2);
    d.mul_f64(0.75 + 0.5 * (f64::from(r) / f64::from(u32::MAX)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reopen_backoff_doubles_from_a_second_to_a_minute_with_jitter() {
        let mut h = Health::default();
        let t0 = Instant::now();
        assert!(h.due(t0), "a healthy store is never held back");
        assert!(h.failed("full".into(), t0, 5_000));
        let mut expected = FIRST_RETRY;
        for n in 1..12u32 {
            let v = h.view().unwrap_or_else(|| panic!("degraded after {n} failures"));
            assert_eq!((v.since_ms, v.failures), (5_000, n));
            let wait = Duration::from_millis(v.next_retry_ms - 5_000);
            assert!(
                wait >= expected.mul_f64(0.74) && wait <= expected.mul_f64(1.26),
                "failure {n}: waits {wait:?}, expected about {expected:?}"
            );
            assert!(!h.due(t0), "failure {n}: not due before its wait");
            assert!(
                h.due(t0 + expected.mul_f64(1.26)),
                "failure {n}: due after its wait"
            );
            assert!(!h.failed(format!("full {n}"), t0, 5_000));
            expected = (expected * 2).min(MAX_RETRY);
        }
        h.retry_now(t0);
        assert!(h.due(t0));
        let spell = h.recovered().unwrap_or_else(|| panic!("was degraded"));
        assert_eq!(spell.last_error, "full 11");
        assert_eq!(h.view(), None);
    }
}
