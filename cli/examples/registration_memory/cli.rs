//! What the benchmark asks the agents through the `roster` CLI (the commands an operator
//! runs): who is a member, how many instances each holds, and `register --from-file` of a
//! file written here; the waits, polling those answers (and the watch's output), until the
//! agents have met, hold what was registered, and the watch has shown it.

use std::future::Future;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::agent::{roster_command, Agent};
use crate::Error;

/// How often a poll asks again.
const POLL: Duration = Duration::from_millis(500);

/// Runs `roster ARGS --agent URL` and returns its stdout; a failure names the command and
/// gives its error.
async fn roster(bin: &Path, url: &str, args: &[&str]) -> Result<Vec<u8>, Error> {
    let mut cmd = tokio::process::Command::from(roster_command(bin));
    // Dropped unfinished (an interrupt): killed by its pid, and reaped by tokio.
    cmd.args(args).args(["--agent", url]).kill_on_drop(true);
    let out = cmd.output().await?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let shown = args.join(" ");
        return Err(format!(
            "`roster {shown} --agent {url}` failed ({}): {}",
            out.status,
            err.trim()
        )
        .into());
    }
    Ok(out.stdout)
}

/// The names of the members the agent at `url` lists `alive` (`roster members --json`).
async fn alive(bin: &Path, url: &str) -> Result<Vec<String>, Error> {
    let out = roster(bin, url, &["members", "--json"]).await?;
    let list: Vec<serde_json::Value> = serde_json::from_slice(&out)?;
    let alive = list.iter().filter(|m| m["state"] == "alive");
    Ok(alive
        .filter_map(|m| m["name"].as_str().map(String::from))
        .collect())
}

/// The live instances the agent at `url` holds, over every service (`roster ls --json`).
async fn instances(bin: &Path, url: &str) -> Result<u64, Error> {
    let out = roster(bin, url, &["ls", "--json"]).await?;
    let list: Vec<serde_json::Value> = serde_json::from_slice(&out)?;
    list.iter()
        .map(|s| {
            s["instances"]
                .as_u64()
                .ok_or("`roster ls --json`: a service without a count")
        })
        .try_fold(0, |sum, k| Ok(sum + k?))
}

/// The service of registration `i` of a file with `services` services.
pub fn service(i: usize, services: usize) -> String {
    format!("svc-{}", i % services)
}

/// Writes `n` registrations in `services` services, one JSON line each as
/// `roster register --from-file` reads them: instance `i<i>` of `svc-<i % services>` at
/// `10.x.y.z:port`, with `version=1.2.3`.
pub fn write_registrations(path: &Path, n: usize, services: usize) -> Result<(), Error> {
    let mut out = BufWriter::new(std::fs::File::create(path)?);
    for i in 0..n {
        let (x, y, z) = ((i >> 16) & 255, (i >> 8) & 255, i & 255);
        let address = format!("10.{x}.{y}.{z}:{}", 8000 + i % 1000);
        let svc = service(i, services);
        writeln!(
            out,
            r#"{{"service": "{svc}", "address": "{address}", "id": "i{i}", "meta": {{"version": "1.2.3"}}}}"#
        )?;
    }
    out.flush()?;
    Ok(())
}

/// Runs `roster register --from-file FILE` against `url`: its wall time (process start to
/// exit) and the instance ids it printed, one a line.
pub async fn register_file(bin: &Path, url: &str, file: &Path) -> Result<(Duration, usize), Error> {
    let file = file.to_str().ok_or("a temporary path that is not UTF-8")?;
    let started = Instant::now();
    let out = roster(bin, url, &["register", "--from-file", file]).await?;
    let took = started.elapsed();
    Ok((took, out.split(|&b| b == b'\n').filter(|l| !l.is_empty()).count()))
}

/// Asks `check` every 500 ms until it answers `None`, or fails with its last answer (what
/// is still missing) after `limit`.
async fn poll<F, Fut>(limit: Duration, mut check: F) -> Result<(), Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<String>, Error>>,
{
    let deadline = Instant::now() + limit;
    loop {
        let Some(missing) = check().await? else {
            return Ok(());
        };
        if Instant::now() > deadline {
            return Err(format!("after {limit:?}: {missing}").into());
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Waits until every agent lists every agent `alive`.
pub async fn met(bin: &Path, agents: &[&Agent]) -> Result<(), Error> {
    for agent in agents {
        poll(crate::LIMIT, || async {
            let alive = alive(bin, &agent.url).await?;
            let missing: Vec<&str> = agents
                .iter()
                .map(|a| a.name)
                .filter(|n| !alive.iter().any(|m| m == n))
                .collect();
            Ok(
                (!missing.is_empty())
                    .then(|| format!("agent {} does not list {missing:?} alive", agent.name)),
            )
        })
        .await?;
    }
    Ok(())
}

/// Waits until every agent holds `n` live instances.
pub async fn hold(bin: &Path, agents: &[&Agent], n: usize) -> Result<(), Error> {
    for agent in agents {
        poll(crate::LIMIT, || async {
            let held = instances(bin, &agent.url).await?;
            Ok((held != n as u64).then(|| format!("agent {} holds {held} of {n} instances", agent.name)))
        })
        .await?;
    }
    Ok(())
}

/// The `up` and `down` lines the watch printed so far.
pub fn watch_lines(out: &Path) -> Result<(usize, usize), Error> {
    let text = std::fs::read_to_string(out)?;
    let count = |event: &str| {
        text.lines()
            .filter(|l| l.split_whitespace().next() == Some(event))
            .count()
    };
    Ok((count("up"), count("down")))
}

/// Waits until the watch of `service` in `out` has printed `size` `up` lines.
pub async fn watched(out: &Path, service: &str, size: usize) -> Result<(), Error> {
    poll(crate::LIMIT, || async {
        let (up, _) = watch_lines(out)?;
        Ok((up < size).then(|| format!("the watch of {service} printed {up} of {size} up lines")))
    })
    .await
}
