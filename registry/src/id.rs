//! Names and identities: service names, provider ids, replica ids and dots.
//!
//! Every name that comes from outside is validated once, when it is made, so the rest of
//! the core can trust it. Names are reference-counted strings: a key appears in the store
//! and in the dot index, and cloning it must not copy its bytes.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::InvalidInput;

/// The longest service name, in bytes (the limit of a DNS name).
pub const MAX_SERVICE_NAME_LEN: usize = 253;
/// The longest label (dot-separated part) of a service name, in bytes.
pub const MAX_LABEL_LEN: usize = 63;
/// The longest provider id, in bytes.
pub const MAX_PROVIDER_ID_LEN: usize = 128;

/// The identity of a registry node: the actor that mints dots.
///
/// A node keeps the same `ReplicaId` across restarts (it is saved with the replica), so
/// the causal context grows with nodes, not with boots.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ReplicaId(pub u64);

impl fmt::Debug for ReplicaId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl fmt::Display for ReplicaId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// A dot: one event minted by one replica, `(replica, counter)`, counters starting at 1.
///
/// Ordered by replica, then counter, so all dots of one replica form a range.
pub type Dot = crdts::OrdDot<ReplicaId>;

/// Makes a dot.
pub fn dot(replica: ReplicaId, counter: u64) -> Dot {
    Dot {
        actor: replica,
        counter,
    }
}

/// A validated service name: 1-253 bytes of `[a-z0-9.-]`, made of dot-separated labels of
/// 1-63 bytes that neither start nor end with `-` (the DNS rules).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceName(Arc<str>);

impl ServiceName {
    /// Validates and makes a service name.
    ///
    /// # Errors
    /// [`InvalidInput::ServiceName`] saying which rule the name breaks.
    pub fn new(name: &str) -> Result<Self, InvalidInput> {
        validate_service_name(name).map_err(|why| InvalidInput::ServiceName {
            name: truncate_for_display(name),
            why,
        })?;
        Ok(Self(Arc::from(name)))
    }

    /// The name as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn validate_service_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("it is empty");
    }
    if name.len() > MAX_SERVICE_NAME_LEN {
        return Err("it is longer than 253 bytes");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
    {
        return Err("only lowercase letters, digits, '.' and '-' are allowed");
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err("it has an empty label (two dots in a row, or a dot at an end)");
        }
        if label.len() > MAX_LABEL_LEN {
            return Err("a label is longer than 63 bytes");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err("a label starts or ends with '-'");
        }
    }
    Ok(())
}

/// A validated provider id: 1-128 bytes of ASCII letters, digits and `.-_:@`.
///
/// A provider is one running instance of a service (a process, a container). Its id is
/// stable across its restarts, so a restart shows up as an update, never as a delete and
/// an add.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProviderId(Arc<str>);

impl ProviderId {
    /// Validates and makes a provider id.
    ///
    /// # Errors
    /// [`InvalidInput::ProviderId`] saying which rule the id breaks.
    pub fn new(id: &str) -> Result<Self, InvalidInput> {
        let why = if id.is_empty() {
            Some("it is empty")
        } else if id.len() > MAX_PROVIDER_ID_LEN {
            Some("it is longer than 128 bytes")
        } else if !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b':' | b'@'))
        {
            Some("only ASCII letters, digits and '.-_:@' are allowed")
        } else {
            None
        };
        match why {
            Some(why) => Err(InvalidInput::ProviderId {
                id: truncate_for_display(id),
                why,
            }),
            None => Ok(Self(Arc::from(id))),
        }
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The empty id, which sorts before every valid one: a range bound, never stored.
    pub(crate) fn sentinel_min() -> Self {
        Self(Arc::from(""))
    }
}

/// Keeps error messages one line and short, whatever a peer or a client sent.
pub(crate) fn truncate_for_display(s: &str) -> String {
    const MAX: usize = 64;
    let mut out: String = s.chars().take(MAX).flat_map(char::escape_default).collect();
    if s.chars().count() > MAX {
        out.push_str("...");
    }
    out
}

macro_rules! string_newtype_impls {
    ($t:ty) => {
        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&*self.0, f)
            }
        }
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
        impl TryFrom<String> for $t {
            type Error = InvalidInput;
            fn try_from(s: String) -> Result<Self, InvalidInput> {
                Self::new(&s)
            }
        }
        impl From<$t> for String {
            fn from(v: $t) -> String {
                v.0.to_string()
            }
        }
        // Encoded as a string. Written from the shared bytes, read from borrowed ones
        // where the format lends them: one allocation per name read, none per name written
        // (through `String`, each cost one more).
        impl Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct Name;
                impl serde::de::Visitor<'_> for Name {
                    type Value = $t;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str("a string")
                    }
                    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<$t, E> {
                        <$t>::new(v).map_err(E::custom)
                    }
                }
                d.deserialize_str(Name)
            }
        }
        impl std::str::FromStr for $t {
            type Err = InvalidInput;
            fn from_str(s: &str) -> Result<Self, InvalidInput> {
                Self::new(s)
            }
        }
    };
}
string_newtype_impls!(ServiceName);
string_newtype_impls!(ProviderId);

/// Whether `c` prints as itself: not a control character (C0, DEL, C1: newlines, escape
/// sequences) and not an invisible formatting character that reorders or hides text (bidi
/// controls, zero-width characters, the byte-order mark). Metadata keys and values hold only
/// these, so what a terminal shows is what was registered.
pub fn is_printable(c: char) -> bool {
    !c.is_control()
        && !matches!(
            c,
            '\u{061C}' | '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{2069}' | '\u{FEFF}'
        )
}

/// The key of a registration: which provider offers which service.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RegKey {
    /// The service.
    pub service: ServiceName,
    /// The provider offering it.
    pub provider: ProviderId,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_names_follow_dns_rules() {
        for ok in ["web", "db.primary", "a-b.c-d", "x1", &"a".repeat(63)] {
            assert!(ServiceName::new(ok).is_ok(), "{ok} should be valid");
        }
        let long = format!("{}.{}", "a".repeat(63), "b".repeat(190));
        assert_eq!(long.len(), 254);
        for bad in [
            "",
            "Web",
            "we b",
            "-web",
            "web-",
            "a..b",
            ".a",
            "a.",
            "ü",
            &"a".repeat(64),
            &long,
        ] {
            assert!(ServiceName::new(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn provider_ids_are_bounded_and_printable() {
        assert!(ProviderId::new("web-1@host:8080").is_ok());
        assert!(ProviderId::new(&"p".repeat(128)).is_ok());
        assert!(ProviderId::new(&"p".repeat(129)).is_err());
        assert!(ProviderId::new("").is_err());
        assert!(ProviderId::new("a b").is_err());
        assert!(ProviderId::new("a\nb").is_err());
    }

    #[test]
    fn error_messages_stay_one_short_line() {
        let err = ServiceName::new(&format!("{}\n{}", "x".repeat(500), "y")).unwrap_err();
        let msg = err.to_string();
        assert!(!msg.contains('\n'), "{msg}");
        assert!(msg.len() < 250, "{msg}");
    }
}
