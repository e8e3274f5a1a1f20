//! What the protocol's unit tests build: nodes and the memberships they write.

use roster_registry::{Endpoint, Hlc, Metadata, Replica, ReplicaId, State};

use super::membership::{member_provider, members_service};
use super::NodeInfo;

/// Node `i`, at `ws://127.0.0.{i}:7420`, named `n{i}`.
pub(super) fn info(i: u64) -> NodeInfo {
    NodeInfo {
        id: ReplicaId(i),
        name: format!("n{i}"),
        url: format!("ws://127.0.0.{i}:7420"),
        zone: Default::default(),
    }
}

/// A membership written by `r` (node `i`'s replica: each write a new dot) at `at`,
/// listening on `port`, with a lease of `ttl`.
pub(super) fn membership_by(r: &mut Replica, port: u16, at: u64, ttl: u64) -> State {
    let i = r.id().0;
    let url = format!("ws://127.0.0.{i}:{port}");
    let meta: Metadata = [("url", url.as_str()), ("name", &format!("n{i}"))].into();
    let ep = Endpoint::parse(&format!("127.0.0.{i}:{port}")).unwrap();
    let at = Hlc::new(at, port % 1000);
    r.register(
        members_service(),
        member_provider(ReplicaId(i)),
        ep,
        meta,
        ttl,
        at,
    )
    .unwrap()
    .delta
}

/// The same, node `i`'s first write.
pub(super) fn membership(i: u64, port: u16, at: u64, ttl: u64) -> State {
    membership_by(&mut Replica::new(ReplicaId(i)), port, at, ttl)
}
