//! The embedded node: [`Node::builder`] starts one, [`Node::register`] keeps an instance
//! registered, [`Node::lookup`] and [`Node::watch`] read the local replica.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use roster_registry::{Health, ProviderId, ServiceName, Status};
use roster_transport::driver::Handle;
use roster_transport::handshake::Secret;
pub use roster_transport::proto::CrashGuard;
use roster_transport::proto::{self, MEMBERS_SERVICE};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::store::{OwnedRecord, Parts, Store, StoreHealth};

mod builder;
mod bulk;
#[cfg(test)]
mod bulk_tests;
mod checks;
#[cfg(test)]
mod disk_tests;
mod error;
mod force;
mod group;
#[cfg(test)]
mod group_tests;
mod health;
#[cfg(test)]
mod health_tests;
mod held;
mod inspect;
mod metrics;
mod near;

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
mod handle;
mod summary;
mod tasks;
mod unsaved;
mod values;
mod watch;

pub use builder::{Damping, NodeBuilder};
pub use error::Error;
pub use handle::RegistrationHandle;
pub use near::NEAR_AGENT;
pub use summary::{Changes, StatusCounts};
use values::ms;
pub use values::{Event, Instance, Member, MemberState, Service, UNREACHABLE};
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
pub const DEFAULT_CRASH_GUARD: CrashGuard = CrashGuard::DEFAULT;
/// The default cluster name.
pub const DEFAULT_CLUSTER: &str = "roster";
/// The shortest `ttl` a registration may have ([`Service::ttl`], `roster register --ttl`).
pub const MIN_REGISTRATION_TTL: Duration = Duration::from_secs(1);
/// The longest `ttl` a registration may have (one day, as the longest lease): a
/// registration that should outlive it is registered without a `ttl` and deregistered.
pub const MAX_REGISTRATION_TTL: Duration = Duration::from_secs(24 * 3600);
/// Client connections waiting to be served.
const CLIENT_QUEUE: usize = 64;

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
            "ttl {} is too long; use at most 24h (for longer, register it with no ttl, and deregister it)",
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
    owned: Mutex<BTreeMap<roster_registry::RegKey, held::Held>>,
    /// No own registration's `ttl` passes before this (wall ms): the TTL keeper reads
    /// `owned` only once it has come. Lowered, under `owned`'s lock, by every record
    /// put in it; 0 until the keeper first looked.
    ttl_due: std::sync::atomic::AtomicU64,
    /// Single registrations waiting for the next commit (see `group`).
    queue: std::sync::Mutex<group::Queue>,
    pub(crate) secret: Option<Secret>,
    pub(crate) client_auth_always: bool,
    /// Whether exec health checks run here.
    exec_checks: bool,
    /// Whether reads serve unreachable instances (see [`Damping`](builder::Damping)).
    serve_unreachable: bool,
    /// TLS for `https://` health checks: the node's CA as the only roots (`None`: a node
    /// without TLS files, which refuses them).
    check_tls: Option<roster_transport::driver::ClientTls>,
    /// The checks running, by instance key.
    checks: checks::Checks,
    /// The last manual sync, for a node without a data directory.
    last_sync: std::sync::Mutex<Option<u64>>,
    /// Own keys whose `ttl` passed and that are out of the cluster, but still on disk
    /// because the store could not write (see `unsaved`).
    pending_removals: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// Latency histograms (`Node::register_metrics`).
    metrics: metrics::Metrics,
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

    /// The record of `s`, checked, and its parts parsed (once: the commit uses them).
    fn record(&self, s: &Service) -> Result<(OwnedRecord, Parts), Error> {
        let instance = s.id.clone().unwrap_or_else(|| self.default_instance(&s.name));
        if let Some(t) = s.ttl {
            check_ttl(t).map_err(Error::Invalid)?;
        }
        roster_registry::metadata_from_pairs(&s.meta)?;
        if s.checks.len() > crate::check::MAX_CHECKS {
            return Err(Error::Invalid(format!(
                "{} checks, more than the {} one registration may have",
                s.checks.len(),
                crate::check::MAX_CHECKS
            )));
        }
        for c in &s.checks {
            c.validate(self.inner.exec_checks).map_err(Error::Invalid)?;
            if matches!(&c.probe, crate::check::Probe::Http(url) if crate::check::is_https(url))
                && self.inner.check_tls.is_none()
            {
                return Err(Error::Invalid(
                    "an https check verifies the service's certificate against the agent's CA, and this agent has no TLS files; start it with --tls-cert, --tls-key and --tls-ca, or check over http://".to_string(),
                ));
            }
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
        let parts = rec.parts()?;
        Ok((rec, parts))
    }

    /// Registers an instance this node owns and keeps alive until it is deregistered (or
    /// its `ttl` passes). The registration is on disk when this returns, and peers hear of
    /// it within milliseconds. Dropping the returned handle deregisters it; call
    /// [`RegistrationHandle::keep`] to keep it registered past the handle.
    ///
    /// # Errors
    /// [`Error::Input`] for a bad name, address or metadata, [`Error::Invalid`] for a bad
    /// ttl or check or the reserved name; [`Error::Store`];
    /// [`Error::Stopped`]. Nothing changed.
    pub async fn register(&self, service: Service) -> Result<RegistrationHandle, Error> {
        let (rec, parts) = self.record(&service)?;
        let (service, instance) = (rec.service.clone(), rec.instance.clone());
        self.put(rec, parts).await?;
        Ok(RegistrationHandle {
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
        let (rec, parts) = self.record(&service)?;
        let instance = rec.instance.clone();
        self.put(rec, parts).await?;
        Ok(instance)
    }

    /// Refuses an instance id that another live node has registered: two nodes keeping the
    /// same instance alive would each take it from the other. The instance is free once
    /// its owner deregisters it, or its owner's lease ends.
    fn not_owned_elsewhere(&self, service: &ServiceName, provider: &ProviderId) -> Result<(), Error> {
        match self.owner_elsewhere(service, provider) {
            Some(owner) => Err(Error::OwnedElsewhere(format!(
                "instance {service}/{provider} is registered by node {owner}; \
                 deregister it there first, or pick another instance id"
            ))),
            None => Ok(()),
        }
    }

    /// The other live node that holds the live instance `service`/`provider`, as `name
    /// (id, url)`; `None` when none does (no such instance, or it is this node's).
    fn owner_elsewhere(&self, service: &ServiceName, provider: &ProviderId) -> Option<String> {
        let me = self.inner.handle.info().id;
        let replica = self.inner.handle.replica();
        let now = now_ms();
        let key = roster_registry::RegKey {
            service: service.clone(),
            provider: provider.clone(),
        };
        let owner = replica
            .visible(&key, now)
            .map(|i| i.node())
            .filter(|n| *n != me)?;
        let m = proto::live_members(&replica, now)
            .into_iter()
            .find(|m| m.id == owner)?;
        Some(format!("{} ({owner}, {})", m.name, m.url.unwrap_or_default()))
    }

    /// Removes an instance this node owns (from disk first, then from the cluster), and
    /// returns once the removal was handed to the connection of every connected peer (see
    /// [`RegistrationHandle::deregister`]).
    ///
    /// # Errors
    /// [`Error::OwnedElsewhere`] when another live node owns it (the error names that
    /// node); [`Error::NotFound`] when no node does; [`Error::Store`]; [`Error::Stopped`].
    pub async fn deregister(&self, service: &str, instance: &str) -> Result<(), Error> {
        let mut owned = self.inner.owned.lock().await;
        let key = held::key_of(service, instance);
        if !key.as_ref().is_some_and(|k| owned.contains_key(k)) {
            let owner = match (ServiceName::new(service), ProviderId::new(instance)) {
                (Ok(s), Ok(p)) => self.owner_elsewhere(&s, &p),
                _ => None,
            };
            if let Some(owner) = owner {
                return Err(Error::OwnedElsewhere(format!(
                    "instance {service}/{instance} is registered by node {owner}, not this one; \
                     deregister it there"
                )));
            }
            return Err(Error::NotFound(format!(
                "this node owns no instance {instance:?} of {service:?}"
            )));
        }
        if let Some(store) = self.inner.store() {
            let (s, i) = (service.to_string(), instance.to_string());
            tokio::task::spawn_blocking(move || store.remove_owned(&s, &i, now_ms()))
                .await
                .map_err(|e| Error::TaskFailed(format!("the store task: {e}")))??;
        }
        if let Some(k) = &key {
            owned.remove(k);
        }
        self.stop_checks(&crate::store::key(service, instance));
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
        all.retain(|i| self.serves(i));
        all
    }

    /// Whether reads return `i` unless asked for every instance: passing or warning, and
    /// reachable unless this node serves unreachable instances.
    pub fn serves(&self, i: &Instance) -> bool {
        i.is_served() || (self.inner.serve_unreachable && i.unreachable && i.status.is_served())
    }

    /// Every live instance of `service`, whatever its status, sorted by id.
    pub fn lookup_all(&self, service: &str) -> Vec<Instance> {
        let Ok(name) = ServiceName::new(service) else {
            return Vec::new();
        };
        let replica = self.inner.handle.replica();
        replica
            .instances(&name, now_ms())
            .map(|i| Instance::from_ref(&i))
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
