//! The `roster` binary as operators run it: real agent processes on loopback ports, and
//! the client commands against them.
//!
//! Every agent listens on `127.0.0.1:0` (or, when restarted, on the port it had) and is
//! killed by its process id when its handle drops.

#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a test failure

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

/// `roster register --from-file`: many instances through a real agent, and killed mid-way.
#[path = "agents/bulk.rs"]
mod bulk;
/// Health checks through real agents.
#[path = "agents/checks.rs"]
mod checks;
/// An agent SIGKILLed at any moment.
#[path = "agents/crash.rs"]
mod crash;
/// The data directory under trouble.
#[path = "agents/disk.rs"]
mod disk;
/// The cluster secret, and what clients are trusted with.
#[path = "agents/secrets.rs"]
mod secrets;
/// TLS between agents and for clients.
#[path = "agents/tls.rs"]
mod tls;

use secrets::{secret_file, STRONG_SECRET};
use tls::{agent_start_output, path_str};

const BIN: &str = env!("CARGO_BIN_EXE_roster");
/// Agents in these tests gossip every 100 ms and hold 3 s leases, so a test runs in seconds.
const GOSSIP: &str = "100ms";
const LEASE: &str = "3s";

/// A running agent, killed (SIGKILL, by pid) and reaped when dropped.
struct Agent {
    child: Child,
    url: String,
    port: u16,
    dir: PathBuf,
    stdout: mpsc::Receiver<String>,
}

impl Agent {
    fn start(dir: &Path, name: &str, extra: &[&str]) -> Agent {
        Self::start_on(dir, name, "127.0.0.1:0", extra)
    }

    fn start_on(dir: &Path, name: &str, listen: &str, extra: &[&str]) -> Agent {
        Self::start_with_log(dir, name, listen, extra, None)
    }

    /// As [`Agent::start_on`], its log (stderr) written to `log` when given.
    fn start_with_log(dir: &Path, name: &str, listen: &str, extra: &[&str], log: Option<&Path>) -> Agent {
        let mut cmd = Command::new(BIN);
        cmd.args([
            "agent",
            "--listen",
            listen,
            "--node-name",
            name,
            "--gossip-interval",
            GOSSIP,
        ]);
        if !extra.contains(&"--lease-ttl") {
            cmd.args(["--lease-ttl", LEASE]);
        }
        cmd.arg("--data-dir")
            .arg(dir)
            .args(extra)
            .env_remove("ROSTER_AGENT")
            .env("ROSTER_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(match log {
                Some(path) => std::fs::File::create(path).unwrap(),
                None => std::fs::File::create(dir.with_extension("log")).unwrap(),
            });
        let mut child = cmd.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        let url = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(url) = line.strip_prefix("listening on ") {
                        break url.to_string();
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = child.wait().unwrap();
                    panic!(
                        "agent {name} exited before it listened ({status}); run it on {} to see why",
                        dir.display()
                    );
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let _ = child.kill();
                    panic!("agent {name} did not say where it listens within 10 s");
                }
            }
        };
        let port = url.rsplit(':').next().unwrap().parse().unwrap();
        Agent {
            child,
            url,
            port,
            dir: dir.to_path_buf(),
            stdout: rx,
        }
    }

    /// SIGKILL: no goodbye, no last save.
    fn kill9(mut self) -> (PathBuf, u16) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        (self.dir.clone(), self.port)
    }

    /// SIGTERM, then wait for a graceful exit.
    fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the agent did not stop within 10 s of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn roster(&self, args: &[&str]) -> Output {
        roster(&[args, &["--agent", &self.url]].concat())
    }

    fn json(&self, args: &[&str]) -> Value {
        let out = self.roster(&[args, &["--json"]].concat());
        assert!(
            out.status.success(),
            "roster {args:?} failed: {}",
            text(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    fn instances(&self, service: &str) -> Vec<Value> {
        let out = self.roster(&["get", service, "--json"]);
        match out.status.code() {
            Some(0) => serde_json::from_slice::<Vec<Value>>(&out.stdout).unwrap(),
            Some(1) => Vec::new(),
            other => panic!("roster get: exit {other:?}: {}", text(&out.stderr)),
        }
    }

    /// What the agent logged so far (its stderr, kept beside its data directory).
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.with_extension("log")).unwrap_or_default()
    }

    /// Lines the agent printed after its start.
    #[allow(dead_code)]
    fn printed(&self) -> Vec<String> {
        self.stdout.try_iter().collect()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `roster watch` running in the background, its lines collected.
struct Watcher {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Watcher {
    fn start(agent: &Agent, service: &str) -> Watcher {
        let mut child = Command::new(BIN)
            .args(["watch", service, "--json", "--agent", &agent.url])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Watcher { child, lines: rx }
    }

    /// The next event within `wait`.
    fn next(&self, wait: Duration) -> Option<Value> {
        self.lines
            .recv_timeout(wait)
            .ok()
            .map(|l| serde_json::from_str(&l).unwrap())
    }

    /// Every event within `wait`.
    fn all(&self, wait: Duration) -> Vec<Value> {
        let deadline = Instant::now() + wait;
        let mut out = Vec::new();
        while let Some(e) = self.next(deadline.saturating_duration_since(Instant::now())) {
            out.push(e);
        }
        out
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn roster(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("ROSTER_AGENT")
        .env_remove("ROSTER_CLUSTER_SECRET_FILE")
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).trim().to_string()
}

/// Polls `f` every 20 ms until it holds or `limit` passes; returns how long it took.
fn within(limit: Duration, what: &str, mut f: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    loop {
        if f() {
            return start.elapsed();
        }
        assert!(start.elapsed() < limit, "not within {limit:?}: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn cluster(root: &Path) -> (Agent, Agent, Agent) {
    let a = Agent::start(&root.join("a"), "a", &[]);
    let b = Agent::start(&root.join("b"), "b", &["--join", &a.url]);
    let c = Agent::start(&root.join("c"), "c", &["--join", &a.url]);
    for x in [&a, &b, &c] {
        within(Duration::from_secs(10), "every agent lists three members", || {
            x.json(&["members"]).as_array().unwrap().len() == 3
        });
    }
    (a, b, c)
}

#[test]
fn a_registration_on_one_agent_reaches_the_others_and_is_pushed_to_a_watch() {
    let root = tempfile::tempdir().unwrap();
    let (a, b, c) = cluster(root.path());
    let watch = Watcher::start(&c, "web");
    // Nothing registered yet: the watch is quiet.
    assert!(watch.next(Duration::from_millis(300)).is_none());

    let out = a.roster(&[
        "register",
        "web",
        "127.0.0.1:8080",
        "--meta",
        "zone=a",
        "--id",
        "web-1",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "web-1");
    for x in [&b, &c] {
        within(
            Duration::from_secs(2),
            "the registration shows on the other agents",
            || x.instances("web").len() == 1,
        );
    }
    let got = &b.instances("web")[0];
    assert_eq!(got["instance"], "web-1");
    assert_eq!(got["address"], "127.0.0.1:8080");
    assert_eq!(got["meta"]["zone"], "a");
    assert!(got["registered_at"].as_str().unwrap().ends_with('Z'));
    assert!(got["lease_expires_at"].as_str().unwrap().ends_with('Z'));

    let up = watch.next(Duration::from_secs(2)).expect("the watch hears of it");
    assert_eq!(up["event"], "up");
    assert_eq!(up["service"], "web");
    assert_eq!(up["instance"], "web-1");
    assert_eq!(up["address"], "127.0.0.1:8080");

    let ls = a.json(&["ls"]);
    assert_eq!(ls, serde_json::json!([{"service": "web", "instances": 1}]));

    let out = a.roster(&["deregister", "web", "web-1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let down = watch
        .next(Duration::from_secs(2))
        .expect("the watch hears of the removal");
    assert_eq!(down["event"], "down");
    assert_eq!(down["instance"], "web-1");
    assert_eq!(down["address"], "127.0.0.1:8080");
    within(Duration::from_secs(2), "the removal reaches b", || {
        b.instances("web").is_empty()
    });
}

#[test]
fn an_agent_killed_and_restarted_on_its_data_dir_resumes_and_peers_see_only_updates() {
    let root = tempfile::tempdir().unwrap();
    let (a, b, c) = cluster(root.path());
    let out = b.roster(&["register", "api", "127.0.0.1:9000", "--id", "api-1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    within(Duration::from_secs(2), "a sees b's registration", || {
        a.instances("api").len() == 1
    });
    let registered = a.instances("api")[0]["registered_at"].clone();
    let winner = |agent: &Agent| {
        let out = agent.roster(&["explain", "api", "api-1", "--json"]);
        serde_json::from_slice::<Value>(&out.stdout).unwrap()["winner"].clone()
    };
    let before = winner(&a);
    let watch = Watcher::start(&a, "api");
    assert_eq!(watch.next(Duration::from_secs(2)).unwrap()["event"], "up");

    let (dir, port) = b.kill9();
    let b = Agent::start_on(&dir, "b", &format!("127.0.0.1:{port}"), &["--join", &a.url]);
    // Its own registration is back at once, from disk.
    assert_eq!(b.instances("api").len(), 1);
    // Peers see it updated (written again under the same id), never removed and re-added,
    // through and past the old lease.
    within(
        Duration::from_secs(3),
        "a sees the rewritten registration",
        || winner(&a) != before,
    );
    // It is the same registration: when it was first registered has not moved.
    assert_eq!(a.instances("api")[0]["registered_at"], registered);
    // Written again with the same address and metadata: nothing a watch prints changed.
    let events = watch.all(Duration::from_secs(4));
    assert!(
        events.is_empty(),
        "a peer's watch printed the restarted agent's registration again: {events:?}"
    );
    assert_eq!(a.instances("api").len(), 1);
    assert_eq!(c.instances("api").len(), 1);
}

#[test]
fn a_restarted_agent_has_its_registrations_and_replica_before_it_talks_to_a_peer() {
    let root = tempfile::tempdir().unwrap();
    let a = Agent::start(&root.path().join("a"), "a", &["--lease-ttl", "20s"]);
    let b = Agent::start(
        &root.path().join("b"),
        "b",
        &["--join", &a.url, "--lease-ttl", "20s"],
    );
    assert!(a
        .roster(&["register", "db", "127.0.0.1:5432", "--id", "db-1"])
        .status
        .success());
    assert!(b
        .roster(&["register", "web", "127.0.0.1:80", "--id", "web-1"])
        .status
        .success());
    within(Duration::from_secs(2), "b holds a's registration", || {
        b.instances("db").len() == 1
    });
    // Let b's saver commit what it learnt (it batches for 100 ms).
    std::thread::sleep(Duration::from_millis(500));
    drop(a.kill9());
    let (dir, port) = b.kill9();

    // b alone, nobody to join: everything it held is back from disk.
    let b = Agent::start_on(&dir, "b", &format!("127.0.0.1:{port}"), &["--lease-ttl", "20s"]);
    assert_eq!(b.instances("web").len(), 1, "its own registration");
    assert_eq!(b.instances("db").len(), 1, "the replica: a peer's registration");
    let status = b.json(&["status"]);
    assert_eq!(status["peers"], serde_json::json!([]));
    assert_eq!(status["counters"]["frames_received"], 0);
    assert_eq!(status["launches_recent"], 2);
}

/// (service, instance) of a registration.
type Key = (String, String);
/// Registrations by key, with their address.
type Regs = BTreeMap<Key, String>;

#[derive(Debug, Clone, Copy)]
enum Kill {
    /// During a burst of writes from two clients.
    Burst,
    /// Within milliseconds of the agent's start, writes already arriving.
    AtStart,
    /// At once after a write returned.
    AfterWrite,
}

#[test]
fn a_dead_agents_registration_disappears_within_the_lease_plus_a_gossip_round() {
    let root = tempfile::tempdir().unwrap();
    let (a, b, c) = cluster(root.path());
    assert!(c
        .roster(&["register", "job", "127.0.0.1:7000", "--id", "job-1"])
        .status
        .success());
    for x in [&a, &b] {
        within(Duration::from_secs(2), "the registration spreads", || {
            x.instances("job").len() == 1
        });
    }
    let watch = Watcher::start(&a, "job");
    assert_eq!(watch.next(Duration::from_secs(2)).unwrap()["event"], "up");
    let (_, c_port) = c.kill9();
    // The lease (3 s) was renewed at most a third of it before the kill; a read hides an
    // instance whose lease ended. One gossip round (100 ms) and a second of slack for a
    // busy machine.
    for x in [&a, &b] {
        within(
            Duration::from_millis(3_000 + 100 + 1_000),
            "the dead agent's registration disappears",
            || x.instances("job").is_empty(),
        );
    }
    // A watch hears of it too: time, not a delta, took it down.
    let down = watch
        .next(Duration::from_secs(3))
        .expect("the watch reports the lapsed lease");
    assert_eq!(
        (down["event"].as_str(), down["instance"].as_str()),
        (Some("down"), Some("job-1"))
    );
    // And `members` shows the dead agent as gone.
    let c_url = format!(":{c_port}");
    within(Duration::from_secs(3), "a lists c as gone", || {
        a.json(&["members"])
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["state"] == "gone" && m["address"].as_str().is_some_and(|u| u.ends_with(&c_url)))
    });
}

#[test]
fn a_gracefully_restarted_agent_shows_its_peers_no_change() {
    let root = tempfile::tempdir().unwrap();
    let a = Agent::start(&root.path().join("a"), "a", &[]);
    let b = Agent::start(&root.path().join("b"), "b", &["--join", &a.url]);
    assert!(b
        .roster(&["register", "web", "127.0.0.1:80", "--id", "web-1"])
        .status
        .success());
    within(Duration::from_secs(2), "a sees it", || {
        a.instances("web").len() == 1
    });
    let watch = Watcher::start(&a, "web");
    assert_eq!(watch.next(Duration::from_secs(2)).unwrap()["event"], "up");
    let port = b.port;
    let dir = b.dir.clone();
    // SIGTERM, as `systemctl restart` or an upgrade sends: a stop, not a departure.
    let status = b.terminate();
    assert!(status.success(), "a graceful stop exits 0: {status:?}");
    // Peers keep what it owns within its lease (48 s at two members).
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        a.instances("web").len(),
        1,
        "a peer kept the stopped agent's registration"
    );
    let _b = Agent::start_on(&dir, "b", &format!("127.0.0.1:{port}"), &["--join", &a.url]);
    within(Duration::from_secs(5), "b is a member again", || {
        a.json(&["members"]).as_array().unwrap().len() == 2
    });
    let events = watch.all(Duration::from_secs(3));
    assert!(
        events.is_empty(),
        "a peer's watch printed the restarted agent's registration again: {events:?}"
    );
    assert_eq!(a.instances("web").len(), 1);
}

#[test]
fn a_watch_on_an_agent_that_restarts_goes_on_without_repeating_or_missing_a_change() {
    let root = tempfile::tempdir().unwrap();
    let a = Agent::start(&root.path().join("a"), "a", &[]);
    let b = Agent::start(&root.path().join("b"), "b", &["--join", &a.url]);
    for (agent, id, port) in [(&a, "kept", "80"), (&b, "gone", "81"), (&b, "moved", "82")] {
        let addr = format!("127.0.0.1:{port}");
        assert!(agent
            .roster(&["register", "web", &addr, "--id", id])
            .status
            .success());
    }
    within(Duration::from_secs(2), "a sees all three", || {
        a.instances("web").len() == 3
    });
    let watch = Watcher::start(&a, "web");
    let first: Vec<Value> = (0..3)
        .map(|_| watch.next(Duration::from_secs(2)).unwrap())
        .collect();
    assert!(first.iter().all(|e| e["event"] == "up"), "{first:?}");

    // The watched agent restarts (SIGTERM, then start on its data directory); while it
    // is down, one instance goes and one moves.
    let (dir, port) = (a.dir.clone(), a.port);
    assert!(a.terminate().success());
    assert!(b.roster(&["deregister", "web", "gone"]).status.success());
    assert!(b
        .roster(&["register", "web", "127.0.0.1:92", "--id", "moved"])
        .status
        .success());
    let _a = Agent::start_on(&dir, "a", &format!("127.0.0.1:{port}"), &["--join", &b.url]);
    let mut seen: Vec<String> = watch
        .all(Duration::from_secs(5))
        .iter()
        .map(|e| {
            format!(
                "{} {} {}",
                e["event"].as_str().unwrap(),
                e["instance"].as_str().unwrap(),
                e["address"].as_str().unwrap()
            )
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        vec!["down gone 127.0.0.1:81", "up moved 127.0.0.1:92"],
        "after the restart the watch printed what changed, once each, and nothing else"
    );
}

#[test]
fn roster_leave_removes_an_agents_registrations_everywhere_at_once_and_stops_it() {
    let root = tempfile::tempdir().unwrap();
    let a = Agent::start(&root.path().join("a"), "a", &[]);
    let mut b = Agent::start(&root.path().join("b"), "b", &["--join", &a.url]);
    for id in ["web-1", "web-2"] {
        assert!(b
            .roster(&["register", "web", "127.0.0.1:80", "--id", id])
            .status
            .success());
    }
    within(Duration::from_secs(2), "a sees them", || {
        a.instances("web").len() == 2
    });
    let out = b.roster(&["leave"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("leaving the cluster"),
        "{}",
        text(&out.stdout)
    );
    // Well within the lease (48 s at two members): removed, not lapsed.
    within(Duration::from_secs(2), "a drops what b owned at once", || {
        a.instances("web").is_empty()
    });
    within(Duration::from_secs(10), "b exits", || {
        b.child.try_wait().unwrap().is_some()
    });
    assert!(b.child.wait().unwrap().success(), "an agent that left exits 0");
    assert!(
        b.printed().iter().any(|l| l == "left the cluster"),
        "{:?}",
        b.printed()
    );

    // Started again, its registrations come back (they stayed on its disk); with
    // --leave-on-terminate, SIGTERM is a departure too.
    let port = b.port;
    let dir = b.dir.clone();
    drop(b);
    let b = Agent::start_on(
        &dir,
        "b",
        &format!("127.0.0.1:{port}"),
        &["--join", &a.url, "--leave-on-terminate"],
    );
    within(
        Duration::from_secs(5),
        "its registrations come back with it",
        || a.instances("web").len() == 2,
    );
    assert!(b.terminate().success());
    within(Duration::from_secs(2), "a drops them at once", || {
        a.instances("web").is_empty()
    });
}

#[test]
fn a_registration_with_a_ttl_ends_when_it_is_not_registered_again() {
    let root = tempfile::tempdir().unwrap();
    let a = Agent::start(&root.path().join("a"), "a", &[]);
    assert!(a
        .roster(&["register", "batch", "127.0.0.1:1", "--ttl", "1s"])
        .status
        .success());
    assert_eq!(a.instances("batch").len(), 1);
    within(
        Duration::from_secs(3),
        "the registration ends after its ttl",
        || a.instances("batch").is_empty(),
    );
}

#[test]
fn bad_input_gets_a_clear_error_and_changes_nothing() {
    let root = tempfile::tempdir().unwrap();
    let a = Agent::start(&root.path().join("a"), "a", &[]);
    let big = format!("k={}", "x".repeat(5_000));
    let cases: Vec<(Vec<&str>, i32, &str)> = vec![
        (
            vec!["register", "Bad Name", "127.0.0.1:80"],
            2,
            "invalid service name",
        ),
        (vec!["register", "web", "no-port"], 2, "invalid address"),
        (vec!["register", "web", "127.0.0.1:99999"], 2, "invalid address"),
        (vec!["register", "web", "`$(id)`;rm:80"], 2, "invalid address"),
        (vec!["register", "web", "a_b.example:80"], 2, "invalid address"),
        (vec!["register", "web", "10.0.0.256:80"], 2, "invalid address"),
        (
            vec![
                "register",
                "web",
                "127.0.0.1:80",
                "--meta",
                "zone=a\ndown  web  web-2",
            ],
            2,
            "printable",
        ),
        (
            vec!["register", "web", "127.0.0.1:80", "--meta", "zone=\u{1b}[31mred"],
            2,
            "printable",
        ),
        (
            vec!["register", "web", "127.0.0.1:80", "--meta", &big],
            2,
            "metadata",
        ),
        (
            vec!["register", "web", "127.0.0.1:80", "--meta", "novalue"],
            2,
            "KEY=VALUE",
        ),
        (
            vec!["register", "web", "127.0.0.1:80", "--id", "a/b"],
            2,
            "instance id",
        ),
        (
            vec!["register", "web", "127.0.0.1:80", "--ttl", "soon"],
            2,
            "durations",
        ),
        (vec!["register", "roster", "127.0.0.1:80"], 2, "reserved"),
        (vec!["register", "web"], 2, "ADDRESS"),
        (vec!["get", "web", "--frobnicate"], 2, "--frobnicate"),
        (vec!["get", "web"], 1, "no live instances of web"),
        (vec!["deregister", "web", "web-9"], 1, "owns no instance"),
        (vec!["explain", "web", "web-9"], 1, "no registration"),
    ];
    for (args, code, needle) in cases {
        let out = a.roster(&args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "roster {args:?}: {err}");
        assert!(
            err.contains(needle),
            "roster {args:?}: {err:?} does not say {needle:?}"
        );
        // Every error but the argument parser's is one line.
        if code == 1 || !err.starts_with("error: ") {
            assert_eq!(err.lines().count(), 1, "one line: {err:?}");
            assert!(err.starts_with("roster: error: "), "{err:?}");
        }
    }
    // Input the agent would refuse, or once accepted (or cut the connection over), is
    // refused before it is sent: exit 2, one line.
    let mut many = vec!["register", "web", "127.0.0.1:80"];
    many.extend(std::iter::repeat_n(["--meta", "k=v"], 10_000).flatten());
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "register",
                "web",
                "127.0.0.1:80",
                "--meta",
                "zone=a",
                "--meta",
                "zone=b",
            ],
            "\"zone\" is given twice",
        ),
        (many, "10000 pairs"),
        (
            vec!["register", "web", "127.0.0.1:80", "--ttl", "25h"],
            "at most 24h",
        ),
        (
            vec!["register", "web", "127.0.0.1:80", "--ttl", "500000000000days"],
            "at most 24h",
        ),
        (
            vec!["register", "web", "127.0.0.1:80", "--ttl", "500ms"],
            "at least 1s",
        ),
    ];
    for (args, needle) in cases {
        let out = a.roster(&args);
        let err = text(&out.stderr);
        let shown = &args[..args.len().min(8)];
        assert_eq!(out.status.code(), Some(2), "roster {shown:?}: {err}");
        assert!(
            err.contains(needle),
            "roster {shown:?}: {err:?} does not say {needle:?}"
        );
        assert_eq!(err.lines().count(), 1, "one line: {err:?}");
        assert!(err.starts_with("roster: error: "), "{err:?}");
    }
    assert_eq!(a.json(&["ls"]), serde_json::json!([]));

    // Bad agent flags stop it before it starts.
    let never = root.path().join("never").display().to_string();
    for (args, needle) in [
        (vec!["agent", "--gossip-interval", "fast"], "durations"),
        (
            vec!["agent", "--fanout", "0", "--data-dir", "/tmp/roster-never"],
            "fanout",
        ),
        (
            vec!["agent", "--join", "http://x:1", "--data-dir", "/tmp/roster-never"],
            "join URL",
        ),
        (
            vec!["agent", "--max-clock-skew", "1h", "--data-dir", &never],
            "max clock skew",
        ),
        (
            vec![
                "agent",
                "--listen",
                "127.0.0.1:0",
                "--cluster-secret-file",
                "/nonexistent",
            ],
            "secret file",
        ),
        (
            vec!["agent", "--listen", "0.0.0.0:0", "--data-dir", &never],
            "--cluster-secret-file",
        ),
        (
            vec![
                "agent",
                "--listen",
                "127.0.0.1:0",
                "--advertise",
                "nowhere",
                "--data-dir",
                &never,
            ],
            "--advertise",
        ),
    ] {
        let out = roster(&args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "roster {args:?}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stderr).contains(needle),
            "roster {args:?}: {}",
            text(&out.stderr)
        );
    }
}

#[test]
fn a_client_that_cannot_reach_its_agent_exits_3_and_says_how_to_start_one() {
    // A port nothing listens on: bind one, note it, release it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("ws://127.0.0.1:{port}");
    let out = roster(&["ls", "--agent", &url]);
    assert_eq!(out.status.code(), Some(3));
    let err = text(&out.stderr);
    assert!(err.contains(&url) && err.contains("roster agent"), "{err}");
    let out = roster(&["ls", "--agent", "http://127.0.0.1:7420"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    // ROSTER_AGENT is the flag's variable.
    let out = Command::new(BIN)
        .args(["ls"])
        .env("ROSTER_AGENT", &url)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert!(text(&out.stderr).contains(&url));
}

#[test]
fn the_config_file_and_variables_set_the_agents_flags_and_flags_win() {
    let root = tempfile::tempdir().unwrap();
    let cfg = root.path().join("roster.toml");
    std::fs::write(
        &cfg,
        format!(
            "listen = \"127.0.0.1:0\"\nnode-name = \"from-file\"\ngossip-interval = \"200ms\"\ndata-dir = \"{}\"\n",
            root.path().join("data").display()
        ),
    )
    .unwrap();
    let start = |env: &[(&str, &str)], args: &[&str]| {
        let mut cmd = Command::new(BIN);
        cmd.arg("agent").args(args).arg("--config").arg(&cfg);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.stdout(Stdio::piped()).stderr(Stdio::null());
        let mut child = cmd.spawn().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().unwrap().unwrap();
        let _ = child.kill();
        let _ = child.wait();
        first
    };
    let first = start(&[], &[]);
    assert!(first.contains("node from-file"), "{first}");
    assert!(start(&[("ROSTER_NODE_NAME", "from-env")], &[]).contains("node from-env"));
    assert!(
        start(&[("ROSTER_NODE_NAME", "from-env")], &["--node-name", "from-flag"]).contains("node from-flag")
    );

    std::fs::write(&cfg, "listen = 5\n").unwrap();
    let out = roster(&["agent", "--config", cfg.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("line 1"), "{}", text(&out.stderr));
    std::fs::write(
        &cfg,
        "# lease-ttl = 1s\nlisten = \"127.0.0.1:0\"\nlease-ttl = \"soon\"\n",
    )
    .unwrap();
    let out = roster(&["agent", "--config", cfg.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("line 3"), "{}", text(&out.stderr));
    std::fs::write(&cfg, "listen = \"127.0.0.1:0\"\ngossip-intervall = \"1s\"\n").unwrap();
    let out = roster(&["agent", "--config", cfg.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("line 2") && err.contains("gossip-intervall"),
        "{err}"
    );
}

#[test]
fn status_members_explain_and_sync_answer_in_json() {
    let root = tempfile::tempdir().unwrap();
    let a = Agent::start(&root.path().join("a"), "a", &["--sync-min-interval", "1h"]);
    let b = Agent::start(&root.path().join("b"), "b", &["--join", &a.url]);
    within(Duration::from_secs(5), "b is connected", || {
        b.json(&["status"])["peers"].as_array().unwrap().len() == 1
    });
    let s = b.json(&["status"]);
    for k in [
        "node",
        "name",
        "version",
        "uptime_ms",
        "peers",
        "launches_recent",
        "crash_guard",
        "counters",
    ] {
        assert!(s.get(k).is_some(), "status has {k}: {s}");
    }
    for k in [
        "connections_opened",
        "connections_accepted",
        "frames_sent",
        "bytes_sent",
        "frames_received",
        "bytes_received",
        "deltas_applied",
        "full_syncs_sent",
        "full_syncs_received",
    ] {
        assert!(s["counters"][k].is_u64(), "counters has {k}: {s}");
    }
    assert_eq!(s["name"], "b");
    assert_eq!(s["crash_guard"], false);

    within(Duration::from_secs(5), "a lists b as a live member", || {
        a.json(&["members"])
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["name"] == "b")
    });
    let m = a.json(&["members"]);
    let names: Vec<&str> = m
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["a", "b"]);
    assert!(m
        .as_array()
        .unwrap()
        .iter()
        .all(|x| x["state"] == "alive" && x["last_heard_ms"].is_u64()));

    assert!(b
        .roster(&["register", "web", "127.0.0.1:80", "--id", "w"])
        .status
        .success());
    let x = b.json(&["explain", "web", "w"]);
    assert_eq!(x["live"], true);
    assert_eq!(x["writes"][0]["node_name"], "b");
    within(
        Duration::from_secs(40),
        "a acknowledges the write in a digest",
        || {
            let _ = a.roster(&["sync"]);
            !b.json(&["explain", "web", "w"])["acknowledged_by"]
                .as_array()
                .unwrap()
                .is_empty()
                || !a.json(&["explain", "web", "w"])["acknowledged_by"]
                    .as_array()
                    .unwrap()
                    .is_empty()
        },
    );

    // A manual sync runs once per --sync-min-interval; the throttle outlives a restart.
    let (dir, port) = a.kill9();
    let a = Agent::start_on(
        &dir,
        "a",
        &format!("127.0.0.1:{port}"),
        &["--sync-min-interval", "1h"],
    );
    let out = a.roster(&["sync"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("next may run in"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_start_refused_for_its_flags_is_not_counted_as_a_launch() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("a");
    let d = dir.to_str().unwrap();
    for listen in ["0.0.0.0:0", "0.0.0.0:0"] {
        let out = roster(&["agent", "--listen", listen, "--data-dir", d]);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    }
    let a = Agent::start(&dir, "a", &[]);
    assert_eq!(a.json(&["status"])["launches_recent"], 1);
}

#[test]
fn roster_id_makes_and_prints_a_data_dirs_identity_without_counting_a_start() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("a");
    let d = path_str(&dir);
    let first = roster(&["id", "--data-dir", &d]);
    assert!(first.status.success(), "{}", text(&first.stderr));
    let id = text(&first.stdout).trim().to_string();
    assert!(
        id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "{id:?}"
    );
    assert!(
        text(&first.stderr).contains("new node identity"),
        "{}",
        text(&first.stderr)
    );
    let again = roster(&["id", "--data-dir", &d, "--json"]);
    let v: Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(v["node"], id.as_str());
    assert_eq!(v["tls_name"], format!("node-{id}"));
    assert_eq!(v["made"], false);
    // The agent started on it is that node, and its first start is its first launch.
    let a = Agent::start(&dir, "a", &[]);
    let status = a.json(&["status"]);
    assert_eq!(status["node"], id.as_str());
    assert_eq!(status["launches_recent"], 1);
    // While the agent holds the directory, `roster id` says so and points at `status`.
    let busy = roster(&["id", "--data-dir", &d]);
    assert_eq!(busy.status.code(), Some(1), "{}", text(&busy.stderr));
    assert!(
        text(&busy.stderr).contains("roster status"),
        "{}",
        text(&busy.stderr)
    );
}

#[test]
fn the_crash_loop_guard_trips_after_too_many_launches_and_clears_after_staying_up() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("a");
    for launch in 1..=3 {
        let a = Agent::start(&dir, "a", &["--crash-guard", "2/30s"]);
        let s = a.json(&["status"]);
        assert_eq!(s["launches_recent"], launch);
        assert_eq!(s["crash_guard"], launch > 2, "launch {launch}: {s}");
        drop(a.kill9());
    }
    // `off` is honoured.
    let a = Agent::start(&dir, "a", &["--crash-guard", "off"]);
    assert_eq!(a.json(&["status"])["crash_guard"], false);
    drop(a.kill9());
    // Five launches within 2 s trip a 2/2s guard, which clears after 2 s up.
    let a = Agent::start(&dir, "a", &["--crash-guard", "2/2s"]);
    assert_eq!(a.json(&["status"])["crash_guard"], true);
    let took = within(
        Duration::from_secs(5),
        "the guard clears after the window",
        || a.json(&["status"])["crash_guard"] == false,
    );
    assert!(
        took >= Duration::from_millis(1_500),
        "cleared after {took:?}, before the window"
    );
    // Reads and own registrations work under the guard.
    assert!(a.roster(&["register", "web", "127.0.0.1:80"]).status.success());
}

#[test]
fn a_restarted_agent_honours_the_dial_backoff_of_the_process_before_it() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("a");
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let seed = format!("ws://127.0.0.1:{dead}");
    let a = Agent::start(&dir, "a", &["--join", &seed, "--crash-guard", "off"]);
    // Its only seed is down: dials back off (0.5 s, 1 s, 2 s, 4 s... each ±50%). After
    // the fourth failure the old process would wait 2 to 6 s: long enough that the check
    // below, under 2 s later even on a loaded machine, is never the old schedule coming
    // due. (After the third, 1 to 3 s, it could be: this test failed once in CI so.)
    within(Duration::from_secs(15), "four dials failed", || {
        a.json(&["status"])["counters"]["connections_opened"]
            .as_u64()
            .unwrap()
            >= 4
    });
    std::thread::sleep(Duration::from_millis(600)); // the backoff reaches the disk
    let (dir, _) = a.kill9();
    // A new process does not dial sooner than the old one would have: seconds.
    let a = Agent::start(&dir, "a", &["--join", &seed, "--crash-guard", "off"]);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        a.json(&["status"])["counters"]["connections_opened"],
        0,
        "the new process dialed its backed-off seed at once"
    );
}

#[test]
fn an_agent_with_nobody_to_join_opens_no_connection() {
    let root = tempfile::tempdir().unwrap();
    let a = Agent::start(&root.path().join("a"), "a", &[]);
    assert!(a.roster(&["register", "web", "127.0.0.1:80"]).status.success());
    std::thread::sleep(Duration::from_millis(1_500));
    let s = a.json(&["status"]);
    assert_eq!(s["counters"]["connections_opened"], 0, "{s}");
    assert_eq!(s["counters"]["frames_sent"], 0, "{s}");
}

/// An instance id another live node keeps alive is refused with its owner named; once the
/// owner deregisters it, it is free. (Two nodes keeping one instance would each take it
/// from the other.)
#[test]
fn registering_an_instance_another_live_node_owns_is_refused_naming_the_owner() {
    let root = tempfile::tempdir().unwrap();
    let a = Agent::start(&root.path().join("a"), "a", &[]);
    let b = Agent::start(&root.path().join("b"), "b", &["--join", &a.url]);
    assert!(a
        .roster(&["register", "web", "127.0.0.1:80", "--id", "w1"])
        .status
        .success());
    within(Duration::from_secs(10), "b to see w1", || {
        b.json(&["get", "web"]).as_array().is_some_and(|v| v.len() == 1)
    });
    let out = b.roster(&["register", "web", "127.0.0.2:80", "--id", "w1"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    assert!(err.contains("registered by node a"), "{err}");
    assert_eq!(
        b.json(&["get", "web"])[0]["address"],
        "127.0.0.1:80",
        "nothing changed"
    );

    assert!(a.roster(&["deregister", "web", "w1"]).status.success());
    within(Duration::from_secs(10), "w1 to be free on b", || {
        b.roster(&["register", "web", "127.0.0.2:80", "--id", "w1"])
            .status
            .success()
    });
    within(Duration::from_secs(10), "a to see b's w1", || {
        a.json(&["get", "web"])[0]["address"] == "127.0.0.2:80"
    });
}

/// The seed of a seeded test: `ROSTER_SEED`, or one from the clock; printed with how
/// to replay it (as `sim_seed` in tests/integration/support.rs does).
fn test_seed(name: &str) -> u64 {
    let seed = std::env::var("ROSTER_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0)
        });
    eprintln!("{name}: seed {seed}; replay with ROSTER_SEED={seed}");
    seed
}

/// splitmix64: a test's schedule, reproducible from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn millis(&mut self, from: u64, to: u64) -> Duration {
        Duration::from_millis(from + self.below(to - from + 1))
    }
}
