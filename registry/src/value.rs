//! The values the registry holds: a provider's registration of one service, and a
//! provider's lease.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::endpoint::Endpoint;
use crate::error::InvalidInput;
use crate::hlc::Hlc;
use crate::id::{is_printable, truncate_for_display, Dot};
use crate::meta::Metadata;
use crate::status::{Health, Status};

/// The most metadata pairs one registration may carry.
pub const MAX_META_PAIRS: usize = 64;
/// The most bytes of metadata (keys plus values) one registration may carry.
pub const MAX_META_BYTES: usize = 4096;
/// The longest metadata key, in bytes.
pub const MAX_META_KEY_LEN: usize = 128;
/// The shortest lease a provider may take, in milliseconds.
pub const MIN_LEASE_TTL_MS: u64 = 100;
/// The longest lease a provider may take, in milliseconds (one day): no lease may
/// outlive its provider for long.
pub const MAX_LEASE_TTL_MS: u64 = 24 * 60 * 60 * 1000;
/// How long a farewell ([`Lease::farewell`]) is kept after the node left, in milliseconds
/// (one day, as long as `roster members` lists a node that is gone).
pub const FAREWELL_KEPT_MS: u64 = 24 * 60 * 60 * 1000;

/// Checks metadata against the limits ([`MAX_META_PAIRS`], [`MAX_META_BYTES`],
/// [`MAX_META_KEY_LEN`]; keys non-empty and without '='; keys and values only of
/// [`is_printable`] characters).
///
/// # Errors
/// [`InvalidInput::Metadata`] naming the limit or rule that was broken.
pub fn validate_metadata(meta: &Metadata) -> Result<(), InvalidInput> {
    let bad = |why: String| Err(InvalidInput::Metadata { why });
    if meta.len() > MAX_META_PAIRS {
        return bad(format!(
            "{} pairs, more than the {MAX_META_PAIRS} allowed",
            meta.len()
        ));
    }
    let bytes: usize = meta.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > MAX_META_BYTES {
        return bad(format!("{bytes} bytes, more than the {MAX_META_BYTES} allowed"));
    }
    for (k, v) in meta.iter() {
        if k.is_empty() || k.len() > MAX_META_KEY_LEN || k.contains('=') || !k.chars().all(is_printable) {
            return bad(format!(
                "key {:?} must be 1-{MAX_META_KEY_LEN} bytes of printable characters without '='",
                truncate_for_display(k)
            ));
        }
        if !v.chars().all(is_printable) {
            return bad(format!(
                "the value of {:?} holds a control or invisible formatting character (a newline, an escape, ...); use printable characters only",
                truncate_for_display(k)
            ));
        }
    }
    Ok(())
}

/// Metadata from pairs given one by one (command-line flags, a client's request), checked:
/// more than [`MAX_META_PAIRS`] pairs, or a key given twice, is refused rather than
/// silently collapsed, and the result must pass [`validate_metadata`].
///
/// # Errors
/// [`InvalidInput::Metadata`] naming the rule that was broken.
pub fn metadata_from_pairs<K: AsRef<str>, V: AsRef<str>>(pairs: &[(K, V)]) -> Result<Metadata, InvalidInput> {
    if pairs.len() > MAX_META_PAIRS {
        return Err(InvalidInput::Metadata {
            why: format!("{} pairs, more than the {MAX_META_PAIRS} allowed", pairs.len()),
        });
    }
    let mut meta = Metadata::new();
    for (k, v) in pairs {
        let k = k.as_ref();
        if meta.insert(k, v.as_ref()).is_some() {
            return Err(InvalidInput::Metadata {
                why: format!(
                    "key {:?} is given twice; give each key once",
                    truncate_for_display(k)
                ),
            });
        }
    }
    validate_metadata(&meta)?;
    Ok(meta)
}

/// One provider's registration of one service: the value of a last-writer-wins register.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registration {
    /// Where the instance listens.
    pub endpoint: Endpoint,
    /// Its metadata.
    pub meta: Metadata,
    /// How it is doing, as its owner last judged it.
    pub status: Status,
    /// When its owner first registered it (wall ms): kept across updates, status changes
    /// and the owner's restarts, so "registered at" means what it says.
    pub since_ms: u64,
    /// When it was written; the register's winner is the greatest `(written, dot)`.
    pub written: Hlc,
    /// The provider's lease this was written under. Once that lease has been collected and
    /// no newer one has arrived, the registration is collected too (see `Replica::expire`).
    pub lease_dot: Dot,
}

impl Registration {
    pub(crate) fn validate(&self) -> Result<(), InvalidInput> {
        self.endpoint.validate()?;
        validate_metadata(&self.meta)?;
        self.status.validate()
    }
}

impl fmt::Debug for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{:?}", self.endpoint, self.written)?;
        if self.status.health != Health::Passing {
            write!(f, "[{}]", self.status.health)?;
        }
        if !self.meta.is_empty() {
            write!(f, "{:?}", self.meta)?;
        }
        Ok(())
    }
}

/// A node's lease: all of its registrations live while it does.
///
/// The deadline travels inside the value (`issued + ttl`) and every node judges it against
/// its own clock, so a stale copy delivered late cannot restart a lease that has ended.
///
/// A lease of TTL 0 is a **farewell** ([`Lease::farewell`]): the node left the cluster at
/// `issued`, by its own word. It is never live, and it is kept for
/// [`FAREWELL_KEPT_MS`] after `issued` (then collected like a lease that ended), so every
/// replica can tell a node that left from one that failed. Only the node itself writes its
/// lease, so no other node can make it look as if it left.
#[derive(Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// When the lease was issued or last renewed.
    pub issued: Hlc,
    /// How long it lasts from `issued`, in milliseconds.
    pub ttl_ms: u64,
}

impl Lease {
    /// A farewell: the last lease of a node that leaves the cluster at `issued`.
    pub fn farewell(issued: Hlc) -> Self {
        Self { issued, ttl_ms: 0 }
    }

    /// Whether this is a farewell (see [`Lease::farewell`]).
    pub fn is_farewell(&self) -> bool {
        self.ttl_ms == 0
    }

    /// Makes a lease.
    ///
    /// # Errors
    /// [`InvalidInput::LeaseTtl`] when `ttl_ms` is outside
    /// [`MIN_LEASE_TTL_MS`]..=[`MAX_LEASE_TTL_MS`].
    pub fn new(issued: Hlc, ttl_ms: u64) -> Result<Self, InvalidInput> {
        if !(MIN_LEASE_TTL_MS..=MAX_LEASE_TTL_MS).contains(&ttl_ms) {
            return Err(InvalidInput::LeaseTtl { ttl_ms });
        }
        Ok(Self { issued, ttl_ms })
    }

    /// The wall time (milliseconds since the epoch) at which the lease ends; for a
    /// farewell, the end of the time it is kept.
    pub fn deadline_ms(&self) -> u64 {
        let ttl = if self.is_farewell() {
            FAREWELL_KEPT_MS
        } else {
            self.ttl_ms
        };
        self.issued.millis().saturating_add(ttl)
    }

    /// Whether the lease is still running at `now_ms` (a farewell never is).
    pub fn is_live(&self, now_ms: u64) -> bool {
        !self.is_farewell() && now_ms < self.deadline_ms()
    }

    pub(crate) fn validate(&self) -> Result<(), InvalidInput> {
        if self.is_farewell() {
            return Ok(());
        }
        Self::new(self.issued, self.ttl_ms).map(|_| ())
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_farewell() {
            return write!(f, "farewell({:?})", self.issued);
        }
        write!(f, "lease({:?}+{}ms)", self.issued, self.ttl_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_from_pairs_refuses_a_key_given_twice_and_too_many_pairs() {
        let m = metadata_from_pairs(&[("zone", "a"), ("rack", "7")]).unwrap();
        assert_eq!((m.get("zone"), m.len()), (Some("a"), 2));
        let e = metadata_from_pairs(&[("zone", "a"), ("rack", "7"), ("zone", "b")]).unwrap_err();
        assert!(e.to_string().contains("\"zone\" is given twice"), "{e}");
        let many: Vec<(String, String)> = (0..10_000).map(|_| ("k".to_string(), "v".to_string())).collect();
        let e = metadata_from_pairs(&many).unwrap_err();
        assert!(e.to_string().contains("10000 pairs"), "{e}");
        let e = metadata_from_pairs(&[("k", "v\n")]).unwrap_err();
        assert!(e.to_string().contains("printable"), "{e}");
    }

    #[test]
    fn metadata_keys_and_values_hold_printable_characters_only() {
        let ok: Metadata = [("zone", "eu-1a \u{e9}t\u{e9} \u{1f600}"), ("note", "a=b, c;d")].into();
        validate_metadata(&ok).unwrap();
        for (k, v) in [
            ("zone", "a\n\u{1b}[31mdown  web  web-1"),
            ("zone", "a\rb"),
            ("zone", "\u{7f}"),
            ("zone", "\u{9b}31m"),
            ("zone", "\u{202e}evil"),
            ("zone", "zero\u{200b}width"),
            ("zo\nne", "a"),
            ("zo\u{1b}ne", "a"),
            ("\u{feff}zone", "a"),
        ] {
            let m: Metadata = [(k, v)].into();
            let e = validate_metadata(&m).expect_err(&format!("{k:?}={v:?}"));
            assert!(e.to_string().contains("printable"), "{e}");
            assert!(
                !e.to_string().contains('\n') && !e.to_string().contains('\u{1b}'),
                "{e}"
            );
        }
    }

    #[test]
    fn metadata_limits_are_named() {
        let mut m = Metadata::new();
        for i in 0..64 {
            m.insert(format!("k{i}"), "v");
        }
        validate_metadata(&m).unwrap();
        m.insert("one-too-many", "v");
        assert!(validate_metadata(&m)
            .unwrap_err()
            .to_string()
            .contains("65 pairs"));
        let big: Metadata = [("k".to_string(), "v".repeat(4096))].into();
        assert!(validate_metadata(&big)
            .unwrap_err()
            .to_string()
            .contains("4097 bytes"));
        let eq: Metadata = [("a=b".to_string(), String::new())].into();
        assert!(validate_metadata(&eq).is_err());
    }

    #[test]
    fn lease_ttl_is_bounded_so_no_lease_lasts_forever() {
        assert!(Lease::new(Hlc::new(0, 0), 99).is_err());
        assert!(Lease::new(Hlc::new(0, 0), MAX_LEASE_TTL_MS + 1).is_err());
        let l = Lease::new(Hlc::new(1_000, 7), 500).unwrap();
        assert_eq!(l.deadline_ms(), 1_500);
        assert!(l.is_live(1_499) && !l.is_live(1_500));
    }
}
