//! Membership as registry data: the reserved service every node registers itself under, and
//! a member's instance id and URL.

use roster_registry::{Endpoint, InvalidInput, ProviderId, ReplicaId, ServiceName};

use super::Node;

/// The service every roster node registers itself under.
pub const MEMBERS_SERVICE: &str = "roster";

pub(super) fn member_provider(id: ReplicaId) -> ProviderId {
    ProviderId::new(&format!("node-{id}")).expect("a hex replica id is a valid provider id")
}

pub(super) fn members_service() -> ServiceName {
    ServiceName::new(MEMBERS_SERVICE).expect("the members service name is valid")
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
        let service = members_service();
        self.replica
            .instances(&service, now_ms)
            .filter_map(|i| {
                let id = i
                    .provider
                    .as_str()
                    .strip_prefix("node-")
                    .and_then(|h| u64::from_str_radix(h, 16).ok())?;
                let id = ReplicaId(id);
                let url = i.registration.meta.get("url")?.to_string();
                let name = i.registration.meta.get("name").unwrap_or_default().to_string();
                (id != self.me.id).then_some((id, url, name))
            })
            .collect()
    }
}
