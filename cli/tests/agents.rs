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
/// The client commands and the agent's flags.
#[path = "agents/commands.rs"]
mod commands;
/// An agent SIGKILLed at any moment.
#[path = "agents/crash.rs"]
mod crash;
/// An agent SIGKILLed during its peer's churn: its acknowledged writes kept, the peer's
/// changes fetched again.
#[path = "agents/crash_churn.rs"]
mod crash_churn;
/// The data directory under trouble.
#[path = "agents/disk.rs"]
mod disk;
/// DNS with dig.
#[path = "agents/dns.rs"]
mod dns;
/// The docs' console examples, run as written: the guides as one flow, the CLI reference.
#[path = "agents/doc_examples/mod.rs"]
mod doc_examples;
/// docs/reference/cli.md's commands against the binary's.
#[path = "agents/docs.rs"]
mod docs;
/// The exit codes of the reference, walked.
#[path = "agents/exit_codes.rs"]
mod exit_codes;
/// The HTTP API with curl, Python and raw sockets.
#[path = "agents/http.rs"]
mod http;
/// `roster members`: left apart from failed.
#[path = "agents/members.rs"]
mod members;
/// The operator's tools: one instance, force-leave, operator removal.
#[path = "agents/operator.rs"]
mod operator;
/// systemd readiness, completions, man pages, docs/ops/.
#[path = "agents/packaging.rs"]
mod packaging;
/// Restarts and departures.
#[path = "agents/restarts.rs"]
mod restarts;
/// The cluster secret, and what clients are trusted with.
#[path = "agents/secrets.rs"]
mod secrets;
/// TLS between agents and for clients.
#[path = "agents/tls.rs"]
mod tls;
/// The service map in a real browser.
#[path = "agents/ui.rs"]
mod ui;
/// Zones: set, replicated with membership, shown.
#[path = "agents/zones.rs"]
mod zones;

use secrets::{secret_file, STRONG_SECRET};
use tls::{agent_start_output, path_str};

const BIN: &str = env!("CARGO_BIN_EXE_roster");
/// Agents in these tests gossip every 100 ms and hold 3 s leases, so a test runs in seconds.
const GOSSIP: &str = "100ms";
const LEASE: &str = "3s";
/// Longer than an agent's saver gathers what peers sent before it commits it (1 s): after
/// this, a SIGKILL finds it on disk.
const SAVED_AFTER: Duration = Duration::from_millis(1_500);

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
        // Agents of parallel tests share loopback: none takes the HTTP API's default port.
        cmd.env("ROSTER_HTTP_LISTEN", "127.0.0.1:0");
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
        let rx = lines_of(stdout);
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
        let rx = lines_of(stdout);
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
        .env("ROSTER_HTTP_LISTEN", "127.0.0.1:0")
        .args(args)
        .env_remove("ROSTER_AGENT")
        .env_remove("ROSTER_CLUSTER_SECRET_FILE")
        .output()
        .unwrap()
}

/// The lines a child prints on stdout (or stderr), as they come.
fn lines_of(stdout: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
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
fn a_registration_with_a_ttl_ends_when_it_is_not_registered_again() {
    let root = tempfile::tempdir().unwrap();
    let a = Agent::start(&root.path().join("a"), "a", &[]);
    // The second time, the agent has found no ttl left to wait for: it ends again.
    for (pause, what) in [
        (0, "the registration ends after its ttl"),
        (600, "the registration made later ends after its ttl too"),
    ] {
        std::thread::sleep(Duration::from_millis(pause));
        assert!(a
            .roster(&["register", "batch", "127.0.0.1:1", "--ttl", "1s"])
            .status
            .success());
        assert_eq!(a.instances("batch").len(), 1);
        within(Duration::from_secs(3), what, || a.instances("batch").is_empty());
    }
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
