//! Health checks: what a registration's owner probes, how often, and how many results in a
//! row it takes to change the instance's status (so one lost probe does not flap it).
//!
//! This module holds the definitions and the pure decision ([`Tally`]); the node runs the
//! probes (`node/checks.rs`).

use std::time::Duration;

use roster_registry::Health;
use serde::{Deserialize, Serialize};

/// The shortest interval between two probes (and the shortest TTL of a TTL check).
pub const MIN_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// The longest interval between two probes (and the longest TTL of a TTL check).
pub const MAX_CHECK_INTERVAL: Duration = Duration::from_secs(24 * 60 * 60);
/// The shortest probe timeout.
pub const MIN_CHECK_TIMEOUT: Duration = Duration::from_millis(100);
/// The most results in a row a threshold may ask for.
pub const MAX_THRESHOLD: u32 = 100;
/// The most checks one registration may have.
pub const MAX_CHECKS: usize = 8;
/// The longest URL, address or command of a check, in bytes.
pub const MAX_TARGET_LEN: usize = 1024;
/// The interval of a probe when none is given.
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(10);
/// Failures in a row before a passing instance turns critical, when not given.
pub const DEFAULT_FAILURES: u32 = 3;
/// Successes in a row before a critical instance turns passing, when not given.
pub const DEFAULT_SUCCESSES: u32 = 1;

/// What a check probes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Probe {
    /// `GET` the URL (`http://`, or `https://` on a node with TLS files, the service's
    /// certificate checked against the node's CA): a 2xx answer passes, 429 warns, anything
    /// else (a redirect too, a certificate the CA did not sign, or nothing within the
    /// timeout) fails.
    Http(String),
    /// Connect to `host:port`: a connection within the timeout passes.
    Tcp(String),
    /// Run the command (no shell): exit code 0 passes, 1 warns, anything else fails, and so
    /// does a command still running at the timeout (it is killed). Only on an agent started
    /// with `--enable-exec-checks`.
    Exec(Vec<String>),
    /// The service itself says it is alive (`roster pass`, [`crate::Node::pass`])
    /// at least once per interval; a pass moves a deadline on the owning node only.
    Ttl,
}

impl Probe {
    /// The kind, as flags and the CLI name it.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Http(_) => "http",
            Self::Tcp(_) => "tcp",
            Self::Exec(_) => "exec",
            Self::Ttl => "ttl",
        }
    }
}

/// One check of a registration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    /// What it probes.
    pub probe: Probe,
    /// How often it probes (the TTL of a TTL check), in milliseconds.
    pub interval_ms: u64,
    /// How long a probe may take, in milliseconds.
    pub timeout_ms: u64,
    /// Successes in a row before a failing instance passes again.
    pub successes: u32,
    /// Failures in a row before a passing instance is critical.
    pub failures: u32,
    /// Deregister the instance once it has been critical this long (milliseconds); `None`:
    /// never.
    pub deregister_after_ms: Option<u64>,
}

impl Check {
    /// A check of `probe` with the defaults: every 10 s (a TTL check: a TTL of 10 s), a
    /// timeout of half the interval up to 10 s, critical after 3 failures in a row,
    /// passing after 1 success.
    pub fn new(probe: Probe) -> Self {
        let interval_ms = millis(DEFAULT_CHECK_INTERVAL);
        Self {
            probe,
            interval_ms,
            timeout_ms: interval_ms / 2,
            successes: DEFAULT_SUCCESSES,
            failures: DEFAULT_FAILURES,
            deregister_after_ms: None,
        }
    }

    /// An HTTP check of `url` (see [`Probe::Http`]), with the defaults of [`Check::new`].
    pub fn http(url: impl Into<String>) -> Self {
        Self::new(Probe::Http(url.into()))
    }

    /// A TCP check of `host:port`, with the defaults of [`Check::new`].
    pub fn tcp(address: impl Into<String>) -> Self {
        Self::new(Probe::Tcp(address.into()))
    }

    /// An exec check running `program` with `args` (no shell), with the defaults of
    /// [`Check::new`].
    pub fn exec<S: Into<String>>(program: impl Into<String>, args: impl IntoIterator<Item = S>) -> Self {
        let argv = std::iter::once(program.into())
            .chain(args.into_iter().map(Into::into))
            .collect();
        Self::new(Probe::Exec(argv))
    }

    /// A TTL check: the instance must pass ([`crate::Node::pass`]) at least once per `ttl`.
    pub fn ttl(ttl: Duration) -> Self {
        Self::new(Probe::Ttl).every(ttl)
    }

    /// Probes every `interval` (a TTL check: its TTL), with a timeout of half of it unless
    /// [`Check::timeout`] says otherwise after this.
    #[must_use]
    pub fn every(mut self, interval: Duration) -> Self {
        self.interval_ms = millis(interval);
        self.timeout_ms = self.interval_ms / 2;
        self
    }

    /// How long a probe may take.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout_ms = millis(timeout);
        self
    }

    /// Failures in a row before the instance is critical.
    #[must_use]
    pub fn failures(mut self, n: u32) -> Self {
        self.failures = n;
        self
    }

    /// Successes in a row before a critical instance passes again.
    #[must_use]
    pub fn successes(mut self, n: u32) -> Self {
        self.successes = n;
        self
    }

    /// Deregisters the instance once this check has been critical for `after`.
    #[must_use]
    pub fn deregister_critical_after(mut self, after: Duration) -> Self {
        self.deregister_after_ms = Some(millis(after));
        self
    }

    /// Checks every field; `exec_allowed` says whether this node runs exec checks.
    ///
    /// # Errors
    /// One line naming the field, what it must be, and what to do.
    pub fn validate(&self, exec_allowed: bool) -> Result<(), String> {
        self.validate_probe(exec_allowed)?;
        let interval = Duration::from_millis(self.interval_ms);
        if !(MIN_CHECK_INTERVAL..=MAX_CHECK_INTERVAL).contains(&interval) {
            // A TTL check's interval is its ttl, the one time it was given.
            let what = if self.probe == Probe::Ttl {
                "a ttl check's ttl"
            } else {
                "a check interval"
            };
            return Err(format!(
                "{what} of {} is out of range; use 1s to 24h",
                humantime::format_duration(interval)
            ));
        }
        let timeout = Duration::from_millis(self.timeout_ms);
        if self.probe != Probe::Ttl && (timeout < MIN_CHECK_TIMEOUT || timeout > interval) {
            return Err(format!(
                "a check timeout of {} is out of range; use 100ms up to the interval ({})",
                humantime::format_duration(timeout),
                humantime::format_duration(interval)
            ));
        }
        for (name, n) in [("success", self.successes), ("failure", self.failures)] {
            if !(1..=MAX_THRESHOLD).contains(&n) {
                return Err(format!(
                    "a check {name} threshold of {n} is out of range; use 1 to {MAX_THRESHOLD}"
                ));
            }
        }
        if let Some(ms) = self.deregister_after_ms {
            let d = Duration::from_millis(ms);
            if !(MIN_CHECK_INTERVAL..=MAX_CHECK_INTERVAL).contains(&d) {
                return Err(format!(
                    "a deregister-critical-after of {} is out of range; use 1s to 24h",
                    humantime::format_duration(d)
                ));
            }
        }
        Ok(())
    }

    fn validate_probe(&self, exec_allowed: bool) -> Result<(), String> {
        match &self.probe {
            Probe::Http(url) => validate_http_url(url),
            Probe::Tcp(addr) => validate_tcp(addr),
            Probe::Exec(argv) => {
                if !exec_allowed {
                    return Err("exec checks run commands and are off on this agent; start it with --enable-exec-checks, or use an http, tcp or ttl check".to_string());
                }
                let len: usize = argv.iter().map(String::len).sum();
                if argv.first().is_none_or(String::is_empty) || len > MAX_TARGET_LEN {
                    return Err(format!(
                        "an exec check needs a command of 1 to {MAX_TARGET_LEN} bytes, e.g. '/usr/local/bin/healthy --quick'"
                    ));
                }
                Ok(())
            }
            Probe::Ttl => Ok(()),
        }
    }
}

/// Whether an HTTP check's URL is `https://`.
pub fn is_https(url: &str) -> bool {
    url.starts_with("https://")
}

/// Splits the URL of an HTTP check (`http://` or `https://`) into its host, port and path.
///
/// # Errors
/// One line saying what a URL must look like.
pub fn split_http_url(url: &str) -> Result<(String, u16, String), String> {
    let bad = || {
        format!(
            "{:?} is not an http URL; give one like http://127.0.0.1:8080/health (or https://)",
            shown(url)
        )
    };
    if url.len() > MAX_TARGET_LEN {
        return Err(format!("a check URL is longer than {MAX_TARGET_LEN} bytes"));
    }
    let (rest, default_port) = match url.strip_prefix("https://") {
        Some(rest) => (rest, 443),
        None => (url.strip_prefix("http://").ok_or_else(bad)?, 80),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.contains('@') || !path.chars().all(|c| c.is_ascii_graphic()) {
        return Err(bad());
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => (h, p.parse::<u16>().map_err(|_| bad())?),
        _ => (authority, default_port),
    };
    roster_registry::Endpoint::new(host, port).map_err(|_| bad())?;
    let host = host.trim_start_matches('[').trim_end_matches(']').to_string();
    Ok((host, port, path.to_string()))
}

fn validate_http_url(url: &str) -> Result<(), String> {
    split_http_url(url).map(drop)
}

fn validate_tcp(addr: &str) -> Result<(), String> {
    roster_registry::Endpoint::parse(addr)
        .map(drop)
        .map_err(|e| format!("a tcp check needs HOST:PORT: {e}"))
}

/// What one probe found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It passed.
    Pass,
    /// It warned (exec exit code 1, HTTP 429).
    Warn,
    /// It failed (or timed out).
    Fail,
}

/// A check's results in a row and the status they decided: a status changes only after
/// `failures` failures (or `successes` passes) in a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tally {
    health: Health,
    /// The outcome of the current streak and its length.
    streak: Option<(Outcome, u32)>,
}

impl Tally {
    /// A tally starting from `health` (the status saved before a restart, so a restart
    /// does not flap the instance).
    pub fn new(health: Health) -> Self {
        Self { health, streak: None }
    }

    /// The status decided so far.
    pub fn health(&self) -> Health {
        self.health
    }

    /// Counts one outcome; returns the new status when it changed.
    pub fn observe(&mut self, outcome: Outcome, check: &Check) -> Option<Health> {
        let n = match self.streak {
            Some((o, n)) if o == outcome => n.saturating_add(1),
            _ => 1,
        };
        self.streak = Some((outcome, n));
        let next = match outcome {
            Outcome::Fail if n >= check.failures => Health::Critical,
            Outcome::Fail => return None,
            // Out of critical only after enough successes; warning <-> passing at once.
            Outcome::Pass | Outcome::Warn if self.health == Health::Critical && n < check.successes => {
                return None
            }
            Outcome::Pass => Health::Passing,
            Outcome::Warn => Health::Warning,
        };
        (next != self.health).then(|| {
            self.health = next;
            next
        })
    }
}

/// The status of an instance from the statuses of its checks: the worst of them (passing
/// when it has none).
pub fn worst(healths: impl IntoIterator<Item = Health>) -> Health {
    healths.into_iter().max().unwrap_or(Health::Passing)
}

/// At most 64 printable characters of `s`, for an error message.
fn shown(s: &str) -> String {
    s.chars()
        .filter(|c| roster_registry::is_printable(*c))
        .take(64)
        .collect()
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(failures: u32, successes: u32) -> Check {
        Check {
            failures,
            successes,
            ..Check::new(Probe::Tcp("127.0.0.1:1".into()))
        }
    }

    #[test]
    fn a_ttl_check_out_of_range_is_told_by_its_ttl_and_another_by_its_interval() {
        let e = Check::ttl(Duration::from_millis(500)).validate(false);
        assert_eq!(
            e,
            Err("a ttl check's ttl of 500ms is out of range; use 1s to 24h".to_string())
        );
        let tcp = Check::new(Probe::Tcp("127.0.0.1:1".into())).every(Duration::from_millis(500));
        assert_eq!(
            tcp.validate(false),
            Err("a check interval of 500ms is out of range; use 1s to 24h".to_string())
        );
    }

    #[test]
    fn one_lost_probe_does_not_flap_and_enough_in_a_row_do() {
        let c = check(3, 2);
        let mut t = Tally::new(Health::Passing);
        assert_eq!(t.observe(Outcome::Fail, &c), None);
        assert_eq!(t.observe(Outcome::Fail, &c), None);
        assert_eq!(t.observe(Outcome::Pass, &c), None, "the streak is broken");
        assert_eq!(t.observe(Outcome::Fail, &c), None);
        assert_eq!(t.observe(Outcome::Fail, &c), None);
        assert_eq!(t.observe(Outcome::Fail, &c), Some(Health::Critical));
        assert_eq!(t.observe(Outcome::Fail, &c), None, "no change, no write");
        assert_eq!(t.observe(Outcome::Pass, &c), None);
        assert_eq!(t.observe(Outcome::Pass, &c), Some(Health::Passing));
        assert_eq!(t.observe(Outcome::Warn, &c), Some(Health::Warning));
        assert_eq!(t.observe(Outcome::Pass, &c), Some(Health::Passing));
    }

    #[test]
    fn a_restarted_tally_keeps_the_saved_status() {
        let c = check(1, 3);
        let mut t = Tally::new(Health::Critical);
        assert_eq!(t.observe(Outcome::Pass, &c), None);
        assert_eq!(t.health(), Health::Critical);
    }

    #[test]
    fn the_worst_check_decides() {
        assert_eq!(worst([]), Health::Passing);
        assert_eq!(worst([Health::Passing, Health::Warning]), Health::Warning);
        assert_eq!(worst([Health::Critical, Health::Warning]), Health::Critical);
    }

    #[test]
    fn bad_checks_are_refused_with_what_to_do() {
        let ok = Check::new(Probe::Http("http://127.0.0.1:8080/health".into()));
        ok.validate(false).unwrap();
        let refused = |c: Check, exec: bool, want: &str| {
            let e = c.validate(exec).unwrap_err();
            assert!(e.contains(want), "{e}");
            assert!(!e.contains('\n'));
        };
        for url in [
            "notaurl",
            "ftp://a/",
            "https://",
            "http://",
            "http://a b/",
            "http://u@h/",
            "http://h:0/",
            "http://h:x/",
        ] {
            refused(Check::new(Probe::Http(url.into())), false, "is not an http URL");
        }
        refused(
            Check {
                interval_ms: 500,
                ..ok.clone()
            },
            false,
            "use 1s to 24h",
        );
        refused(
            Check {
                failures: 0,
                ..ok.clone()
            },
            false,
            "failure threshold of 0",
        );
        refused(
            Check {
                timeout_ms: 20_000,
                ..ok.clone()
            },
            false,
            "up to the interval",
        );
        refused(
            Check::new(Probe::Exec(vec!["true".into()])),
            false,
            "--enable-exec-checks",
        );
        Check::new(Probe::Exec(vec!["true".into()]))
            .validate(true)
            .unwrap();
        refused(Check::new(Probe::Tcp("nohost".into())), false, "HOST:PORT");
        assert_eq!(
            split_http_url("http://[::1]:81/h?x=1").unwrap(),
            ("::1".to_string(), 81, "/h?x=1".to_string())
        );
        assert_eq!(
            split_http_url("https://db.local/h").unwrap(),
            ("db.local".to_string(), 443, "/h".to_string())
        );
        assert_eq!(
            split_http_url("http://db.local").unwrap(),
            ("db.local".to_string(), 80, "/".to_string())
        );
    }
}
