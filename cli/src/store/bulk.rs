//! Own registrations written in bulk: one transaction (one commit, one fsync) for a batch.

use super::{OwnedRecord, Store, StoreError, META, OWNED, REMOVED};

impl Store {
    /// Saves own registrations and forgets `deletes` (keys, without remembering them as
    /// removed), all in one transaction, durable when this returns; raises the counter
    /// floor to at least `floor`. A bulk register saves its records this way before the
    /// node mints their dots, so the floor covers every dot the batch may mint; a failed
    /// batch puts the previous records back the same way.
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
            let tx = db.begin_write().map_err(|e| self.io(e))?;
            {
                let mut owned = tx.open_table(OWNED).map_err(|e| self.io(e))?;
                let mut removed = tx.open_table(REMOVED).map_err(|e| self.io(e))?;
                for (k, bytes) in &encoded {
                    owned
                        .insert(k.as_str(), bytes.as_slice())
                        .map_err(|e| self.io(e))?;
                    removed.remove(k.as_str()).map_err(|e| self.io(e))?;
                }
                for k in deletes {
                    owned.remove(k.as_str()).map_err(|e| self.io(e))?;
                }
                let mut meta = tx.open_table(META).map_err(|e| self.io(e))?;
                self.raise_floor(&mut meta, |reserved| floor.filter(|f| *f > reserved))?;
            }
            tx.commit().map_err(|e| self.io(e))
        })
    }
}
