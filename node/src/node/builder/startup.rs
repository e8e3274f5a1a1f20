//! Starting a node: the listener and its checks, the data directory, the crash-loop guard,
//! what to resume, the protocol's configuration, and the node's tasks.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use roster_registry::{Replica, ReplicaId};
use roster_transport::driver::{self, ClientProtocol, DriverConfig, StartError};
use roster_transport::handshake::Secret;
use roster_transport::proto::{self, CrashGuard, Resume};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Mutex};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use super::{secret_weakness, NodeBuilder, STRONG_SECRET_LEN};
use crate::node::checks;
use crate::node::held::Held;
use crate::node::tasks::{saver, ttl_keeper, warn_unsynced};
use crate::node::{millis, now_ms, Error, Inner, Node, CLIENT_QUEUE};
use crate::store::{OwnedRecord, Store};
use roster_registry::RegKey;

/// What the data directory gave back.
struct Disk {
    store: Option<Arc<Store>>,
    replica: Replica,
    /// Own registrations still wanted (those whose `ttl` passed are removed).
    owned: Vec<OwnedRecord>,
    removed: Vec<roster_registry::RegKey>,
    /// Launch times, this one among them.
    launches: Vec<u64>,
    /// What the last process knew of its peers.
    memory: proto::Memory,
}

/// This launch and the crash-loop guard.
struct Guard {
    /// The guard this launch starts under; `None`: not under it.
    on: Option<CrashGuard>,
    /// Launches within the guard's window, this one among them.
    launches_recent: u64,
}

impl NodeBuilder {
    /// Starts the node: opens the data directory, resumes the replica and the node's own
    /// registrations from it, binds the listener and joins the cluster.
    ///
    /// # Errors
    /// [`Error`]; nothing is left running.
    pub async fn start(self) -> Result<Node, Error> {
        self.check()?;
        let secret = self.secret()?;
        let listener = self.bind(secret.is_some()).await?;
        let new_id =
            ReplicaId(getrandom::u64().map_err(|e| Error::System(format!("no random id from the OS: {e}")))?);
        let now = now_ms();
        let disk = self.open_disk(new_id, now).await?;
        let guard = self.guard(&disk, now);
        let (resume, owned) = self.resume(&disk, guard.on);
        let (clients_tx, clients_rx) = mpsc::channel(CLIENT_QUEUE);
        let name = self
            .name
            .clone()
            .unwrap_or_else(|| format!("node-{}", disk.replica.id()));
        let mut config = DriverConfig::new(self.cluster.clone(), name);
        config.zone = self.zone.clone();
        config.advertise_url = self.advertise.clone();
        config.secret = secret.clone();
        config.protocol = self.protocol();
        config.resume = resume;
        config.clients = self.serve_clients.then_some(ClientProtocol {
            name: crate::api::CLIENT_SUBPROTOCOL,
            conns: clients_tx,
        });
        config.tls = self.tls.clone();
        let metrics = super::super::metrics::Metrics::new();
        config.on_snapshot = Some(metrics.snapshot_observer());
        let cancel = CancellationToken::new();
        let handle = driver::start(listener, config, disk.replica, self.join.clone(), cancel.clone())?;
        let inner = Arc::new(Inner {
            handle,
            store: std::sync::Mutex::new(disk.store.clone()),
            data_dir: self.data_dir.clone(),
            cancel,
            closed: CancellationToken::new(),
            tasks: TaskTracker::new(),
            lease_ttl_ms: millis(self.lease_ttl),
            sync_min_interval: self.sync_min_interval,
            started: Instant::now(),
            launches_recent: guard.launches_recent,
            guarded: std::sync::atomic::AtomicBool::new(guard.on.is_some()),
            owned: Mutex::new(owned),
            ttl_due: std::sync::atomic::AtomicU64::new(0),
            queue: std::sync::Mutex::default(),
            secret,
            client_auth_always: self.client_auth_always,
            exec_checks: self.exec_checks,
            serve_unreachable: self.damping.serve_unreachable,
            // The CA file was read and checked above (`tls.check()`).
            check_tls: self
                .tls
                .as_ref()
                .and_then(|t| driver::ClientTls::load(&t.ca_pem, None).ok()),
            checks: checks::Checks::default(),
            last_sync: std::sync::Mutex::new(None),
            pending_removals: std::sync::Mutex::new(std::collections::BTreeSet::new()),
            metrics,
        });
        let node = Node { inner };
        self.spawn_tasks(&node, disk.store, &guard, clients_rx).await;
        // Clients are served from here on, from the replica as loaded; what this returns
        // shows the node's own registrations written again.
        node.inner.handle.resumed().await;
        Ok(node)
    }

    /// The cluster secret, checked, with a warning when it is weak.
    fn secret(&self) -> Result<Option<Secret>, Error> {
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
        Ok(secret)
    }

    /// Binds the listener, and refuses what the transport would refuse, before the store
    /// records a launch.
    async fn bind(&self, has_secret: bool) -> Result<TcpListener, Error> {
        let listen_error = |source| Error::Listen {
            addr: self.listen.clone(),
            source,
        };
        let listener = TcpListener::bind(&self.listen).await.map_err(listen_error)?;
        let bound = listener.local_addr().map_err(listen_error)?;
        if !has_secret && !bound.ip().is_loopback() {
            return Err(Error::Start(StartError::Unauthenticated { addr: bound }));
        }
        if has_secret && self.tls.is_none() && !bound.ip().is_loopback() {
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
            self.check_advertise(url)?;
        }
        Ok(listener)
    }

    fn check_advertise(&self, url: &str) -> Result<(), Error> {
        if self.tls.is_some() != url.starts_with("wss://") {
            return Err(super::setting(
                "advertise",
                format!(
                    "advertise URL {url:?}: a node {} TLS is dialed with {}; fix --advertise",
                    if self.tls.is_some() { "with" } else { "without" },
                    if self.tls.is_some() { "wss://" } else { "ws://" }
                ),
            ));
        }
        if !(url.starts_with("ws://") || url.starts_with("wss://")) || proto::url_endpoint(url).is_err() {
            return Err(super::setting(
                "advertise",
                format!("advertise URL {url:?} is not ws://host:port or wss://host:port; fix --advertise"),
            ));
        }
        Ok(())
    }

    /// Opens the data directory (a node without one starts empty): the replica, the own
    /// registrations (removing those whose `ttl` passed while the node was down), the
    /// launches and what the last process knew of its peers.
    async fn open_disk(&self, new_id: ReplicaId, now: u64) -> Result<Disk, Error> {
        let Some(dir) = self.data_dir.clone() else {
            return Ok(Disk {
                store: None,
                replica: Replica::new(new_id),
                owned: Vec::new(),
                removed: Vec::new(),
                launches: vec![now],
                memory: proto::Memory::default(),
            });
        };
        let reset = self.reset_identity;
        let (store, loaded) = tokio::task::spawn_blocking(move || match reset {
            true => Store::open_resetting(&dir, new_id, now),
            false => Store::open(&dir, new_id, now),
        })
        .await
        .map_err(|e| Error::TaskFailed(format!("the store task: {e}")))??;
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
        // Unreadable memory is only a lost hint.
        let memory = if loaded.memory.is_empty() {
            proto::Memory::default()
        } else {
            postcard::from_bytes(&loaded.memory).unwrap_or_else(|e| {
                warn!("ignored the saved peer backoffs: {e}");
                proto::Memory::default()
            })
        };
        Ok(Disk {
            store: Some(Arc::new(store)),
            replica: loaded.replica,
            owned,
            removed: loaded.removed,
            launches: loaded.launches,
            memory,
        })
    }

    /// Whether this launch is under the crash-loop guard: more launches within its window
    /// than it allows (a node without a data directory counts none).
    fn guard(&self, disk: &Disk, now: u64) -> Guard {
        let policy = self.crash_guard.unwrap_or(CrashGuard::DEFAULT);
        let (over, launches_recent) = policy.judge(&disk.launches, now);
        let on = (over && self.crash_guard.is_some() && disk.store.is_some()).then_some(policy);
        if let Some(g) = on {
            warn!(
                launches = launches_recent,
                "crash-loop guard on: more than {} launches within {}; until this process has been up that long it keeps to the essential (one connection, the long backoff, no full state unasked)",
                g.launches,
                humantime::format_duration(g.window)
            );
        }
        Guard { on, launches_recent }
    }

    /// What the protocol resumes, and the own registrations by key.
    fn resume(&self, disk: &Disk, guard: Option<CrashGuard>) -> (Resume, BTreeMap<RegKey, Held>) {
        let mut resume = Resume {
            owned: Vec::new(),
            removed: disk.removed.clone(),
            drop_unowned: disk.store.is_some(),
            peers: disk.memory.peers.clone(),
            seeds: disk.memory.seeds.clone(),
            crash_guard: guard,
            leases_shipped: disk.memory.leases_shipped,
        };
        let mut owned = BTreeMap::new();
        for rec in &disk.owned {
            let mut rec = rec.clone();
            // Saved for older builds, which gave each registration a lease of its own: it
            // lives by the node's lease now.
            rec.lease_ttl_ms = millis(self.lease_ttl);
            match rec.registration() {
                Ok(reg) => {
                    let reg = Arc::new(reg);
                    resume.owned.push(Arc::clone(&reg));
                    let held = Held::new(rec, reg);
                    owned.insert(held.key(), held);
                }
                Err(why) => warn!("skipped a saved registration that no longer passes the checks: {why}"),
            }
        }
        (resume, owned)
    }

    /// The protocol's configuration from the builder's settings.
    fn protocol(&self) -> proto::Config {
        proto::Config {
            fanout: self.fanout,
            max_outbound: self.fanout,
            gossip_interval_ms: millis(self.gossip_interval),
            member_lease_ttl_ms: millis(self.lease_ttl),
            lease_per_member_ms: millis(self.lease_per_member),
            max_skew_ms: millis(self.max_clock_skew),
            damping_share_pct: self.damping.share_pct.min(100),
            damping_window_ms: millis(self.damping.window),
            damping_bound_ms: millis(self.damping.bound),
            // The grace before collecting an ended lease is at least the allowed skew.
            expire_grace_ms: proto::Config::default()
                .expire_grace_ms
                .max(millis(self.max_clock_skew)),
            ..proto::Config::default()
        }
    }

    /// The node's tasks: checks, the saver, the guard's end, the TTL keeper, the warning
    /// while no seed answers, and the client server.
    async fn spawn_tasks(
        &self,
        node: &Node,
        store: Option<Arc<Store>>,
        guard: &Guard,
        clients: mpsc::Receiver<crate::transport::driver::ClientConn>,
    ) {
        let inner = &node.inner;
        for held in inner.owned.lock().await.values() {
            node.run_checks(&held.store_key(), held.checks(), held.status().health);
        }
        if let Some(store) = store {
            inner.tasks.spawn(saver(
                inner.handle.clone(),
                store,
                inner.metrics.save.clone(),
                inner.cancel.clone(),
            ));
        }
        if let Some(g) = guard.on {
            inner.tasks.spawn(end_guard(Arc::downgrade(inner), g.window));
        }
        inner
            .tasks
            .spawn(ttl_keeper(Arc::downgrade(inner), inner.cancel.clone()));
        if !self.join.is_empty() {
            inner.tasks.spawn(warn_unsynced(
                inner.handle.clone(),
                self.join.clone(),
                inner.cancel.clone(),
            ));
        }
        if self.serve_clients {
            inner.tasks.spawn(crate::server::accept(
                Arc::downgrade(inner),
                clients,
                inner.cancel.clone(),
            ));
        }
    }
}

/// Turns the crash-loop guard off once the node has been up for its window.
async fn end_guard(weak: std::sync::Weak<Inner>, window: Duration) {
    let Some(cancel) = weak.upgrade().map(|i| i.cancel.clone()) else {
        return;
    };
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
}
