//! Where the store lives: the data directory and `roster.redb` in it, and how the file is
//! opened.
//!
//! Only a missing file makes a new node. A new store is built under a temporary name and
//! linked into place once its identity is committed, so an empty or half-made
//! `roster.redb` is never roster's own doing: one found at start is refused, never taken
//! for a new node (that would give the node a new id and drop what it owned).

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use redb::backends::FileBackend;
use redb::Database;

use super::StoreError;

/// The permission bits roster gives its data directory.
#[cfg(unix)]
const DIR_MODE: u32 = 0o700;
/// The permission bits roster gives the files in it.
#[cfg(unix)]
const FILE_MODE: u32 = 0o600;

/// The backend under the database: the file itself, or (in tests) the file behind a
/// switch that makes writes fail, as a full disk would.
#[cfg(not(test))]
type Backend = FileBackend;
#[cfg(test)]
type Backend = faults::FaultyBackend;

/// The test-only switch of [`Backend`]; nothing in a release build.
#[derive(Debug, Clone, Default)]
pub(super) struct Faults {
    #[cfg(test)]
    pub(super) fail_writes: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Faults {
    /// The switch for a store opened in `dir`: the one a test set with
    /// [`fail_writes_in`], or a switch nobody turns.
    pub(super) fn for_dir(dir: &Path) -> Self {
        #[cfg(test)]
        if let Some(fail_writes) = faults::registered(dir) {
            return Self { fail_writes };
        }
        let _ = dir;
        Self::default()
    }
}

impl Faults {
    /// In tests, the error a full disk gives while the switch is on; else nothing.
    pub(super) fn check(&self) -> std::io::Result<()> {
        #[cfg(test)]
        if self.fail_writes.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(std::io::Error::from_raw_os_error(28));
        }
        Ok(())
    }
}

/// Test only: a switch that makes every write of a store opened in `dir` fail with
/// ENOSPC while it is on (for a node started on `dir`, whose store is opened inside it).
#[cfg(test)]
pub(crate) fn fail_writes_in(dir: &Path) -> std::sync::Arc<std::sync::atomic::AtomicBool> {
    faults::register(dir)
}

/// Creates the data directory (0700) if it is missing. Returns a warning when an existing
/// one can be read by other users (it is the user's to change: it may be shared on purpose).
pub(super) fn prepare_dir(dir: &Path) -> Result<Option<String>, StoreError> {
    let failed = |source| StoreError::Dir {
        dir: dir.to_path_buf(),
        source,
    };
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, DIR_MODE);
    builder.create(dir).map_err(failed)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir).map_err(failed)?.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Ok(Some(format!(
                "the data directory {} can be read by other users (mode {mode:o}); run `chmod 700 {}`",
                dir.display(),
                dir.display()
            )));
        }
    }
    Ok(None)
}

/// Makes the store file at `path` readable by its owner only (0600), as roster makes it
/// now; an older roster made it 0644. Returns what was changed.
pub(super) fn tighten_file(path: &Path) -> Option<String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(FILE_MODE)).ok()?;
            return Some(format!(
                "{} could be read by other users (mode {mode:o}): now 600",
                path.display()
            ));
        }
    }
    #[cfg(not(unix))]
    let _ = path;
    None
}

/// Opens the existing store file at `path`; `None` when there is none. An empty file, or
/// one that cannot be opened, is refused with the way out.
pub(super) fn open_existing(path: &Path, faults: &Faults) -> Result<Option<Database>, StoreError> {
    let file = match OpenOptions::new().read(true).write(true).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(StoreError::Unreadable {
                path: path.to_path_buf(),
                why: e.to_string(),
            })
        }
    };
    let len = file
        .metadata()
        .map_err(|e| StoreError::Unreadable {
            path: path.to_path_buf(),
            why: e.to_string(),
        })?
        .len();
    if len == 0 {
        return Err(StoreError::Corrupt {
            path: path.to_path_buf(),
            why: "the file is empty".to_string(),
        });
    }
    open_db(file, faults)
        .map(Some)
        .map_err(|e| super::open_error(path, e))
}

/// A new store file: made under a temporary name in `dir` to be linked into
/// place by [`publish`] once its identity is committed.
pub(super) fn create_temporary(dir: &Path, faults: &Faults) -> Result<(Database, PathBuf), StoreError> {
    let suffix = getrandom::u64().unwrap_or_default();
    let temp = dir.join(format!(
        ".{}.new-{}-{suffix:016x}",
        super::STORE_FILE,
        std::process::id()
    ));
    let mut options = OpenOptions::new();
    options.read(true).write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, FILE_MODE);
    let file = options.open(&temp).map_err(|source| StoreError::Dir {
        dir: dir.to_path_buf(),
        source,
    })?;
    match open_db(file, faults) {
        Ok(db) => Ok((db, temp)),
        Err(e) => {
            let _ = std::fs::remove_file(&temp);
            Err(super::open_error(&temp, e))
        }
    }
}

/// Gives the committed temporary store its real name. Returns `false` when another
/// process made `path` first (the temporary file is removed either way).
pub(super) fn publish(temp: &Path, path: &Path) -> Result<bool, StoreError> {
    // A link, not a rename: it fails when `path` exists, so two processes starting at once
    // cannot both take the name.
    let linked = match std::fs::hard_link(temp, path) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        // A file system without hard links: a rename, when the name is still free.
        Err(_) if !path.exists() => std::fs::rename(temp, path).map(|()| true),
        other => other.map(|()| true),
    };
    let _ = std::fs::remove_file(temp);
    match linked {
        Ok(true) => {}
        Ok(false) => return Ok(false),
        Err(e) => {
            return Err(StoreError::Io {
                path: path.to_path_buf(),
                why: e.to_string(),
            })
        }
    }
    // The name is durable before the node acts on the identity in it.
    if let Some(dir) = path.parent() {
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(true)
}

/// Opens the store file at `path` again after a failure. The file must still be there:
/// a missing or emptied file is not made anew.
pub(super) fn reopen(path: &Path, faults: &Faults) -> Result<Database, StoreError> {
    open_existing(path, faults)?.ok_or_else(|| StoreError::Io {
        path: path.to_path_buf(),
        why: "the file is gone".to_string(),
    })
}

/// What redb may keep of the file in memory. Its default, a gigabyte, kept every page
/// read at start (the whole file) for the process's life.
const STORE_CACHE_BYTES: usize = 2 << 20;

fn open_db(file: File, faults: &Faults) -> Result<Database, redb::DatabaseError> {
    let backend = FileBackend::new(file)?;
    #[cfg(test)]
    let backend = faults::FaultyBackend {
        inner: backend,
        fail_writes: std::sync::Arc::clone(&faults.fail_writes),
    };
    #[cfg(not(test))]
    let _ = faults;
    let backend: Backend = backend;
    redb::Builder::new()
        .set_check_integrity_on_open(true)
        .set_cache_size(STORE_CACHE_BYTES)
        .create_with_backend(backend)
}

#[cfg(test)]
pub(super) mod faults {
    //! A file backend whose writes fail while a switch is on: the error a full disk gives.

    use std::ops::Bound;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use redb::backends::FileBackend;
    use redb::{BackendError, StorageBackend};

    // What the backend methods return without redb's experimental API.
    type BackendIoError = std::io::Error;

    static REGISTERED: std::sync::Mutex<Vec<(std::path::PathBuf, Arc<AtomicBool>)>> =
        std::sync::Mutex::new(Vec::new());

    pub(crate) fn register(dir: &std::path::Path) -> Arc<AtomicBool> {
        let switch = Arc::new(AtomicBool::new(false));
        if let Ok(mut r) = REGISTERED.lock() {
            r.push((dir.to_path_buf(), Arc::clone(&switch)));
        }
        switch
    }

    pub(crate) fn registered(dir: &std::path::Path) -> Option<Arc<AtomicBool>> {
        let r = REGISTERED.lock().ok()?;
        r.iter().find(|(d, _)| d == dir).map(|(_, s)| Arc::clone(s))
    }

    #[derive(Debug)]
    pub(crate) struct FaultyBackend {
        pub(crate) inner: FileBackend,
        pub(crate) fail_writes: Arc<AtomicBool>,
    }

    impl FaultyBackend {
        fn check(&self) -> Result<(), BackendIoError> {
            if self.fail_writes.load(Ordering::SeqCst) {
                return Err(std::io::Error::from_raw_os_error(28));
            }
            Ok(())
        }
    }

    impl StorageBackend for FaultyBackend {
        fn len(&self) -> Result<u64, BackendIoError> {
            self.inner.len()
        }
        fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), BackendIoError> {
            self.inner.read(offset, out)
        }
        fn set_len(&self, len: u64) -> Result<(), BackendIoError> {
            self.check()?;
            self.inner.set_len(len)
        }
        fn sync_data(&self) -> Result<(), BackendIoError> {
            self.check()?;
            self.inner.sync_data()
        }
        fn write(&self, offset: u64, data: &[u8]) -> Result<(), BackendIoError> {
            self.check()?;
            self.inner.write(offset, data)
        }
        fn close(&self) -> Result<(), BackendIoError> {
            self.inner.close()
        }
        fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
            self.inner.try_lock_range(start, end)
        }
        fn try_lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
            self.inner.try_lock_shared_range(start, end)
        }
        fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
            self.inner.lock_range(start, end)
        }
        fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
            self.inner.lock_shared_range(start, end)
        }
        fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
            self.inner.unlock_range(start, end)
        }
        fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
            self.inner.query_lock_range(start, end)
        }
    }
}
