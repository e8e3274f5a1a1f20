//! The store's tests: formats, identity, permissions, failed writes and reopening.

#![allow(clippy::unwrap_used)]

use super::*;
use crate::check::Check;

#[test]
fn a_store_of_another_format_is_refused_with_the_way_out() {
    let dir = tempfile::tempdir().unwrap();
    let (store, loaded) = Store::open(dir.path(), ReplicaId(1), 1_000).unwrap();
    assert!(loaded.fresh);
    store
        .with_db(|db| {
            let tx = db.begin_write().unwrap();
            {
                let mut meta = tx.open_table(META).unwrap();
                meta.insert(K_FORMAT, 3u32.to_le_bytes().as_slice()).unwrap();
            }
            tx.commit().unwrap();
            Ok(())
        })
        .unwrap();
    drop(store);
    let e = Store::open(dir.path(), ReplicaId(1), 2_000).unwrap_err();
    assert!(
        matches!(
            e,
            StoreError::Incompatible {
                found: 3,
                expected: 2,
                ..
            }
        ),
        "{e}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("roster.redb") && msg.contains("move the file aside"),
        "{msg}"
    );
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn an_empty_store_file_is_refused_and_never_becomes_a_new_node() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(STORE_FILE);
    std::fs::write(&path, b"").unwrap();
    let e = Store::open(dir.path(), ReplicaId(1), 1_000).unwrap_err();
    assert!(matches!(e, StoreError::Corrupt { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains(&path.display().to_string())
            && msg.contains("empty")
            && msg.contains("move it aside")
            && msg.contains("new node")
            && !msg.contains('\n'),
        "{msg}"
    );
    // Nothing changed: still empty, and no other file left behind.
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
    assert_eq!(entries(dir.path()), vec![STORE_FILE.to_string()]);
}

#[test]
fn a_store_file_that_cannot_be_opened_is_refused_with_the_way_out() {
    let dir = tempfile::tempdir().unwrap();
    // A directory where the file should be: no open for writing succeeds, even as root.
    std::fs::create_dir(dir.path().join(STORE_FILE)).unwrap();
    let e = Store::open(dir.path(), ReplicaId(1), 1_000).unwrap_err();
    assert!(matches!(e, StoreError::Unreadable { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains(STORE_FILE) && msg.contains("move it aside") && msg.contains("new node"),
        "{msg}"
    );
}

#[test]
fn a_database_without_a_roster_identity_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(STORE_FILE);
    drop(Database::create(&path).unwrap());
    let e = Store::open(dir.path(), ReplicaId(1), 1_000).unwrap_err();
    assert!(
        matches!(&e, StoreError::Corrupt { why, .. } if why.contains("no roster identity")),
        "{e}"
    );
}

#[test]
fn a_new_store_appears_under_its_name_only_when_made() {
    let dir = tempfile::tempdir().unwrap();
    let (store, loaded) = Store::open(dir.path(), ReplicaId(5), 1_000).unwrap();
    assert!(loaded.fresh);
    assert_eq!(store.path(), dir.path().join(STORE_FILE));
    // The store, and the journal of own writes beside it.
    assert_eq!(
        entries(dir.path()),
        vec![JOURNAL_FILE.to_string(), STORE_FILE.to_string()]
    );
    drop(store);
    let (_, again) = Store::open(dir.path(), ReplicaId(6), 2_000).unwrap();
    assert!(!again.fresh);
    assert_eq!(again.replica.id(), ReplicaId(5));
}

#[cfg(unix)]
fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[cfg(unix)]
#[test]
fn a_new_data_dir_and_its_store_are_for_the_owner_only() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("a").join("b");
    let (store, loaded) = Store::open(&dir, ReplicaId(1), 1_000).unwrap();
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&dir.join(STORE_FILE)), 0o600);
    assert_eq!(mode(&dir.join(JOURNAL_FILE)), 0o600);
    assert_eq!(mode(&root.path().join("a")), 0o700);
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    drop(store);
}

#[cfg(unix)]
#[test]
fn an_open_data_dir_is_warned_about_and_an_open_store_file_is_tightened() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    drop(Store::open(dir.path(), ReplicaId(1), 1_000).unwrap());
    let file = dir.path().join(STORE_FILE);
    // As an older roster left them.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (_, loaded) = Store::open(dir.path(), ReplicaId(1), 2_000).unwrap();
    assert_eq!(mode(&file), 0o600);
    assert_eq!(mode(dir.path()), 0o755, "the directory is the user's to change");
    let all = loaded.warnings.join("\n");
    assert!(
        all.contains(&format!("chmod 700 {}", dir.path().display())) && all.contains("now 600"),
        "{all}"
    );
}

#[test]
fn a_record_saved_by_a_build_before_checks_is_read_passing_and_in_service() {
    let r = rec("w1");
    let old = (
        &r.service,
        &r.instance,
        &r.address,
        &r.meta,
        r.lease_ttl_ms,
        r.registered_at_ms,
        r.expires_at_ms,
    );
    let bytes = postcard::to_stdvec(&old).unwrap();
    assert_eq!(OwnedRecord::decode(&bytes).unwrap(), r);
    // And this build's record round-trips with what it added.
    let mut new = rec("w2");
    new.maintenance = Some("deploy".into());
    new.checks = vec![Check::new(crate::check::Probe::Ttl)];
    let bytes = postcard::to_stdvec(&new).unwrap();
    assert_eq!(OwnedRecord::decode(&bytes).unwrap(), new);
    assert!(OwnedRecord::decode(&bytes[..bytes.len() - 1]).is_err());
}

/// An own registration of `web` as a test saves it (shared with `entries_tests`).
pub(super) fn rec(instance: &str) -> OwnedRecord {
    OwnedRecord {
        service: "web".into(),
        instance: instance.into(),
        address: "127.0.0.1:80".into(),
        meta: Vec::new(),
        lease_ttl_ms: 30_000,
        registered_at_ms: 1_000,
        expires_at_ms: None,
        status: roster_registry::Status::passing(),
        maintenance: None,
        checks: Vec::new(),
    }
}

/// Polls `f` every 20 ms for up to 10 s (the first reopen comes after about a second).
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "not within 10 s: {what}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn after_a_failed_write_the_store_refuses_writes_then_reopens_by_itself_once_the_disk_works() {
    let dir = tempfile::tempdir().unwrap();
    let faults = disk::Faults::default();
    let (store, _) = Store::open_with(dir.path(), ReplicaId(3), 1_000, faults.clone()).unwrap();
    store.write_owned(&[rec("a")], &[], None).unwrap();
    assert_eq!(store.health(), None);

    faults
        .fail_writes
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let e = store.write_owned(&[rec("b")], &[], None).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, StoreError::Unwritable { .. }), "{msg}");
    assert!(
        msg.contains(&store.path().display().to_string())
            && msg.contains("No space left on device")
            && msg.contains("nothing was saved")
            && msg.contains("free space and permissions"),
        "{msg}"
    );
    let h = store.health().unwrap();
    assert!(h.last_error.contains("No space left on device"), "{h:?}");
    assert_eq!(h.failures, 1);
    // Refused at once until the backoff passes, with the first error, not redb's
    // "Previous I/O error occurred".
    let again = store.remove_owned("web", "a", 2_000).unwrap_err().to_string();
    assert!(again.contains("No space left on device"), "{again}");

    // Space is back: the store reopens on its own and writes again.
    faults
        .fail_writes
        .store(false, std::sync::atomic::Ordering::SeqCst);
    eventually("the store reopens", || store.reopen_if_due() == Some(true));
    store.write_owned(&[rec("c")], &[], None).unwrap();
    assert_eq!(store.health(), None);
    drop(store);

    // What was acknowledged is there; what failed is not.
    let (_, loaded) = Store::open(dir.path(), ReplicaId(9), 3_000).unwrap();
    let mut owned: Vec<String> = loaded.owned.iter().map(|r| r.instance.clone()).collect();
    owned.sort();
    assert_eq!(owned, vec!["a".to_string(), "c".to_string()]);
    assert_eq!(loaded.replica.id(), ReplicaId(3));
}

#[test]
fn a_store_that_still_cannot_write_stays_degraded_and_backs_off() {
    let dir = tempfile::tempdir().unwrap();
    let faults = disk::Faults::default();
    let (store, _) = Store::open_with(dir.path(), ReplicaId(3), 1_000, faults.clone()).unwrap();
    faults
        .fail_writes
        .store(true, std::sync::atomic::Ordering::SeqCst);
    store.set_last_run("sync", 5).unwrap_err();
    let first = store.health().unwrap();
    // Each attempt (a reopen, or a write once reopened) fails and waits longer.
    eventually("a second failure", || {
        let _ = store.reopen_if_due();
        let _ = store.set_last_run("sync", 5);
        store.health().is_some_and(|h| h.failures >= 2)
    });
    let second = store.health().unwrap();
    assert_eq!(second.since_ms, first.since_ms);
    assert!(
        second.next_retry_ms - first.since_ms > first.next_retry_ms - first.since_ms,
        "the second wait is longer: {first:?} then {second:?}"
    );
}

#[test]
fn identity_floor_and_launches_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let (store, first) = Store::open(dir.path(), ReplicaId(7), 1_000).unwrap();
    assert_eq!(first.replica.id(), ReplicaId(7));
    assert_eq!(first.replica.counter(), 0);
    drop(store);
    // Another id offered: the saved one wins; the floor reserved at the first open
    // is where this process starts minting above.
    let (_, second) = Store::open(dir.path(), ReplicaId(8), 2_000).unwrap();
    assert!(!second.fresh);
    assert_eq!(second.replica.id(), ReplicaId(7));
    assert_eq!(second.replica.counter(), COUNTER_RESERVE);
    assert_eq!(second.launches, vec![1_000, 2_000]);
}
