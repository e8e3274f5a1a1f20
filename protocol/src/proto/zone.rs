//! A node's zone: the failure domain it runs in (a rack, an availability zone, a region),
//! written with its membership so that every node knows every member's zone.

use std::fmt;

/// The longest zone name: a DNS label's.
pub const MAX_ZONE_LEN: usize = 63;

/// A zone's name: 1 to [`MAX_ZONE_LEN`] lowercase ASCII letters, digits and `-`, neither
/// first nor last, so that it is a DNS label as it is (`eu-west-1a`, `rack-12`). A node that
/// sets none is in [`Zone::DEFAULT`], and its membership names no zone, so a cluster that
/// sets none writes what it wrote before zones.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Zone(String);

/// A zone name that is not a DNS label.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("zone {0:?} is not a zone name: use 1 to 63 lowercase letters, digits and '-', not first or last (such as eu-west-1a)")]
pub struct InvalidZone(pub String);

impl Zone {
    /// The zone of a node that sets none.
    pub const DEFAULT: &'static str = "default";

    /// `name` as a zone.
    ///
    /// # Errors
    /// [`InvalidZone`] when it is not 1 to 63 lowercase letters, digits and inner `-`.
    pub fn new(name: &str) -> Result<Self, InvalidZone> {
        let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
        let ok = !name.is_empty()
            && name.len() <= MAX_ZONE_LEN
            && name.chars().all(ok_char)
            && !name.starts_with('-')
            && !name.ends_with('-');
        if ok {
            Ok(Self(name.to_string()))
        } else {
            Err(InvalidZone(name.chars().take(80).collect()))
        }
    }

    /// The zone as written in a member's registration: `None` for the default zone, the
    /// name otherwise.
    pub fn written(&self) -> Option<&str> {
        (!self.is_default()).then_some(self.0.as_str())
    }

    /// Read from a member's registration: its zone, or the default zone when it names none
    /// or one this build would refuse (a newer build's, say).
    pub fn read(written: Option<&str>) -> Self {
        Self(Self::name_of(written).to_string())
    }

    /// [`Zone::read`]'s name, borrowed from the registration.
    pub fn name_of(written: Option<&str>) -> &str {
        written.filter(|z| Self::new(z).is_ok()).unwrap_or(Self::DEFAULT)
    }

    /// Whether it is the default zone.
    pub fn is_default(&self) -> bool {
        self.0 == Self::DEFAULT
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for Zone {
    fn default() -> Self {
        Self(Self::DEFAULT.to_string())
    }
}

impl fmt::Display for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for Zone {
    type Err = InvalidZone;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zone_is_a_dns_label_and_the_default_is_written_as_none() {
        for good in ["eu-west-1a", "rack-12", "a", "0", &"z".repeat(63)] {
            assert_eq!(Zone::new(good).unwrap().as_str(), good);
        }
        for bad in [
            "",
            "EU-1",
            "eu_1",
            "eu.1",
            "-eu",
            "eu-",
            "zone one",
            "é",
            &"z".repeat(64),
        ] {
            assert!(Zone::new(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(Zone::default().written(), None);
        assert_eq!(Zone::new("default").unwrap().written(), None);
        assert_eq!(Zone::new("eu-1").unwrap().written(), Some("eu-1"));
        assert_eq!(Zone::read(None), Zone::default());
        assert_eq!(Zone::read(Some("eu-1")), Zone::new("eu-1").unwrap());
        assert_eq!(Zone::read(Some("Not A Zone")), Zone::default());
    }
}
