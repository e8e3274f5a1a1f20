//! A state taken apart and put back together: its encoded shape, and the constructor that
//! checks every invariant of decoded parts.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{LeaseMap, State, Touched};
use crate::context::CausalContext;
use crate::dotfun::DotFun;
use crate::error::InvalidState;
use crate::id::{Dot, ReplicaId};
use crate::regstore::RegMap;
use crate::value::Lease;

impl State {
    /// Builds a state from decoded parts, checking every invariant.
    pub(crate) fn from_parts(
        regs: RegMap,
        leases: LeaseMap,
        ctx: CausalContext,
        touched: Option<Touched>,
    ) -> Result<Self, InvalidState> {
        ctx.validate()?;
        let mut seen = BTreeSet::new();
        let mut check = |d: &Dot| -> Result<(), InvalidState> {
            if d.counter == 0 {
                return Err(InvalidState::ZeroCounter(d.actor.to_string()));
            }
            if !ctx.contains(d) {
                return Err(InvalidState::DotNotInContext(format!("{d}")));
            }
            if ctx.retired().any(|(r, x)| r == d.actor && d.counter <= x.counter) {
                return Err(InvalidState::RetiredDot(format!("{d}")));
            }
            if !seen.insert(d.clone()) {
                return Err(InvalidState::DuplicateDot(format!("{d}")));
            }
            Ok(())
        };
        for (key, f) in regs.iter() {
            if f.is_empty() || !f.is_sorted_unique() {
                return Err(InvalidState::EmptyEntry(format!(
                    "{}/{}",
                    key.service, key.provider
                )));
            }
            for (d, v) in f.iter() {
                v.validate()?;
                check(d)?;
            }
        }
        for (node, f) in leases.iter() {
            if f.is_empty() || !f.is_sorted_unique() {
                return Err(InvalidState::EmptyEntry(format!("lease of {node}")));
            }
            for (d, v) in f.iter() {
                v.validate()?;
                check(d)?;
                // A node's lease is written by that node alone: no node may keep another
                // alive.
                if d.actor != *node {
                    return Err(InvalidState::ForeignLease {
                        node: node.to_string(),
                        dot: format!("{d}"),
                    });
                }
            }
        }
        Ok(Self {
            regs: regs.into(),
            leases,
            ctx,
            touched,
        })
    }
}

/// The encoded shape of a state: the store, the context, and a delta's touched keys
/// (only those outside its store; the store's own keys are implied).
#[derive(Serialize)]
pub(crate) struct WireRef<'a> {
    pub(crate) regs: &'a RegMap,
    pub(crate) leases: BTreeMap<&'a ReplicaId, &'a DotFun<Lease>>,
    pub(crate) ctx: &'a CausalContext,
    pub(crate) touched: Option<Touched>,
}

/// The decoded shape of a state, before its invariants are checked.
#[derive(Deserialize)]
pub(crate) struct Wire {
    pub(crate) regs: RegMap,
    pub(crate) leases: BTreeMap<ReplicaId, DotFun<Lease>>,
    pub(crate) ctx: CausalContext,
    pub(crate) touched: Option<Touched>,
}

impl State {
    pub(crate) fn wire(&self) -> WireRef<'_> {
        let touched = self.touched.as_ref().map(|t| Touched {
            regs: t
                .regs
                .iter()
                .filter(|k| !self.regs.contains_key(*k))
                .cloned()
                .collect(),
            leases: t
                .leases
                .iter()
                .filter(|p| !self.leases.contains_key(*p))
                .cloned()
                .collect(),
        });
        WireRef {
            regs: &self.regs,
            leases: self.leases.iter().collect(),
            ctx: &self.ctx,
            touched,
        }
    }
}
