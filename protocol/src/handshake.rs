//! How two nodes authenticate each other before any protocol message: a challenge-response
//! over the cluster secret, so the secret never crosses the wire. Pure: no I/O, no clock,
//! no randomness (nonces and the time come in as parameters).
//!
//! The exchange, over the first WebSocket binary messages of a connection:
//!
//! ```text
//! client (dialer)                                server (listener)
//!   Hello(cluster, id, name, url, nonce_c, clock)  ->
//!                                               checks version, cluster, clock skew
//!   <-  Challenge(Hello(.., nonce_s, clock))
//! checks version, cluster, skew
//!   Proof(proof_c)                               ->
//!                                               checks proof_c
//!   <-  Welcome(proof_s)                         (or Refused at any step, with the reason)
//! checks proof_s
//! ```
//!
//! A proof is HMAC-SHA256, keyed by the secret, over the protocol version, a role label
//! (`server` or `client`) and both hellos in full (so both nonces, both node ids, the
//! cluster, the URLs and the clocks). Each side's fresh nonce makes a proof useless on any
//! other connection, the role label keeps a server's proof from being reflected back as a
//! client's, and covering the whole hellos means nothing in them can be altered on the way.
//!
//! The listener proves the secret only after the dialer has: a listener is reachable by
//! anyone, and a proof it sent first would let anyone collect proofs over nonces of their
//! choosing and guess the secret offline. The dialer's proof can still be collected by an
//! impostor it was made to dial (a wrong `--join`, a hijacked address), so secrets must be
//! high-entropy (32 random bytes) rather than passphrases.
//!
//! Every frame starts with the protocol version ([`PROTOCOL_VERSION`]) before anything else,
//! so a node can name a version mismatch even when the rest of the layout changed.
//!
//! A node without a secret skips the proofs. It refuses a peer that sends one (that peer
//! expects authentication), and a node with a secret refuses a peer that sends none.

use std::fmt;

use hmac::{Hmac, KeyInit, Mac};
use roster_registry::ReplicaId;
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::backoff::Failure;
use crate::message::PROTOCOL_VERSION;
use crate::proto::NodeInfo;

/// Bytes of a nonce.
pub const NONCE_LEN: usize = 32;
/// Bytes of a proof (an HMAC-SHA256 tag).
pub const PROOF_LEN: usize = 32;
/// The shortest secret accepted, in bytes.
pub const MIN_SECRET_LEN: usize = 16;
/// The longest cluster name, in bytes.
pub const MAX_CLUSTER_LEN: usize = 64;
/// The longest node name, in bytes.
pub const MAX_NAME_LEN: usize = 128;
/// The longest advertise URL, in bytes.
pub const MAX_URL_LEN: usize = 256;
/// The longest refusal reason, in bytes.
pub const MAX_REASON_LEN: usize = 256;

type HmacSha256 = Hmac<Sha256>;

/// The cluster secret every node of a cluster shares. Its `Debug` output hides the bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Box<[u8]>);

/// A secret was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// It is shorter than [`MIN_SECRET_LEN`] bytes.
    #[error("the cluster secret has {0} bytes; use at least {MIN_SECRET_LEN}")]
    TooShort(usize),
}

impl Secret {
    /// A secret from its bytes.
    ///
    /// # Errors
    /// [`SecretError::TooShort`] when it has fewer than [`MIN_SECRET_LEN`] bytes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self, SecretError> {
        let bytes = bytes.into();
        if bytes.len() < MIN_SECRET_LEN {
            return Err(SecretError::TooShort(bytes.len()));
        }
        Ok(Self(bytes.into_boxed_slice()))
    }
}

impl Secret {
    /// HMAC-SHA256 under the secret of `label` then each part, each prefixed with its
    /// length: a proof of the secret bound to those bytes (for protocols besides the peer
    /// handshake, such as client authentication).
    pub fn prove(&self, label: &[u8], parts: &[&[u8]]) -> [u8; PROOF_LEN] {
        self.mac(label, parts).finalize().into_bytes().into()
    }

    /// Whether `proof` is [`Secret::prove`] of the same label and parts (in constant time).
    pub fn verify(&self, label: &[u8], parts: &[&[u8]], proof: &[u8]) -> bool {
        self.mac(label, parts).verify_slice(proof).is_ok()
    }

    fn mac(&self, label: &[u8], parts: &[&[u8]]) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        for p in std::iter::once(label).chain(parts.iter().copied()) {
            mac.update(&(p.len() as u64).to_le_bytes());
            mac.update(p);
        }
        mac
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// What this node presents and requires in a handshake.
#[derive(Debug, Clone)]
pub struct HandshakeConfig {
    /// The cluster name; a peer of another cluster is refused.
    pub cluster: String,
    /// Who this node is.
    pub node: NodeInfo,
    /// The cluster secret; `None` runs without authentication (loopback only).
    pub secret: Option<Secret>,
    /// The most a peer's clock may run ahead of ours, in milliseconds.
    pub max_skew_ms: u64,
}

/// One side's introduction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// The cluster the sender belongs to.
    pub cluster: String,
    /// The sender's replica id.
    pub id: ReplicaId,
    /// The sender's name.
    pub name: String,
    /// Where the sender is dialed.
    pub url: String,
    /// A fresh random nonce.
    pub nonce: [u8; NONCE_LEN],
    /// The sender's wall clock, in milliseconds since the epoch.
    pub clock_ms: u64,
}

/// What a refusal was about, so the refused side knows how long to back off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RefusalKind {
    /// Protocol versions differ.
    Version,
    /// Cluster names differ.
    Cluster,
    /// The secret (or its absence) does not match.
    Secret,
    /// A clock runs too far ahead.
    Skew,
    /// A message could not be understood.
    Malformed,
    /// The node cannot take the connection now (shutting down, full).
    Unavailable,
}

impl RefusalKind {
    /// How the refused side should back off: minutes for what will not fix itself soon.
    pub fn failure(self) -> Failure {
        match self {
            Self::Version | Self::Cluster | Self::Secret => Failure::Auth,
            Self::Skew => Failure::Clock,
            Self::Malformed | Self::Unavailable => Failure::Network,
        }
    }
}

/// One handshake frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum HandshakeMessage {
    /// The client opens.
    Hello(Hello),
    /// The server answers with its own hello (no proof yet: it proves the secret only to a
    /// client that proved it first).
    Challenge {
        /// The server's hello.
        hello: Hello,
    },
    /// The client proves it knows the secret (`None` without a secret).
    Proof {
        /// The client's proof.
        proof: Option<[u8; PROOF_LEN]>,
    },
    /// The server accepted the client's proof and proves the secret in turn (`None`
    /// without a secret); protocol messages follow once the client has checked it.
    Welcome {
        /// The server's proof of the secret.
        proof: Option<[u8; PROOF_LEN]>,
    },
    /// Either side refuses; the connection closes.
    Refused {
        /// What about.
        kind: RefusalKind,
        /// Why, in one line.
        reason: String,
    },
}

/// Why a handshake failed. Nothing was joined or changed; the connection is closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    /// The peer speaks another protocol version.
    #[error("wrong protocol version: the peer speaks {theirs}, this node {ours}")]
    Version {
        /// Ours.
        ours: u16,
        /// The peer's.
        theirs: u16,
    },
    /// The peer belongs to another cluster.
    #[error("wrong cluster: the peer is in {theirs:?}, this node in {ours:?}")]
    Cluster {
        /// Ours.
        ours: String,
        /// The peer's.
        theirs: String,
    },
    /// The peer's proof does not match: it holds another secret.
    #[error("wrong cluster secret: the peer's proof does not match")]
    BadProof,
    /// This node requires a secret and the peer gave no proof.
    #[error("the peer runs without a cluster secret; this node requires one")]
    MissingProof,
    /// The peer requires a secret and this node has none.
    #[error("the peer requires a cluster secret; this node has none")]
    UnexpectedProof,
    /// The peer's clock runs too far ahead.
    #[error("the peer's clock runs {ahead_ms} ms ahead, more than the {max_ms} ms allowed")]
    Skew {
        /// How far ahead.
        ahead_ms: u64,
        /// The allowed skew.
        max_ms: u64,
    },
    /// A frame could not be understood, or came out of turn.
    #[error("malformed handshake: {0}")]
    Malformed(String),
    /// The peer refused us.
    #[error("refused by the peer: {reason}")]
    Refused {
        /// What about.
        kind: RefusalKind,
        /// The peer's reason.
        reason: String,
    },
}

impl HandshakeError {
    /// What the refusal is about.
    pub fn kind(&self) -> RefusalKind {
        match self {
            Self::Version { .. } => RefusalKind::Version,
            Self::Cluster { .. } => RefusalKind::Cluster,
            Self::BadProof | Self::MissingProof | Self::UnexpectedProof => RefusalKind::Secret,
            Self::Skew { .. } => RefusalKind::Skew,
            Self::Malformed(_) => RefusalKind::Malformed,
            Self::Refused { kind, .. } => *kind,
        }
    }

    /// How a dialer should back off after this failure.
    pub fn failure(&self) -> Failure {
        self.kind().failure()
    }

    /// The frame that tells the peer why (none when the peer refused us: it knows).
    pub fn to_refusal(&self) -> Option<HandshakeMessage> {
        match self {
            Self::Refused { .. } => None,
            e => Some(HandshakeMessage::refused(e.kind(), &e.to_string())),
        }
    }
}

fn cut(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

fn malformed(what: impl fmt::Display) -> HandshakeError {
    HandshakeError::Malformed(cut(&what.to_string(), MAX_REASON_LEN))
}

impl HandshakeMessage {
    /// A refusal, its reason cut to [`MAX_REASON_LEN`] bytes.
    pub fn refused(kind: RefusalKind, reason: &str) -> Self {
        Self::Refused {
            kind,
            reason: cut(reason, MAX_REASON_LEN),
        }
    }

    /// Encodes the frame: the protocol version, then the message.
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(&(PROTOCOL_VERSION, self)).expect("postcard failed to encode a handshake frame")
    }

    /// Decodes a frame, checking the version first, then the message, its field lengths,
    /// and that nothing trails it.
    ///
    /// # Errors
    /// [`HandshakeError::Version`] for another protocol version, else
    /// [`HandshakeError::Malformed`].
    pub fn decode(bytes: &[u8]) -> Result<Self, HandshakeError> {
        let (version, rest): (u16, _) = postcard::take_from_bytes(bytes).map_err(malformed)?;
        if version != PROTOCOL_VERSION {
            return Err(HandshakeError::Version {
                ours: PROTOCOL_VERSION,
                theirs: version,
            });
        }
        let (msg, rest): (Self, _) = postcard::take_from_bytes(rest).map_err(malformed)?;
        if !rest.is_empty() {
            return Err(malformed(format_args!(
                "{} unexpected bytes after the frame",
                rest.len()
            )));
        }
        let too_long = |what: &str, len: usize, max: usize| {
            (len > max).then(|| malformed(format_args!("{what} of {len} bytes, more than {max}")))
        };
        let check = |h: &Hello| {
            too_long("cluster name", h.cluster.len(), MAX_CLUSTER_LEN)
                .or_else(|| too_long("node name", h.name.len(), MAX_NAME_LEN))
                .or_else(|| too_long("URL", h.url.len(), MAX_URL_LEN))
        };
        let err = match &msg {
            Self::Hello(h) | Self::Challenge { hello: h, .. } => check(h),
            Self::Refused { reason, .. } => too_long("reason", reason.len(), MAX_REASON_LEN),
            Self::Proof { .. } | Self::Welcome { .. } => None,
        };
        match err {
            Some(e) => Err(e),
            None => Ok(msg),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Self::Hello(_) => "hello",
            Self::Challenge { .. } => "challenge",
            Self::Proof { .. } => "proof",
            Self::Welcome { .. } => "welcome",
            Self::Refused { .. } => "refusal",
        }
    }
}

/// Turns a peer's refusal into an error, and anything else but `expected` into a malformed one.
fn unexpected(msg: HandshakeMessage, expected: &str) -> HandshakeError {
    match msg {
        HandshakeMessage::Refused { kind, reason } => HandshakeError::Refused { kind, reason },
        other => malformed(format_args!("expected a {expected}, got a {}", other.name())),
    }
}

impl HandshakeConfig {
    fn hello(&self, nonce: [u8; NONCE_LEN], now_ms: u64) -> Hello {
        Hello {
            cluster: self.cluster.clone(),
            id: self.node.id,
            name: self.node.name.clone(),
            url: self.node.url.clone(),
            nonce,
            clock_ms: now_ms,
        }
    }

    /// Checks the peer's cluster and clock.
    fn check_peer(&self, peer: &Hello, now_ms: u64) -> Result<(), HandshakeError> {
        if peer.cluster != self.cluster {
            return Err(HandshakeError::Cluster {
                ours: self.cluster.clone(),
                theirs: peer.cluster.clone(),
            });
        }
        let ahead_ms = peer.clock_ms.saturating_sub(now_ms);
        if ahead_ms > self.max_skew_ms {
            return Err(HandshakeError::Skew {
                ahead_ms,
                max_ms: self.max_skew_ms,
            });
        }
        Ok(())
    }

    fn mac(secret: &Secret, role: &[u8], client: &Hello, server: &Hello) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&secret.0).expect("HMAC takes a key of any length");
        mac.update(b"roster handshake\0");
        mac.update(&PROTOCOL_VERSION.to_be_bytes());
        mac.update(role);
        for hello in [client, server] {
            let bytes = postcard::to_stdvec(hello).expect("postcard failed to encode a hello");
            mac.update(&(bytes.len() as u64).to_be_bytes());
            mac.update(&bytes);
        }
        mac
    }

    fn prove(&self, role: &[u8], client: &Hello, server: &Hello) -> Option<[u8; PROOF_LEN]> {
        let secret = self.secret.as_ref()?;
        let tag = Self::mac(secret, role, client, server).finalize().into_bytes();
        let mut out = [0u8; PROOF_LEN];
        out.copy_from_slice(&tag);
        Some(out)
    }

    /// Checks the peer's proof (in constant time) against what our secret gives.
    fn verify(
        &self,
        role: &[u8],
        client: &Hello,
        server: &Hello,
        proof: Option<&[u8; PROOF_LEN]>,
    ) -> Result<(), HandshakeError> {
        match (&self.secret, proof) {
            (None, None) => Ok(()),
            (None, Some(_)) => Err(HandshakeError::UnexpectedProof),
            (Some(_), None) => Err(HandshakeError::MissingProof),
            (Some(secret), Some(proof)) => Self::mac(secret, role, client, server)
                .verify_slice(proof)
                .map_err(|_| HandshakeError::BadProof),
        }
    }
}

const CLIENT: &[u8] = b"client";
const SERVER: &[u8] = b"server";

fn peer_info(h: &Hello) -> NodeInfo {
    NodeInfo {
        id: h.id,
        name: h.name.clone(),
        url: h.url.clone(),
        // A hello names no zone: a peer's zone is read from its membership.
        zone: Default::default(),
    }
}

/// The dialing side of a handshake.
#[derive(Debug)]
pub struct Client<'a> {
    cfg: &'a HandshakeConfig,
    hello: Hello,
    server: Option<Hello>,
}

impl<'a> Client<'a> {
    /// Starts a handshake with a fresh `nonce` at `now_ms`; send the returned hello.
    pub fn start(cfg: &'a HandshakeConfig, nonce: [u8; NONCE_LEN], now_ms: u64) -> (Self, HandshakeMessage) {
        let hello = cfg.hello(nonce, now_ms);
        (
            Self {
                cfg,
                hello: hello.clone(),
                server: None,
            },
            HandshakeMessage::Hello(hello),
        )
    }

    /// Checks the server's challenge: version (already, by decoding), cluster and clock.
    /// Returns who the server says it is (not yet proven: [`Client::on_outcome`] checks its
    /// proof) and the proof to send.
    ///
    /// # Errors
    /// [`HandshakeError`] when the server is refused or refused us; send its
    /// [`HandshakeError::to_refusal`] and close.
    pub fn on_challenge(
        &mut self,
        msg: HandshakeMessage,
        now_ms: u64,
    ) -> Result<(NodeInfo, HandshakeMessage), HandshakeError> {
        if self.server.is_some() {
            return Err(malformed("a second challenge"));
        }
        let HandshakeMessage::Challenge { hello } = msg else {
            return Err(unexpected(msg, "challenge"));
        };
        self.cfg.check_peer(&hello, now_ms)?;
        let proof = self.cfg.prove(CLIENT, &self.hello, &hello);
        let info = peer_info(&hello);
        self.server = Some(hello);
        Ok((info, HandshakeMessage::Proof { proof }))
    }

    /// Checks the server's last word: a welcome carrying its proof of the secret.
    ///
    /// # Errors
    /// [`HandshakeError::Refused`] when the server refused our proof,
    /// [`HandshakeError::BadProof`] / [`HandshakeError::MissingProof`] /
    /// [`HandshakeError::UnexpectedProof`] when its proof does not match our secret, or
    /// [`HandshakeError::Malformed`] for anything but a welcome after a challenge.
    pub fn on_outcome(&self, msg: HandshakeMessage) -> Result<(), HandshakeError> {
        let Some(server) = &self.server else {
            return Err(malformed("an outcome before the challenge"));
        };
        match msg {
            HandshakeMessage::Welcome { proof } => {
                self.cfg.verify(SERVER, &self.hello, server, proof.as_ref())
            }
            other => Err(unexpected(other, "welcome")),
        }
    }
}

/// The accepting side of a handshake.
#[derive(Debug)]
pub struct Server<'a> {
    cfg: &'a HandshakeConfig,
    nonce: [u8; NONCE_LEN],
    hellos: Option<(Hello, Hello)>,
}

impl<'a> Server<'a> {
    /// Waits for a client's hello; `nonce` is fresh.
    pub fn new(cfg: &'a HandshakeConfig, nonce: [u8; NONCE_LEN]) -> Self {
        Self {
            cfg,
            nonce,
            hellos: None,
        }
    }

    /// Checks the client's hello (cluster, clock) and returns the challenge to send.
    ///
    /// # Errors
    /// [`HandshakeError`] when the client is refused; send its
    /// [`HandshakeError::to_refusal`] and close.
    pub fn on_hello(
        &mut self,
        msg: HandshakeMessage,
        now_ms: u64,
    ) -> Result<HandshakeMessage, HandshakeError> {
        if self.hellos.is_some() {
            return Err(malformed("a second hello"));
        }
        let HandshakeMessage::Hello(client) = msg else {
            return Err(unexpected(msg, "hello"));
        };
        self.cfg.check_peer(&client, now_ms)?;
        let ours = self.cfg.hello(self.nonce, now_ms);
        self.hellos = Some((client, ours.clone()));
        Ok(HandshakeMessage::Challenge { hello: ours })
    }

    /// Checks the client's proof. Returns who the client is and the welcome to send, which
    /// carries this node's proof: made only now that the client has proved the secret.
    ///
    /// # Errors
    /// [`HandshakeError`] when the proof is wrong or missing; send its
    /// [`HandshakeError::to_refusal`] and close.
    pub fn on_proof(&self, msg: HandshakeMessage) -> Result<(NodeInfo, HandshakeMessage), HandshakeError> {
        let Some((client, ours)) = &self.hellos else {
            return Err(malformed("a proof before the hello"));
        };
        let HandshakeMessage::Proof { proof } = msg else {
            return Err(unexpected(msg, "proof"));
        };
        self.cfg.verify(CLIENT, client, ours, proof.as_ref())?;
        let proof = self.cfg.prove(SERVER, client, ours);
        Ok((peer_info(client), HandshakeMessage::Welcome { proof }))
    }
}

#[cfg(test)]
mod tests;
