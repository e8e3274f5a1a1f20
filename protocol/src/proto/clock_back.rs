//! A wall clock back from ahead: what the node does once it believes it (see `time.rs`).
//!
//! What a restart with a clock set right does, without the restart: the clock goes on
//! from now, not from the stamps it wrote ahead; watchers are told of the instances that
//! show again (their leases looked ended ahead); the node writes its membership and what
//! it owns again at the true time (peers refused them stamped ahead); and the dials its
//! peers refused for its clock may go at once.

use std::sync::Arc;

use roster_registry::{Hlc, HlcClock};

use super::membership::{member_meta, url_endpoint};
use super::resume::RESUME_BATCH;
use super::{Node, Now, OwnedRegistration};

impl Node {
    /// The time of an input, with the wall time the node goes by (see `time.rs`); a wall
    /// clock back from ahead, and leases that ended since the node last looked, are acted
    /// on before the input is.
    pub(super) fn input_time(&mut self, now: Now) -> Now {
        let now = self.time.input(now);
        if self.time.take_step_back().is_some() {
            self.clock_came_back(now);
        }
        self.report_lapsed(now);
        now
    }

    fn clock_came_back(&mut self, now: Now) {
        self.counters.clock_steps_back += 1;
        let last = self.replica.state().latest_time().min(Hlc::new(now.wall_ms, 0));
        self.clock = HlcClock::resume_after(last);
        // Reads ahead hid every instance whose lease looked ended, and watchers were told:
        // tell them what shows again.
        let shown_again = self.replica.clock_went_back(self.lapse_checked, now.wall_ms);
        self.lapse_checked = now.wall_ms;
        self.emit_changes(shown_again, now);
        if let Ok(endpoint) = url_endpoint(&self.me.url) {
            let meta = member_meta(&self.me);
            // The node's own URL and metadata were checked at its start.
            let _ = self.register_membership(endpoint, meta, now);
        }
        let owned: Vec<Arc<OwnedRegistration>> = self.owned.values().cloned().collect();
        for batch in owned.chunks(RESUME_BATCH) {
            // Each was written before: none is refused now.
            let _ = self.register_many(batch.to_vec(), now);
        }
        self.renew_at = now.mono_ms;
        for p in self.peers.values_mut().filter(|p| p.clock_refused) {
            p.backoff.not_before_ms = now.mono_ms;
        }
        for s in self.seeds.values_mut().filter(|s| s.clock_refused) {
            s.backoff.not_before_ms = now.mono_ms;
        }
    }
}
