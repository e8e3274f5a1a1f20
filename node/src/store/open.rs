//! Opening a store: made or found, checked, its identity reset or read without starting.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use redb::{Database, ReadableDatabase};
use roster_registry::ReplicaId;

use super::journal::{Journal, JOURNAL_FILE};
use super::{
    disk, health, Loaded, Store, StoreError, K_FORMAT, K_ID, META, RESET_HINT, STORE_FILE, STORE_FORMAT,
};

/// The replica id a store file holds.
/// A new store's identity records, as [`Store::open`] writes them for a new node.
pub(super) fn write_identity(db: &Database, id: ReplicaId) -> Result<(), String> {
    let tx = db.begin_write().map_err(|e| e.to_string())?;
    {
        let mut meta = tx.open_table(META).map_err(|e| e.to_string())?;
        meta.insert(K_FORMAT, STORE_FORMAT.to_le_bytes().as_slice())
            .map_err(|e| e.to_string())?;
        meta.insert(K_ID, id.0.to_le_bytes().as_slice())
            .map_err(|e| e.to_string())?;
    }
    tx.commit().map_err(|e| e.to_string())
}

pub(super) fn read_id(db: &Database) -> Result<Option<u64>, String> {
    let tx = db.begin_read().map_err(|e| e.to_string())?;
    let meta = tx.open_table(META).map_err(|e| e.to_string())?;
    let v = meta.get(K_ID).map_err(|e| e.to_string())?;
    Ok(v.and_then(|v| <[u8; 8]>::try_from(v.value()).ok())
        .map(u64::from_le_bytes))
}

pub(super) fn open_error(path: &Path, e: redb::DatabaseError) -> StoreError {
    match e {
        redb::DatabaseError::DatabaseAlreadyOpen | redb::DatabaseError::LockProtocolMismatch => {
            StoreError::InUse {
                path: path.to_path_buf(),
            }
        }
        redb::DatabaseError::UpgradeRequired(v) => StoreError::Corrupt {
            path: path.to_path_buf(),
            why: format!("written by an older storage engine (redb file format {v})"),
        },
        redb::DatabaseError::Storage(redb::StorageError::Io(io))
            if io.kind() == std::io::ErrorKind::InvalidData =>
        {
            StoreError::Corrupt {
                path: path.to_path_buf(),
                why: format!("not a roster database: {io}"),
            }
        }
        redb::DatabaseError::Storage(redb::StorageError::Corrupted(why)) => StoreError::Corrupt {
            path: path.to_path_buf(),
            why,
        },
        other => StoreError::Unreadable {
            path: path.to_path_buf(),
            why: other.to_string(),
        },
    }
}

impl Store {
    /// Opens (or creates) the store in `dir`, records this launch at `now_ms`, and
    /// reserves the counters this process may mint. Only when there is no `roster.redb`
    /// is a new store made, with the replica id `new_id`; an empty, unreadable or damaged
    /// one is refused.
    ///
    /// # Errors
    /// [`StoreError`], naming the file and the way out.
    pub fn open(dir: &Path, new_id: ReplicaId, now_ms: u64) -> Result<(Self, Loaded), StoreError> {
        Self::open_with(dir, new_id, now_ms, disk::Faults::for_dir(dir))
    }

    /// As [`Store::open`], but an existing store takes `new_id` as this node's identity and
    /// forgets its replica, its counter floor and what it knew of peers, keeping the
    /// registrations it owns (written again under the new identity at start) and its launch
    /// times: the way out of a replica that cannot be read or a history that was poisoned,
    /// without wiping the data directory by hand. [`Loaded::reset_from`] names the old id.
    ///
    /// # Errors
    /// As [`Store::open`].
    pub fn open_resetting(dir: &Path, new_id: ReplicaId, now_ms: u64) -> Result<(Self, Loaded), StoreError> {
        let faults = disk::Faults::for_dir(dir);
        let mut notes: Vec<String> = disk::prepare_dir(dir)?.into_iter().collect();
        let path = dir.join(STORE_FILE);
        match disk::open_existing(&path, &faults)? {
            Some(db) => {
                notes.extend(disk::tighten_file(&path));
                let mut store = Self::new(db, path, new_id, faults)?;
                let mut loaded = store.load_now(None, now_ms, Some(new_id))?;
                store.id = loaded.replica.id();
                loaded.warnings = notes;
                Ok((store, loaded))
            }
            None => Self::open_with(dir, new_id, now_ms, faults),
        }
    }

    /// This data directory's node id, without starting a node: read from its `roster.redb`,
    /// or, when there is none, made and saved as [`Store::open`] would make it (a new
    /// store that holds only its identity). Nothing else is written; no launch is
    /// recorded, so asking does not count as a start. The second value says whether the
    /// identity was made now. This is how an operator learns the id a TLS certificate must
    /// name (`node-<id>`) before the node first starts.
    ///
    /// # Errors
    /// [`StoreError`] as [`Store::open`]; [`StoreError::InUse`] while an agent runs on it.
    pub fn identity(dir: &Path, new_id: ReplicaId) -> Result<(ReplicaId, bool), StoreError> {
        let faults = disk::Faults::for_dir(dir);
        disk::prepare_dir(dir)?;
        let path = dir.join(STORE_FILE);
        let corrupt = |why: &str| StoreError::Corrupt {
            path: path.clone(),
            why: format!("{why}{RESET_HINT}"),
        };
        if let Some(db) = disk::open_existing(&path, &faults)? {
            let id = read_id(&db).map_err(|e| corrupt(&e))?;
            return id
                .map(|id| (ReplicaId(id), false))
                .ok_or_else(|| corrupt("no replica id"));
        }
        let (db, temp) = disk::create_temporary(dir, &faults)?;
        let written = write_identity(&db, new_id).map_err(|why| StoreError::Io {
            path: temp.clone(),
            why,
        });
        drop(db);
        if let Err(e) = written {
            let _ = std::fs::remove_file(&temp);
            return Err(e);
        }
        if disk::publish(&temp, &path)? {
            return Ok((new_id, true));
        }
        // Another process made the store first: its id is the one.
        let db =
            disk::open_existing(&path, &faults)?.ok_or_else(|| corrupt("it vanished while being read"))?;
        let id = read_id(&db).map_err(|e| corrupt(&e))?;
        id.map(|id| (ReplicaId(id), false))
            .ok_or_else(|| corrupt("no replica id"))
    }

    pub(super) fn open_with(
        dir: &Path,
        new_id: ReplicaId,
        now_ms: u64,
        faults: disk::Faults,
    ) -> Result<(Self, Loaded), StoreError> {
        let mut notes: Vec<String> = disk::prepare_dir(dir)?.into_iter().collect();
        let path = dir.join(STORE_FILE);
        if let Some(db) = disk::open_existing(&path, &faults)? {
            notes.extend(disk::tighten_file(&path));
            let (store, mut loaded) = Self::resume(db, path, now_ms, faults)?;
            loaded.warnings = notes;
            return Ok((store, loaded));
        }
        // Only a missing file makes a new node; the new store gets its name once its
        // identity is committed.
        let (db, temp) = disk::create_temporary(dir, &faults)?;
        let mut store = match Self::new(db, temp.clone(), new_id, faults.clone()) {
            Ok(store) => store,
            Err(e) => {
                let _ = std::fs::remove_file(&temp);
                return Err(e);
            }
        };
        let loaded = match store.load_now(Some(new_id), now_ms, None) {
            Ok(loaded) => loaded,
            Err(e) => {
                drop(store);
                let _ = std::fs::remove_file(&temp);
                return Err(e);
            }
        };
        if disk::publish(&temp, &path)? {
            store.path = path;
            return Ok((
                store,
                Loaded {
                    warnings: notes,
                    ..loaded
                },
            ));
        }
        // Another process made the store first: open that one (it is likely still in use).
        drop(store);
        match disk::open_existing(&path, &faults)? {
            Some(db) => Self::resume(db, path, now_ms, faults),
            None => Err(StoreError::Io {
                path,
                why: "the file vanished while it was being made".to_string(),
            }),
        }
    }

    pub(super) fn new(
        db: Database,
        path: PathBuf,
        id: ReplicaId,
        faults: disk::Faults,
    ) -> Result<Self, StoreError> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let journal = Journal::open(dir, faults.clone()).map_err(|e| StoreError::Io {
            path: dir.join(JOURNAL_FILE),
            why: e.to_string(),
        })?;
        Ok(Self {
            db: Mutex::new(Some(db)),
            path,
            id,
            health: Mutex::new(health::Health::default()),
            faults,
            journal: Mutex::new(journal),
        })
    }
}
