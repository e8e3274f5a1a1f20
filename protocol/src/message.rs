//! The messages roster nodes exchange once a connection is authenticated, and their
//! encoding: postcard, behind the protocol version agreed in the handshake.
//!
//! Registry payloads (digests, deltas, elided states) travel as the registry's own encoding
//! inside a message, so they are checked by the same decoder whichever path they take.

use roster_registry::codec;
use roster_registry::{CausalContext, Elided, Hlc, State};
use serde::{Deserialize, Serialize};

/// The protocol version this build speaks (2: the listener proves the cluster secret only
/// after the dialer has, in the handshake's welcome; 3: one lease per node, registry
/// format 2; 4: registrations carry a status, registry format 3; 5: pushes on per-origin
/// trees, with announcements, grafts and prunes; 6: a lease of TTL 0 is a node's farewell,
/// which version 5 refuses to decode; 7: only a message that carries a state to join
/// carries the sender's clock).
pub const PROTOCOL_VERSION: u16 = 7;
/// The most entries (registrations plus leases) one delta may carry.
pub const MAX_DELTA_ENTRIES: usize = 65_536;
/// The most entries one full (elided) state may carry.
pub const MAX_STATE_ENTRIES: usize = 4_000_000;
/// The longest goodbye reason, in bytes.
pub const MAX_REASON_LEN: usize = 256;
/// The most URLs a redirect may carry.
pub const MAX_REDIRECT_URLS: usize = 8;
/// The longest URL a redirect may carry, in bytes.
pub const MAX_URL_LEN: usize = 256;
/// The most change ids one push, announcement or graft may carry, and the most roots one
/// prune may name.
pub const MAX_TREE_IDS: usize = 4_096;

/// A change's name on the dissemination trees: the node that wrote it (the root of the
/// tree it travels on) and that node's clock when it did. Its clock never goes back and
/// ticks for every write, so a name is never reused, across restarts too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ChangeId {
    /// The node that wrote it.
    pub root: roster_registry::ReplicaId,
    /// Its clock at the write.
    pub at: Hlc,
}

/// A change id and how many links it crossed to reach the sender (0 at its root).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tagged {
    /// The change.
    pub id: ChangeId,
    /// Links crossed from its root to the sender.
    pub hops: u16,
}

/// One message between nodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Message {
    /// What the sender has seen (its causal context). Sent when a connection opens and by
    /// the periodic digest exchange. `reply` marks an answer, which is never answered.
    Digest {
        /// The encoded causal context.
        ctx: Vec<u8>,
        /// Whether this answers a digest.
        reply: bool,
        /// A hash of the sender's whole state ([`state_hash`]), in digests that ask: a
        /// receiver with no acknowledgement from the sender that finds it equal to its own
        /// takes the sender as up to date, instead of sending it an elided state (one entry
        /// per registration) to find out.
        state: Option<[u8; 16]>,
    },
    /// A delta: the join of the sender's buffered deltas up to `seq`.
    Delta {
        /// The sender's buffer sequence number this delta brings the receiver up to.
        seq: u64,
        /// The encoded delta.
        delta: Vec<u8>,
    },
    /// The sender's whole state, elided against the receiver's digest.
    Elided {
        /// The sender's buffer sequence number at the time.
        seq: u64,
        /// The encoded elided state.
        elided: Vec<u8>,
    },
    /// The receiver has joined the sender's deltas up to `seq`.
    Ack {
        /// The sequence number acknowledged.
        seq: u64,
    },
    /// An elided state left out a value the receiver does not have: send a full state.
    NeedFull,
    /// The sender is full (too many inbound connections): dial one of these members instead.
    Redirect {
        /// Member URLs, at most [`MAX_REDIRECT_URLS`].
        urls: Vec<String>,
    },
    /// The sender is closing this connection (shutting down, rotating, or refusing).
    Goodbye {
        /// Why, for the receiver's log.
        reason: String,
    },
    /// A hash of the sender's causal context ([`context_hash`]): the periodic exchange,
    /// and the first word on a new connection. A receiver whose own context hashes
    /// otherwise answers with its [`Message::Digest`]; one whose context is the same sends
    /// nothing. Sixteen bytes instead of a context of one entry per node that ever wrote
    /// (110 kB at 10,000 nodes).
    DigestHash {
        /// The hash.
        hash: [u8; 16],
        /// On a new connection, the hash of the sender's whole state ([`state_hash`]): a
        /// receiver whose own hashes both match takes the sender as up to date; one whose
        /// state alone differs answers with its digest too.
        state: Option<[u8; 16]>,
    },
    /// The sender lost its connection to `node` and suspects it dead: is the receiver
    /// connected to it? Answered with [`Message::ProbeAck`].
    ProbeReq {
        /// The node in question.
        node: roster_registry::ReplicaId,
    },
    /// The answer to a [`Message::ProbeReq`].
    ProbeAck {
        /// The node in question.
        node: roster_registry::ReplicaId,
        /// Whether the sender holds a live connection to it (the driver closes one on which
        /// nothing arrives for a few seconds).
        connected: bool,
    },
    /// A delta pushed on the trees: [`Message::Delta`] with the changes it carries named,
    /// so a receiver can tell a copy it already had (and prune the link for their roots).
    Push {
        /// The sender's buffer number this brings the receiver up to, acknowledged like a
        /// delta's; `None` for an answer to a graft, which is not acknowledged (it is sent
        /// out of the buffer's order).
        seq: Option<u64>,
        /// The encoded delta.
        delta: Vec<u8>,
        /// The changes it carries, at most [`MAX_TREE_IDS`].
        ids: Vec<Tagged>,
        /// Changes held back from this link (off their trees here), announced with the
        /// push so they share its fate, at most [`MAX_TREE_IDS`].
        announced: Vec<Tagged>,
        /// Sent before (a repair round's resend, or a graft's answer): a copy the receiver
        /// already had is then no reason to prune.
        resend: bool,
    },
    /// Changes the sender has and did not push on this link (it is off their trees here):
    /// a receiver that lacks one grafts it after a timeout.
    IHave {
        /// The sender's buffer number this brings the receiver up to, acknowledged like a
        /// delta's, when no delta went with it; `None` beside a delta, which carries it.
        seq: Option<u64>,
        /// The changes, at most [`MAX_TREE_IDS`].
        ids: Vec<Tagged>,
    },
    /// Send these changes, and push their roots' changes on this link from now on.
    Graft {
        /// The changes missed, at most [`MAX_TREE_IDS`].
        ids: Vec<ChangeId>,
    },
    /// A copy of these roots' changes arrived here by another link first: push them on
    /// this link no more, announce them instead.
    Prune {
        /// The roots, at most [`MAX_TREE_IDS`].
        roots: Vec<roster_registry::ReplicaId>,
    },
    /// The sender dialed this connection for one anti-entropy exchange: it is no link, so
    /// push nothing on it (a change that came first by it would prune the receiver's tree
    /// link, and leave a hole when it closes).
    ExchangeOnly,
}

/// A message, with the sender's clock when it carries a state to join, so a receiver
/// can refuse a peer whose clock runs too far ahead and order what it writes after what it
/// learnt. The others (acknowledgements, announcements, hashes) go without it: nine bytes
/// of an acknowledgement's eleven, on every link a change crosses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    /// The sender's hybrid logical clock when it sent the message: present exactly when
    /// [`Message::carries_state`].
    pub sent_at: Option<Hlc>,
    /// The message.
    pub message: Message,
}

/// A message from a peer could not be used. The connection is closed with this reason;
/// the node and its replica are unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    /// The bytes are not a message.
    #[error("malformed message: {0}")]
    Malformed(String),
    /// The message carried trailing bytes.
    #[error("{0} unexpected bytes after the message")]
    TrailingBytes(usize),
    /// A registry payload inside could not be decoded.
    #[error("bad registry payload: {0}")]
    Payload(#[from] roster_registry::DecodeError),
    /// A delta carried more entries than allowed.
    #[error("delta has {entries} entries, more than the {limit} allowed")]
    TooManyEntries {
        /// Entries found.
        entries: usize,
        /// The limit.
        limit: usize,
    },
    /// A goodbye reason was too long.
    #[error("goodbye reason longer than {MAX_REASON_LEN} bytes")]
    ReasonTooLong,
    /// A redirect carried too many or too long URLs.
    #[error("redirect with more than {MAX_REDIRECT_URLS} URLs or a URL longer than {MAX_URL_LEN} bytes")]
    RedirectTooLarge,
    /// A message that carries a state to join came without the sender's clock.
    #[error("{0} carries a state to join without the sender's clock")]
    MissingClock(&'static str),
    /// A message that carries no state came with a clock (only states to join carry one).
    #[error("{0} carries a clock, which only a state to join carries")]
    UnexpectedClock(&'static str),
    /// A push, announcement, graft or prune named too many changes or roots.
    #[error("{kind} names {count} changes or roots, more than the {MAX_TREE_IDS} allowed")]
    TooManyIds {
        /// The message's kind.
        kind: &'static str,
        /// How many it named.
        count: usize,
    },
}

impl Envelope {
    /// `message` with `at` as the sender's clock if it carries a state to join, else with
    /// none.
    pub fn stamped(message: Message, at: Hlc) -> Self {
        Envelope {
            sent_at: message.carries_state().then_some(at),
            message,
        }
    }

    /// Encodes the envelope.
    pub fn encode(&self) -> Vec<u8> {
        // Sized first: one allocation, where growing from empty took one per doubling.
        let out = Vec::with_capacity(self.encoded_len());
        postcard::to_extend(self, out).expect("postcard failed to encode a message")
    }

    /// How many bytes [`Envelope::encode`] makes, without making them (the counters ask
    /// for every message sent; an encoding to count it copied each payload once more).
    pub fn encoded_len(&self) -> usize {
        postcard::experimental::serialized_size(self).expect("postcard failed to size a message")
    }

    /// Decodes an envelope, refusing trailing bytes and over-long reasons.
    ///
    /// # Errors
    /// [`MessageError`] when the bytes are not exactly one valid envelope.
    pub fn decode(bytes: &[u8]) -> Result<Self, MessageError> {
        let (env, rest): (Envelope, _) =
            postcard::take_from_bytes(bytes).map_err(|e| MessageError::Malformed(e.to_string()))?;
        if !rest.is_empty() {
            return Err(MessageError::TrailingBytes(rest.len()));
        }
        match (env.sent_at, env.message.carries_state()) {
            (None, true) => return Err(MessageError::MissingClock(env.message.kind())),
            (Some(_), false) => return Err(MessageError::UnexpectedClock(env.message.kind())),
            _ => {}
        }
        match &env.message {
            Message::Goodbye { reason } if reason.len() > MAX_REASON_LEN => {
                return Err(MessageError::ReasonTooLong);
            }
            Message::Redirect { urls }
                if urls.len() > MAX_REDIRECT_URLS || urls.iter().any(|u| u.len() > MAX_URL_LEN) =>
            {
                return Err(MessageError::RedirectTooLarge);
            }
            m => {
                if let Some(count) = m.tree_ids().filter(|&c| c > MAX_TREE_IDS) {
                    return Err(MessageError::TooManyIds {
                        kind: m.kind(),
                        count,
                    });
                }
            }
        }
        Ok(env)
    }
}

impl Message {
    /// Whether the receiver acknowledges it (it carries one of the sender's buffer numbers).
    pub fn is_acknowledged(&self) -> bool {
        matches!(
            self,
            Message::Delta { .. }
                | Message::Elided { .. }
                | Message::Push { seq: Some(_), .. }
                | Message::IHave { seq: Some(_), .. }
        )
    }

    /// The message's kind, for logs and traffic counts.
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Digest { .. } => "digest",
            Message::Delta { .. } => "delta",
            Message::Elided { .. } => "elided",
            Message::Ack { .. } => "ack",
            Message::NeedFull => "need-full",
            Message::Redirect { .. } => "redirect",
            Message::Goodbye { .. } => "goodbye",
            Message::DigestHash { .. } => "digest-hash",
            Message::ProbeReq { .. } => "probe-req",
            Message::ProbeAck { .. } => "probe-ack",
            Message::Push { .. } => "push",
            Message::IHave { .. } => "ihave",
            Message::Graft { .. } => "graft",
            Message::Prune { .. } => "prune",
            Message::ExchangeOnly => "exchange-only",
        }
    }

    /// Whether it carries a state to join (a delta, a push, a full state), and so the
    /// sender's clock.
    pub fn carries_state(&self) -> bool {
        matches!(
            self,
            Message::Delta { .. } | Message::Push { .. } | Message::Elided { .. }
        )
    }

    /// Whether it carries deltas to join: a delta, or a push on the trees.
    pub fn carries_delta(&self) -> bool {
        matches!(self, Message::Delta { .. } | Message::Push { .. })
    }

    /// How many changes or roots a tree message names (`None` for the others).
    pub fn tree_ids(&self) -> Option<usize> {
        match self {
            Message::Push { ids, announced, .. } => Some(ids.len().max(announced.len())),
            Message::IHave { ids, .. } => Some(ids.len()),
            Message::Graft { ids } => Some(ids.len()),
            Message::Prune { roots } => Some(roots.len()),
            _ => None,
        }
    }

    /// The sender's buffer sequence number a delta, full state or acknowledgement names.
    pub fn seq(&self) -> Option<u64> {
        match self {
            Message::Delta { seq, .. } | Message::Elided { seq, .. } | Message::Ack { seq } => Some(*seq),
            Message::Push { seq, .. } | Message::IHave { seq, .. } => *seq,
            _ => None,
        }
    }

    /// A digest message for `ctx`; `state` the hash of the sender's state, sent with
    /// digests that ask (not with replies).
    pub fn digest(ctx: &CausalContext, reply: bool, state: Option<[u8; 16]>) -> Self {
        Message::Digest {
            ctx: codec::encode_context(ctx),
            reply,
            state,
        }
    }

    /// A digest-hash message for `ctx`; `state` the hash of the sender's state, on a new
    /// connection.
    pub fn digest_hash(ctx: &CausalContext, state: Option<[u8; 16]>) -> Self {
        Message::DigestHash {
            hash: context_hash(ctx),
            state,
        }
    }

    /// A delta message.
    pub fn delta(seq: u64, delta: &State) -> Self {
        Message::Delta {
            seq,
            delta: codec::encode_state(delta),
        }
    }

    /// A delta message from a delta already encoded (by `codec::encode_state`).
    pub fn encoded_delta(seq: u64, delta: &[u8]) -> Self {
        Message::Delta {
            seq,
            delta: delta.to_vec(),
        }
    }

    /// An elided-state message.
    pub fn elided(seq: u64, elided: &Elided) -> Self {
        Message::Elided {
            seq,
            elided: codec::encode_elided(elided),
        }
    }

    /// A goodbye, its reason cut to [`MAX_REASON_LEN`] bytes.
    pub fn goodbye(reason: &str) -> Self {
        let mut end = reason.len().min(MAX_REASON_LEN);
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        Message::Goodbye {
            reason: reason[..end].to_string(),
        }
    }
}

/// Decodes a digest payload.
///
/// # Errors
/// [`MessageError::Payload`] when it is not a valid causal context.
pub fn decode_digest(bytes: &[u8]) -> Result<CausalContext, MessageError> {
    Ok(codec::decode_context(bytes)?)
}

/// Decodes a delta payload, refusing one with more than [`MAX_DELTA_ENTRIES`] entries.
///
/// # Errors
/// [`MessageError`] when it is not a valid state or is too large.
pub fn decode_delta(bytes: &[u8]) -> Result<State, MessageError> {
    let state = codec::decode_state(bytes)?;
    let entries = state.registration_count() + state.lease_count();
    if entries > MAX_DELTA_ENTRIES {
        return Err(MessageError::TooManyEntries {
            entries,
            limit: MAX_DELTA_ENTRIES,
        });
    }
    Ok(state)
}

/// SHA-256 of a context's encoding, cut to 16 bytes: equal contexts encode alike (maps in
/// key order, a compact cloud), so they hash alike, and two different ones collide with
/// odds no cluster will meet (a collision would only delay a repair to the next exchange
/// with another peer).
pub fn context_hash(ctx: &CausalContext) -> [u8; 16] {
    use sha2::Digest as _;
    let full = sha2::Sha256::digest(codec::encode_context(ctx));
    let mut out = [0u8; 16];
    out.copy_from_slice(&full[..16]);
    out
}

/// SHA-256 of a state's encoding, cut to 16 bytes: equal states encode alike (maps in key
/// order), so two replicas with the same hash hold the same registrations, leases,
/// removals and context. It costs an encoding of the state (O(registrations)), paid only
/// when a digest asks, that is when a connection opens or a periodic exchange found the
/// contexts apart.
pub fn state_hash(state: &State) -> [u8; 16] {
    use sha2::Digest as _;
    let full = sha2::Sha256::digest(codec::encode_state(state));
    let mut out = [0u8; 16];
    out.copy_from_slice(&full[..16]);
    out
}

/// Decodes an elided-state payload, refusing one with more than [`MAX_STATE_ENTRIES`] entries.
///
/// # Errors
/// [`MessageError`] when it is not a valid elided state or is too large.
pub fn decode_elided(bytes: &[u8]) -> Result<Elided, MessageError> {
    let e = codec::decode_elided(bytes)?;
    let entries = e.entry_count();
    if entries > MAX_STATE_ENTRIES {
        return Err(MessageError::TooManyEntries {
            entries,
            limit: MAX_STATE_ENTRIES,
        });
    }
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_round_trip_and_refuse_trailing_bytes_and_garbage() {
        let env = Envelope::stamped(Message::Ack { seq: 42 }, Hlc::new(5, 1));
        let mut bytes = env.encode();
        assert_eq!(Envelope::decode(&bytes).unwrap(), env);
        assert_eq!(env.encoded_len(), bytes.len());
        let delta = Envelope::stamped(Message::encoded_delta(7, &[1; 300]), Hlc::new(1 << 40, 3));
        assert_eq!(delta.encoded_len(), delta.encode().len());
        bytes.push(0);
        assert_eq!(Envelope::decode(&bytes), Err(MessageError::TrailingBytes(1)));
        // (Seven, seven, seven is a valid probe now; a variant past the last is not.)
        for garbage in [&[][..], &[0xff; 40][..], &[7, 40, 7][..]] {
            assert!(Envelope::decode(garbage).is_err());
        }
    }

    #[test]
    fn only_a_state_to_join_carries_the_clock_and_it_must() {
        let at = Hlc::new(1 << 40, 3);
        let ack = Envelope::stamped(Message::Ack { seq: 42 }, at);
        assert_eq!(ack.sent_at, None);
        assert_eq!(
            ack.encoded_len(),
            3,
            "an acknowledgement is its tag, its kind and its number"
        );
        let delta = Envelope::stamped(Message::encoded_delta(7, &[1; 30]), at);
        assert_eq!(delta.sent_at, Some(at));
        let bare = Envelope {
            sent_at: None,
            ..delta
        };
        assert_eq!(
            Envelope::decode(&bare.encode()),
            Err(MessageError::MissingClock("delta"))
        );
        let stamped_ack = Envelope {
            sent_at: Some(at),
            ..ack
        };
        assert_eq!(
            Envelope::decode(&stamped_ack.encode()),
            Err(MessageError::UnexpectedClock("ack"))
        );
    }

    #[test]
    fn a_tree_message_naming_too_many_changes_is_refused() {
        let id = ChangeId {
            root: roster_registry::ReplicaId(7),
            at: Hlc::new(9, 0),
        };
        let env = |n| Envelope::stamped(Message::Graft { ids: vec![id; n] }, Hlc::default());
        assert!(Envelope::decode(&env(MAX_TREE_IDS).encode()).is_ok());
        assert_eq!(
            Envelope::decode(&env(MAX_TREE_IDS + 1).encode()),
            Err(MessageError::TooManyIds {
                kind: "graft",
                count: MAX_TREE_IDS + 1
            })
        );
    }

    #[test]
    fn a_goodbye_reason_is_bounded_both_ways() {
        let long = "é".repeat(500);
        let Message::Goodbye { reason } = Message::goodbye(&long) else {
            unreachable!()
        };
        assert!(reason.len() <= MAX_REASON_LEN);
        let env = Envelope::stamped(Message::Goodbye { reason: long }, Hlc::default());
        assert_eq!(Envelope::decode(&env.encode()), Err(MessageError::ReasonTooLong));
    }
}
