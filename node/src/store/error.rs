//! Why the store could not do what it was asked.

use std::path::PathBuf;

/// Why the data directory could not be used. Each message names the file and the way out.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The directory could not be created or read.
    #[error("cannot use the data directory {dir}: {source}; pass another --data-dir or fix its permissions")]
    Dir {
        /// The directory.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Another process has the database open.
    #[error("{path} is in use by another roster process; stop it, or pass another --data-dir")]
    InUse {
        /// The database file.
        path: PathBuf,
    },
    /// The file is not a roster database, or is damaged (an empty file included).
    #[error(
        "{path} is corrupt ({why}); move it aside to start afresh as a new node (it resyncs the \
         registry from its peers; what this node registered is not restored)"
    )]
    Corrupt {
        /// The database file.
        path: PathBuf,
        /// What was wrong.
        why: String,
    },
    /// The file is there but cannot be opened (permissions, a failing disk).
    #[error(
        "cannot open {path} ({why}); fix its permissions or its disk, or move it aside to start \
         afresh as a new node (what this node registered is not restored)"
    )]
    Unreadable {
        /// The database file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// The file was written by an incompatible version.
    #[error(
        "{path} has data format {found}, this roster reads format {expected}; run the roster \
         version that wrote it, or move the file aside to start afresh"
    )]
    Incompatible {
        /// The database file.
        path: PathBuf,
        /// The format found.
        found: u32,
        /// The format this build reads.
        expected: u32,
    },
    /// Writes fail (a full or failing disk, permissions): nothing was saved. The store
    /// reopens the file by itself once it can.
    #[error(
        "{path} cannot be written ({why}; failing since {since}); nothing was saved: check the free \
         space and permissions of its disk (roster retries by itself)"
    )]
    Unwritable {
        /// The database file.
        path: PathBuf,
        /// The last error.
        why: String,
        /// When writes started to fail (UTC).
        since: String,
    },
    /// A read or write failed.
    #[error("{path} could not be read or written ({why}); check the free space and permissions of its disk")]
    Io {
        /// The database file.
        path: PathBuf,
        /// What failed.
        why: String,
    },
}

impl StoreError {
    /// The same error again (an I/O source as its kind and message): one failed commit
    /// answers every write it carried.
    pub fn duplicate(&self) -> Self {
        match self {
            Self::Dir { dir, source } => Self::Dir {
                dir: dir.clone(),
                source: std::io::Error::new(source.kind(), source.to_string()),
            },
            Self::InUse { path } => Self::InUse { path: path.clone() },
            Self::Corrupt { path, why } => Self::Corrupt {
                path: path.clone(),
                why: why.clone(),
            },
            Self::Unreadable { path, why } => Self::Unreadable {
                path: path.clone(),
                why: why.clone(),
            },
            Self::Incompatible {
                path,
                found,
                expected,
            } => Self::Incompatible {
                path: path.clone(),
                found: *found,
                expected: *expected,
            },
            Self::Unwritable { path, why, since } => Self::Unwritable {
                path: path.clone(),
                why: why.clone(),
                since: since.clone(),
            },
            Self::Io { path, why } => Self::Io {
                path: path.clone(),
                why: why.clone(),
            },
        }
    }
}
