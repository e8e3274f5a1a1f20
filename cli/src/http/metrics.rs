//! `GET /metrics`: the agent in Prometheus's text format (prometheus-client's encoder).
//!
//! The counters are the ones the protocol's state machine and the driver keep, read at
//! each scrape: they are the single source of truth (the simulator's tests assert on
//! them), so nothing is counted twice. Gauges are read from the node the same way.

use axum::extract::State;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use roster::transport::driver::NodeCounters;

use super::error::ApiError;
use super::App;

/// What one scrape reports, read from the node before encoding.
#[derive(Debug)]
struct Snapshot {
    counters: NodeCounters,
    peers: (u64, u64),
    members: [(&'static str, u64); 5],
    /// This agent's zone.
    zone: String,
    /// Live members (alive or suspect) by zone.
    zones: Vec<(String, u64)>,
    /// Members shown as unreachable (their zone damped), by zone.
    unreachable_zones: Vec<(String, u64)>,
    services: u64,
    instances: [(&'static str, u64); 5],
    launches_recent: u64,
    crash_guard: bool,
    synced: bool,
    store_degraded: bool,
    uptime_s: u64,
}

/// `GET /metrics`.
pub async fn metrics(State(app): State<App>) -> Result<Response, ApiError> {
    let snapshot = snapshot(&app.node).await?;
    let mut registry = Registry::default();
    registry.register_collector(Box::new(snapshot));
    app.node.register_metrics(&mut registry);
    let mut body = String::new();
    prometheus_client::encoding::text::encode(&mut body, &registry)
        .map_err(|e| ApiError::unavailable(format!("cannot encode the metrics: {e}")))?;
    let mut r = body.into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    Ok(r)
}

async fn snapshot(node: &roster::Node) -> Result<Snapshot, ApiError> {
    let status = node.status().await?;
    let members = node.members().await?;
    let count = |s: roster::MemberState| members.iter().filter(|m| m.state == s).count() as u64;
    let outbound = status.peers.iter().filter(|p| p.direction == "outbound").count() as u64;
    let mut by_status = [
        ("passing", 0),
        ("warning", 0),
        ("critical", 0),
        ("maintenance", 0),
        (roster::UNREACHABLE, 0),
    ];
    for (service, _) in node.services() {
        for i in node.lookup_all(&service) {
            if let Some(slot) = by_status.iter_mut().find(|(s, _)| *s == i.status_name()) {
                slot.1 += 1;
            }
        }
    }
    let mut zones = std::collections::BTreeMap::<String, u64>::new();
    let mut unreachable = std::collections::BTreeMap::<String, u64>::new();
    for m in &members {
        match (&m.zone, m.state) {
            (Some(z), roster::MemberState::Alive | roster::MemberState::Suspect) => {
                *zones.entry(z.clone()).or_default() += 1;
            }
            (Some(z), roster::MemberState::Unreachable) => *unreachable.entry(z.clone()).or_default() += 1,
            _ => {}
        }
    }
    Ok(Snapshot {
        zone: status.zone.clone(),
        zones: zones.into_iter().collect(),
        unreachable_zones: unreachable.into_iter().collect(),
        counters: node.transport().counters(),
        peers: (outbound, status.peers.len() as u64 - outbound),
        members: [
            ("alive", count(roster::MemberState::Alive)),
            ("suspect", count(roster::MemberState::Suspect)),
            ("unreachable", count(roster::MemberState::Unreachable)),
            ("left", count(roster::MemberState::Left)),
            ("failed", count(roster::MemberState::Failed)),
        ],
        services: status.services,
        instances: by_status,
        launches_recent: status.launches_recent,
        crash_guard: status.crash_guard,
        synced: status.synced,
        store_degraded: status.store.is_some(),
        uptime_s: status.uptime_ms / 1000,
    })
}

fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> std::fmt::Result {
    let c = ConstCounter::new(v);
    c.encode(e.encode_descriptor(name, help, None, c.metric_type())?)
}

fn gauge(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> std::fmt::Result {
    let g = ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX));
    g.encode(e.encode_descriptor(name, help, None, g.metric_type())?)
}

/// One metric with a label, a value for each of its values.
fn labelled(
    e: &mut DescriptorEncoder,
    (name, help, counter): (&str, &str, bool),
    label: &str,
    values: &[(&str, u64)],
) -> std::fmt::Result {
    let kind = if counter {
        ConstCounter::new(0u64).metric_type()
    } else {
        ConstGauge::new(0i64).metric_type()
    };
    let mut m = e.encode_descriptor(name, help, None, kind)?;
    for (value, n) in values {
        let labels = [(label, *value)];
        if counter {
            ConstCounter::new(*n).encode(m.encode_family(&labels)?)?;
        } else {
            ConstGauge::new(i64::try_from(*n).unwrap_or(i64::MAX)).encode(m.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

impl Collector for Snapshot {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        self.encode_traffic(&mut e)?;
        self.encode_replication(&mut e)?;
        self.encode_refusals(&mut e)?;
        self.encode_state(&mut e)
    }
}

impl Snapshot {
    fn encode_traffic(&self, e: &mut DescriptorEncoder) -> std::fmt::Result {
        let (p, d) = (&self.counters.protocol, &self.counters.driver);
        counter(e, "roster_dials", "Dials made to peers.", p.dials)?;
        counter(
            e,
            "roster_connections_accepted",
            "Inbound peer connections accepted (clients not counted).",
            d.inbound_accepted.saturating_sub(d.clients_accepted),
        )?;
        counter(
            e,
            "roster_client_connections_accepted",
            "Client-protocol connections accepted.",
            d.clients_accepted,
        )?;
        counter(
            e,
            "roster_frames_sent",
            "WebSocket frames sent to peers.",
            d.frames_sent,
        )?;
        counter(
            e,
            "roster_frames_received",
            "WebSocket frames received from peers.",
            d.frames_received,
        )?;
        counter(
            e,
            "roster_bytes_sent",
            "Payload bytes sent to peers.",
            d.bytes_sent,
        )?;
        counter(
            e,
            "roster_bytes_received",
            "Payload bytes received from peers.",
            d.bytes_received,
        )?;
        counter(
            e,
            "roster_pings_sent",
            "Pings sent on quiet peer connections.",
            d.pings_sent,
        )?;
        counter(
            e,
            "roster_dead_links",
            "Peer connections closed because nothing arrived for dead_after.",
            d.dead_links,
        )
    }

    fn encode_replication(&self, e: &mut DescriptorEncoder) -> std::fmt::Result {
        let p = &self.counters.protocol;
        counter(
            e,
            "roster_deltas_applied",
            "Deltas that taught this node something.",
            p.deltas_applied,
        )?;
        counter(
            e,
            "roster_full_syncs_sent",
            "Full (elided) states sent to peers.",
            p.full_syncs_sent,
        )?;
        counter(
            e,
            "roster_full_syncs_received",
            "Full (elided) states received from peers.",
            p.full_syncs_received,
        )?;
        counter(
            e,
            "roster_diverged_states",
            "Peers whose state differed from this node's with the same context (a removal one side missed); each side then sent its elided state.",
            p.diverged_states,
        )?;
        counter(
            e,
            "roster_states_refused",
            "States from peers refused before they were joined (a retirement of a live node, a runaway counter, a time too far ahead).",
            p.states_refused,
        )?;
        counter(
            e,
            "roster_forgeries_refuted",
            "Writes forged under this node's id that it refuted.",
            p.forgeries_refuted,
        )?;
        counter(
            e,
            "roster_overwrites_repaired",
            "Instances this node owns that another wrote over, written again.",
            p.overwrites_repaired,
        )?;
        counter(
            e,
            "roster_deaths_written",
            "Peers this node found unreachable and wrote dead.",
            p.deaths_written,
        )?;
        counter(
            e,
            "roster_deaths_refuted",
            "Times this node found itself written dead and renewed its lease.",
            p.deaths_refuted,
        )?;
        counter(
            e,
            "roster_clock_steps_back",
            "Times this node's wall clock came back from ahead of its peers' and it wrote what it owns again.",
            p.clock_steps_back,
        )?;
        counter(
            e,
            "roster_operator_removals",
            "Instances of other nodes an operator removed through this agent.",
            p.operator_removals,
        )?;
        counter(
            e,
            "roster_instances_lapsed",
            "Instances reads stopped showing because their lease ended without a renewal.",
            p.instances_lapsed,
        )?;
        self.encode_trees(e)
    }

    fn encode_trees(&self, e: &mut DescriptorEncoder) -> std::fmt::Result {
        let p = &self.counters.protocol;
        counter(
            e,
            "roster_duplicate_pushes",
            "Pushes on the trees that carried only changes this node had (each prunes a link).",
            p.duplicate_pushes,
        )?;
        counter(
            e,
            "roster_changes_announced",
            "Changes announced on links off their trees.",
            p.changes_announced,
        )?;
        counter(
            e,
            "roster_changes_grafted",
            "Changes asked of an announcer after they did not arrive on their tree in time.",
            p.changes_grafted,
        )?;
        counter(
            e,
            "roster_exchange_dials",
            "Dials of a member with no link for one anti-entropy exchange.",
            p.exchange_dials,
        )?;
        counter(
            e,
            "roster_overdue_rounds",
            "Rounds of exchanges with members with no link, started by a push not acknowledged in time.",
            p.overdue_rounds,
        )
    }

    fn encode_refusals(&self, e: &mut DescriptorEncoder) -> std::fmt::Result {
        let d = &self.counters.driver;
        labelled(
            e,
            (
                "roster_refusals",
                "Connections, handshakes and messages refused or cut, by reason.",
                true,
            ),
            "reason",
            &[
                ("inbound_over_cap", d.inbound_over_cap),
                ("unauthenticated_over_cap", d.unauthenticated_over_cap),
                ("handshake_timeout", d.handshake_timeouts),
                ("handshake_refused", d.handshakes_refused),
                ("handshake_rejected_by_peer", d.handshakes_rejected),
                ("oversize", d.oversize),
                ("oversize_not_sent", d.oversize_sent),
                ("malformed", d.malformed),
                ("slow_peer", d.slow_peers),
                ("peer_shed", d.peers_shed),
                ("client_shed", d.clients_shed),
                ("dial_failed", d.dial_failures),
                ("message_refused", self.counters.protocol.refused),
            ],
        )?;
        counter(
            e,
            "roster_frames_throttled",
            "Frames read late because a peer sent faster than the rate limit.",
            d.frames_throttled,
        )
    }

    fn encode_state(&self, e: &mut DescriptorEncoder) -> std::fmt::Result {
        labelled(
            e,
            ("roster_peers", "Connected peers, by direction.", false),
            "direction",
            &[("outbound", self.peers.0), ("inbound", self.peers.1)],
        )?;
        labelled(
            e,
            ("roster_members", "Nodes of the cluster, by state.", false),
            "state",
            &self.members,
        )?;
        labelled(
            e,
            ("roster_zone", "This agent's zone (1, labelled with it).", false),
            "zone",
            &[(self.zone.as_str(), 1)],
        )?;
        let zones: Vec<(&str, u64)> = self.zones.iter().map(|(z, n)| (z.as_str(), *n)).collect();
        labelled(
            e,
            (
                "roster_zone_members",
                "Live members of the cluster, by zone.",
                false,
            ),
            "zone",
            &zones,
        )?;
        let unreachable: Vec<(&str, u64)> = self
            .unreachable_zones
            .iter()
            .map(|(z, n)| (z.as_str(), *n))
            .collect();
        labelled(
            e,
            (
                "roster_zone_unreachable_members",
                "Members shown as unreachable, not dead: their zone was judged cut off (damped), by zone.",
                false,
            ),
            "zone",
            &unreachable,
        )?;
        gauge(
            e,
            "roster_services",
            "Live services in the replica.",
            self.services,
        )?;
        labelled(
            e,
            (
                "roster_instances",
                "Live instances in the replica, by status.",
                false,
            ),
            "status",
            &self.instances,
        )?;
        gauge(
            e,
            "roster_launches_recent",
            "Launches within the crash-guard window.",
            self.launches_recent,
        )?;
        gauge(
            e,
            "roster_crash_guard",
            "1 while the crash-loop guard holds this agent in its quiet mode.",
            u64::from(self.crash_guard),
        )?;
        gauge(
            e,
            "roster_synced",
            "1 once this agent has caught up with a peer since it started.",
            u64::from(self.synced),
        )?;
        gauge(
            e,
            "roster_store_degraded",
            "1 while the data directory cannot be written (changes are refused).",
            u64::from(self.store_degraded),
        )?;
        gauge(
            e,
            "roster_uptime_seconds",
            "Seconds since this agent started.",
            self.uptime_s,
        )
    }
}
