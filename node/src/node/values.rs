//! The values of the embedded API: a service to register, an instance as read, a member,
//! and what a watch sees.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use roster_registry::Health;

#[cfg(doc)]
use super::Node;
use crate::api::{InstanceView, MemberView};
use crate::check::Check;

/// A service instance to register: a name, an address, metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    pub(super) name: String,
    pub(super) address: String,
    pub(super) meta: Vec<(String, String)>,
    pub(super) id: Option<String>,
    pub(super) ttl: Option<Duration>,
    pub(super) checks: Vec<Check>,
}

impl Service {
    /// An instance of service `name` listening at `address` (`host:port`).
    pub fn new(name: impl Into<String>, address: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            address: address.into(),
            meta: Vec::new(),
            id: None,
            ttl: None,
            checks: Vec::new(),
        }
    }

    /// Adds a health check, run by this node while it owns the registration (at most
    /// [`crate::check::MAX_CHECKS`]). An instance with checks starts critical (not served)
    /// until its first probe passes; its status is the worst of its checks'.
    #[must_use]
    pub fn check(mut self, check: Check) -> Self {
        self.checks.push(check);
        self
    }

    /// Adds a metadata pair. A key given twice is refused when registering.
    #[must_use]
    pub fn meta(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.meta.push((key.into(), value.into()));
        self
    }

    /// The instance id (default: `<service>-<node name>`): stable across restarts, so a
    /// restart is an update, not a removal and an addition.
    #[must_use]
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// Ends the registration after `ttl` unless it is registered again (default: never);
    /// from [`MIN_REGISTRATION_TTL`](crate::MIN_REGISTRATION_TTL) (1 s) to
    /// [`MAX_REGISTRATION_TTL`](crate::MAX_REGISTRATION_TTL) (24 h).
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }
}

/// The status reads show for an instance of an unreachable node (see
/// [`Instance::unreachable`]).
pub const UNREACHABLE: &str = "unreachable";

/// A live instance, as a read returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// The service.
    pub service: String,
    /// The instance id.
    pub id: String,
    /// `host:port`.
    pub address: String,
    /// Its metadata.
    pub meta: BTreeMap<String, String>,
    /// How it is doing: [`Node::lookup`] returns passing and warning instances only.
    pub status: Health,
    /// Why (a check's output, a maintenance reason); empty when there is nothing to say.
    pub note: String,
    /// The node that registered it (16 hex digits).
    pub node: String,
    /// When it was first registered (kept across updates and its node's restarts).
    pub registered_at: SystemTime,
    /// When its lease ends unless renewed; for an unreachable instance, when it stops
    /// being shown.
    pub lease_expires_at: SystemTime,
    /// Its node is unreachable: its zone was judged cut off (most of its nodes lost at
    /// once), so it is shown with the status `unreachable` instead of being removed, and
    /// reads leave it out unless asked for every instance (or the agent serves
    /// unreachable instances). It returns to its own status when its node is heard again.
    pub unreachable: bool,
}

impl Instance {
    /// Copied straight out of the replica (one copy, where `to_owned` then
    /// [`Instance::from_registry`] made two: a read of 10,000 instances is mostly copies).
    pub(super) fn from_ref(i: &roster_registry::InstanceRef<'_>) -> Self {
        let r = i.registration;
        Self {
            service: i.service.as_str().to_string(),
            id: i.provider.as_str().to_string(),
            address: r.endpoint.to_string(),
            meta: r
                .meta
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            status: r.status.health,
            note: r.status.note.clone(),
            node: i.node().to_string(),
            registered_at: at(r.since_ms),
            lease_expires_at: at(i.lease.deadline_ms()),
            unreachable: i.unreachable,
        }
    }

    pub(super) fn from_registry(i: &roster_registry::Instance) -> Self {
        Self {
            service: i.service.as_str().to_string(),
            id: i.provider.as_str().to_string(),
            address: i.endpoint.to_string(),
            meta: i
                .meta
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            status: i.status.health,
            note: i.status.note.clone(),
            node: i.node.to_string(),
            registered_at: at(i.since_ms),
            lease_expires_at: at(i.lease_deadline_ms),
            unreachable: i.unreachable,
        }
    }

    /// Whether a read returns it unless asked for every instance: passing or warning,
    /// and not unreachable.
    pub fn is_served(&self) -> bool {
        !self.unreachable && self.status.is_served()
    }

    /// Its status as reads show it: `unreachable` for an instance of an unreachable node,
    /// else its own (`passing`, `warning`, `critical`, `maintenance`).
    pub fn status_name(&self) -> &'static str {
        if self.unreachable {
            UNREACHABLE
        } else {
            self.status.as_str()
        }
    }

    /// Whether `other` shows the same to a reader: address, metadata and status (not the
    /// lease, which moves with every renewal of its node).
    pub(crate) fn shows_as(&self, other: &Instance) -> bool {
        (
            &self.address,
            &self.meta,
            self.status,
            &self.note,
            self.unreachable,
        ) == (
            &other.address,
            &other.meta,
            other.status,
            &other.note,
            other.unreachable,
        )
    }

    /// As the client protocol (and `roster get --json`) shows it.
    pub fn view(&self) -> InstanceView {
        InstanceView {
            service: self.service.clone(),
            instance: self.id.clone(),
            address: self.address.clone(),
            meta: self.meta.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            status: self.status_name().to_string(),
            note: self.note.clone(),
            node: self.node.clone(),
            registered_at_ms: ms(self.registered_at),
            lease_expires_at_ms: ms(self.lease_expires_at),
        }
    }
}

/// How a node of the cluster is doing, as this node sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberState {
    /// Its lease is live and renewed on time.
    Alive,
    /// Its lease is live, but its renewal is late.
    Suspect,
    /// Left lately, by its own word (`roster leave`, a shutdown): its farewell is in the
    /// registry, so every node says so.
    Left,
    /// Lost lately without a word: written dead by a peer (its connections closed and no
    /// peer reached it), force-left, or its lease ended.
    Failed,
    /// Lost with most of its zone at once: the zone is judged cut off, not dead, so its
    /// instances are shown `unreachable` until it is heard again (or for the damping's
    /// bound).
    Unreachable,
}

impl MemberState {
    /// The name, as `roster members` shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Alive => "alive",
            Self::Suspect => "suspect",
            Self::Left => "left",
            Self::Failed => "failed",
            Self::Unreachable => "unreachable",
        }
    }
}

/// A node of the cluster, as [`Node::members`] returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its id (16 hex digits).
    pub node: String,
    /// Its name.
    pub name: String,
    /// Its URL.
    pub address: String,
    /// Its zone, as its membership names it ([`crate::Zone::DEFAULT`] when it names
    /// none); `None` for a node gone, whose membership is no more.
    pub zone: Option<String>,
    /// How it is doing.
    pub state: MemberState,
    /// How long ago it was last heard of.
    pub last_heard: Duration,
    /// How long its membership lease has left unless renewed; `None` for a node that left
    /// or failed.
    pub lease_left: Option<Duration>,
    /// How long ago this node last exchanged state with it directly: took a change, an
    /// acknowledgement, a digest or a state hash from it over a connection. `None` for
    /// this node itself, and for a node it has had no connection with since it started
    /// (what it holds of such a node came through others).
    pub synced: Option<Duration>,
}

impl Member {
    /// As the client protocol (and `roster members --json`) shows it.
    pub fn view(&self) -> MemberView {
        MemberView {
            node: self.node.clone(),
            name: self.name.clone(),
            address: self.address.clone(),
            zone: self.zone.clone(),
            state: self.state.as_str().to_string(),
            last_heard_ms: ms_of(self.last_heard),
            lease_left_ms: self.lease_left.map(ms_of),
            synced_ms: self.synced.map(ms_of),
        }
    }
}

pub(super) fn ms_of(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A change a watch sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The instance is up: new to the watch, or its address or metadata changed.
    Up(Instance),
    /// Only the instance's status (or its note) changed, and it is still shown.
    Status(Instance),
    /// The instance is down: deregistered, its lease ended, or no longer served (critical
    /// or in maintenance, for a watch of served instances).
    Down {
        /// The service.
        service: String,
        /// The instance id.
        id: String,
        /// The address it had when this watch last showed it (empty for one the watch
        /// never showed: a remote client's, resumed with `WatchFrom`).
        address: String,
    },
}

pub(super) fn at(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

pub(super) fn ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
