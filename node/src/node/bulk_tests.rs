//! Bulk registration through the node: all or none, saved once, resumed after a restart.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::Ordering;

use super::{test_node as start, Error, Node, MAX_BATCH_ITEMS};
use crate::store::{fail_writes_in, StoreError};
use crate::Service;

fn web(n: usize) -> Vec<Service> {
    (0..n)
        .map(|i| Service::new("web", format!("10.0.0.1:{}", 1000 + i)).id(format!("w{i}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_registered_whole_and_resumed_whole_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path()).await;
    let ids = node.register_many_owned(web(500)).await.unwrap();
    assert_eq!(ids.len(), 500);
    assert_eq!(ids[7], "w7", "ids come in the order of the items");
    assert_eq!(node.lookup("web").len(), 500, "read-your-writes");
    node.shutdown().await.unwrap();
    drop(node);
    let node = start(dir.path()).await;
    assert_eq!(node.lookup("web").len(), 500);
    node.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_item_refuses_the_whole_batch_naming_it_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path()).await;
    let mut items = web(10);
    items[6] = Service::new("web", "no port here").id("bad");
    let e = node.register_many_owned(items).await.unwrap_err();
    assert!(matches!(e, Error::Invalid(_)), "{e}");
    assert!(e.to_string().starts_with("item 6: invalid address"), "{e}");
    let mut items = web(3);
    items.push(Service::new("web", "10.0.0.1:9").id("w1"));
    let e = node.register_many_owned(items).await.unwrap_err();
    assert!(
        e.to_string()
            .starts_with("item 3: instance w1 of web is also item 1"),
        "{e}"
    );
    assert!(node.lookup("web").is_empty());
    let e = node
        .register_many_owned(web(MAX_BATCH_ITEMS + 1))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("send at most 10000 per batch"), "{e}");
    node.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_the_disk_cannot_save_is_not_registered() {
    let dir = tempfile::tempdir().unwrap();
    let fail = fail_writes_in(dir.path());
    let node = start(dir.path()).await;
    fail.store(true, Ordering::SeqCst);
    let e = node.register_many_owned(web(5)).await.unwrap_err();
    assert!(matches!(e, Error::Store(StoreError::Unwritable { .. })), "{e}");
    assert!(node.lookup("web").is_empty());
    fail.store(false, Ordering::SeqCst);
    node.shutdown().await.ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_handles_of_a_batch_deregisters_its_instances() {
    let node = Node::builder().listen("127.0.0.1:0").start().await.unwrap();
    let regs = node.register_many(web(3)).await.unwrap();
    assert_eq!(regs[2].id(), "w2");
    assert_eq!(node.lookup("web").len(), 3);
    drop(regs);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !node.lookup("web").is_empty() {
        assert!(std::time::Instant::now() < deadline, "still registered");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    node.shutdown().await.unwrap();
}
