//! Single registrations committed together (group commit). While one commit is on its
//! way to disk, the registrations that arrive queue up, and the next commit takes them all:
//! one write to the replica, one delta to peers and one synced append to the store's journal
//! for the lot.
//! A client that waits for each answer pays one commit per registration, as before; many
//! clients at once, or one that sends requests without waiting for answers, share them.
//!
//! Each registration is answered alone: one refused (a bad limit, an instance owned
//! elsewhere) leaves the others of its group alone. A failed commit fails its whole group,
//! and the replica is put back to what the disk still has.

use std::collections::BTreeMap;
use std::sync::Arc;

use roster_transport::driver::DriverError;
use roster_transport::proto::OwnedRegistration;
use tokio::sync::oneshot;

use super::held::{record_key, Held};
use super::{Error, Node, Service};
use crate::store::{OwnedRecord, Parts, Store, COUNTER_RESERVE};

/// The most registrations one commit takes. The replica mints their dots before the
/// commit raises the counter floor on disk, so a group must stay well under the counters a
/// commit reserves ahead (`COUNTER_RESERVE / 2`): a crash between the two must not leave
/// dots peers have above the floor a restart starts from.
pub(crate) const MAX_GROUP: usize = 64;
const _: () = assert!(MAX_GROUP as u64 * 2 <= COUNTER_RESERVE / 2);

/// How a queued registration is answered.
pub(crate) type Answer = oneshot::Receiver<Result<(), Error>>;
type Reply = oneshot::Sender<Result<(), Error>>;

/// Registrations waiting for the next commit.
#[derive(Debug, Default)]
pub(crate) struct Queue {
    items: Vec<Queued>,
    /// Whether a committer task is draining `items`.
    running: bool,
}

/// A write waiting for the next commit.
#[derive(Debug)]
struct Queued {
    rec: OwnedRecord,
    /// `Some`: a registration as a client asked for it, with its parts as parsed when it
    /// came in, which keeps what the node knows of an instance it already owns (see
    /// [`carry_over`]). `None`: a rewrite of an owned record by the node itself (a status
    /// change), written as it is.
    parts: Option<Parts>,
    reply: Reply,
}

/// One registration admitted into a group.
struct Admitted {
    rec: OwnedRecord,
    reg: Arc<OwnedRegistration>,
    reply: Reply,
}

impl Node {
    /// Registers `rec` (of `parts`) with the next commit, and waits for it.
    pub(super) async fn put(&self, rec: OwnedRecord, parts: Parts) -> Result<(), Error> {
        self.queue(rec, Some(parts)).await.unwrap_or(Err(Error::Stopped))
    }

    /// Writes `rec`, an owned record the node changed itself (its status), as it is.
    pub(super) async fn rewrite(&self, rec: OwnedRecord) -> Result<(), Error> {
        self.queue(rec, None).await.unwrap_or(Err(Error::Stopped))
    }

    /// Registers as [`Node::register_owned`], without waiting: returns the instance id and
    /// the answer to wait for. The order of calls is the order of the writes.
    ///
    /// # Errors
    /// [`Error::Input`] for a bad name, address or metadata, [`Error::Invalid`] for a bad
    /// ttl or check; nothing is queued.
    pub(crate) fn register_queued(&self, service: &Service) -> Result<(String, Answer), Error> {
        let (rec, parts) = self.record(service)?;
        let instance = rec.instance.clone();
        Ok((instance, self.queue(rec, Some(parts))))
    }

    /// Queues `rec` for the next commit and returns its answer. It returns at once, so the
    /// order of calls is the order of the writes (a later write to the same instance wins).
    pub(super) fn queue(&self, rec: OwnedRecord, parts: Option<Parts>) -> Answer {
        let (reply, answer) = oneshot::channel();
        let start = {
            let mut q = self
                .inner
                .queue
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            q.items.push(Queued { rec, parts, reply });
            !std::mem::replace(&mut q.running, true)
        };
        if start {
            let node = self.clone();
            self.inner.tasks.spawn(async move { node.commit_queued().await });
        }
        answer
    }

    /// Commits queued registrations, a group at a time, until none is left.
    async fn commit_queued(&self) {
        loop {
            let group: Vec<_> = {
                let mut q = self
                    .inner
                    .queue
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if q.items.is_empty() {
                    q.running = false;
                    return;
                }
                let n = q.items.len().min(MAX_GROUP);
                q.items.drain(..n).collect()
            };
            self.commit_group(group).await;
        }
    }

    /// Into the replica (and on its way to peers) first, then on disk, then answered: the
    /// disk's commit is not on the path of a change to its peers. A crash between the two
    /// leaves writes that were never answered; the restarted node does not own them, so
    /// they lapse with its lease (or are removed on resume if the saved replica has them),
    /// as unanswered writes may.
    async fn commit_group(&self, group: Vec<Queued>) {
        let mut owned = self.inner.owned.lock().await;
        let store = self.inner.store();
        let admitted: Vec<Admitted> = group
            .into_iter()
            .map(
                |q| match (q.parts.is_some(), record_key(&q.rec).and_then(|k| owned.get(&k))) {
                    (true, Some(before)) => (carry_over(q.rec, before), q.parts, q.reply),
                    _ => (q.rec, q.parts, q.reply),
                },
            )
            .filter_map(
                |(rec, parts, reply)| match self.admit(&rec, parts, store.as_deref()) {
                    Ok(reg) => Some(Admitted { rec, reg, reply }),
                    Err(e) => {
                        let _ = reply.send(Err(e));
                        None
                    }
                },
            )
            .collect();
        let admitted = self.write_replica(admitted).await;
        if admitted.is_empty() {
            return;
        }
        if let Some(store) = store {
            let last = last_per_key(&admitted);
            let puts = last.values().map(|a| admitted[*a].rec.clone()).collect();
            let floor = self.inner.handle.replica().counter() + COUNTER_RESERVE;
            if let Err(e) = write(store, puts, floor).await {
                // Not on disk: not registered. Put back what the disk still has.
                for i in last.values() {
                    let previous = record_key(&admitted[*i].rec).and_then(|k| owned.get(&k));
                    self.restore(previous, &admitted[*i].reg).await;
                }
                for a in admitted {
                    let _ = a.reply.send(Err(duplicate(&e)));
                }
                return;
            }
        }
        for a in admitted {
            self.run_checks(&a.rec.key(), &a.rec.checks, a.rec.status.health);
            self.note_ttl(a.rec.expires_at_ms);
            let held = Held::new(a.rec, a.reg);
            owned.insert(held.key(), held);
            let _ = a.reply.send(Ok(()));
        }
    }

    /// The checks of one registration, made under the lock that orders writes.
    fn admit(
        &self,
        rec: &OwnedRecord,
        parts: Option<Parts>,
        store: Option<&Store>,
    ) -> Result<Arc<OwnedRegistration>, Error> {
        let reg = match parts {
            Some(parts) => rec.registration_of(parts)?,
            None => rec.registration()?,
        };
        let reg = Arc::new(reg);
        if self.is_stopped() {
            return Err(Error::Stopped);
        }
        // A disk known to fail refuses before peers see a write it would take back.
        if let Some(store) = store {
            store.ready()?;
        }
        self.not_owned_elsewhere(&reg.service, &reg.provider)?;
        Ok(reg)
    }

    /// Writes the group into the replica as one delta; answers and drops each item the node
    /// refuses (a limit of the transport), and all of them if the node stopped.
    async fn write_replica(&self, mut admitted: Vec<Admitted>) -> Vec<Admitted> {
        while !admitted.is_empty() {
            let last = last_per_key(&admitted);
            let regs: Vec<_> = last.values().map(|a| admitted[*a].reg.clone()).collect();
            let result = self.inner.handle.register_many(regs).await;
            match result {
                Ok(()) => return admitted,
                Err(DriverError::InvalidItem { index, source }) => {
                    // `index` counts the registrations sent, one per key.
                    // An index past the group (never sent) refuses all of it.
                    let key = last.keys().nth(index).cloned();
                    let (refused, kept) = admitted
                        .into_iter()
                        .partition(|a| key.as_ref().is_none_or(|k| a.rec.key() == *k));
                    admitted = kept;
                    for a in refused {
                        let _ = a.reply.send(Err(Error::Invalid(source.to_string())));
                    }
                }
                Err(e) => {
                    for a in admitted {
                        let _ = a.reply.send(Err(Error::from(e.clone())));
                    }
                    return Vec::new();
                }
            }
        }
        Vec::new()
    }

    /// Puts back into the replica what the disk has for the instance of `reg` (after a
    /// failed commit): its `previous` record, or nothing.
    async fn restore(&self, previous: Option<&Held>, reg: &OwnedRegistration) {
        let handle = &self.inner.handle;
        let _ = match previous {
            Some(p) => handle.register_many(vec![Arc::clone(&p.reg)]).await,
            None => handle
                .deregister(reg.service.clone(), reg.provider.clone())
                .await
                .map(drop),
        };
    }
}

/// A new registration of an instance the node already owns keeps what the node knows of
/// it: when it was first registered, its maintenance, and the status its checks decided
/// (when they are the same checks). Registering again is an update, not a new instance.
pub(super) fn carry_over(mut rec: OwnedRecord, before: &Held) -> OwnedRecord {
    rec.registered_at_ms = before.reg.since_ms;
    rec.maintenance = before.maintenance().cloned();
    if rec.checks == before.checks() {
        rec.status.clone_from(before.status());
    }
    rec
}

/// The index of the last write to each key (store key, in its order).
fn last_per_key(admitted: &[Admitted]) -> BTreeMap<String, usize> {
    admitted
        .iter()
        .enumerate()
        .map(|(i, a)| (a.rec.key(), i))
        .collect()
}

/// Saves `puts` at once (one synced append to the journal), with counters reserved up to
/// `floor`.
async fn write(store: Arc<Store>, puts: Vec<OwnedRecord>, floor: u64) -> Result<(), Error> {
    tokio::task::spawn_blocking(move || store.write_owned(&puts, &[], Some(floor)))
        .await
        .map_err(|e| Error::TaskFailed(format!("the store task: {e}")))?
        .map_err(Error::from)
}

/// The same error again, for each registration of a failed group.
fn duplicate(e: &Error) -> Error {
    match e {
        Error::Store(s) => Error::Store(s.duplicate()),
        Error::Stopped => Error::Stopped,
        Error::TaskFailed(m) => Error::TaskFailed(m.clone()),
        other => Error::Invalid(other.to_string()),
    }
}
