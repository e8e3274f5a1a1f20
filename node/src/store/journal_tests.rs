//! The journal of own writes: what it reads back, and a store's own writes kept by it
//! through a crash that the database did not sync.

#![allow(clippy::unwrap_used)]

use std::path::Path;

use super::journal::{Journal, JOURNAL_FILE};
use super::tests::rec;
use super::*;

fn journal(dir: &Path) -> Journal {
    Journal::open(dir, disk::Faults::default()).unwrap()
}

/// Appends a frame whose one put is `key`.
fn put(j: &mut Journal, id: u64, key: &str) {
    j.append(id, vec![(key.to_string(), vec![7; 40])], Vec::new(), Some(9))
        .unwrap();
}

/// (sequence number, key) of the frames a journal opened on `dir` reads after `applied`.
fn read(dir: &Path, id: u64, applied: u64) -> Vec<(u64, String)> {
    let mut j = journal(dir);
    j.read(id, applied).unwrap();
    j.unapplied()
        .iter()
        .map(|f| (f.seq, f.puts[0].0.clone()))
        .collect()
}

fn seq(frames: &[(u64, &str)]) -> Vec<(u64, String)> {
    frames.iter().map(|(n, k)| (*n, k.to_string())).collect()
}

#[test]
fn the_frames_of_this_node_come_back_in_order_after_those_applied() {
    let dir = tempfile::tempdir().unwrap();
    let mut j = journal(dir.path());
    for k in ["a", "b", "c"] {
        put(&mut j, 5, k);
    }
    drop(j);
    assert_eq!(read(dir.path(), 5, 0), seq(&[(1, "a"), (2, "b"), (3, "c")]));
    assert_eq!(read(dir.path(), 5, 2), seq(&[(3, "c")]));
    assert!(read(dir.path(), 6, 0).is_empty(), "another node's journal");
    // The next frame follows the last read, after it.
    let mut j = journal(dir.path());
    j.read(5, 0).unwrap();
    put(&mut j, 5, "d");
    assert_eq!(read(dir.path(), 5, 3), seq(&[(4, "d")]));
}

/// A store reopened after a failed write reads its open journal a second time: it read
/// from where the first read ended, found nothing, and the next append overwrote the
/// frames (the full-disk test of `cli/tests/agents/disk.rs` lost 57 answered writes so).
#[test]
fn a_second_read_of_an_open_journal_reads_it_from_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut j = journal(dir.path());
    put(&mut j, 5, "a");
    j.read(5, 0).unwrap();
    put(&mut j, 5, "b");
    j.read(5, 0).unwrap();
    let again: Vec<_> = j
        .unapplied()
        .iter()
        .map(|f| (f.seq, f.puts[0].0.clone()))
        .collect();
    assert_eq!(again, seq(&[(1, "a"), (2, "b")]));
    put(&mut j, 5, "c");
    assert_eq!(read(dir.path(), 5, 0), seq(&[(1, "a"), (2, "b"), (3, "c")]));
}

#[test]
fn reading_stops_at_a_torn_or_damaged_frame() {
    let dir = tempfile::tempdir().unwrap();
    let mut j = journal(dir.path());
    for k in ["a", "b", "c"] {
        put(&mut j, 5, k);
    }
    let path = dir.path().join(JOURNAL_FILE);
    let whole = std::fs::read(&path).unwrap();
    let frame = whole.len() / 3;

    // Torn: the last frame half written (a crash before its sync: never answered).
    std::fs::write(&path, &whole[..whole.len() - frame / 2]).unwrap();
    assert_eq!(read(dir.path(), 5, 0), seq(&[(1, "a"), (2, "b")]));

    // Damaged in the middle: nothing from there on.
    let mut damaged = whole.clone();
    damaged[frame + frame / 2] ^= 0x40;
    std::fs::write(&path, &damaged).unwrap();
    assert_eq!(read(dir.path(), 5, 0), seq(&[(1, "a")]));
}

#[test]
fn frames_left_from_before_the_journal_was_emptied_are_not_read_after_newer_ones() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(JOURNAL_FILE);
    let mut j = journal(dir.path());
    for k in ["a", "b", "c"] {
        put(&mut j, 5, k);
    }
    let old = std::fs::read(&path).unwrap();
    j.empty();
    put(&mut j, 5, "d");
    // A crash that kept the frames written after the emptying but not the emptying's cut.
    let mut kept = std::fs::read(&path).unwrap();
    kept.extend_from_slice(&old[kept.len()..]);
    std::fs::write(&path, &kept).unwrap();
    assert_eq!(read(dir.path(), 5, 3), seq(&[(4, "d")]));
}

#[test]
fn frames_wait_for_a_synced_commit_in_memory_and_a_failed_append_leaves_none() {
    let dir = tempfile::tempdir().unwrap();
    let switch = fail_writes_in(dir.path());
    let mut j = Journal::open(dir.path(), disk::Faults::for_dir(dir.path())).unwrap();
    put(&mut j, 5, "a");
    switch.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(j
        .append(5, vec![("b".into(), vec![1])], Vec::new(), None)
        .is_err());
    switch.store(false, std::sync::atomic::Ordering::SeqCst);
    put(&mut j, 5, "c");
    let waiting: Vec<_> = j
        .unapplied()
        .iter()
        .map(|f| (f.seq, f.puts[0].0.clone()))
        .collect();
    assert_eq!(waiting, seq(&[(1, "a"), (2, "c")]));
    assert_eq!(read(dir.path(), 5, 0), waiting);
    j.empty();
    assert!(j.unapplied().is_empty());
    assert_eq!(std::fs::metadata(dir.path().join(JOURNAL_FILE)).unwrap().len(), 0);
}

/// What a SIGKILL leaves of a running store's directory: its files as they are now, the
/// database's commits that were not synced not among them.
fn killed_copy(from: &Path) -> tempfile::TempDir {
    let to = tempfile::tempdir().unwrap();
    for name in [STORE_FILE, JOURNAL_FILE] {
        std::fs::copy(from.join(name), to.path().join(name)).unwrap();
    }
    to
}

#[test]
fn an_answered_own_write_the_database_did_not_sync_is_loaded_from_the_journal_after_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = Store::open(dir.path(), ReplicaId(3), 1_000).unwrap();
    store.write_owned(&[rec("a")], &[], Some(600)).unwrap();
    store.write_owned(&[rec("b")], &[], None).unwrap();
    let killed = killed_copy(dir.path());

    let (_, loaded) = Store::open(killed.path(), ReplicaId(0), 2_000).unwrap();
    let owned: Vec<_> = loaded.owned.iter().map(|r| r.instance.as_str()).collect();
    assert_eq!(owned, ["a", "b"]);
    assert!(loaded.replica.counter() >= 600, "the floor the write raised");

    // Without the journal, the database alone has neither: the journal is what kept them.
    let db_only = killed_copy(dir.path());
    std::fs::remove_file(db_only.path().join(JOURNAL_FILE)).unwrap();
    let (_, loaded) = Store::open(db_only.path(), ReplicaId(0), 2_000).unwrap();
    assert!(loaded.owned.is_empty(), "{:?}", loaded.owned);
}

#[test]
fn a_synced_commit_empties_the_journal_and_a_removal_after_it_stays_removed() {
    let dir = tempfile::tempdir().unwrap();
    let (store, loaded) = Store::open(dir.path(), ReplicaId(3), 1_000).unwrap();
    store.write_owned(&[rec("a")], &[], None).unwrap();
    assert!(std::fs::metadata(dir.path().join(JOURNAL_FILE)).unwrap().len() > 0);
    store
        .save_replica(&loaded.replica, &roster_registry::ChangedKeys::default(), false)
        .unwrap();
    assert_eq!(std::fs::metadata(dir.path().join(JOURNAL_FILE)).unwrap().len(), 0);
    store.write_owned(&[rec("b")], &[], None).unwrap();
    assert!(store.remove_owned("web", "b", 1_500).unwrap());
    let killed = killed_copy(dir.path());
    let (_, loaded) = Store::open(killed.path(), ReplicaId(0), 2_000).unwrap();
    let owned: Vec<_> = loaded.owned.iter().map(|r| r.instance.as_str()).collect();
    assert_eq!(owned, ["a"]);
}

#[test]
fn a_journal_that_cannot_be_written_refuses_the_write_and_keeps_nothing_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let switch = fail_writes_in(dir.path());
    let (store, _) = Store::open(dir.path(), ReplicaId(3), 1_000).unwrap();
    switch.store(true, std::sync::atomic::Ordering::SeqCst);
    let e = store.write_owned(&[rec("a")], &[], None).unwrap_err();
    assert!(e.to_string().contains("cannot be written"), "{e}");
    switch.store(false, std::sync::atomic::Ordering::SeqCst);
    let killed = killed_copy(dir.path());
    let (_, loaded) = Store::open(killed.path(), ReplicaId(0), 2_000).unwrap();
    assert!(loaded.owned.is_empty(), "{:?}", loaded.owned);
}
