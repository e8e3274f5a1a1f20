//! The delta buffer: the deltas a node has made or learnt lately, numbered, so each peer can
//! be sent the join of what it has not acknowledged (Algorithm 2 of the delta-state paper,
//! as Akka Distributed Data does it).
//!
//! Bounded: past `capacity` entries the oldest go, and a peer whose acknowledgement falls
//! before what remains gets a full (elided) state instead. Past [`MAX_BYTES`] of them
//! encoded, the oldest that every peer still to be sent them holds go too (`trim_held`).
//!
//! Deltas are kept encoded (the registry's wire encoding). Most are tiny (one registration
//! or one lease renewal), and a `State` of one entry costs about 1.8 KB in memory (a B-tree
//! leaf of eleven slots for its one key, another for its context, others for its key hints,
//! and its own copy of the registration's strings), where its encoding takes about 100
//! bytes. A full buffer of 1,024 such deltas was most of a node's memory in the simulator
//! (1.8 MB per node); encoded, it is about 150 KB. Reading one back costs a decode, about
//! what the clone it replaces cost.

use std::collections::{BTreeSet, VecDeque};

use roster_registry::codec::{decode_state, encode_state};
use roster_registry::{CausalContext, ReplicaId, State};

use crate::message::{ChangeId, Tagged};

/// The bytes of encoded deltas past which those every peer holds go (the newest stays):
/// a bulk load of 100,000 registrations came in deltas of 850 KB each, and the buffer
/// held ten of them (85 bytes a registration at every node) long after every peer had
/// them. About 7,000 deltas of one registration fit, so the bound binds only on bulk.
pub const MAX_BYTES: usize = 1 << 20;

/// The most peers recorded as holding one buffered delta (a node has a few links).
const MAX_KNOWN: usize = 8;

/// The newest buffered deltas an announcement is looked for in: it names changes of the
/// last announcement spacing or so, and each scan is on the path of every announcement
/// (an older delta left unmarked only costs that peer a copy or an announcement).
const KNOWN_SCAN: usize = 256;

/// One buffered delta, encoded, and the peer it came from (never sent back to it).
#[derive(Debug, Clone)]
struct Entry {
    seq: u64,
    origin: Option<ReplicaId>,
    /// Other peers known to hold every change it names (they announced them): neither
    /// pushed nor announced to them.
    known: Vec<ReplicaId>,
    /// Its registrations and leases, so the size of a join is known before it is made.
    entries: usize,
    /// The changes it carries, by name, when it travels on the trees (empty: it floods,
    /// as what a full sync taught does).
    tags: Box<[Tagged]>,
    delta: Box<[u8]>,
}

/// Who buffered deltas are for: a peer, never sent what it sent us, and the roots whose
/// changes it is not pushed (it is off their trees here: they are announced to it).
#[derive(Debug, Clone, Copy)]
pub struct Recipient<'a> {
    /// The peer.
    pub peer: ReplicaId,
    /// The roots held back from it.
    pub held: Option<&'a BTreeSet<ReplicaId>>,
}

impl From<ReplicaId> for Recipient<'_> {
    fn from(peer: ReplicaId) -> Self {
        Recipient { peer, held: None }
    }
}

impl Recipient<'_> {
    /// Whether `e` goes to this recipient: not learnt from it, and not held back (a delta
    /// that names no change, or one of a root not held back, goes).
    fn wants(&self, e: &Entry) -> bool {
        !self.has(e) && !self.holds(e)
    }

    /// Whether it has `e` already: it sent it, or announced every change it names.
    fn has(&self, e: &Entry) -> bool {
        e.origin == Some(self.peer) || e.known.contains(&self.peer)
    }

    /// Whether `e` is held back from it: every change it names is of a root held back.
    fn holds(&self, e: &Entry) -> bool {
        match self.held {
            Some(h) if !e.tags.is_empty() => e.tags.iter().all(|t| h.contains(&t.id.root)),
            _ => false,
        }
    }
}

impl Entry {
    fn delta(&self) -> State {
        // The bytes are this node's own encoding of a valid state (every delta it buffers
        // is one it ships as is, which peers decode the same way).
        decode_state(&self.delta).expect("a buffered delta is this node's own valid encoding")
    }
}

/// The bounded, numbered buffer of recent deltas.
#[derive(Debug, Clone)]
pub struct DeltaBuffer {
    entries: VecDeque<Entry>,
    head: u64,
    capacity: usize,
    /// The encoded bytes of the entries.
    bytes: usize,
    max_bytes: usize,
}

impl DeltaBuffer {
    /// An empty buffer keeping at most `capacity` deltas (at least one), trimmed past
    /// [`MAX_BYTES`].
    pub fn new(capacity: usize) -> Self {
        Self {
            entries: VecDeque::new(),
            head: 0,
            capacity: capacity.max(1),
            bytes: 0,
            max_bytes: MAX_BYTES,
        }
    }

    /// The same buffer, trimmed past `max_bytes` of encoded deltas (see `trim_held`).
    pub fn with_max_bytes(self, max_bytes: usize) -> Self {
        Self { max_bytes, ..self }
    }

    /// The sequence number of the newest delta (0 before the first).
    pub fn head(&self) -> u64 {
        self.head
    }

    /// How many deltas it holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Appends a delta learnt from `origin` (or made here, `None`); returns its number.
    pub fn push(&mut self, origin: Option<ReplicaId>, delta: State) -> u64 {
        self.push_tagged(origin, delta, Vec::new())
    }

    /// [`DeltaBuffer::push`] for a delta carrying the named changes.
    pub fn push_tagged(&mut self, origin: Option<ReplicaId>, delta: State, tags: Vec<Tagged>) -> u64 {
        self.head += 1;
        // Make room first: the deque never holds more than `capacity`, so it never grows
        // to twice that.
        while self.entries.len() >= self.capacity {
            self.pop_oldest();
        }
        let encoded = encode_state(&delta).into_boxed_slice();
        self.bytes += encoded.len();
        self.entries.push_back(Entry {
            seq: self.head,
            origin,
            known: Vec::new(),
            entries: delta.registration_count() + delta.lease_count(),
            tags: tags.into_boxed_slice(),
            delta: encoded,
        });
        // `after` finds an entry by its distance from the first: numbers without gaps.
        debug_assert!(
            self.entries
                .front()
                .is_some_and(|f| f.seq + self.entries.len() as u64 - 1 == self.head),
            "the buffered deltas are numbered without gaps up to the head"
        );
        self.head
    }

    /// Whether it holds more than its bytes of encoded deltas.
    pub fn over_bytes(&self) -> bool {
        self.bytes > self.max_bytes
    }

    /// Past its bytes, drops the oldest deltas that every one of `peers` (each with the
    /// last number it acknowledged) holds: acknowledged, sent us, or announced whole. It
    /// stops at the first one of them still lacks, and never drops the newest.
    pub fn trim_held(&mut self, peers: &[(ReplicaId, u64)]) {
        while self.over_bytes() && self.entries.len() > 1 {
            let Some(e) = self.entries.front() else { break };
            let held = |&(p, acked): &(ReplicaId, u64)| e.seq <= acked || Recipient::from(p).has(e);
            if !peers.iter().all(held) {
                break;
            }
            self.pop_oldest();
        }
    }

    fn pop_oldest(&mut self) {
        if let Some(e) = self.entries.pop_front() {
            self.bytes -= e.delta.len();
        }
    }

    /// Whether every delta after `acked` is still held, so a peer that acknowledged `acked`
    /// can be brought up to date from the buffer.
    pub fn covers(&self, acked: u64) -> bool {
        match self.entries.front() {
            Some(first) => acked + 1 >= first.seq,
            None => true,
        }
    }

    /// How far after `acked` a delta for a peer may reach and hold at most `max` entries
    /// (registrations and leases, counted per buffered delta, so at least those of the
    /// join), leaving out those learnt from `exclude`: the greatest such number, the head
    /// when all of it fits; `None` when the first delta alone holds more. Known without
    /// decoding or joining anything.
    pub fn fits_until<'a>(&self, acked: u64, to: impl Into<Recipient<'a>>, max: usize) -> Option<u64> {
        let to = to.into();
        let (mut sum, mut last) = (0, acked);
        for e in self.after(acked) {
            if to.wants(e) {
                if sum + e.entries > max {
                    return (last > acked).then_some(last);
                }
                sum += e.entries;
            }
            last = e.seq;
        }
        Some(self.head)
    }

    /// The entries after `acked`, found without walking those before: entries are
    /// numbered without gaps.
    fn after(&self, acked: u64) -> impl Iterator<Item = &Entry> {
        let skip = self
            .entries
            .front()
            .map_or(0, |first| acked.saturating_add(1).saturating_sub(first.seq));
        let skip = usize::try_from(skip).map_or(self.entries.len(), |s| s.min(self.entries.len()));
        self.entries.range(skip..).filter(move |e| e.seq > acked)
    }

    /// The join of the deltas after `acked`, leaving out those learnt from `exclude`;
    /// `None` when there is nothing to send. The caller checks [`DeltaBuffer::covers`].
    pub fn since<'a>(&self, acked: u64, to: impl Into<Recipient<'a>>) -> Option<State> {
        self.since_for(acked, to, None)
    }

    /// [`DeltaBuffer::since`], each delta trimmed for a peer that has seen `seen`
    /// ([`State::trimmed_for`]) before the join: trimming them one by one keeps the key
    /// hints of only those that remove something, where trimming their join would keep
    /// the hints of all (a thousand registrations the peer already has would still name a
    /// thousand keys).
    pub fn since_for<'a>(
        &self,
        acked: u64,
        to: impl Into<Recipient<'a>>,
        seen: Option<&CausalContext>,
    ) -> Option<State> {
        self.between_for(acked, self.head, to, seen)
    }

    /// The encoded delta [`DeltaBuffer::between_for`] (without `seen`) would join, when
    /// there is exactly one: it can be sent as buffered, without a decode, a join and an
    /// encode. Most pushes carry one delta; decoding and re-encoding it for every peer was
    /// a sixth of a writer's CPU at 5,000 changes a second.
    pub fn single_between<'a>(&self, acked: u64, until: u64, to: impl Into<Recipient<'a>>) -> Option<&[u8]> {
        let to = to.into();
        let mut wanted = self.after(acked).filter(|e| e.seq <= until && to.wants(e));
        let one = wanted.next()?;
        wanted.next().is_none().then_some(&one.delta[..])
    }

    /// [`DeltaBuffer::since_for`], up to `until` (see [`DeltaBuffer::fits_until`]).
    pub fn between_for<'a>(
        &self,
        acked: u64,
        until: u64,
        to: impl Into<Recipient<'a>>,
        seen: Option<&CausalContext>,
    ) -> Option<State> {
        let to = to.into();
        let mut out: Option<State> = None;
        let wanted = |e: &&Entry| e.seq <= until && to.wants(e);
        for e in self.after(acked).filter(wanted) {
            let delta = match seen {
                Some(c) => e.delta().trimmed_for(c),
                None => e.delta(),
            };
            out.get_or_insert_with(State::new_delta).join(delta);
        }
        out
    }

    /// The changes the deltas after `acked` up to `until` carry to `to`: those it is sent
    /// (`held` false), or those held back from it, to announce (`held` true).
    pub fn tags_between<'a>(
        &self,
        acked: u64,
        until: u64,
        to: impl Into<Recipient<'a>>,
        held: bool,
    ) -> Vec<Tagged> {
        let to = to.into();
        self.after(acked)
            .filter(|e| e.seq <= until && !to.has(e) && to.holds(e) == held)
            .flat_map(|e| e.tags.iter().copied())
            .collect()
    }

    /// `peer` announced `ids`: the buffered deltas whose every change is among them are
    /// neither pushed nor announced to it. (Both ends of a link off a tree announced each
    /// change to the other; now the later of the two, under churn most often, stays
    /// silent.)
    pub fn known_to(&mut self, peer: ReplicaId, ids: &BTreeSet<ChangeId>) {
        for e in self.entries.iter_mut().rev().take(KNOWN_SCAN) {
            let all = !e.tags.is_empty() && e.tags.iter().all(|t| ids.contains(&t.id));
            if all && e.origin != Some(peer) && !e.known.contains(&peer) && e.known.len() < MAX_KNOWN {
                e.known.push(peer);
            }
        }
    }

    /// The join of the buffered deltas that carry any of `ids`, and the changes they
    /// carry (to answer a graft); `None` when none is held any more.
    pub fn carrying(&self, ids: &BTreeSet<ChangeId>) -> Option<(State, Vec<Tagged>)> {
        let mut out: Option<(State, Vec<Tagged>)> = None;
        for e in self
            .entries
            .iter()
            .filter(|e| e.tags.iter().any(|t| ids.contains(&t.id)))
        {
            let (state, tags) = out.get_or_insert_with(|| (State::new_delta(), Vec::new()));
            state.join(e.delta());
            tags.extend(e.tags.iter().copied());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use roster_registry::{Endpoint, Hlc, ProviderId, Replica, ServiceName};

    fn deltas(n: usize) -> Vec<State> {
        let mut r = Replica::new(ReplicaId(1));
        (0..n)
            .map(|i| {
                let s = ServiceName::new(&format!("s{i}")).unwrap();
                let ep = Endpoint::new("h", 1).unwrap();
                let p = ProviderId::new("p").unwrap();
                r.register(s, p, ep, Default::default(), 1_000, Hlc::new(10 + i as u64, 0))
                    .unwrap()
                    .delta
            })
            .collect()
    }

    #[test]
    fn a_peer_gets_what_it_has_not_acknowledged_and_nothing_it_sent() {
        let mut b = DeltaBuffer::new(8);
        let ds = deltas(3);
        b.push(None, ds[0].clone());
        b.push(Some(ReplicaId(9)), ds[1].clone());
        b.push(None, ds[2].clone());
        let to_9 = b.since(1, ReplicaId(9)).unwrap();
        assert_eq!(
            to_9.registration_count(),
            1,
            "the delta from 9 is not echoed back"
        );
        let to_5 = b.since(1, ReplicaId(5)).unwrap();
        assert_eq!(to_5.registration_count(), 2);
        assert!(b.since(3, ReplicaId(5)).is_none());
        assert!(to_5.is_delta());
    }

    #[test]
    fn a_lone_delta_goes_as_buffered_and_decodes_to_what_a_join_would_send() {
        let mut b = DeltaBuffer::new(8);
        let ds = deltas(3);
        b.push(None, ds[0].clone());
        b.push(Some(ReplicaId(9)), ds[1].clone());
        b.push(None, ds[2].clone());
        // To 9, after 1: only the third (the second came from 9).
        let one = b.single_between(1, 3, ReplicaId(9)).unwrap();
        let joined = b.between_for(1, 3, ReplicaId(9), None).unwrap();
        assert_eq!(decode_state(one).unwrap(), joined);
        // Two to join, or none: no single delta.
        assert!(b.single_between(1, 3, ReplicaId(5)).is_none());
        assert!(b.single_between(3, 3, ReplicaId(5)).is_none());
        assert!(b.single_between(1, 2, ReplicaId(9)).is_none());
    }

    #[test]
    fn a_delta_for_a_peer_reaches_as_far_as_its_entries_allow() {
        let mut b = DeltaBuffer::new(8);
        let ds = deltas(3);
        // The first registration also writes its node's lease: two entries, then one each.
        let sizes: Vec<usize> = ds
            .iter()
            .map(|d| d.registration_count() + d.lease_count())
            .collect();
        assert_eq!(sizes, [2, 1, 1]);
        b.push(None, ds[0].clone());
        b.push(None, ds[1].clone());
        b.push(Some(ReplicaId(9)), ds[2].clone());
        assert_eq!(b.fits_until(0, ReplicaId(5), 4), Some(3), "all of it fits");
        assert_eq!(b.fits_until(0, ReplicaId(5), 3), Some(2));
        assert_eq!(b.fits_until(0, ReplicaId(5), 2), Some(1));
        assert_eq!(
            b.fits_until(0, ReplicaId(5), 1),
            None,
            "the first alone is too many"
        );
        // What came from the peer itself costs nothing: the limit reaches past it.
        assert_eq!(b.fits_until(1, ReplicaId(9), 1), Some(3));
        let part = b.between_for(0, 2, ReplicaId(5), None).unwrap();
        assert_eq!(part.registration_count(), 2);
        assert!(b.between_for(3, 3, ReplicaId(5), None).is_none());
    }

    #[test]
    fn overflow_uncovers_old_acknowledgements() {
        let mut b = DeltaBuffer::new(2);
        for d in deltas(5) {
            b.push(None, d);
        }
        assert_eq!((b.head(), b.len()), (5, 2));
        assert!(b.covers(3) && b.covers(5) && !b.covers(2));
    }

    #[test]
    fn past_its_bytes_the_oldest_every_peer_holds_go_but_never_the_newest() {
        let ds = deltas(5);
        let size = |d: &State| encode_state(d).len();
        // Room for the last two deltas' bytes, not three; the second came from peer 9.
        let room = size(&ds[3]) + size(&ds[4]);
        let mut b = DeltaBuffer::new(8).with_max_bytes(room);
        for (i, d) in ds.iter().cloned().enumerate() {
            b.push((i == 1).then_some(ReplicaId(9)), d);
        }
        assert!(b.over_bytes());
        // Peer 5 acknowledged the first only: nothing after it goes.
        b.trim_held(&[(ReplicaId(5), 1), (ReplicaId(9), 5)]);
        assert_eq!(b.len(), 4);
        assert!(b.covers(1) && !b.covers(0));
        // 5 acknowledged the third, 9 only the first but sent the second: 9 lacks the third.
        b.trim_held(&[(ReplicaId(5), 3), (ReplicaId(9), 1)]);
        assert_eq!(b.len(), 3, "9 lacks the third");
        b.trim_held(&[(ReplicaId(5), 3), (ReplicaId(9), 3)]);
        assert_eq!((b.head(), b.len()), (5, 2));
        assert!(b.covers(3) && !b.covers(2) && !b.over_bytes());
        // With no peer, a delta over the bound alone is kept, alone.
        let mut tiny = DeltaBuffer::new(8).with_max_bytes(1);
        tiny.push(None, ds[0].clone());
        tiny.push(None, ds[1].clone());
        tiny.trim_held(&[]);
        assert_eq!((tiny.head(), tiny.len()), (2, 1));
        let newest = encode_state(&ds[1]);
        assert_eq!(tiny.single_between(1, 2, ReplicaId(5)), Some(&newest[..]));
    }
}
