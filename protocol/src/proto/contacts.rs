//! Where other nodes are reached. A live member is dialed at the URL of its membership
//! registration, read from the replica when it is dialed: nothing is copied. A member
//! that stops being visible (its lease ended, it was written dead or swept, an operator
//! removed it) keeps a contact, its URL and name taken from its registration as it was
//! just before the change that hid it, so that it is dialed again should it come back: a
//! partition that outlived the leases must still heal. Members only shown as unreachable
//! are still in the replica, and are dialed like lost ones from there.
//!
//! Until issue 29 every live member had a peer record holding a copy of its URL and name,
//! about 390 bytes a member at 10,000 members. The registrations "just before" are a
//! persistent snapshot (`Replica::registrations`, `O(1)`), dropped once the change is
//! read: kept from one read of the members to the next instead, a snapshot held on to
//! every path the bootstrap changed meanwhile (a fifth more peak memory at 1,000
//! simulated nodes).

use std::collections::{BTreeMap, BTreeSet};

use roster_registry::{Change, Metadata, RegKey, Registrations, ReplicaId};

use super::membership::{member_id, member_provider, members_service, MEMBERS_SERVICE};
use super::{KnownPeer, Node, Now};

/// Where a node that is not a live member now was last reached.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Contact {
    /// The URL of its last membership (or the one it was written dead at).
    pub(super) url: Option<String>,
    /// Its name, as its membership gave it.
    pub(super) name: Option<String>,
    /// When it was last a live member or connected (wall ms).
    pub(super) last_seen_ms: u64,
}

impl Contact {
    /// The contact a membership's metadata gives, seen at `now_ms`.
    fn of(meta: &Metadata, now_ms: u64) -> Self {
        Self {
            url: meta.get("url").map(str::to_string),
            name: meta.get("name").map(str::to_string),
            last_seen_ms: now_ms,
        }
    }
}

/// The contacts of lost nodes.
#[derive(Debug, Default)]
pub(super) struct Contacts {
    /// Nodes that were members or peers and are not live members now.
    pub(super) lost: BTreeMap<ReplicaId, Contact>,
}

impl Node {
    /// Notes what `changes` did to members: a member no longer visible gets a contact,
    /// from `before` (the registrations as they were before the changes), and so does one
    /// now shown only as unreachable (from its instance: such a display may end without a
    /// change reported, once its time is up); one live again loses its own (its
    /// membership is read instead).
    pub(super) fn note_departures(&mut self, before: &Registrations, changes: &[Change], now: Now) {
        for c in changes {
            match c {
                Change::Down { service, provider } if service.as_str() == MEMBERS_SERVICE => {
                    let Some(id) = member_id(provider).filter(|id| *id != self.me.id) else {
                        continue;
                    };
                    if let Some(contact) = contact_in(before, id, now.wall_ms) {
                        self.contacts.lost.insert(id, contact);
                    }
                }
                Change::Up(i) if i.service.as_str() == MEMBERS_SERVICE => {
                    let Some(id) = member_id(&i.provider).filter(|id| *id != self.me.id) else {
                        continue;
                    };
                    if i.unreachable {
                        self.contacts.lost.insert(id, Contact::of(&i.meta, now.wall_ms));
                    } else {
                        self.contacts.lost.remove(&id);
                    }
                }
                _ => {}
            }
        }
    }

    /// The URL `id` is dialed at: its membership's while it is a live member, else its
    /// contact's.
    pub(super) fn url_of(&self, id: ReplicaId, now_ms: u64) -> Option<String> {
        self.known_contact(id, now_ms).0
    }

    /// Where `id` is dialed ([`Node::url_of`]) and its name, as its membership gives them
    /// while it is a live member, else as its contact or its last connection did.
    pub(super) fn known_contact(&self, id: ReplicaId, now_ms: u64) -> (Option<String>, Option<String>) {
        if let Some((url, name)) = self.member_contact(id, now_ms) {
            return (Some(url), Some(name));
        }
        let lost = self.contacts.lost.get(&id);
        let name = lost
            .and_then(|c| c.name.clone())
            .or_else(|| self.peers.get(&id)?.name.clone());
        (lost.and_then(|c| c.url.clone()), name)
    }

    /// Notes that `id` was heard from (connected, or its last connection closed).
    pub(super) fn seen(&mut self, id: ReplicaId, now: Now) {
        self.peers.entry(id).or_default().last_seen_ms = now.wall_ms;
        if let Some(c) = self.contacts.lost.get_mut(&id) {
            c.last_seen_ms = now.wall_ms;
        }
    }

    /// Every other node this node knows of: live members, connected peers, and peers it
    /// lost lately.
    pub fn known_peers(&self) -> Vec<KnownPeer> {
        let now_ms = self.time.wall_ms();
        let connected: BTreeSet<ReplicaId> = self.conns.values().map(|c| c.peer).collect();
        self.known_ids(now_ms)
            .into_iter()
            .map(|id| {
                let (url, name) = self.known_contact(id, now_ms);
                let lost = self.contacts.lost.get(&id);
                let peer = self.peers.get(&id);
                KnownPeer {
                    id,
                    url: url.or_else(|| peer?.advertised.clone()),
                    name,
                    last_seen_ms: match self.is_live_other(id, now_ms) {
                        true => now_ms,
                        false => lost
                            .map_or(0, |c| c.last_seen_ms)
                            .max(peer.map_or(0, |p| p.last_seen_ms)),
                    },
                    connected: connected.contains(&id),
                }
            })
            .collect()
    }

    /// The ids of every other node this node knows of, sorted.
    pub(super) fn known_ids(&self, now_ms: u64) -> BTreeSet<ReplicaId> {
        self.live_others(now_ms)
            .iter()
            .chain(self.contacts.lost.keys())
            .chain(self.peers.keys())
            .copied()
            .filter(|id| *id != self.me.id)
            .collect()
    }

    fn is_live_other(&self, id: ReplicaId, now_ms: u64) -> bool {
        self.live_others(now_ms).binary_search(&id).is_ok()
    }
}

/// The contact of member `id` in `regs`, if its membership is there.
pub(super) fn contact_in(regs: &Registrations, id: ReplicaId, now_ms: u64) -> Option<Contact> {
    let key = RegKey {
        service: members_service(),
        provider: member_provider(id),
    };
    Some(Contact::of(&regs.get(&key)?.meta, now_ms))
}

#[cfg(test)]
mod tests {
    use rand::rngs::SmallRng;
    use rand::{RngExt, SeedableRng};
    use roster_registry::Replica;

    use super::super::membership::live_members;
    use super::super::test_support::{info, membership, membership_by};
    use super::super::{Config, DialTarget, Output};
    use super::*;

    fn node(now: u64) -> Node {
        Node::new(
            info(1),
            Replica::new(ReplicaId(1)),
            vec![],
            Config::default(),
            1,
            now,
        )
        .unwrap()
    }

    #[test]
    fn a_member_whose_lease_ended_is_dialed_again_at_the_url_of_its_last_membership() {
        let mut now = 1_000_000;
        let mut n = node(now);
        n.replica.apply(membership(2, 7421, now, 10_000), now);
        // Long past its lease, and past the sweep that collects it: only the contact is left.
        let mut dialed = None;
        while now < 1_000_000 + 120_000 && dialed.is_none() {
            now = n.poll_timeout().max(now + 1);
            n.handle_timeout(now);
            while let Some(o) = n.poll_output() {
                if let Output::Dial(DialTarget::Peer { id, url }) = o {
                    dialed = Some((id, url, now));
                }
            }
        }
        let (id, url, at) = dialed.expect("member 2 was dialed");
        assert_eq!((id, url.as_str()), (ReplicaId(2), "ws://127.0.0.2:7421"));
        if at > 1_010_000 {
            assert!(n.live_others(at).is_empty(), "dialed as a lost peer");
        }
        let now = n.poll_timeout().max(1_000_000 + 130_000);
        n.handle_timeout(now);
        let known = n.known_peers();
        assert_eq!(known.len(), 1, "{known:?}");
        assert_eq!(known[0].url.as_deref(), Some("ws://127.0.0.2:7421"));
        assert_eq!(known[0].name.as_deref(), Some("n2"));
        let saved = n.memory().peers;
        assert_eq!(saved[0].url.as_deref(), Some("ws://127.0.0.2:7421"));
    }

    /// What the damping shows unreachable, kept as it does: each round, the nodes lost
    /// (not live) whose display has not ended.
    fn tend(n: &mut Node, shown: &mut Vec<(ReplicaId, u64, u64)>, now: u64) {
        let live = n.live_others(now);
        shown.retain(|(id, _, until)| !live.contains(id) && now < *until);
        n.show_unreachable(shown.clone(), Now::at(now));
    }

    /// Runs the node's rounds (lapses, sweeps, the damping's) from `now` until a round has
    /// looked past `end`; returns the time then.
    fn pass_time(n: &mut Node, shown: &mut Vec<(ReplicaId, u64, u64)>, mut now: u64, end: u64) -> u64 {
        while n.lapse_checked < end {
            now = n.poll_timeout().max(now + 1);
            n.handle_timeout(Now::at(now));
            tend(n, shown, now);
            while n.poll_output().is_some() {}
        }
        now
    }

    #[test]
    fn every_node_that_was_a_live_member_is_dialed_at_its_last_url_until_it_is_live_again() {
        // Seeds fixed here (the protocol's modules take no randomness from outside).
        let (mut returns, mut removals) = (0, 0);
        for seed in 0..100u64 {
            let mut rng = SmallRng::seed_from_u64(seed);
            let mut now = 1_000_000;
            let mut n = node(now);
            // What each member's URL was at the last look at which the replica showed it
            // (live, or only as unreachable).
            let mut model: BTreeMap<ReplicaId, String> = BTreeMap::new();
            let mut writers: BTreeMap<u64, Replica> =
                (2..8).map(|i| (i, Replica::new(ReplicaId(i)))).collect();
            let mut before: Vec<ReplicaId> = Vec::new();
            let mut shown = Vec::new();
            for _ in 0..80 {
                let other = rng.random_range(2..8u64);
                let w = writers.get_mut(&other).unwrap();
                match rng.random_range(0..6) {
                    0 | 1 => {
                        let port = rng.random_range(7000..7004);
                        let ttl = rng.random_range(5_000..60_000);
                        n.apply(ReplicaId(other), membership_by(w, port, now, ttl), Now::at(now));
                    }
                    2 => {
                        let until = now + rng.random_range(0..30_000);
                        shown.push((ReplicaId(other), now, until));
                    }
                    3 => {
                        // Another node wrote it dead and, half the time, swept it too: the
                        // delta removes the registration itself.
                        let dots = n.replica.lease_dots(ReplicaId(other));
                        let mut peer = Replica::from_state(ReplicaId(9), n.replica.state().clone(), 0);
                        if let Some(a) = peer.write_dead(ReplicaId(other), &dots, now) {
                            let mut delta = a.delta;
                            if rng.random_bool(0.5) {
                                if let Some(swept) = peer.expire(now, 0) {
                                    removals += 1;
                                    delta.join(swept.delta);
                                }
                            }
                            n.apply(ReplicaId(9), delta, Now::at(now));
                        }
                    }
                    _ => {
                        let end = now + rng.random_range(0..20_000);
                        now = pass_time(&mut n, &mut shown, now, end);
                    }
                }
                tend(&mut n, &mut shown, now);
                let live: Vec<ReplicaId> = n.live_others(now).to_vec();
                for m in live_members(&n.replica, now)
                    .iter()
                    .filter(|m| m.id != ReplicaId(1))
                {
                    let back = live.contains(&m.id) && model.contains_key(&m.id) && !before.contains(&m.id);
                    returns += usize::from(back);
                    model.insert(m.id, m.url.unwrap().to_string());
                }
                before.clone_from(&live);
                let set: BTreeSet<ReplicaId> = live.iter().copied().collect();
                let lost: BTreeMap<ReplicaId, String> =
                    n.lost_peers_of(&set, &BTreeSet::new(), now).into_iter().collect();
                for (id, url) in &model {
                    let (expected, dialed_as_lost) = match set.contains(id) {
                        true => (n.member_contact(*id, now).map(|(u, _)| u), None),
                        false => (Some(url.clone()), Some(url)),
                    };
                    let at = format!("seed {seed}, node {id:?} at {now}");
                    assert_eq!(n.url_of(*id, now), expected, "{at}");
                    assert_eq!(lost.get(id), dialed_as_lost, "{at}");
                }
            }
        }
        assert!(returns > 100, "members came back {returns} times only");
        assert!(
            removals > 50,
            "registrations were swept by a delta {removals} times only"
        );
    }
}
