//! Membership as registry data: the reserved service every node registers itself under, and
//! how a member is written there (instance id `node-<hex id>`, its URL and name in the
//! metadata). The one place that encoding is written and read: the protocol and the
//! embedded API (`roster members`, `explain`) both go through it.

use roster_registry::{
    Endpoint, InstanceRef, InvalidInput, Lease, Metadata, ProviderId, Replica, ReplicaId, ServiceName,
};

use super::{Node, NodeInfo};

/// The service every roster node registers itself under.
pub const MEMBERS_SERVICE: &str = "roster";

/// The instance id a node registers itself under in [`MEMBERS_SERVICE`].
pub(super) fn member_provider(id: ReplicaId) -> ProviderId {
    ProviderId::new(&format!("node-{id}")).expect("a hex replica id is a valid provider id")
}

/// [`MEMBERS_SERVICE`] as a service name.
pub(super) fn members_service() -> ServiceName {
    MEMBERS.clone()
}

static MEMBERS: std::sync::LazyLock<ServiceName> = std::sync::LazyLock::new(|| {
    ServiceName::new(MEMBERS_SERVICE).expect("the members service name is valid")
});

/// The metadata of a node's member registration: its URL and name.
pub(super) fn member_meta(me: &NodeInfo) -> Metadata {
    [("url", me.url.as_str()), ("name", me.name.as_str())].into()
}

/// A live member, as read from its registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveMember<'a> {
    /// The node.
    pub id: ReplicaId,
    /// Where it is dialed (`None` when its registration has none).
    pub url: Option<&'a str>,
    /// Its name, for people (empty when its registration has none).
    pub name: &'a str,
    /// The lease of its registration: when it was last renewed, and for how long.
    pub lease: &'a Lease,
}

impl<'a> LiveMember<'a> {
    /// The member an instance of [`MEMBERS_SERVICE`] stands for; `None` when its instance id
    /// is not a member's.
    pub fn of(i: &InstanceRef<'a>) -> Option<Self> {
        let id = i
            .provider
            .as_str()
            .strip_prefix("node-")
            .and_then(|h| u64::from_str_radix(h, 16).ok())?;
        let meta = &i.registration.meta;
        Some(Self {
            id: ReplicaId(id),
            url: meta.get("url"),
            name: meta.get("name").unwrap_or_default(),
            lease: i.lease,
        })
    }
}

/// Every live member in `replica` at `now_ms`, this node included.
pub fn live_members(replica: &Replica, now_ms: u64) -> Vec<LiveMember<'_>> {
    replica
        .instances(&MEMBERS, now_ms)
        .filter_map(|i| LiveMember::of(&i))
        .collect()
}

/// The host and port of a `ws://` or `wss://` URL.
///
/// # Errors
/// [`InvalidInput::Endpoint`] when the URL has no host or port.
pub fn url_endpoint(url: &str) -> Result<Endpoint, InvalidInput> {
    let rest = url
        .strip_prefix("ws://")
        .or_else(|| url.strip_prefix("wss://"))
        .unwrap_or(url);
    let authority = rest.split('/').next().unwrap_or(rest);
    Endpoint::parse(authority)
}

impl Node {
    /// The live members other than this node, by id, with their URL and name.
    pub fn members(&self, now_ms: u64) -> Vec<(ReplicaId, String, String)> {
        live_members(&self.replica, now_ms)
            .into_iter()
            .filter(|m| m.id != self.me.id)
            .filter_map(|m| Some((m.id, m.url?.to_string(), m.name.to_string())))
            .collect()
    }
}
