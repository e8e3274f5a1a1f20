//! Starting a node: the listener and its checks, the data directory, the crash-loop guard,
//! what to resume, the protocol's configuration, and the node's tasks.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use roster_registry::{Replica, ReplicaId};
use roster_transport::driver::{self, DriverConfig, StartError};
use roster_transport::handshake::Secret;
use roster_transport::proto::{self, Resume};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Mutex};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use super::{secret_weakness, NodeBuilder, STRONG_SECRET_LEN};
use crate::node::checks;
use crate::node::tasks::{saver, ttl_keeper, warn_unsynced};
use crate::node::{millis, now_ms, Error, Inner, Node, CLIENT_QUEUE};
use crate::store::{OwnedRecord, Store};

impl NodeBuilder {
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
            match rec.registration() {
                Ok(reg) => {
                    resume.owned.push(reg);
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
            exec_checks: self.exec_checks,
            checks: checks::Checks::default(),
            last_sync: std::sync::Mutex::new(None),
            pending_removals: std::sync::Mutex::new(std::collections::BTreeSet::new()),
        });
        let node = Node { inner };
        for rec in node.inner.owned.lock().await.values() {
            node.run_checks(rec);
        }
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
