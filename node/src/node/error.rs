//! Why a node could not start or do what it was asked.

use std::time::Duration;

use roster_transport::driver::{DriverError, StartError};

use crate::store::StoreError;

/// Why a node could not start or do what it was asked. Nothing changed.
///
/// Its `Debug` is its one-line message, so a service whose `main` returns it (through `?`
/// and `Box<dyn Error>`) prints `Error: cannot listen on ...: ...; pick another --listen
/// address`, not the variant's fields.
#[derive(thiserror::Error)]
pub enum Error {
    /// Bad input: a TTL, a check, a batch (what the node itself checks).
    #[error("{0}")]
    Invalid(String),
    /// Bad input the registry refused, with its typed reason: a service name, an instance
    /// id, an address, metadata or a status note ([`Error::invalid_input`]).
    #[error(transparent)]
    Input(#[from] roster_registry::InvalidInput),
    /// A setting of the [`NodeBuilder`](crate::NodeBuilder) is out of range or malformed;
    /// nothing started.
    #[error("{message}")]
    Setting {
        /// The builder method that set it: `fanout`, `gossip_interval`, `lease_ttl`,
        /// `lease_per_member`, `max_clock_skew`, `join` or `advertise`.
        name: &'static str,
        /// What is wrong, and what to use.
        message: String,
    },
    /// The TLS files (`NodeBuilder::tls`) could not be read or do not fit together.
    #[error("TLS: {0}")]
    Tls(String),
    /// The data directory.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}; {}", listen_hint(source))]
    Listen {
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// The transport refused the configuration.
    #[error(transparent)]
    Start(#[from] StartError),
    /// The node has stopped.
    #[error("the node has stopped")]
    Stopped,
    /// Nothing by that name.
    #[error("{0}")]
    NotFound(String),
    /// A force-leave of a node that answers: this node, or one connected to it.
    #[error("{0}")]
    Answers(String),
    /// The instance id is registered by another live node.
    #[error("{0}")]
    OwnedElsewhere(String),
    /// A task of the node (a disk write run off the async threads) panicked or was cancelled:
    /// a bug, not bad input. Nothing it was doing is known to have happened.
    #[error("a task of the node failed: {0}; this is a bug in roster, please report it")]
    TaskFailed(String),
    /// The operating system could not give what the node needs (randomness for its id).
    #[error("{0}")]
    System(String),
    /// A throttled action ran too recently.
    #[error("{message}")]
    Throttled {
        /// What to do.
        message: String,
        /// When it may run again.
        retry_after: Duration,
    },
}

/// What to do about a listen address that could not be bound: one that does not parse is
/// not "in use".
fn listen_hint(e: &std::io::Error) -> &'static str {
    if e.kind() == std::io::ErrorKind::InvalidInput {
        "give --listen as HOST:PORT, e.g. 127.0.0.1:7420"
    } else {
        "pick another --listen address or stop what uses it"
    }
}

impl Error {
    /// The registry's typed reason, when the registry refused the input.
    pub fn invalid_input(&self) -> Option<&roster_registry::InvalidInput> {
        match self {
            Error::Input(e) => Some(e),
            _ => None,
        }
    }

    /// Whether the input was refused (either kind): nothing was tried.
    pub fn is_invalid(&self) -> bool {
        matches!(self, Error::Invalid(_) | Error::Input(_))
    }
}

impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl From<DriverError> for Error {
    fn from(e: DriverError) -> Self {
        match e {
            DriverError::Stopped => Error::Stopped,
            DriverError::Invalid(e) => Error::Input(e),
            e @ DriverError::InvalidItem { .. } => Error::Invalid(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listen_address_that_does_not_parse_is_not_called_in_use() {
        let listen = |kind, why| Error::Listen {
            addr: "nowhere".into(),
            source: std::io::Error::new(kind, why),
        };
        let bad = listen(std::io::ErrorKind::InvalidInput, "invalid socket address").to_string();
        assert_eq!(
            bad,
            "cannot listen on nowhere: invalid socket address; give --listen as HOST:PORT, e.g. 127.0.0.1:7420"
        );
        let busy = listen(std::io::ErrorKind::AddrInUse, "Address already in use").to_string();
        assert!(
            busy.ends_with("pick another --listen address or stop what uses it"),
            "{busy}"
        );
    }
}
