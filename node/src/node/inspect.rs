//! What a node tells of itself and of the cluster: members, status, explain, a manual sync.

use std::collections::BTreeMap;
use std::time::Duration;

use roster_registry::{ProviderId, ReplicaId, ServiceName};
use roster_transport::proto;

use super::{millis, now_ms, Error, Member, MemberState, Node};
use crate::api::{CountersView, ExplainView, PeerView, StatusView, WriteView};

impl Node {
    /// The nodes of the cluster: live members (alive, or suspect when their renewal is
    /// late) and nodes gone lately, which left (their farewell is in the registry) or
    /// failed (written dead, force-left, or their lease ended). Each with its lease's end
    /// (live members) and when this node last exchanged state with it.
    ///
    /// # Errors
    /// [`Error::Stopped`].
    pub async fn members(&self) -> Result<Vec<Member>, Error> {
        let me = self.inner.handle.info().clone();
        let known = self.inner.handle.inspect(|n, _| n.known_peers()).await?;
        let exchanged: BTreeMap<ReplicaId, u64> = self.inner.handle.exchanged().await?.into_iter().collect();
        let replica = self.inner.handle.replica();
        let now = now_ms();
        let synced = |id: ReplicaId| {
            exchanged
                .get(&id)
                .map(|t| Duration::from_millis(now.saturating_sub(*t)))
        };
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
                zone: Some(m.zone.to_string()),
                state: if m.unreachable {
                    MemberState::Unreachable
                } else if late && !is_me {
                    MemberState::Suspect
                } else {
                    MemberState::Alive
                },
                last_heard: Duration::from_millis(if is_me { 0 } else { heard }),
                lease_left: Some(Duration::from_millis(m.lease.deadline_ms().saturating_sub(now))),
                synced: synced(m.id),
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
                zone: None,
                state: if proto::has_left(&replica, p.id) {
                    MemberState::Left
                } else {
                    MemberState::Failed
                },
                last_heard: Duration::from_millis(now.saturating_sub(p.last_seen_ms)),
                lease_left: None,
                synced: synced(p.id),
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
            zone: info.zone.to_string(),
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
                operator_removals: c.protocol.operator_removals,
                clock_steps_back: c.protocol.clock_steps_back,
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
        let not_found = || Error::NotFound(format!("no registration {instance:?} of {service:?} here"));
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
}
