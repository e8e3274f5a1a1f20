//! The embedded node: [`Node::builder`] starts one, [`Node::register`] keeps an instance
//! registered, [`Node::lookup`] and [`Node::watch`] read the local replica.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use roster_registry::{Health, ProviderId, ServiceName, Status};
use roster_transport::driver::{DriverError, Handle, StartError};
use roster_transport::handshake::Secret;
use roster_transport::proto::{self, MEMBERS_SERVICE};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::api::{CountersView, ExplainView, InstanceView, MemberView, PeerView, StatusView, WriteView};
use crate::check::Check;
use crate::store::{OwnedRecord, Store, StoreError, StoreHealth};

mod builder;
mod bulk;
#[cfg(test)]
mod bulk_tests;
mod checks;
#[cfg(test)]
mod disk_tests;
mod group;
#[cfg(test)]
mod group_tests;
mod health;
#[cfg(test)]
mod health_tests;

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
mod registration;
mod tasks;
mod unsaved;
mod watch;

pub use builder::NodeBuilder;
pub use registration::Registration;
pub use watch::Watch;

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
    /// A task of the node (a disk write run off the async threads) panicked or was cancelled:
    /// a bug, not bad input. Nothing it was doing is known to have happened.
    #[error("a task of the node failed: {0}; this is a bug in roster, please report it")]
    TaskFailed(String),
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
    checks: Vec<Check>,
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
            checks: Vec::new(),
        }
    }

    /// Adds a health check, run by this node while it owns the registration (at most
    /// [`crate::check::MAX_CHECKS`]). An instance with checks starts critical (not served)
    /// until its first probe passes; its status is the worst of its checks'.
    #[must_use]
    pub fn check(mut self, check: Check) -> Self {
        self.checks.push(check);
        self
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
    /// How it is doing: [`Node::lookup`] returns passing and warning instances only.
    pub status: Health,
    /// Why (a check's output, a maintenance reason); empty when there is nothing to say.
    pub note: String,
    /// The node that registered it (16 hex digits).
    pub node: String,
    /// When it was first registered (kept across updates and its node's restarts).
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
            status: i.status.health,
            note: i.status.note.clone(),
            node: i.node.to_string(),
            registered_at: at(i.since_ms),
            lease_expires_at: at(i.lease_deadline_ms),
        }
    }

    /// Whether a read returns it unless asked for every instance.
    pub fn is_served(&self) -> bool {
        self.status.is_served()
    }

    /// Whether `other` shows the same to a reader: address, metadata and status (not the
    /// lease, which moves with every renewal of its node).
    pub(crate) fn shows_as(&self, other: &Instance) -> bool {
        (&self.address, &self.meta, self.status, &self.note)
            == (&other.address, &other.meta, other.status, &other.note)
    }

    pub(crate) fn view(&self) -> InstanceView {
        InstanceView {
            service: self.service.clone(),
            instance: self.id.clone(),
            address: self.address.clone(),
            meta: self.meta.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            status: self.status.as_str().to_string(),
            note: self.note.clone(),
            node: self.node.clone(),
            registered_at_ms: ms(self.registered_at),
            lease_expires_at_ms: ms(self.lease_expires_at),
        }
    }
}

/// How a node of the cluster is doing, as this node sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberState {
    /// Its lease is live and renewed on time.
    Alive,
    /// Its lease is live, but its renewal is late.
    Suspect,
    /// Lost lately: its lease ended, or it was written dead, or it left.
    Gone,
}

impl MemberState {
    /// The name, as `roster members` shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Alive => "alive",
            Self::Suspect => "suspect",
            Self::Gone => "gone",
        }
    }
}

/// A node of the cluster, as [`Node::members`] returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its id (16 hex digits).
    pub node: String,
    /// Its name.
    pub name: String,
    /// Its URL.
    pub address: String,
    /// How it is doing.
    pub state: MemberState,
    /// How long ago it was last heard of.
    pub last_heard: Duration,
}

impl Member {
    pub(crate) fn view(&self) -> MemberView {
        MemberView {
            node: self.node.clone(),
            name: self.name.clone(),
            address: self.address.clone(),
            state: self.state.as_str().to_string(),
            last_heard_ms: ms_of(self.last_heard),
        }
    }
}

fn ms_of(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A change a watch sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The instance is up: new to the watch, or its address or metadata changed.
    Up(Instance),
    /// Only the instance's status (or its note) changed, and it is still shown.
    Status(Instance),
    /// The instance is down: deregistered, its lease ended, or no longer served (critical
    /// or in maintenance, for a watch of served instances).
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
    /// Whether exec health checks run here.
    exec_checks: bool,
    /// The checks running, by instance key.
    checks: checks::Checks,
    /// The last manual sync, for a node without a data directory.
    last_sync: std::sync::Mutex<Option<u64>>,
    /// Own keys whose `ttl` passed and that are out of the cluster, but still on disk
    /// because the store could not write (see `unsaved`).
    pending_removals: std::sync::Mutex<std::collections::BTreeSet<String>>,
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
        if s.checks.len() > crate::check::MAX_CHECKS {
            return Err(Error::Invalid(format!(
                "{} checks, more than the {} one registration may have",
                s.checks.len(),
                crate::check::MAX_CHECKS
            )));
        }
        for c in &s.checks {
            c.validate(self.inner.exec_checks).map_err(Error::Invalid)?;
        }
        let status = if s.checks.is_empty() {
            Status::passing()
        } else {
            Status::new(Health::Critical, "waiting for its first check")
        };
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
            status,
            maintenance: None,
            checks: s.checks.clone(),
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
        let member = proto::live_members(&replica, now)
            .into_iter()
            .find(|m| m.id == owner);
        match member {
            Some(m) => {
                let (name, url) = (m.name, m.url.unwrap_or_default());
                Err(Error::OwnedElsewhere(format!(
                    "instance {service}/{provider} is registered by node {name} ({owner}, {url}); \
                     deregister it there first, or pick another --id"
                )))
            }
            None => Ok(()),
        }
    }

    /// Removes an instance this node owns (from disk first, then from the cluster), and
    /// returns once the removal was handed to the connection of every connected peer (see
    /// [`Registration::deregister`]).
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
                .map_err(|e| Error::TaskFailed(format!("the store task: {e}")))??;
        }
        owned.remove(&key);
        self.stop_checks(&key);
        let (Ok(s), Ok(p)) = (ServiceName::new(service), ProviderId::new(instance)) else {
            return Ok(());
        };
        self.inner.handle.deregister(s, p).await?;
        // Writes go on meanwhile: the wait for the push is outside the lock.
        drop(owned);
        self.inner.handle.pushed().await;
        Ok(())
    }

    /// The live instances of `service` that are served (passing or warning), from the
    /// local replica (no network), sorted by id.
    pub fn lookup(&self, service: &str) -> Vec<Instance> {
        let mut all = self.lookup_all(service);
        all.retain(Instance::is_served);
        all
    }

    /// Every live instance of `service`, whatever its status, sorted by id.
    pub fn lookup_all(&self, service: &str) -> Vec<Instance> {
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

    /// The nodes of the cluster: live members (alive, or suspect when their renewal is
    /// late) and nodes lost lately (gone).
    ///
    /// # Errors
    /// [`Error::Stopped`].
    pub async fn members(&self) -> Result<Vec<Member>, Error> {
        let me = self.inner.handle.info().clone();
        let known = self.inner.handle.inspect(|n, _| n.known_peers()).await?;
        let replica = self.inner.handle.replica();
        let now = now_ms();
        let mut out = Vec::new();
        let mut live = std::collections::BTreeSet::new();
        for m in proto::live_members(&replica, now) {
            let id = m.id.to_string();
            live.insert(id.clone());
            let heard = now.saturating_sub(m.lease.issued.millis());
            let is_me = m.id == me.id;
            let late = heard > m.lease.ttl_ms * 2 / 3;
            out.push(Member {
                node: id,
                name: m.name.to_string(),
                address: m.url.unwrap_or_default().to_string(),
                state: if late && !is_me {
                    MemberState::Suspect
                } else {
                    MemberState::Alive
                },
                last_heard: Duration::from_millis(if is_me { 0 } else { heard }),
            });
        }
        for p in known {
            let id = p.id.to_string();
            if live.contains(&id) {
                continue;
            }
            out.push(Member {
                node: id,
                name: p.name.unwrap_or_default(),
                address: p.url.unwrap_or_default(),
                state: MemberState::Gone,
                last_heard: Duration::from_millis(now.saturating_sub(p.last_seen_ms)),
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
                .map_err(|e| Error::TaskFailed(format!("the store task: {e}")))??;
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
