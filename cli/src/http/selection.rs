//! What a service query selects from the local replica, and the index that says whether
//! it changed: read by a plain read, a blocking query and a watch alike.

use sha2::{Digest, Sha256};

use super::params::ServiceQuery;

/// The instances of `service` a query shows, by id.
pub fn select(node: &roster::Node, service: &str, q: &ServiceQuery) -> Vec<roster::Instance> {
    let found = if q.wide() {
        node.lookup_all(service)
    } else {
        node.lookup(service)
    };
    let mut list: Vec<roster::Instance> = found.into_iter().filter(|i| q.admits(i)).collect();
    list.sort_by(|a, b| a.id.cmp(&b.id));
    list
}

/// The index of a list of instances: a fingerprint of what readers see (ids, addresses,
/// metadata, status and note; not the lease, which moves with every renewal). It changes
/// when they change, and every agent that holds the same instances gives the same index,
/// so a blocking query may go to another agent with the index it has.
pub fn index(list: &[roster::Instance]) -> u64 {
    let mut h = Sha256::new();
    for i in list {
        for part in [
            i.id.as_str(),
            i.address.as_str(),
            i.status_name(),
            i.note.as_str(),
        ] {
            h.update(part.as_bytes());
            h.update([0]);
        }
        for (k, v) in &i.meta {
            h.update(k.as_bytes());
            h.update([1]);
            h.update(v.as_bytes());
            h.update([0]);
        }
        h.update([2]);
    }
    let digest = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(first)
}
