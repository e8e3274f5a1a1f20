//! The encoding of format 1, read from data directories written before leases were per
//! node, and its conversion.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{LeaseMap, RegKey, RegMap, State};
use crate::context::CausalContext;
use crate::dotfun::DotFun;
use crate::error::InvalidState;
use crate::id::{Dot, ProviderId};
use crate::value::Lease;

/// A format-1 state: one lease per provider.
#[derive(Deserialize)]
pub(crate) struct WireV1 {
    regs: RegMap,
    leases: BTreeMap<ProviderId, DotFun<Lease>>,
    ctx: CausalContext,
    #[allow(dead_code)] // read to consume its bytes; a converted state names no keys
    touched: Option<TouchedV1>,
}

#[derive(Deserialize)]
struct TouchedV1 {
    #[allow(dead_code)]
    regs: std::collections::BTreeSet<RegKey>,
    #[allow(dead_code)]
    leases: std::collections::BTreeSet<ProviderId>,
}

impl WireV1 {
    /// The state with every provider's lease moved to the node that wrote it: a node's
    /// lease holds every lease dot it minted, so it lives while any of them does (its
    /// own membership lease among them) until its next renewal replaces them all.
    /// Registrations keep their dots and live by their writer's lease from now on. The
    /// result names no keys (a full state).
    pub(crate) fn into_state(self) -> Result<State, InvalidState> {
        let mut by_node: BTreeMap<crate::id::ReplicaId, Vec<(Dot, Lease)>> = BTreeMap::new();
        for (_, f) in self.leases {
            for (d, l) in f.into_iter() {
                by_node.entry(d.actor).or_default().push((d, l));
            }
        }
        let mut leases = LeaseMap::default();
        for (node, mut pairs) in by_node {
            pairs.sort_by(|a, b| a.0.cmp(&b.0));
            pairs.dedup_by(|a, b| a.0 == b.0);
            leases.insert_mut(node, DotFun::from_vec(pairs));
        }
        State::from_parts(self.regs, leases, self.ctx, None)
    }
}
