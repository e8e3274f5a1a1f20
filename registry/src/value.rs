//! The values the registry holds: a provider's registration of one service, and a
//! provider's lease.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::InvalidInput;
use crate::hlc::Hlc;
use crate::id::{truncate_for_display, Dot};
use crate::meta::Metadata;
use crate::status::{Health, Status};

/// The most metadata pairs one registration may carry.
pub const MAX_META_PAIRS: usize = 64;
/// The most bytes of metadata (keys plus values) one registration may carry.
pub const MAX_META_BYTES: usize = 4096;
/// The longest metadata key, in bytes.
pub const MAX_META_KEY_LEN: usize = 128;
/// The longest host name or address in an endpoint, in bytes.
pub const MAX_HOST_LEN: usize = 253;
/// The shortest lease a provider may take, in milliseconds.
pub const MIN_LEASE_TTL_MS: u64 = 100;
/// The longest lease a provider may take, in milliseconds (one day): no lease may
/// outlive its provider for long.
pub const MAX_LEASE_TTL_MS: u64 = 24 * 60 * 60 * 1000;
/// How long a farewell ([`Lease::farewell`]) is kept after the node left, in milliseconds
/// (one day, as long as `roster members` lists a node that is gone).
pub const FAREWELL_KEPT_MS: u64 = 24 * 60 * 60 * 1000;

/// Where a service instance listens: a host name or IP address, and a port.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Endpoint {
    host: Box<str>,
    port: u16,
}

impl Endpoint {
    /// Validates and makes an endpoint.
    ///
    /// The host is a DNS host name (letters, digits, hyphens and dots: labels of 1-63 bytes
    /// that neither start nor end with a hyphen, at most 253 bytes, an optional trailing
    /// dot, a last label that is not all digits), an IPv4 address (`10.0.0.7`) or an IPv6
    /// address (`::1`, or `[::1]` in brackets).
    ///
    /// # Errors
    /// [`InvalidInput::Endpoint`] when the host is none of these, or when the port is 0.
    pub fn new(host: &str, port: u16) -> Result<Self, InvalidInput> {
        let bracketed = host.strip_prefix('[').and_then(|h| h.strip_suffix(']'));
        let host = bracketed.unwrap_or(host);
        let why = if port == 0 {
            Err("the port is 0")
        } else if bracketed.is_some() || host.contains(':') {
            host.parse::<core::net::Ipv6Addr>()
                .map(|_| ())
                .map_err(|_| "the host is not an IPv6 address")
        } else {
            validate_host_name(host)
        };
        match why {
            Err(why) => Err(InvalidInput::Endpoint {
                endpoint: truncate_for_display(&format!("{host}:{port}")),
                why,
            }),
            Ok(()) => Ok(Self {
                host: host.into(),
                port,
            }),
        }
    }

    /// Parses `host:port` or `[ipv6]:port`.
    ///
    /// # Errors
    /// [`InvalidInput::Endpoint`] when there is no port, the port is not a number from 1 to
    /// 65535, or the host is invalid.
    pub fn parse(s: &str) -> Result<Self, InvalidInput> {
        let bad = |why| InvalidInput::Endpoint {
            endpoint: truncate_for_display(s),
            why,
        };
        let (host, port) = s
            .rsplit_once(':')
            .ok_or_else(|| bad("expected HOST:PORT, e.g. 10.0.0.7:8080"))?;
        if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
            return Err(bad("write an IPv6 address in brackets, e.g. [::1]:8080"));
        }
        let port: u16 = port
            .parse()
            .map_err(|_| bad("the port is not a number from 1 to 65535"))?;
        Self::new(host, port)
    }

    /// The host name or IP address (IPv6 without brackets).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    fn validate(&self) -> Result<(), InvalidInput> {
        Self::new(&self.host, self.port).map(|_| ())
    }
}

/// Checks a host that is not an IPv6 address: an IPv4 address or a DNS host name.
fn validate_host_name(host: &str) -> Result<(), &'static str> {
    if host.parse::<core::net::Ipv4Addr>().is_ok() {
        return Ok(());
    }
    let name = host.strip_suffix('.').unwrap_or(host);
    if name.is_empty() {
        return Err("the host is empty");
    }
    if host.len() > MAX_HOST_LEN {
        return Err("the host is longer than 253 bytes");
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err("the host has an empty label (two dots in a row, or a leading dot)");
        }
        if label.len() > 63 {
            return Err("a label of the host is longer than 63 bytes");
        }
        if !label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
            return Err("the host is not a host name (letters, digits, '-' and dots) nor an IP address");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err("a label of the host starts or ends with '-'");
        }
    }
    if name
        .rsplit('.')
        .next()
        .is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err("the host is not a valid IPv4 address, and a host name's last label is not all digits");
    }
    Ok(())
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

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
    fn endpoints_parse_v4_v6_and_names() {
        assert_eq!(
            Endpoint::parse("10.0.0.7:8080").unwrap().to_string(),
            "10.0.0.7:8080"
        );
        let v6 = Endpoint::parse("[::1]:53").unwrap();
        assert_eq!((v6.host(), v6.port()), ("::1", 53));
        assert_eq!(v6.to_string(), "[::1]:53");
        assert_eq!(Endpoint::parse("db.local:5432").unwrap().host(), "db.local");
        for bad in ["nohost", "::1:53", "a:0", "a:70000", ":80", "a b:80", "a:-1"] {
            assert!(Endpoint::parse(bad).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn hosts_must_be_host_names_or_ip_literals() {
        for good in [
            "localhost:80",
            "db.local:5432",
            "db.local.:5432",
            "a-1.B-2.example:1",
            "xn--bcher-kva.example:443",
            "10.0.0.7:8080",
            "255.255.255.255:1",
            "[::1]:53",
            "[fe80::1:2]:53",
            "[::ffff:10.0.0.1]:80",
            "svc1.internal:9",
        ] {
            let e = Endpoint::parse(good).unwrap_or_else(|e| panic!("{good} should be accepted: {e}"));
            assert_eq!(Endpoint::parse(&e.to_string()).unwrap(), e, "{good} round-trips");
        }
        let long_label = format!("{}.example:80", "a".repeat(64));
        let long_name = format!("{}a:80", "abcdefgh.".repeat(29));
        for bad in [
            "`$(id)`;rm:80",
            "$(id):80",
            "a;b:80",
            "a_b:80",
            "a/b:80",
            "a\u{1b}[2J:80",
            "h\u{e9}te.example:80",
            "-a.example:80",
            "a-.example:80",
            "a..example:80",
            ".a.example:80",
            ".:80",
            "10.0.0.256:80",
            "1.2.3:80",
            "010.0.0.1:80",
            "1234:80",
            "[10.0.0.1]:80",
            "[::g]:80",
            "[a.example]:80",
            &long_label,
            &long_name,
        ] {
            let e = Endpoint::parse(bad).expect_err(bad);
            assert!(e.to_string().starts_with("invalid address"), "{bad}: {e}");
        }
        // What a peer sends goes through the same rules.
        let forged: Endpoint =
            postcard::from_bytes(&postcard::to_stdvec(&("$(id)", 80u16)).unwrap()).unwrap();
        assert!(forged.validate().is_err());
        assert!(
            Endpoint::new("::1", 53).is_ok(),
            "a stored IPv6 host has no brackets"
        );
    }

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
