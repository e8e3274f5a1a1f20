//! Status: maintenance and health checks take instances out of reads without
//! deregistering them, a pass writes nothing, and a restart keeps what was decided.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use roster_registry::Health;

use super::{test_node as start, Error, Event, Node, Watch};
use crate::check::{Check, Probe};
use crate::Service;

/// Waits (up to 10 s) for `f`, polling every 20 ms.
async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..500 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("never: {what}");
}

async fn next(w: &mut Watch) -> Event {
    tokio::time::timeout(Duration::from_secs(10), w.recv())
        .await
        .unwrap()
        .unwrap()
}

fn served(node: &Node) -> Vec<String> {
    node.lookup("web").into_iter().map(|i| i.id).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_takes_an_instance_out_of_reads_keeps_it_registered_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path()).await;
    node.register_owned(Service::new("web", "127.0.0.1:81").id("w1"))
        .await
        .unwrap();
    node.register_owned(Service::new("web", "127.0.0.1:82").id("w2"))
        .await
        .unwrap();
    let registered = node.lookup("web")[0].registered_at;
    let mut watch = node.watch("web");
    let mut all = node.watch_all("web");
    for w in [&mut watch, &mut all] {
        assert!(matches!(next(w).await, Event::Up(_)));
        assert!(matches!(next(w).await, Event::Up(_)));
    }

    let changed = node
        .maintenance(Some(("web", "w1")), Some("deploy 42"))
        .await
        .unwrap();
    assert_eq!(changed, vec!["web/w1".to_string()]);
    assert_eq!(served(&node), vec!["w2"]);
    let w1 = node.lookup_all("web").into_iter().find(|i| i.id == "w1").unwrap();
    assert_eq!((w1.status, w1.note.as_str()), (Health::Maintenance, "deploy 42"));
    assert_eq!(
        w1.registered_at, registered,
        "a status change is not a new registration"
    );
    assert!(matches!(next(&mut watch).await, Event::Down { id, .. } if id == "w1"));
    assert!(
        matches!(next(&mut all).await, Event::Status(i) if i.id == "w1" && i.status == Health::Maintenance)
    );
    // Again: nothing changes.
    assert!(node
        .maintenance(Some(("web", "w1")), Some("deploy 42"))
        .await
        .unwrap()
        .is_empty());
    // An instance it does not own, and a bad reason, are refused.
    assert!(matches!(
        node.maintenance(Some(("web", "nope")), Some("x")).await,
        Err(Error::NotFound(_))
    ));
    assert!(matches!(
        node.maintenance(None, Some("a\nb")).await,
        Err(Error::Invalid(_))
    ));
    // Registering it again (an update) keeps it in maintenance and keeps its time.
    node.register_owned(Service::new("web", "127.0.0.1:91").id("w1"))
        .await
        .unwrap();
    let w1 = node.lookup_all("web").into_iter().find(|i| i.id == "w1").unwrap();
    assert_eq!(
        (w1.status, w1.address.as_str(), w1.registered_at),
        (Health::Maintenance, "127.0.0.1:91", registered)
    );
    node.shutdown().await.unwrap();

    let node = start(dir.path()).await;
    assert_eq!(served(&node), vec!["w2"], "maintenance is kept across a restart");
    let w1 = node.lookup_all("web").into_iter().find(|i| i.id == "w1").unwrap();
    assert_eq!(w1.registered_at, registered, "so is the registration time");
    let changed = node.maintenance(None, None).await.unwrap();
    assert_eq!(changed, vec!["web/w1".to_string()]);
    assert_eq!(served(&node), vec!["w1", "w2"]);
    node.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_check_serves_the_instance_while_it_passes_and_a_pass_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path()).await;
    let ttl = Check::ttl(Duration::from_secs(1));
    let svc = Service::new("web", "127.0.0.1:81").id("w1").check(ttl);
    node.register_owned(svc).await.unwrap();
    assert!(served(&node).is_empty(), "not served before its first pass");
    assert_eq!(node.lookup_all("web")[0].status, Health::Critical);
    node.pass("web", "w1").unwrap();
    eventually("served after a pass", || served(&node) == ["w1"]).await;

    // Passes within the TTL: no write to the replica, no event.
    let mut watch = node.watch("web");
    assert!(matches!(next(&mut watch).await, Event::Up(_)));
    let counter = node.transport().replica().counter();
    for _ in 0..1_000 {
        node.pass("web", "w1").unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    node.pass("web", "w1").unwrap();
    assert_eq!(
        node.transport().replica().counter(),
        counter,
        "a pass wrote to the replica"
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(200), watch.recv())
            .await
            .is_err(),
        "a pass made an event"
    );

    // No pass: critical, out of reads, still registered; a pass brings it back.
    assert!(matches!(next(&mut watch).await, Event::Down { id, .. } if id == "w1"));
    let w1 = &node.lookup_all("web")[0];
    assert_eq!(w1.status, Health::Critical);
    assert!(w1.note.contains("no pass within its TTL"), "{}", w1.note);
    node.pass("web", "w1").unwrap();
    assert!(matches!(next(&mut watch).await, Event::Up(i) if i.id == "w1"));

    assert!(matches!(node.pass("web", "nope"), Err(Error::NotFound(_))));
    node.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_check_turns_critical_when_nothing_listens_and_deregisters_after_its_limit() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path()).await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let check = Check::tcp(addr.clone())
        .every(Duration::from_secs(1))
        .failures(2)
        .deregister_critical_after(Duration::from_secs(1));
    node.register_owned(Service::new("web", addr).id("w1").check(check))
        .await
        .unwrap();
    eventually("passing once the port answers", || served(&node) == ["w1"]).await;
    drop(listener);
    eventually("critical after two failed probes", || {
        node.lookup_all("web")
            .first()
            .is_some_and(|i| i.status == Health::Critical)
    })
    .await;
    assert!(
        node.lookup_all("web")[0].note.contains("tcp"),
        "{:?}",
        node.lookup_all("web")
    );
    eventually("deregistered after a second critical", || {
        node.lookup_all("web").is_empty()
    })
    .await;
    node.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_checks_run_only_where_enabled_and_exit_codes_decide() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path()).await;
    let exec = |argv: &[&str]| Check {
        interval_ms: 1_000,
        timeout_ms: 500,
        failures: 1,
        ..Check::new(Probe::Exec(argv.iter().map(|s| s.to_string()).collect()))
    };
    let refused = node
        .register_owned(
            Service::new("web", "127.0.0.1:81")
                .id("w1")
                .check(exec(&["true"])),
        )
        .await;
    assert!(
        matches!(&refused, Err(Error::Invalid(m)) if m.contains("--enable-exec-checks")),
        "{refused:?}"
    );
    assert!(node.lookup_all("web").is_empty(), "nothing registered");
    node.shutdown().await.unwrap();

    let node = Node::builder()
        .listen("127.0.0.1:0")
        .data_dir(dir.path())
        .crash_guard(None)
        .enable_exec_checks(true)
        .start()
        .await
        .unwrap();
    let warn = exec(&["sh", "-c", "echo degraded; exit 1"]);
    node.register_owned(Service::new("web", "127.0.0.1:81").id("w1").check(warn))
        .await
        .unwrap();
    eventually("warning, and still served", || {
        node.lookup("web")
            .first()
            .is_some_and(|i| i.status == Health::Warning && i.note == "degraded")
    })
    .await;
    // Passes once, then hangs past its timeout.
    let flag = dir.path().join("ran-once");
    let script = format!("test -e {0} && sleep 5; touch {0}", flag.display());
    let slow = Check {
        timeout_ms: 200,
        ..exec(&["sh", "-c", &script])
    };
    node.register_owned(Service::new("web", "127.0.0.1:82").id("w2").check(slow))
        .await
        .unwrap();
    eventually("a probe past its timeout fails", || {
        node.lookup_all("web")
            .iter()
            .any(|i| i.id == "w2" && i.status == Health::Critical && i.note.contains("timed out"))
    })
    .await;
    node.shutdown().await.unwrap();
}

/// An HTTP server on loopback answering every request with the status in `code`.
fn http_server(code: std::sync::Arc<std::sync::atomic::AtomicU16>) -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { return };
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf);
            let c = code.load(std::sync::atomic::Ordering::SeqCst);
            let _ = write!(
                s,
                "HTTP/1.1 {c} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            );
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_check_follows_the_answer_code_with_its_thresholds() {
    use std::sync::atomic::{AtomicU16, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path()).await;
    let code = std::sync::Arc::new(AtomicU16::new(200));
    let addr = http_server(code.clone());
    let check = Check {
        interval_ms: 1_000,
        timeout_ms: 500,
        failures: 2,
        ..Check::new(Probe::Http(format!("http://{addr}/health")))
    };
    node.register_owned(Service::new("web", addr).id("w1").check(check))
        .await
        .unwrap();
    eventually("passing on 200", || served(&node) == ["w1"]).await;
    code.store(429, Ordering::SeqCst);
    eventually("warning on 429, still served", || {
        node.lookup("web")
            .first()
            .is_some_and(|i| i.status == Health::Warning)
    })
    .await;
    code.store(503, Ordering::SeqCst);
    eventually("critical after two 503s", || served(&node).is_empty()).await;
    assert!(
        node.lookup_all("web")[0].note.contains("503"),
        "{:?}",
        node.lookup_all("web")
    );
    code.store(204, Ordering::SeqCst);
    eventually("passing again", || served(&node) == ["w1"]).await;
    node.shutdown().await.unwrap();
}
