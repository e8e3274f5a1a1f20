//! What churn costs: three real agents on loopback, `N` registrations held, `K` changes a
//! second through one of them, and what each change costs in CPU, bytes and time until
//! every node shows it.
//!
//! ```sh
//! cargo build --release -p roster-cli     # the agents run target/release/roster
//! cargo run --release -p roster-cli --example churn_cost -- --n 1000,10000 --rate 100 --secs 20
//! cargo run --release -p roster-cli --example churn_cost -- max-rate --n 1000 --secs 10 --batch 100
//! ```
//!
//! For each `N` of `--n` (default `1000,10000`), a fresh cluster: agents `a`, `b` and `c`
//! (`b` and `c` join through `a`, default settings, temporary data directories), each
//! killed by its pid when the run ends or fails. Instances `c0`..`c<N-1>` of service
//! `churn` are registered through `a` in batches; once every agent holds them, a watch
//! opens on every agent, the agents idle for `--idle` seconds (default 5: the background
//! cost), then `--rate` changes a second (default 100) go to `a` for `--secs` seconds
//! (default 20) on one client connection, one `Register` each, request after request at
//! its due time (or at once if the previous answer came late): change `s` sets metadata
//! `seq=s` on instance `c<s mod N>`. Printed, one line per `N`:
//!
//! - `acked`: changes the agent acknowledged, and the rate achieved;
//! - `cpu ms/change`: CPU time (user + system, `/proc/<pid>/stat`) over the run divided by
//!   the changes, for `a` (the writer) and the mean of `b` and `c`;
//! - `bytes/change`: WebSocket bytes all three agents sent to their peers over the run
//!   (their `bytes_sent` counter, `roster status`), divided by the changes, and `a`'s part;
//! - `lag ms`: from when the request was written to when the last of the three watches
//!   showed the change, median, p99 and max; `unseen`: changes a watch did not show
//!   within 5 s of the last request (a watch that falls behind reports an instance's
//!   latest value only, so a change overwritten before a watch showed it counts here: at
//!   high rates and small `N`); `p50 ack`: the request's round trip; `a`: the lag until
//!   the writer's own watch showed the change;
//! - `syscalls/change`: system calls over the run (`perf stat -e raw_syscalls:sys_enter`
//!   attached to each agent; when perf cannot run, `rw syscalls/change`: the `read`- and
//!   `write`-like calls of `/proc/<pid>/io`, a lower bound), for `a` and the mean of `b`
//!   and `c`;
//! - `ctx switches/change`: context switches over the run, summed over each agent's
//!   threads (`/proc/<pid>/task/*/status`), voluntary + involuntary, for `a` and `b,c`;
//! - `rss MiB`: each agent's resident memory (`VmRSS`) after the run;
//! - `idle`: the same CPU and bytes per second over the idle window, to read the figures
//!   per change against (they include the background: gossip, pings, saves).
//!
//! `max-rate` runs one cluster at the first `N` and steps the rate up (`--rates`, default
//! `50,100,200,500,1000,2000,5000,10000,20000,50000`), `--secs` each (default 10), first one
//! `Register` per change, then `RegisterMany` batches of `--batch` (default 100). A step is
//! sustained when the rate achieved is at least 95% of the rate asked, no request failed
//! and every change was seen on every node; stepping stops at the first step not
//! sustained. Printed after each mode: the highest sustained rate whose p99 lag was at most
//! 50 ms, the highest whose every lag (the max) was, and the highest sustained at any lag.
//!
//! `--others K` (default 0) opens `K` more watches on every agent, each of a service nobody
//! writes: what watches of other services cost a node per change.
//!
//! `--window W` (default 1) lets up to `W` requests await their answers on the connection
//! (the agent answers them in order, and commits registrations that wait together in one
//! transaction); with 1, each request waits for the previous answer.
//!
//! The benchmark process (the driver and three watches) shares the machine with the agents:
//! on a small machine its CPU is part of what the lags include.

mod cluster;
mod counters;
mod drive;
mod item;
#[path = "../common/proc.rs"]
mod proc;

use std::path::Path;
use std::time::{Duration, Instant};

use cluster::{bytes_sent, rss_mib, Cluster};
use counters::{context_switches, rw_syscalls, SyscallCount};
use drive::{drive, lags, preload, quantile, settle, watch_all, watch_others, Load, Sent, Sightings};
use proc::{cpu_seconds, roster_binary, ticks_per_second};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The lag bar of `max-rate` (ms).
const LAG_MS: f64 = 50.0;

const USAGE: &str = "usage: churn_cost [max-rate] [--n 1000,10000] [--rate 100] [--secs 20] [--idle 5] [--batch 100] [--window 1] [--rates 50,100,200,...] [--others 0]";

/// The command line.
struct Args {
    max_rate: bool,
    n: Vec<usize>,
    rate: f64,
    secs: f64,
    idle: f64,
    batch: usize,
    window: usize,
    rates: Vec<f64>,
    others: usize,
}

fn list<T: std::str::FromStr>(s: &str) -> Result<Vec<T>, Error> {
    s.split(',')
        .map(|x| {
            x.trim()
                .replace('_', "")
                .parse()
                .map_err(|_| format!("not a number: {x}").into())
        })
        .collect()
}

fn parse_args() -> Result<Args, Error> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let max_rate = args.first().is_some_and(|a| a == "max-rate");
    if max_rate {
        args.remove(0);
    }
    let mut out = Args {
        max_rate,
        n: vec![1_000, 10_000],
        rate: 100.0,
        secs: if max_rate { 10.0 } else { 20.0 },
        idle: 5.0,
        batch: 100,
        window: 1,
        rates: list("50,100,200,500,1000,2000,5000,10000,20000,50000")?,
        others: 0,
    };
    for pair in args.chunks(2) {
        let [flag, value] = pair else {
            return Err(USAGE.into());
        };
        let one = |v: &str| -> Result<f64, Error> { Ok(v.parse::<f64>().map_err(|_| USAGE)?) };
        match flag.as_str() {
            "--n" => out.n = list(value)?,
            "--rate" => out.rate = one(value)?,
            "--secs" => out.secs = one(value)?,
            "--idle" => out.idle = one(value)?,
            "--batch" => out.batch = list(value)?.first().copied().ok_or(USAGE)?,
            "--window" => out.window = list(value)?.first().copied().ok_or(USAGE)?,
            "--rates" => out.rates = list(value)?,
            "--others" => out.others = list(value)?.first().copied().ok_or(USAGE)?,
            _ => return Err(USAGE.into()),
        }
    }
    if out.n.contains(&0)
        || out.batch == 0
        || out.window == 0
        || out.rate <= 0.0
        || out.rates.iter().any(|&r| r <= 0.0)
    {
        return Err(USAGE.into());
    }
    Ok(out)
}

/// CPU seconds, peer bytes sent, context switches (voluntary, involuntary) and
/// `read`/`write`-like system calls of each agent, at a moment.
struct Usage {
    cpu: Vec<f64>,
    bytes: Vec<u64>,
    switches: Vec<(u64, u64)>,
    rw_calls: Vec<u64>,
    at: Instant,
}

async fn usage(cluster: &Cluster, ticks: f64) -> Result<Usage, Error> {
    let mut u = Usage {
        cpu: Vec::new(),
        bytes: Vec::new(),
        switches: Vec::new(),
        rw_calls: Vec::new(),
        at: Instant::now(),
    };
    for agent in &cluster.agents {
        u.cpu.push(cpu_seconds(agent.pid(), ticks)?);
        u.bytes.push(bytes_sent(agent).await?);
        u.switches.push(context_switches(agent.pid())?);
        u.rw_calls.push(rw_syscalls(agent.pid())?);
    }
    Ok(u)
}

/// What each agent used between two moments: CPU seconds, bytes, context switches
/// (voluntary, involuntary), system calls (perf's count, else the `read`/`write`-like ones)
/// and the seconds between.
struct Used {
    cpu: Vec<f64>,
    bytes: Vec<f64>,
    switches: Vec<(f64, f64)>,
    syscalls: Vec<f64>,
    /// Whether `syscalls` counts every call (perf) or only `read`/`write`-like ones.
    all_syscalls: bool,
    secs: f64,
}

fn minus(a: &[u64], b: &[u64]) -> Vec<f64> {
    a.iter()
        .zip(b)
        .map(|(x, y)| y.saturating_sub(*x) as f64)
        .collect()
}

impl Used {
    fn between(a: &Usage, b: &Usage) -> Used {
        let (vol_a, invol_a): (Vec<u64>, Vec<u64>) = a.switches.iter().copied().unzip();
        let (vol_b, invol_b): (Vec<u64>, Vec<u64>) = b.switches.iter().copied().unzip();
        Used {
            cpu: a.cpu.iter().zip(&b.cpu).map(|(x, y)| y - x).collect(),
            bytes: minus(&a.bytes, &b.bytes),
            switches: minus(&vol_a, &vol_b)
                .into_iter()
                .zip(minus(&invol_a, &invol_b))
                .collect(),
            syscalls: minus(&a.rw_calls, &b.rw_calls),
            all_syscalls: false,
            secs: b.at.duration_since(a.at).as_secs_f64(),
        }
    }

    /// The same, with every system call perf counted (one count per agent), when it did.
    fn with_syscalls(mut self, counted: Option<Vec<u64>>) -> Used {
        if let Some(c) = counted.filter(|c| c.len() == self.syscalls.len()) {
            self.syscalls = c.into_iter().map(|x| x as f64).collect();
            self.all_syscalls = true;
        }
        self
    }

    /// The writer's figure and the mean of the others, per `per`.
    fn split(values: &[f64], per: f64) -> (f64, f64) {
        let others = values[1..].iter().sum::<f64>() / (values.len() - 1) as f64;
        (values[0] / per, others / per)
    }

    /// System calls and context switches per `per`, in words.
    fn calls(&self, per: f64) -> String {
        let (sw, so) = Self::split(&self.syscalls, per);
        let all: Vec<f64> = self.switches.iter().map(|(v, i)| v + i).collect();
        let vol: Vec<f64> = self.switches.iter().map(|(v, _)| *v).collect();
        let (cw, co) = Self::split(&all, per);
        let (vw, vo) = Self::split(&vol, per);
        let name = if self.all_syscalls {
            "syscalls"
        } else {
            "rw syscalls"
        };
        format!("{name}/change a={sw:.1} b,c={so:.1} | ctx switches/change a={cw:.2} b,c={co:.2} (voluntary a={vw:.2} b,c={vo:.2})")
    }

    /// CPU ms of the writer and the mean of the others, per `unit`.
    fn cpu_ms(&self, per: f64) -> (f64, f64) {
        let others = self.cpu[1..].iter().sum::<f64>() / (self.cpu.len() - 1) as f64;
        (self.cpu[0] * 1e3 / per, others * 1e3 / per)
    }

    /// Bytes of all agents, and of the writer, per `unit`.
    fn bytes(&self, per: f64) -> (f64, f64) {
        (self.bytes.iter().sum::<f64>() / per, self.bytes[0] / per)
    }
}

/// `perf stat` attached to every agent, when it can be (else `None`).
async fn perf_start(cluster: &Cluster) -> Option<Vec<SyscallCount>> {
    let counts: Option<Vec<_>> = cluster
        .agents
        .iter()
        .map(|a| SyscallCount::start(a.pid()))
        .collect();
    // perf reads the process's threads when it attaches: let it do so before the run.
    tokio::time::sleep(Duration::from_millis(300)).await;
    counts
}

fn perf_stop(counts: Option<Vec<SyscallCount>>) -> Option<Vec<u64>> {
    counts?.into_iter().map(SyscallCount::stop).collect()
}

/// One run's figures, in one line.
fn line(n: usize, load: Load, sent: &Sent, seen: &Sightings, run: &Used) -> (String, f64, f64, bool) {
    let acked = sent.changes.len() as f64;
    let per = acked.max(1.0);
    let lags = lags(seen, sent);
    let unseen = lags.unseen;
    let (p50, p99, max) = (
        quantile(&lags.last, 0.5),
        quantile(&lags.last, 0.99),
        quantile(&lags.last, 1.0),
    );
    let mut acks = sent.acks.clone();
    acks.sort_by(f64::total_cmp);
    let (ack50, a50) = (quantile(&acks, 0.5), quantile(&lags.writer, 0.5));
    // On pace, the last request goes one interval before the end: count the whole window.
    let achieved = acked / sent.took.as_secs_f64().max(load.secs);
    let (cpu_w, cpu_o) = run.cpu_ms(per);
    let (bytes, bytes_w) = run.bytes(per);
    let text = format!(
        "N={n} K={}/s batch={} window={} acked={acked} ({achieved:.1}/s) errors={} | cpu ms/change a={cpu_w:.3} b,c={cpu_o:.3} | {} | bytes/change {bytes:.0} (a {bytes_w:.0}) | lag ms p50={p50:.2} p99={p99:.2} max={max:.2} unseen={unseen} (p50 ack {ack50:.2}, a {a50:.2})",
        load.rate, load.batch, load.window, sent.errors, run.calls(per)
    );
    let sustained = achieved >= 0.95 * load.rate && sent.errors == 0 && unseen == 0 && acked > 0.0;
    (text, p99, max, sustained)
}

/// A fresh cluster holding `n` instances, watched on every agent.
async fn loaded(bin: &Path, n: usize) -> Result<(Cluster, Sightings), Error> {
    let cluster = Cluster::start(bin)?;
    let t = Instant::now();
    preload(&cluster, n).await?;
    let seen = watch_all(&cluster, n).await?;
    eprintln!(
        "N={n}: preloaded and watched in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    Ok((cluster, seen))
}

/// One line for `n`: idle, then `load`.
async fn churn(bin: &Path, n: usize, load: Load, args: &Args, ticks: f64) -> Result<(), Error> {
    let idle = args.idle;
    let (cluster, seen) = loaded(bin, n).await?;
    watch_others(&cluster, args.others).await?;
    let before = usage(&cluster, ticks).await?;
    tokio::time::sleep(Duration::from_secs_f64(idle)).await;
    let perf = perf_start(&cluster).await;
    let start = usage(&cluster, ticks).await?;
    let sent = drive(&cluster, n, 1, load).await?;
    settle(&seen, &sent).await;
    let end = usage(&cluster, ticks).await?;
    let run = Used::between(&start, &end).with_syscalls(perf_stop(perf));
    let idle = Used::between(&before, &start);
    let (text, ..) = line(n, load, &sent, &seen, &run);
    let mut rss = Vec::new();
    for agent in &cluster.agents {
        rss.push(format!("{:.1}", rss_mib(agent.pid())?));
    }
    let (idle_w, idle_o) = idle.cpu_ms(idle.secs);
    let idle_bytes = idle.bytes(idle.secs).0;
    println!(
        "{text} | rss MiB a,b,c={} | idle: cpu ms/s a={idle_w:.2} b,c={idle_o:.2}, bytes/s {idle_bytes:.0}",
        rss.join(",")
    );
    Ok(())
}

/// Steps the rate up, one `Register` per change and then in batches; prints each step and
/// the highest rates sustained.
async fn max_rate(bin: &Path, args: &Args, ticks: f64) -> Result<(), Error> {
    let n = args.n[0];
    let (cluster, seen) = loaded(bin, n).await?;
    let mut first = 1;
    for batch in [1, args.batch] {
        // The highest rates sustained: at all, with p99 lag within 50 ms, with every lag.
        let mut best = [None; 3];
        for &rate in &args.rates {
            let load = Load {
                rate,
                secs: args.secs,
                batch,
                window: args.window,
            };
            let perf = perf_start(&cluster).await;
            let start = usage(&cluster, ticks).await?;
            let sent = drive(&cluster, n, first, load).await?;
            first = sent.changes.iter().map(|c| c.0).max().unwrap_or(first) + batch as u64 + 1;
            settle(&seen, &sent).await;
            let end = usage(&cluster, ticks).await?;
            let run = Used::between(&start, &end).with_syscalls(perf_stop(perf));
            let (text, p99, max, sustained) = line(n, load, &sent, &seen, &run);
            println!("{text}");
            if !sustained {
                break;
            }
            for (b, ok) in best.iter_mut().zip([true, p99 <= LAG_MS, max <= LAG_MS]) {
                *b = if ok { Some(rate) } else { *b };
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let show = |r: Option<f64>| r.map_or("none".into(), |r| format!("{r}/s"));
        println!(
            "max rate, batch={batch}: {} with p99 lag <= {LAG_MS} ms; {} with every lag <= {LAG_MS} ms; {} sustained at any lag",
            show(best[1]),
            show(best[2]),
            show(best[0]),
        );
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    // Interrupted or terminated: the run is dropped, and with it the agents (killed, reaped).
    let result = tokio::select! {
        r = run() => r,
        r = proc::stopped() => r.map_err(Error::from).and(Err("interrupted".into())),
    };
    if let Err(e) = result {
        eprintln!("churn_cost: {e}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), Error> {
    let args = parse_args()?;
    let bin = roster_binary()?;
    let ticks = ticks_per_second();
    if args.max_rate {
        return max_rate(&bin, &args, ticks).await;
    }
    for &n in &args.n {
        let load = Load {
            rate: args.rate,
            secs: args.secs,
            batch: 1,
            window: args.window,
        };
        churn(&bin, n, load, &args, ticks).await?;
    }
    Ok(())
}
