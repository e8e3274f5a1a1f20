//! Admission: what a replica checks before it joins a state that came from outside (a
//! peer's delta, full state or elided state, or a state loaded from disk).
//!
//! Decoding already refuses what is malformed (see [`crate::codec`]). A well-formed state
//! can still be poison: a retirement of a live node or of the receiver, a dot far ahead of
//! anything its node minted (or under the receiver's own id, above its counter), a time in
//! the far future that would make a lease endless. [`Replica::admit`] refuses those, so one
//! crafted or faulty message cannot erase a node, plant a registration that never expires,
//! or make a node spend minutes on a counter gap. Its cost is `O(|incoming|)`, plus one scan
//! of the store for each retirement the receiver has not seen yet (rare: one per dead node).

use crate::context::CausalContext;
use crate::hlc::Hlc;
use crate::id::ReplicaId;
use crate::replica::Replica;
use crate::state::State;

/// How far ahead a state from outside may reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// The receiver's wall time, in milliseconds since the epoch.
    pub now_ms: u64,
    /// How far ahead of `now_ms` a time in the state may lie (when a registration was
    /// written, a lease issued, a node retired).
    pub max_clock_skew_ms: u64,
    /// How far above the greatest counter the receiver has seen from a node a dot of that
    /// node may lie.
    pub max_counter_jump: u64,
}

impl Bounds {
    /// The default distance a node's counter may jump between two messages the receiver
    /// sees: about 2^32 writes, decades of renewals, still 2^30 jumps short of
    /// [`MAX_COUNTER`](crate::MAX_COUNTER).
    pub const DEFAULT_MAX_COUNTER_JUMP: u64 = 1 << 32;

    /// Bounds at `now_ms` with the default counter jump.
    pub fn new(now_ms: u64, max_clock_skew_ms: u64) -> Self {
        Self {
            now_ms,
            max_clock_skew_ms,
            max_counter_jump: Self::DEFAULT_MAX_COUNTER_JUMP,
        }
    }

    fn latest_ms(&self) -> u64 {
        self.now_ms.saturating_add(self.max_clock_skew_ms)
    }
}

/// Why a state from outside was refused. Nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// It retires the receiver itself.
    #[error("it retires this node ({0}); a live node is never retired")]
    RetiresReceiver(ReplicaId),
    /// It retires a node whose writes are live here.
    #[error(
        "it retires node {0}, whose lease is live here; a node is retired only after its writes are gone"
    )]
    RetiresLiveNode(ReplicaId),
    /// It holds a dot under the receiver's own id that the receiver never minted.
    #[error("it holds dot {replica}:{counter} under this node's id, above the {minted} it minted; a peer forged or corrupted it")]
    OwnDotAhead {
        /// The receiver.
        replica: ReplicaId,
        /// The counter in the state.
        counter: u64,
        /// The greatest counter the receiver minted.
        minted: u64,
    },
    /// It holds a dot far above anything seen from its node.
    #[error(
        "it holds dot {replica}:{counter}, more than {max_jump} above the {seen} seen here from that node"
    )]
    CounterJump {
        /// The node.
        replica: ReplicaId,
        /// The counter in the state.
        counter: u64,
        /// The greatest counter seen here from that node.
        seen: u64,
        /// The allowed jump.
        max_jump: u64,
    },
    /// It holds a time too far ahead of the receiver's clock.
    #[error("it holds {what} stamped {ahead_ms} ms ahead of this node's clock, more than the {max_skew_ms} ms allowed (--max-clock-skew); check NTP on both hosts")]
    TimeAhead {
        /// What was stamped: a registration, a lease or a retirement.
        what: &'static str,
        /// How far ahead.
        ahead_ms: u64,
        /// The allowed skew.
        max_skew_ms: u64,
    },
}

impl Refusal {
    /// Whether the same state may be admitted later without change: a time ahead of our
    /// clock is no longer ahead once the clock catches up; every other refusal is final
    /// (the sender is faulty or hostile).
    pub fn is_transient(&self) -> bool {
        matches!(self, Refusal::TimeAhead { .. })
    }
}

impl Replica {
    /// Checks a state from outside before it is joined (see the module docs); `Ok` means
    /// joining it cannot retire a live node or this one, plant a dot this node would mint
    /// again, or hold a time more than `bounds.max_clock_skew_ms` ahead.
    ///
    /// # Errors
    /// [`Refusal`], naming the first thing refused. Nothing is changed.
    pub fn admit(&self, incoming: &State, bounds: &Bounds) -> Result<(), Refusal> {
        self.admit_retirements(&incoming.ctx, bounds)?;
        self.admit_counters(&incoming.ctx, bounds)?;
        admit_times(incoming, bounds)
    }

    /// Every node the incoming context names: its greatest counter is neither above what
    /// this node minted (for its own id) nor far above what this node has seen.
    fn admit_counters(&self, ctx: &CausalContext, bounds: &Bounds) -> Result<(), Refusal> {
        let mut nodes: Vec<ReplicaId> = ctx.ranges().map(|(r, _)| r).collect();
        nodes.extend(ctx.cloud().map(|d| d.actor));
        nodes.sort_unstable();
        nodes.dedup();
        for r in nodes {
            let counter = ctx.max_counter(r);
            if r == self.id() {
                if counter > self.counter() {
                    return Err(Refusal::OwnDotAhead {
                        replica: r,
                        counter,
                        minted: self.counter(),
                    });
                }
                continue;
            }
            let seen = self.context().max_counter(r);
            if counter.saturating_sub(seen) > bounds.max_counter_jump {
                return Err(Refusal::CounterJump {
                    replica: r,
                    counter,
                    seen,
                    max_jump: bounds.max_counter_jump,
                });
            }
        }
        Ok(())
    }

    /// Every retirement this replica has not seen: none may cover a write that is live
    /// here (of this replica itself: any write of its own it still stores), unless the
    /// same state removes that write the ordinary way (its vector or cloud has seen it):
    /// a node answering its own retirement sends one, with its entries written again.
    fn admit_retirements(&self, ctx: &CausalContext, bounds: &Bounds) -> Result<(), Refusal> {
        let mine = self.context();
        for (r, x) in ctx.retired() {
            if mine.retired().any(|(b, y)| b == r && y >= x) {
                continue;
            }
            if r == self.id() {
                if self.state().lowest_own_dot(r).is_some_and(|c| c <= x.counter) {
                    return Err(Refusal::RetiresReceiver(r));
                }
            } else if self
                .state()
                .holds_live_writes_of(r, x.counter, ctx, bounds.now_ms)
            {
                return Err(Refusal::RetiresLiveNode(r));
            }
        }
        Ok(())
    }
}

impl Replica {
    /// Answers a peer whose context `peer` claims things about this replica's own dots
    /// that are not true: dots of ours above anything we minted (forged), or a retirement
    /// of us that covers writes we still hold. Only this replica mints its dots, so it
    /// knows the whole truth about them; the delta carries every write of ours we still
    /// store (those the retirement covers written again under new dots, same values) and
    /// claims every other counter up to the claim as removed. A replica that took the
    /// forged writes drops them wherever they are stored (the delta joins like a full
    /// state: it visits every key), and the retirement then covers nothing live. Our
    /// counter moves past the claim, so our next writes are not mistaken for forged ones.
    ///
    /// `None` when there is nothing to answer, or the claim is more than `max_jump` above
    /// our counter: no replica admits such a dot, so the claim itself is hostile, and
    /// following it would spend our counters.
    pub fn refute(&mut self, peer: &CausalContext, max_jump: u64, now_ms: u64) -> Option<crate::Applied> {
        let me = self.id();
        let mine = self.counter();
        let claimed = peer.max_counter(me);
        if claimed.saturating_sub(mine) > max_jump {
            return None;
        }
        let retired = peer
            .retired()
            .find(|(r, _)| *r == me)
            .map_or(0, |(_, x)| x.counter);
        let covered = retired > 0 && self.state().lowest_own_dot(me).is_some_and(|c| c <= retired);
        if claimed <= mine && !covered {
            return None;
        }
        let top = mine.max(claimed);
        self.raise_floor(top);
        let truth = self.rewrite_own_above(retired);
        let mut ctx = CausalContext::through(me, top);
        ctx.join(&truth.stored_dots());
        Some(self.apply_removal_to_every_key(truth.with_context(ctx), now_ms))
    }

    /// Every write of ours this replica stores, those with a counter at or below `floor`
    /// under new dots (leases first, so registrations name their lease's new dot).
    fn rewrite_own_above(&mut self, floor: u64) -> State {
        let me = self.id();
        let own = self.state().own_writes(me);
        let mut out = State::new();
        let mut moved = std::collections::BTreeMap::new();
        let leases: std::collections::BTreeMap<_, _> = own.leases.iter().collect();
        for (p, f) in leases {
            for (d, v) in f.iter() {
                let d2 = if d.counter <= floor {
                    self.mint()
                } else {
                    d.clone()
                };
                moved.insert(d.clone(), d2.clone());
                out.insert_lease(*p, d2, *v);
            }
        }
        for (k, f) in own.regs.iter() {
            for (d, v) in f.iter() {
                let d2 = if d.counter <= floor {
                    self.mint()
                } else {
                    d.clone()
                };
                let mut v = v.clone();
                if let Some(l) = moved.get(&v.lease_dot) {
                    v.lease_dot = l.clone();
                }
                out.insert_reg(k.clone(), d2, v);
            }
        }
        out
    }
}

/// No registration written, lease issued or node retired later than the bounds allow, so
/// no deadline lies further ahead than the skew plus the longest lease.
fn admit_times(incoming: &State, bounds: &Bounds) -> Result<(), Refusal> {
    let ahead = |what: &'static str, t: Hlc| {
        if t.millis() <= bounds.latest_ms() {
            return Ok(());
        }
        Err(Refusal::TimeAhead {
            what,
            ahead_ms: t.millis() - bounds.now_ms,
            max_skew_ms: bounds.max_clock_skew_ms,
        })
    };
    for f in incoming.regs.values() {
        for (_, r) in f.iter() {
            ahead("a registration", r.written)?;
        }
    }
    for f in incoming.leases.values() {
        for (_, l) in f.iter() {
            ahead("a lease", l.issued)?;
        }
    }
    for (_, x) in incoming.ctx.retired() {
        ahead("a retirement", x.at)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{dot, Endpoint, ProviderId, ServiceName};

    const NOW: u64 = 1_000_000;
    const A: ReplicaId = ReplicaId(1);
    const B: ReplicaId = ReplicaId(2);

    fn bounds() -> Bounds {
        Bounds::new(NOW, 5_000)
    }

    /// `a` with one registration of its own, and `b` holding it.
    fn pair() -> (Replica, Replica) {
        let mut a = Replica::new(A);
        let web = ServiceName::new("web").unwrap();
        let p = ProviderId::new("p").unwrap();
        let ep = Endpoint::parse("10.0.0.1:80").unwrap();
        let applied = a
            .register(web, p, ep, Default::default(), 30_000, Hlc::new(NOW, 0))
            .unwrap();
        let mut b = Replica::new(B);
        b.admit(&applied.delta, &bounds()).unwrap();
        b.apply(applied.delta, NOW);
        (a, b)
    }

    fn retiring(r: ReplicaId, counter: u64, at_ms: u64) -> State {
        State::new().with_context(CausalContext::retiring(r, counter, Hlc::new(at_ms, 0)))
    }

    #[test]
    fn a_retirement_of_the_receiver_or_of_a_node_with_a_live_lease_is_refused() {
        let (a, b) = pair();
        assert_eq!(
            a.admit(&retiring(A, 1, NOW), &bounds()),
            Err(Refusal::RetiresReceiver(A))
        );
        // b wrote nothing: retiring it covers nothing, but claims a counter it never minted.
        assert!(matches!(
            b.admit(&retiring(B, 1, NOW), &bounds()),
            Err(Refusal::OwnDotAhead { .. })
        ));
        assert_eq!(
            b.admit(&retiring(A, 2, NOW), &bounds()),
            Err(Refusal::RetiresLiveNode(A))
        );
        // Once a's lease has ended here, retiring it is what a clean-up does.
        let later = Bounds::new(NOW + 60_000, 5_000);
        assert_eq!(b.admit(&retiring(A, 2, NOW + 60_000), &later), Ok(()));
    }

    #[test]
    fn a_dot_under_the_receivers_id_above_its_counter_is_refused() {
        let (a, _) = pair();
        let forged = State::new().with_context(CausalContext::from_dots([dot(A, a.counter() + 1)]));
        assert!(matches!(
            a.admit(&forged, &bounds()),
            Err(Refusal::OwnDotAhead { .. })
        ));
        let replay = State::new().with_context(CausalContext::from_dots([dot(A, a.counter())]));
        assert_eq!(a.admit(&replay, &bounds()), Ok(()));
    }

    #[test]
    fn a_counter_far_above_what_its_node_minted_is_refused() {
        let (_, b) = pair();
        let near = State::new().with_context(CausalContext::from_dots([dot(A, 1_000)]));
        assert_eq!(b.admit(&near, &bounds()), Ok(()));
        let far = State::new().with_context(CausalContext::from_dots([dot(A, 3 + (1 << 32))]));
        assert!(matches!(
            b.admit(&far, &bounds()),
            Err(Refusal::CounterJump { .. })
        ));
    }

    #[test]
    fn an_owner_refutes_writes_forged_under_its_id_wherever_they_are_stored() {
        let (mut a, mut b) = pair();
        let web = ServiceName::new("web").unwrap();
        let mut forger = Replica::from_state(A, State::new(), a.counter() + 1_000);
        for p in ["p", "forged"] {
            let ep = Endpoint::parse("10.6.6.6:66").unwrap();
            let w = forger
                .register(
                    web.clone(),
                    ProviderId::new(p).unwrap(),
                    ep,
                    Default::default(),
                    30_000,
                    Hlc::new(NOW + 1, 0),
                )
                .unwrap();
            b.admit(&w.delta, &bounds()).unwrap();
            b.apply(w.delta, NOW);
        }
        let shown = |r: &Replica| -> Vec<String> {
            r.instances(&web, NOW)
                .map(|i| format!("{}@{}", i.provider, i.registration.endpoint))
                .collect()
        };
        assert_eq!(shown(&b), ["forged@10.6.6.6:66", "p@10.6.6.6:66"]);

        let claimed = b.context().max_counter(A);
        assert!(
            a.refute(b.context(), 10, NOW).is_none(),
            "a claim beyond the jump is not followed"
        );
        let refutation = a
            .refute(b.context(), Bounds::DEFAULT_MAX_COUNTER_JUMP, NOW)
            .unwrap();
        assert!(a.counter() > claimed);
        b.admit(&refutation.delta, &bounds()).unwrap();
        b.apply(refutation.delta, NOW);
        assert_eq!(shown(&b), ["p@10.0.0.1:80"]);
        assert!(a
            .refute(b.context(), Bounds::DEFAULT_MAX_COUNTER_JUMP, NOW)
            .is_none());

        // The owner's next write is not mistaken for a forged one.
        let next = a
            .register(
                web.clone(),
                ProviderId::new("q").unwrap(),
                Endpoint::parse("10.0.0.1:81").unwrap(),
                Default::default(),
                30_000,
                Hlc::new(NOW + 2, 0),
            )
            .unwrap();
        b.admit(&next.delta, &bounds()).unwrap();
        b.apply(next.delta, NOW);
        assert_eq!(shown(&b), ["p@10.0.0.1:80", "q@10.0.0.1:81"]);
    }

    #[test]
    fn a_node_retired_while_alive_writes_its_entries_again_above_the_retirement() {
        let (mut a, b) = pair();
        let retire = retiring(A, a.counter(), NOW);
        assert_eq!(a.admit(&retire, &bounds()), Err(Refusal::RetiresReceiver(A)));
        let answer = a
            .refute(retire.context(), Bounds::DEFAULT_MAX_COUNTER_JUMP, NOW)
            .unwrap();
        assert_eq!(
            a.admit(&retire, &bounds()),
            Ok(()),
            "the retirement covers nothing live now"
        );
        let valid = |s: &State| crate::codec::decode_state(&crate::codec::encode_state(s)).map(|_| ());
        assert_eq!(valid(&answer.delta), Ok(()), "the answer is a valid state");
        assert_eq!(valid(a.state()), Ok(()));
        let web = ServiceName::new("web").unwrap();
        for mut r in [a.clone(), b] {
            if r.id() != A {
                r.apply(answer.delta.clone(), NOW);
            }
            r.apply(retire.clone(), NOW);
            let shown: Vec<_> = r
                .instances(&web, NOW)
                .map(|i| i.registration.endpoint.to_string())
                .collect();
            assert_eq!(shown, ["10.0.0.1:80"], "on {}", r.id());
        }
    }

    #[test]
    fn a_registration_written_far_in_the_future_is_refused_until_the_clock_catches_up() {
        let mut c = Replica::new(ReplicaId(3));
        let web = ServiceName::new("web").unwrap();
        let p = ProviderId::new("q").unwrap();
        let ep = Endpoint::parse("10.0.0.2:80").unwrap();
        let ahead = NOW + 60_000;
        let delta = c
            .register(web, p, ep, Default::default(), 30_000, Hlc::new(ahead, 0))
            .unwrap()
            .delta;
        let (_, b) = pair();
        let refused = b.admit(&delta, &bounds()).unwrap_err();
        assert!(refused.is_transient(), "{refused}");
        assert_eq!(b.admit(&delta, &Bounds::new(ahead - 5_000, 5_000)), Ok(()));
    }
}
