//! Resuming from what the previous process saved, and what this one saves for the next.

use std::collections::BTreeSet;
use std::sync::Arc;

use roster_registry::{validate_metadata, InvalidInput, ProviderId, RegKey, Replica, ServiceName};

use crate::backoff::Backoff;

use super::{
    member_provider, members_service, Config, Memory, Node, NodeInfo, Now, OwnedRegistration, PeerMemory,
    Resume, Resumed,
};

/// The most own registrations a resuming node writes again in one delta (well within
/// what a peer takes in one, `MAX_DELTA_ENTRIES`).
pub(super) const RESUME_BATCH: usize = 10_000;

impl Node {
    /// A node picking up where a previous process of it left off, before it talks to any
    /// peer (it dials only after): it takes back what that process knew of its peers
    /// (backoffs, so it dials no sooner than the old one would have), writes its own
    /// registrations again (peers see an update, never a removal) unless, after a stop
    /// within its lease, the replica holds them as saved (peers hold them too), removes
    /// registrations it wrote but no longer owns (a removal lost in a crash), and claims
    /// the counters between its saved state and its floor (`Replica::close_gap`) over
    /// every key it could have written.
    ///
    /// # Errors
    /// As [`Node::new`].
    pub fn with_resume(
        me: NodeInfo,
        replica: Replica,
        seeds: impl IntoIterator<Item = String>,
        cfg: Config,
        seed: u64,
        now: impl Into<Now>,
        resume: Resume,
    ) -> Result<(Self, Resumed), InvalidInput> {
        let now: Now = now.into();
        let (mut node, resume) = Self::with_deferred_resume(me, replica, seeds, cfg, seed, now, resume)?;
        let resumed = node.finish_resume(resume, now);
        Ok((node, resumed))
    }

    /// [`Node::with_resume`] without writing its own registrations again yet: a caller
    /// that serves reads from the replica as loaded meanwhile (a restart with 100,000
    /// owned spent about 1.3 s of its 2 s before the first read on that). Gives back the
    /// `resume` for [`Node::finish_resume`], which must come before any other input and
    /// before any output is acted on: the node must not talk to a peer before.
    ///
    /// # Errors
    /// As [`Node::with_resume`].
    pub fn with_deferred_resume(
        me: NodeInfo,
        replica: Replica,
        seeds: impl IntoIterator<Item = String>,
        cfg: Config,
        seed: u64,
        now: impl Into<Now>,
        resume: Resume,
    ) -> Result<(Self, Resume), InvalidInput> {
        let now: Now = now.into();
        let (mut node, resume) = Self::build(me, replica, seeds, cfg, seed, now, resume)?;
        node.dial_more(now);
        Ok((node, resume))
    }

    /// Writes again the registrations `resume` names as owned (see
    /// [`Node::with_deferred_resume`]); its other fields were taken at the start.
    pub fn finish_resume(&mut self, resume: Resume, now: impl Into<Now>) -> Resumed {
        let now = self.input_time(now.into());
        self.resume(resume, now)
    }

    /// The registry part of [`Node::with_resume`].
    pub(super) fn resume(&mut self, resume: Resume, now: Now) -> Resumed {
        let mut done = Resumed::default();
        let me = self.me.id;
        let member = (members_service(), member_provider(me));
        let mut keys: BTreeSet<RegKey> = resume.removed.into_iter().collect();
        keys.insert(RegKey {
            service: member.0.clone(),
            provider: member.1.clone(),
        });
        // In bulk: one delta per batch, not one per registration (100,000 one by one took
        // about 2 s before a restarted node served reads).
        let (owned, refused): (Vec<_>, Vec<_>) = resume
            .owned
            .into_iter()
            .partition(|o| validate_metadata(&o.meta).is_ok() && o.status.validate().is_ok());
        done.refused = refused.len();
        keys.extend(owned.iter().map(|o| RegKey {
            service: o.service.clone(),
            provider: o.provider.clone(),
        }));
        // After a stop within the lease, those the replica holds as saved stay as they
        // are: a restart owning 100,000 wrote them all again, and every peer took them in
        // (an update of each, 120 MiB more resident at a peer for a while). After a crash
        // all are written: a write shipped and never saved (its counter in the gap) may
        // hold the key at peers, and closing the gap removes it there; kept under its old
        // dot, which peers saw removed, the registration would be here and nowhere else,
        // with contexts equal, so no exchange would ever repair it.
        let (kept, mut owned): (Vec<_>, Vec<_>) = match self.saved_stands {
            true => owned.into_iter().partition(|o| self.holds_as_saved(o, now)),
            false => (Vec::new(), owned),
        };
        done.kept = kept.len();
        for o in kept {
            self.own(o);
        }
        while !owned.is_empty() {
            let batch: Vec<Arc<OwnedRegistration>> = owned.drain(..owned.len().min(RESUME_BATCH)).collect();
            let n = batch.len();
            match self.register_many(batch, now) {
                Ok(()) => done.rewritten += n,
                Err(_) => done.refused += n,
            }
        }
        let stale: Vec<RegKey> = if resume.drop_unowned {
            self.replica.state().written_by(me)
        } else {
            Vec::new()
        };
        let stale: Vec<(ServiceName, ProviderId)> = stale
            .into_iter()
            .filter(|k| !self.owned.contains_key(&(k.service.clone(), k.provider.clone())))
            .map(|k| (k.service, k.provider))
            .collect();
        for (s, p) in stale {
            keys.insert(RegKey {
                service: s.clone(),
                provider: p.clone(),
            });
            if self.deregister(&s, &p, now) {
                done.removed += 1;
            }
        }
        // A lease of ours issued after now (by a clock that ran ahead, since fixed) was
        // issued again at now when the membership was registered, before this.
        done.gap = self.replica.unclaimed_gap();
        if let Some(applied) = self.replica.close_gap(keys, now.wall_ms) {
            self.local_delta(applied.delta, applied.changes, now);
        }
        done
    }

    /// Whether this node's lease, as the replica holds it, is live at `now` and was
    /// issued by then (not by a clock that ran ahead).
    pub(super) fn own_lease_live(&self, now: Now) -> bool {
        let lease = self.replica.lease_of(self.me.id);
        lease.is_some_and(|l| l.issued.millis() <= now.wall_ms && l.is_live(now.wall_ms))
    }

    /// Whether the replica shows `o` as this node wrote it, and not stamped ahead of `now`
    /// (a clock since set back: written again at the true time). Asked only when what was
    /// saved stands (`saved_stands`).
    fn holds_as_saved(&self, o: &OwnedRegistration, now: Now) -> bool {
        let key = RegKey {
            service: o.service.clone(),
            provider: o.provider.clone(),
        };
        let Some(i) = self.replica.visible(&key, now.wall_ms) else {
            return false;
        };
        let r = i.registration;
        i.node() == self.me.id
            && !i.unreachable
            && r.written.millis() <= now.wall_ms
            && (&r.endpoint, &r.meta, &r.status, r.since_ms) == (&o.endpoint, &o.meta, &o.status, o.since_ms)
    }

    /// The registrations this node owns, as the next process resumes them
    /// ([`Resume::owned`]).
    pub fn owned_registrations(&self) -> Vec<Arc<OwnedRegistration>> {
        self.owned.values().cloned().collect()
    }

    /// What this process knows of its peers and seeds, to save for the next one.
    pub fn memory(&self) -> Memory {
        let now_ms = self.time.wall_ms();
        let peers = self
            .known_ids(now_ms)
            .into_iter()
            .map(|id| {
                let (url, name) = self.known_contact(id, now_ms);
                let p = self.peers.get(&id);
                PeerMemory {
                    id,
                    url,
                    name,
                    // Kept in monotonic time; saved in wall time, by the last input's offset.
                    backoff: p.map_or_else(Backoff::default, |p| {
                        self.saved_backoff(p.backoff, p.clock_refused)
                    }),
                    full_sent_at: p.and_then(|p| p.full_sent_at).map(|t| self.time.wall_of(t)),
                }
            })
            .collect();
        let seeds = self
            .seeds
            .iter()
            .map(|(u, s)| (u.clone(), self.saved_backoff(s.backoff, s.clock_refused)))
            .collect();
        Memory {
            peers,
            seeds,
            leases_shipped: self.leases_shipped,
        }
    }

    /// A backoff as the next process takes it, in wall time. One earned by a refusal for
    /// clock skew ends at once: the restart is how a clock is often set right, and the
    /// next process must not wait minutes for a clock it no longer has (a Jepsen node,
    /// restarted with its true clock after running a minute ahead, dialed no one for the
    /// whole final check). Its failures are kept: a clock still wrong escalates, and the
    /// crash-loop guard still holds a process that keeps dying.
    fn saved_backoff(&self, b: Backoff, clock_refused: bool) -> Backoff {
        if clock_refused {
            Backoff {
                not_before_ms: 0,
                ..b
            }
        } else {
            self.time.backoff_to_wall(b)
        }
    }
}
