//! Where a service instance listens: a host name or an IP address, and a port.
//!
//! An IP address is held parsed, in the value itself: most instances listen on one, and
//! as a string it took an allocation of its own in every registration at every node
//! (about 32 bytes with the allocator's header). Its encoding is the text, as before.

use core::net::{Ipv4Addr, Ipv6Addr};
use std::borrow::Cow;
use std::fmt;
use std::io::Write as _;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::InvalidInput;
use crate::id::truncate_for_display;

/// The longest host name or address in an endpoint, in bytes.
pub const MAX_HOST_LEN: usize = 253;

/// Where a service instance listens: a host name or IP address, and a port.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Endpoint(Host);

/// The host and the port, 24 bytes whichever it is (as the boxed string alone was).
#[derive(Clone, PartialEq, Eq, Hash)]
enum Host {
    /// An IPv4 address, written as it reads back.
    V4(Ipv4Addr, u16),
    /// An IPv6 address, written as it reads back (`::1`, not `0:0:0:0:0:0:0:1`).
    V6(Ipv6Addr, u16),
    /// A host name, or an address written some other way: kept as written.
    Name(Box<str>, u16),
}

/// The most bytes an IP address takes as text (an IPv6 address with an IPv4 tail).
const MAX_IP_TEXT: usize = 45;

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
            Ok(()) => Ok(Self::from_parts(host, port)),
        }
    }

    /// The endpoint of `host` (not checked) and `port`: an address that reads back as
    /// written is held parsed, anything else as its text. So the same text always makes
    /// the same value, and a value always writes the text it came from.
    fn from_parts(host: &str, port: u16) -> Self {
        // The standard library reads an IPv4 address only in the form it writes (four
        // decimal numbers, no leading zero), so one that parses reads back as written.
        if let Ok(ip) = host.parse::<Ipv4Addr>() {
            return Self(Host::V4(ip, port));
        }
        if let Ok(ip) = host.parse::<Ipv6Addr>() {
            if with_text(&ip, |t| t == host) {
                return Self(Host::V6(ip, port));
            }
        }
        Self(Host::Name(host.into(), port))
    }

    /// Calls `f` with the host as text, without allocating.
    fn with_host<R>(&self, f: impl FnOnce(&str) -> R) -> R {
        match &self.0 {
            Host::V4(ip, _) => with_text(ip, f),
            Host::V6(ip, _) => with_text(ip, f),
            Host::Name(name, _) => f(name),
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
    pub fn host(&self) -> Cow<'_, str> {
        match &self.0 {
            Host::Name(name, _) => Cow::Borrowed(name),
            _ => Cow::Owned(self.with_host(str::to_string)),
        }
    }

    /// The port.
    pub fn port(&self) -> u16 {
        match self.0 {
            Host::V4(_, port) | Host::V6(_, port) | Host::Name(_, port) => port,
        }
    }

    pub(crate) fn validate(&self) -> Result<(), InvalidInput> {
        self.with_host(|host| Self::new(host, self.port()).map(|_| ()))
    }
}

/// Calls `f` with `ip` written as text, in a buffer on the stack.
fn with_text<R>(ip: &impl fmt::Display, f: impl FnOnce(&str) -> R) -> R {
    let mut buf = [0u8; MAX_IP_TEXT];
    let mut rest = &mut buf[..];
    // An address always fits; were it not to, the text would be cut, never wrong bytes.
    let _ = write!(rest, "{ip}");
    let len = MAX_IP_TEXT - rest.len();
    f(std::str::from_utf8(&buf[..len]).unwrap_or_default())
}

/// The encoding: the host as text and the port, as when the host was a string.
#[derive(Serialize, Deserialize)]
#[serde(rename = "Endpoint")]
struct Wire<'a> {
    #[serde(borrow)]
    host: Cow<'a, str>,
    port: u16,
}

impl Serialize for Endpoint {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.with_host(|host| {
            Wire {
                host: Cow::Borrowed(host),
                port: self.port(),
            }
            .serialize(s)
        })
    }
}

impl<'de> Deserialize<'de> for Endpoint {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Not checked here, as before: a registration's checks run on what a peer sends.
        let w = Wire::deserialize(d)?;
        Ok(Self::from_parts(&w.host, w.port))
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
        let port = self.port();
        self.with_host(|host| match host.contains(':') {
            true => write!(f, "[{host}]:{port}"),
            false => write!(f, "{host}:{port}"),
        })
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An address is held parsed, anything else as written; either way the value writes
    /// the text it came from, and encodes as the text did (`host` a string, then `port`).
    #[test]
    fn an_address_is_held_parsed_and_writes_and_encodes_as_it_was_written() {
        assert_eq!(std::mem::size_of::<Endpoint>(), 24);
        for (text, parsed) in [
            ("10.0.0.7:8080", true),
            ("[::1]:53", true),
            ("[fe80::1:2]:80", true),
            ("[0:0:0:0:0:0:0:1]:53", false),
            ("[::ffff:10.0.0.1]:80", true),
            ("db.local:5432", false),
            ("999.1.1.1:80", false),
        ] {
            let Ok(e) = Endpoint::parse(text) else {
                assert!(!parsed, "{text} should parse");
                continue;
            };
            assert_eq!(matches!(e.0, Host::V4(..) | Host::V6(..)), parsed, "{text}");
            assert_eq!(e.to_string(), text);
            #[derive(Serialize)]
            struct Before<'a> {
                host: &'a str,
                port: u16,
            }
            let before = postcard::to_allocvec(&Before {
                host: &e.host(),
                port: e.port(),
            })
            .unwrap();
            assert_eq!(postcard::to_allocvec(&e).unwrap(), before, "{text}");
            assert_eq!(postcard::from_bytes::<Endpoint>(&before).unwrap(), e, "{text}");
        }
        // A decoded host is written as it came: leading zeros are not an IPv4 address.
        let odd = Endpoint::from_parts("010.0.0.1", 80);
        assert!(matches!(odd.0, Host::Name(..)));
        assert_eq!(odd.to_string(), "010.0.0.1:80");
    }

    #[test]
    fn endpoints_parse_v4_v6_and_names() {
        assert_eq!(
            Endpoint::parse("10.0.0.7:8080").unwrap().to_string(),
            "10.0.0.7:8080"
        );
        let v6 = Endpoint::parse("[::1]:53").unwrap();
        assert_eq!((v6.host().as_ref(), v6.port()), ("::1", 53));
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
}
