//! The node when its data directory cannot be written: changes refused until it can,
//! the store reopened by itself, passed `ttl`s still ended.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{now_ms, test_node as start, Error, Event, Node};
use crate::store::{fail_writes_in, Store, StoreError};
use crate::Service;

fn ids(node: &Node) -> Vec<String> {
    node.lookup("web").into_iter().map(|i| i.id).collect()
}

/// Polls `f` every 20 ms for up to 10 s (the store's first reopen comes after about a second).
async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "not within 10 s: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_that_cannot_be_saved_is_refused_and_the_node_writes_again_once_the_disk_works() {
    let dir = tempfile::tempdir().unwrap();
    let fail = fail_writes_in(dir.path());
    let node = start(dir.path()).await;
    node.register_owned(Service::new("web", "127.0.0.1:80").id("a"))
        .await
        .unwrap();
    assert_eq!(node.store_health(), None);
    let mut watch = node.watch("web");

    fail.store(true, Ordering::SeqCst);
    let e = node
        .register_owned(Service::new("web", "127.0.0.1:81").id("b"))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Store(StoreError::Unwritable { .. })), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("cannot be written") && msg.contains("No space left on device"),
        "{msg}"
    );
    assert_eq!(ids(&node), vec!["a"], "what was not saved is not registered");
    let e = node.deregister("web", "a").await.unwrap_err();
    assert!(matches!(e, Error::Store(StoreError::Unwritable { .. })), "{e}");
    assert_eq!(ids(&node), vec!["a"], "what was not saved is not deregistered");
    let health = node.store_health().unwrap();
    assert!(
        health.last_error.contains("No space left on device"),
        "{health:?}"
    );
    // Known to fail now: refused before peers would see a write taken back.
    let e = node
        .register_owned(Service::new("web", "127.0.0.1:82").id("c"))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Store(StoreError::Unwritable { .. })), "{e}");

    // Space is back: no restart needed.
    fail.store(false, Ordering::SeqCst);
    eventually("the store is healthy again", || node.store_health().is_none()).await;
    node.register_owned(Service::new("web", "127.0.0.1:81").id("b"))
        .await
        .unwrap();
    node.deregister("web", "a").await.unwrap();
    assert_eq!(ids(&node), vec!["b"]);
    // Up to the `b` that was saved, the watch saw `a`, then `b` shown and taken back (a
    // first failure cannot be foreseen), but never `c`.
    let mut seen = Vec::new();
    while seen.last().is_none_or(|l| l != "+b") || seen.len() < 4 {
        let e = tokio::time::timeout(Duration::from_secs(10), watch.recv())
            .await
            .unwrap()
            .unwrap();
        seen.push(match e {
            Event::Up(i) => format!("+{}", i.id),
            Event::Status(i) => format!("~{}", i.id),
            Event::Down { id, .. } => format!("-{id}"),
        });
    }
    assert_eq!(seen, vec!["+a", "+b", "-b", "+b"]);
    node.shutdown().await.unwrap();
    let (_, loaded) = Store::open(dir.path(), roster_registry::ReplicaId(1), now_ms()).unwrap();
    let owned: Vec<String> = loaded.owned.iter().map(|r| r.instance.clone()).collect();
    assert_eq!(owned, vec!["b"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passed_ttl_whose_removal_cannot_be_saved_leaves_the_cluster_and_is_saved_later() {
    let dir = tempfile::tempdir().unwrap();
    let fail = fail_writes_in(dir.path());
    let node = start(dir.path()).await;
    node.register_owned(
        Service::new("web", "127.0.0.1:80")
            .id("t")
            .ttl(Duration::from_secs(1)),
    )
    .await
    .unwrap();
    fail.store(true, Ordering::SeqCst);
    eventually("the instance whose ttl passed is gone", || ids(&node).is_empty()).await;
    assert!(node.store_health().is_some());
    let pending = |node: &Node| node.inner.pending_removals.lock().unwrap().clone();
    assert_eq!(pending(&node).into_iter().collect::<Vec<_>>(), vec!["web/t"]);

    fail.store(false, Ordering::SeqCst);
    eventually("the removal is saved", || {
        node.store_health().is_none() && pending(&node).is_empty()
    })
    .await;
    // Off disk for good (a graceful stop keeps what the node owns on disk).
    node.shutdown().await.unwrap();
    let (_, loaded) = Store::open(dir.path(), roster_registry::ReplicaId(1), 0).unwrap();
    assert!(loaded.owned.is_empty(), "{:?}", loaded.owned);
}
