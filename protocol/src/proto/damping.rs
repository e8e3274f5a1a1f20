//! Damping per failure domain: a zone cut off is not written off.
//!
//! When more than `damping_share_pct` of one other zone's members stop being live members
//! (written dead, or their lease ended) within `damping_window_ms`, this node judges the
//! zone cut off, not its nodes dead: reads show their registrations as unreachable (not
//! served unless the reader asks) and no sweep collects them, until each comes back (a
//! node written dead renews its lease as soon as it hears of it, so a healed zone is back
//! without anyone registering again) or `damping_bound_ms` after it was lost (then it is
//! gone as any dead node is). A node's own zone is never damped by it: its zone's members
//! judge their own, and a single node that dies in a healthy zone is gone as before.
//!
//! The judgement is each node's own, from what every node sees alike (the members its
//! replica holds, and when they stopped being live), so the nodes of every other zone
//! reach the same one within a gossip round or two; nothing of it is replicated. A death
//! is still written (that is how the news travels), and deaths of another zone's members
//! are held from the sweep for the window, so the registrations are still there when the
//! zone's share crosses the line.
//!
//! Links across a border are few (see `borders`), so a cut is seen first by a border node
//! or two. When such a node writes a member of another zone dead, it tests the zone: it
//! dials a few other members of it, each for an exchange; one that does not answer is
//! suspected at once (and written dead if no peer reaches it), so a cut zone shows as
//! one, while a node that died alone in a reachable zone does not take its zone with it.

use std::collections::{BTreeMap, BTreeSet};

use rand::RngExt;
use roster_registry::ReplicaId;

use roster_registry::Change;

use super::membership::{has_left, members_service};
use super::{DialTarget, Node, Now, Output, Zone};

/// Zones with fewer members than this are never damped: in a zone of one or two, one
/// death is half the zone or more, and damping it would keep every such death shown for
/// the whole bound.
pub const MIN_DAMPED_ZONE: usize = 3;

/// How many other members of a zone a node dials when it writes one of them dead.
const ZONE_TEST_DIALS: usize = 3;

/// A member lost lately: its zone, and when this node saw it go (wall ms).
#[derive(Debug, Clone)]
struct Lost {
    zone: Zone,
    at_ms: u64,
}

/// What this node knows of other zones' losses.
#[derive(Debug, Default)]
pub(super) struct Damping {
    /// Every live member at the last look (not this node), with its zone.
    live: BTreeMap<ReplicaId, Zone>,
    /// Members lost within the bound, and not back.
    lost: BTreeMap<ReplicaId, Lost>,
    /// Zones judged cut off, with when (wall ms).
    damped: BTreeMap<Zone, u64>,
    /// Members dialed to test their zone: one that does not answer is suspected.
    testing: BTreeSet<ReplicaId>,
    /// Whether the members were of more than one zone at the last reconnect round: a
    /// cluster of one zone skips all of this.
    pub(super) zoned: bool,
}

impl Node {
    /// Each gossip round: notes which members were lost since the last, judges the zones,
    /// and shows the lost members of damped zones as unreachable.
    pub(super) fn tend_damping(&mut self, now: Now) {
        let d = &self.damping;
        if !d.zoned && d.live.is_empty() && d.lost.is_empty() {
            return;
        }
        let bound = self.cfg.damping_bound_ms;
        let live: BTreeMap<ReplicaId, Zone> = self
            .live_all(now.wall_ms)
            .iter()
            .filter(|m| m.id != self.me.id && !m.unreachable)
            .map(|m| (m.id, Zone::new(&m.zone).unwrap_or_default()))
            .collect();
        let gone: Vec<(ReplicaId, Zone)> = self
            .damping
            .live
            .iter()
            .filter(|(id, _)| !live.contains_key(id) && !has_left(&self.replica, **id))
            .map(|(id, z)| (*id, z.clone()))
            .collect();
        let d = &mut self.damping;
        for (id, zone) in gone {
            d.lost.entry(id).or_insert(Lost {
                zone,
                at_ms: now.wall_ms,
            });
        }
        d.lost
            .retain(|id, l| !live.contains_key(id) && now.wall_ms < l.at_ms.saturating_add(bound));
        d.live = if d.zoned { live } else { BTreeMap::new() };
        self.judge_zones(now);
        let shown: Vec<(ReplicaId, u64, u64)> = self
            .damping
            .lost
            .iter()
            .filter(|(_, l)| self.damping.damped.contains_key(&l.zone))
            .map(|(id, l)| (*id, l.at_ms, l.at_ms.saturating_add(bound)))
            .collect();
        self.show_unreachable(shown, now);
    }

    /// Shows `shown` as unreachable (see [`roster_registry::Replica::set_unreachable`]) and
    /// tells what changed.
    pub(super) fn show_unreachable(&mut self, shown: Vec<(ReplicaId, u64, u64)>, now: Now) {
        let changes = self.replica.set_unreachable(shown, now.wall_ms);
        self.emit_changes(changes, now);
    }

    /// Damps each other zone whose recent losses pass the share, and lifts the damping of
    /// a zone once its members still lost no longer pass it (the cut healed: those that
    /// came back renewed, those that did not are dead). A zone's members still lost when
    /// its damping lifts are hidden, and held from the sweep for another window: one slow
    /// to hear of its death may still renew. (Kept damped while any member was lost, a
    /// zone showed a node that died during the cut as unreachable until the sweep of its
    /// own zone, which waits 90 s after a start, reached it: 24 s after the heal in the
    /// three-zone Jepsen run.)
    fn judge_zones(&mut self, now: Now) {
        let d = &mut self.damping;
        let mine = &self.me.zone;
        let recent_from = now.wall_ms.saturating_sub(self.cfg.damping_window_ms);
        // Per zone: members (live and lost), lost lately, lost.
        let mut zones: BTreeMap<Zone, (usize, usize, usize)> = BTreeMap::new();
        for z in d.live.values() {
            zones.entry(z.clone()).or_default().0 += 1;
        }
        for l in d.lost.values() {
            let e = zones.entry(l.zone.clone()).or_default();
            e.0 += 1;
            e.1 += usize::from(l.at_ms >= recent_from);
            e.2 += 1;
        }
        let share = usize::from(self.cfg.damping_share_pct);
        let passes = |n: usize, members: usize| members >= MIN_DAMPED_ZONE && n * 100 > share * members;
        let lifted: Vec<Zone> = d
            .damped
            .keys()
            .filter(|z| {
                zones
                    .get(*z)
                    .is_none_or(|(members, _, lost)| !passes(*lost, *members))
            })
            .cloned()
            .collect();
        for z in &lifted {
            d.damped.remove(z);
            for l in d.lost.values_mut().filter(|l| l.zone == *z) {
                l.at_ms = now.wall_ms;
            }
        }
        for (z, (members, recent, _)) in zones {
            if z != *mine && !lifted.contains(&z) && passes(recent, members) {
                d.damped.entry(z).or_insert(now.wall_ms);
            }
        }
    }

    /// A member of another zone came up: from now on this node tracks other zones' losses
    /// (before the next reconnect round says so, or a zone lost early would go unseen).
    pub(super) fn note_zone_of(&mut self, change: &Change) {
        if let Change::Up(i) = change {
            let zone = Zone::name_of(i.meta.get("zone"));
            if !self.damping.zoned && i.service == members_service() && zone != self.me.zone.as_str() {
                self.damping.zoned = true;
            }
        }
    }

    /// Members lost within the window: the sweep leaves them to the judgement (another
    /// zone's), or to their refutation. A node of this zone written dead from across a cut
    /// hears of it when this node does, at the heal, and renews at once; swept here
    /// meanwhile, its registrations were written anew (a heal of 21 nodes in the
    /// simulator rewrote one or two, seed 9).
    pub(super) fn held_from_sweep(&self, now: Now) -> BTreeSet<ReplicaId> {
        let recent_from = now.wall_ms.saturating_sub(self.cfg.damping_window_ms);
        self.damping
            .lost
            .iter()
            .filter(|(_, l)| l.at_ms >= recent_from)
            .map(|(id, _)| *id)
            .collect()
    }

    /// `peer` was written dead here: if it is of another zone, dials a few other members of
    /// that zone for an exchange, to tell a cut zone from a death. Each of those written
    /// dead in turn tests a few more, so a cut zone is found whole (once it is damped too:
    /// a member nobody tested would be listed live until its lease ends), while a death in a
    /// reachable zone stops at the first dials.
    pub(super) fn test_zone_of(&mut self, peer: ReplicaId, now: Now) {
        let Some(zone) = self.damping.live.get(&peer).cloned() else {
            return;
        };
        if zone == self.me.zone || !self.cfg.dial {
            return;
        }
        let connected: BTreeSet<ReplicaId> = self.conns.values().map(|c| c.peer).collect();
        let mut candidates: Vec<ReplicaId> = self
            .damping
            .live
            .iter()
            .filter(|(id, z)| **z == zone && **id != peer && !connected.contains(id))
            .filter(|(id, _)| !self.suspects.contains_key(id) && !self.damping.testing.contains(id))
            .filter(|(id, _)| self.peers.get(id).is_none_or(|p| p.dialing.is_none()))
            .map(|(id, _)| *id)
            .collect();
        let urls: BTreeMap<ReplicaId, String> = self
            .members(now.wall_ms)
            .into_iter()
            .map(|(id, u, _)| (id, u))
            .collect();
        for _ in 0..ZONE_TEST_DIALS {
            if candidates.is_empty() {
                break;
            }
            let id = candidates.swap_remove(self.rng.random_range(0..candidates.len()));
            let Some(url) = urls.get(&id).cloned() else {
                continue;
            };
            let p = self.peers.entry(id).or_default();
            p.dialing = Some(now.mono_ms);
            p.sync_dial = true;
            self.damping.testing.insert(id);
            self.counters.dials += 1;
            self.counters.zone_test_dials += 1;
            self.outputs.push_back(Output::Dial(DialTarget::Peer { id, url }));
        }
    }

    /// A dial to `peer` ended: answered (`reached`) or not. One that tested a zone and
    /// failed makes `peer` a suspect at once.
    pub(super) fn zone_test_ended(&mut self, peer: ReplicaId, reached: bool, now: Now) {
        if self.damping.testing.remove(&peer) && !reached {
            self.suspect(peer, true, now);
        }
    }

    /// The members shown as unreachable, by zone.
    pub fn unreachable_by_zone(&self) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for l in self.damping.lost.values() {
            if self.damping.damped.contains_key(&l.zone) {
                *out.entry(l.zone.to_string()).or_default() += 1;
            }
        }
        out
    }
}
