//! Three real `roster agent` processes on loopback, killed (by pid) and reaped when dropped,
//! and what `/proc` and the agents' status say about them.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use roster::api::{Request, ServerMessage};
use roster::client::Client;

use crate::Error;

/// One agent process. Dropping it kills the process and waits for it.
pub struct Agent {
    child: Child,
    /// Its client and peer URL.
    pub url: String,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Agent {
    fn start(bin: &Path, dir: &Path, name: &str, join: Option<&str>) -> Result<Agent, Error> {
        let mut cmd = Command::new(bin);
        cmd.env("ROSTER_HTTP_LISTEN", "127.0.0.1:0");
        cmd.args(["agent", "--listen", "127.0.0.1:0", "--node-name", name])
            .args(["--crash-guard", "off", "--data-dir"])
            .arg(dir.join(name));
        if let Some(url) = join {
            cmd.args(["--join", url]);
        }
        let mut child = cmd
            .env_remove("ROSTER_AGENT")
            .env("ROSTER_LOG", "error")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        // The guard exists before the first line is read: an error below still kills it.
        let mut agent = Agent {
            child,
            url: String::new(),
        };
        agent.url = listening_on(stdout, name)?;
        Ok(agent)
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A new client connection to it.
    pub async fn client(&self) -> Result<Client, Error> {
        Ok(Client::connect(&self.url, None).await?)
    }
}

/// Reads the agent's stdout until `listening on URL`, then drains the rest in a thread.
fn listening_on(stdout: std::process::ChildStdout, name: &str) -> Result<String, Error> {
    let mut lines = BufReader::new(stdout).lines();
    for line in lines.by_ref() {
        if let Some(url) = line?.strip_prefix("listening on ") {
            let url = url.to_string();
            std::thread::spawn(move || lines.for_each(drop));
            return Ok(url);
        }
    }
    Err(format!("agent {name} exited before it said where it listens").into())
}

/// Three agents, `b` and `c` joined through `a`, in a temporary directory.
pub struct Cluster {
    /// `a` (the one written to), `b`, `c`.
    pub agents: Vec<Agent>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts the three agents.
    pub fn start(bin: &Path) -> Result<Cluster, Error> {
        let dir = tempfile::tempdir()?;
        let a = Agent::start(bin, dir.path(), "a", None)?;
        let mut agents = vec![a];
        for name in ["b", "c"] {
            let agent = Agent::start(bin, dir.path(), name, Some(&agents[0].url))?;
            agents.push(agent);
        }
        Ok(Cluster { agents, _dir: dir })
    }

    /// Waits until every agent holds `n` live instances of `service`.
    pub async fn wait_for(&self, service: &str, n: u64, limit: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + limit;
        for agent in &self.agents {
            let mut client = agent.client().await?;
            loop {
                let held = count(&mut client, service).await?;
                if held == n {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(format!("agent {} holds {held} of {n} after {limit:?}", agent.url).into());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(())
    }
}

/// The live instances of `service` an agent holds.
async fn count(client: &mut Client, service: &str) -> Result<u64, Error> {
    match client.request(Request::Services).await? {
        ServerMessage::Services(list) => Ok(list.iter().find(|(s, _)| s == service).map_or(0, |(_, n)| *n)),
        other => Err(format!("Services answered {}", other.name()).into()),
    }
}

/// Bytes of WebSocket frames the agent sent to its peers since it started (its counters).
pub async fn bytes_sent(agent: &Agent) -> Result<u64, Error> {
    match agent.client().await?.request(Request::Status).await? {
        ServerMessage::Status(s) => Ok(s.counters.bytes_sent),
        other => Err(format!("Status answered {}", other.name()).into()),
    }
}

/// The process's resident memory (`VmRSS`), in MiB.
pub fn rss_mib(pid: u32) -> Result<f64, Error> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .ok_or("no VmRSS in /proc status")?;
    let kib: f64 = line
        .split_whitespace()
        .nth(1)
        .ok_or("a bad VmRSS line")?
        .parse()?;
    Ok(kib / 1024.0)
}
