//! How a node starts: its settings, checked, then the data directory opened, the
//! transport started and the background tasks spawned.

use std::path::{Path, PathBuf};
use std::time::Duration;

use roster_transport::driver;
use roster_transport::proto::{self, Zone};

use super::{
    millis, CrashGuard, Error, DEFAULT_CLUSTER, DEFAULT_CRASH_GUARD, DEFAULT_LEASE_TTL,
    DEFAULT_MAX_CLOCK_SKEW, DEFAULT_SYNC_MIN_INTERVAL, MAX_CLOCK_SKEW_MS, MIN_CLOCK_SKEW_MS,
};

mod startup;

/// The secret's bytes as the builder holds them; `Debug` shows only their length.
#[derive(Clone)]
struct SecretBytes(Vec<u8>);

impl std::fmt::Debug for SecretBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<{} bytes, redacted>", self.0.len())
    }
}

/// The secret length below which a node warns at start (the hard minimum is
/// [`roster_transport::handshake::MIN_SECRET_LEN`]).
const STRONG_SECRET_LEN: usize = 32;
/// The fewest distinct byte values a secret of [`STRONG_SECRET_LEN`] bytes or more may hold
/// without a warning (a hex string of random bytes holds 16; `aaaa...` or a repeated word
/// far fewer).
const STRONG_SECRET_DISTINCT: usize = 10;

/// Why a secret looks easy to guess, if it does: fewer than [`STRONG_SECRET_LEN`] bytes,
/// or fewer than [`STRONG_SECRET_DISTINCT`] distinct byte values. A heuristic: it cannot
/// tell a passphrase from random bytes, only catch the obvious.
fn secret_weakness(bytes: &[u8]) -> Option<String> {
    if bytes.len() < STRONG_SECRET_LEN {
        return Some(format!(
            "has {} bytes, fewer than {STRONG_SECRET_LEN}",
            bytes.len()
        ));
    }
    let mut seen = [false; 256];
    for &b in bytes {
        seen[usize::from(b)] = true;
    }
    let distinct = seen.iter().filter(|&&x| x).count();
    (distinct < STRONG_SECRET_DISTINCT).then(|| {
        format!(
            "holds only {distinct} distinct byte values in {} bytes",
            bytes.len()
        )
    })
}

/// How to start a [`Node`](crate::Node).
#[derive(Debug, Clone)]
pub struct NodeBuilder {
    listen: String,
    advertise: Option<String>,
    join: Vec<String>,
    data_dir: Option<PathBuf>,
    secret: Option<SecretBytes>,
    name: Option<String>,
    zone: Zone,
    cluster: String,
    fanout: usize,
    gossip_interval: Duration,
    lease_ttl: Duration,
    lease_per_member: Duration,
    max_clock_skew: Duration,
    reset_identity: bool,
    sync_min_interval: Duration,
    serve_clients: bool,
    client_auth_always: bool,
    crash_guard: Option<CrashGuard>,
    tls: Option<driver::TlsConfig>,
    exec_checks: bool,
    damping: Damping,
}

/// How this node damps a cut-off zone (see [`NodeBuilder::damping`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Damping {
    /// The share of another zone's members, in percent (0 to 100), that must be lost
    /// within `window` for the zone to be judged cut off; 100 never damps.
    pub share_pct: u8,
    /// The window those losses must fall in.
    pub window: Duration,
    /// How long a member of a damped zone is shown as unreachable before it is gone.
    pub bound: Duration,
    /// Whether reads serve unreachable instances (passing or warning before the cut) as
    /// they serve passing ones; by default they list them only when asked for every
    /// instance.
    pub serve_unreachable: bool,
}

impl Default for Damping {
    fn default() -> Self {
        let p = proto::Config::default();
        Self {
            share_pct: p.damping_share_pct,
            window: Duration::from_millis(p.damping_window_ms),
            bound: Duration::from_millis(p.damping_bound_ms),
            serve_unreachable: false,
        }
    }
}

impl Default for NodeBuilder {
    fn default() -> Self {
        let protocol = proto::Config::default();
        Self {
            // A free port: an embedded node must not take the agent's (DEFAULT_LISTEN).
            listen: "127.0.0.1:0".to_string(),
            advertise: None,
            join: Vec::new(),
            data_dir: None,
            secret: None,
            name: None,
            zone: Zone::default(),
            cluster: DEFAULT_CLUSTER.to_string(),
            fanout: protocol.fanout,
            gossip_interval: Duration::from_millis(protocol.gossip_interval_ms),
            lease_ttl: DEFAULT_LEASE_TTL,
            lease_per_member: Duration::from_millis(protocol.lease_per_member_ms),
            max_clock_skew: DEFAULT_MAX_CLOCK_SKEW,
            reset_identity: false,
            sync_min_interval: DEFAULT_SYNC_MIN_INTERVAL,
            serve_clients: false,
            client_auth_always: false,
            crash_guard: Some(DEFAULT_CRASH_GUARD),
            tls: None,
            exec_checks: false,
            damping: Damping::default(),
        }
    }
}

impl NodeBuilder {
    /// The address to listen on for peers (and clients). Default `127.0.0.1:0`: a free
    /// loopback port ([`Node::url`](crate::Node::url) says which), so an embedded node never takes the port
    /// of an agent on the same host ([`crate::DEFAULT_LISTEN`]).
    #[must_use]
    pub fn listen(mut self, addr: impl Into<String>) -> Self {
        self.listen = addr.into();
        self
    }

    /// The URL peers dial (default: `ws://` and the bound address).
    #[must_use]
    pub fn advertise(mut self, url: impl Into<String>) -> Self {
        self.advertise = Some(url.into());
        self
    }

    /// Seed URLs to join through (`ws://host:port`).
    #[must_use]
    pub fn join<I, S>(mut self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.join.extend(urls.into_iter().map(Into::into));
        self
    }

    /// Where the replica, the node's identity and its registrations live. Without one the
    /// node is ephemeral: a new identity each start, nothing resumed.
    #[must_use]
    pub fn data_dir(mut self, dir: impl AsRef<Path>) -> Self {
        self.data_dir = Some(dir.as_ref().to_path_buf());
        self
    }

    /// The cluster secret (at least 16 bytes). Without one the node listens on loopback only.
    #[must_use]
    pub fn cluster_secret(mut self, secret: impl Into<Vec<u8>>) -> Self {
        self.secret = Some(SecretBytes(secret.into()));
        self
    }

    /// The node's name, for people (default: `node-<id>`).
    #[must_use]
    pub fn node_name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The failure domain the node runs in (a rack, an availability zone), written with its
    /// membership so every node knows it: `members`, `status`, the HTTP API and metrics
    /// show it. Default: [`Zone::DEFAULT`], which writes nothing (a cluster that sets no
    /// zone writes what it wrote before zones).
    #[must_use]
    pub fn zone(mut self, zone: Zone) -> Self {
        self.zone = zone;
        self
    }

    /// The cluster's name: nodes of another cluster are refused (default `roster`).
    #[must_use]
    pub fn cluster(mut self, name: impl Into<String>) -> Self {
        self.cluster = name.into();
        self
    }

    /// Peers each gossip round goes to, and the most outbound connections the node keeps
    /// (default 2). A change is pushed to every connected peer that lacks it.
    #[must_use]
    pub fn fanout(mut self, n: usize) -> Self {
        self.fanout = n;
        self
    }

    /// The gossip round (default 1 s).
    #[must_use]
    pub fn gossip_interval(mut self, d: Duration) -> Self {
        self.gossip_interval = d;
        self
    }

    /// The shortest lease of this node's registrations and membership (default 30 s): when
    /// the node dies and no peer writes it dead, its registrations disappear this long after
    /// its last renewal. In a larger cluster the lease is longer (see
    /// [`NodeBuilder::lease_per_member`]).
    #[must_use]
    pub fn lease_ttl(mut self, d: Duration) -> Self {
        self.lease_ttl = d;
        self
    }

    /// How much the lease grows per live member this node sees, their count rounded up to a
    /// power of two (default 24 s; at most 24 h in all), so renewals, which reach every
    /// node, cost each node the same at any size. Zero keeps the lease at
    /// [`NodeBuilder::lease_ttl`] whatever the cluster's size.
    #[must_use]
    pub fn lease_per_member(mut self, d: Duration) -> Self {
        self.lease_per_member = d;
        self
    }

    /// How far ahead of this node's clock a peer's clock, and any time in what it sends (a
    /// registration's write, a lease), may be (default 5 s); further is refused, so no
    /// deadline lies further ahead than this plus the longest lease. Expired leases are
    /// collected no sooner than this after their end.
    #[must_use]
    pub fn max_clock_skew(mut self, d: Duration) -> Self {
        self.max_clock_skew = d;
        self
    }

    /// Start under a new identity, keeping the registrations this node owns (default
    /// `false`): the replica, the counter floor and what the node knew of its peers are
    /// forgotten and resynced from peers. The way out of a data directory whose replica
    /// cannot be read (a history poisoned before roster checked what peers send). Has
    /// effect only with a data directory; use it for one start.
    #[must_use]
    pub fn reset_identity(mut self, yes: bool) -> Self {
        self.reset_identity = yes;
        self
    }

    /// The least time between two manual syncs (default 30 s).
    #[must_use]
    pub fn sync_min_interval(mut self, d: Duration) -> Self {
        self.sync_min_interval = d;
        self
    }

    /// How this node damps a cut-off zone: when more than `share_pct` of another zone's
    /// members are lost within `window`, their instances are shown with the status
    /// `unreachable` for up to `bound` instead of being removed, and come back when their
    /// nodes are heard again (default 30%, 30 s, 10 minutes; reads leave them out unless
    /// asked for every instance, or unless `serve_unreachable`). A node's own zone is
    /// never damped by it; a zone of fewer than three members never is.
    #[must_use]
    pub fn damping(mut self, damping: Damping) -> Self {
        self.damping = damping;
        self
    }

    /// Whether this node runs exec health checks (default: no). They run commands as this
    /// process's user, so anyone who may register may run them: off unless asked, as in
    /// Consul.
    #[must_use]
    pub fn enable_exec_checks(mut self, yes: bool) -> Self {
        self.exec_checks = yes;
        self
    }

    /// Whether to serve `roster` clients on the listener (what `roster agent` does).
    #[must_use]
    pub fn serve_clients(mut self, yes: bool) -> Self {
        self.serve_clients = yes;
        self
    }

    /// The crash-loop guard (default: more than 5 launches in 5 minutes); `None` turns it
    /// off. Launches are counted in the data directory; a node without one never trips it.
    /// Under the guard the node keeps its own registrations and lease, answers reads and
    /// receives deltas, but opens one connection only, takes the long backoff, and sends no
    /// full state unasked, until it has stayed up for the window.
    #[must_use]
    pub fn crash_guard(mut self, guard: Option<CrashGuard>) -> Self {
        self.crash_guard = guard;
        self
    }

    /// Whether clients on loopback must prove the cluster secret too (default: only
    /// clients elsewhere must). Has effect only with a secret.
    #[must_use]
    pub fn require_client_auth(mut self, always: bool) -> Self {
        self.client_auth_always = always;
        self
    }

    /// Mutual TLS from PEM files: this node's certificate chain, its private key, and the
    /// CA that signs every node's certificate. The node then serves `wss://` only (its URL
    /// becomes `wss://`), dials `wss://` peers checking their certificates against the CA,
    /// presents its certificate to the peers it dials, and refuses a peer, or a client not on
    /// loopback, that shows no certificate of that CA.
    #[must_use]
    pub fn tls(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>, ca: impl Into<PathBuf>) -> Self {
        self.tls = Some(driver::TlsConfig {
            cert_pem: cert.into(),
            key_pem: key.into(),
            ca_pem: ca.into(),
        });
        self
    }

    /// The settings, checked; [`Error::Setting`] names the one out of range.
    fn check(&self) -> Result<(), Error> {
        if let Some(tls) = &self.tls {
            tls.check().map_err(|e| Error::Tls(e.to_string()))?;
        }
        if self.fanout == 0 || self.fanout > 64 {
            return Err(setting(
                "fanout",
                format!("fanout {} is out of range; use 1 to 64", self.fanout),
            ));
        }
        let gossip = millis(self.gossip_interval);
        if !(10..=60_000).contains(&gossip) {
            return Err(setting(
                "gossip_interval",
                format!(
                    "gossip interval {:?} is out of range; use 10ms to 60s",
                    self.gossip_interval
                ),
            ));
        }
        let lease = millis(self.lease_ttl);
        if !(roster_registry::MIN_LEASE_TTL_MS..=roster_registry::MAX_LEASE_TTL_MS).contains(&lease)
            || lease < 3 * gossip
        {
            return Err(setting(
                "lease_ttl",
                format!(
                    "lease TTL {:?} is out of range; use at least 100ms and 3 gossip intervals, at most 24h",
                    self.lease_ttl
                ),
            ));
        }
        if millis(self.lease_per_member) > roster_registry::MAX_LEASE_TTL_MS {
            return Err(setting(
                "lease_per_member",
                format!(
                "lease per member {:?} is out of range; use 0s (a lease of --lease-ttl at any size) to 24h",
                self.lease_per_member
            ),
            ));
        }
        let skew = millis(self.max_clock_skew);
        if !(MIN_CLOCK_SKEW_MS..=MAX_CLOCK_SKEW_MS).contains(&skew) {
            return Err(setting(
                "max_clock_skew",
                format!(
                    "max clock skew {:?} is out of range; use 100ms to 10m",
                    self.max_clock_skew
                ),
            ));
        }
        if self.join.len() > proto::MAX_SEEDS {
            return Err(setting(
                "join",
                format!("{} join URLs; give at most {}", self.join.len(), proto::MAX_SEEDS),
            ));
        }
        for url in &self.join {
            if !(url.starts_with("ws://") || url.starts_with("wss://")) || proto::url_endpoint(url).is_err() {
                return Err(setting(
                    "join",
                    format!("join URL {url:?} is not ws://host:port or wss://host:port"),
                ));
            }
        }
        Ok(())
    }
}

/// An out-of-range setting, named by its builder method.
fn setting(name: &'static str, message: String) -> Error {
    Error::Setting { name, message }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::Node;

    #[test]
    fn a_builders_debug_output_never_shows_the_secret() {
        let secret = "correct-horse-battery-staple-0123456789";
        let shown = format!("{:?}", Node::builder().cluster_secret(secret));
        assert!(!shown.contains(secret), "{shown}");
        // Nor its bytes as numbers, as a derived Debug of a Vec<u8> would print them.
        let as_numbers = format!("{:?}", &secret.as_bytes()[..4]);
        assert!(!shown.contains(as_numbers.trim_matches(['[', ']'])), "{shown}");
        assert!(shown.contains("redacted"), "{shown}");
    }

    #[test]
    fn short_or_repetitive_secrets_are_called_weak_and_random_ones_are_not() {
        assert!(secret_weakness(b"sixteen-bytes-or-more")
            .unwrap()
            .contains("21 bytes"));
        assert!(secret_weakness(&[b'a'; 64]).unwrap().contains("1 distinct"));
        assert!(secret_weakness(b"passwordpasswordpasswordpassword").is_some());
        // 32 random bytes in base64 (as the docs say to make one), and in hex.
        assert_eq!(
            secret_weakness(b"q8Vw0yU3kq2m9Hc7r1XfLZb0pQe5T4nJ6sYdGa2uWkE="),
            None
        );
        assert_eq!(
            secret_weakness(b"3f9a0c27d1e84b6f5a2c9e07b3d14f68a9c2e5071b3d4f6e8a0c2e4f6a8b0c1d"),
            None
        );
    }
}
