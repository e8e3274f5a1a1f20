//! Reads that prefer the near: the instances owned by nodes of one zone first.

use std::collections::BTreeSet;

use roster_transport::proto::{self, Zone};

use super::{now_ms, Instance, Node};

/// What a reader asks to come first: the instances of the agent's own zone, or of a
/// zone it names (`roster get --near`, `?near=`).
pub const NEAR_AGENT: &str = "_agent";

impl Node {
    /// This node's zone.
    pub fn zone(&self) -> &Zone {
        &self.inner.handle.info().zone
    }

    /// The served instances of `service` (as [`Node::lookup`]), those owned by live
    /// members of `zone` first (this node's zone when `None`), each part sorted by id.
    pub fn lookup_near(&self, service: &str, zone: Option<&Zone>) -> Vec<Instance> {
        self.near_first(self.lookup(service), zone.unwrap_or(self.zone()))
    }

    /// `instances` with those owned by live members of `zone` first, each part in the
    /// order it had.
    pub fn near_first(&self, instances: Vec<Instance>, zone: &Zone) -> Vec<Instance> {
        let replica = self.inner.handle.replica();
        let near: BTreeSet<String> = proto::live_members(&replica, now_ms())
            .into_iter()
            .filter(|m| m.zone == zone.as_str())
            .map(|m| m.id.to_string())
            .collect();
        let (mut first, rest): (Vec<Instance>, Vec<Instance>) =
            instances.into_iter().partition(|i| near.contains(&i.node));
        first.extend(rest);
        first
    }

    /// The zone a reader's `near` names: [`NEAR_AGENT`] for this node's.
    ///
    /// # Errors
    /// [`crate::InvalidZone`] when it is neither that nor a zone name.
    pub fn near_zone(&self, near: &str) -> Result<Zone, crate::InvalidZone> {
        if near == NEAR_AGENT {
            Ok(self.zone().clone())
        } else {
            Zone::new(near)
        }
    }
}
