//! Inbound connections by source address: how many are not yet authenticated, and a gate
//! that keeps repeated refusals from one address to one log line a minute.
//!
//! One address must not take every inbound slot (`max_inbound`): a connection counts as
//! unauthenticated from its TCP accept until its peer has proved the secret (a peer's
//! handshake) or the application says its client did ([`super::ClientConn::authenticated`]),
//! and each address may hold at most [`super::Limits::max_unauthenticated_per_address`] such
//! connections. Over that, a new connection is dropped at once, counted, and logged through
//! the gate.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::quiet_log::QuietLog;

/// At most one log line per address in this long (refusals, handshake failures).
pub(super) const LOG_INTERVAL: Duration = Duration::from_secs(60);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How many connections each address holds that have not authenticated yet.
#[derive(Debug, Default)]
pub(super) struct Unauthenticated {
    by_address: Mutex<HashMap<IpAddr, usize>>,
}

impl Unauthenticated {
    /// A place for one more unauthenticated connection from `ip`, or `None` when it holds
    /// `max` already. The place is given back when the guard drops. The map holds only
    /// addresses with a connection open, so it is bounded by the inbound cap.
    pub(super) fn admit(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<PendingGuard> {
        let mut map = lock(&self.by_address);
        let held = map.entry(ip).or_insert(0);
        if *held >= max {
            if *held == 0 {
                map.remove(&ip);
            }
            return None;
        }
        *held += 1;
        Some(PendingGuard {
            counts: Arc::clone(self),
            ip,
        })
    }

    /// How many connections from `ip` are unauthenticated now.
    #[cfg(test)]
    fn held(&self, ip: IpAddr) -> usize {
        lock(&self.by_address).get(&ip).copied().unwrap_or(0)
    }
}

/// One unauthenticated connection's place; dropped when it authenticates or ends.
#[derive(Debug)]
pub(crate) struct PendingGuard {
    counts: Arc<Unauthenticated>,
    ip: IpAddr,
}

impl Drop for PendingGuard {
    fn drop(&mut self) {
        let mut map = lock(&self.counts.by_address);
        if let Some(held) = map.get_mut(&self.ip) {
            *held = held.saturating_sub(1);
            if *held == 0 {
                map.remove(&self.ip);
            }
        }
    }
}

/// Logs of repeated refusals: at most one line per address per [`LOG_INTERVAL`]; the line
/// says how many were left out since the last one. The counters count every refusal. Shared
/// by the connection tasks, so a [`QuietLog`] behind a lock, on a clock from the gate's start.
#[derive(Debug)]
pub(super) struct LogGate {
    origin: Instant,
    quiet: Mutex<QuietLog<IpAddr>>,
}

impl Default for LogGate {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
            quiet: Mutex::new(QuietLog::new(LOG_INTERVAL.as_millis() as u64)),
        }
    }
}

impl LogGate {
    /// Whether to log a refusal from `ip` at `now`: `Some(n)`, with `n` the refusals from
    /// it left out of the log since its last line, or `None` to leave this one out.
    pub(super) fn admit(&self, ip: IpAddr, now: Instant) -> Option<u64> {
        let ms = now.saturating_duration_since(self.origin).as_millis() as u64;
        lock(&self.quiet).allow(ip, ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_holds_at_most_its_cap_of_unauthenticated_connections() {
        let counts = Arc::new(Unauthenticated::default());
        let (a, b): (IpAddr, IpAddr) = ("127.0.0.2".parse().unwrap(), "127.0.0.1".parse().unwrap());
        let held: Vec<PendingGuard> = (0..3).filter_map(|_| counts.admit(a, 3)).collect();
        assert_eq!(held.len(), 3);
        assert!(counts.admit(a, 3).is_none(), "a fourth from the same address");
        let other = counts.admit(b, 3);
        assert!(other.is_some(), "another address is not affected");
        drop(held);
        assert_eq!(counts.held(a), 0, "places are given back");
        assert!(counts.admit(a, 3).is_some());
        assert!(counts.admit(a, 0).is_none(), "a cap of zero admits nobody");
    }

    #[test]
    fn repeated_refusals_from_one_address_log_once_a_minute_with_the_count_left_out() {
        let gate = LogGate::default();
        let t0 = Instant::now();
        let (a, b): (IpAddr, IpAddr) = ("127.0.0.2".parse().unwrap(), "127.0.0.1".parse().unwrap());
        assert_eq!(gate.admit(a, t0), Some(0));
        let logged = (1..1_000)
            .filter(|k| gate.admit(a, t0 + Duration::from_millis(*k)).is_some())
            .count();
        assert_eq!(logged, 0);
        assert_eq!(gate.admit(b, t0), Some(0), "each address has its own line");
        assert_eq!(gate.admit(a, t0 + LOG_INTERVAL), Some(999));
        assert_eq!(gate.admit(a, t0 + LOG_INTERVAL), None);
    }
}
