//! What a node keeps in memory of a registration it owns: the registration it writes,
//! shared with the protocol (which writes it again after a sweep), and what only the owner
//! needs besides (its checks, its `ttl`, its maintenance). The record saved on disk is
//! rebuilt from these when it is written again; an owner of 100,000 kept every string of
//! every registration a second time before (about 500 B each).

use std::sync::Arc;

use roster_registry::{Health, RegKey, Status};
use roster_transport::proto::OwnedRegistration;

use crate::check::Check;
use crate::store::OwnedRecord;

/// One registration this node owns.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    /// What the replica gets (with the status to write): the protocol holds the same one.
    pub(crate) reg: Arc<OwnedRegistration>,
    /// What only the owner knows of it; `None` for one that has none (no checks, no
    /// `ttl`, in service: nearly all of a bulk load), so that one costs a pointer.
    own: Option<Box<OwnerOnly>>,
}

/// What the owner alone keeps of a registration.
#[derive(Debug, Clone, Default)]
struct OwnerOnly {
    /// The status its checks decided (`reg` holds maintenance instead while an operator
    /// keeps it out of service).
    status: Status,
    /// Why an operator took it out of service; `None`: in service.
    maintenance: Option<String>,
    /// Its health checks, run by this node.
    checks: Vec<Check>,
    /// When it ends unless registered again (wall ms); `None`: until deregistered.
    expires_at_ms: Option<u64>,
}

/// The key of the owned map for an instance named by strings; `None` when either name is
/// not valid, which no owned registration has.
pub(crate) use crate::store::reg_key as key_of;

/// The key of the owned map for a record.
pub(crate) fn record_key(rec: &OwnedRecord) -> Option<RegKey> {
    key_of(&rec.service, &rec.instance)
}

/// The status of a registration without checks.
static PASSING: Status = Status {
    health: Health::Passing,
    note: String::new(),
};

impl Held {
    /// Keeps `rec`, whose registration (checked) is `reg`; the record itself is dropped.
    pub(crate) fn new(rec: OwnedRecord, reg: Arc<OwnedRegistration>) -> Self {
        let own = OwnerOnly {
            status: rec.status,
            maintenance: rec.maintenance,
            checks: rec.checks,
            expires_at_ms: rec.expires_at_ms,
        };
        let plain = own.status == PASSING
            && own.maintenance.is_none()
            && own.checks.is_empty()
            && own.expires_at_ms.is_none();
        Self {
            reg,
            own: (!plain).then(|| Box::new(own)),
        }
    }

    /// Its key in the owned map, sharing the registration's names.
    pub(crate) fn key(&self) -> RegKey {
        RegKey {
            service: self.reg.service.clone(),
            provider: self.reg.provider.clone(),
        }
    }

    /// The key of its checks and of its record on disk (`service/instance`).
    pub(crate) fn store_key(&self) -> String {
        crate::store::key(self.reg.service.as_str(), self.reg.provider.as_str())
    }

    /// The status its checks decided.
    pub(crate) fn status(&self) -> &Status {
        self.own.as_ref().map_or(&PASSING, |o| &o.status)
    }

    /// Why an operator took it out of service; `None`: in service.
    pub(crate) fn maintenance(&self) -> Option<&String> {
        self.own.as_ref().and_then(|o| o.maintenance.as_ref())
    }

    /// Its health checks.
    pub(crate) fn checks(&self) -> &[Check] {
        self.own.as_ref().map_or(&[], |o| &o.checks)
    }

    /// When its `ttl` ends (wall ms); `None`: until deregistered.
    pub(crate) fn expires_at_ms(&self) -> Option<u64> {
        self.own.as_ref().and_then(|o| o.expires_at_ms)
    }

    /// The record to save, as it was registered (the address and metadata as the
    /// registry holds them: the same registration, written canonically).
    pub(crate) fn record(&self, lease_ttl_ms: u64) -> OwnedRecord {
        let reg = &self.reg;
        OwnedRecord {
            service: reg.service.to_string(),
            instance: reg.provider.to_string(),
            address: reg.endpoint.to_string(),
            meta: reg
                .meta
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            lease_ttl_ms,
            registered_at_ms: reg.since_ms,
            expires_at_ms: self.expires_at_ms(),
            status: self.status().clone(),
            maintenance: self.maintenance().cloned(),
            checks: self.checks().to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use roster_registry::{Health, Status};

    use super::Held;
    use crate::store::OwnedRecord;

    /// A record kept as `Held` and rebuilt is the record that was saved.
    #[test]
    fn a_record_kept_and_rebuilt_is_the_record_saved() {
        let rec = OwnedRecord {
            service: "web".into(),
            instance: "w1".into(),
            address: "[::1]:8080".into(),
            meta: vec![("a".into(), "1".into()), ("zone".into(), "eu".into())],
            lease_ttl_ms: 30_000,
            registered_at_ms: 1_700_000_000_000,
            expires_at_ms: Some(1_700_000_060_000),
            status: Status::new(Health::Warning, "slow"),
            maintenance: Some("upgrade".into()),
            checks: Vec::new(),
        };
        let reg = Arc::new(rec.registration().unwrap());
        let held = Held::new(rec.clone(), reg);
        assert_eq!(held.record(30_000), rec);
        let plain = OwnedRecord {
            status: Status::passing(),
            maintenance: None,
            expires_at_ms: None,
            ..rec
        };
        let reg = Arc::new(plain.registration().unwrap());
        let held = Held::new(plain.clone(), reg);
        assert!(held.own.is_none(), "nothing but the registration is kept");
        assert_eq!(held.record(30_000), plain);
    }
}
