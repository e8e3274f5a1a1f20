//! The replica saved entry by entry: migration from format 1, saves that fail and are
//! written later, and a damaged entry refused with the way out.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::Ordering;

use redb::ReadableDatabase;
use roster_registry::{codec, ChangedKeys, Endpoint, Hlc, ProviderId, Replica, ReplicaId, ServiceName};

use super::tests::rec;
use super::*;

fn register(r: &mut Replica, provider: &str, port: u16, at: u64) {
    let web = ServiceName::new("web").unwrap();
    let p = ProviderId::new(provider).unwrap();
    let ep = Endpoint::new("10.0.0.1", port).unwrap();
    r.register(web, p, ep, Default::default(), 30_000, Hlc::new(at, 0))
        .unwrap();
}

/// A data directory as roster wrote it before the replica was saved entry by entry
/// (format 1: the whole state as one value).
fn write_format_1(dir: &Path, id: ReplicaId, r: &Replica) {
    let db = Database::create(dir.join(STORE_FILE)).unwrap();
    let tx = db.begin_write().unwrap();
    {
        let mut meta = tx.open_table(META).unwrap();
        meta.insert(K_FORMAT, 1u32.to_le_bytes().as_slice()).unwrap();
        meta.insert(K_ID, id.0.to_le_bytes().as_slice()).unwrap();
        meta.insert(K_FLOOR, r.counter().to_le_bytes().as_slice())
            .unwrap();
        let state = codec::encode_state(r.state());
        meta.insert(entries::K_STATE, state.as_slice()).unwrap();
    }
    tx.commit().unwrap();
}

fn meta_value(dir: &Path, k: &str) -> Option<Vec<u8>> {
    let db = Database::open(dir.join(STORE_FILE)).unwrap();
    let tx = db.begin_read().unwrap();
    let meta = tx.open_table(META).unwrap();
    let v = meta.get(k).unwrap().map(|v| v.value().to_vec());
    v
}

#[test]
fn a_format_1_store_is_migrated_on_open_and_loads_the_same_replica() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = Replica::new(ReplicaId(4));
    for (i, p) in ["a", "b", "c"].into_iter().enumerate() {
        register(&mut r, p, 80 + i as u16, 10 + i as u64);
    }
    r.deregister(
        ServiceName::new("web").unwrap(),
        ProviderId::new("b").unwrap(),
        20,
    )
    .unwrap();
    write_format_1(dir.path(), ReplicaId(4), &r);

    let (store, loaded) = Store::open(dir.path(), ReplicaId(9), 1_000).unwrap();
    assert!(!loaded.fresh);
    assert_eq!(loaded.replica.id(), ReplicaId(4));
    assert_eq!(loaded.replica.state(), r.state());
    assert!(loaded.replica.counter() >= r.counter());
    drop(store);
    assert_eq!(
        meta_value(dir.path(), K_FORMAT),
        Some(2u32.to_le_bytes().to_vec())
    );
    assert_eq!(meta_value(dir.path(), entries::K_STATE), None, "the blob is gone");
    // Opened again, as format 2 now: the same replica, from its rows.
    let (_, again) = Store::open(dir.path(), ReplicaId(9), 2_000).unwrap();
    assert_eq!(again.replica.state(), r.state());
}

#[test]
fn a_damaged_format_1_store_is_refused_and_left_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let r = Replica::new(ReplicaId(4));
    write_format_1(dir.path(), ReplicaId(4), &r);
    {
        let db = Database::open(dir.path().join(STORE_FILE)).unwrap();
        let tx = db.begin_write().unwrap();
        tx.open_table(META)
            .unwrap()
            .insert(entries::K_STATE, [2u8, 0xff].as_slice())
            .unwrap();
        tx.commit().unwrap();
    }
    let e = Store::open(dir.path(), ReplicaId(9), 1_000).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, StoreError::Corrupt { .. }), "{msg}");
    assert!(msg.contains("--reset-identity") && !msg.contains('\n'), "{msg}");
    assert_eq!(
        meta_value(dir.path(), K_FORMAT),
        Some(1u32.to_le_bytes().to_vec())
    );
}

#[test]
fn a_format_1_store_whose_replica_is_damaged_is_reset_keeping_its_own_registrations() {
    let dir = tempfile::tempdir().unwrap();
    write_format_1(dir.path(), ReplicaId(4), &Replica::new(ReplicaId(4)));
    {
        let (store, _) = Store::open(dir.path(), ReplicaId(4), 1_000).unwrap();
        store.write_owned(&[rec("w1")], &[], None).unwrap();
    }
    // Back to format 1 with a damaged replica, as an older roster may have left it.
    let db = Database::open(dir.path().join(STORE_FILE)).unwrap();
    let tx = db.begin_write().unwrap();
    {
        let mut meta = tx.open_table(META).unwrap();
        meta.insert(K_FORMAT, 1u32.to_le_bytes().as_slice()).unwrap();
        meta.insert(entries::K_STATE, [2u8, 0xff].as_slice()).unwrap();
    }
    tx.commit().unwrap();
    drop(db);
    Store::open(dir.path(), ReplicaId(9), 2_000).unwrap_err();
    let (_, loaded) = Store::open_resetting(dir.path(), ReplicaId(9), 3_000).unwrap();
    assert_eq!(loaded.reset_from, Some(ReplicaId(4)));
    assert_eq!(loaded.replica.id(), ReplicaId(9));
    assert!(loaded.replica.state().is_store_empty());
    assert_eq!(loaded.owned, vec![rec("w1")]);
    assert_eq!(
        meta_value(dir.path(), K_FORMAT),
        Some(2u32.to_le_bytes().to_vec())
    );
    assert_eq!(meta_value(dir.path(), entries::K_STATE), None);
}

#[test]
fn a_damaged_entry_is_refused_with_the_way_out() {
    let dir = tempfile::tempdir().unwrap();
    let (store, loaded) = Store::open(dir.path(), ReplicaId(4), 1_000).unwrap();
    let mut r = loaded.replica;
    register(&mut r, "a", 80, 10);
    let changed = r.take_changed().unwrap();
    store.save_replica(&r, &changed, false).unwrap();
    store
        .with_db(|db| {
            let tx = db.begin_write().unwrap();
            tx.open_table(redb::TableDefinition::<&str, &[u8]>::new("regs"))
                .unwrap()
                .insert("web/a", [2u8, 1, 2, 3].as_slice())
                .unwrap();
            tx.commit().unwrap();
            Ok(())
        })
        .unwrap();
    drop(store);
    let e = Store::open(dir.path(), ReplicaId(9), 2_000).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(e, StoreError::Corrupt { .. })
            && msg.contains("web/a")
            && msg.contains("move it aside")
            && msg.contains("--reset-identity")
            && !msg.contains('\n'),
        "{msg}"
    );
}

#[test]
fn the_keys_of_a_save_that_failed_are_written_by_a_later_save() {
    let dir = tempfile::tempdir().unwrap();
    let faults = disk::Faults::default();
    let (store, loaded) = Store::open_with(dir.path(), ReplicaId(3), 1_000, faults.clone()).unwrap();
    let mut r = loaded.replica;
    register(&mut r, "a", 80, 10);
    let first = r.take_changed().unwrap();
    faults.fail_writes.store(true, Ordering::SeqCst);
    store.save_replica(&r, &first, false).unwrap_err();
    faults.fail_writes.store(false, Ordering::SeqCst);
    // Meanwhile another key changes; the failed save's keys are given back.
    register(&mut r, "b", 81, 11);
    let mut pending: ChangedKeys = r.take_changed().unwrap();
    pending.merge(first);
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    while store.reopen_if_due() == Some(false) {
        assert!(Instant::now() < deadline, "the store did not reopen");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    store.save_replica(&r, &pending, false).unwrap();
    drop(store);
    let (_, again) = Store::open(dir.path(), ReplicaId(9), 2_000).unwrap();
    assert_eq!(again.replica.state(), r.state());
    assert_eq!(again.replica.state().registration_count(), 2);
}
