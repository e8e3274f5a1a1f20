//! The `roster` binary: `roster agent` runs a node; the other commands ask one.
//!
//! Exit codes: [`exit::Exit`], the table of docs/reference/cli.md.

mod agent;
mod check_args;
mod commands;
mod dns;
mod exit;
mod heap_trim;
mod http;
mod instances_file;
mod output;
mod watch;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, CommandFactory, Parser, Subcommand};

use exit::Exit;

/// A failure with its exit code and one line for stderr.
#[derive(Debug)]
pub struct Fail {
    /// How the process exits.
    pub code: Exit,
    /// What went wrong and what to do.
    pub message: String,
}

impl Fail {
    pub fn failed(message: impl Into<String>) -> Self {
        Self {
            code: Exit::Failed,
            message: message.into(),
        }
    }

    pub fn usage(message: impl Into<String>) -> Self {
        Self {
            code: Exit::Usage,
            message: message.into(),
        }
    }

    /// A listener that could not be bound: bad input (exit 2) when the address does not
    /// parse, else a failure (exit 1: in use, or not an address of this host).
    pub fn bind(e: &std::io::Error, message: String) -> Self {
        if e.kind() == std::io::ErrorKind::InvalidInput {
            Self::usage(message)
        } else {
            Self::failed(message)
        }
    }

    pub fn unreachable(message: impl Into<String>) -> Self {
        Self {
            code: Exit::Unreachable,
            message: message.into(),
        }
    }
}

/// roster: a replicated service registry.
///
/// Run a node with `roster agent`; register, find and watch services with the other
/// commands, which ask the agent at --agent (default ws://127.0.0.1:7420).
#[derive(Debug, Parser)]
#[command(name = "roster", version, propagate_version = true, max_term_width = 100)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a roster node (an agent) in the foreground.
    Agent(agent::AgentArgs),
    /// Register an instance of a service; the agent owns and renews it until `deregister`.
    ///
    /// With --from-file, register many at once (a deploy): one JSON object a line, with the
    /// fields of the arguments, e.g.
    /// {"service": "web", "address": "10.0.0.7:8080", "id": "web-1", "meta": {"zone": "a"},
    /// "ttl": "30s"}. Every line is checked before any is sent; the agent takes up to 10,000
    /// a batch, all or none.
    Register {
        #[command(flatten)]
        client: ClientArgs,
        /// The service name (DNS-like: lowercase letters, digits, '-', dots between labels).
        #[arg(required_unless_present = "from_file")]
        service: Option<String>,
        /// Where the instance listens, host:port.
        #[arg(required_unless_present = "from_file")]
        address: Option<String>,
        /// Register the instances of a JSON-lines file ('-': stdin) instead.
        #[arg(long, value_name = "FILE", conflicts_with_all = [
            "service", "address", "meta", "id", "ttl", "check_http", "check_tcp", "check_exec", "check_ttl",
            "check_interval", "check_timeout", "check_failures", "check_successes", "deregister_critical_after",
        ])]
        from_file: Option<PathBuf>,
        /// Metadata, KEY=VALUE (repeat for more).
        #[arg(long = "meta", value_name = "K=V")]
        meta: Vec<String>,
        /// The instance id (default: <service>-<agent node name>).
        #[arg(long = "id", value_name = "INSTANCE")]
        id: Option<String>,
        /// Deregister it when this long passes without another `register` (e.g. 30s, 5m).
        #[arg(long, value_name = "DUR", value_parser = parse_duration)]
        ttl: Option<Duration>,
        #[command(flatten)]
        checks: check_args::CheckArgs,
    },
    /// Deregister an instance the agent owns.
    Deregister {
        #[command(flatten)]
        client: ClientArgs,
        /// The service name.
        service: String,
        /// The instance id.
        instance: String,
        /// Remove it whatever node owns it (an operator's removal of a stranded instance;
        /// logged and counted by the agent). A live owner writes it back.
        #[arg(long)]
        any_owner: bool,
    },
    /// List services and their live instance counts.
    Ls {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Show the served (passing or warning) instances of a service (exit 1 when there is
    /// none), or one live instance whatever its status.
    Get {
        #[command(flatten)]
        client: ClientArgs,
        /// The service name.
        service: String,
        /// One instance id: show it, whatever its status (exit 1 when it is not live).
        #[arg(conflicts_with = "all")]
        instance: Option<String>,
        /// Show every live instance, critical and in maintenance too.
        #[arg(long)]
        all: bool,
        /// Put first the instances owned by nodes of a zone: the agent's own without a
        /// value, or the one named (`--near eu-west-1a`).
        #[arg(long, value_name = "ZONE", num_args = 0..=1, default_missing_value = roster::NEAR_AGENT, conflicts_with = "instance")]
        near: Option<String>,
    },
    /// Show a service's instances, then its changes as they arrive, until interrupted.
    Watch {
        #[command(flatten)]
        client: ClientArgs,
        /// The service name.
        service: String,
        /// End when the agent goes away (exit 1), instead of reconnecting and going on
        /// from what was printed.
        #[arg(long)]
        once: bool,
        /// Follow every live instance, critical and in maintenance too.
        #[arg(long)]
        all: bool,
    },
    /// Tell the agent an instance with a TTL check (--check-ttl) is alive. Cheap: it moves
    /// a deadline on the agent, and writes nothing unless the instance was critical.
    Pass {
        #[command(flatten)]
        client: ClientArgs,
        /// The service name.
        service: String,
        /// The instance id.
        instance: String,
    },
    /// Take instances of this agent out of reads without deregistering them (a drain before
    /// a deploy), or put them back. Kept across agent restarts.
    Maint {
        #[command(flatten)]
        client: ClientArgs,
        /// enable (out of service) or disable (back in service).
        #[arg(value_parser = ["enable", "disable"])]
        action: String,
        /// The service name (with INSTANCE; neither: every instance this agent owns).
        #[arg(requires = "instance")]
        service: Option<String>,
        /// The instance id.
        #[arg(requires = "service")]
        instance: Option<String>,
        /// Why, shown beside the instance (with enable).
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
    },
    /// List the nodes of the cluster.
    Members {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Show this agent: identity, peers, launches, counters.
    Status {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Show where a registration came from and which peers have it.
    Explain {
        #[command(flatten)]
        client: ClientArgs,
        /// The service name.
        service: String,
        /// The instance id.
        instance: String,
    },
    /// Print a data directory's node id without starting the agent (a new directory gets its
    /// identity now): the id a TLS certificate names as `node-<id>`.
    Id {
        /// The agent's data directory [default: $ROSTER_DATA_DIR, or the platform data
        /// directory].
        #[arg(long, value_name = "DIR", env = "ROSTER_DATA_DIR")]
        data_dir: Option<PathBuf>,
        /// Print JSON (machine output) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print a completion script for SHELL (e.g. `roster completions bash >
    /// /usr/share/bash-completion/completions/roster`).
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Print the man page, roff (e.g. `roster man > /usr/local/share/man/man1/roster.1`,
    /// `roster man agent > .../roster-agent.1`).
    Man {
        /// A command's own page (its flags), e.g. agent.
        command: Option<String>,
    },
    /// Make the agent leave the cluster and stop: its registrations are removed from every
    /// node at once (they stay on its disk and come back if it is started again).
    Leave {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Write a node that is gone for good dead for every replica now: its registrations
    /// leave every read at once, not when its lease ends. Refused for a node that answers.
    ForceLeave {
        #[command(flatten)]
        client: ClientArgs,
        /// The node's name or id (as `roster members` shows them).
        node: String,
    },
    /// Ask for an anti-entropy round now (at most once per the agent's --sync-min-interval).
    Sync {
        #[command(flatten)]
        client: ClientArgs,
    },
}

/// How a client command reaches its agent.
#[derive(Debug, Clone, Args)]
pub struct ClientArgs {
    /// The agent to ask.
    #[arg(long, value_name = "URL", env = "ROSTER_AGENT", default_value = roster::DEFAULT_AGENT_URL)]
    pub agent: String,
    /// A file holding the cluster secret (needed when the agent is not on loopback).
    #[arg(long, value_name = "FILE", env = "ROSTER_CLUSTER_SECRET_FILE")]
    pub cluster_secret_file: Option<PathBuf>,
    /// The CA (PEM) that signs a wss:// agent's certificate.
    #[arg(long, value_name = "FILE", env = "ROSTER_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// A client certificate (PEM) to show a wss:// agent; needed when not on loopback.
    #[arg(long, value_name = "FILE", env = "ROSTER_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", env = "ROSTER_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// Print JSON (machine output) instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Parses `500ms`, `30s`, `5m`, `1h 30m`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (write durations like 500ms, 30s, 5m)"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let is_agent = matches!(cli.command, Command::Agent(_));
    init_logging(is_agent);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("roster: error: cannot start the async runtime: {e}");
            return Exit::Failed.into();
        }
    };
    let result = runtime.block_on(dispatch(cli.command));
    // Watches and the agent end on a signal; nothing else may linger.
    runtime.shutdown_timeout(Duration::from_millis(100));
    match result {
        Ok(()) => Exit::Success.into(),
        Err(fail) => {
            // The message may quote what an agent sent: one line, escaped.
            eprintln!("roster: error: {}", output::escape(&fail.message));
            fail.code.into()
        }
    }
}

/// Runs one command.
async fn dispatch(command: Command) -> Result<(), Fail> {
    match command {
        Command::Agent(args) => {
            heap_trim::spawn();
            agent::run(args).await
        }
        Command::Register {
            client,
            service,
            address,
            from_file,
            meta,
            id,
            ttl,
            checks,
        } => match (from_file, service, address) {
            (Some(path), _, _) => commands::register_from_file(&client, &path).await,
            (None, Some(service), Some(address)) => {
                let checks = checks.checks().map_err(Fail::usage)?;
                let item = roster::api::RegisterItem {
                    service,
                    address,
                    meta: Vec::new(),
                    instance: id,
                    ttl_ms: None,
                    checks,
                };
                commands::register(&client, item, meta, ttl).await
            }
            _ => Err(Fail::usage("give SERVICE and ADDRESS, or --from-file FILE")),
        },
        Command::Deregister {
            client,
            service,
            instance,
            any_owner,
        } => commands::deregister(&client, service, instance, any_owner).await,
        Command::Ls { client } => commands::ls(&client).await,
        Command::Get {
            client,
            service,
            instance: Some(instance),
            ..
        } => commands::get_one(&client, service, instance).await,
        Command::Get {
            client,
            service,
            instance: None,
            all,
            near,
        } => commands::get(&client, service, all, near).await,
        Command::Watch {
            client,
            service,
            once,
            all,
        } => watch::watch(&client, service, once, all).await,
        Command::Pass {
            client,
            service,
            instance,
        } => commands::pass(&client, service, instance).await,
        Command::Maint {
            client,
            action,
            service,
            instance,
            reason,
        } => commands::maint(&client, action == "enable", service.zip(instance), reason).await,
        Command::Members { client } => commands::members(&client).await,
        Command::Status { client } => commands::status(&client).await,
        Command::Explain {
            client,
            service,
            instance,
        } => commands::explain(&client, service, instance).await,
        Command::Sync { client } => commands::sync(&client).await,
        Command::ForceLeave { client, node } => commands::force_leave(&client, node).await,
        Command::Leave { client } => commands::leave(&client).await,
        Command::Id { data_dir, json } => agent::identity(data_dir, json),
        Command::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "roster", &mut script);
            print_bytes(&script)
        }
        Command::Man { command } => {
            let cli = Cli::command();
            let cmd = match &command {
                None => cli,
                Some(name) => cli
                    .find_subcommand(name)
                    .cloned()
                    .ok_or_else(|| Fail::usage(format!("no command {name:?}; `roster --help` lists them")))?
                    .bin_name(format!("roster {name}"))
                    .version(env!("CARGO_PKG_VERSION")),
            };
            let title = command.map_or_else(|| "roster".to_string(), |name| format!("roster-{name}"));
            let mut page = Vec::new();
            clap_mangen::Man::new(cmd)
                .title(title)
                .render(&mut page)
                .map_err(|e| Fail::failed(format!("cannot render the man page: {e}")))?;
            print_bytes(&page)
        }
    }
}

/// Writes to stdout; a reader that closed early (`| head`) is not an error.
fn print_bytes(bytes: &[u8]) -> Result<(), Fail> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(bytes) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(Fail::failed(format!("cannot write to stdout: {e}")))
        }
        _ => Ok(()),
    }
}

/// Logs go to stderr: `info` for the agent, `warn` for commands; `ROSTER_LOG` (an
/// `EnvFilter` directive such as `debug` or `roster_transport=debug`) overrides. The DNS
/// server's library logs each query at `info`: it says `warn` and above unless
/// `ROSTER_LOG` names it (`hickory_server=info`).
fn init_logging(agent: bool) {
    let default = if agent { "info" } else { "warn" };
    let asked = std::env::var("ROSTER_LOG").ok();
    let mut filter = tracing_subscriber::EnvFilter::try_from_env("ROSTER_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    if !asked.is_some_and(|a| a.contains("hickory")) {
        if let Ok(quiet) = "hickory_server=warn".parse() {
            filter = filter.add_directive(quiet);
        }
    }
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .init();
}
