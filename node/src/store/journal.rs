//! The journal of own writes, `owned.journal` beside `roster.redb`: what makes an own
//! registration durable before it is answered, for one append and one `fdatasync`, where
//! a synced commit of the database cost about 0.3 ms of CPU (its dirty pages written and
//! synced) at every request.
//!
//! An own write is appended here and synced, and kept in memory ([`Journal::unapplied`]);
//! the database is not touched. The next synced commit of the database (the saver's, at
//! most about a second later, or any other) writes it there first, records the sequence
//! number of the last frame it covers, and the journal is emptied. A start applies the
//! frames after that number, which only a crash leaves: an answered write is on disk in
//! one of the two.
//!
//! A frame is its body's length (u32, little-endian), the first four bytes of the body's
//! SHA-256, and the body (postcard of [`Frame`]). Reading stops at the first frame that is
//! torn (a crash while it was written: it was never answered), damaged, of another node,
//! or out of sequence (a frame left from before the journal was last emptied).

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The file in the data directory.
pub const JOURNAL_FILE: &str = "owned.journal";
/// Past this many bytes, the next own write is a synced commit of the database, which
/// empties the journal: the journal stays small whatever the saver does.
pub(super) const JOURNAL_LIMIT: u64 = 1 << 20;
/// The largest frame body read back (a group of own writes is far smaller); a longer
/// length is taken as damage.
const MAX_BODY: usize = 64 << 20;
/// Length and checksum.
const HEADER: usize = 8;

/// One group of own writes, as [`super::Store::write_owned`] commits it.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Frame {
    /// The node whose journal it is (a journal left by a store since made anew is not
    /// this node's).
    pub(super) id: u64,
    pub(super) seq: u64,
    /// (key, encoded record) of the `owned` table.
    pub(super) puts: Vec<(String, Vec<u8>)>,
    pub(super) deletes: Vec<String>,
    pub(super) floor: Option<u64>,
}

/// The open journal.
#[derive(Debug)]
pub(super) struct Journal {
    file: File,
    path: PathBuf,
    /// Where the next frame goes.
    len: u64,
    /// The frames written or read that no synced commit covers yet.
    unapplied: Vec<Frame>,
    /// The sequence number of the last frame written or read.
    last_seq: u64,
    faults: super::disk::Faults,
}

impl Journal {
    /// Opens (or creates, readable by its owner only) the journal in `dir`.
    pub(super) fn open(dir: &Path, faults: super::disk::Faults) -> std::io::Result<Self> {
        let path = dir.join(JOURNAL_FILE);
        let mut options = OpenOptions::new();
        options.read(true).write(true).create(true).truncate(false);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let file = options.open(&path)?;
        Ok(Self {
            file,
            path,
            len: 0,
            unapplied: Vec::new(),
            last_seq: 0,
            faults,
        })
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// The bytes written since the journal was last emptied.
    pub(super) fn len(&self) -> u64 {
        self.len
    }

    /// The sequence number a synced commit records as covered.
    pub(super) fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Reads the frames of node `id` after `applied` into [`Journal::unapplied`]; the next
    /// frame follows the last one read (or `applied`), and is written after what was read.
    pub(super) fn read(&mut self, id: u64, applied: u64) -> std::io::Result<()> {
        // From the start, whatever the file's position (writes are positioned and do not
        // move it; a read before this one did).
        let mut bytes = Vec::new();
        (&self.file).seek(SeekFrom::Start(0))?;
        (&self.file).read_to_end(&mut bytes)?;
        let (frames, end) = parse(&bytes, id);
        self.len = end as u64;
        self.last_seq = frames.last().map_or(applied, |f| f.seq.max(applied));
        self.unapplied = frames.into_iter().filter(|f| f.seq > applied).collect();
        Ok(())
    }

    /// Appends a frame of the next sequence number and syncs it; it waits in
    /// [`Journal::unapplied`] for the next synced commit. On an error nothing of it is left
    /// to be read back, if the file can still be cut back.
    pub(super) fn append(
        &mut self,
        id: u64,
        puts: Vec<(String, Vec<u8>)>,
        deletes: Vec<String>,
        floor: Option<u64>,
    ) -> std::io::Result<()> {
        let frame = Frame {
            id,
            seq: self.last_seq + 1,
            puts,
            deletes,
            floor,
        };
        let body = postcard::to_stdvec(&frame).map_err(std::io::Error::other)?;
        let mut out = Vec::with_capacity(HEADER + body.len());
        out.extend_from_slice(&u32::try_from(body.len()).unwrap_or(u32::MAX).to_le_bytes());
        out.extend_from_slice(&checksum(&body));
        out.extend_from_slice(&body);
        let written = self.faults.check().and_then(|()| {
            self.file.write_all_at(&out, self.len)?;
            self.file.sync_data()
        });
        match written {
            Ok(()) => {
                self.len += out.len() as u64;
                self.last_seq = frame.seq;
                self.unapplied.push(frame);
                Ok(())
            }
            Err(e) => {
                let _ = self.file.set_len(self.len);
                Err(e)
            }
        }
    }

    /// The frames the database does not hold yet, oldest first: every synced commit
    /// writes them before anything else.
    pub(super) fn unapplied(&self) -> &[Frame] {
        &self.unapplied
    }

    /// Empties the journal once a synced commit covers every frame in it. Not synced:
    /// frames that come back after a crash are at or below the number that commit
    /// recorded, and are skipped.
    pub(super) fn empty(&mut self) {
        self.unapplied.clear();
        if self.len > 0 && self.file.set_len(0).is_ok() {
            self.len = 0;
        }
    }
}

/// The frames of node `id` that follow each other from the start of `bytes`, and where
/// they end.
fn parse(bytes: &[u8], id: u64) -> (Vec<Frame>, usize) {
    let mut frames: Vec<Frame> = Vec::new();
    let mut at = 0;
    while let Some((frame, next)) = frame_at(bytes, at) {
        let follows = frames.last().is_none_or(|prev| frame.seq == prev.seq + 1);
        if frame.id != id || !follows {
            break;
        }
        frames.push(frame);
        at = next;
    }
    (frames, at)
}

/// The frame at `at` and where the next one starts, if a whole, undamaged one is there.
fn frame_at(bytes: &[u8], at: usize) -> Option<(Frame, usize)> {
    let header = bytes.get(at..at + HEADER)?;
    let len = u32::from_le_bytes(header[..4].try_into().ok()?) as usize;
    if len > MAX_BODY {
        return None;
    }
    let body = bytes.get(at + HEADER..at + HEADER + len)?;
    if checksum(body) != header[4..] {
        return None;
    }
    let frame = postcard::from_bytes(body).ok()?;
    Some((frame, at + HEADER + len))
}

fn checksum(body: &[u8]) -> [u8; 4] {
    let digest = Sha256::digest(body);
    [digest[0], digest[1], digest[2], digest[3]]
}
