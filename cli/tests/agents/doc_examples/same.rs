//! What the docs say stays the same, checked across a flow: the redactions let any node id
//! or time stand for any other, but a doc that shows one value twice (a restarted agent's
//! id, an instance's `REGISTERED` before and after its owner's restart) claims the binary
//! printed one value twice too. Each value the doc shows must stand for one value printed.
//! (Not the other way: two instants the doc tells apart may fall in the same millisecond.)

use std::collections::BTreeMap;

use regex::Regex;

/// The values of the doc and what they stood for, so far in a flow.
pub struct Same {
    tokens: Regex,
    seen: BTreeMap<String, (String, String)>,
}

impl Same {
    pub fn new() -> Same {
        let tokens = Regex::new(r"\b[0-9a-f]{16}\b|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z").unwrap();
        Same {
            tokens,
            seen: BTreeMap::new(),
        }
    }

    /// Pairs the ids and times of `expected` with those of `actual`, line by line where
    /// both show as many, and checks each pair against the ones seen before (`label`
    /// names where a value was first seen).
    pub fn check(&mut self, label: &str, actual: &str, expected: &str) -> Result<(), String> {
        let (a, e): (Vec<&str>, Vec<&str>) = (actual.lines().collect(), expected.lines().collect());
        if a.len() != e.len() || e.iter().any(|l| l.trim() == "...") {
            return Ok(());
        }
        for (al, el) in a.iter().zip(&e) {
            let at: Vec<&str> = self.tokens.find_iter(al).map(|m| m.as_str()).collect();
            let et: Vec<&str> = self.tokens.find_iter(el).map(|m| m.as_str()).collect();
            if at.len() != et.len() {
                continue;
            }
            for (av, ev) in at.into_iter().zip(et) {
                let (was, first) = self
                    .seen
                    .entry(ev.to_string())
                    .or_insert_with(|| (av.to_string(), label.to_string()));
                if was != av {
                    return Err(format!(
                        "{label}: the doc shows {ev} here and at {first}, but the binary printed {was} there and {av} here"
                    ));
                }
            }
        }
        Ok(())
    }
}
