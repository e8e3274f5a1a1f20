//! What differs from run to run and is not the doc's to fix: the ports (the docs give the
//! defaults, the runner takes free ones), node ids, process ids, times, ages and milliseconds.
//!
//! Commands get the free ports in place of the documented ones; output gets the documented
//! ones back. Then the same redactions go over the doc's output and the real one, so a doc
//! keeps realistic values (`3b94983390832086`, `2026-11-30T04:01:38.511Z`) and still
//! matches; snapbox's `[..]` and `...` wildcards cover the rest. A stand-in port may have
//! another number of digits than the documented one, so the padding between columns is
//! compared as two spaces, whatever its width.

use regex::Regex;
use snapbox::Redactions;

/// The ports the docs use: the defaults (7420 peers and clients, 7421 HTTP, 8600 DNS) and
/// the tutorial's second and third agents.
pub const DOC_PORTS: [u16; 8] = [7420, 7421, 7430, 7431, 7440, 7441, 7450, 8600];

/// The documented ports and the free loopback ports that stand in for them in one flow.
pub struct Ports {
    map: Vec<(u16, u16)>,
}

impl Ports {
    /// A free loopback port for each documented one (bound, noted and released, so
    /// nothing here ever binds a documented port itself).
    pub fn free() -> Ports {
        let map = DOC_PORTS
            .iter()
            .map(|doc| {
                let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                (*doc, l.local_addr().unwrap().port())
            })
            .collect();
        Ports { map }
    }

    /// The free port that stands in for the documented `doc`.
    pub fn real(&self, doc: u16) -> u16 {
        self.map.iter().find(|(d, _)| *d == doc).map(|(_, r)| *r).unwrap()
    }

    /// `command` with each documented port (a number of its own) replaced.
    pub fn to_real(&self, command: &str) -> String {
        let re = Regex::new(r"\b(\d{4,5})\b").unwrap();
        re.replace_all(command, |c: &regex::Captures| {
            let n: u16 = c[1].parse().unwrap_or(0);
            self.map
                .iter()
                .find(|(d, _)| *d == n)
                .map_or(c[1].to_string(), |(_, r)| r.to_string())
        })
        .into_owned()
    }

    /// `output` with each stand-in port after a `:` given back its documented number.
    pub fn to_doc(&self, output: &str) -> String {
        let re = Regex::new(r":(\d{4,5})\b").unwrap();
        re.replace_all(output, |c: &regex::Captures| {
            let n: u16 = c[1].parse().unwrap_or(0);
            let doc = self.map.iter().find(|(_, r)| *r == n).map_or(n, |(d, _)| *d);
            format!(":{doc}")
        })
        .into_owned()
    }
}

/// The redactions applied to both the doc's output and the binary's.
pub fn redactions() -> Redactions {
    let mut r = Redactions::new();
    let patterns = [
        ("[TIME]", r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z"),
        ("[NODE]", r"\b[0-9a-f]{16}\b"),
        ("[PID]", r"\bpid (?<redacted>\d+)"),
        ("[AGE]", r"\b(?<redacted>\d+(\.\d+)?(ms|s|m)) ago\b"),
        ("[LEFT]", r"\bin (?<redacted>\d+(\.\d+)?(ms|s|m))\b"),
        ("[WAIT]", r"reconnecting in (?<redacted>\d+ms)"),
        // Milliseconds in JSON: spans (`uptime_ms`) and points in time (`written_ms`, a
        // lease's ends).
        ("[MS]", r#"_ms": (?<redacted>\d+)"#),
        ("[MS]", r"\b(?<redacted>\d{13})\b"),
    ];
    for (placeholder, re) in patterns {
        r.insert(placeholder, Regex::new(re).unwrap()).unwrap();
    }
    r
}

/// `line` without trailing spaces, each run of two or more spaces (or a tab) as two: a
/// table's columns, whatever the width of the values above and below (dig's tabs too).
pub fn columns(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut spaces = 0;
    for ch in line.trim_end().chars() {
        if ch == ' ' || ch == '\t' {
            spaces += if ch == '\t' { 2 } else { 1 };
            continue;
        }
        out.push_str(&" ".repeat(spaces.min(2)));
        spaces = 0;
        out.push(ch);
    }
    out
}
