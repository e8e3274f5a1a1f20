//! A registration this node owns, as saved, and the keys it is saved under.

use roster_registry::{Endpoint, Health, InvalidInput, Metadata, ProviderId, RegKey, ServiceName, Status};
use roster_transport::proto::OwnedRegistration;
use serde::{Deserialize, Serialize};

use crate::check::Check;

/// A registration this node owns, as saved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnedRecord {
    /// The service.
    pub service: String,
    /// The instance (provider) id.
    pub instance: String,
    /// `host:port`.
    pub address: String,
    /// Metadata pairs.
    pub meta: Vec<(String, String)>,
    /// The node's lease when it was saved, in milliseconds. Kept so the record's encoding
    /// stays the same; a registration lives by its node's lease of the current run.
    pub lease_ttl_ms: u64,
    /// When it was registered (wall ms).
    pub registered_at_ms: u64,
    /// When it ends unless registered again (wall ms); `None`: until deregistered.
    pub expires_at_ms: Option<u64>,
    // Appended in 0.x (records of older builds end above: see `OwnedRecord::decode`).
    /// Its health as last written by its checks (passing when it has none).
    pub status: Status,
    /// Why an operator took it out of service (`roster maint`); `None`: in service.
    pub maintenance: Option<String>,
    /// Its health checks, run by this node.
    pub checks: Vec<Check>,
}

/// An own registration as builds before health checks saved it.
#[derive(Deserialize)]
pub(super) struct OwnedRecordV1 {
    service: String,
    instance: String,
    address: String,
    meta: Vec<(String, String)>,
    lease_ttl_ms: u64,
    registered_at_ms: u64,
    expires_at_ms: Option<u64>,
}

impl OwnedRecord {
    /// The key in the `owned` and `removed` tables.
    pub fn key(&self) -> String {
        key(&self.service, &self.instance)
    }

    /// A saved record: this build's, or an older build's (passing, in service, no checks).
    ///
    /// # Errors
    /// Why the bytes are neither.
    pub fn decode(bytes: &[u8]) -> Result<Self, postcard::Error> {
        // A record of an older build is a prefix of this build's shape (fields were
        // appended), and an older build reading ours stops where its shape ends.
        postcard::from_bytes(bytes).or_else(|e| {
            // All of the bytes: a record of ours cut short is refused, not read as older.
            let old: OwnedRecordV1 = match postcard::take_from_bytes(bytes) {
                Ok((old, [])) => old,
                _ => return Err(e),
            };
            Ok(Self {
                service: old.service,
                instance: old.instance,
                address: old.address,
                meta: old.meta,
                lease_ttl_ms: old.lease_ttl_ms,
                registered_at_ms: old.registered_at_ms,
                expires_at_ms: old.expires_at_ms,
                status: Status::passing(),
                maintenance: None,
                checks: Vec::new(),
            })
        })
    }

    /// The status to write: maintenance (with its reason) while an operator holds it out
    /// of service, else what its checks decided.
    pub fn effective_status(&self) -> Status {
        match &self.maintenance {
            Some(reason) => Status::new(Health::Maintenance, reason),
            None => self.status.clone(),
        }
    }

    /// The registration to write into the replica, checked.
    ///
    /// # Errors
    /// The rule a part breaks.
    pub fn registration(&self) -> Result<OwnedRegistration, InvalidInput> {
        self.registration_of(self.parts()?)
    }

    /// The registration to write into the replica, of this record's `parts` as already
    /// checked (a registration is parsed once, when it comes in).
    ///
    /// # Errors
    /// The status breaks a rule.
    pub fn registration_of(&self, parts: Parts) -> Result<OwnedRegistration, InvalidInput> {
        let status = self.effective_status();
        status.validate()?;
        Ok(OwnedRegistration {
            service: parts.service,
            provider: parts.provider,
            endpoint: parts.endpoint,
            meta: parts.meta,
            status,
            since_ms: self.registered_at_ms,
        })
    }

    /// The typed parts, checked.
    ///
    /// # Errors
    /// The rule a part breaks.
    pub fn parts(&self) -> Result<Parts, InvalidInput> {
        let meta: Metadata = self.meta.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        roster_registry::validate_metadata(&meta)?;
        Ok(Parts {
            service: ServiceName::new(&self.service)?,
            provider: ProviderId::new(&self.instance)?,
            endpoint: Endpoint::parse(&self.address)?,
            meta,
        })
    }
}

/// What a record's registration is made of, besides its status and age: its strings
/// parsed into the registry's types and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parts {
    /// The service.
    pub service: ServiceName,
    /// The instance (provider) id.
    pub provider: ProviderId,
    /// Where it listens.
    pub endpoint: Endpoint,
    /// Its metadata.
    pub meta: Metadata,
}

pub(crate) fn key(service: &str, instance: &str) -> String {
    // Neither part may contain a '/' (service names are DNS-like, ids have no '/').
    format!("{service}/{instance}")
}

/// The key of an instance named by strings; `None` when either name is not valid.
pub(crate) fn reg_key(service: &str, instance: &str) -> Option<RegKey> {
    Some(RegKey {
        service: ServiceName::new(service).ok()?,
        provider: ProviderId::new(instance).ok()?,
    })
}

/// The key of an instance from its store key (`service/instance`).
pub(crate) fn split_key(k: &str) -> Option<RegKey> {
    let (s, p) = k.split_once('/')?;
    reg_key(s, p)
}
