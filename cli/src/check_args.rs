//! The health-check flags of `roster register`.

use std::time::Duration;

use clap::Args;
use roster::check::{Check, Probe, DEFAULT_CHECK_INTERVAL, DEFAULT_FAILURES, DEFAULT_SUCCESSES};

use crate::parse_duration;

/// How the agent checks the instance it registers (any number of checks, each of one kind;
/// the timing flags apply to all of them).
#[derive(Debug, Clone, Default, Args)]
pub struct CheckArgs {
    /// Check by GETting an http:// URL: 2xx passing, 429 warning, anything else critical.
    #[arg(long, value_name = "URL")]
    pub check_http: Vec<String>,
    /// Check by connecting to HOST:PORT.
    #[arg(long, value_name = "HOST:PORT")]
    pub check_tcp: Vec<String>,
    /// Check by running a command (no shell): exit 0 passing, 1 warning, other critical.
    /// The agent must run with --enable-exec-checks.
    #[arg(long, value_name = "CMD")]
    pub check_exec: Vec<String>,
    /// Check that the service runs `roster pass SERVICE INSTANCE` at least once per DUR.
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub check_ttl: Option<Duration>,
    /// How often to probe [default: 10s].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub check_interval: Option<Duration>,
    /// How long a probe may take [default: half the interval].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub check_timeout: Option<Duration>,
    /// Failures in a row before the instance is critical (not served).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_FAILURES)]
    pub check_failures: u32,
    /// Successes in a row before a critical instance is passing again.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_SUCCESSES)]
    pub check_successes: u32,
    /// Deregister the instance once a check has been critical this long.
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub deregister_critical_after: Option<Duration>,
}

impl CheckArgs {
    /// The checks the flags ask for, each checked as the agent will (exec checks are
    /// allowed here; the agent says whether it runs them).
    ///
    /// # Errors
    /// One line naming the flag at fault.
    pub fn checks(&self) -> Result<Vec<Check>, String> {
        let interval = self.check_interval.unwrap_or(DEFAULT_CHECK_INTERVAL);
        let mut probes: Vec<(Probe, Duration)> = Vec::new();
        probes.extend(self.check_http.iter().map(|u| (Probe::Http(u.clone()), interval)));
        probes.extend(self.check_tcp.iter().map(|a| (Probe::Tcp(a.clone()), interval)));
        for cmd in &self.check_exec {
            let argv =
                shlex::split(cmd).ok_or_else(|| format!("--check-exec {cmd:?} has an unclosed quote"))?;
            probes.push((Probe::Exec(argv), interval));
        }
        if let Some(ttl) = self.check_ttl {
            probes.push((Probe::Ttl, ttl));
        }
        let uses_timing = self.check_interval.is_some() || self.check_timeout.is_some();
        if probes.is_empty() && (uses_timing || self.deregister_critical_after.is_some()) {
            return Err(
                "the --check-* timing flags need a check: add --check-http, --check-tcp, --check-exec or --check-ttl"
                    .to_string(),
            );
        }
        probes
            .into_iter()
            .map(|(probe, every)| {
                let c = Check {
                    probe,
                    interval_ms: millis(every),
                    timeout_ms: millis(self.check_timeout.unwrap_or(every / 2)),
                    successes: self.check_successes,
                    failures: self.check_failures,
                    deregister_after_ms: self.deregister_critical_after.map(millis),
                };
                c.validate(true).map(|()| c)
            })
            .collect()
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
