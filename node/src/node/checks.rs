//! Running the health checks of the instances a node owns.
//!
//! Each checked instance has one task that keeps a [`Tally`] per check and writes the
//! instance's status (the worst of its checks') when it changes; each check feeds it
//! outcomes from a task of its own: a probe every interval, or, for a TTL check, a missed
//! deadline. A pass of a TTL check only moves its deadline here: no write, no event, unless
//! it brings the instance back from critical.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use roster_registry::{Health, Status};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::metrics::CheckLabels;
use super::{Error, Node};
use crate::check::{worst, Check, Outcome, Probe, Tally};
use roster_transport::driver::ClientTls;

/// The checks of one instance, running.
#[derive(Debug)]
pub(crate) struct Running {
    checks: Vec<Check>,
    cancel: CancellationToken,
    /// The last pass of each TTL check (one sender for all of them).
    passes: Arc<watch::Sender<Instant>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// The checks running on a node, by instance key.
pub(crate) type Checks = std::sync::Mutex<BTreeMap<String, Running>>;

impl Node {
    /// Runs the `checks` of the owned instance `key`, whose checks last judged it
    /// `health` (stopping those it ran before, unless they are the same), or stops them
    /// when it has none.
    pub(super) fn run_checks(&self, key: &str, checks: &[Check], health: Health) {
        let mut running = self
            .inner
            .checks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if checks.is_empty() {
            running.remove(key);
            return;
        }
        if running.get(key).is_some_and(|r| r.checks == checks) {
            return;
        }
        let cancel = self.inner.cancel.child_token();
        let (passes, _) = watch::channel(Instant::now());
        let passes = Arc::new(passes);
        let (tx, rx) = mpsc::channel(16);
        for (i, check) in checks.iter().enumerate() {
            let feed = Feed {
                index: i,
                check: check.clone(),
                tx: tx.clone(),
                cancel: cancel.clone(),
                results: self.inner.metrics.checks.clone(),
                tls: self.inner.check_tls.clone(),
            };
            match check.probe {
                Probe::Ttl => self.inner.tasks.spawn(feed.ttl(passes.subscribe())),
                _ => self.inner.tasks.spawn(feed.probes()),
            };
        }
        let node = self.clone();
        let judge = Judge::new(key.to_string(), checks.to_vec(), health);
        self.inner.tasks.spawn(judge.run(node, rx, cancel.clone()));
        running.insert(
            key.to_string(),
            Running {
                checks: checks.to_vec(),
                cancel,
                passes,
            },
        );
    }

    /// Stops the checks of instance `key`.
    pub(super) fn stop_checks(&self, key: &str) {
        self.inner
            .checks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(key);
    }

    /// A TTL check's pass for an instance this node owns: its deadline moves to now plus
    /// the TTL. Nothing is written unless the instance was critical.
    ///
    /// # Errors
    /// [`Error::NotFound`] when this node owns no such instance with a TTL check.
    pub fn pass(&self, service: &str, instance: &str) -> Result<(), Error> {
        let key = crate::store::key(service, instance);
        let running = self
            .inner
            .checks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match running.get(&key) {
            Some(r) if r.checks.iter().any(|c| c.probe == Probe::Ttl) => {
                r.passes.send_replace(Instant::now());
                Ok(())
            }
            _ => Err(Error::NotFound(format!(
                "this node owns no instance {instance:?} of {service:?} with a TTL check; register it with a ttl check first"
            ))),
        }
    }
}

/// One check's outcomes, sent to its instance's [`Judge`].
struct Feed {
    index: usize,
    check: Check,
    tx: mpsc::Sender<(usize, Outcome, String)>,
    cancel: CancellationToken,
    /// Results counted for `/metrics`.
    results: Family<CheckLabels, Counter>,
    /// TLS for an `https://` check.
    tls: Option<ClientTls>,
}

impl Feed {
    /// Counts a result (for `/metrics`) and hands it to the judge; false once nobody
    /// listens.
    async fn report(&self, outcome: Outcome, note: String) -> bool {
        let label = match outcome {
            Outcome::Pass => "pass",
            Outcome::Warn => "warn",
            Outcome::Fail => "fail",
        };
        self.results
            .get_or_create(&[("kind", self.check.probe.kind()), ("outcome", label)])
            .inc();
        self.tx.send((self.index, outcome, note)).await.is_ok()
    }

    /// Probes at once, then every interval.
    async fn probes(self) {
        let interval = Duration::from_millis(self.check.interval_ms);
        let timeout = Duration::from_millis(self.check.timeout_ms);
        loop {
            let started = Instant::now();
            let (outcome, note) = tokio::select! {
                () = self.cancel.cancelled() => return,
                r = probe(&self.check.probe, timeout, self.tls.as_ref()) => r,
            };
            if !self.report(outcome, note).await {
                return;
            }
            tokio::select! {
                () = self.cancel.cancelled() => return,
                () = tokio::time::sleep_until(started + interval) => {}
            }
        }
    }

    /// A pass for every pass (the judge ignores those that change nothing), a failure
    /// when the deadline passes without one (once, until the next pass).
    async fn ttl(self, mut passes: watch::Receiver<Instant>) {
        let ttl = Duration::from_millis(self.check.interval_ms);
        let mut deadline = Some(Instant::now() + ttl);
        loop {
            let (outcome, note) = tokio::select! {
                () = self.cancel.cancelled() => return,
                changed = passes.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    deadline = Some(*passes.borrow_and_update() + ttl);
                    (Outcome::Pass, String::new())
                }
                () = sleep_until_some(deadline) => {
                    deadline = None;
                    (Outcome::Fail, format!("no pass within its TTL of {}", humantime::format_duration(ttl)))
                }
            };
            if !self.report(outcome, note).await {
                return;
            }
        }
    }
}

/// The outcome of one probe, with a note saying why.
async fn probe(p: &Probe, timeout: Duration, tls: Option<&ClientTls>) -> (Outcome, String) {
    let run = async {
        match p {
            Probe::Tcp(addr) => match tokio::net::TcpStream::connect(addr.as_str()).await {
                Ok(_) => (Outcome::Pass, String::new()),
                Err(e) => (Outcome::Fail, format!("tcp {addr}: {e}")),
            },
            Probe::Exec(argv) => exec(argv).await,
            Probe::Http(url) => http(url, tls).await,
            Probe::Ttl => (Outcome::Fail, "a ttl check is not probed".to_string()),
        }
    };
    match tokio::time::timeout(timeout, run).await {
        Ok(r) => r,
        Err(_) => (
            Outcome::Fail,
            format!(
                "{} check timed out after {}",
                p.kind(),
                humantime::format_duration(timeout)
            ),
        ),
    }
}

/// `GET`s the URL over one HTTP/1.1 connection: 2xx passes, 429 warns, anything else
/// fails (redirects are not followed: point the check at the answering URL).
async fn http(url: &str, tls: Option<&ClientTls>) -> (Outcome, String) {
    let fail = |why: String| (Outcome::Fail, format!("http {url}: {why}"));
    let (host, port, path) = match crate::check::split_http_url(url) {
        Ok(parts) => parts,
        Err(e) => return fail(e),
    };
    let stream = match tokio::net::TcpStream::connect((host.as_str(), port)).await {
        Ok(s) => s,
        Err(e) => return fail(e.to_string()),
    };
    if !crate::check::is_https(url) {
        return get(hyper_util::rt::TokioIo::new(stream), &host, port, &path, fail).await;
    }
    let Some(tls) = tls else {
        return fail("this node has no TLS files to check the certificate with".to_string());
    };
    match tls.connect(stream, &host).await {
        Ok(s) => get(hyper_util::rt::TokioIo::new(s), &host, port, &path, fail).await,
        Err(e) => fail(format!("TLS: {e}")),
    }
}

/// The `GET` of an HTTP check over an open connection (plain or TLS).
async fn get<IO>(
    io: IO,
    host: &str,
    port: u16,
    path: &str,
    fail: impl Fn(String) -> (Outcome, String),
) -> (Outcome, String)
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(io).await {
        Ok(pair) => pair,
        Err(e) => return fail(e.to_string()),
    };
    // The connection is driven beside the request, and dropped with it (at the timeout).
    let drive = async move {
        let _ = conn.await;
        std::future::pending::<std::convert::Infallible>().await
    };
    let authority = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let request = hyper::Request::get(path)
        .header(hyper::header::HOST, authority)
        .header(hyper::header::USER_AGENT, "roster-health-check")
        .body(http_body_util::Empty::<hyper::body::Bytes>::new());
    let request = match request {
        Ok(r) => r,
        Err(e) => return fail(e.to_string()),
    };
    let answer = tokio::select! {
        r = sender.send_request(request) => r,
        never = drive => match never {},
    };
    match answer {
        Err(e) => fail(e.to_string()),
        Ok(r) => {
            let code = r.status();
            let outcome = match code.as_u16() {
                200..=299 => Outcome::Pass,
                429 => Outcome::Warn,
                _ => Outcome::Fail,
            };
            (outcome, format!("HTTP {code}"))
        }
    }
}

/// Runs a command (no shell): 0 passes, 1 warns, anything else fails. Killed when the
/// probe is dropped (its timeout).
async fn exec(argv: &[String]) -> (Outcome, String) {
    let Some((program, args)) = argv.split_first() else {
        return (Outcome::Fail, "an empty command".to_string());
    };
    let out = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await;
    match out {
        Err(e) => (Outcome::Fail, format!("exec {program}: {e}")),
        Ok(o) => {
            let text = if o.stdout.is_empty() { &o.stderr } else { &o.stdout };
            let note = String::from_utf8_lossy(text)
                .lines()
                .next()
                .unwrap_or_default()
                .to_string();
            let outcome = match o.status.code() {
                Some(0) => Outcome::Pass,
                Some(1) => Outcome::Warn,
                _ => Outcome::Fail,
            };
            (outcome, note)
        }
    }
}

/// Decides one instance's status from the outcomes of its checks.
struct Judge {
    key: String,
    checks: Vec<Check>,
    tallies: Vec<Tally>,
    notes: Vec<String>,
    /// Since when each check has been critical.
    critical_since: Vec<Option<Instant>>,
}

impl Judge {
    fn new(key: String, checks: Vec<Check>, saved: Health) -> Self {
        // A TTL check reports each missed deadline once, and each pass: one of either decides.
        let checks: Vec<Check> = checks
            .into_iter()
            .map(|c| match c.probe {
                Probe::Ttl => Check {
                    failures: 1,
                    successes: 1,
                    ..c
                },
                _ => c,
            })
            .collect();
        let n = checks.len();
        Self {
            key,
            checks,
            tallies: vec![Tally::new(saved); n],
            notes: vec![String::new(); n],
            critical_since: vec![(saved == Health::Critical).then(Instant::now); n],
        }
    }

    async fn run(
        mut self,
        node: Node,
        mut rx: mpsc::Receiver<(usize, Outcome, String)>,
        cancel: CancellationToken,
    ) {
        loop {
            let deregister_at = self.deregister_at();
            let got = tokio::select! {
                () = cancel.cancelled() => return,
                got = rx.recv() => got,
                () = sleep_until_some(deregister_at) => {
                    self.deregister(&node).await;
                    return;
                }
            };
            let Some((i, outcome, note)) = got else { return };
            self.notes[i] = note;
            if self.tallies[i].observe(outcome, &self.checks[i]).is_some() {
                let critical = self.tallies[i].health() == Health::Critical;
                self.critical_since[i] =
                    critical.then(|| self.critical_since[i].unwrap_or_else(Instant::now));
                let status = self.status();
                info!(instance = %self.key, status = %status.health, note = %status.note, "check status changed");
                if let Err(e) = node.set_checked_status(&self.key, status).await {
                    warn!(instance = %self.key, "could not write a status: {e}");
                }
            }
        }
    }

    /// The worst of the checks' statuses, with the note of the (first) worst check.
    fn status(&self) -> Status {
        let health = worst(self.tallies.iter().map(Tally::health));
        let note = self
            .tallies
            .iter()
            .zip(&self.notes)
            .find(|(t, _)| t.health() == health)
            .map(|(_, n)| n.as_str())
            .unwrap_or_default();
        Status::new(health, note)
    }

    /// When the instance is to be deregistered: the earliest a check critical long enough
    /// asks for.
    fn deregister_at(&self) -> Option<Instant> {
        self.checks
            .iter()
            .zip(&self.critical_since)
            .filter_map(|(c, since)| Some((*since)? + Duration::from_millis(c.deregister_after_ms?)))
            .min()
    }

    async fn deregister(&self, node: &Node) {
        let Some((service, instance)) = self.key.split_once('/') else {
            return;
        };
        info!(instance = %self.key, "critical past its deregister-critical-after: deregistering");
        if let Err(e) = node.deregister(service, instance).await {
            warn!(instance = %self.key, "could not deregister: {e}");
        }
    }
}

async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
