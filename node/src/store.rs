//! The data directory: one crash-safe redb database, `roster.redb`.
//!
//! It holds the node's identity (replica id), the counter floor it reserves ahead of
//! what it mints, the replica (one row per registration and per node's lease, and the
//! causal context; a save writes the rows that changed with the context in one
//! transaction, so a restart resumes from a consistent point: see `entries`), the
//! registrations it owns, the keys it removed lately, its launch times, and the times of
//! throttled actions.
//!
//! Writes: own registrations are durable before `register` returns (synced in the
//! journal, `owned.journal`, and written to the database by its next synced commit: see
//! `journal`); the replica is committed in batches (group commit) by the node's saver task.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use roster_registry::{ChangedKeys, RegKey, Replica, ReplicaId};
use tracing::{info, warn};

mod disk;
mod entries;
#[cfg(test)]
mod entries_tests;
mod error;
mod health;
mod journal;
#[cfg(test)]
mod journal_tests;
mod load;
mod open;
mod own_writes;
mod record;

#[cfg(test)]
pub(crate) use disk::fail_writes_in;
pub use error::StoreError;
pub use health::{StoreHealth, FIRST_RETRY, MAX_RETRY};
use journal::Journal;
pub use journal::JOURNAL_FILE;
use open::{open_error, read_id};
pub(crate) use record::{key, reg_key, split_key};
pub use record::{OwnedRecord, Parts};

/// The file in the data directory.
pub const STORE_FILE: &str = "roster.redb";
/// The layout of the tables. Format 1 (the replica as one value) is migrated on open; a
/// data directory of another layout is refused.
pub const STORE_FORMAT: u32 = 2;
/// The format migrated on open.
const MIGRATED_FORMAT: u32 = 1;
/// Counters reserved ahead of the highest minted: a crash leaves a gap of at most this
/// many (closed at the next start), and the floor is rewritten about every half of it.
pub const COUNTER_RESERVE: u64 = 256;
/// Launch times kept.
const MAX_LAUNCHES: usize = 256;
/// How long a removed own key is remembered (a removal lost in a crash is redone at the
/// next start only within this window; after it, the lease has long ended anyway).
pub const REMOVED_KEEP_MS: u64 = 24 * 60 * 60 * 1000;
/// The most removed keys remembered.
const MAX_REMOVED: usize = 4_096;

const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const OWNED: TableDefinition<&str, &[u8]> = TableDefinition::new("owned");
const REMOVED: TableDefinition<&str, u64> = TableDefinition::new("removed");
const LAUNCHES: TableDefinition<u64, ()> = TableDefinition::new("launches");

const K_FORMAT: &str = "format";
const K_ID: &str = "replica_id";
/// What a replica that cannot be read leaves besides moving the file aside.
const RESET_HINT: &str = "; or start once with `roster agent --reset-identity` to keep what this node \
                          registered under a new identity";
const K_FLOOR: &str = "counter_floor";
const K_MEMORY: &str = "peer_memory";
/// The sequence number of the last journal frame the database holds durably.
const K_JOURNAL: &str = "journal_applied";

/// What a node resumes from.
#[derive(Debug)]
pub struct Loaded {
    /// The replica: its saved state, with the counter floor from disk.
    pub replica: Replica,
    /// Whether the data directory was new.
    pub fresh: bool,
    /// The registrations it owns.
    pub owned: Vec<OwnedRecord>,
    /// Keys it owned and removed lately.
    pub removed: Vec<RegKey>,
    /// Launch times (wall ms), oldest first, this launch included.
    pub launches: Vec<u64>,
    /// What the previous process knew of its peers (encoded by [`Store::save_memory`]'s
    /// caller); empty when none was saved.
    pub memory: Vec<u8>,
    /// What the node should tell its operator about the data directory (a directory
    /// others can read, a file whose permissions were tightened).
    pub warnings: Vec<String>,
    /// The identity this store had before [`Store::open_resetting`] gave it a new one.
    pub reset_from: Option<ReplicaId>,
}

/// The open data directory.
///
/// After a write fails, the database is closed (redb refuses every write after an I/O
/// error until it is opened again) and writes are refused with that error until it
/// reopens, which [`Store::reopen_if_due`] and every operation try on a backoff; see
/// [`Store::health`].
#[derive(Debug)]
pub struct Store {
    /// `None` while closed after a failure.
    db: Mutex<Option<Database>>,
    path: PathBuf,
    /// The replica id in the file: a reopened file must still hold it.
    id: ReplicaId,
    health: Mutex<health::Health>,
    faults: disk::Faults,
    /// Own writes synced ahead of the database's next synced commit; taken after `db`.
    journal: Mutex<Journal>,
}

impl Store {
    fn resume(
        db: Database,
        path: PathBuf,
        now_ms: u64,
        faults: disk::Faults,
    ) -> Result<(Self, Loaded), StoreError> {
        // The id is read by `load`; until then it is not used.
        let mut store = Self::new(db, path, ReplicaId(0), faults)?;
        let loaded = store.load_now(None, now_ms, None)?;
        store.id = loaded.replica.id();
        Ok((store, loaded))
    }

    /// `load` on the database just opened: a failure here stops the start, so it is not
    /// taken as a degraded store to reopen.
    fn load_now(
        &self,
        new_id: Option<ReplicaId>,
        now_ms: u64,
        reset_to: Option<ReplicaId>,
    ) -> Result<Loaded, StoreError> {
        let db = lock(&self.db);
        match db.as_ref() {
            Some(db) => self.load(db, new_id, now_ms, reset_to),
            None => Err(self.io("the database is closed")),
        }
    }

    /// Runs `op` on the open database. While it is closed after a failure, reopens it if
    /// its backoff has passed, or else refuses at once with the error that closed it. An
    /// I/O error from `op` closes it. The store is healthy again only once a write works
    /// (a reopen alone proves little on a full disk, and would reset the backoff).
    fn with_db<T>(&self, op: impl FnOnce(&Database) -> Result<T, StoreError>) -> Result<T, StoreError> {
        self.run(true, op)
    }

    /// [`Store::with_db`] for an operation that only reads.
    fn read_db<T>(&self, op: impl FnOnce(&Database) -> Result<T, StoreError>) -> Result<T, StoreError> {
        self.run(false, op)
    }

    fn run<T>(
        &self,
        writes: bool,
        op: impl FnOnce(&Database) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut db = lock(&self.db);
        if db.is_none() {
            self.reopen_locked(&mut db)?;
        }
        let Some(open) = db.as_ref() else {
            return Err(self.unwritable());
        };
        match op(open) {
            Err(StoreError::Io { why, .. }) => {
                // redb refuses every write after an I/O error until the database is
                // opened again: close it now, reopen on the backoff.
                *db = None;
                let first = lock(&self.health).failed(why.clone(), Instant::now(), wall_ms());
                if first {
                    warn!(
                        "{} cannot be written: {why}; reads and replication go on, changes are refused \
                         until it can be written again (check the free space and permissions of its \
                         disk); retrying in about {}s",
                        self.path.display(),
                        health::FIRST_RETRY.as_secs()
                    );
                }
                Err(self.unwritable())
            }
            Ok(v) => {
                if writes {
                    if let Some(spell) = lock(&self.health).recovered() {
                        info!(
                            "{} can be written again, after {} failures since {}",
                            self.path.display(),
                            spell.failures,
                            format_wall(spell.since_ms)
                        );
                    }
                }
                Ok(v)
            }
            other => other,
        }
    }

    /// Tries to open the database again, if its backoff has passed.
    fn reopen_locked(&self, db: &mut Option<Database>) -> Result<(), StoreError> {
        if !lock(&self.health).due(Instant::now()) {
            return Err(self.unwritable());
        }
        let reopened = disk::reopen(&self.path, &self.faults).and_then(|d| {
            let id = read_id(&d).map_err(|e| self.io(e))?;
            if id == Some(self.id.0) {
                self.apply_journal_now(&d)?;
                Ok(d)
            } else {
                Err(self.io(format!(
                    "the file now holds another node's data (id {:016x}, this node is {})",
                    id.unwrap_or_default(),
                    self.id
                )))
            }
        });
        match reopened {
            Ok(d) => {
                *db = Some(d);
                Ok(())
            }
            Err(e) => {
                let why = match e {
                    StoreError::Io { why, .. } => why,
                    other => other.to_string(),
                };
                let mut health = lock(&self.health);
                let changed = health.view().is_none_or(|h| h.last_error != why);
                health.failed(why.clone(), Instant::now(), wall_ms());
                if changed {
                    warn!("{} still cannot be written: {why}", self.path.display());
                }
                drop(health);
                Err(self.unwritable())
            }
        }
    }

    fn unwritable(&self) -> StoreError {
        let view = lock(&self.health).view();
        StoreError::Unwritable {
            path: self.path.clone(),
            why: view
                .as_ref()
                .map_or_else(|| "it is closed".to_string(), |h| h.last_error.clone()),
            since: format_wall(view.map_or_else(wall_ms, |h| h.since_ms)),
        }
    }

    /// Whether a write may be tried now: refused at once after a failure until its
    /// backoff has passed. It does not wait for a write in progress.
    ///
    /// # Errors
    /// [`StoreError::Unwritable`], with the error that closed it.
    pub fn ready(&self) -> Result<(), StoreError> {
        // The health only, not the database's lock: callers are async, and a save may
        // hold that lock for a commit.
        let waiting = {
            let health = lock(&self.health);
            health.view().is_some() && !health.due(Instant::now())
        };
        if waiting {
            return Err(self.unwritable());
        }
        Ok(())
    }

    /// `None` while the store can write; after a failure, since when it cannot, the last
    /// error and when it tries again.
    pub fn health(&self) -> Option<StoreHealth> {
        lock(&self.health).view()
    }

    /// After a failure, reopens the database if its backoff has passed: `None` when it is
    /// open, `Some(true)` when it reopened now, `Some(false)` when it is still closed. The
    /// store is healthy again after the next write that works.
    pub fn reopen_if_due(&self) -> Option<bool> {
        let mut db = lock(&self.db);
        if db.is_some() {
            return None;
        }
        Some(self.reopen_locked(&mut db).is_ok())
    }

    /// Makes the next reopening attempt due now, whatever the backoff (a graceful stop
    /// tries once more to save).
    pub fn retry_now(&self) {
        lock(&self.health).retry_now(Instant::now());
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn io(&self, e: impl std::fmt::Display) -> StoreError {
        StoreError::Io {
            path: self.path.clone(),
            why: e.to_string(),
        }
    }

    fn corrupt(&self, why: impl std::fmt::Display) -> StoreError {
        StoreError::Corrupt {
            path: self.path.clone(),
            why: why.to_string(),
        }
    }

    /// The error of a replica that could not be read or written; a damaged one names the
    /// way out that keeps this node's own registrations.
    fn failed(&self, f: entries::Fail) -> StoreError {
        match f {
            entries::Fail::Io(why) => self.io(why),
            entries::Fail::Corrupt(why) => self.corrupt(format!("{why}{RESET_HINT}")),
        }
    }

    /// Saves the replica: the entries of the keys `changed` names (every key whose entry
    /// changed since the last save that worked; see [`Replica::track_changes`]) and the
    /// context, in one transaction; and, when its counter nears the reserved floor,
    /// reserves more; with `exact`, the floor becomes the counter itself (a clean stop
    /// leaves no gap). After an error nothing was saved: `changed` must be saved again.
    ///
    /// # Errors
    /// [`StoreError::Io`].
    pub fn save_replica(
        &self,
        replica: &Replica,
        changed: &ChangedKeys,
        exact: bool,
    ) -> Result<(), StoreError> {
        let batch = entries::Batch::changed(replica.state(), changed);
        self.with_db(|db| {
            self.synced(db, |tx, _| {
                let mut meta = tx.open_table(META).map_err(|e| self.io(e))?;
                entries::write(tx, &mut meta, &batch).map_err(|f| self.failed(f))?;
                let counter = replica.counter();
                self.raise_floor(&mut meta, |reserved| {
                    if exact {
                        Some(counter)
                    } else {
                        (counter + COUNTER_RESERVE / 2 > reserved).then_some(counter + COUNTER_RESERVE)
                    }
                })
            })
        })
    }

    /// Writes the counter floor `wanted` returns, given the one saved (0 when none); keeps
    /// the saved one when it returns `None`.
    fn raise_floor(
        &self,
        meta: &mut redb::Table<&str, &[u8]>,
        wanted: impl FnOnce(u64) -> Option<u64>,
    ) -> Result<(), StoreError> {
        let reserved = meta
            .get(K_FLOOR)
            .map_err(|e| self.io(e))?
            .and_then(|v| <[u8; 8]>::try_from(v.value()).ok())
            .map_or(0, u64::from_le_bytes);
        if let Some(floor) = wanted(reserved) {
            meta.insert(K_FLOOR, floor.to_le_bytes().as_slice())
                .map_err(|e| self.io(e))?;
        }
        Ok(())
    }

    /// Forgets an own registration (durable when this returns) and remembers its key as
    /// removed at `now_ms`. Returns whether it was saved.
    ///
    /// # Errors
    /// [`StoreError::Io`].
    pub fn remove_owned(&self, service: &str, instance: &str, now_ms: u64) -> Result<bool, StoreError> {
        let k = key(service, instance);
        self.with_db(|db| {
            self.synced(db, |tx, _| {
                let mut owned = tx.open_table(OWNED).map_err(|e| self.io(e))?;
                let existed = owned.remove(k.as_str()).map_err(|e| self.io(e))?.is_some();
                let mut removed = tx.open_table(REMOVED).map_err(|e| self.io(e))?;
                if removed.len().map_err(|e| self.io(e))? < MAX_REMOVED as u64 {
                    removed.insert(k.as_str(), now_ms).map_err(|e| self.io(e))?;
                }
                Ok(existed)
            })
        })
    }

    /// Saves what this process knows of its peers (backoffs, URLs), durable when this
    /// returns, so the next process dials no sooner than this one would have.
    ///
    /// # Errors
    /// [`StoreError::Io`].
    pub fn save_memory(&self, bytes: &[u8]) -> Result<(), StoreError> {
        self.with_db(|db| {
            self.synced(db, |tx, _| {
                let mut meta = tx.open_table(META).map_err(|e| self.io(e))?;
                meta.insert(K_MEMORY, bytes).map_err(|e| self.io(e))?;
                Ok(())
            })
        })
    }

    /// When the throttled action `name` last ran (wall ms).
    ///
    /// # Errors
    /// [`StoreError::Io`].
    pub fn last_run(&self, name: &str) -> Result<Option<u64>, StoreError> {
        self.read_db(|db| {
            let tx = db.begin_read().map_err(|e| self.io(e))?;
            let meta = match tx.open_table(META) {
                Ok(t) => t,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
                Err(e) => return Err(self.io(e)),
            };
            let k = format!("last_run.{name}");
            let v = meta.get(k.as_str()).map_err(|e| self.io(e))?;
            Ok(v.and_then(|v| <[u8; 8]>::try_from(v.value()).ok())
                .map(u64::from_le_bytes))
        })
    }

    /// Records that the throttled action `name` ran at `at_ms` (durable when this returns).
    ///
    /// # Errors
    /// [`StoreError::Io`].
    pub fn set_last_run(&self, name: &str, at_ms: u64) -> Result<(), StoreError> {
        self.with_db(|db| {
            self.synced(db, |tx, _| {
                let mut meta = tx.open_table(META).map_err(|e| self.io(e))?;
                let k = format!("last_run.{name}");
                meta.insert(k.as_str(), at_ms.to_le_bytes().as_slice())
                    .map_err(|e| self.io(e))?;
                Ok(())
            })
        })
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves nothing half-done that the next holder must mend.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn format_wall(ms: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + std::time::Duration::from_millis(ms)).to_string()
}

#[cfg(test)]
mod tests;
