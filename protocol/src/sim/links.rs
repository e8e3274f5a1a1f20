//! The driver's link keepalive, emulated: the dialing side pings a quiet link, the
//! accepting side later, and a link on which nothing arrived for `dead_after` is closed as
//! dead ([`crate::keepalive`], the same logic the driver runs). Off unless a test asks
//! for it ([`super::Sim::emulate_keepalive`]): with it, a lossy link can die as a real one
//! does when its pongs are lost, and its node suspects the peer behind it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::keepalive::{Check, Liveness, Timing};
use crate::proto::ConnId;

/// What a link's keepalive asks the simulator to do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Due {
    /// Send a ping on it.
    Ping,
    /// Close it as dead (nothing arrived for `dead_after`).
    Dead,
}

/// The keepalive of every open connection end.
#[derive(Debug)]
pub(super) struct Keepalives {
    timing: Timing,
    /// Each end's liveness and when it is next looked at (virtual ms).
    links: BTreeMap<ConnId, (Liveness<Duration>, u64)>,
    /// (when, end): the next looks, in order.
    due: BTreeSet<(u64, ConnId)>,
}

fn at(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

fn ms(t: Duration) -> u64 {
    u64::try_from(t.as_millis()).unwrap_or(u64::MAX)
}

impl Keepalives {
    pub(super) fn new(timing: Timing) -> Self {
        Self {
            timing,
            links: BTreeMap::new(),
            due: BTreeSet::new(),
        }
    }

    /// End `conn` opened at `now` (`outbound`: its side dialed).
    pub(super) fn opened(&mut self, conn: ConnId, outbound: bool, now: u64) {
        self.closed(conn);
        let live = Liveness::new(self.timing, outbound, at(now));
        self.links.insert(conn, (live, now));
        self.due.insert((now, conn));
    }

    /// Something (a message, a ping, a pong) arrived on end `conn` at `now`.
    pub(super) fn heard(&mut self, conn: ConnId, now: u64) {
        if let Some((live, _)) = self.links.get_mut(&conn) {
            live.heard(at(now));
        }
    }

    /// End `conn` closed.
    pub(super) fn closed(&mut self, conn: ConnId) {
        if let Some((_, next)) = self.links.remove(&conn) {
            self.due.remove(&(next, conn));
        }
    }

    /// When an end is next looked at.
    pub(super) fn next_due(&self) -> Option<u64> {
        self.due.first().map(|(t, _)| *t)
    }

    /// Looks at every end due by `now`: what each asks, in (time, end) order. A dead end is
    /// forgotten here; the caller closes it.
    pub(super) fn take_due(&mut self, now: u64) -> Vec<(ConnId, Due)> {
        let mut asked = Vec::new();
        while let Some(&(t, conn)) = self.due.first() {
            if t > now {
                break;
            }
            self.due.pop_first();
            let Some((live, next)) = self.links.get_mut(&conn) else {
                continue;
            };
            let again = match live.check(at(now)) {
                Check::Wait(t) => ms(t),
                Check::Ping(t) => {
                    asked.push((conn, Due::Ping));
                    ms(t)
                }
                Check::Dead(_) => {
                    asked.push((conn, Due::Dead));
                    self.links.remove(&conn);
                    continue;
                }
            };
            *next = again.max(now + 1);
            self.due.insert((*next, conn));
        }
        asked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Timing {
        Timing {
            ping_after: Duration::from_secs(5),
            dead_after: Duration::from_secs(8),
        }
    }

    #[test]
    fn a_quiet_end_is_pinged_then_found_dead_and_a_heard_one_is_not() {
        let mut k = Keepalives::new(limits());
        k.opened(1, true, 0);
        k.opened(2, true, 0);
        assert_eq!(k.take_due(0), vec![]);
        assert_eq!(k.next_due(), Some(5_000));
        assert_eq!(k.take_due(5_000), vec![(1, Due::Ping), (2, Due::Ping)]);
        k.heard(2, 6_000);
        assert_eq!(k.take_due(8_000), vec![(1, Due::Dead)]);
        // End 2 was heard at 6 s: its next ping is 5 s of silence later.
        assert_eq!(k.next_due(), Some(11_000));
        k.closed(2);
        assert_eq!(k.next_due(), None);
    }
}
