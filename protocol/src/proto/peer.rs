//! The records a node keeps of its connections, of the other nodes it deals with (links,
//! dials, acknowledgements, digests) and of its seeds.

use roster_registry::{CausalContext, ReplicaId};

use crate::backoff::{Backoff, BackoffPolicy, Failure};

#[derive(Debug, Clone)]
pub(super) struct Conn {
    pub(super) peer: ReplicaId,
    pub(super) outbound: bool,
    pub(super) opened_at: u64,
    /// The seed URL it was dialed as, if any.
    pub(super) seed: Option<String>,
    /// The last delta number received and not acknowledged yet (see `ack_delay_ms`).
    pub(super) ack_owed: Option<u64>,
    /// Dialed for one anti-entropy exchange (see `anti_entropy`): no pushes, no slot.
    pub(super) sync: bool,
}

/// What we know of another node we dealt with: a connection, a dial, a failure, an
/// acknowledgement, a digest. A live member we never dealt with has none: where it is
/// dialed is its membership registration's (see `contacts`).
#[derive(Debug, Clone, Default)]
pub(super) struct Peer {
    /// The last of our buffer's numbers it acknowledged.
    pub(super) acked: Option<u64>,
    /// The last of our buffer's numbers sent to it on its oldest connection, which carries
    /// all we send it (pushes send only what came after; gossip rounds resend from
    /// `acked`). Cleared when that connection closes (`Node::forget_conn`).
    pub(super) sent: Option<u64>,
    /// The number the last message that carried one to it named: numbers sent after it
    /// carried nothing for it (changes learnt from it), so its acknowledgement covers
    /// them too. Cleared with `sent`.
    pub(super) numbered: Option<u64>,
    /// When we last sent it a full state (not again before the ack or a pause); monotonic
    /// ms, like every time kept for a timer.
    pub(super) full_sent_at: Option<u64>,
    /// When what was sent and not acknowledged may be sent again (see `Config::resend_after_ms`).
    pub(super) resend_at: Option<u64>,
    /// Resends since its acknowledgement last advanced.
    pub(super) resends: u32,
    /// Since when a push to it awaits its acknowledgement (monotonic ms; see `overdue`).
    pub(super) unacked_since: Option<u64>,

    /// Its last digest (boxed: most peers, members never connected, have none).
    pub(super) digest: Option<Box<CausalContext>>,
    /// Its dial backoff, in monotonic time (saved in wall time).
    pub(super) backoff: Backoff,
    /// When its dial in flight started (monotonic ms), if one is.
    pub(super) dialing: Option<u64>,
    /// When we wrote it dead (monotonic ms): for `member_lease_ttl_ms` after, it is still
    /// dialed like a member, under its backoff, so a live node behind a healed cut is
    /// found again as fast as before deaths were written.
    pub(super) written_dead_at: Option<u64>,
    /// The name it gave when it last connected.
    pub(super) name: Option<String>,
    /// The URL it advertised when it connected (for people; dials use its membership's).
    pub(super) advertised: Option<String>,
    /// When we sent it a digest it has not answered yet (single flight).
    pub(super) digest_sent_at: Option<u64>,
    /// When a new connection to it sent our hashes and its own have not come yet: they
    /// ask for its digest if they differ, so nothing else asks meanwhile (a repair round
    /// in that millisecond sent a digest to a peer in step).
    pub(super) hashes_sent_at: Option<u64>,
    /// Its acknowledgement was taken from its digest (see `adopt_base`), not from an ack:
    /// until it acks, what it is sent is trimmed by that digest.
    pub(super) adopted: bool,
    /// A catch-up from the buffer, on its latest connection, is to have its state checked
    /// once acknowledged up to this number (see `divergence`).
    pub(super) check_state_at: Option<u64>,
    /// Its latest connection had such a check already.
    pub(super) state_checked: bool,
    /// When it was last connected.
    pub(super) last_seen_ms: u64,
    /// Its last dial was refused for clock skew (see [`Seed::clock_refused`]).
    pub(super) clock_refused: bool,
    /// Its dial in flight is for an anti-entropy exchange.
    pub(super) sync_dial: bool,
    /// When it was last sent an announcement alone (monotonic ms; see
    /// `Config::announce_spacing_ms`).
    pub(super) announced_at: Option<u64>,
    /// When its last failure was (a dial, a connection cut short, a link dead of silence;
    /// monotonic ms), in this process; `None` once a connection to it lived long enough
    /// to count as healthy. Free slots go to the peers that failed longest ago first.
    pub(super) failed_at: Option<u64>,
}

impl Peer {
    /// Whether something sent to it awaits its acknowledgement.
    pub(super) fn in_flight(&self) -> bool {
        self.sent.is_some_and(|s| self.acked.is_none_or(|a| a < s))
    }

    /// An acknowledgement arrived: what was awaited is no longer. Returns how long it
    /// took, when something was awaited (see `overdue`).
    pub(super) fn ack_arrived(&mut self, mono_ms: u64) -> Option<u64> {
        self.unacked_since
            .take()
            .map(|since| mono_ms.saturating_sub(since))
    }

    /// Records a failure: its backoff grows, and it goes behind the peers that failed
    /// longer ago. Returns the delay before it may be dialed again.
    pub(super) fn fail(&mut self, policy: &BackoffPolicy, failure: Failure, now_ms: u64, draw: u64) -> u64 {
        self.failed_at = Some(now_ms);
        self.backoff.fail(policy, failure, now_ms, draw)
    }
}

/// A seed URL and how it is dialed.
#[derive(Debug, Default)]
pub(super) struct Seed {
    /// Its dial backoff, in monotonic time (saved in wall time).
    pub(super) backoff: Backoff,
    /// When its dial in flight started (monotonic ms), if one is.
    pub(super) dialing: Option<u64>,
    /// Its last dial was refused for clock skew: a clock set right by the restart that
    /// follows must not wait out a backoff earned by the wrong one, so the next process
    /// may dial it at once (`Node::memory`).
    pub(super) clock_refused: bool,
}
