//! Where a service instance listens: a host name or an IP address, and a port.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::InvalidInput;
use crate::id::truncate_for_display;
use crate::value::MAX_HOST_LEN;

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

    pub(crate) fn validate(&self) -> Result<(), InvalidInput> {
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
}
