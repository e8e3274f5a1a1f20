//! Health checks run by real agents: an HTTP service that stops answering leaves every
//! agent's reads and comes back, a killed service behind a live agent is critical and then
//! deregistered, a TTL check's passes cost peers nothing, and bad checks are refused.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{cluster, text, within, Agent, Watcher};

/// An HTTP server on loopback answering every request with the status in `code`, for as
/// long as the test runs.
fn http_server(code: Arc<AtomicU16>) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { return };
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf);
            let c = code.load(Ordering::SeqCst);
            let _ = write!(
                s,
                "HTTP/1.1 {c} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            );
        }
    });
    addr
}

fn served(agent: &Agent, service: &str) -> usize {
    agent.instances(service).len()
}

fn statuses(agent: &Agent, service: &str) -> Vec<(String, String)> {
    let out = agent.roster(&["get", service, "--all", "--json"]);
    if out.status.code() == Some(1) {
        return Vec::new();
    }
    let list: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    list.iter()
        .map(|i| {
            (
                i["status"].as_str().unwrap().to_string(),
                i["note"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn an_http_service_that_stops_answering_leaves_every_agents_reads_and_comes_back() {
    let root = tempfile::tempdir().unwrap();
    let (a, b, c) = cluster(root.path());
    let code = Arc::new(AtomicU16::new(200));
    let addr = http_server(code.clone());
    let url = format!("http://{addr}/health");
    let out = b.roster(&[
        "register",
        "web",
        &addr,
        "--id",
        "web-1",
        "--check-http",
        &url,
        "--check-interval",
        "1s",
        "--check-timeout",
        "500ms",
        "--check-failures",
        "2",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for x in [&a, &b, &c] {
        within(Duration::from_secs(10), "every agent serves web-1", || {
            served(x, "web") == 1
        });
    }
    // Interval x failures + a gossip round is 2.1 s; the limit leaves room for a slow machine.
    code.store(503, Ordering::SeqCst);
    let down = Instant::now();
    for x in [&a, &b, &c] {
        within(Duration::from_secs(15), "no agent serves web-1", || {
            served(x, "web") == 0
        });
    }
    eprintln!("gone from every agent's reads after {:?}", down.elapsed());
    assert_eq!(
        statuses(&a, "web"),
        vec![("critical".to_string(), "HTTP 503 Service Unavailable".to_string())]
    );
    code.store(200, Ordering::SeqCst);
    for x in [&a, &b, &c] {
        within(Duration::from_secs(15), "every agent serves web-1 again", || {
            served(x, "web") == 1
        });
    }
}

#[test]
fn a_killed_service_behind_a_live_agent_is_critical_then_deregistered() {
    let root = tempfile::tempdir().unwrap();
    let (a, b, _c) = cluster(root.path());
    // The service: a process listening on a port (another roster agent does).
    let service = Agent::start(&root.path().join("svc"), "svc", &[]);
    let target = service.url.trim_start_matches("ws://").to_string();
    let out = a.roster(&[
        "register",
        "db",
        &target,
        "--id",
        "db-1",
        "--check-tcp",
        &target,
        "--check-interval",
        "1s",
        "--check-failures",
        "1",
        "--deregister-critical-after",
        "2s",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    within(Duration::from_secs(10), "b serves db-1", || served(&b, "db") == 1);
    let _ = service.kill9();
    within(Duration::from_secs(10), "b sees db-1 critical", || {
        statuses(&b, "db").first().is_some_and(|(s, _)| s == "critical")
    });
    assert_eq!(served(&b, "db"), 0, "a critical instance is not served");
    within(Duration::from_secs(15), "db-1 is deregistered everywhere", || {
        statuses(&a, "db").is_empty() && statuses(&b, "db").is_empty()
    });
    let out = a.roster(&["deregister", "db", "db-1"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a no longer owns it: {}",
        text(&out.stderr)
    );
}

#[test]
fn passes_of_a_ttl_check_cost_peers_nothing() {
    let root = tempfile::tempdir().unwrap();
    let (a, b, _c) = cluster(root.path());
    let out = a.roster(&[
        "register",
        "cron",
        "127.0.0.1:9",
        "--id",
        "cron-1",
        "--check-ttl",
        "30s",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        statuses(&a, "cron")[0].0,
        "critical",
        "not served before its first pass"
    );
    assert!(a.roster(&["pass", "cron", "cron-1"]).status.success());
    within(Duration::from_secs(10), "b serves cron-1", || {
        served(&b, "cron") == 1
    });
    let winner = |agent: &Agent| agent.json(&["explain", "cron", "cron-1"])["winner"].clone();
    let before = (winner(&a), winner(&b));
    let watch = Watcher::start(&b, "cron");
    assert_eq!(watch.next(Duration::from_secs(5)).unwrap()["event"], "up");
    for _ in 0..200 {
        let out = a.roster(&["pass", "cron", "cron-1"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    assert!(
        watch.all(Duration::from_millis(500)).is_empty(),
        "a pass made an event at a peer"
    );
    assert_eq!(
        (winner(&a), winner(&b)),
        before,
        "a pass wrote the registration again"
    );
    let out = a.roster(&["pass", "cron", "nope"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("with a TTL check"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn bad_checks_are_refused_clearly_and_register_nothing() {
    let root = tempfile::tempdir().unwrap();
    let a = Agent::start(&root.path().join("a"), "a", &[]);
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--check-http", "notaurl"], "is not an http URL"),
        (vec!["--check-http", "ftp://127.0.0.1/"], "is not an http URL"),
        (vec!["--check-http", "https://127.0.0.1/"], "has no TLS files"),
        (
            vec!["--check-tcp", "127.0.0.1:1", "--check-interval", "500ms"],
            "use 1s to 24h",
        ),
        (
            vec!["--check-tcp", "127.0.0.1:1", "--check-failures", "0"],
            "failure threshold of 0",
        ),
        (vec!["--check-tcp", "127.0.0.1:1", "--check-failures", "-1"], "-1"),
        (vec!["--check-tcp", "nohost"], "HOST:PORT"),
        (vec!["--check-interval", "5s"], "need a check"),
        (vec!["--check-exec", "true"], "--enable-exec-checks"),
        (vec!["--check-exec", "'unclosed"], "unclosed quote"),
    ];
    for (flags, needle) in cases {
        let out = a.roster(
            &[
                &["register", "web", "127.0.0.1:80", "--id", "web-1"],
                flags.as_slice(),
            ]
            .concat(),
        );
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {err}");
        assert!(err.contains(needle), "{flags:?}: {err:?} does not say {needle:?}");
        assert_eq!(
            err.lines()
                .filter(|l| l.starts_with("roster: error"))
                .count()
                .max(1),
            1,
            "{err}"
        );
    }
    assert!(statuses(&a, "web").is_empty(), "nothing was registered");
    // An unreachable target is allowed: the instance is just critical.
    let out = a.roster(&["register", "web", "127.0.0.1:80", "--check-tcp", "127.0.0.1:1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}
