//! Single registrations committed together: each answered alone, in order, the last write
//! to an instance winning, and a failed commit taking back its whole group.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::Ordering;

use super::{now_ms, test_node as start, Error, Node};
use crate::store::{fail_writes_in, Store, StoreError};
use crate::Service;

fn web(id: &str, port: u16) -> Service {
    Service::new("web", format!("127.0.0.1:{port}")).id(id)
}

fn addresses(node: &Node) -> Vec<(String, String)> {
    node.lookup("web")
        .into_iter()
        .map(|i| (i.id, i.address))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrations_queued_together_are_each_answered_and_the_last_write_to_an_instance_wins() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path()).await;
    let mut answers = Vec::new();
    for i in 0..150u16 {
        answers.push(node.register_queued(&web(&format!("w{i}"), 1000 + i)).unwrap());
    }
    // Twice more to the same instance, queued behind the others: the last one stays.
    answers.push(node.register_queued(&web("w7", 2001)).unwrap());
    answers.push(node.register_queued(&web("w7", 2002)).unwrap());
    // A bad one is refused at once, and queues nothing.
    let bad = node.register_queued(&Service::new("web", "no port").id("bad"));
    assert!(
        matches!(
            bad,
            Err(Error::Input(roster_registry::InvalidInput::Endpoint { .. }))
        ),
        "{bad:?}"
    );
    for (instance, answer) in answers {
        assert!(answer.await.unwrap().is_ok(), "{instance}");
    }
    let shown = addresses(&node);
    assert_eq!(shown.len(), 150);
    assert!(
        shown.contains(&("w7".into(), "127.0.0.1:2002".into())),
        "{shown:?}"
    );

    node.shutdown().await.unwrap();
    let (_, loaded) = Store::open(dir.path(), roster_registry::ReplicaId(1), now_ms()).unwrap();
    assert_eq!(loaded.owned.len(), 150);
    let w7 = loaded.owned.iter().find(|r| r.instance == "w7").unwrap();
    assert_eq!(w7.address, "127.0.0.1:2002");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_whose_commit_fails_is_refused_whole_and_the_replica_keeps_what_the_disk_has() {
    let dir = tempfile::tempdir().unwrap();
    let fail = fail_writes_in(dir.path());
    let node = start(dir.path()).await;
    node.register_owned(web("kept", 80)).await.unwrap();

    fail.store(true, Ordering::SeqCst);
    let mut answers = vec![node.register_queued(&web("kept", 81)).unwrap()];
    for i in 0..20u16 {
        answers.push(node.register_queued(&web(&format!("n{i}"), 100 + i)).unwrap());
    }
    for (instance, answer) in answers {
        let e = answer.await.unwrap().unwrap_err();
        assert!(
            matches!(
                e,
                Error::Store(StoreError::Unwritable { .. } | StoreError::Io { .. })
            ),
            "{instance}: {e}"
        );
    }
    assert_eq!(addresses(&node), vec![("kept".into(), "127.0.0.1:80".into())]);

    fail.store(false, Ordering::SeqCst);
    node.shutdown().await.unwrap();
    let (_, loaded) = Store::open(dir.path(), roster_registry::ReplicaId(1), now_ms()).unwrap();
    let owned: Vec<_> = loaded
        .owned
        .iter()
        .map(|r| (r.instance.as_str(), r.address.as_str()))
        .collect();
    assert_eq!(owned, vec![("kept", "127.0.0.1:80")]);
}
