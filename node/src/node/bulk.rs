//! Writes in bulk: many own registrations (a deploy) in one replica write, one delta to
//! peers and one commit on disk, instead of one of each per instance.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::held::{record_key, Held};
use super::{Error, Node, RegistrationHandle, Service};
use crate::store::{OwnedRecord, Parts, Store, COUNTER_RESERVE};

/// The most registrations one [`Node::register_many`] (one `RegisterMany` request) takes:
/// well under the entries a peer accepts in one delta
/// ([`roster_transport::message::MAX_DELTA_ENTRIES`]), and a batch a node joins in a few
/// milliseconds.
pub const MAX_BATCH_ITEMS: usize = 10_000;

/// The prefix of an error about one item of a batch: `item 17: ...` (from 0).
pub(crate) fn item_error(index: usize, why: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("item {index}: {why}"))
}

impl Node {
    /// Registers many instances this node owns at once, as [`Node::register`] does each,
    /// at the cost of about one: one write to the replica, one delta to peers and one
    /// commit on disk for the lot. All are on disk when this returns; the handles come in
    /// the order of `services`, and dropping one deregisters its instance.
    ///
    /// # Errors
    /// [`Error::Invalid`] for more than [`MAX_BATCH_ITEMS`] services, or naming the first
    /// bad one by its index (`item 3: ...`): a bad name, address, metadata or ttl, or an
    /// instance id given twice; [`Error::OwnedElsewhere`] (also naming the item);
    /// [`Error::Store`]; [`Error::Stopped`]. Nothing changed: none is registered.
    pub async fn register_many(&self, services: Vec<Service>) -> Result<Vec<RegistrationHandle>, Error> {
        let ids = self.put_many(services).await?;
        Ok(ids
            .into_iter()
            .map(|(service, instance)| RegistrationHandle {
                node: self.clone(),
                service,
                instance,
                armed: true,
            })
            .collect())
    }

    /// Registers as [`Node::register_many`] without handles: each stays until
    /// [`Node::deregister`]. Returns the instance ids, in the order of `services`.
    ///
    /// # Errors
    /// As [`Node::register_many`].
    pub async fn register_many_owned(&self, services: Vec<Service>) -> Result<Vec<String>, Error> {
        let ids = self.put_many(services).await?;
        Ok(ids.into_iter().map(|(_, instance)| instance).collect())
    }

    /// Checks every item, then saves the records with a counter floor above every dot the
    /// batch may mint, then writes the replica. (A single `register` writes the replica
    /// first and reserves the floor after; a batch mints more dots than the reserve, so a
    /// crash between the two could leave dots minted above the floor on disk, and the
    /// restarted node would mint them again.) Returns each (service, instance id).
    async fn put_many(&self, services: Vec<Service>) -> Result<Vec<(String, String)>, Error> {
        let checked = self.records(&services)?;
        let mut owned = self.inner.owned.lock().await;
        let (recs, parts): (Vec<OwnedRecord>, Vec<Parts>) = checked
            .into_iter()
            .map(|(r, p)| match record_key(&r).and_then(|k| owned.get(&k)) {
                Some(before) => (super::group::carry_over(r, before), p),
                None => (r, p),
            })
            .unzip();
        let regs = recs
            .iter()
            .zip(parts)
            .enumerate()
            .map(|(i, (r, p))| {
                r.registration_of(p)
                    .map(Arc::new)
                    .map_err(|e| item_error(i, e.to_string()))
            })
            .collect::<Result<Vec<_>, Error>>()?;
        if self.is_stopped() {
            return Err(Error::Stopped);
        }
        let store = self.inner.store();
        if let Some(store) = &store {
            store.ready()?;
        }
        for (i, r) in regs.iter().enumerate() {
            self.not_owned_elsewhere(&r.service, &r.provider)
                .map_err(|e| match e {
                    Error::OwnedElsewhere(m) => Error::OwnedElsewhere(format!("item {i}: {m}")),
                    other => other,
                })?;
        }
        if let Some(store) = &store {
            let minted = u64::try_from(recs.len()).unwrap_or(u64::MAX).saturating_add(1);
            let floor = self.inner.handle.replica().counter() + minted + COUNTER_RESERVE;
            write(store, recs.clone(), Vec::new(), Some(floor)).await?;
        }
        if let Err(e) = self.inner.handle.register_many(regs.clone()).await {
            if let Some(store) = &store {
                // Not in the replica: not registered. Put back what the store had.
                let (previous, fresh): (Vec<_>, Vec<_>) = recs
                    .iter()
                    .partition(|r| record_key(r).is_some_and(|k| owned.contains_key(&k)));
                let previous = previous
                    .iter()
                    .filter_map(|r| owned.get(&record_key(r)?))
                    .map(|held| held.record(self.inner.lease_ttl_ms))
                    .collect();
                let fresh = fresh.iter().map(|r| r.key()).collect();
                let _ = write(store, previous, fresh, None).await;
            }
            return Err(e.into());
        }
        let mut ids = Vec::with_capacity(recs.len());
        for (r, reg) in recs.into_iter().zip(regs) {
            self.run_checks(&r.key(), &r.checks, r.status.health);
            self.note_ttl(r.expires_at_ms);
            ids.push((r.service.clone(), r.instance.clone()));
            let held = Held::new(r, reg);
            owned.insert(held.key(), held);
        }
        Ok(ids)
    }

    /// The records of a batch, each checked as `register` checks one, and no key twice.
    fn records(&self, services: &[Service]) -> Result<Vec<(OwnedRecord, Parts)>, Error> {
        if services.len() > MAX_BATCH_ITEMS {
            return Err(Error::Invalid(format!(
                "{} registrations in one batch; send at most {MAX_BATCH_ITEMS} per batch",
                services.len()
            )));
        }
        let mut first: BTreeMap<String, usize> = BTreeMap::new();
        let mut recs = Vec::with_capacity(services.len());
        for (i, s) in services.iter().enumerate() {
            let (rec, parts) = self.record(s).map_err(|e| item_error(i, e))?;
            if let Some(j) = first.insert(rec.key(), i) {
                return Err(item_error(
                    i,
                    format!(
                        "instance {} of {} is also item {j}; give each instance its own id",
                        rec.instance, rec.service
                    ),
                ));
            }
            recs.push((rec, parts));
        }
        Ok(recs)
    }
}

async fn write(
    store: &Arc<Store>,
    puts: Vec<OwnedRecord>,
    deletes: Vec<String>,
    floor: Option<u64>,
) -> Result<(), Error> {
    let store = Arc::clone(store);
    tokio::task::spawn_blocking(move || store.write_owned(&puts, &deletes, floor))
        .await
        .map_err(|e| Error::TaskFailed(format!("the store task: {e}")))?
        .map_err(Error::from)
}
