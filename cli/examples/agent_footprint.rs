//! The resident memory of a real `roster agent` process that knows `--n` members (default
//! 10,000) and holds no registrations beyond its membership: "resident memory of a real
//! agent that knows 10,000 members, no registrations".
//!
//! A temporary data directory is made with [`Store::open`]; `--n` synthetic members write
//! their membership as the protocol does (a `proto::Node` each, its state encoded and
//! decoded, as `member_footprint` builds them), every one joined into the stored replica,
//! which is saved. Each member's lease is an hour long and stamped with the wall clock, so
//! every member stays live while the agent runs; its URL is on loopback at port 1
//! (`ws://127.x.y.z:1`), where a dial is refused at once. Then `roster agent` resumes that
//! data directory (`--listen 127.0.0.1:<free port> --http-listen off --crash-guard off`, no
//! `--join`; its output goes to `agent.log` in the temporary directory), runs `--settle`
//! seconds (default 20), and its `VmRSS` and `VmHWM` are read from `/proc/<pid>/status`.
//! Only then is `roster members --json` asked (the answer costs the agent memory of its
//! own) and its members counted by state, to show the agent loaded them.
//!
//! The same runs first with no members (a baseline); "per member" is the agent's `VmRSS`
//! above the baseline's, divided by `--n` (and the same for `VmHWM`). Every agent is
//! killed by its pid and reaped, on error paths too. Measured values only: nothing is
//! asserted about them.
//!
//! ```sh
//! CARGO_PROFILE_RELEASE_LTO=off CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 cargo build --release -p roster-cli --bin roster --example agent_footprint
//! target/release/examples/agent_footprint --n 10000
//! ```
//!
//! `--roster <path>` names the binary (default `target/release/roster`).

#![allow(clippy::unwrap_used)] // fixed, valid inputs: a failure is a bug in the benchmark

#[path = "common/proc.rs"]
mod proc;

use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use roster::registry::codec::{decode_state, encode_state};
use roster::registry::{Replica, ReplicaId, State};
use roster::store::Store;
use roster::transport::proto::{Config, Node, NodeInfo, Now};

/// The agent's own id (members are 1..=n).
const AGENT_ID: ReplicaId = ReplicaId(1 << 40);

/// Members' URLs are 127.x.y.z: at most 2^24 - 2 of them.
const MAX_MEMBERS: u64 = (1 << 24) - 2;

/// The command line.
struct Args {
    n: u64,
    settle: u64,
    roster: PathBuf,
}

/// The value after `name` on the command line.
fn value(args: &[String], name: &str) -> Option<String> {
    let i = args.iter().position(|a| a == name)?;
    Some(args.get(i + 1).expect("a value after the flag").clone())
}

fn parse_args() -> Args {
    let args: Vec<String> = std::env::args().collect();
    let number =
        |name: &str, default: u64| value(&args, name).map_or(default, |v| v.parse().expect("a number"));
    let n = number("--n", 10_000);
    assert!(n <= MAX_MEMBERS, "--n is at most {MAX_MEMBERS}");
    Args {
        n,
        settle: number("--settle", 20),
        roster: value(&args, "--roster").map_or_else(|| "target/release/roster".into(), PathBuf::from),
    }
}

fn wall_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// Member `id`'s membership as it writes it and as it reaches a node: encoded and decoded.
fn member_state(id: u64, now: Now) -> State {
    let info = NodeInfo {
        id: ReplicaId(id),
        name: format!("node-{id}"),
        url: format!("ws://127.{}.{}.{}:1", id >> 16, (id >> 8) & 255, id & 255),
        zone: Default::default(),
    };
    let cfg = Config {
        member_lease_ttl_ms: 3_600_000,
        ..Config::default()
    };
    let member = Node::new(
        info,
        Replica::new(ReplicaId(id)),
        Vec::<String>::new(),
        cfg,
        id,
        now,
    )
    .unwrap();
    decode_state(&encode_state(member.replica().state())).unwrap()
}

/// A data directory whose replica holds `n` members' memberships, saved key by key.
fn prepare(data: &Path, n: u64) -> Result<(), String> {
    let now = wall_ms();
    let (store, loaded) = Store::open(data, AGENT_ID, now).map_err(|e| e.to_string())?;
    let mut replica = loaded.replica;
    // Every member's state joined into one, as `member_footprint` does (a join into the
    // replica per member costs time in proportion to what it holds: 60 s at 10,000).
    let mut all = State::new();
    for id in 1..=n {
        all.join(member_state(id, Now::at(now)));
    }
    // Tracked before the join: every key it adds is saved.
    replica.track_changes();
    replica.apply(all, now);
    let changed = replica.take_changed().unwrap();
    store
        .save_replica(&replica, &changed, false)
        .map_err(|e| e.to_string())
    // The store is dropped here: the file is closed before the agent opens it.
}

/// A port nobody listens on now.
fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// A running agent; dropping it kills it (by its pid) and waits for it.
struct Agent {
    child: Child,
    port: u16,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(roster: &Path, data: &Path, log: &Path) -> Result<Agent, String> {
    let out = File::create(log).map_err(|e| e.to_string())?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    let port = free_port();
    let mut cmd = Command::new(roster);
    // Flags only: no setting of the caller's environment reaches the agent.
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("ROSTER_") {
            cmd.env_remove(k);
        }
    }
    cmd.arg("agent")
        .arg("--data-dir")
        .arg(data)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--http-listen", "off", "--crash-guard", "off"])
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    let child = cmd
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", roster.display()))?;
    Ok(Agent { child, port })
}

/// Waits `secs` seconds, failing as soon as the agent exits.
fn settle(agent: &mut Agent, secs: u64) -> Result<(), String> {
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        if let Some(status) = agent.child.try_wait().map_err(|e| e.to_string())? {
            return Err(format!("the agent exited while settling: {status}"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

/// The members `roster members --json` lists, counted by state (`alive 10001, ...`).
fn listed(roster: &Path, port: u16) -> Result<String, String> {
    let out = Command::new(roster)
        .args(["members", "--json", "--agent", &format!("ws://127.0.0.1:{port}")])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "roster members failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let list: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    let mut by_state = std::collections::BTreeMap::<String, usize>::new();
    for m in &list {
        *by_state
            .entry(m["state"].as_str().unwrap_or("?").to_string())
            .or_default() += 1;
    }
    let states: Vec<String> = by_state.iter().map(|(s, k)| format!("{s} {k}")).collect();
    Ok(format!("{} ({})", list.len(), states.join(", ")))
}

/// One run's figures.
struct Measured {
    rss_kib: u64,
    hwm_kib: u64,
    listed: String,
}

/// Prepares, starts, settles and measures one agent that knows `n` members.
fn measure(args: &Args, n: u64, dir: &Path) -> Result<Measured, String> {
    let data = dir.join("data");
    let t = Instant::now();
    prepare(&data, n)?;
    eprintln!(
        "members={n}: data directory written in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let mut agent = start(&args.roster, &data, &dir.join("agent.log"))?;
    settle(&mut agent, args.settle)?;
    // Memory first: the members' listing costs the agent memory of its own.
    let (rss_kib, hwm_kib) = proc::memory_kib(agent.child.id()).map_err(|e| e.to_string())?;
    let listed = listed(&args.roster, agent.port)?;
    drop(agent);
    Ok(Measured {
        rss_kib,
        hwm_kib,
        listed,
    })
}

/// [`measure`] in a temporary directory, kept (and named) when the run fails.
fn run(args: &Args, n: u64) -> Measured {
    let dir = tempfile::tempdir().unwrap();
    match measure(args, n, dir.path()) {
        Ok(m) => m,
        Err(e) => {
            let kept = dir.keep();
            eprintln!(
                "members={n}: {e}\nagent log: {}",
                kept.join("agent.log").display()
            );
            std::process::exit(1);
        }
    }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn line(n: u64, m: &Measured) -> String {
    format!(
        "members={n} VmRSS={} KiB ({:.1} MiB) VmHWM={} KiB ({:.1} MiB)",
        m.rss_kib,
        mib(m.rss_kib),
        m.hwm_kib,
        mib(m.hwm_kib)
    )
}

/// Bytes a member: what `n` members add to the baseline's `kib`.
fn per_member(kib: u64, base_kib: u64, n: u64) -> f64 {
    (kib as f64 - base_kib as f64) * 1024.0 / n.max(1) as f64
}

fn main() {
    let args = parse_args();
    let base = run(&args, 0);
    println!(
        "baseline: {} | listed by `roster members`: {}",
        line(0, &base),
        base.listed
    );
    let m = run(&args, args.n);
    println!(
        "{} per member {:.0} B",
        line(args.n, &m),
        per_member(m.rss_kib, base.rss_kib, args.n)
    );
    println!(
        "  (per member: VmRSS above the baseline's, divided by members; VmHWM the same way: {:.0} B) | listed by `roster members`: {}",
        per_member(m.hwm_kib, base.hwm_kib, args.n),
        m.listed
    );
}
