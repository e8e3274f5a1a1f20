//! The encodings of older formats, read from data directories written by older builds,
//! and their conversion: format 1 (before leases were per node) and format 2 (before
//! registrations carried a status and the time they were first registered).

use std::collections::BTreeMap;

use serde::Deserialize;

use rpds::RedBlackTreeMapSync;

use super::{LeaseMap, RegKey, RegMap, State, Touched};
use crate::context::CausalContext;
use crate::dotfun::DotFun;
use crate::endpoint::Endpoint;
use crate::error::InvalidState;
use crate::hlc::Hlc;
use crate::id::{Dot, ProviderId, ReplicaId};
use crate::meta::Metadata;
use crate::status::Status;
use crate::value::{Lease, Registration};

/// A registration of formats 1 and 2: no status, no first-registered time.
#[derive(Deserialize)]
pub(crate) struct RegistrationV2 {
    endpoint: Endpoint,
    meta: Metadata,
    written: Hlc,
    lease_dot: Dot,
}

impl From<RegistrationV2> for Registration {
    /// Passing (formats 1 and 2 had no checks), first registered when it was written
    /// (the best an old value knows).
    fn from(r: RegistrationV2) -> Self {
        Self {
            endpoint: r.endpoint,
            meta: r.meta,
            status: Status::passing(),
            since_ms: r.written.millis(),
            written: r.written,
            lease_dot: r.lease_dot,
        }
    }
}

/// The registrations of formats 1 and 2, by key.
pub(crate) type RegMapV2 = RedBlackTreeMapSync<RegKey, DotFun<RegistrationV2>>;

/// One key's registrations of format 2, converted.
pub(crate) fn upgrade(f: DotFun<RegistrationV2>) -> DotFun<Registration> {
    DotFun::from_vec(f.into_iter().map(|(d, r)| (d, r.into())).collect())
}

fn upgrade_map(regs: RegMapV2) -> RegMap {
    let mut out = RegMap::default();
    for (k, f) in regs.iter() {
        let pairs = f
            .iter()
            .map(|(d, r)| (d.clone(), r.clone_into_current()))
            .collect();
        out.insert_mut(k.clone(), DotFun::from_vec(pairs));
    }
    out
}

impl RegistrationV2 {
    fn clone_into_current(&self) -> Registration {
        Registration {
            endpoint: self.endpoint.clone(),
            meta: self.meta.clone(),
            status: Status::passing(),
            since_ms: self.written.millis(),
            written: self.written,
            lease_dot: self.lease_dot.clone(),
        }
    }
}

/// A format-2 state: as format 3, with registrations of format 2.
#[derive(Deserialize)]
pub(crate) struct WireV2 {
    regs: RegMapV2,
    leases: BTreeMap<ReplicaId, DotFun<Lease>>,
    ctx: CausalContext,
    touched: Option<Touched>,
}

impl WireV2 {
    /// The state, each registration converted (see [`RegistrationV2`]).
    pub(crate) fn into_state(self) -> Result<State, InvalidState> {
        State::from_parts(
            upgrade_map(self.regs),
            self.leases.into_iter().collect(),
            self.ctx,
            self.touched,
        )
    }
}

/// A format-1 state: one lease per provider.
#[derive(Deserialize)]
pub(crate) struct WireV1 {
    regs: RegMapV2,
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
        State::from_parts(upgrade_map(self.regs), leases, self.ctx, None)
    }
}

#[cfg(test)]
mod tests {
    use serde::Serialize;

    use crate::id::{dot, ReplicaId};
    use crate::{Endpoint, Health, Hlc, Metadata};

    /// A registration as format 2 wrote it.
    #[derive(Serialize)]
    struct V2 {
        endpoint: Endpoint,
        meta: Metadata,
        written: Hlc,
        lease_dot: crate::Dot,
    }

    #[test]
    fn a_saved_entry_of_format_2_is_read_as_passing_and_registered_when_written() {
        let v2 = V2 {
            endpoint: Endpoint::new("10.0.0.1", 80).unwrap(),
            meta: [("zone", "a")].into(),
            written: Hlc::new(1_234, 5),
            lease_dot: dot(ReplicaId(7), 1),
        };
        let mut bytes = vec![2];
        bytes.extend(postcard::to_stdvec(&vec![(dot(ReplicaId(7), 2), v2)]).unwrap());
        let f = crate::codec::decode_registrations(&bytes).unwrap();
        let (d, r) = f.iter().next().unwrap();
        assert_eq!(*d, dot(ReplicaId(7), 2));
        assert_eq!(
            (r.status.health, r.since_ms, r.meta.get("zone")),
            (Health::Passing, 1_234, Some("a"))
        );
        // The current format of the same entry is not misread as format 2, nor the reverse.
        assert!(crate::codec::decode_registrations(&[&[3u8][..], &bytes[1..]].concat()).is_err());
    }
}
