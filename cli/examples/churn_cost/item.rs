//! The instances the churn examples write (`churn_cost`, and `receive_allocs`, which
//! includes this file by its path).

use roster::api::RegisterItem;

/// The service every instance belongs to.
pub const SERVICE: &str = "churn";

/// Instance `c<seq mod n>` with metadata `seq=<seq>` (the preload has seq 0).
pub fn item(n: usize, seq: u64) -> RegisterItem {
    let i = (seq as usize) % n;
    RegisterItem {
        service: SERVICE.into(),
        address: format!("10.0.0.1:{}", 1 + i % 60_000),
        meta: vec![("seq".into(), seq.to_string())],
        instance: Some(format!("c{i}")),
        ttl_ms: None,
        checks: vec![],
    }
}
