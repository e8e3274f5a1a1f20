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
pub(super) fn open_existing(path: &Path) -> Result<Option<Database>, StoreError> {
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
    open_db(file).map(Some).map_err(|e| super::open_error(path, e))
}

/// A new store file: made under a temporary name in `dir` to be linked into
/// place by [`publish`] once its identity is committed.
pub(super) fn create_temporary(dir: &Path) -> Result<(Database, PathBuf), StoreError> {
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
    match open_db(file) {
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

fn open_db(file: File) -> Result<Database, redb::DatabaseError> {
    redb::Builder::new()
        .set_check_integrity_on_open(true)
        .create_with_backend(FileBackend::new(file)?)
}
