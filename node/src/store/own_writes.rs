//! Own registrations written: a group durable through the journal before it is answered
//! (see `journal`), and every synced commit of the database, which takes the journal's
//! writes first.

use redb::{Database, WriteTransaction};

use super::journal::{Frame, Journal, JOURNAL_LIMIT};
use super::{lock, OwnedRecord, Store, StoreError, K_JOURNAL, META, OWNED, REMOVED};

impl Store {
    /// Saves own registrations and forgets `deletes` (keys, without remembering them as
    /// removed), all at once, durable when this returns; raises the counter floor to at
    /// least `floor`. A bulk register saves its records this way before the node mints
    /// their dots, so the floor covers every dot the batch may mint; a failed batch puts
    /// the previous records back the same way.
    ///
    /// Durable through the journal: one synced append; the database takes them at its
    /// next synced commit. Once the journal passes [`JOURNAL_LIMIT`], a synced commit
    /// instead, which empties it.
    ///
    /// # Errors
    /// [`StoreError::Io`]; nothing is saved.
    pub fn write_owned(
        &self,
        puts: &[OwnedRecord],
        deletes: &[String],
        floor: Option<u64>,
    ) -> Result<(), StoreError> {
        let encoded = puts
            .iter()
            .map(|r| postcard::to_stdvec(r).map(|b| (r.key(), b)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.io(e))?;
        self.with_db(|db| {
            let mut journal = lock(&self.journal);
            if journal.len() < JOURNAL_LIMIT {
                return journal
                    .append(self.id.0, encoded, deletes.to_vec(), floor)
                    .map_err(|e| self.journal_error(&journal, e));
            }
            drop(journal);
            self.synced(db, |tx, _| self.apply_owned(tx, &encoded, deletes, floor))
        })
    }

    /// Writes one group of own writes into `tx`.
    fn apply_owned(
        &self,
        tx: &WriteTransaction,
        puts: &[(String, Vec<u8>)],
        deletes: &[String],
        floor: Option<u64>,
    ) -> Result<(), StoreError> {
        let mut owned = tx.open_table(OWNED).map_err(|e| self.io(e))?;
        let mut removed = tx.open_table(REMOVED).map_err(|e| self.io(e))?;
        for (k, bytes) in puts {
            owned
                .insert(k.as_str(), bytes.as_slice())
                .map_err(|e| self.io(e))?;
            removed.remove(k.as_str()).map_err(|e| self.io(e))?;
        }
        for k in deletes {
            owned.remove(k.as_str()).map_err(|e| self.io(e))?;
        }
        let mut meta = tx.open_table(META).map_err(|e| self.io(e))?;
        self.raise_floor(&mut meta, |reserved| floor.filter(|f| *f > reserved))
    }

    /// One synced transaction: the journal's unapplied own writes first, then `write`, and
    /// the number of the last frame it covers; the journal is emptied once it is
    /// committed. Every synced commit goes through here, so none can be followed by an
    /// older own write (a frame applied after a later removal would bring the record back).
    pub(super) fn synced<T>(
        &self,
        db: &Database,
        write: impl FnOnce(&WriteTransaction, &mut Journal) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut journal = lock(&self.journal);
        let tx = db.begin_write().map_err(|e| self.io(e))?;
        self.apply_frames(&tx, journal.unapplied())?;
        let out = write(&tx, &mut journal)?;
        {
            let mut meta = tx.open_table(META).map_err(|e| self.io(e))?;
            meta.insert(K_JOURNAL, journal.last_seq().to_le_bytes().as_slice())
                .map_err(|e| self.io(e))?;
        }
        tx.commit().map_err(|e| self.io(e))?;
        journal.empty();
        Ok(out)
    }

    fn apply_frames(&self, tx: &WriteTransaction, frames: &[Frame]) -> Result<(), StoreError> {
        for f in frames {
            self.apply_owned(tx, &f.puts, &f.deletes, f.floor)?;
        }
        Ok(())
    }

    /// Reads into `journal` and writes into `tx` the frames of node `id` the database does
    /// not hold (what a crash, or a failed write that closed the database, left only in
    /// the journal); returns how many. For [`Store::synced`]'s `write`.
    pub(super) fn apply_journal(
        &self,
        tx: &WriteTransaction,
        journal: &mut Journal,
        id: u64,
    ) -> Result<usize, StoreError> {
        let applied = {
            let meta = tx.open_table(META).map_err(|e| self.io(e))?;
            self.get_u64(&meta, K_JOURNAL)?.unwrap_or(0)
        };
        journal
            .read(id, applied)
            .map_err(|e| self.journal_error(journal, e))?;
        self.apply_frames(tx, journal.unapplied())?;
        Ok(journal.unapplied().len())
    }

    /// Writes the journal's waiting own writes into the database opened again after a
    /// failed write (the frames in memory are those the file holds after the last synced
    /// commit: nothing to read again).
    pub(super) fn apply_journal_now(&self, db: &Database) -> Result<(), StoreError> {
        self.synced(db, |_, _| Ok(()))
    }

    fn journal_error(&self, journal: &Journal, e: std::io::Error) -> StoreError {
        StoreError::Io {
            path: journal.path().to_path_buf(),
            why: e.to_string(),
        }
    }
}
