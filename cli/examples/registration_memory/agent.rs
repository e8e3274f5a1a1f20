//! The processes the benchmark starts: `roster agent`s on loopback and one `roster watch`,
//! each killed by its pid (SIGKILL) and reaped when dropped, on error paths too; and what
//! `/proc` says of an agent: its memory, its CPU time, whether it is busy.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{proc, Error};

/// `roster` with no `ROSTER_*` variable of the caller's environment: flags only.
pub fn roster_command(bin: &Path) -> Command {
    let mut cmd = Command::new(bin);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("ROSTER_") {
            cmd.env_remove(k);
        }
    }
    cmd.stdin(Stdio::null());
    cmd
}

/// A child process. Dropping it kills it by its pid (SIGKILL) and waits for it.
#[derive(Debug)]
pub struct Process(Child);

impl Process {
    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A port nobody listens on now: fixed for an agent's life, so a restart keeps its URL.
fn free_port() -> Result<u16, Error> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// One `roster agent`, with what it was started with, to start it again alike.
#[derive(Debug)]
pub struct Agent {
    process: Process,
    /// Its node name (`a`, `b`, `w`).
    pub name: &'static str,
    /// Its client and peer URL (`ws://127.0.0.1:<port>`).
    pub url: String,
    port: u16,
    join: Option<String>,
    dir: PathBuf,
}

impl Agent {
    /// Starts agent `name` with its data in `dir/name`, its output in `dir/name.log`.
    pub fn start(bin: &Path, dir: &Path, name: &'static str, join: Option<&str>) -> Result<Agent, Error> {
        let port = free_port()?;
        Agent::launch(bin, dir, name, port, join.map(str::to_string))
    }

    /// Kills the agent (SIGKILL, by its pid: no goodbye, no save), reaps it, and starts it
    /// again with the same flags on the same data directory.
    pub fn kill_and_restart(self, bin: &Path) -> Result<Agent, Error> {
        let Agent {
            process,
            name,
            port,
            join,
            dir,
            ..
        } = self;
        drop(process);
        Agent::launch(bin, &dir, name, port, join)
    }

    fn launch(
        bin: &Path,
        dir: &Path,
        name: &'static str,
        port: u16,
        join: Option<String>,
    ) -> Result<Agent, Error> {
        let mut log = File::options()
            .create(true)
            .append(true)
            .open(dir.join(format!("{name}.log")))?;
        let mut cmd = roster_command(bin);
        cmd.args([
            "agent",
            "--node-name",
            name,
            "--listen",
            &format!("127.0.0.1:{port}"),
        ])
        .args(["--http-listen", "off", "--crash-guard", "off", "--data-dir"])
        .arg(dir.join(name));
        if let Some(url) = &join {
            cmd.args(["--join", url]);
        }
        let mut child = cmd.stdout(Stdio::piped()).stderr(log.try_clone()?).spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        // The guard exists before the first line is read: an error below still kills it.
        let process = Process(child);
        let url = listening_on(stdout, &mut log).map_err(|e| format!("agent {name}: {e}"))?;
        let dir = dir.to_path_buf();
        Ok(Agent {
            process,
            name,
            url,
            port,
            join,
            dir,
        })
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }
}

/// Copies the agent's stdout to its log until `listening on URL`, then the rest in a thread.
fn listening_on(stdout: std::process::ChildStdout, log: &mut File) -> Result<String, Error> {
    let mut lines = BufReader::new(stdout).lines();
    for line in lines.by_ref() {
        let line = line?;
        writeln!(log, "{line}")?;
        if let Some(url) = line.strip_prefix("listening on ") {
            let url = url.to_string();
            let mut log = log.try_clone()?;
            std::thread::spawn(move || lines.map_while(Result::ok).try_for_each(|l| writeln!(log, "{l}")));
            return Ok(url);
        }
    }
    Err("exited before it said where it listens (see its log)".into())
}

/// `roster watch SERVICE` against `agent`, its output (one line an event) in `out`.
pub fn watch(bin: &Path, agent: &Agent, service: &str, out: &Path) -> Result<Process, Error> {
    let file = File::create(out)?;
    let child = roster_command(bin)
        .args(["watch", service, "--agent", &agent.url])
        .stdout(file.try_clone()?)
        .stderr(file)
        .spawn()?;
    Ok(Process(child))
}

/// CPU seconds (user and system) the process used since it started (`/proc/<pid>/stat`).
pub fn cpu_seconds(pid: u32) -> Result<f64, Error> {
    proc::cpu_seconds(pid, proc::ticks_per_second())
}

/// Most CPU an agent may use over a second and count as quiet: 5% of a core.
const QUIET_CPU: f64 = 0.05;

/// Waits until every agent used at most 5% of a core over one second, for at most `limit`:
/// whatever the last change set off (replication, a restarted agent's exchange with its
/// peers) is over. Returns when the quiet second ended.
pub async fn quiet(agents: &[&Agent], limit: Duration) -> Result<Instant, Error> {
    let deadline = Instant::now() + limit;
    let cpu = || -> Result<Vec<f64>, Error> { agents.iter().map(|a| cpu_seconds(a.pid())).collect() };
    let mut before = cpu()?;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = cpu()?;
        let used = before.iter().zip(&now).map(|(b, n)| n - b);
        let busy: Vec<&str> = agents
            .iter()
            .zip(used)
            .filter(|(_, used)| *used > QUIET_CPU)
            .map(|(a, _)| a.name)
            .collect();
        if busy.is_empty() {
            return Ok(Instant::now());
        }
        if Instant::now() > deadline {
            return Err(format!("agents {busy:?} still busy (over 5% of a core) after {limit:?}").into());
        }
        before = now;
    }
}
