//! Membership as registry data: the reserved service every node registers itself under, and
//! how a member is written there (instance id `node-<hex id>`, its URL and name in the
//! metadata). The one place that encoding is written and read: the protocol and the
//! embedded API (`roster members`, `explain`) both go through it.

use roster_registry::{
    Endpoint, InstanceRef, InvalidInput, Lease, Metadata, ProviderId, Replica, ReplicaId, ServiceName,
};

use super::{Node, NodeInfo, Zone};

/// The service every roster node registers itself under.
pub const MEMBERS_SERVICE: &str = "roster";

/// The instance id a node registers itself under in [`MEMBERS_SERVICE`].
pub(super) fn member_provider(id: ReplicaId) -> ProviderId {
    ProviderId::new(&format!("node-{id}")).expect("a hex replica id is a valid provider id")
}

/// The member an instance id of [`MEMBERS_SERVICE`] stands for, if it is a member's.
pub(super) fn member_id(provider: &ProviderId) -> Option<ReplicaId> {
    let hex = provider.as_str().strip_prefix("node-")?;
    u64::from_str_radix(hex, 16).ok().map(ReplicaId)
}

/// [`MEMBERS_SERVICE`] as a service name.
pub(super) fn members_service() -> ServiceName {
    MEMBERS.clone()
}

static MEMBERS: std::sync::LazyLock<ServiceName> = std::sync::LazyLock::new(|| {
    ServiceName::new(MEMBERS_SERVICE).expect("the members service name is valid")
});

/// The metadata of a node's member registration: its URL, name, and zone unless it is
/// the default (so a cluster that sets none writes what it wrote before zones).
pub(super) fn member_meta(me: &NodeInfo) -> Metadata {
    let mut meta: Vec<(&str, &str)> = vec![("url", me.url.as_str()), ("name", me.name.as_str())];
    meta.extend(me.zone.written().map(|z| ("zone", z)));
    meta.into_iter().collect()
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
    /// Its zone ([`Zone::DEFAULT`] when its registration names none).
    pub zone: &'a str,
    /// The lease of its registration: when it was last renewed, and for how long.
    pub lease: &'a Lease,
    /// Whether it is shown only as unreachable: its lease ended or was written dead, and
    /// its zone is judged cut off (see `damping`).
    pub unreachable: bool,
}

impl<'a> LiveMember<'a> {
    /// The member an instance of [`MEMBERS_SERVICE`] stands for; `None` when its instance id
    /// is not a member's.
    pub fn of(i: &InstanceRef<'a>) -> Option<Self> {
        let id = member_id(i.provider)?;
        let meta = &i.registration.meta;
        Some(Self {
            id,
            url: meta.get("url"),
            name: meta.get("name").unwrap_or_default(),
            zone: Zone::name_of(meta.get("zone")),
            lease: i.lease,
            unreachable: i.unreachable,
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

/// Whether `node` left the cluster by its own word (`roster leave`, a shutdown): its lease
/// is its farewell ([`Lease::farewell`]), which replicates like any lease and is kept a day
/// on every replica. A node that is not a live member and did not leave was lost: written
/// dead by a peer, force-left, or its lease ended. A node back after it left writes a
/// lease again, which replaces the farewell.
pub fn has_left(replica: &Replica, node: ReplicaId) -> bool {
    replica.lease_of(node).is_some_and(Lease::is_farewell)
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
    /// The live members other than this node, by id, with their URL and name: not those
    /// only shown as unreachable (they are dialed as lost peers, so a healed cut is found).
    pub fn members(&self, now_ms: u64) -> Vec<(ReplicaId, String, String)> {
        live_members(&self.replica, now_ms)
            .into_iter()
            .filter(|m| m.id != self.me.id && !m.unreachable)
            .filter_map(|m| Some((m.id, m.url?.to_string(), m.name.to_string())))
            .collect()
    }

    /// How many members [`Node::members`] lists, from the member view (the same members:
    /// not this node, not only unreachable, with a URL): nothing is read or copied while
    /// the replica and the leases stay as they were.
    pub fn member_count(&self, now_ms: u64) -> usize {
        self.live_others(now_ms).len()
    }
}

#[cfg(test)]
mod tests {
    use roster_registry::{Hlc, State, FAREWELL_KEPT_MS};

    use super::*;

    const TTL: u64 = 60_000;

    /// A node that wrote its membership at `at`, and the delta that says so.
    fn member(id: u64, at: u64) -> (Replica, State) {
        let mut r = Replica::new(ReplicaId(id));
        let delta = register(&mut r, at);
        (r, delta)
    }

    fn register(r: &mut Replica, at: u64) -> State {
        let endpoint = Endpoint::parse("127.0.0.1:7420").unwrap();
        r.register(
            members_service(),
            member_provider(r.id()),
            endpoint,
            Metadata::default(),
            TTL,
            Hlc::new(at, 0),
        )
        .unwrap()
        .delta
    }

    fn write_dead(r: &mut Replica, node: u64, at: u64) -> Option<State> {
        let seen = r.lease_dots(ReplicaId(node));
        r.write_dead(ReplicaId(node), &seen, at).map(|a| a.delta)
    }

    fn ids(r: &Replica, now: u64) -> Vec<u64> {
        live_members(r, now).iter().map(|m| m.id.0).collect()
    }

    #[test]
    fn a_node_that_left_reads_as_left_and_one_written_dead_does_not_on_every_replica() {
        let (mut a, _) = member(1, 1_000);
        let (mut x, dx) = member(2, 1_000);
        let (_, dy) = member(3, 1_000);
        a.apply(dx, 1_000);
        a.apply(dy, 1_000);
        // x leaves; y is lost, and a writes it dead.
        a.apply(x.deregister_all(Hlc::new(2_000, 0)).delta, 2_000);
        write_dead(&mut a, 3, 2_000).unwrap();
        // b was no peer of x or y: it learns both from a's whole state.
        let mut b = Replica::new(ReplicaId(4));
        b.apply(a.state().clone(), 2_000);
        for r in [&a, &b] {
            assert_eq!(ids(r, 2_001), vec![1], "neither is a member");
            assert!(has_left(r, ReplicaId(2)), "x left");
            assert!(!has_left(r, ReplicaId(3)), "y failed");
        }
    }

    #[test]
    fn a_leave_racing_a_death_written_for_it_reads_as_left_in_either_order() {
        let (mut x, dx) = member(2, 1_000);
        let mut a = Replica::new(ReplicaId(1));
        a.apply(dx.clone(), 1_000);
        let dead = write_dead(&mut a, 2, 2_000).unwrap();
        let farewell = x.deregister_all(Hlc::new(2_000, 0)).delta;
        let mut replicas = Vec::new();
        for order in [[&dead, &farewell], [&farewell, &dead]] {
            let mut r = Replica::new(ReplicaId(5));
            r.apply(dx.clone(), 1_000);
            for d in order {
                r.apply(d.clone(), 2_000);
            }
            assert!(has_left(&r, ReplicaId(2)));
            replicas.push(r);
        }
        assert_eq!(replicas[0].state(), replicas[1].state());
        // A death written after the leave leaves the farewell be.
        assert!(write_dead(&mut replicas[0], 2, 3_000).is_none());
        assert!(has_left(&replicas[0], ReplicaId(2)));
    }

    /// Node 2, a member since 1,000, leaves at 2,000; replica 1 (returned second) saw both.
    fn left_at_2000() -> (Replica, Replica) {
        let (mut x, dx) = member(2, 1_000);
        let mut a = Replica::new(ReplicaId(1));
        a.apply(dx, 1_000);
        a.apply(x.deregister_all(Hlc::new(2_000, 0)).delta, 2_000);
        (x, a)
    }

    #[test]
    fn a_node_back_after_it_left_is_a_member_and_if_killed_then_it_failed() {
        let (x, mut a) = left_at_2000();
        assert!(has_left(&a, ReplicaId(2)));
        // x starts again from its disk, farewell included, and writes its membership.
        let mut x = Replica::from_state(ReplicaId(2), x.state().clone(), x.counter());
        a.apply(register(&mut x, 3_000), 3_000);
        assert_eq!(ids(&a, 3_001), vec![2]);
        assert!(!has_left(&a, ReplicaId(2)), "back: no longer left");
        // Killed this time (no farewell), and written dead: it failed.
        write_dead(&mut a, 2, 4_000).unwrap();
        assert!(ids(&a, 4_001).is_empty());
        assert!(!has_left(&a, ReplicaId(2)));
    }

    #[test]
    fn a_members_zone_is_read_on_every_replica_and_the_default_zone_is_not_written() {
        let info = |id: u64, zone: &str| NodeInfo {
            id: ReplicaId(id),
            name: format!("n{id}"),
            url: format!("ws://10.0.0.{id}:7420"),
            zone: Zone::new(zone).unwrap(),
        };
        let mut a = Replica::new(ReplicaId(1));
        for me in [info(2, "eu-west-1a"), info(3, "default")] {
            let meta = member_meta(&me);
            assert_eq!(meta.get("zone"), me.zone.written());
            let mut x = Replica::new(me.id);
            let endpoint = url_endpoint(&me.url).unwrap();
            let delta = x
                .register(
                    members_service(),
                    member_provider(me.id),
                    endpoint,
                    meta,
                    TTL,
                    Hlc::new(1_000, 0),
                )
                .unwrap()
                .delta;
            a.apply(delta, 1_000);
        }
        let zones: Vec<(u64, &str)> = live_members(&a, 1_001).iter().map(|m| (m.id.0, m.zone)).collect();
        assert_eq!(zones, vec![(2, "eu-west-1a"), (3, Zone::DEFAULT)]);
    }

    #[test]
    fn a_farewell_is_kept_a_day_then_collected_like_an_ended_lease() {
        let (_, mut a) = left_at_2000();
        assert!(a.expire(2_000 + FAREWELL_KEPT_MS - 1, 0).is_none());
        assert!(has_left(&a, ReplicaId(2)));
        assert!(a.expire(2_000 + FAREWELL_KEPT_MS, 0).is_some());
        assert!(!has_left(&a, ReplicaId(2)) && a.lease_of(ReplicaId(2)).is_none());
    }
}
