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
mod tests {
    use super::*;

    const NOW: u64 = 1_700_000_000_000;

    fn cfg(id: u64, cluster: &str, secret: Option<&str>) -> HandshakeConfig {
        HandshakeConfig {
            cluster: cluster.to_string(),
            node: NodeInfo {
                id: ReplicaId(id),
                name: format!("node{id}"),
                url: format!("ws://127.0.0.1:{}", 7000 + id),
            },
            secret: secret.map(|s| Secret::new(s).unwrap()),
            max_skew_ms: 5_000,
        }
    }

    /// Runs a whole exchange through the encoding, as two drivers would. Returns what each
    /// side concluded: the client's view of the server and the server's view of the client.
    fn run(
        client: &HandshakeConfig,
        server: &HandshakeConfig,
        client_now: u64,
        server_now: u64,
    ) -> (Result<NodeInfo, HandshakeError>, Result<NodeInfo, HandshakeError>) {
        let wire = |m: &HandshakeMessage| HandshakeMessage::decode(&m.encode()).unwrap();
        let (mut c, hello) = Client::start(client, [1; NONCE_LEN], client_now);
        let mut s = Server::new(server, [2; NONCE_LEN]);
        let challenge = match s.on_hello(wire(&hello), server_now) {
            Ok(m) => m,
            Err(e) => {
                let refusal = e.to_refusal().unwrap();
                return (
                    Err(c.on_challenge(wire(&refusal), client_now).unwrap_err()),
                    Err(e),
                );
            }
        };
        let (server_info, proof) = match c.on_challenge(wire(&challenge), client_now) {
            Ok(x) => x,
            Err(e) => {
                let refusal = e.to_refusal().unwrap();
                return (Err(e), Err(s.on_proof(wire(&refusal)).unwrap_err()));
            }
        };
        match s.on_proof(wire(&proof)) {
            Ok((client_info, welcome)) => match c.on_outcome(wire(&welcome)) {
                Ok(()) => (Ok(server_info), Ok(client_info)),
                Err(e) => (Err(e), Ok(client_info)),
            },
            Err(e) => {
                let refusal = e.to_refusal().unwrap();
                (Err(c.on_outcome(wire(&refusal)).unwrap_err()), Err(e))
            }
        }
    }

    const SECRET: &str = "correct horse battery staple";

    #[test]
    fn the_same_secret_authenticates_both_sides() {
        let (a, b) = (cfg(1, "prod", Some(SECRET)), cfg(2, "prod", Some(SECRET)));
        let (server_seen, client_seen) = run(&a, &b, NOW, NOW);
        assert_eq!(server_seen.unwrap(), b.node);
        assert_eq!(client_seen.unwrap(), a.node);
    }

    #[test]
    fn two_nodes_without_a_secret_shake_hands() {
        let (a, b) = (cfg(1, "dev", None), cfg(2, "dev", None));
        let (s, c) = run(&a, &b, NOW, NOW);
        assert_eq!((s.unwrap().id, c.unwrap().id), (ReplicaId(2), ReplicaId(1)));
    }

    #[test]
    fn a_wrong_secret_is_refused_on_both_sides_and_backs_off_as_auth() {
        let (a, b) = (
            cfg(1, "prod", Some(SECRET)),
            cfg(2, "prod", Some("another secret entirely")),
        );
        // The listener checks the dialer's proof first, so it is the one to find it wrong.
        let (c, s) = run(&a, &b, NOW, NOW);
        let s = s.unwrap_err();
        assert_eq!(s, HandshakeError::BadProof);
        assert_eq!(s.failure(), Failure::Auth);
        let c = c.unwrap_err();
        assert!(
            matches!(
                c,
                HandshakeError::Refused {
                    kind: RefusalKind::Secret,
                    ..
                }
            ),
            "{c}"
        );
        assert_eq!(c.failure(), Failure::Auth);
        assert!(c.to_string().contains("wrong cluster secret"), "{c}");
    }

    #[test]
    fn a_secret_on_one_side_only_is_refused_by_name() {
        let (with, without) = (cfg(1, "prod", Some(SECRET)), cfg(2, "prod", None));
        let (c, s) = run(&without, &with, NOW, NOW);
        assert_eq!(s.unwrap_err(), HandshakeError::MissingProof);
        assert!(matches!(
            c.unwrap_err(),
            HandshakeError::Refused {
                kind: RefusalKind::Secret,
                ..
            }
        ));
        let (c, s) = run(&with, &without, NOW, NOW);
        assert_eq!(s.unwrap_err(), HandshakeError::UnexpectedProof);
        assert_eq!(c.unwrap_err().kind(), RefusalKind::Secret);
    }

    #[test]
    fn a_forged_or_reflected_proof_is_refused() {
        let (a, b) = (cfg(1, "prod", Some(SECRET)), cfg(2, "prod", Some(SECRET)));
        let (mut c, hello) = Client::start(&a, [1; NONCE_LEN], NOW);
        let mut s = Server::new(&b, [2; NONCE_LEN]);
        let challenge = s.on_hello(hello, NOW).unwrap();
        let (_, proof) = c.on_challenge(challenge, NOW).unwrap();
        let HandshakeMessage::Proof { proof: client_proof } = proof else {
            unreachable!()
        };
        // To the listener: forged and missing proofs.
        let forged = HandshakeMessage::Proof {
            proof: Some([0; PROOF_LEN]),
        };
        assert_eq!(s.on_proof(forged).unwrap_err(), HandshakeError::BadProof);
        assert_eq!(
            s.on_proof(HandshakeMessage::Proof { proof: None }).unwrap_err(),
            HandshakeError::MissingProof
        );
        // To the dialer: its own proof reflected back as the listener's, a forged one, none.
        for (proof, e) in [
            (client_proof, HandshakeError::BadProof),
            (Some([0; PROOF_LEN]), HandshakeError::BadProof),
            (None, HandshakeError::MissingProof),
        ] {
            assert_eq!(c.on_outcome(HandshakeMessage::Welcome { proof }), Err(e));
        }
        // The real one passes.
        let (_, welcome) = s
            .on_proof(HandshakeMessage::Proof { proof: client_proof })
            .unwrap();
        assert_eq!(c.on_outcome(welcome), Ok(()));
    }

    #[test]
    fn a_listener_proves_the_secret_only_to_a_dialer_that_proved_it_first() {
        let (a, b) = (cfg(1, "prod", Some(SECRET)), cfg(2, "prod", Some(SECRET)));
        // A dialer without the secret (an attacker collecting proofs to guess it offline).
        let (_, hello) = Client::start(&a, [1; NONCE_LEN], NOW);
        let HandshakeMessage::Hello(dialer_hello) = hello.clone() else {
            unreachable!()
        };
        let mut s = Server::new(&b, [2; NONCE_LEN]);
        let challenge = s.on_hello(hello, NOW).unwrap();
        let HandshakeMessage::Challenge {
            hello: listener_hello,
            ..
        } = challenge.clone()
        else {
            unreachable!()
        };
        let listener_proof = b.prove(SERVER, &dialer_hello, &listener_hello).unwrap();
        let mut sent = vec![challenge.encode()];
        for attempt in [
            HandshakeMessage::Proof { proof: None },
            HandshakeMessage::Proof {
                proof: Some([7; PROOF_LEN]),
            },
        ] {
            let refusal = s.on_proof(attempt).unwrap_err().to_refusal().unwrap();
            sent.push(refusal.encode());
        }
        for frame in &sent {
            assert!(
                !frame.windows(PROOF_LEN).any(|w| w == listener_proof),
                "the listener sent its proof to a dialer that proved nothing: {frame:?}"
            );
        }
    }

    #[test]
    fn a_wrong_cluster_is_refused_by_name() {
        let (a, b) = (cfg(1, "prod", Some(SECRET)), cfg(2, "staging", Some(SECRET)));
        let (c, s) = run(&a, &b, NOW, NOW);
        let s = s.unwrap_err();
        assert_eq!(
            s,
            HandshakeError::Cluster {
                ours: "staging".into(),
                theirs: "prod".into()
            }
        );
        assert!(s.to_string().contains("\"prod\"") && s.to_string().contains("\"staging\""));
        let c = c.unwrap_err();
        assert_eq!(c.kind(), RefusalKind::Cluster);
        assert!(c.to_string().contains("wrong cluster"), "{c}");
    }

    #[test]
    fn a_wrong_protocol_version_is_refused_by_name() {
        let a = cfg(1, "prod", None);
        let (_, hello) = Client::start(&a, [1; NONCE_LEN], NOW);
        let future = postcard::to_stdvec(&(PROTOCOL_VERSION + 1, hello)).unwrap();
        let e = HandshakeMessage::decode(&future).unwrap_err();
        assert_eq!(
            e,
            HandshakeError::Version {
                ours: PROTOCOL_VERSION,
                theirs: PROTOCOL_VERSION + 1
            }
        );
        assert!(e.to_string().starts_with("wrong protocol version"));
        assert_eq!(e.failure(), Failure::Auth);
        // Even when the rest of the frame is something this build cannot read.
        let mut odd = postcard::to_stdvec(&(PROTOCOL_VERSION + 1)).unwrap();
        odd.extend_from_slice(&[0xff; 9]);
        assert!(matches!(
            HandshakeMessage::decode(&odd),
            Err(HandshakeError::Version { .. })
        ));
    }

    #[test]
    fn a_peer_clock_too_far_ahead_is_refused_and_behind_is_fine() {
        let (a, b) = (cfg(1, "prod", Some(SECRET)), cfg(2, "prod", Some(SECRET)));
        let (c, s) = run(&a, &b, NOW + 5_001, NOW);
        assert_eq!(
            s.unwrap_err(),
            HandshakeError::Skew {
                ahead_ms: 5_001,
                max_ms: 5_000
            }
        );
        let c = c.unwrap_err();
        assert_eq!(c.kind(), RefusalKind::Skew);
        // A clock is set right while the node runs: not the minutes of a wrong secret.
        assert_eq!(c.failure(), Failure::Clock);
        // The server ahead: the client refuses it.
        let (c, _) = run(&a, &b, NOW, NOW + 60_000);
        assert!(matches!(
            c.unwrap_err(),
            HandshakeError::Skew { ahead_ms: 60_000, .. }
        ));
        // Within the allowance either way.
        let (c, s) = run(&a, &b, NOW + 5_000, NOW);
        assert!(c.is_ok() && s.is_ok());
    }

    #[test]
    fn frames_out_of_turn_are_malformed() {
        let a = cfg(1, "prod", None);
        let s = Server::new(&a, [2; NONCE_LEN]);
        assert!(matches!(
            s.on_proof(HandshakeMessage::Proof { proof: None }),
            Err(HandshakeError::Malformed(_))
        ));
        let mut s = Server::new(&a, [2; NONCE_LEN]);
        assert!(matches!(
            s.on_hello(HandshakeMessage::Welcome { proof: None }, NOW),
            Err(HandshakeError::Malformed(_))
        ));
        let (mut c, hello) = Client::start(&a, [1; NONCE_LEN], NOW);
        assert!(matches!(
            c.on_outcome(HandshakeMessage::Welcome { proof: None }),
            Err(HandshakeError::Malformed(_))
        ));
        assert!(matches!(
            c.on_challenge(hello, NOW),
            Err(HandshakeError::Malformed(_))
        ));
    }

    #[test]
    fn garbage_trailing_bytes_and_overlong_fields_are_malformed() {
        for garbage in [
            &[][..],
            &[1][..],
            &[1, 0xff, 0xff, 0xff, 0xff, 0xff][..],
            &[0xff; 64][..],
        ] {
            assert!(HandshakeMessage::decode(garbage).is_err());
        }
        let mut bytes = HandshakeMessage::Welcome { proof: None }.encode();
        bytes.push(0);
        assert!(matches!(
            HandshakeMessage::decode(&bytes),
            Err(HandshakeError::Malformed(_))
        ));
        let mut a = cfg(1, "prod", None);
        a.cluster = "x".repeat(MAX_CLUSTER_LEN + 1);
        let (_, hello) = Client::start(&a, [1; NONCE_LEN], NOW);
        let e = HandshakeMessage::decode(&hello.encode()).unwrap_err();
        assert!(e.to_string().contains("cluster name"), "{e}");
    }

    #[test]
    fn a_short_secret_is_refused_and_a_secret_never_prints() {
        assert_eq!(Secret::new("short"), Err(SecretError::TooShort(5)));
        let s = Secret::new(SECRET).unwrap();
        assert!(!format!("{s:?}").contains("horse"));
    }
}
