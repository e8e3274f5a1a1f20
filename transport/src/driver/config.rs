//! How to run a node ([`DriverConfig`]), the check it passes at start, and why a node could
//! not start ([`StartError`]).

use std::net::SocketAddr;

use roster_registry::InvalidInput;
use tokio::net::TcpListener;

use super::limits::Limits;
use super::tls::{self, TlsConfig};
use super::ClientProtocol;
use crate::handshake::{Secret, MAX_CLUSTER_LEN, MAX_NAME_LEN, MAX_URL_LEN};
use crate::proto;

/// How to run a node.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    /// The cluster name; peers of another cluster are refused.
    pub cluster: String,
    /// This node's name (for people and logs).
    pub name: String,
    /// The failure domain this node runs in, written with its membership.
    pub zone: proto::Zone,
    /// The URL peers dial; `None` uses the listener's address, as `ws://`, or `wss://`
    /// with TLS.
    pub advertise_url: Option<String>,
    /// The cluster secret. Without one, the node runs unauthenticated and may listen on
    /// loopback only.
    pub secret: Option<Secret>,
    /// The protocol's knobs.
    pub protocol: proto::Config,
    /// Limits on peers.
    pub limits: Limits,
    /// TLS: when set, the node serves `wss://` only and can dial `wss://` peers.
    pub tls: Option<TlsConfig>,
    /// What a node resuming from disk writes again before it talks to a peer
    /// ([`Node::finish_resume`](crate::proto::Node::finish_resume)).
    pub resume: proto::Resume,
    /// The application's protocol for clients: connections that ask for it go there after
    /// the upgrade; `None` refuses them. They count under the inbound cap.
    pub clients: Option<ClientProtocol>,
    /// Told what each replica snapshot published for readers cost to make (for a latency
    /// histogram); `None`: nobody asks.
    pub on_snapshot: Option<SnapshotObserver>,
}

/// A function told the duration of each snapshot the node publishes for readers. It runs
/// on the node's task: it must return at once (record into a histogram, no I/O).
#[derive(Clone)]
pub struct SnapshotObserver(pub std::sync::Arc<dyn Fn(std::time::Duration) + Send + Sync>);

impl std::fmt::Debug for SnapshotObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SnapshotObserver")
    }
}

impl DriverConfig {
    /// A configuration with default protocol knobs and limits, no secret, and the
    /// listener's address as advertise URL.
    pub fn new(cluster: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            cluster: cluster.into(),
            name: name.into(),
            zone: proto::Zone::default(),
            advertise_url: None,
            secret: None,
            protocol: proto::Config::default(),
            limits: Limits::default(),
            tls: None,
            resume: proto::Resume::default(),
            clients: None,
            on_snapshot: None,
        }
    }
}

/// Why a node could not start. Nothing was spawned.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// No secret, and the listener is not on loopback.
    #[error(
        "no cluster secret: a node without one may listen on loopback only, not on {addr}; \
         configure a secret"
    )]
    Unauthenticated {
        /// The listener's address.
        addr: SocketAddr,
    },
    /// The listener has no local address.
    #[error("the listener has no local address: {0}")]
    Listener(#[source] std::io::Error),
    /// A name or URL is empty or too long.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The state machine refused the node's identity (its URL has no host and port, say).
    #[error(transparent)]
    Node(#[from] InvalidInput),
    /// A TLS file could not be read or used.
    #[error("TLS: {0}")]
    Tls(String),
    /// The OS gave no random seed.
    #[error("no random seed from the OS: {0}")]
    Random(getrandom::Error),
}

/// The listener's address, the TLS files loaded, and the advertised URL, once the
/// configuration is found sound.
pub(super) fn checked(
    listener: &TcpListener,
    config: &DriverConfig,
) -> Result<(SocketAddr, Option<tls::Tls>, String), StartError> {
    let local_addr = listener.local_addr().map_err(StartError::Listener)?;
    if config.secret.is_none() && !local_addr.ip().is_loopback() {
        return Err(StartError::Unauthenticated { addr: local_addr });
    }
    config.limits.check().map_err(StartError::Config)?;
    let tls = config
        .tls
        .as_ref()
        .map(tls::Tls::load)
        .transpose()
        .map_err(StartError::Tls)?;
    let scheme = if tls.is_some() { "wss" } else { "ws" };
    let url = config
        .advertise_url
        .clone()
        .unwrap_or_else(|| format!("{scheme}://{local_addr}"));
    for (what, value, max) in [
        ("cluster name", &config.cluster, MAX_CLUSTER_LEN),
        ("node name", &config.name, MAX_NAME_LEN),
        ("advertise URL", &url, MAX_URL_LEN),
    ] {
        if value.is_empty() || value.len() > max {
            return Err(StartError::Config(format!(
                "the {what} must have 1 to {max} bytes"
            )));
        }
    }
    Ok((local_addr, tls, url))
}
