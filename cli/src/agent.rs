//! `roster agent`: flags, the TOML config file and `ROSTER_<FLAG>` variables, then a node
//! that serves clients until SIGINT or SIGTERM.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::{parse_duration, Fail};

mod config;
mod damping;
mod files;
mod from_file;

use config::{file_duration, key_line, read_config, FileConfig};
use damping::damping;
pub use files::{read_secret, tls_files};
use from_file::{keys_used, FromFile};

/// Flags of `roster agent`. Each has a key in the config file (the flag's name) and a
/// variable `ROSTER_<FLAG>`; a flag beats its variable, which beats the file.
#[derive(Debug, Clone, Args)]
pub struct AgentArgs {
    /// A TOML config file whose keys are the flags' names (listen = "...", join = [...]).
    #[arg(long, value_name = "FILE", env = "ROSTER_CONFIG")]
    config: Option<PathBuf>,
    /// Where to listen for peers and clients [default: 127.0.0.1:7420].
    #[arg(long, value_name = "ADDR", env = "ROSTER_LISTEN")]
    listen: Option<String>,
    /// The URL peers dial [default: ws:// and the listen address].
    #[arg(long, value_name = "URL", env = "ROSTER_ADVERTISE")]
    advertise: Option<String>,
    /// A node to join through, ws://host:port (repeat for more; the variable takes a
    /// comma-separated list).
    #[arg(long, value_name = "URL", env = "ROSTER_JOIN", value_delimiter = ',')]
    join: Vec<String>,
    /// Where the replica and this node's registrations live [default: $ROSTER_DATA_DIR,
    /// or the platform data directory].
    #[arg(long, value_name = "DIR", env = "ROSTER_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// A file holding the cluster secret (at least 16 bytes); required to listen beyond
    /// loopback.
    #[arg(long, value_name = "FILE", env = "ROSTER_CLUSTER_SECRET_FILE")]
    cluster_secret_file: Option<PathBuf>,
    /// This node's name, for people [default: node-<id>].
    #[arg(long, value_name = "NAME", env = "ROSTER_NODE_NAME")]
    node_name: Option<String>,
    /// The failure domain this node runs in (a rack, an availability zone), shown by
    /// `members` and `status`: a DNS label such as eu-west-1a [default: default].
    #[arg(long, value_name = "ZONE", env = "ROSTER_ZONE", value_parser = parse_zone)]
    zone: Option<roster::Zone>,
    /// Damping: when more than PCT percent of another zone's members are lost within
    /// --damping-window, that zone is judged cut off, not dead: its instances are shown
    /// `unreachable` instead of removed; 100 never damps [default: 30].
    #[arg(long, value_name = "PCT", env = "ROSTER_DAMPING_SHARE", value_parser = clap::value_parser!(u8).range(0..=100))]
    damping_share: Option<u8>,
    /// The window a zone's losses must fall in to damp it [default: 30s].
    #[arg(long, value_name = "DUR", env = "ROSTER_DAMPING_WINDOW", value_parser = parse_duration)]
    damping_window: Option<Duration>,
    /// How long a damped zone's members are shown unreachable before they are gone as
    /// dead nodes are [default: 10m].
    #[arg(long, value_name = "DUR", env = "ROSTER_DAMPING_BOUND", value_parser = parse_duration)]
    damping_bound: Option<Duration>,
    /// Serve unreachable instances in reads (`get`, DNS, the HTTP API) as passing ones are,
    /// instead of listing them only with --all: for services that keep serving when the
    /// registry's network to their zone is cut.
    #[arg(long)]
    serve_unreachable: bool,
    /// Peers each gossip round goes to, and the most outbound connections; a change goes to
    /// every connected peer [default: 2].
    #[arg(long, value_name = "N", env = "ROSTER_FANOUT")]
    fanout: Option<usize>,
    /// The gossip round [default: 1s].
    #[arg(long, value_name = "DUR", env = "ROSTER_GOSSIP_INTERVAL", value_parser = parse_duration)]
    gossip_interval: Option<Duration>,
    /// The shortest lease of this node's registrations and membership; it grows with the
    /// cluster (see --lease-per-member) [default: 30s].
    #[arg(long, value_name = "DUR", env = "ROSTER_LEASE_TTL", value_parser = parse_duration)]
    lease_ttl: Option<Duration>,
    /// How much the lease grows per live member (their count rounded up to a power of
    /// two); 0s keeps it at --lease-ttl at any size [default: 24s].
    #[arg(long, value_name = "DUR", env = "ROSTER_LEASE_PER_MEMBER", value_parser = parse_duration)]
    lease_per_member: Option<Duration>,
    /// The least time between two `roster sync` runs [default: 30s].
    #[arg(long, value_name = "DUR", env = "ROSTER_SYNC_MIN_INTERVAL", value_parser = parse_duration)]
    sync_min_interval: Option<Duration>,
    /// How far ahead of this node's clock a peer's clock, and any time in what it sends,
    /// may be; further is refused [default: 5s].
    #[arg(long, value_name = "DUR", env = "ROSTER_MAX_CLOCK_SKEW", value_parser = parse_duration)]
    max_clock_skew: Option<Duration>,
    /// The cluster's name; nodes of another cluster are refused [default: roster].
    #[arg(long, value_name = "NAME", env = "ROSTER_CLUSTER")]
    cluster: Option<String>,
    /// Start under a new node id, keeping this node's registrations: the replica is
    /// forgotten and resynced from peers (the way out of a data directory whose replica
    /// cannot be read). For one start; not read from the config file.
    #[arg(long)]
    reset_identity: bool,
    /// The crash-loop guard: more than N launches within DUR (counted in the data dir) put
    /// the agent in a quiet mode (one connection, long backoff, no full sync unasked)
    /// until it has stayed up for DUR; `off` disables it [default: 5/5m].
    #[arg(long, value_name = "N/DUR", env = "ROSTER_CRASH_GUARD", value_parser = parse_guard)]
    crash_guard: Option<Guard>,
    /// This agent's TLS certificate chain (PEM); with --tls-key and --tls-ca it serves
    /// and dials wss:// only, with mutual TLS.
    #[arg(long, value_name = "FILE", env = "ROSTER_TLS_CERT")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", env = "ROSTER_TLS_KEY")]
    tls_key: Option<PathBuf>,
    /// The CA (PEM) that signs every node's certificate and remote clients' certificates.
    #[arg(long, value_name = "FILE", env = "ROSTER_TLS_CA")]
    tls_ca: Option<PathBuf>,
    /// On SIGINT or SIGTERM, leave the cluster (deregister everything at once, as `roster
    /// leave` does) instead of stopping to start again (peers keep this agent's
    /// registrations within its lease, so a restart shows them no change).
    #[arg(long)]
    leave_on_terminate: bool,
    /// Run the exec health checks of registrations (`roster register --check-exec`): they
    /// run commands as this agent's user, so they are off unless asked.
    #[arg(long)]
    enable_exec_checks: bool,
    /// Where the HTTP/JSON API listens, or `off` [default: 127.0.0.1:7421]. Beyond loopback
    /// it needs --http-token-file.
    #[arg(long, value_name = "ADDR", env = "ROSTER_HTTP_LISTEN")]
    http_listen: Option<String>,
    /// A file of bearer tokens (one per line, mode 600) that HTTP clients not on loopback
    /// must show; read again when it changes, so tokens rotate without a restart.
    #[arg(long, value_name = "FILE", env = "ROSTER_HTTP_TOKEN_FILE")]
    http_token_file: Option<PathBuf>,
    /// Ask HTTP clients on loopback for a token too (a loopback shared with others: the
    /// containers of one pod).
    #[arg(long)]
    http_require_token: bool,
    /// Serve DNS (UDP and TCP) on ADDR from the local replica, e.g. 127.0.0.1:8600
    /// [default: off].
    #[arg(long, value_name = "ADDR", env = "ROSTER_DNS_LISTEN")]
    dns_listen: Option<String>,
    /// The zone DNS answers for: <service>.service.<domain> [default: roster].
    #[arg(long, value_name = "NAME", env = "ROSTER_DNS_DOMAIN")]
    dns_domain: Option<String>,
    /// The TTL of DNS answers, 0s to 1h [default: 0s, so every lookup sees the registry
    /// as it is].
    #[arg(long, value_name = "DUR", env = "ROSTER_DNS_TTL", value_parser = parse_duration)]
    dns_ttl: Option<Duration>,
}

/// The longest TTL a DNS answer may carry.
const MAX_DNS_TTL: Duration = Duration::from_secs(3600);

/// `--dns-domain` and `--dns-ttl`, checked; a refusal comes with the key it is about.
fn dns_config(
    domain: Option<String>,
    ttl: Option<Duration>,
) -> Result<crate::dns::DnsConfig, (&'static str, Fail)> {
    let domain = crate::dns::domain(domain.as_deref().unwrap_or("roster"))
        .map_err(|e| ("dns-domain", Fail::usage(e)))?;
    let ttl = ttl.unwrap_or(Duration::ZERO);
    if ttl > MAX_DNS_TTL {
        return Err((
            "dns-ttl",
            Fail::usage(format!(
                "DNS TTL {} is over 1h; use at most 1h (answers older than that mislead)",
                humantime::format_duration(ttl)
            )),
        ));
    }
    Ok(crate::dns::DnsConfig { domain, ttl })
}

/// Where the HTTP API listens unless told.
pub const DEFAULT_HTTP_LISTEN: &str = "127.0.0.1:7421";

/// `--crash-guard`: `N/DUR` or `off`.
#[derive(Debug, Clone, Copy)]
pub enum Guard {
    Off,
    On(roster::CrashGuard),
}

fn parse_guard(s: &str) -> Result<Guard, String> {
    if s.trim() == "off" {
        return Ok(Guard::Off);
    }
    let bad = || format!("crash guard {s:?} is not N/DURATION (e.g. 5/5m) or off");
    let (n, d) = s.split_once('/').ok_or_else(bad)?;
    let launches: u32 = n.trim().parse().map_err(|_| bad())?;
    let window = humantime::parse_duration(d.trim()).map_err(|_| bad())?;
    if launches == 0 || window < Duration::from_secs(1) || window > Duration::from_secs(24 * 3600) {
        return Err(format!(
            "{}: use 1 or more launches and a window of 1s to 24h",
            bad()
        ));
    }
    Ok(Guard::On(roster::CrashGuard { launches, window }))
}

fn default_data_dir() -> Result<PathBuf, Fail> {
    dirs::data_dir().map(|d| d.join("roster")).ok_or_else(|| {
        Fail::usage("no platform data directory; pass --data-dir DIR (or set ROSTER_DATA_DIR)")
    })
}

/// `roster id`: prints the node id of `data_dir` (the agent's default when `None`), making
/// the identity of a new data directory without recording a start.
pub fn identity(data_dir: Option<PathBuf>, json: bool) -> Result<(), Fail> {
    let dir = match data_dir {
        Some(d) => d,
        None => default_data_dir()?,
    };
    let new_id = roster::registry::ReplicaId(
        getrandom::u64().map_err(|e| Fail::failed(format!("no random id from the OS: {e}")))?,
    );
    let (id, made) = roster::store::Store::identity(&dir, new_id).map_err(|e| match e {
        roster::store::StoreError::InUse { .. } => {
            Fail::failed(format!("{e}; `roster status` asks the running agent for its id"))
        }
        other => Fail::failed(other.to_string()),
    })?;
    if json {
        let v = serde_json::json!({
            "node": id.to_string(),
            "tls_name": format!("node-{id}"),
            "made": made,
            "data_dir": dir.display().to_string(),
        });
        println!("{v}");
    } else {
        println!("{id}");
        if made {
            eprintln!("roster: a new node identity was made in {}", dir.display());
        }
    }
    Ok(())
}

/// Runs the agent until SIGINT or SIGTERM, then stops to start again (or leaves, with
/// `--leave-on-terminate`); or until a client asks it to leave (`roster leave`).
pub async fn run(args: AgentArgs) -> Result<(), Fail> {
    let settings = Settings::of(args)?;
    let http = settings.http().await?;
    let dns = match &settings.dns_listen {
        Some(a) => Some(
            crate::dns::Sockets::bind(a)
                .await
                .map_err(|f| settings.from_file.name("dns-listen", f))?,
        ),
        None => None,
    };
    let node = settings
        .builder()?
        .start()
        .await
        .map_err(|e| settings.start_failed(e))?;
    let stop_http = tokio_util::sync::CancellationToken::new();
    let http = http.map(|(listener, tokens)| {
        let addr = listener.local_addr().ok();
        (
            addr,
            crate::http::spawn(node.clone(), listener, tokens, stop_http.clone()),
        )
    });
    let dns = dns.map(|sockets| {
        let addr = sockets.local_addr();
        let config = settings.dns.clone();
        (
            addr,
            crate::dns::spawn(node.clone(), sockets, config, stop_http.clone()),
        )
    });
    settings.announce(
        &node,
        http.as_ref().and_then(|(a, _)| *a),
        dns.as_ref().and_then(|(a, _)| *a),
    );
    notify_systemd(sd_notify::NotifyState::Ready);
    let left = tokio::select! {
        () = wait_for_signal() => false,
        () = node.closed() => true,
    };
    notify_systemd(sd_notify::NotifyState::Stopping);
    stop_http.cancel();
    for (_, server) in http.into_iter().chain(dns) {
        let _ = server.await;
    }
    if left {
        // A client asked it to leave; the node has left and saved.
        println!("left the cluster");
        return Ok(());
    }
    let closed = if settings.leave_on_terminate {
        tracing::info!("leaving the cluster (--leave-on-terminate)");
        node.shutdown().await
    } else {
        tracing::info!("stopping; peers keep this agent's registrations within its lease");
        node.stop().await
    };
    closed.map_err(|e| Fail::failed(format!("the last save failed: {e}")))?;
    Ok(())
}

/// What the agent runs with: each flag, else its key in the config file, else the default.
struct Settings {
    listen: String,
    advertise: Option<String>,
    join: Vec<String>,
    data_dir: PathBuf,
    secret_file: Option<PathBuf>,
    node_name: Option<String>,
    zone: roster::Zone,
    damping: roster::Damping,
    fanout: Option<usize>,
    gossip: Option<Duration>,
    lease: Option<Duration>,
    per_member: Option<Duration>,
    sync_min: Option<Duration>,
    skew: Option<Duration>,
    cluster: Option<String>,
    guard: Guard,
    tls: Option<(PathBuf, PathBuf, PathBuf)>,
    reset_identity: bool,
    exec_checks: bool,
    leave_on_terminate: bool,
    /// `None`: off.
    http_listen: Option<String>,
    http_token_file: Option<PathBuf>,
    http_require_token: bool,
    /// `None`: off.
    dns_listen: Option<String>,
    dns: crate::dns::DnsConfig,
    /// The config file's keys whose values are used: refusals of them name the file and line.
    from_file: FromFile,
}

impl Settings {
    /// The flags over the config file (`--config`), checked.
    fn of(args: AgentArgs) -> Result<Self, Fail> {
        let (file, text) = match &args.config {
            Some(p) => read_config(p)?,
            None => (FileConfig::default(), String::new()),
        };
        let cfg_path = args.config.clone().unwrap_or_default();
        let from_file = FromFile::new(&cfg_path, text, &keys_used(&args, &file));
        let text = from_file.text();
        let duration = |flag: Option<Duration>, key: &str, value: Option<String>| match flag {
            Some(d) => Ok(Some(d)),
            None => file_duration(&cfg_path, text, key, value),
        };
        let damping = damping(&args, &file, &duration, &from_file)?;
        Ok(Self {
            listen: args
                .listen
                .or(file.listen)
                .unwrap_or_else(|| roster::DEFAULT_LISTEN.to_string()),
            advertise: args.advertise.or(file.advertise),
            join: if args.join.is_empty() {
                file.join.unwrap_or_default()
            } else {
                args.join
            },
            data_dir: match args.data_dir.or(file.data_dir) {
                Some(d) => d,
                None => default_data_dir()?,
            },
            secret_file: args.cluster_secret_file.or(file.cluster_secret_file),
            node_name: args.node_name.or(file.node_name),
            zone: match (args.zone, file.zone) {
                (Some(z), _) => z,
                (None, Some(z)) => parse_zone(&z).map_err(|e| from_file.name("zone", Fail::usage(e)))?,
                (None, None) => roster::Zone::default(),
            },
            damping,
            fanout: args.fanout.or(file.fanout),
            gossip: duration(args.gossip_interval, "gossip-interval", file.gossip_interval)?,
            lease: duration(args.lease_ttl, "lease-ttl", file.lease_ttl)?,
            per_member: duration(args.lease_per_member, "lease-per-member", file.lease_per_member)?,
            sync_min: duration(
                args.sync_min_interval,
                "sync-min-interval",
                file.sync_min_interval,
            )?,
            skew: duration(args.max_clock_skew, "max-clock-skew", file.max_clock_skew)?,
            cluster: args.cluster.or(file.cluster),
            guard: match (args.crash_guard, file.crash_guard) {
                (Some(g), _) => g,
                (None, Some(value)) => parse_guard(&value).map_err(|e| {
                    let line = key_line(text, "crash-guard").unwrap_or(0);
                    Fail::usage(format!(
                        "config file {}, line {line}: crash-guard: {e}",
                        cfg_path.display()
                    ))
                })?,
                (None, None) => Guard::On(roster::DEFAULT_CRASH_GUARD),
            },
            tls: tls_files(
                args.tls_cert.or(file.tls_cert),
                args.tls_key.or(file.tls_key),
                args.tls_ca.or(file.tls_ca),
            )?,
            reset_identity: args.reset_identity,
            exec_checks: args.enable_exec_checks || file.enable_exec_checks.unwrap_or(false),
            leave_on_terminate: args.leave_on_terminate || file.leave_on_terminate.unwrap_or(false),
            http_listen: match args.http_listen.or(file.http_listen) {
                Some(a) if a.trim() == "off" => None,
                Some(a) => Some(a),
                None => Some(DEFAULT_HTTP_LISTEN.to_string()),
            },
            http_token_file: args.http_token_file.or(file.http_token_file),
            http_require_token: args.http_require_token || file.http_require_token.unwrap_or(false),
            dns_listen: args.dns_listen.or(file.dns_listen).filter(|a| a.trim() != "off"),
            dns: dns_config(
                args.dns_domain.or(file.dns_domain),
                duration(args.dns_ttl, "dns-ttl", file.dns_ttl)?,
            )
            .map_err(|(key, f)| from_file.name(key, f))?,
            from_file,
        })
    }

    /// The HTTP API's listener, bound before the node starts, and its tokens; `None` when
    /// it is off. Beyond loopback, a token file is required.
    async fn http(&self) -> Result<Option<(tokio::net::TcpListener, crate::http::Access)>, Fail> {
        let Some(addr) = &self.http_listen else {
            if self.http_token_file.is_some() || self.http_require_token {
                return Err(Fail::usage(
                    "--http-token-file and --http-require-token go with the HTTP API; drop them, or drop `--http-listen off`",
                ));
            }
            return Ok(None);
        };
        let tokens = match &self.http_token_file {
            Some(p) => Some(
                crate::http::Tokens::load(p)
                    .map_err(|e| self.from_file.name("http-token-file", Fail::usage(e)))?,
            ),
            None if self.http_require_token => {
                return Err(Fail::usage(
                    "--http-require-token needs --http-token-file FILE (the tokens to require)",
                ))
            }
            None => None,
        };
        let tls = match &self.tls {
            Some((cert, key, ca)) => Some(
                roster::transport::driver::TlsConfig {
                    cert_pem: cert.clone(),
                    key_pem: key.clone(),
                    ca_pem: ca.clone(),
                }
                .acceptor()
                .map_err(|e| Fail::usage(format!("TLS: {e}; check --tls-cert, --tls-key and --tls-ca")))?,
            ),
            None => None,
        };
        let named = |f| self.from_file.name("http-listen", f);
        let listener = crate::http::bind(addr).await.map_err(named)?;
        let local = listener
            .local_addr()
            .map_err(|e| Fail::failed(format!("the HTTP listener has no address: {e}")))?;
        if tokens.is_none() && tls.is_none() && !local.ip().is_loopback() {
            return Err(named(Fail::usage(format!(
                "--http-listen {addr} is beyond loopback: give --http-token-file FILE (or the TLS flags, for client certificates) so clients there can authenticate, or listen on 127.0.0.1"
            ))));
        }
        let access = crate::http::Access {
            tokens,
            loopback_needs_token: self.http_require_token,
            tls,
        };
        Ok(Some((listener, access)))
    }

    /// The node these settings describe (reading the secret file).
    fn builder(&self) -> Result<roster::NodeBuilder, Fail> {
        let mut b = roster::Node::builder()
            .reset_identity(self.reset_identity)
            .listen(self.listen.clone())
            .join(self.join.iter().cloned())
            .data_dir(&self.data_dir)
            .serve_clients(true)
            .enable_exec_checks(self.exec_checks);
        if let Some(a) = &self.advertise {
            b = b.advertise(a.clone());
        }
        if let Some(p) = &self.secret_file {
            let secret = read_secret(p).map_err(|f| self.from_file.name("cluster-secret-file", f))?;
            b = b.cluster_secret(secret);
        }
        if let Some(n) = &self.node_name {
            b = b.node_name(n.clone());
        }
        b = b.zone(self.zone.clone()).damping(self.damping);
        if let Some(f) = self.fanout {
            b = b.fanout(f);
        }
        type Set = fn(roster::NodeBuilder, Duration) -> roster::NodeBuilder;
        let durations: [(Option<Duration>, Set); 5] = [
            (self.gossip, roster::NodeBuilder::gossip_interval),
            (self.lease, roster::NodeBuilder::lease_ttl),
            (self.per_member, roster::NodeBuilder::lease_per_member),
            (self.sync_min, roster::NodeBuilder::sync_min_interval),
            (self.skew, roster::NodeBuilder::max_clock_skew),
        ];
        for (d, set) in durations {
            if let Some(d) = d {
                b = set(b, d);
            }
        }
        if let Some(c) = &self.cluster {
            b = b.cluster(c.clone());
        }
        if let Some((cert, key, ca)) = &self.tls {
            b = b.tls(cert, key, ca);
        }
        Ok(b.crash_guard(match self.guard {
            Guard::Off => None,
            Guard::On(g) => Some(g),
        }))
    }

    /// Prints who the agent is, where it listens and whom it joins.
    fn announce(
        &self,
        node: &roster::Node,
        http: Option<std::net::SocketAddr>,
        dns: Option<std::net::SocketAddr>,
    ) {
        println!(
            "roster agent {}: node {} ({}), pid {}",
            env!("CARGO_PKG_VERSION"),
            node.name(),
            node.id(),
            std::process::id()
        );
        let scheme = if self.tls.is_some() { "wss" } else { "ws" };
        println!("listening on {scheme}://{}", node.local_addr());
        if node.url() != format!("{scheme}://{}", node.local_addr()) {
            println!("advertising {}", node.url());
        }
        match http {
            Some(a) => println!(
                "HTTP API on {}://{a}",
                if self.tls.is_some() { "https" } else { "http" }
            ),
            None => println!("HTTP API off"),
        }
        if let Some(a) = dns {
            println!("DNS on {a} (udp and tcp) for {}", self.dns.domain);
        }
        println!("data in {}", self.data_dir.display());
        if self.join.is_empty() {
            println!("joining nobody (no --join): waiting for peers to dial in");
        } else {
            println!("joining {}", self.join.join(", "));
        }
    }

    /// Why the node did not start, as the agent's one-line error with what to check; a
    /// setting taken from the config file is named by its file and line.
    fn start_failed(&self, e: roster::Error) -> Fail {
        let key = match &e {
            roster::Error::Setting { name, .. } => name.replace('_', "-"),
            roster::Error::Listen { .. } => "listen".to_string(),
            _ => String::new(),
        };
        self.from_file.name(&key, start_failed(e))
    }
}

/// Why the node did not start, as the agent's one-line error with what to check.
fn start_failed(e: roster::Error) -> Fail {
    use roster::transport::driver::StartError;
    match e {
        roster::Error::Setting { message, .. } => Fail::usage(message),
        e @ roster::Error::Tls(_) => Fail::usage(format!("{e}; check --tls-cert, --tls-key and --tls-ca")),
        roster::Error::Invalid(m) => Fail::usage(m),
        e @ roster::Error::Input(_) => Fail::usage(e.to_string()),
        roster::Error::Listen { ref source, .. } => Fail::bind(source, e.to_string()),
        roster::Error::Start(StartError::Unauthenticated { addr }) => Fail::usage(format!(
            "no cluster secret: an agent without one listens on loopback only, not on {addr}; \
             pass --cluster-secret-file FILE, or --listen 127.0.0.1:PORT"
        )),
        roster::Error::Start(e @ (StartError::Config(_) | StartError::Node(_) | StartError::Tls(_))) => {
            Fail::usage(format!("{e}; check --advertise, --node-name and --cluster"))
        }
        other => Fail::failed(other.to_string()),
    }
}

/// Tells systemd (`Type=notify`) how the agent is doing; nothing without `$NOTIFY_SOCKET`.
fn notify_systemd(state: sd_notify::NotifyState) {
    if let Err(e) = sd_notify::notify(false, &[state]) {
        tracing::warn!("cannot tell systemd the agent's state: {e}");
    }
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// A zone from a flag, a variable or the config file.
fn parse_zone(s: &str) -> Result<roster::Zone, String> {
    roster::Zone::new(s).map_err(|e| e.to_string())
}
