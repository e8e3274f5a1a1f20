//! What registrations cost in memory: the resident memory of real agents holding `N`
//! registrations, at a peer, at their owner and at the owner after a restart, with one
//! more peer serving a watch; and the wall time of `roster register --from-file` of `N`.
//!
//! ```sh
//! cargo build --release -p roster-cli     # the agents run target/release/roster
//! cargo run --release -p roster-cli --example registration_memory -- --n 10000,100000
//! ```
//!
//! or, building only what it runs (faster):
//!
//! ```sh
//! CARGO_PROFILE_RELEASE_LTO=off CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 cargo build --release -p roster-cli --bin roster --example registration_memory
//! target/release/examples/registration_memory --n 10000,100000
//! ```
//!
//! For each `N` of `--n` (default `10000,100000`; at most 100,000, the most a file may
//! hold), in a fresh temporary directory (removed at the end; kept, and named, when the run
//! fails):
//!
//! 1. Agents `a` (the owner), `b` and `w` (peers, `--join` a's URL) start on loopback
//!    ports picked free (`--http-listen off --crash-guard off`, each its own data
//!    directory, its output in `<name>.log`). Once each lists all three `alive`
//!    (`roster members --json`) and all are settled, each one's `VmRSS` is read from
//!    `/proc/<pid>/status`: the baseline. Settled: each agent used at most 5% of a core
//!    over one second (its CPU time in `/proc/<pid>/stat`), and `--settle` seconds
//!    (default 5) have passed since.
//! 2. `roster watch svc-0` starts against `w` (its output in `watch.out`).
//! 3. A file of `N` registrations is written: instance `i<i>` of service `svc-<i % S>`
//!    (`--services S`, default 100, so `svc-0` holds `N/S`; `--services 10` watches a
//!    service of 10,000 at `N` = 100,000), address `10.x.y.z:port`, metadata
//!    `version=1.2.3`, one JSON line each; `roster register --from-file` of it against `a`
//!    is timed (wall time, process start to exit).
//! 4. Once `a`, `b` and `w` each hold `N` instances (`roster ls --json`, asked every
//!    500 ms) and the watch has printed an `up` line for each instance of `svc-0`, and all
//!    are settled, `VmRSS` and `VmHWM` of each are read.
//! 5. `a` is killed by its pid (SIGKILL) and started again with the same flags on its data
//!    directory; once it holds `N` instances again, the three are quiet (5% of a core), list
//!    each other `alive` and hold `N`, and are settled, its `VmRSS` and `VmHWM` are read.
//!
//! Every wait gives up after 120 s with an error that says what was missing.
//!
//! Printed, one line per agent and `N`: `VmRSS`, `VmHWM` and the baseline `VmRSS` in MiB,
//! and bytes per registration, `(VmRSS - baseline) / N`. `b` and `w` hold the same
//! registrations, so `w` against `b` is what one watch costs (the lines the watch printed
//! are counted too: a restart the peers noticed would show as `down` lines). Then the
//! `--from-file` wall time; and for the restart, the time from the kill until `a` held `N`
//! (found by polling, so up to 500 ms late) and until the three were quiet (up to a
//! second late), with the CPU seconds each agent used from the kill until then.
//!
//! Measured values only: nothing is asserted about them. Every process started (agents,
//! the watch, the CLI commands) is killed by its pid and reaped when the run ends, fails
//! or is interrupted.

mod agent;
mod cli;
#[path = "../common/proc.rs"]
mod proc;

use std::path::Path;
use std::time::{Duration, Instant};

use agent::{cpu_seconds, quiet, Agent};
use cli::{hold, met, register_file, service, watch_lines, watched, write_registrations};
use proc::{memory_kib, roster_binary};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The most registrations a `--from-file` file may hold.
const MAX_N: usize = 100_000;
/// The longest wait for the agents to meet, to converge, to restart, to go quiet.
pub const LIMIT: Duration = Duration::from_secs(120);
/// The service the watch follows.
const WATCHED: &str = "svc-0";

const USAGE: &str = "usage: registration_memory [--n 10000,100000] [--settle 5] [--services 100]";

/// The command line.
#[derive(Debug)]
struct Args {
    n: Vec<usize>,
    settle: Duration,
    services: usize,
}

fn parse_args() -> Result<Args, Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut out = Args {
        n: vec![10_000, 100_000],
        settle: Duration::from_secs(5),
        services: 100,
    };
    let number = |v: &str| v.trim().replace('_', "").parse::<usize>().map_err(|_| USAGE);
    for pair in args.chunks(2) {
        let [flag, value] = pair else {
            return Err(USAGE.into());
        };
        match flag.as_str() {
            "--n" => out.n = value.split(',').map(number).collect::<Result<_, _>>()?,
            "--settle" => out.settle = Duration::from_secs(number(value)? as u64),
            "--services" => out.services = number(value)?,
            _ => return Err(USAGE.into()),
        }
    }
    if out.n.iter().any(|&n| n == 0 || n > MAX_N) || out.services == 0 {
        return Err(format!("{USAGE} (each N from 1 to {MAX_N}, --services at least 1)").into());
    }
    Ok(out)
}

/// A process's memory at a moment, in KiB.
#[derive(Debug, Clone, Copy)]
struct Memory {
    rss: u64,
    hwm: u64,
}

fn memory(agent: &Agent) -> Result<Memory, Error> {
    let (rss, hwm) = memory_kib(agent.pid())?;
    Ok(Memory { rss, hwm })
}

/// One line of the table: an agent's memory against its baseline `VmRSS` (KiB).
#[derive(Debug)]
struct Row {
    which: &'static str,
    now: Memory,
    base: u64,
}

/// What `a`'s restart took: until it held `N` again, until it was quiet, and the CPU
/// seconds `a`, `b` and `w` used from the kill until then.
#[derive(Debug)]
struct Restart {
    held: Duration,
    quiet: Duration,
    cpu: [f64; 3],
}

/// What one `N` measured.
#[derive(Debug)]
struct Measured {
    rows: Vec<Row>,
    /// The wall time of `register --from-file`, and the ids it printed.
    register: (Duration, usize),
    restart: Restart,
    /// The watched service's size, and the `up` and `down` lines the watch printed.
    watch: (usize, usize, usize),
}

/// Waits until the agents are quiet, then `settle` more.
async fn settled(agents: &[&Agent], settle: Duration) -> Result<(), Error> {
    quiet(agents, LIMIT).await?;
    tokio::time::sleep(settle).await;
    Ok(())
}

/// The three agents, started, met and settled, with their baseline `VmRSS`.
async fn cluster(bin: &Path, dir: &Path, settle: Duration) -> Result<(Agent, Agent, Agent, [u64; 3]), Error> {
    let a = Agent::start(bin, dir, "a", None)?;
    let b = Agent::start(bin, dir, "b", Some(&a.url))?;
    let w = Agent::start(bin, dir, "w", Some(&a.url))?;
    met(bin, &[&a, &b, &w]).await?;
    settled(&[&a, &b, &w], settle).await?;
    let base = [memory(&a)?.rss, memory(&b)?.rss, memory(&w)?.rss];
    Ok((a, b, w, base))
}

/// Kills `a` (SIGKILL) and starts it again; waits until it holds `n`, is quiet, and the
/// three have met again and hold `n`, and `settle` more.
async fn restart(
    bin: &Path,
    a: Agent,
    b: &Agent,
    w: &Agent,
    n: usize,
    settle: Duration,
) -> Result<(Agent, Restart), Error> {
    let peers_cpu = [cpu_seconds(b.pid())?, cpu_seconds(w.pid())?];
    let started = Instant::now();
    let a = a.kill_and_restart(bin)?;
    hold(bin, &[&a], n).await?;
    let held = started.elapsed();
    let quiet = quiet(&[&a, b, w], LIMIT).await? - started;
    let cpu = [
        cpu_seconds(a.pid())?,
        cpu_seconds(b.pid())? - peers_cpu[0],
        cpu_seconds(w.pid())? - peers_cpu[1],
    ];
    met(bin, &[&a, b, w]).await?;
    hold(bin, &[&a, b, w], n).await?;
    settled(&[&a, b, w], settle).await?;
    Ok((a, Restart { held, quiet, cpu }))
}

/// Steps 1 to 5 for `n` in `dir`: start, register, converge, measure, restart `a`, measure.
async fn measure(bin: &Path, n: usize, args: &Args, dir: &Path) -> Result<Measured, Error> {
    let (a, b, w, base) = cluster(bin, dir, args.settle).await?;
    let out = dir.join("watch.out");
    let _watch = agent::watch(bin, &w, WATCHED, &out)?;
    let size = (0..n).filter(|&i| service(i, args.services) == WATCHED).count();
    let file = dir.join("registrations.jsonl");
    write_registrations(&file, n, args.services)?;
    let register = register_file(bin, &a.url, &file).await?;
    hold(bin, &[&a, &b, &w], n).await?;
    watched(&out, WATCHED, size).await?;
    settled(&[&a, &b, &w], args.settle).await?;
    let [ma, mb, mw] = [memory(&a)?, memory(&b)?, memory(&w)?];
    let (a, restart) = restart(bin, a, &b, &w, n, args.settle).await?;
    let mr = memory(&a)?;
    let (up, down) = watch_lines(&out)?;
    let row = |which, now, base| Row { which, now, base };
    let rows = vec![
        row("b  peer", mb, base[1]),
        row("a  owner", ma, base[0]),
        row("a  owner, after a restart", mr, base[0]),
        row("w  peer serving 1 watch", mw, base[2]),
    ];
    Ok(Measured {
        rows,
        register,
        restart,
        watch: (size, up, down),
    })
}

/// [`measure`] in a fresh temporary directory, removed at the end (kept when it fails).
async fn one(bin: &Path, n: usize, args: &Args) -> Result<Measured, Error> {
    let dir = tempfile::Builder::new()
        .prefix(&format!("registration_memory-{n}-"))
        .tempdir_in(std::env::temp_dir())?;
    match measure(bin, n, args, dir.path()).await {
        Ok(m) => Ok(m),
        Err(e) => {
            let kept = dir.keep();
            Err(format!("N={n}: {e} (the agents' logs are kept in {})", kept.display()).into())
        }
    }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// The lines of one `N`.
fn print(n: usize, m: &Measured) {
    for r in &m.rows {
        let per = (r.now.rss as f64 - r.base as f64) * 1024.0 / n as f64;
        println!(
            "{n:>7}  {:<27}  {:>9.1}  {:>9.1}  {:>12.1}  {per:>14.0}",
            r.which,
            mib(r.now.rss),
            mib(r.now.hwm),
            mib(r.base)
        );
    }
    let (took, ids) = m.register;
    println!(
        "{n:>7}  register --from-file: {:.2} s wall ({ids} ids printed)",
        took.as_secs_f64()
    );
    let Restart { held, quiet, cpu } = &m.restart;
    println!(
        "{n:>7}  a restarted: held {n} after {:.1} s; quiet after {:.1} s; CPU s since the kill a {:.1}, b {:.1}, w {:.1}",
        held.as_secs_f64(),
        quiet.as_secs_f64(),
        cpu[0],
        cpu[1],
        cpu[2]
    );
    let (size, up, down) = m.watch;
    let extra = (m.rows[3].now.rss as f64 - m.rows[0].now.rss as f64) / 1024.0;
    println!(
        "{n:>7}  watch of {WATCHED} ({size} instances) on w: {up} up, {down} down lines | VmRSS w - b: {extra:+.1} MiB"
    );
}

async fn run() -> Result<(), Error> {
    let args = parse_args()?;
    let bin = roster_binary()?;
    println!(
        "{:>7}  {:<27}  {:>9}  {:>9}  {:>12}  {:>14}",
        "N", "agent", "VmRSS MiB", "VmHWM MiB", "baseline MiB", "B/registration"
    );
    for &n in &args.n {
        let m = one(&bin, n, &args).await?;
        print(n, &m);
    }
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    // Interrupted or terminated: the run is dropped, and with it every process (killed, reaped).
    let result = tokio::select! {
        r = run() => r,
        r = proc::stopped() => r.map_err(Error::from).and(Err("interrupted".into())),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("registration_memory: error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
