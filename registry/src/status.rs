//! The health of a registered instance, as its owner last judged it: what reads filter on.
//!
//! The node that owns a registration runs its checks and writes a new value only when the
//! status changes, so status costs the cluster what changes, not what is checked.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::InvalidInput;
use crate::id::{is_printable, truncate_for_display};

/// The longest status note, in bytes.
pub const MAX_NOTE_LEN: usize = 256;

/// How an instance is doing. Reads return `Passing` and `Warning` instances unless asked
/// for all of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Health {
    /// Its checks pass (or it has none).
    #[default]
    Passing,
    /// A check warns: still served.
    Warning,
    /// A check fails: not served.
    Critical,
    /// Taken out of service by an operator, still registered (a drain before a deploy).
    Maintenance,
}

impl Health {
    /// Whether reads return an instance in this state by default.
    pub fn is_served(self) -> bool {
        matches!(self, Self::Passing | Self::Warning)
    }

    /// The name, as the CLI and JSON show it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Passing => "passing",
            Self::Warning => "warning",
            Self::Critical => "critical",
            Self::Maintenance => "maintenance",
        }
    }
}

impl fmt::Display for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Health {
    type Err = InvalidInput;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [Self::Passing, Self::Warning, Self::Critical, Self::Maintenance]
            .into_iter()
            .find(|h| h.as_str() == s)
            .ok_or_else(|| InvalidInput::Status {
                why: format!(
                    "{:?} is not a status; use passing, warning, critical or maintenance",
                    truncate_for_display(s)
                ),
            })
    }
}

/// An instance's health and why: the output of the check that decided it, or the reason
/// given for maintenance.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// How it is doing.
    pub health: Health,
    /// Why, in one line of at most [`MAX_NOTE_LEN`] bytes; empty when there is nothing to say.
    pub note: String,
}

impl Status {
    /// A status with a note cut to [`MAX_NOTE_LEN`] bytes (at a character boundary) and
    /// with every character [`is_printable`] refuses replaced by a space: check output is
    /// whatever a program printed.
    pub fn new(health: Health, note: &str) -> Self {
        let mut clean = String::with_capacity(note.len().min(MAX_NOTE_LEN));
        for c in note.chars().map(|c| if is_printable(c) { c } else { ' ' }) {
            if clean.len() + c.len_utf8() > MAX_NOTE_LEN {
                break;
            }
            clean.push(c);
        }
        Self {
            health,
            note: clean.trim().to_string(),
        }
    }

    /// Passing, with nothing to say.
    pub fn passing() -> Self {
        Self::default()
    }

    /// Checks the note (what a peer sends goes through the same rules as what is written).
    ///
    /// # Errors
    /// [`InvalidInput::Status`] for a note over [`MAX_NOTE_LEN`] bytes or with a control
    /// or invisible character.
    pub fn validate(&self) -> Result<(), InvalidInput> {
        if self.note.len() > MAX_NOTE_LEN {
            return Err(InvalidInput::Status {
                why: format!(
                    "a note of {} bytes, more than the {MAX_NOTE_LEN} allowed",
                    self.note.len()
                ),
            });
        }
        if !self.note.chars().all(is_printable) {
            return Err(InvalidInput::Status {
                why:
                    "a note holds a control or invisible formatting character; use printable characters only"
                        .to_string(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_is_cut_and_cleaned_and_a_forged_one_is_refused() {
        let s = Status::new(Health::Critical, "HTTP 503\n\u{1b}[2J");
        assert_eq!(s.note, "HTTP 503  [2J");
        s.validate().unwrap();
        let long = Status::new(Health::Warning, &"\u{e9}".repeat(200));
        assert!(long.note.len() <= MAX_NOTE_LEN && long.note.len() >= MAX_NOTE_LEN - 1);
        long.validate().unwrap();
        let forged = Status {
            health: Health::Passing,
            note: "a\nb".to_string(),
        };
        assert!(forged.validate().unwrap_err().to_string().contains("printable"));
        let big = Status {
            health: Health::Passing,
            note: "x".repeat(MAX_NOTE_LEN + 1),
        };
        assert!(big.validate().unwrap_err().to_string().contains("257 bytes"));
    }

    #[test]
    fn health_names_round_trip_and_only_passing_and_warning_are_served() {
        for h in [
            Health::Passing,
            Health::Warning,
            Health::Critical,
            Health::Maintenance,
        ] {
            assert_eq!(h.as_str().parse::<Health>().unwrap(), h);
        }
        assert!(Health::Passing.is_served() && Health::Warning.is_served());
        assert!(!Health::Critical.is_served() && !Health::Maintenance.is_served());
        let e = "ok".parse::<Health>().unwrap_err().to_string();
        assert!(e.contains("passing, warning, critical or maintenance"), "{e}");
    }
}
