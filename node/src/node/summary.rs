//! A summary of the replica for dashboards: each service's instance counts by status, and
//! a signal that something changed (for a blocking query over the summary).

use roster_registry::Health;
use roster_transport::proto::MEMBERS_SERVICE;
use tokio::sync::broadcast;

use super::{now_ms, Node};

/// One service's live instances, counted by status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct StatusCounts {
    /// Passing instances.
    pub passing: usize,
    /// Warning instances (still served).
    pub warning: usize,
    /// Critical instances (not served).
    pub critical: usize,
    /// Instances in maintenance.
    pub maintenance: usize,
    /// Instances of unreachable nodes (their zone judged cut off; not served), whatever
    /// their own status.
    pub unreachable: usize,
}

impl StatusCounts {
    /// Every live instance counted.
    pub fn total(&self) -> usize {
        self.passing + self.warning + self.critical + self.maintenance + self.unreachable
    }

    fn add(&mut self, h: Health) {
        match h {
            Health::Passing => self.passing += 1,
            Health::Warning => self.warning += 1,
            Health::Critical => self.critical += 1,
            Health::Maintenance => self.maintenance += 1,
        }
    }
}

impl Node {
    /// Services with live instances and their counts by status, sorted by name, from the
    /// local replica: one pass over it, reading each instance's status in place (nothing
    /// is copied out, so it costs about what [`Node::services`] does).
    pub fn service_counts(&self) -> Vec<(String, StatusCounts)> {
        let replica = self.inner.handle.replica();
        let now = now_ms();
        let mut out: Vec<(String, StatusCounts)> = Vec::new();
        for (name, _) in replica.services(now) {
            if name.as_str() == MEMBERS_SERVICE {
                continue;
            }
            let mut c = StatusCounts::default();
            for i in replica.instances(&name, now) {
                if i.unreachable {
                    c.unreachable += 1;
                } else {
                    c.add(i.registration.status.health);
                }
            }
            out.push((name.as_str().to_string(), c));
        }
        out
    }

    /// A signal for every change to the replica from now on, whatever its service.
    pub fn changes(&self) -> Changes {
        Changes {
            rx: self.inner.handle.subscribe(),
        }
    }
}

/// Says when the replica changed. See [`Node::changes`].
#[derive(Debug)]
pub struct Changes {
    rx: broadcast::Receiver<std::sync::Arc<roster_registry::Change>>,
}

impl Changes {
    /// Waits for the next change (a signal that fell behind counts as one); `false` when
    /// the node stopped.
    pub async fn next(&mut self) -> bool {
        match self.rx.recv().await {
            Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => true,
            Err(broadcast::error::RecvError::Closed) => false,
        }
    }
}
