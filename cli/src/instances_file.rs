//! `roster register --from-file`: a file of JSON lines, one instance a line, read and
//! checked whole before anything is sent, then cut into batches the agent takes.
//!
//! A line holds the fields of `roster register`'s arguments:
//! `{"service": "web", "address": "10.0.0.7:8080", "id": "web-1", "meta": {"zone": "a"},
//! "ttl": "30s", "checks": [{"http": "http://10.0.0.7:8080/health", "interval": "5s"}]}`;
//! `service` and `address` are required. Blank lines are skipped. A check names one of
//! `http`, `tcp`, `exec` or `ttl`, and optionally `interval`, `timeout`, `failures`,
//! `successes` and `deregister_critical_after`, as the `--check-*` flags do.

use std::collections::BTreeMap;
use std::path::Path;

use roster::api::{self, RegisterItem, MAX_BATCH_REQUEST_BYTES};
use roster::registry::{metadata_from_pairs, Endpoint, ProviderId, ServiceName};
use serde::Deserialize;

use crate::Fail;

/// The most lines a file may hold (ten full batches).
pub const MAX_FILE_LINES: usize = 10 * roster::MAX_BATCH_ITEMS;
/// Room in a batch request for its envelope (version byte, tags, the item count).
const BATCH_OVERHEAD_BYTES: usize = 64;

/// One line as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLine {
    service: String,
    address: String,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    meta: BTreeMap<String, String>,
    #[serde(default)]
    ttl: Option<String>,
    #[serde(default)]
    checks: Vec<RawCheck>,
}

/// One check of a line (or of an HTTP registration's body), with the names of the
/// `--check-*` flags.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCheck {
    http: Option<String>,
    tcp: Option<String>,
    exec: Option<String>,
    ttl: Option<String>,
    interval: Option<String>,
    timeout: Option<String>,
    failures: Option<u32>,
    successes: Option<u32>,
    deregister_critical_after: Option<String>,
}

impl RawCheck {
    /// The check, checked as the flags are.
    pub fn check(self) -> Result<roster::check::Check, String> {
        let kinds = [&self.http, &self.tcp, &self.exec, &self.ttl];
        if kinds.iter().filter(|k| k.is_some()).count() != 1 {
            return Err("a check names exactly one of \"http\", \"tcp\", \"exec\" or \"ttl\"".to_string());
        }
        let duration = |name: &str, v: &Option<String>| {
            v.as_deref()
                .map(|t| crate::parse_duration(t).map_err(|e| format!("check {name} {t:?}: {e}")))
                .transpose()
        };
        let args = crate::check_args::CheckArgs {
            check_http: self.http.into_iter().collect(),
            check_tcp: self.tcp.into_iter().collect(),
            check_exec: self.exec.into_iter().collect(),
            check_ttl: duration("ttl", &self.ttl)?,
            check_interval: duration("interval", &self.interval)?,
            check_timeout: duration("timeout", &self.timeout)?,
            check_failures: self.failures.unwrap_or(roster::check::DEFAULT_FAILURES),
            check_successes: self.successes.unwrap_or(roster::check::DEFAULT_SUCCESSES),
            deregister_critical_after: duration(
                "deregister_critical_after",
                &self.deregister_critical_after,
            )?,
        };
        let mut checks = args.checks()?;
        checks
            .pop()
            .ok_or_else(|| "a check with nothing to check".to_string())
    }
}

/// A checked line: its number in the file (from 1) and the instance it registers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// The line number, from 1.
    pub number: usize,
    /// The instance.
    pub item: RegisterItem,
}

/// Reads `path` (`-`: stdin) and checks every line.
///
/// # Errors
/// [`Fail::usage`] naming the file and the line, for the first bad one; nothing is sent.
pub fn read(path: &Path) -> Result<Vec<Line>, Fail> {
    let stdin = path.as_os_str() == "-";
    let name = if stdin {
        "stdin".to_string()
    } else {
        path.display().to_string()
    };
    let text = if stdin {
        std::io::read_to_string(std::io::stdin())
    } else {
        std::fs::read_to_string(path)
    }
    .map_err(|e| Fail::usage(format!("cannot read {name}: {e}")))?;
    parse(&name, &text)
}

/// Checks every line of `text`, read from the file `name`.
///
/// # Errors
/// [`Fail::usage`] naming the file and the line, for the first bad one.
pub fn parse(name: &str, text: &str) -> Result<Vec<Line>, Fail> {
    let mut lines = Vec::new();
    let mut ids: BTreeMap<(String, String), usize> = BTreeMap::new();
    for (i, raw) in text.lines().enumerate() {
        let number = i + 1;
        if raw.trim().is_empty() {
            continue;
        }
        if lines.len() == MAX_FILE_LINES {
            return Err(Fail::usage(format!(
                "{name} line {number}: more than {MAX_FILE_LINES} instances; split the file"
            )));
        }
        let at = |why: String| Fail::usage(format!("{name} line {number}: {why}"));
        let item = check(raw).map_err(at)?;
        if let Some(id) = &item.instance {
            if let Some(first) = ids.insert((item.service.clone(), id.clone()), number) {
                return Err(at(format!(
                    "instance {id} of {} is also on line {first}; give each instance its own id",
                    item.service
                )));
            }
        }
        lines.push(Line { number, item });
    }
    if lines.is_empty() {
        return Err(Fail::usage(format!(
            "{name} holds no instance; write one JSON object a line, such as \
             {{\"service\": \"web\", \"address\": \"10.0.0.7:8080\", \"id\": \"web-1\"}}"
        )));
    }
    Ok(lines)
}

/// One line, checked as `roster register` checks its arguments.
fn check(raw: &str) -> Result<RegisterItem, String> {
    let line: RawLine = serde_json::from_str(raw).map_err(|e| {
        format!(
            "{e}; write one JSON object a line with \"service\" and \"address\", and optionally \
             \"id\", \"meta\" (an object of strings), \"ttl\" (such as \"30s\") and \"checks\""
        )
    })?;
    ServiceName::new(&line.service).map_err(|e| e.to_string())?;
    Endpoint::parse(&line.address).map_err(|e| e.to_string())?;
    let meta: Vec<(String, String)> = line.meta.into_iter().collect();
    metadata_from_pairs(&meta).map_err(|e| e.to_string())?;
    if let Some(id) = &line.id {
        ProviderId::new(id).map_err(|e| e.to_string())?;
    }
    let ttl_ms = match &line.ttl {
        Some(t) => {
            let d = crate::parse_duration(t).map_err(|e| format!("ttl {t:?}: {e}"))?;
            roster::check_ttl(d)?;
            Some(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        }
        None => None,
    };
    if line.checks.len() > roster::check::MAX_CHECKS {
        return Err(format!(
            "{} checks, more than the {} one registration may have",
            line.checks.len(),
            roster::check::MAX_CHECKS
        ));
    }
    let checks = line
        .checks
        .into_iter()
        .map(RawCheck::check)
        .collect::<Result<_, _>>()?;
    Ok(RegisterItem {
        service: line.service,
        address: line.address,
        meta,
        instance: line.id,
        ttl_ms,
        checks,
    })
}

/// Cuts checked lines into batches of at most [`roster::MAX_BATCH_ITEMS`] items and
/// [`MAX_BATCH_REQUEST_BYTES`] encoded bytes, in file order.
pub fn batches(lines: &[Line]) -> Vec<&[Line]> {
    let budget = MAX_BATCH_REQUEST_BYTES - BATCH_OVERHEAD_BYTES;
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, l) in lines.iter().enumerate() {
        let size = api::encode(&l.item).len();
        if i > start && (i - start == roster::MAX_BATCH_ITEMS || bytes + size > budget) {
            out.push(&lines[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += size;
    }
    if start < lines.len() {
        out.push(&lines[start..]);
    }
    out
}

/// An agent's error about a batch, with its item named by its line in the file.
pub fn locate(name: &str, batch: &[Line], message: &str) -> String {
    match api::item_error(message) {
        Some((i, why)) => match batch.get(i) {
            Some(l) => format!("{name} line {}: {}", l.number, name_lines(batch, why)),
            None => message.to_string(),
        },
        None => message.to_string(),
    }
}

/// Rewrites `also item J` (the agent's words for a repeated id) as the line it is on.
fn name_lines(batch: &[Line], why: &str) -> String {
    let Some((head, tail)) = why.split_once("is also item ") else {
        return why.to_string();
    };
    let digits: String = tail.chars().take_while(char::is_ascii_digit).collect();
    match digits.parse::<usize>().ok().and_then(|j| batch.get(j)) {
        Some(l) => format!("{head}is also on line {}{}", l.number, &tail[digits.len()..]),
        None => why.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str =
        r#"{"service": "web", "address": "10.0.0.1:80", "id": "w1", "meta": {"zone": "a"}, "ttl": "30s"}"#;

    fn line(n: usize) -> String {
        format!(
            r#"{{"service": "web", "address": "10.0.0.1:{}", "id": "w{n}"}}"#,
            1000 + n
        )
    }

    fn error(text: &str) -> String {
        parse("deploy.jsonl", text).unwrap_err().message
    }

    #[test]
    fn every_field_of_register_is_read_from_a_line() {
        let lines = parse("f", &format!("{GOOD}\n\n{}\n", line(2))).unwrap();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].number, 1);
        assert_eq!(lines[1].number, 3, "a blank line still counts");
        let item = &lines[0].item;
        assert_eq!(item.service, "web");
        assert_eq!(item.address, "10.0.0.1:80");
        assert_eq!(item.instance.as_deref(), Some("w1"));
        assert_eq!(item.meta, vec![("zone".to_string(), "a".to_string())]);
        assert_eq!(item.ttl_ms, Some(30_000));
        assert_eq!(lines[1].item.ttl_ms, None);
    }

    #[test]
    fn a_bad_line_is_named_by_file_and_number_with_what_to_fix() {
        let text = format!("{}\n{}\nnot json\n", line(1), line(2));
        let e = error(&text);
        assert!(e.starts_with("deploy.jsonl line 3: "), "{e}");
        assert!(e.contains("\"service\" and \"address\""), "{e}");
        let e = error(&format!(
            "{}\n{{\"service\": \"Web!\", \"address\": \"h:1\"}}",
            line(1)
        ));
        assert!(e.starts_with("deploy.jsonl line 2: invalid service name"), "{e}");
        let e = error(r#"{"service": "web", "address": "no-port"}"#);
        assert!(e.starts_with("deploy.jsonl line 1: invalid address"), "{e}");
        let e = error(r#"{"service": "web", "address": "h:1", "ttl": "100ms"}"#);
        assert!(e.contains("line 1: ttl") && e.contains("at least 1s"), "{e}");
        let e = error(r#"{"service": "web", "address": "h:1", "adress": "h:2"}"#);
        assert!(e.contains("line 1: unknown field `adress`"), "{e}");
        let e = error(r#"{"service": "web"}"#);
        assert!(e.contains("line 1: missing field `address`"), "{e}");
    }

    #[test]
    fn checks_are_read_from_a_line_and_checked_as_the_flags_are() {
        let lines = parse(
            "f",
            r#"{"service": "web", "address": "h:1", "checks": [{"http": "http://h:1/health", "interval": "5s", "failures": 2}, {"ttl": "30s"}]}"#,
        )
        .unwrap();
        let checks = &lines[0].item.checks;
        assert_eq!(checks.len(), 2);
        assert_eq!(
            checks[0].probe,
            roster::check::Probe::Http("http://h:1/health".into())
        );
        assert_eq!(
            (checks[0].interval_ms, checks[0].timeout_ms, checks[0].failures),
            (5_000, 2_500, 2)
        );
        assert_eq!((checks[1].probe.kind(), checks[1].interval_ms), ("ttl", 30_000));
        for (check, needle) in [
            (r#"{"http": "notaurl"}"#, "is not an http URL"),
            (r#"{"tcp": "h:1", "http": "http://h/"}"#, "exactly one of"),
            (r#"{"interval": "5s"}"#, "exactly one of"),
            (r#"{"tcp": "h:1", "interval": "10ms"}"#, "use 1s to 24h"),
            (r#"{"tcp": "h:1", "every": "1s"}"#, "unknown field `every`"),
        ] {
            let e = error(&format!(
                r#"{{"service": "web", "address": "h:1", "checks": [{check}]}}"#
            ));
            assert!(
                e.starts_with("deploy.jsonl line 1: ") && e.contains(needle),
                "{check}: {e}"
            );
        }
    }

    #[test]
    fn an_instance_given_twice_names_both_lines() {
        let e = error(&format!("{}\n{}\n{}", line(1), line(2), line(1)));
        assert!(
            e.starts_with("deploy.jsonl line 3: instance w1 of web is also on line 1"),
            "{e}"
        );
    }

    #[test]
    fn an_empty_file_is_refused_with_an_example() {
        assert!(error("\n\n").contains("holds no instance"));
    }

    #[test]
    fn batches_keep_file_order_and_hold_at_most_the_limit() {
        let n = roster::MAX_BATCH_ITEMS + 5;
        let text: Vec<String> = (0..n).map(line).collect();
        let lines = parse("f", &text.join("\n")).unwrap();
        let cut = batches(&lines);
        assert_eq!(cut.len(), 2);
        assert_eq!(cut[0].len(), roster::MAX_BATCH_ITEMS);
        assert_eq!(cut[1][0].number, roster::MAX_BATCH_ITEMS + 1);
    }

    #[test]
    fn batches_of_large_items_stay_under_the_frame_an_agent_reads() {
        let meta: String = (0..30)
            .map(|i| format!(r#""k{i}": "{}""#, "v".repeat(120)))
            .collect::<Vec<_>>()
            .join(",");
        let text: Vec<String> = (0..1000)
            .map(|n| format!(r#"{{"service": "web", "address": "h:1", "id": "w{n}", "meta": {{{meta}}}}}"#))
            .collect();
        let lines = parse("f", &text.join("\n")).unwrap();
        let cut = batches(&lines);
        assert!(cut.len() > 1);
        for b in cut {
            let items: Vec<RegisterItem> = b.iter().map(|l| l.item.clone()).collect();
            let req = api::ClientMessage::Request(api::Request::RegisterMany { items });
            assert!(api::encode(&req).len() <= MAX_BATCH_REQUEST_BYTES);
        }
    }

    #[test]
    fn an_agents_error_about_an_item_names_its_line() {
        let lines = parse("f", &format!("\n{}\n{}\n{}", line(1), line(2), line(3))).unwrap();
        let m = locate(
            "f",
            &lines,
            "item 2: instance w3 of web is also item 0; give each its own id",
        );
        assert_eq!(
            m,
            "f line 4: instance w3 of web is also on line 2; give each its own id"
        );
        assert_eq!(
            locate("f", &lines, "the node has stopped"),
            "the node has stopped"
        );
    }
}
