//! Loading a store: its format checked (or migrated), its identity, and what the node
//! resumes from.

use redb::{Database, ReadableTable};
use roster_registry::{RegKey, Replica, ReplicaId};
use tracing::info;

use super::journal::Journal;
use super::{
    entries, split_key, Loaded, OwnedRecord, Store, StoreError, COUNTER_RESERVE, K_FLOOR, K_FORMAT, K_ID,
    K_MEMORY, LAUNCHES, MAX_LAUNCHES, META, MIGRATED_FORMAT, OWNED, REMOVED, REMOVED_KEEP_MS, RESET_HINT,
    STORE_FORMAT,
};

impl Store {
    /// Refuses a store of another format than this build's, but migrates format 1 (whose
    /// replica a store `resetting` its identity forgets instead: it may be what is damaged).
    pub(super) fn check_format(
        &self,
        tx: &redb::WriteTransaction,
        meta: &mut redb::Table<&str, &[u8]>,
        resetting: bool,
    ) -> Result<(), StoreError> {
        let found = match meta.get(K_FORMAT).map_err(|e| self.io(e))? {
            None => return Err(self.corrupt("it holds no roster identity")),
            Some(v) => <[u8; 4]>::try_from(v.value())
                .ok()
                .map(u32::from_le_bytes)
                .ok_or_else(|| self.corrupt("the format record is damaged"))?,
        };
        match found {
            STORE_FORMAT => Ok(()),
            MIGRATED_FORMAT if resetting => {
                entries::clear(tx, meta).map_err(|f| self.failed(f))?;
                meta.insert(K_FORMAT, STORE_FORMAT.to_le_bytes().as_slice())
                    .map_err(|e| self.io(e))?;
                Ok(())
            }
            MIGRATED_FORMAT => self.migrate(tx, meta),
            _ => Err(StoreError::Incompatible {
                path: self.path.clone(),
                found,
                expected: STORE_FORMAT,
            }),
        }
    }

    /// Turns a store of format 1 (the replica as one value) into this format, in the
    /// transaction that loads it.
    pub(super) fn migrate(
        &self,
        tx: &redb::WriteTransaction,
        meta: &mut redb::Table<&str, &[u8]>,
    ) -> Result<(), StoreError> {
        let rows = entries::migrate(tx, meta).map_err(|f| self.failed(f))?;
        meta.insert(K_FORMAT, STORE_FORMAT.to_le_bytes().as_slice())
            .map_err(|e| self.io(e))?;
        info!(
            "{}: migrated the data format {MIGRATED_FORMAT} to {STORE_FORMAT} (the replica saved entry by \
             entry, {rows} rows)",
            self.path.display()
        );
        Ok(())
    }

    /// Reads what the node resumes from; `new_id` is `Some` only for a store just made, and
    /// `reset_to` for an existing store that takes a new identity (see
    /// [`Store::open_resetting`]).
    pub(super) fn load(
        &self,
        db: &Database,
        new_id: Option<ReplicaId>,
        now_ms: u64,
        reset_to: Option<ReplicaId>,
    ) -> Result<Loaded, StoreError> {
        let mut from_journal = 0;
        let loaded = self.synced(db, |tx, journal| {
            let mut meta = tx.open_table(META).map_err(|e| self.io(e))?;
            let fresh = new_id.is_some();
            if let Some(new_id) = new_id {
                meta.insert(K_FORMAT, STORE_FORMAT.to_le_bytes().as_slice())
                    .map_err(|e| self.io(e))?;
                meta.insert(K_ID, new_id.0.to_le_bytes().as_slice())
                    .map_err(|e| self.io(e))?;
            } else {
                self.check_format(tx, &mut meta, reset_to.is_some())?;
                drop(meta);
                from_journal = self.resume_journal(tx, journal)?;
                meta = tx.open_table(META).map_err(|e| self.io(e))?;
            }
            let reset_from = match reset_to {
                Some(new) => self.reset_identity(tx, &mut meta, new)?,
                None => None,
            };
            let (replica, memory) = self.load_replica(tx, &mut meta)?;
            drop(meta);
            Ok(Loaded {
                replica,
                fresh,
                owned: self.load_owned(tx)?,
                removed: self.load_removed(tx, now_ms)?,
                launches: self.record_launch(tx, now_ms)?,
                memory,
                warnings: Vec::new(),
                reset_from,
            })
        })?;
        if from_journal > 0 {
            info!(
                "{}: {from_journal} groups of own writes the last process made durable in its journal \
                 are now in the database",
                self.path.display()
            );
        }
        Ok(loaded)
    }

    /// Writes into `tx` what the last process answered but did not commit synced (under
    /// the identity it wrote it with, before a reset gives it another); returns how many
    /// groups.
    fn resume_journal(
        &self,
        tx: &redb::WriteTransaction,
        journal: &mut Journal,
    ) -> Result<usize, StoreError> {
        let id = {
            let meta = tx.open_table(META).map_err(|e| self.io(e))?;
            self.get_u64(&meta, K_ID)?.unwrap_or_default()
        };
        self.apply_journal(tx, journal, id)
    }

    /// A `u64` of the meta table.
    pub(super) fn get_u64(
        &self,
        meta: &redb::Table<&str, &[u8]>,
        k: &str,
    ) -> Result<Option<u64>, StoreError> {
        match meta.get(k).map_err(|e| self.io(e))? {
            None => Ok(None),
            Some(v) => {
                let b: [u8; 8] = v
                    .value()
                    .try_into()
                    .map_err(|_| self.corrupt(format!("{k} is not 8 bytes")))?;
                Ok(Some(u64::from_le_bytes(b)))
            }
        }
    }

    /// Gives the store the identity `new`, forgetting what belonged to the old one (its
    /// floor, its peers, its replica); returns the old one.
    fn reset_identity(
        &self,
        tx: &redb::WriteTransaction,
        meta: &mut redb::Table<&str, &[u8]>,
        new: ReplicaId,
    ) -> Result<Option<ReplicaId>, StoreError> {
        let reset_from = self.get_u64(meta, K_ID).ok().flatten().map(ReplicaId);
        meta.insert(K_ID, new.0.to_le_bytes().as_slice())
            .map_err(|e| self.io(e))?;
        for k in [K_FLOOR, K_MEMORY] {
            meta.remove(k).map_err(|e| self.io(e))?;
        }
        entries::clear(tx, meta).map_err(|f| self.failed(f))?;
        Ok(reset_from)
    }

    /// The replica saved, with its counter floor raised by what this process may mint,
    /// and what the last process knew of its peers.
    fn load_replica(
        &self,
        tx: &redb::WriteTransaction,
        meta: &mut redb::Table<&str, &[u8]>,
    ) -> Result<(Replica, Vec<u8>), StoreError> {
        let id = ReplicaId(
            self.get_u64(meta, K_ID)?
                .ok_or_else(|| self.corrupt("no replica id"))?,
        );
        let state = entries::load(tx, meta).map_err(|f| self.failed(f))?;
        let floor = self.get_u64(meta, K_FLOOR)?.unwrap_or(0);
        if floor > roster_registry::MAX_COUNTER {
            return Err(self.corrupt(format!(
                "the counter floor {floor} is beyond any a node mints{RESET_HINT}"
            )));
        }
        let memory = meta
            .get(K_MEMORY)
            .map_err(|e| self.io(e))?
            .map(|v| v.value().to_vec())
            .unwrap_or_default();
        let mut replica = Replica::from_state(id, state, floor);
        // What changes from now on is what the saves write.
        replica.track_changes();
        // Reserve what this process may mint before it mints anything.
        let reserved = replica.counter() + COUNTER_RESERVE;
        meta.insert(K_FLOOR, reserved.to_le_bytes().as_slice())
            .map_err(|e| self.io(e))?;
        Ok((replica, memory))
    }

    /// The registrations this node owns.
    fn load_owned(&self, tx: &redb::WriteTransaction) -> Result<Vec<OwnedRecord>, StoreError> {
        let mut owned = Vec::new();
        let table = tx.open_table(OWNED).map_err(|e| self.io(e))?;
        for row in table.iter().map_err(|e| self.io(e))? {
            let (_, v) = row.map_err(|e| self.io(e))?;
            let rec = OwnedRecord::decode(v.value())
                .map_err(|e| self.corrupt(format!("an own registration: {e}")))?;
            owned.push(rec);
        }
        Ok(owned)
    }

    /// The keys removed within [`REMOVED_KEEP_MS`]; older ones are forgotten.
    fn load_removed(&self, tx: &redb::WriteTransaction, now_ms: u64) -> Result<Vec<RegKey>, StoreError> {
        let mut removed_table = tx.open_table(REMOVED).map_err(|e| self.io(e))?;
        let mut removed_rows = Vec::new();
        for row in removed_table.iter().map_err(|e| self.io(e))? {
            let (k, at) = row.map_err(|e| self.io(e))?;
            removed_rows.push((k.value().to_string(), at.value()));
        }
        let mut removed = Vec::new();
        for (k, at) in removed_rows {
            match split_key(&k) {
                Some(key) if at + REMOVED_KEEP_MS > now_ms => removed.push(key),
                _ => {
                    removed_table.remove(k.as_str()).map_err(|e| self.io(e))?;
                }
            }
        }
        Ok(removed)
    }

    /// Records this launch at `now_ms`, keeping the last [`MAX_LAUNCHES`]; returns them.
    fn record_launch(&self, tx: &redb::WriteTransaction, now_ms: u64) -> Result<Vec<u64>, StoreError> {
        let mut launches_table = tx.open_table(LAUNCHES).map_err(|e| self.io(e))?;
        launches_table.insert(now_ms, ()).map_err(|e| self.io(e))?;
        let mut launches = Vec::new();
        for row in launches_table.iter().map_err(|e| self.io(e))? {
            launches.push(row.map_err(|e| self.io(e))?.0.value());
        }
        let excess = launches.len().saturating_sub(MAX_LAUNCHES);
        for t in launches.drain(..excess) {
            launches_table.remove(t).map_err(|e| self.io(e))?;
        }
        Ok(launches)
    }
}
