//! The node's latency histograms, for Prometheus: what saving a batch of changes to the data
//! directory takes, and what publishing a replica snapshot for readers takes. Counters are
//! the protocol's and the driver's own (`Handle::counters`), read when scraped.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use roster_transport::driver::SnapshotObserver;

use super::Node;

/// The histograms, shared by the tasks that observe into them.
#[derive(Debug, Clone)]
pub(crate) struct Metrics {
    /// One save of the replica's changes (a redb transaction, fsync included).
    pub save: Histogram,
    /// One snapshot of the replica published for readers.
    pub snapshot: Histogram,
    /// Health check results, by the check's kind and the outcome.
    pub checks: Family<CheckLabels, Counter>,
}

/// A check result's labels: its kind (`http`, `tcp`, `exec`, `ttl`) and outcome (`pass`,
/// `warn`, `fail`).
pub(crate) type CheckLabels = [(&'static str, &'static str); 2];

/// 50 µs to about 13 s, each bucket four times the last.
fn buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.000_05, 4.0, 10)
}

impl Metrics {
    pub(crate) fn new() -> Self {
        Self {
            save: Histogram::new(buckets()),
            snapshot: Histogram::new(buckets()),
            checks: Family::default(),
        }
    }

    /// What the transport calls after each snapshot it publishes.
    pub(crate) fn snapshot_observer(&self) -> SnapshotObserver {
        let h = self.snapshot.clone();
        SnapshotObserver(Arc::new(move |d: Duration| h.observe(d.as_secs_f64())))
    }
}

impl Node {
    /// Registers the node's own metrics in `registry` (for a service's own `/metrics`):
    /// `roster_save_seconds`, each save of the replica's changes to the data directory;
    /// `roster_snapshot_seconds`, each snapshot of the replica published for readers;
    /// `roster_check_results_total{kind, outcome}`, the results of the health checks this
    /// node runs. `roster agent` serves them on `GET /metrics` with its counters.
    pub fn register_metrics(&self, registry: &mut Registry) {
        registry.register(
            "roster_save_seconds",
            "Time to save a batch of the replica's changes to the data directory",
            self.inner.metrics.save.clone(),
        );
        registry.register(
            "roster_snapshot_seconds",
            "Time to publish a snapshot of the replica for readers",
            self.inner.metrics.snapshot.clone(),
        );
        registry.register(
            "roster_check_results",
            "Results of the health checks this node runs, by kind and outcome",
            self.inner.metrics.checks.clone(),
        );
    }
}
