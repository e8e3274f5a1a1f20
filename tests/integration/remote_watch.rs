//! `roster::client::RemoteWatch`: a watch through an agent that goes on across the agent's
//! restart, repeating and missing nothing.

use std::time::Duration;

use roster::client::{RemoteWatch, WatchError, WatchEvent};
use roster::{Node, Service};

async fn agent(dir: &std::path::Path, listen: &str) -> Node {
    Node::builder()
        .listen(listen)
        .data_dir(dir)
        .serve_clients(true)
        .crash_guard(None)
        .start()
        .await
        .unwrap()
}

async fn next(w: &mut RemoteWatch) -> WatchEvent {
    tokio::time::timeout(Duration::from_secs(10), w.next())
        .await
        .expect("an event within 10 s")
        .expect("the watch goes on")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_watch_goes_on_across_its_agents_restart_without_repeating_or_missing() {
    let dir = tempfile::tempdir().unwrap();
    let node = agent(dir.path(), "127.0.0.1:0").await;
    let addr = node.local_addr().to_string();
    node.register_owned(Service::new("web", "10.0.0.1:80").id("w1"))
        .await
        .unwrap();
    let mut w = RemoteWatch::new(node.url(), None, None, "web", false);
    assert!(matches!(next(&mut w).await, WatchEvent::Up(i) if i.instance == "w1"));

    // A stop to start again: the watch loses its connection, and says when it retries.
    node.stop().await.unwrap();
    assert!(matches!(next(&mut w).await, WatchEvent::Lost { .. }));
    let node = agent(dir.path(), &addr).await;
    // A change made while the watch was away, and a change after.
    node.register_owned(Service::new("web", "10.0.0.1:81").id("w2"))
        .await
        .unwrap();
    // The agent may not be listening yet at the first retries: a later one finds it, and
    // the watch says it is back before it shows what changed.
    let mut event = next(&mut w).await;
    while matches!(event, WatchEvent::Lost { .. }) {
        event = next(&mut w).await;
    }
    assert!(matches!(event, WatchEvent::Resumed), "{event:?}");
    match next(&mut w).await {
        WatchEvent::Up(i) => assert_eq!(i.instance, "w2", "w1 was shown already: not again"),
        other => panic!("{other:?}"),
    }
    node.deregister("web", "w1").await.unwrap();
    match next(&mut w).await {
        WatchEvent::Down { instance, last, .. } => {
            assert_eq!(instance, "w1");
            assert_eq!(last.unwrap().address, "10.0.0.1:80");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(w.shown().keys().collect::<Vec<_>>(), ["w2"]);
    node.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_watch_that_cannot_reach_its_agent_at_the_start_says_so() {
    let mut w = RemoteWatch::new("ws://127.0.0.1:1", None, None, "web", false);
    assert!(matches!(w.next().await, Err(WatchError::Client(_))));
    let dir = tempfile::tempdir().unwrap();
    let node = agent(dir.path(), "127.0.0.1:0").await;
    let mut w = RemoteWatch::new(node.url(), None, None, "Not A Name", false);
    assert!(matches!(w.next().await, Err(WatchError::Refused(_))));
    node.shutdown().await.unwrap();
}
