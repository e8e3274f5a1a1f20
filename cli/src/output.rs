//! Human output (aligned tables) and JSON output.
//!
//! Text output shows what peers and agents sent (names, addresses, metadata), so every
//! field is escaped before it reaches the terminal: a newline or an escape sequence in a
//! value cannot forge a line or recolour the screen. JSON output escapes by itself.

use std::borrow::Cow;
use std::io::Write;
use std::time::{Duration, UNIX_EPOCH};

use roster::api::{ExplainView, InstanceView, StatusView};
use serde::Serialize;

/// Prints a line and flushes (a watch's lines must not wait in a buffer).
pub fn line(s: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{s}");
    let _ = out.flush();
}

/// `s` with every character that does not print as itself (control characters, escape
/// sequences, invisible formatting) written as a Rust escape (`\n`, `\u{1b}`).
pub fn escape(s: &str) -> Cow<'_, str> {
    if s.chars().all(roster::registry::is_printable) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if roster::registry::is_printable(c) {
            out.push(c);
        } else {
            out.extend(c.escape_default());
        }
    }
    Cow::Owned(out)
}

/// Prints one line of text, escaped.
pub fn text_line(s: &str) {
    line(&escape(s));
}

/// Prints lines of text, each escaped.
fn text_lines(lines: &[String]) {
    let escaped: Vec<Cow<'_, str>> = lines.iter().map(|l| escape(l)).collect();
    line(&escaped.join("\n"));
}

/// Prints a value as pretty JSON.
pub fn json<T: Serialize + ?Sized>(v: &T) {
    match serde_json::to_string_pretty(v) {
        Ok(s) => line(&s),
        Err(e) => eprintln!("roster: error: cannot encode JSON: {e}"),
    }
}

/// Prints a value as JSON on one line.
pub fn json_line<T: Serialize + ?Sized>(v: &T) {
    match serde_json::to_string(v) {
        Ok(s) => line(&s),
        Err(e) => eprintln!("roster: error: cannot encode JSON: {e}"),
    }
}

/// Prints rows under headers, each column as wide as its widest cell.
pub fn table(headers: &[&str], rows: Vec<Vec<String>>) {
    let rows: Vec<Vec<String>> = rows
        .into_iter()
        .map(|r| r.iter().map(|c| escape(c).into_owned()).collect())
        .collect();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let render = |cells: Vec<&str>| {
        let n = cells.len();
        let mut s = String::new();
        for (i, (c, w)) in cells.into_iter().zip(&widths).enumerate() {
            s.push_str(c);
            if i + 1 < n {
                s.push_str(&" ".repeat(w - c.chars().count() + 2));
            }
        }
        s.truncate(s.trim_end().len());
        s
    };
    let mut out = String::new();
    out.push_str(&render(headers.to_vec()));
    for r in &rows {
        out.push('\n');
        out.push_str(&render(r.iter().map(String::as_str).collect()));
    }
    line(&out);
}

/// Wall milliseconds as RFC 3339 (UTC, milliseconds).
pub fn rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// `k=v,k=v`.
pub fn meta_line(meta: &[(String, String)]) -> String {
    meta.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Metadata as a JSON object.
pub fn meta_json(meta: &[(String, String)]) -> serde_json::Value {
    serde_json::Value::Object(
        meta.iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
            .collect(),
    )
}

/// One instance as `roster get --json` shows it.
pub fn instance_json(i: &InstanceView) -> serde_json::Value {
    serde_json::to_value(InstanceJson::of_view(i)).unwrap_or_default()
}

/// One instance as `roster get --json` and the HTTP API show it, written straight from
/// what it borrows: a large list is encoded without a copy of each instance or a
/// `serde_json::Value` per field (10,000 instances are 2.3 MB of JSON). Fields in
/// alphabetical order, as a `serde_json::Value` object writes them.
#[derive(Serialize)]
pub struct InstanceJson<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    address: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    instance: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lease_expires_at: Option<Rfc3339>,
    #[serde(skip_serializing_if = "Option::is_none")]
    meta: Option<Meta<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    node: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    registered_at: Option<Rfc3339>,
    #[serde(skip_serializing_if = "Option::is_none")]
    service: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<&'a str>,
}

/// The fields of an instance as JSON shows it, by name: what `?fields=` chooses from.
pub const INSTANCE_FIELDS: [&str; 9] = [
    "address",
    "instance",
    "lease_expires_at",
    "meta",
    "node",
    "note",
    "registered_at",
    "service",
    "status",
];

/// A choice among [`INSTANCE_FIELDS`] (`?fields=instance,address`): a bit for each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fields(u16);

impl Fields {
    /// Reads `instance,address,...`; the message names a field it does not know.
    pub fn parse(list: &str) -> Result<Fields, String> {
        let mut bits = 0;
        for name in list.split(',').map(str::trim) {
            let at = INSTANCE_FIELDS.iter().position(|f| *f == name).ok_or_else(|| {
                format!(
                    "no instance field {name:?} (fields is a comma-separated list of {})",
                    INSTANCE_FIELDS.join(", ")
                )
            })?;
            bits |= 1 << at;
        }
        Ok(Fields(bits))
    }

    fn has(self, name: &str) -> bool {
        INSTANCE_FIELDS
            .iter()
            .position(|f| *f == name)
            .is_some_and(|at| self.0 & (1 << at) != 0)
    }
}

impl<'a> InstanceJson<'a> {
    /// From an instance of the local replica.
    pub fn of(i: &'a roster::Instance) -> Self {
        Self {
            address: Some(&i.address),
            instance: Some(&i.id),
            lease_expires_at: Some(Rfc3339(wall_ms(i.lease_expires_at))),
            meta: Some(Meta::Map(&i.meta)),
            node: Some(&i.node),
            note: Some(&i.note),
            registered_at: Some(Rfc3339(wall_ms(i.registered_at))),
            service: Some(&i.service),
            status: Some(i.status_name()),
        }
    }

    /// From an instance as the client protocol carries it.
    pub fn of_view(i: &'a InstanceView) -> Self {
        Self {
            address: Some(&i.address),
            instance: Some(&i.instance),
            lease_expires_at: Some(Rfc3339(i.lease_expires_at_ms)),
            meta: Some(Meta::Pairs(&i.meta)),
            node: Some(&i.node),
            note: Some(&i.note),
            registered_at: Some(Rfc3339(i.registered_at_ms)),
            service: Some(&i.service),
            status: Some(&i.status),
        }
    }

    /// Only the fields `f` chooses; every field when `f` is `None`.
    #[must_use]
    pub fn only(mut self, f: Option<Fields>) -> Self {
        let Some(f) = f else { return self };
        fn keep<T>(f: Fields, name: &str, v: &mut Option<T>) {
            if !f.has(name) {
                *v = None;
            }
        }
        keep(f, "address", &mut self.address);
        keep(f, "instance", &mut self.instance);
        keep(f, "lease_expires_at", &mut self.lease_expires_at);
        keep(f, "meta", &mut self.meta);
        keep(f, "node", &mut self.node);
        keep(f, "note", &mut self.note);
        keep(f, "registered_at", &mut self.registered_at);
        keep(f, "service", &mut self.service);
        keep(f, "status", &mut self.status);
        self
    }
}

/// Metadata, written as a JSON object with its keys sorted (the last of a repeated key wins).
enum Meta<'a> {
    Map(&'a std::collections::BTreeMap<String, String>),
    Pairs(&'a [(String, String)]),
}

impl Serialize for Meta<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Map(m) => s.collect_map(m.iter()),
            Self::Pairs(p) => {
                let sorted: std::collections::BTreeMap<&str, &str> =
                    p.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                s.collect_map(sorted)
            }
        }
    }
}

/// Wall milliseconds, written as [`rfc3339`] gives them, without a `String` of their own.
struct Rfc3339(u64);

impl Serialize for Rfc3339 {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&humantime::format_rfc3339_millis(
            UNIX_EPOCH + Duration::from_millis(self.0),
        ))
    }
}

fn wall_ms(t: std::time::SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Instances as `roster get` prints them: a table, a row each.
pub fn instances(list: &[InstanceView]) {
    let rows = list
        .iter()
        .map(|i| {
            vec![
                i.instance.clone(),
                i.address.clone(),
                i.status.clone(),
                i.node.clone(),
                rfc3339(i.registered_at_ms),
                meta_line(&i.meta),
                i.note.clone(),
            ]
        })
        .collect();
    table(
        &[
            "INSTANCE",
            "ADDRESS",
            "STATUS",
            "NODE",
            "REGISTERED",
            "META",
            "NOTE",
        ],
        rows,
    );
}

/// `1.2s ago`.
pub fn ago(ms: u64) -> String {
    format!("{} ago", span(ms))
}

/// A span still to come, as `roster members` shows a lease: `in 12.4s`.
pub fn within(ms: u64) -> String {
    format!("in {}", span(ms))
}

/// `Nms` under a second, `N.Ns` under two minutes, then `Nm`.
fn span(ms: u64) -> String {
    if ms < 1_000 {
        format!("{ms}ms")
    } else if ms < 120_000 {
        format!("{:.1}s", ms as f64 / 1000.0)
    } else {
        format!("{}m", ms / 60_000)
    }
}

pub fn status(s: &StatusView) {
    let c = &s.counters;
    let mut out = vec![
        format!("node:            {} ({})", s.name, s.node),
        format!("address:         {}", s.address),
        format!("zone:            {}", s.zone),
        format!("version:         {}", s.version),
        format!(
            "uptime:          {}",
            humantime::format_duration(Duration::from_secs(s.uptime_ms / 1000))
        ),
        format!(
            "data dir:        {}",
            s.data_dir.as_deref().unwrap_or("(none: ephemeral)")
        ),
        format!(
            "registry:        {} services, {} instances",
            s.services, s.instances
        ),
        format!(
            "launches:        {} within the crash-guard window",
            s.launches_recent
        ),
        format!("crash guard:     {}", if s.crash_guard { "on" } else { "off" }),
        format!(
            "synced:          {}",
            if s.synced { "yes" } else { "no: no peer reached yet (check --join)" }
        ),
        match &s.store {
            None if s.data_dir.is_some() => "store:           ok".to_string(),
            None => "store:           (none)".to_string(),
            Some(h) => format!(
                "store:           DEGRADED: cannot be written since {} ({}); changes are refused; next try {}",
                humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_millis(h.since_ms)),
                h.last_error,
                humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_millis(h.next_retry_ms)),
            ),
        },
        format!("peers:           {}", s.peers.len()),
    ];
    for p in &s.peers {
        out.push(format!("  {} {} {} ({})", p.direction, p.name, p.address, p.node));
    }
    out.push(format!(
        "connections:     {} opened, {} accepted",
        c.connections_opened, c.connections_accepted
    ));
    out.push(format!(
        "sent:            {} frames, {} bytes",
        c.frames_sent, c.bytes_sent
    ));
    out.push(format!(
        "received:        {} frames, {} bytes",
        c.frames_received, c.bytes_received
    ));
    out.push(format!("deltas applied:  {}", c.deltas_applied));
    out.push(format!(
        "full syncs:      {} sent, {} received",
        c.full_syncs_sent, c.full_syncs_received
    ));
    out.push(format!(
        "refused:         {} states from peers; {} forgeries refuted, {} overwrites repaired",
        c.states_refused, c.forgeries_refuted, c.overwrites_repaired
    ));
    out.push(format!(
        "deaths:          {} peers written dead; {} times written dead and refuted",
        c.deaths_written, c.deaths_refuted
    ));
    out.push(format!(
        "clock:           {} times back from ahead of the peers' and own writes stamped again",
        c.clock_steps_back
    ));
    text_lines(&out);
}

pub fn explain(x: &ExplainView) {
    let mut out = vec![
        format!(
            "{} / {}: {}",
            x.service,
            x.instance,
            if x.live { "live" } else { "not live" }
        ),
        format!("winning write:   {}", x.winner.as_deref().unwrap_or("none")),
    ];
    for w in &x.writes {
        let who = if w.node_name.is_empty() {
            w.node.clone()
        } else {
            format!("{} ({})", w.node_name, w.node)
        };
        out.push(format!(
            "  write {} by {} at {} (+{}) -> {} under lease {}",
            w.dot,
            who,
            rfc3339(w.written_ms),
            w.written_logical,
            w.address,
            w.lease_dot
        ));
    }
    match &x.lease {
        Some((dot, issued, deadline)) => out.push(format!(
            "lease:           {dot}, renewed {}, ends {}",
            rfc3339(*issued),
            rfc3339(*deadline)
        )),
        None => out.push("lease:           none".to_string()),
    }
    if x.acknowledged_by.is_empty() {
        out.push("acknowledged by: no peer's last digest holds it yet".to_string());
    } else {
        out.push(format!("acknowledged by: {}", x.acknowledged_by.join(", ")));
    }
    text_lines(&out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_keeps_printable_text_and_escapes_control_and_invisible_characters() {
        assert!(matches!(escape("zone=eu-1a été 😀"), Cow::Borrowed(_)));
        assert_eq!(
            escape("a\nb\r\u{1b}[31mc\u{9b}d\u{202e}e\u{7f}"),
            "a\\nb\\r\\u{1b}[31mc\\u{9b}d\\u{202e}e\\u{7f}"
        );
    }

    #[test]
    fn an_instance_is_written_the_same_from_the_replica_and_from_the_protocol() {
        let i = roster::Instance {
            service: "web".into(),
            id: "web-1".into(),
            address: "10.0.0.1:80".into(),
            meta: [("zone".to_string(), "a\"b".to_string()), ("a".into(), "1".into())].into(),
            status: roster::registry::Health::Maintenance,
            note: "deploy 42".into(),
            node: "3b94983390832086".into(),
            registered_at: UNIX_EPOCH + Duration::from_millis(1_764_000_000_123),
            lease_expires_at: UNIX_EPOCH + Duration::from_millis(1_764_000_030_456),
            unreachable: false,
        };
        let direct = serde_json::to_string(&InstanceJson::of(&i)).unwrap();
        let via_value = serde_json::to_string(&instance_json(&i.view())).unwrap();
        assert_eq!(direct, via_value);
        let some = Fields::parse("status,instance").unwrap();
        assert_eq!(
            serde_json::to_string(&InstanceJson::of(&i).only(Some(some))).unwrap(),
            r#"{"instance":"web-1","status":"maintenance"}"#
        );
        assert!(Fields::parse("instance,lease").unwrap_err().contains("\"lease\""));
        assert_eq!(
            direct,
            r#"{"address":"10.0.0.1:80","instance":"web-1","lease_expires_at":"2025-11-24T16:00:30.456Z","meta":{"a":"1","zone":"a\"b"},"node":"3b94983390832086","note":"deploy 42","registered_at":"2025-11-24T16:00:00.123Z","service":"web","status":"maintenance"}"#
        );
    }
}
