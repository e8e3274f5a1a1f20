//! The embedded node: [`Node::builder`] starts one, [`Node::register`] keeps an instance
//! registered, [`Node::lookup`] and [`Node::watch`] read the local replica.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::Stream;
use roster_registry::{Change, ProviderId, Replica, ReplicaId, ServiceName};
use roster_transport::driver::{self, DriverConfig, DriverError, Handle, StartError};
use roster_transport::handshake::Secret;
use roster_transport::proto::{self, OwnedRegistration, Resume, MEMBERS_SERVICE};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, mpsc, Mutex};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use crate::api::{CountersView, ExplainView, InstanceView, MemberView, PeerView, StatusView, WriteView};
use crate::store::{OwnedRecord, Store, StoreError, StoreHealth};

mod bulk;
#[cfg(test)]
mod bulk_tests;
#[cfg(test)]
mod disk_tests;
mod group;
#[cfg(test)]
mod group_tests;

/// A node for the tests beside this file: on a free loopback port, over `dir`, without
/// the crash-loop guard.
#[cfg(test)]
#[allow(clippy::unwrap_used)]
async fn test_node(dir: &std::path::Path) -> Node {
    Node::builder()
        .listen("127.0.0.1:0")
        .data_dir(dir)
        .crash_guard(None)
        .start()
        .await
        .unwrap()
}
mod unsaved;

pub use bulk::MAX_BATCH_ITEMS;
pub(crate) use group::Answer;

/// The default listen address of an agent.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7420";
/// The default agent URL of client commands.
pub const DEFAULT_AGENT_URL: &str = "ws://127.0.0.1:7420";
/// The default lease of a node's registrations and of its membership.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);
/// How far ahead of a node's clock a peer's may run by default (`--max-clock-skew`).
pub const DEFAULT_MAX_CLOCK_SKEW: Duration = Duration::from_secs(5);
const MIN_CLOCK_SKEW_MS: u64 = 100;
const MAX_CLOCK_SKEW_MS: u64 = 10 * 60 * 1000;
/// The default least time between two manual syncs.
pub const DEFAULT_SYNC_MIN_INTERVAL: Duration = Duration::from_secs(30);
/// The default crash-loop guard: more than 5 launches within 5 minutes.
pub const DEFAULT_CRASH_GUARD: CrashGuard = CrashGuard {
    launches: 5,
    window: Duration::from_secs(300),
};
/// How often what the node knows of its peers (backoffs) is compared with what was saved.
const MEMORY_CHECK: Duration = Duration::from_millis(250);

/// The crash-loop guard: more than `launches` launches within `window` put the node in
/// crash-guard mode until it has stayed up for `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CrashGuard {
    /// Launches allowed within the window.
    pub launches: u32,
    /// The window.
    pub window: Duration,
}

impl std::str::FromStr for CrashGuard {
    type Err = String;

    /// `N/DUR` (`5/5m`).
    fn from_str(s: &str) -> Result<Self, String> {
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
        Ok(Self { launches, window })
    }
}
/// The default cluster name.
pub const DEFAULT_CLUSTER: &str = "roster";
/// The shortest `ttl` a registration may have ([`Service::ttl`], `roster register --ttl`).
pub const MIN_REGISTRATION_TTL: Duration = Duration::from_secs(1);
/// The longest `ttl` a registration may have (one day, as the longest lease): a
/// registration that should outlive it is registered without a `ttl` and deregistered.
pub const MAX_REGISTRATION_TTL: Duration = Duration::from_secs(24 * 3600);
/// The least time between two saves of the replica (group commit).
const SAVE_INTERVAL: Duration = Duration::from_millis(100);
/// Saves of a large replica are spaced further: writing may take at most a tenth of the time.
const SAVE_COST_FACTOR: u32 = 10;
/// How often own registrations with a `ttl` are checked for their end.
const TTL_CHECK: Duration = Duration::from_millis(250);
/// Client connections waiting to be served.
const CLIENT_QUEUE: usize = 64;

/// Why a node could not start or do what it was asked. Nothing changed.
///
/// Its `Debug` is its one-line message, so a service whose `main` returns it (through `?`
/// and `Box<dyn Error>`) prints `Error: cannot listen on ...: ...; pick another --listen
/// address`, not the variant's fields.
#[derive(thiserror::Error)]
pub enum Error {
    /// Bad input: a name, an address, metadata, a TTL.
    #[error("{0}")]
    Invalid(String),
    /// The data directory.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}; pick another --listen address or stop what uses it")]
    Listen {
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// The transport refused the configuration.
    #[error(transparent)]
    Start(#[from] StartError),
    /// The node has stopped.
    #[error("the node has stopped")]
    Stopped,
    /// Nothing by that name.
    #[error("{0}")]
    NotFound(String),
    /// The instance id is registered by another live node.
    #[error("{0}")]
    OwnedElsewhere(String),
    /// A throttled action ran too recently.
    #[error("{message}")]
    Throttled {
        /// What to do.
        message: String,
        /// When it may run again.
        retry_after: Duration,
    },
}

impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl From<DriverError> for Error {
    fn from(e: DriverError) -> Self {
        match e {
            DriverError::Stopped => Error::Stopped,
            DriverError::Invalid(e) => Error::Invalid(e.to_string()),
            e @ DriverError::InvalidItem { .. } => Error::Invalid(e.to_string()),
        }
    }
}

/// A service instance to register: a name, an address, metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    name: String,
    address: String,
    meta: Vec<(String, String)>,
    id: Option<String>,
    ttl: Option<Duration>,
}

impl Service {
    /// An instance of service `name` listening at `address` (`host:port`).
    pub fn new(name: impl Into<String>, address: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            address: address.into(),
            meta: Vec::new(),
            id: None,
            ttl: None,
        }
    }

    /// Adds a metadata pair. A key given twice is refused when registering.
    #[must_use]
    pub fn meta(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.meta.push((key.into(), value.into()));
        self
    }

    /// The instance id (default: `<service>-<node name>`): stable across restarts, so a
    /// restart is an update, not a removal and an addition.
    #[must_use]
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// Ends the registration after `ttl` unless it is registered again (default: never);
    /// from [`MIN_REGISTRATION_TTL`] (1 s) to [`MAX_REGISTRATION_TTL`] (24 h).
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }
}

/// A live instance, as a read returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// The service.
    pub service: String,
    /// The instance id.
    pub id: String,
    /// `host:port`.
    pub address: String,
    /// Its metadata.
    pub meta: BTreeMap<String, String>,
    /// The node that registered it (16 hex digits).
    pub node: String,
    /// When it was registered or last updated.
    pub registered_at: SystemTime,
    /// When its lease ends unless renewed.
    pub lease_expires_at: SystemTime,
}

impl Instance {
    fn from_registry(i: &roster_registry::Instance) -> Self {
        Self {
            service: i.service.as_str().to_string(),
            id: i.provider.as_str().to_string(),
            address: i.endpoint.to_string(),
            meta: i
                .meta
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            node: i.node.to_string(),
            registered_at: at(i.written.millis()),
            lease_expires_at: at(i.lease_deadline_ms),
        }
    }

    pub(crate) fn view(&self) -> InstanceView {
        InstanceView {
            service: self.service.clone(),
            instance: self.id.clone(),
            address: self.address.clone(),
            meta: self.meta.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            node: self.node.clone(),
            registered_at_ms: ms(self.registered_at),
            lease_expires_at_ms: ms(self.lease_expires_at),
        }
    }
}

/// A change a watch sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The instance is up: new, or updated.
    Up(Instance),
    /// The instance is down: deregistered, or its lease ended.
    Down {
        /// The service.
        service: String,
        /// The instance id.
        id: String,
        /// The address it had when this watch last showed it (empty for one the watch
        /// never showed: a remote client's, resumed with `WatchFrom`).
        address: String,
    },
}

fn at(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

fn ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The wall clock, in milliseconds since the epoch.
pub(crate) fn now_ms() -> u64 {
    ms(SystemTime::now())
}

/// Checks a registration's `ttl` against [`MIN_REGISTRATION_TTL`] and
/// [`MAX_REGISTRATION_TTL`].
///
/// # Errors
/// One line saying what to use instead.
pub fn check_ttl(ttl: Duration) -> Result<(), String> {
    if ttl < MIN_REGISTRATION_TTL {
        return Err(format!("ttl {ttl:?} is too short; use at least 1s"));
    }
    if ttl > MAX_REGISTRATION_TTL {
        return Err(format!(
            "ttl {} is too long; use at most 24h (register without --ttl, and deregister, for longer)",
            humantime::format_duration(ttl)
        ));
    }
    Ok(())
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The secret's bytes as the builder holds them; `Debug` shows only their length.
#[derive(Clone)]
struct SecretBytes(Vec<u8>);

impl std::fmt::Debug for SecretBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<{} bytes, redacted>", self.0.len())
    }
}

/// The secret length below which a node warns at start (the hard minimum is
/// [`roster_transport::handshake::MIN_SECRET_LEN`]).
const STRONG_SECRET_LEN: usize = 32;
/// The fewest distinct byte values a secret of [`STRONG_SECRET_LEN`] bytes or more may hold
/// without a warning (a hex string of random bytes holds 16; `aaaa...` or a repeated word
/// far fewer).
const STRONG_SECRET_DISTINCT: usize = 10;

/// Why a secret looks easy to guess, if it does: fewer than [`STRONG_SECRET_LEN`] bytes,
/// or fewer than [`STRONG_SECRET_DISTINCT`] distinct byte values. A heuristic: it cannot
/// tell a passphrase from random bytes, only catch the obvious.
fn secret_weakness(bytes: &[u8]) -> Option<String> {
    if bytes.len() < STRONG_SECRET_LEN {
        return Some(format!(
            "has {} bytes, fewer than {STRONG_SECRET_LEN}",
            bytes.len()
        ));
    }
    let mut seen = [false; 256];
    for &b in bytes {
        seen[usize::from(b)] = true;
    }
    let distinct = seen.iter().filter(|&&x| x).count();
    (distinct < STRONG_SECRET_DISTINCT).then(|| {
        format!(
            "holds only {distinct} distinct byte values in {} bytes",
            bytes.len()
        )
    })
}

/// How to start a [`Node`].
#[derive(Debug, Clone)]
pub struct NodeBuilder {
    listen: String,
    advertise: Option<String>,
    join: Vec<String>,
    data_dir: Option<PathBuf>,
    secret: Option<SecretBytes>,
    name: Option<String>,
    cluster: String,
    fanout: usize,
    gossip_interval: Duration,
    lease_ttl: Duration,
    lease_per_member: Duration,
    max_clock_skew: Duration,
    reset_identity: bool,
    sync_min_interval: Duration,
    serve_clients: bool,
    client_auth_always: bool,
    crash_guard: Option<CrashGuard>,
    tls: Option<driver::TlsConfig>,
}

impl Default for NodeBuilder {
    fn default() -> Self {
        let protocol = proto::Config::default();
        Self {
            // A free port: an embedded node must not take the agent's (DEFAULT_LISTEN).
            listen: "127.0.0.1:0".to_string(),
            advertise: None,
            join: Vec::new(),
            data_dir: None,
            secret: None,
            name: None,
            cluster: DEFAULT_CLUSTER.to_string(),
            fanout: protocol.fanout,
            gossip_interval: Duration::from_millis(protocol.gossip_interval_ms),
            lease_ttl: DEFAULT_LEASE_TTL,
            lease_per_member: Duration::from_millis(protocol.lease_per_member_ms),
            max_clock_skew: DEFAULT_MAX_CLOCK_SKEW,
            reset_identity: false,
            sync_min_interval: DEFAULT_SYNC_MIN_INTERVAL,
            serve_clients: false,
            client_auth_always: false,
            crash_guard: Some(DEFAULT_CRASH_GUARD),
            tls: None,
        }
    }
}

impl NodeBuilder {
    /// The address to listen on for peers (and clients). Default `127.0.0.1:0`: a free
    /// loopback port ([`Node::url`] says which), so an embedded node never takes the port
    /// of an agent on the same host ([`DEFAULT_LISTEN`]).
    #[must_use]
    pub fn listen(mut self, addr: impl Into<String>) -> Self {
        self.listen = addr.into();
        self
    }

    /// The URL peers dial (default: `ws://` and the bound address).
    #[must_use]
    pub fn advertise(mut self, url: impl Into<String>) -> Self {
        self.advertise = Some(url.into());
        self
    }

    /// Seed URLs to join through (`ws://host:port`).
    #[must_use]
    pub fn join<I, S>(mut self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.join.extend(urls.into_iter().map(Into::into));
        self
    }

    /// Where the replica, the node's identity and its registrations live. Without one the
    /// node is ephemeral: a new identity each start, nothing resumed.
    #[must_use]
    pub fn data_dir(mut self, dir: impl AsRef<Path>) -> Self {
        self.data_dir = Some(dir.as_ref().to_path_buf());
        self
    }

    /// The cluster secret (at least 16 bytes). Without one the node listens on loopback only.
    #[must_use]
    pub fn cluster_secret(mut self, secret: impl Into<Vec<u8>>) -> Self {
        self.secret = Some(SecretBytes(secret.into()));
        self
    }

    /// The node's name, for people (default: `node-<id>`).
    #[must_use]
    pub fn node_name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The cluster's name: nodes of another cluster are refused (default `roster`).
    #[must_use]
    pub fn cluster(mut self, name: impl Into<String>) -> Self {
        self.cluster = name.into();
        self
    }

    /// Peers each push and gossip round goes to (default 3).
    #[must_use]
    pub fn fanout(mut self, n: usize) -> Self {
        self.fanout = n;
        self
    }

    /// The gossip round (default 1 s).
    #[must_use]
    pub fn gossip_interval(mut self, d: Duration) -> Self {
        self.gossip_interval = d;
        self
    }

    /// The shortest lease of this node's registrations and membership (default 30 s): when
    /// the node dies and no peer writes it dead, its registrations disappear this long after
    /// its last renewal. In a larger cluster the lease is longer (see
    /// [`NodeBuilder::lease_per_member`]).
    #[must_use]
    pub fn lease_ttl(mut self, d: Duration) -> Self {
        self.lease_ttl = d;
        self
    }

    /// How much the lease grows per live member this node sees, their count rounded up to a
    /// power of two (default 24 s; at most 24 h in all), so renewals, which reach every
    /// node, cost each node the same at any size. Zero keeps the lease at
    /// [`NodeBuilder::lease_ttl`] whatever the cluster's size.
    #[must_use]
    pub fn lease_per_member(mut self, d: Duration) -> Self {
        self.lease_per_member = d;
        self
    }

    /// How far ahead of this node's clock a peer's clock, and any time in what it sends (a
    /// registration's write, a lease), may be (default 5 s); further is refused, so no
    /// deadline lies further ahead than this plus the longest lease. Expired leases are
    /// collected no sooner than this after their end.
    #[must_use]
    pub fn max_clock_skew(mut self, d: Duration) -> Self {
        self.max_clock_skew = d;
        self
    }

    /// Start under a new identity, keeping the registrations this node owns (default
    /// `false`): the replica, the counter floor and what the node knew of its peers are
    /// forgotten and resynced from peers. The way out of a data directory whose replica
    /// cannot be read (a history poisoned before roster checked what peers send). Has
    /// effect only with a data directory; use it for one start.
    #[must_use]
    pub fn reset_identity(mut self, yes: bool) -> Self {
        self.reset_identity = yes;
        self
    }

    /// The least time between two manual syncs (default 30 s).
    #[must_use]
    pub fn sync_min_interval(mut self, d: Duration) -> Self {
        self.sync_min_interval = d;
        self
    }

    /// Whether to serve `roster` clients on the listener (what `roster agent` does).
    #[must_use]
    pub fn serve_clients(mut self, yes: bool) -> Self {
        self.serve_clients = yes;
        self
    }

    /// The crash-loop guard (default: more than 5 launches in 5 minutes); `None` turns it
    /// off. Launches are counted in the data directory; a node without one never trips it.
    /// Under the guard the node keeps its own registrations and lease, answers reads and
    /// receives deltas, but opens one connection only, takes the long backoff, and sends no
    /// full state unasked, until it has stayed up for the window.
    #[must_use]
    pub fn crash_guard(mut self, guard: Option<CrashGuard>) -> Self {
        self.crash_guard = guard;
        self
    }

    /// Whether clients on loopback must prove the cluster secret too (default: only
    /// clients elsewhere must). Has effect only with a secret.
    #[must_use]
    pub fn require_client_auth(mut self, always: bool) -> Self {
        self.client_auth_always = always;
        self
    }

    /// Mutual TLS from PEM files: this node's certificate chain, its private key, and the
    /// CA that signs every node's certificate. The node then serves `wss://` only (its URL
    /// becomes `wss://`), dials `wss://` peers checking their certificates against the CA,
    /// presents its certificate to the peers it dials, and refuses a peer, or a client not on
    /// loopback, that shows no certificate of that CA.
    #[must_use]
    pub fn tls(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>, ca: impl Into<PathBuf>) -> Self {
        self.tls = Some(driver::TlsConfig {
            cert_pem: cert.into(),
            key_pem: key.into(),
            ca_pem: ca.into(),
        });
        self
    }

    fn check(&self) -> Result<(), Error> {
        if let Some(tls) = &self.tls {
            tls.check().map_err(|e| Error::Invalid(format!("TLS: {e}")))?;
        }
        if self.fanout == 0 || self.fanout > 64 {
            return Err(Error::Invalid(format!(
                "fanout {} is out of range; use 1 to 64",
                self.fanout
            )));
        }
        let gossip = millis(self.gossip_interval);
        if !(10..=60_000).contains(&gossip) {
            return Err(Error::Invalid(format!(
                "gossip interval {:?} is out of range; use 10ms to 60s",
                self.gossip_interval
            )));
        }
        let lease = millis(self.lease_ttl);
        if !(roster_registry::MIN_LEASE_TTL_MS..=roster_registry::MAX_LEASE_TTL_MS).contains(&lease)
            || lease < 3 * gossip
        {
            return Err(Error::Invalid(format!(
                "lease TTL {:?} is out of range; use at least 100ms and 3 gossip intervals, at most 24h",
                self.lease_ttl
            )));
        }
        if millis(self.lease_per_member) > roster_registry::MAX_LEASE_TTL_MS {
            return Err(Error::Invalid(format!(
                "lease per member {:?} is out of range; use 0s (a lease of --lease-ttl at any size) to 24h",
                self.lease_per_member
            )));
        }
        let skew = millis(self.max_clock_skew);
        if !(MIN_CLOCK_SKEW_MS..=MAX_CLOCK_SKEW_MS).contains(&skew) {
            return Err(Error::Invalid(format!(
                "max clock skew {:?} is out of range; use 100ms to 10m",
                self.max_clock_skew
            )));
        }
        if self.join.len() > proto::MAX_SEEDS {
            return Err(Error::Invalid(format!(
                "{} join URLs; give at most {}",
                self.join.len(),
                proto::MAX_SEEDS
            )));
        }
        for url in &self.join {
            if !(url.starts_with("ws://") || url.starts_with("wss://")) || proto::url_endpoint(url).is_err() {
                return Err(Error::Invalid(format!(
                    "join URL {url:?} is not ws://host:port or wss://host:port"
                )));
            }
        }
        Ok(())
    }

    /// Starts the node: opens the data directory, resumes the replica and the node's own
    /// registrations from it, binds the listener and joins the cluster.
    ///
    /// # Errors
    /// [`Error`]; nothing is left running.
    pub async fn start(self) -> Result<Node, Error> {
        self.check()?;
        let secret = self
            .secret
            .clone()
            .map(|s| Secret::new(s.0))
            .transpose()
            .map_err(|e| Error::Invalid(e.to_string()))?;
        if let Some(why) = self.secret.as_ref().and_then(|s| secret_weakness(&s.0)) {
            warn!(
                "the cluster secret {why}: a short or repetitive secret can be guessed offline from one captured proof; \
                 use {STRONG_SECRET_LEN} random bytes (`head -c 32 /dev/urandom | base64 > FILE; chmod 600 FILE`)"
            );
        }
        let listener = TcpListener::bind(&self.listen)
            .await
            .map_err(|source| Error::Listen {
                addr: self.listen.clone(),
                source,
            })?;
        // Refuse what the transport would refuse before the store records a launch.
        let bound = listener.local_addr().map_err(|source| Error::Listen {
            addr: self.listen.clone(),
            source,
        })?;
        if secret.is_none() && !bound.ip().is_loopback() {
            return Err(Error::Start(StartError::Unauthenticated { addr: bound }));
        }
        if secret.is_some() && self.tls.is_none() && !bound.ip().is_loopback() {
            warn!(
                "listening on {bound} without TLS: the cluster secret authenticates each connection's handshake, \
                 but the messages after it are not protected (an on-path attacker can read and alter them); \
                 pass --tls-cert, --tls-key and --tls-ca"
            );
        }
        if bound.ip().is_unspecified() && self.advertise.is_none() {
            return Err(Error::Invalid(format!(
                "listening on {bound} needs --advertise ws://HOST:PORT: peers cannot dial {}",
                bound.ip()
            )));
        }
        if let Some(url) = &self.advertise {
            if self.tls.is_some() != url.starts_with("wss://") {
                return Err(Error::Invalid(format!(
                    "advertise URL {url:?}: a node {} TLS is dialed with {}; fix --advertise",
                    if self.tls.is_some() { "with" } else { "without" },
                    if self.tls.is_some() { "wss://" } else { "ws://" }
                )));
            }
            if !(url.starts_with("ws://") || url.starts_with("wss://")) || proto::url_endpoint(url).is_err() {
                return Err(Error::Invalid(format!(
                    "advertise URL {url:?} is not ws://host:port or wss://host:port; fix --advertise"
                )));
            }
        }
        let new_id = ReplicaId(
            getrandom::u64().map_err(|e| Error::Invalid(format!("no random id from the OS: {e}")))?,
        );
        let now = now_ms();
        let (store, replica, owned, removed, launches) = match &self.data_dir {
            Some(dir) => {
                let dir = dir.clone();
                let reset = self.reset_identity;
                let (store, loaded) = tokio::task::spawn_blocking(move || match reset {
                    true => Store::open_resetting(&dir, new_id, now),
                    false => Store::open(&dir, new_id, now),
                })
                .await
                .map_err(|e| Error::Invalid(format!("the store task failed: {e}")))??;
                for note in &loaded.warnings {
                    warn!("{note}");
                }
                if let Some(old) = loaded.reset_from {
                    warn!(
                        "this node takes the new identity {new_id} (it was {old}), as --reset-identity \
                         asked: it forgot its replica and resyncs it from its peers, and writes its own \
                         registrations again; start it without the flag from now on"
                    );
                }
                let (owned, ended): (Vec<OwnedRecord>, Vec<OwnedRecord>) = loaded
                    .owned
                    .into_iter()
                    .partition(|r| r.expires_at_ms.is_none_or(|t| t > now));
                for r in ended {
                    info!(
                        service = r.service,
                        instance = r.instance,
                        "its ttl passed while the node was down: deregistered"
                    );
                    store.remove_owned(&r.service, &r.instance, now)?;
                }
                (
                    Some(Arc::new(store)),
                    loaded.replica,
                    owned,
                    loaded.removed,
                    (loaded.launches, loaded.memory),
                )
            }
            None => (
                None,
                Replica::new(new_id),
                Vec::new(),
                Vec::new(),
                (vec![now], Vec::new()),
            ),
        };
        let (launches, memory) = launches;
        // What the last process knew of its peers; unreadable memory is only a lost hint.
        let memory: proto::Memory = if memory.is_empty() {
            proto::Memory::default()
        } else {
            postcard::from_bytes(&memory).unwrap_or_else(|e| {
                warn!("ignored the saved peer backoffs: {e}");
                proto::Memory::default()
            })
        };
        let window = self.crash_guard.map_or(Duration::from_secs(300), |g| g.window);
        let since = now.saturating_sub(millis(window));
        let launches_recent = launches.iter().filter(|t| **t >= since).count() as u64;
        let guarded = self
            .crash_guard
            .is_some_and(|g| store.is_some() && launches_recent > u64::from(g.launches));
        let id = replica.id();
        let name = self.name.clone().unwrap_or_else(|| format!("node-{id}"));
        let mut resume = Resume {
            owned: Vec::new(),
            removed,
            drop_unowned: store.is_some(),
            peers: memory.peers,
            seeds: memory.seeds,
            crash_guard: guarded,
            leases_shipped: memory.leases_shipped,
        };
        if guarded {
            warn!(
                launches = launches_recent,
                "crash-loop guard on: more than {} launches within {}; until this process has been up that long it keeps to the essential (one connection, the long backoff, no full state unasked)",
                self.crash_guard.map_or(0, |g| g.launches),
                humantime::format_duration(window)
            );
        }
        let mut owned_map = BTreeMap::new();
        for mut rec in owned {
            // Saved for older builds, which gave each registration a lease of its own: it
            // lives by the node's lease now.
            rec.lease_ttl_ms = millis(self.lease_ttl);
            match rec.parts() {
                Ok((service, provider, endpoint, meta)) => {
                    resume.owned.push(OwnedRegistration {
                        service,
                        provider,
                        endpoint,
                        meta,
                    });
                    owned_map.insert(rec.key(), rec);
                }
                Err(why) => warn!("skipped a saved registration that no longer passes the checks: {why}"),
            }
        }
        let protocol = proto::Config {
            fanout: self.fanout,
            max_outbound: self.fanout,
            gossip_interval_ms: millis(self.gossip_interval),
            member_lease_ttl_ms: millis(self.lease_ttl),
            lease_per_member_ms: millis(self.lease_per_member),
            max_skew_ms: millis(self.max_clock_skew),
            // The grace before collecting an ended lease is at least the allowed skew.
            expire_grace_ms: proto::Config::default()
                .expire_grace_ms
                .max(millis(self.max_clock_skew)),
            ..proto::Config::default()
        };
        let (clients_tx, clients_rx) = mpsc::channel(CLIENT_QUEUE);
        let mut config = DriverConfig::new(self.cluster.clone(), name.clone());
        config.advertise_url = self.advertise.clone();
        config.secret = secret.clone();
        config.protocol = protocol;
        config.resume = resume;
        config.clients = self.serve_clients.then_some(clients_tx);
        config.tls = self.tls.clone();
        let cancel = CancellationToken::new();
        let handle = driver::start(listener, config, replica, self.join.clone(), cancel.clone())?;
        let inner = Arc::new(Inner {
            handle,
            store: std::sync::Mutex::new(store.clone()),
            data_dir: self.data_dir.clone(),
            cancel,
            closed: CancellationToken::new(),
            tasks: TaskTracker::new(),
            lease_ttl_ms: millis(self.lease_ttl),
            sync_min_interval: self.sync_min_interval,
            started: Instant::now(),
            launches_recent,
            guarded: std::sync::atomic::AtomicBool::new(guarded),
            owned: Mutex::new(owned_map),
            queue: std::sync::Mutex::default(),
            secret,
            client_auth_always: self.client_auth_always,
            last_sync: std::sync::Mutex::new(None),
            pending_removals: std::sync::Mutex::new(std::collections::BTreeSet::new()),
        });
        let node = Node { inner };
        if let Some(store) = store {
            node.inner
                .tasks
                .spawn(saver(node.inner.handle.clone(), store, node.inner.cancel.clone()));
        }
        if guarded {
            let weak = Arc::downgrade(&node.inner);
            let cancel = node.inner.cancel.clone();
            node.inner.tasks.spawn(async move {
                tokio::select! {
                    () = cancel.cancelled() => {}
                    () = tokio::time::sleep(window) => {
                        if let Some(inner) = weak.upgrade() {
                            if inner.handle.set_crash_guard(false).await.is_ok() {
                                inner.guarded.store(false, std::sync::atomic::Ordering::Relaxed);
                                info!("crash-loop guard off: up for {}", humantime::format_duration(window));
                            }
                        }
                    }
                }
            });
        }
        node.inner
            .tasks
            .spawn(ttl_keeper(Arc::downgrade(&node.inner), node.inner.cancel.clone()));
        if !self.join.is_empty() {
            node.inner.tasks.spawn(warn_unsynced(
                node.inner.handle.clone(),
                self.join.clone(),
                node.inner.cancel.clone(),
            ));
        }
        if self.serve_clients {
            node.inner.tasks.spawn(crate::server::accept(
                Arc::downgrade(&node.inner),
                clients_rx,
                node.inner.cancel.clone(),
            ));
        }
        // Clients are served from here on, from the replica as loaded; what this returns
        // shows the node's own registrations written again.
        node.inner.handle.resumed().await;
        Ok(node)
    }
}

/// A running roster node, embedded in a service (or run by `roster agent`). Cheap to clone.
#[derive(Debug, Clone)]
pub struct Node {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) handle: Handle,
    /// Taken at shutdown, so the database closes with the node.
    store: std::sync::Mutex<Option<Arc<Store>>>,
    data_dir: Option<PathBuf>,
    cancel: CancellationToken,
    /// Cancelled once [`Node::shutdown`] or [`Node::stop`] has finished.
    closed: CancellationToken,
    tasks: TaskTracker,
    lease_ttl_ms: u64,
    sync_min_interval: Duration,
    started: Instant,
    launches_recent: u64,
    guarded: std::sync::atomic::AtomicBool,
    /// Own registrations by store key; the lock orders writes (disk, then the node).
    owned: Mutex<BTreeMap<String, OwnedRecord>>,
    /// Single registrations waiting for the next commit (see `group`).
    queue: std::sync::Mutex<group::Queue>,
    pub(crate) secret: Option<Secret>,
    pub(crate) client_auth_always: bool,
    /// The last manual sync, for a node without a data directory.
    last_sync: std::sync::Mutex<Option<u64>>,
    /// Own keys whose `ttl` passed and that are out of the cluster, but still on disk
    /// because the store could not write (see `unsaved`).
    pending_removals: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

/// Saves the replica after changes, in batches (group commit). After a failed write it
/// reopens the store on its backoff, and saves what is unsaved once it can.
async fn saver(handle: Handle, store: Arc<Store>, cancel: CancellationToken) {
    let mut rx = handle.watch_replica();
    let mut interval = SAVE_INTERVAL;
    let mut saved_memory: Vec<u8> = Vec::new();
    // A change the last save attempt did not write.
    let mut unsaved = false;
    loop {
        let replica_changed = tokio::select! {
            () = cancel.cancelled() => return,
            r = rx.changed() => {
                if r.is_err() {
                    return;
                }
                true
            }
            () = tokio::time::sleep(MEMORY_CHECK) => false,
        };
        unsaved |= replica_changed;
        if store.health().is_some() {
            // Closed after a failed write (the store logged it): nothing is written until
            // it reopens on its backoff; then the save below is the write that proves it.
            let s = Arc::clone(&store);
            match tokio::task::spawn_blocking(move || s.reopen_if_due()).await {
                Ok(Some(false)) | Err(_) => continue,
                Ok(_) => unsaved = true,
            }
        }
        if unsaved {
            if replica_changed {
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep(interval) => {}
                }
            }
            rx.borrow_and_update();
            let started = Instant::now();
            match save_changes(&handle, &store).await {
                Ok(()) => unsaved = false,
                Err(StoreError::Unwritable { .. }) => continue,
                Err(e) => warn!("could not save the replica: {e}"),
            }
            interval = (started.elapsed() * SAVE_COST_FACTOR).max(SAVE_INTERVAL);
        }
        // Backoffs change without the replica changing (a dial that fails): save them
        // when they differ from what is on disk, so the next process honours them.
        let Ok(memory) = handle.inspect(|n, _| n.memory()).await else {
            return;
        };
        let Ok(bytes) = postcard::to_stdvec(&memory) else {
            continue;
        };
        if bytes != saved_memory {
            let store = Arc::clone(&store);
            let b = bytes.clone();
            match tokio::task::spawn_blocking(move || store.save_memory(&b)).await {
                Ok(Ok(())) => saved_memory = bytes,
                Ok(Err(StoreError::Unwritable { .. })) => {}
                Ok(Err(e)) => warn!("could not save the peer backoffs: {e}"),
                Err(e) => warn!("the save task failed: {e}"),
            }
        }
    }
}

/// Saves the latest replica snapshot: the entries changed since the last save, and the
/// context. Keys it could not write are given back, to be written by the next save.
async fn save_changes(handle: &Handle, store: &Arc<Store>) -> Result<(), StoreError> {
    let (replica, changed) = handle.take_unsaved();
    // Kept here too: a save task that panicked must not lose them.
    let kept = changed.clone();
    let s = Arc::clone(store);
    let saved = tokio::task::spawn_blocking(move || s.save_replica(&replica, &changed, false))
        .await
        .unwrap_or_else(|e| {
            Err(StoreError::Io {
                path: store.path().to_path_buf(),
                why: format!("the save task failed: {e}"),
            })
        });
    if saved.is_err() {
        handle.give_back_unsaved(kept);
    }
    saved
}

/// How long after its start a node with seeds says it has reached none, and then how
/// often it says so again while that lasts.
const UNSYNCED_WARN_AFTER: Duration = Duration::from_secs(10);
const UNSYNCED_WARN_EVERY: Duration = Duration::from_secs(300);

/// Logs a warning while the node has caught up with no peer: its seeds are all
/// unreachable (a wrong `--join`, agents not started, a secret or TLS mismatch), and its
/// reads show only what it had on disk.
async fn warn_unsynced(handle: Handle, seeds: Vec<String>, cancel: CancellationToken) {
    let mut wait = UNSYNCED_WARN_AFTER;
    let mut waited = Duration::ZERO;
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = handle.synced() => return,
            () = tokio::time::sleep(wait) => {}
        }
        waited += wait;
        warn!(
            "no peer reached {} after the start: none of the seeds ({}) answered; reads show only what this node had on disk; still trying: check --join, that those agents run, and the cluster secret or TLS files",
            humantime::format_duration(waited),
            seeds.join(", ")
        );
        wait = UNSYNCED_WARN_EVERY;
    }
}

/// Ends own registrations whose `ttl` passed without a new `register`.
async fn ttl_keeper(inner: std::sync::Weak<Inner>, cancel: CancellationToken) {
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(TTL_CHECK) => {}
        }
        let Some(inner) = inner.upgrade() else { return };
        let node = Node { inner };
        node.save_pending_removals().await;
        let now = now_ms();
        let due: Vec<(String, String)> = node
            .inner
            .owned
            .lock()
            .await
            .values()
            .filter(|r| r.expires_at_ms.is_some_and(|t| t <= now))
            .map(|r| (r.service.clone(), r.instance.clone()))
            .collect();
        for (service, instance) in due {
            info!(
                service,
                instance, "registration TTL passed without a new register: deregistering"
            );
            node.expire(&service, &instance).await;
        }
    }
}

impl Inner {
    fn store(&self) -> Option<Arc<Store>> {
        self.store.lock().ok().and_then(|s| s.clone())
    }
}

impl Node {
    /// How to start a node.
    pub fn builder() -> NodeBuilder {
        NodeBuilder::default()
    }

    /// This node's id (16 hex digits).
    pub fn id(&self) -> String {
        self.inner.handle.info().id.to_string()
    }

    /// This node's name.
    pub fn name(&self) -> &str {
        &self.inner.handle.info().name
    }

    /// The URL peers (and clients) reach this node at.
    pub fn url(&self) -> &str {
        &self.inner.handle.info().url
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.inner.handle.local_addr()
    }

    /// The data directory, if any.
    pub fn data_dir(&self) -> Option<&Path> {
        self.inner.data_dir.as_deref()
    }

    /// The transport's handle (counters, the raw replica).
    pub fn transport(&self) -> &Handle {
        &self.inner.handle
    }

    fn default_instance(&self, service: &str) -> String {
        let raw = format!("{service}-{}", self.name());
        let mut id: String = raw
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':' | '@') {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        id.truncate(roster_registry::MAX_PROVIDER_ID_LEN);
        id
    }

    fn record(&self, s: &Service) -> Result<OwnedRecord, Error> {
        let instance = s.id.clone().unwrap_or_else(|| self.default_instance(&s.name));
        if let Some(t) = s.ttl {
            check_ttl(t).map_err(Error::Invalid)?;
        }
        roster_registry::metadata_from_pairs(&s.meta).map_err(|e| Error::Invalid(e.to_string()))?;
        let ttl = s.ttl.map(millis);
        let now = now_ms();
        let rec = OwnedRecord {
            service: s.name.clone(),
            instance,
            address: s.address.clone(),
            meta: s.meta.clone(),
            lease_ttl_ms: self.inner.lease_ttl_ms,
            registered_at_ms: now,
            expires_at_ms: ttl.map(|t| now.saturating_add(t)),
        };
        if rec.service == MEMBERS_SERVICE {
            return Err(Error::Invalid(format!(
                "the service name {MEMBERS_SERVICE:?} is reserved for roster's members; pick another"
            )));
        }
        rec.parts().map_err(Error::Invalid)?;
        Ok(rec)
    }

    /// Registers an instance this node owns and keeps alive until it is deregistered (or
    /// its `ttl` passes). The registration is on disk when this returns, and peers hear of
    /// it within milliseconds. Dropping the returned handle deregisters it; call
    /// [`Registration::keep`] to keep it registered past the handle.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a bad name, address or metadata; [`Error::Store`];
    /// [`Error::Stopped`]. Nothing changed.
    pub async fn register(&self, service: Service) -> Result<Registration, Error> {
        let rec = self.record(&service)?;
        let (service, instance) = (rec.service.clone(), rec.instance.clone());
        self.put(rec).await?;
        Ok(Registration {
            node: self.clone(),
            service,
            instance,
            armed: true,
        })
    }

    /// Registers as [`Node::register`] without a handle: it stays until
    /// [`Node::deregister`]. Returns the instance id.
    ///
    /// # Errors
    /// As [`Node::register`].
    pub async fn register_owned(&self, service: Service) -> Result<String, Error> {
        let rec = self.record(&service)?;
        let instance = rec.instance.clone();
        self.put(rec).await?;
        Ok(instance)
    }

    /// Refuses an instance id that another live node has registered: two nodes keeping the
    /// same instance alive would each take it from the other. The instance is free once
    /// its owner deregisters it, or its owner's lease ends.
    fn not_owned_elsewhere(&self, service: &ServiceName, provider: &ProviderId) -> Result<(), Error> {
        let me = self.inner.handle.info().id;
        let replica = self.inner.handle.replica();
        let now = now_ms();
        let key = roster_registry::RegKey {
            service: service.clone(),
            provider: provider.clone(),
        };
        let Some(owner) = replica.visible(&key, now).map(|i| i.node()).filter(|n| *n != me) else {
            return Ok(());
        };
        let Ok(members) = ServiceName::new(MEMBERS_SERVICE) else {
            return Ok(());
        };
        let member = replica
            .instances(&members, now)
            .find(|i| i.provider.as_str() == format!("node-{owner}"));
        match member {
            Some(m) => {
                let name = m.registration.meta.get("name").unwrap_or_default();
                let url = m.registration.meta.get("url").unwrap_or_default();
                Err(Error::OwnedElsewhere(format!(
                    "instance {service}/{provider} is registered by node {name} ({owner}, {url}); \
                     deregister it there first, or pick another --id"
                )))
            }
            None => Ok(()),
        }
    }

    /// Removes an instance this node owns (from disk first, then from the cluster).
    ///
    /// # Errors
    /// [`Error::NotFound`] when this node owns no such instance; [`Error::Store`];
    /// [`Error::Stopped`].
    pub async fn deregister(&self, service: &str, instance: &str) -> Result<(), Error> {
        let mut owned = self.inner.owned.lock().await;
        let key = format!("{service}/{instance}");
        if !owned.contains_key(&key) {
            return Err(Error::NotFound(format!(
                "this node owns no instance {instance:?} of {service:?}; `roster get {service}` lists them"
            )));
        }
        if let Some(store) = self.inner.store() {
            let (s, i) = (service.to_string(), instance.to_string());
            tokio::task::spawn_blocking(move || store.remove_owned(&s, &i, now_ms()))
                .await
                .map_err(|e| Error::Invalid(format!("the store task failed: {e}")))??;
        }
        owned.remove(&key);
        let (Ok(s), Ok(p)) = (ServiceName::new(service), ProviderId::new(instance)) else {
            return Ok(());
        };
        self.inner.handle.deregister(s, p).await?;
        Ok(())
    }

    /// The live instances of `service`, from the local replica (no network), sorted by id.
    pub fn lookup(&self, service: &str) -> Vec<Instance> {
        let Ok(name) = ServiceName::new(service) else {
            return Vec::new();
        };
        let replica = self.inner.handle.replica();
        replica
            .instances(&name, now_ms())
            .map(|i| Instance::from_registry(&i.to_owned()))
            .collect()
    }

    /// Services with live instances, and how many, from the local replica.
    pub fn services(&self) -> Vec<(String, usize)> {
        self.inner
            .handle
            .replica()
            .services(now_ms())
            .into_iter()
            .filter(|(s, _)| s.as_str() != MEMBERS_SERVICE)
            .map(|(s, n)| (s.as_str().to_string(), n))
            .collect()
    }

    /// The instances of `service` now (as `Up` events), then every change as it arrives:
    /// pushed by peers, no polling. A watch that falls behind re-reads the replica and
    /// reports the difference, so it never misses a final state.
    pub fn watch(&self, service: &str) -> Watch {
        self.watch_from(service, &BTreeMap::new())
    }

    /// As [`Node::watch`], for a watcher that already shows `shown` (instance id to the
    /// [`crate::api::fingerprint`] of its address and metadata): first an `Up` for each
    /// instance new or changed since, and a `Down` for each one gone, then every change.
    pub(crate) fn watch_from(&self, service: &str, shown: &BTreeMap<String, u64>) -> Watch {
        let rx = self.inner.handle.subscribe();
        let name = ServiceName::new(service).ok();
        let mut known = BTreeMap::new();
        let mut pending = VecDeque::new();
        if let Some(name) = &name {
            let replica = self.inner.handle.replica();
            for i in replica.instances(name, now_ms()) {
                let i = Instance::from_registry(&i.to_owned());
                known.insert(i.id.clone(), i.clone());
                // The fingerprint of what a client shows: the view it was sent.
                let v = i.view();
                if shown.get(&i.id) != Some(&crate::api::fingerprint(&v.address, &v.meta)) {
                    pending.push_back(Event::Up(i));
                }
            }
            for id in shown.keys().filter(|id| !known.contains_key(*id)) {
                pending.push_back(Event::Down {
                    service: service.to_string(),
                    id: id.clone(),
                    address: String::new(),
                });
            }
        }
        let state = WatchState {
            node: self.clone(),
            rx,
            name,
            known,
            pending,
        };
        Watch {
            inner: Box::pin(futures_util::stream::unfold(state, |mut st| async move {
                let e = st.next().await?;
                Some((e, st))
            })),
        }
    }

    /// The nodes of the cluster: live members (alive, or suspect when their renewal is
    /// late) and nodes lost lately (gone).
    ///
    /// # Errors
    /// [`Error::Stopped`].
    pub async fn members(&self) -> Result<Vec<MemberView>, Error> {
        let me = self.inner.handle.info().clone();
        let known = self.inner.handle.inspect(|n, _| n.known_peers()).await?;
        let replica = self.inner.handle.replica();
        let now = now_ms();
        let mut out = Vec::new();
        let mut live = std::collections::BTreeSet::new();
        let Ok(members) = ServiceName::new(MEMBERS_SERVICE) else {
            return Ok(out);
        };
        for i in replica.instances(&members, now) {
            let Some(id) = i.provider.as_str().strip_prefix("node-") else {
                continue;
            };
            live.insert(id.to_string());
            let heard = now.saturating_sub(i.lease.issued.millis());
            let is_me = id == me.id.to_string();
            let late = heard > i.lease.ttl_ms * 2 / 3;
            out.push(MemberView {
                node: id.to_string(),
                name: i.registration.meta.get("name").unwrap_or_default().to_string(),
                address: i.registration.meta.get("url").unwrap_or_default().to_string(),
                state: if late && !is_me { "suspect" } else { "alive" }.to_string(),
                last_heard_ms: if is_me { 0 } else { heard },
            });
        }
        for p in known {
            let id = p.id.to_string();
            if live.contains(&id) {
                continue;
            }
            out.push(MemberView {
                node: id,
                name: p.name.unwrap_or_default(),
                address: p.url.unwrap_or_default(),
                state: "gone".to_string(),
                last_heard_ms: now.saturating_sub(p.last_seen_ms),
            });
        }
        out.sort_by(|a, b| (a.name.as_str(), a.node.as_str()).cmp(&(b.name.as_str(), b.node.as_str())));
        Ok(out)
    }

    /// This node: identity, uptime, peers, launches and counters.
    ///
    /// # Errors
    /// [`Error::Stopped`].
    pub async fn status(&self) -> Result<StatusView, Error> {
        let info = self.inner.handle.info().clone();
        let names: BTreeMap<String, (String, String)> = self
            .members()
            .await?
            .into_iter()
            .map(|m| (m.node, (m.name, m.address)))
            .collect();
        let mut peers: Vec<PeerView> = self
            .inner
            .handle
            .connected()
            .into_iter()
            .map(|(id, outbound)| {
                let id = id.to_string();
                let (name, address) = names.get(&id).cloned().unwrap_or_default();
                PeerView {
                    node: id,
                    name,
                    address,
                    direction: if outbound { "outbound" } else { "inbound" }.to_string(),
                }
            })
            .collect();
        peers.sort_by(|a, b| a.node.cmp(&b.node));
        let services = self.services();
        let c = self.inner.handle.counters();
        Ok(StatusView {
            node: info.id.to_string(),
            name: info.name.clone(),
            address: info.url.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            uptime_ms: millis(self.inner.started.elapsed()),
            peers,
            launches_recent: self.inner.launches_recent,
            crash_guard: self.inner.guarded.load(std::sync::atomic::Ordering::Relaxed),
            data_dir: self.inner.data_dir.as_ref().map(|d| d.display().to_string()),
            services: services.len() as u64,
            instances: services.iter().map(|(_, n)| *n as u64).sum(),
            store: self.store_health().map(|h| crate::api::StoreView {
                since_ms: h.since_ms,
                last_error: h.last_error,
                failures: h.failures,
                next_retry_ms: h.next_retry_ms,
            }),
            synced: self.inner.handle.is_synced(),
            counters: CountersView {
                connections_opened: c.protocol.dials,
                connections_accepted: c
                    .driver
                    .inbound_accepted
                    .saturating_sub(c.driver.clients_accepted),
                frames_sent: c.driver.frames_sent,
                bytes_sent: c.driver.bytes_sent,
                frames_received: c.driver.frames_received,
                bytes_received: c.driver.bytes_received,
                deltas_applied: c.protocol.deltas_applied,
                full_syncs_sent: c.protocol.full_syncs_sent,
                full_syncs_received: c.protocol.full_syncs_received,
                states_refused: c.protocol.states_refused,
                forgeries_refuted: c.protocol.forgeries_refuted,
                overwrites_repaired: c.protocol.overwrites_repaired,
                deaths_written: c.protocol.deaths_written,
                deaths_refuted: c.protocol.deaths_refuted,
            },
        })
    }

    /// Where a registration came from: its writes (dot, node, time), its lease, and which
    /// peers have acknowledged the winning write.
    ///
    /// # Errors
    /// [`Error::NotFound`] when the replica holds nothing under that name;
    /// [`Error::Stopped`].
    pub async fn explain(&self, service: &str, instance: &str) -> Result<ExplainView, Error> {
        let not_found = || {
            Error::NotFound(format!(
                "no registration {instance:?} of {service:?} here; `roster get {service}` lists the live ones"
            ))
        };
        let (Ok(s), Ok(p)) = (ServiceName::new(service), ProviderId::new(instance)) else {
            return Err(not_found());
        };
        let replica = self.inner.handle.replica();
        let now = now_ms();
        let prov = replica.explain(&s, &p, now).ok_or_else(not_found)?;
        let names: BTreeMap<String, String> = self
            .members()
            .await?
            .into_iter()
            .map(|m| (m.node, m.name))
            .collect();
        let winner = prov.winner.clone();
        let acked = match winner.clone() {
            Some(d) => self.inner.handle.inspect(move |n, _| n.acknowledged(&d)).await?,
            None => Vec::new(),
        };
        let dot = |d: &roster_registry::Dot| format!("{}:{}", d.actor, d.counter);
        Ok(ExplainView {
            service: service.to_string(),
            instance: instance.to_string(),
            live: prov.live,
            winner: winner.as_ref().map(dot),
            writes: prov
                .writes
                .iter()
                .map(|(d, r)| WriteView {
                    dot: dot(d),
                    node: d.actor.to_string(),
                    node_name: names.get(&d.actor.to_string()).cloned().unwrap_or_default(),
                    written_ms: r.written.millis(),
                    written_logical: r.written.logical(),
                    address: r.endpoint.to_string(),
                    lease_dot: dot(&r.lease_dot),
                })
                .collect(),
            // The lease the winning write lives by: that of the node that wrote it.
            lease: prov
                .leases
                .iter()
                .filter(|(d, _)| prov.winner.as_ref().is_some_and(|w| w.actor == d.actor))
                .max_by_key(|(_, l)| l.issued)
                .map(|(d, l)| (dot(d), l.issued.millis(), l.deadline_ms())),
            acknowledged_by: acked
                .into_iter()
                .map(|id| {
                    let id = id.to_string();
                    match names.get(&id) {
                        Some(n) if !n.is_empty() => format!("{n} ({id})"),
                        _ => id,
                    }
                })
                .collect(),
        })
    }

    /// Asks a peer for an anti-entropy round now, at most once per `sync_min_interval`
    /// (the last run is saved on disk, so a restart does not reset the throttle).
    /// Returns whether a peer was connected to ask.
    ///
    /// # Errors
    /// [`Error::Throttled`] with when it may run next; [`Error::Stopped`].
    pub async fn sync(&self) -> Result<bool, Error> {
        let now = now_ms();
        let store = self.inner.store();
        let in_memory = self.inner.last_sync.lock().ok().and_then(|l| *l);
        let last = match &store {
            Some(store) => store.last_run("sync")?.max(in_memory),
            None => in_memory,
        };
        let min = millis(self.inner.sync_min_interval);
        if let Some(last) = last {
            let next = last.saturating_add(min);
            if next > now {
                let wait = Duration::from_millis(next - now);
                return Err(Error::Throttled {
                    message: format!(
                        "a sync ran {} ago; the next may run in {} (--sync-min-interval {})",
                        humantime::format_duration(Duration::from_millis((now - last) / 1000 * 1000)),
                        humantime::format_duration(Duration::from_millis(
                            wait.as_millis().div_ceil(1000) as u64 * 1000
                        )),
                        humantime::format_duration(self.inner.sync_min_interval),
                    ),
                    retry_after: wait,
                });
            }
        }
        let asked = self.inner.handle.sync_now().await?;
        // Only a sync that asked a peer counts against the throttle.
        if asked {
            if let Ok(mut l) = self.inner.last_sync.lock() {
                *l = Some(now);
            }
            if let Some(store) = &store {
                store.set_last_run("sync", now)?;
            }
        }
        Ok(asked)
    }

    /// Leaves the cluster gracefully: deregisters what this node owns (peers drop it at
    /// once), pushes every change peers lack, says goodbye, flushes, and saves the
    /// replica. Every registration this node owned stays on disk (only `deregister`, a
    /// dropped handle or a passed `ttl` removes one) and is registered again at the next
    /// start with the same data directory. Watches end. To restart without peers seeing
    /// a departure, [`Node::stop`].
    ///
    /// # Errors
    /// [`Error::Store`] when the last save failed.
    pub async fn shutdown(&self) -> Result<(), Error> {
        self.close(true).await
    }

    /// Stops to start again (an upgrade, a restart): as [`Node::shutdown`], but nothing
    /// is deregistered. Peers keep this node and its registrations for the rest of its
    /// lease, so a restart with the same data directory within it shows them no change;
    /// a node that does not come back lapses with its lease.
    ///
    /// # Errors
    /// [`Error::Store`] when the last save failed.
    pub async fn stop(&self) -> Result<(), Error> {
        self.close(false).await
    }

    async fn close(&self, leave: bool) -> Result<(), Error> {
        if leave {
            self.inner.handle.shutdown().await;
        } else {
            self.inner.handle.stop().await;
        }
        self.inner.cancel.cancel();
        self.inner.tasks.close();
        self.inner.tasks.wait().await;
        let saved = self.save_last().await;
        self.inner.closed.cancel();
        saved
    }

    /// The last save, at a shutdown.
    async fn save_last(&self) -> Result<(), Error> {
        let store = self.inner.store.lock().ok().and_then(|mut s| s.take());
        if let Some(store) = store {
            let (replica, changed) = self.inner.handle.take_unsaved();
            // One more try after a failure, whatever the backoff.
            store.retry_now();
            tokio::task::spawn_blocking(move || store.save_replica(&replica, &changed, true))
                .await
                .map_err(|e| Error::Invalid(format!("the store task failed: {e}")))??;
        }
        Ok(())
    }

    /// Whether this node has caught up with a peer since it started: it held everything a
    /// peer held at some moment (its registrations, the members), so reads answer as the
    /// cluster would. True at once for a node with no seeds (`join`). See [`Node::synced`].
    pub fn is_synced(&self) -> bool {
        self.inner.handle.is_synced()
    }

    /// Waits up to `within` for [`Node::is_synced`], and says whether it came: a service
    /// that must not answer from an empty registry waits for this after `start()`. False
    /// when no seed was reached in time (the node goes on trying) or the node stopped.
    pub async fn synced(&self, within: Duration) -> bool {
        tokio::time::timeout(within, self.inner.handle.synced())
            .await
            .is_ok()
            && self.is_synced()
    }

    /// Resolves once [`Node::shutdown`] or [`Node::stop`] has finished, whoever called it
    /// (a client's `Leave` request, say).
    pub async fn closed(&self) {
        self.inner.closed.cancelled().await;
    }

    /// `None` while the data directory can be written (or the node has none). After a write
    /// failed (a full disk, say): since when, the last error, and when the node next tries
    /// to reopen it. Meanwhile changes (`register`, `deregister`) fail and change nothing;
    /// reads and replication go on.
    pub fn store_health(&self) -> Option<StoreHealth> {
        self.inner.store().and_then(|s| s.health())
    }

    /// Whether the node has stopped.
    pub fn is_stopped(&self) -> bool {
        self.inner.handle.is_stopped()
    }
}

/// An instance this node keeps registered. Dropping it deregisters the instance (in the
/// background); [`Registration::deregister`] does it and waits; [`Registration::keep`]
/// leaves it registered.
#[derive(Debug)]
#[must_use = "dropping a Registration deregisters the instance at once: keep the handle, or call .keep()"]
pub struct Registration {
    node: Node,
    service: String,
    instance: String,
    armed: bool,
}

impl Registration {
    /// The instance id.
    pub fn id(&self) -> &str {
        &self.instance
    }

    /// The service.
    pub fn service(&self) -> &str {
        &self.service
    }

    /// Deregisters the instance and waits until it is off disk and applied by the node; the
    /// push to connected peers follows at once (batched with others under a burst).
    ///
    /// # Errors
    /// As [`Node::deregister`].
    pub async fn deregister(mut self) -> Result<(), Error> {
        self.armed = false;
        self.node.deregister(&self.service, &self.instance).await
    }

    /// Keeps the instance registered after this handle is dropped (until
    /// [`Node::deregister`]); it is registered again at every start.
    pub fn keep(mut self) {
        self.armed = false;
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if !self.armed || self.node.is_stopped() {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let node = self.node.clone();
            let (s, i) = (
                std::mem::take(&mut self.service),
                std::mem::take(&mut self.instance),
            );
            rt.spawn(async move {
                if let Err(e) = node.deregister(&s, &i).await {
                    warn!(
                        service = s,
                        instance = i,
                        "dropped registration not deregistered: {e}"
                    );
                }
            });
        }
    }
}

struct WatchState {
    node: Node,
    rx: broadcast::Receiver<Change>,
    name: Option<ServiceName>,
    known: BTreeMap<String, Instance>,
    pending: VecDeque<Event>,
}

impl WatchState {
    async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(e) = self.pending.pop_front() {
                return Some(e);
            }
            let name = self.name.clone()?;
            let handle = self.node.inner.handle.clone();
            let received = tokio::select! {
                r = self.rx.recv() => r,
                () = handle.stopped() => return None,
            };
            match received {
                Ok(Change::Up(i)) if i.service == name => {
                    let i = Instance::from_registry(&i);
                    if self.known.get(&i.id) != Some(&i) {
                        self.known.insert(i.id.clone(), i.clone());
                        return Some(Event::Up(i));
                    }
                }
                Ok(Change::Down { service, provider }) if service == name => {
                    if let Some(gone) = self.known.remove(provider.as_str()) {
                        return Some(Event::Down {
                            service: service.as_str().to_string(),
                            id: provider.as_str().to_string(),
                            address: gone.address,
                        });
                    }
                }
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => self.resync(&name),
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }

    /// After falling behind: report the difference between what this watch showed and the
    /// replica now.
    fn resync(&mut self, name: &ServiceName) {
        let replica = self.node.inner.handle.replica();
        let now: BTreeMap<String, Instance> = replica
            .instances(name, now_ms())
            .map(|i| {
                let i = Instance::from_registry(&i.to_owned());
                (i.id.clone(), i)
            })
            .collect();
        for (id, gone) in &self.known {
            if !now.contains_key(id) {
                self.pending.push_back(Event::Down {
                    service: name.as_str().to_string(),
                    id: id.clone(),
                    address: gone.address.clone(),
                });
            }
        }
        for (id, i) in &now {
            if self.known.get(id) != Some(i) {
                self.pending.push_back(Event::Up(i.clone()));
            }
        }
        self.known = now;
    }
}

/// The changes of one service: a [`Stream`] of [`Event`]s. See [`Node::watch`].
pub struct Watch {
    inner: Pin<Box<dyn Stream<Item = Event> + Send>>,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Watch")
    }
}

impl Watch {
    /// The next change; `None` when the node stopped.
    pub async fn recv(&mut self) -> Option<Event> {
        futures_util::StreamExt::next(self).await
    }
}

impl Stream for Watch {
    type Item = Event;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        self.inner.as_mut().poll_next(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_builders_debug_output_never_shows_the_secret() {
        let secret = "correct-horse-battery-staple-0123456789";
        let shown = format!("{:?}", Node::builder().cluster_secret(secret));
        assert!(!shown.contains(secret), "{shown}");
        // Nor its bytes as numbers, as a derived Debug of a Vec<u8> would print them.
        let as_numbers = format!("{:?}", &secret.as_bytes()[..4]);
        assert!(!shown.contains(as_numbers.trim_matches(['[', ']'])), "{shown}");
        assert!(shown.contains("redacted"), "{shown}");
    }

    #[test]
    fn short_or_repetitive_secrets_are_called_weak_and_random_ones_are_not() {
        assert!(secret_weakness(b"sixteen-bytes-or-more")
            .unwrap()
            .contains("21 bytes"));
        assert!(secret_weakness(&[b'a'; 64]).unwrap().contains("1 distinct"));
        assert!(secret_weakness(b"passwordpasswordpasswordpassword").is_some());
        // 32 random bytes in base64 (as the docs say to make one), and in hex.
        assert_eq!(
            secret_weakness(b"q8Vw0yU3kq2m9Hc7r1XfLZb0pQe5T4nJ6sYdGa2uWkE="),
            None
        );
        assert_eq!(
            secret_weakness(b"3f9a0c27d1e84b6f5a2c9e07b3d14f68a9c2e5071b3d4f6e8a0c2e4f6a8b0c1d"),
            None
        );
    }
}
