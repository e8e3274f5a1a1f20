//! The agent's config file: a TOML file whose keys are the flags' names.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::{parse_duration, Fail};

/// The config file: the flags' names as keys.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileConfig {
    pub listen: Option<String>,
    pub advertise: Option<String>,
    pub join: Option<Vec<String>>,
    pub data_dir: Option<PathBuf>,
    pub cluster_secret_file: Option<PathBuf>,
    pub node_name: Option<String>,
    pub zone: Option<String>,
    pub damping_share: Option<u8>,
    pub damping_window: Option<String>,
    pub damping_bound: Option<String>,
    pub serve_unreachable: Option<bool>,
    pub fanout: Option<usize>,
    pub gossip_interval: Option<String>,
    pub lease_ttl: Option<String>,
    pub lease_per_member: Option<String>,
    pub sync_min_interval: Option<String>,
    pub max_clock_skew: Option<String>,
    pub cluster: Option<String>,
    pub crash_guard: Option<String>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub tls_ca: Option<PathBuf>,
    pub leave_on_terminate: Option<bool>,
    pub enable_exec_checks: Option<bool>,
    pub http_listen: Option<String>,
    pub http_token_file: Option<PathBuf>,
    pub http_require_token: Option<bool>,
    pub dns_listen: Option<String>,
    pub dns_domain: Option<String>,
    pub dns_ttl: Option<String>,
}

/// The largest config file read.
const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

pub fn read_config(path: &Path) -> Result<(FileConfig, String), Fail> {
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| {
        Fail::usage(format!(
            "cannot read config file {shown}: {e}; check the --config path"
        ))
    })?;
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(Fail::usage(format!(
            "config file {shown} has {} bytes, over the limit of {MAX_CONFIG_BYTES}; is it the right file?",
            meta.len()
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|e| {
        Fail::usage(format!(
            "cannot read config file {shown}: {e}; check the --config path"
        ))
    })?;
    parse(&shown.to_string(), &text).map(|config| (config, text))
}

/// The keys whose values are durations (strings such as "30s").
const DURATION_KEYS: [&str; 6] = [
    "gossip-interval",
    "lease-ttl",
    "lease-per-member",
    "sync-min-interval",
    "max-clock-skew",
    "dns-ttl",
];

/// The config file's text, read; `shown` names the file in errors.
fn parse(shown: &str, text: &str) -> Result<FileConfig, Fail> {
    toml::from_str(text).map_err(|e| {
        let what = e.message().lines().next().unwrap_or("invalid TOML").trim();
        let at = line_of(text, e.span().map_or(0, |s| s.start));
        Fail::usage(format!("config file {shown}, {}", explain(text, what, at)))
    })
}

/// `line N: what is wrong; what to write instead`, for a TOML or type error `what` at `line`.
fn explain(text: &str, what: &str, line: usize) -> String {
    if let Some(rest) = what.strip_prefix("unknown field `") {
        let key = rest.split('`').next().unwrap_or_default();
        // An unknown key's span is its table; point at the key itself.
        let line = key_line(text, key).unwrap_or(line);
        let keys: Vec<&str> = rest.split('`').skip(2).step_by(2).collect();
        return match nearest(key, &keys) {
            Some(near) => format!("line {line}: unknown key `{key}`; did you mean `{near}`?"),
            None => format!(
                "line {line}: unknown key `{key}`; keys are the agent's flag names without the \
                 leading -- (listen, join, data-dir, ...: see `roster agent --help`)"
            ),
        };
    }
    let Some(key) = key_at(text, line) else {
        return format!("line {line}: {what}");
    };
    let number = what
        .strip_prefix("invalid type: integer `")
        .or_else(|| what.strip_prefix("invalid type: floating point `"))
        .and_then(|r| r.split('`').next());
    match number {
        Some(n) if DURATION_KEYS.contains(&key) => {
            format!("line {line}: {key}: {what}; a duration is a string with a unit: write {key} = \"{n}s\"")
        }
        _ => format!("line {line}: {key}: {what}"),
    }
}

/// The key set on `line` (1-based), if that line is `key = ...`.
fn key_at(text: &str, line: usize) -> Option<&str> {
    let l = text.lines().nth(line.checked_sub(1)?)?;
    let (key, _) = l.split_once('=')?;
    let key = key.trim();
    (!key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'))
    .then_some(key)
}

/// The key of `keys` nearest to the misspelt `key`, if one is near enough to be meant: an
/// edit distance of at most a third of its length (and at least 1, at most 3).
fn nearest<'k>(key: &str, keys: &[&'k str]) -> Option<&'k str> {
    let most = (key.chars().count() / 3).clamp(1, 3);
    keys.iter()
        .map(|k| (strsim::levenshtein(key, k), *k))
        .filter(|(d, _)| *d <= most)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// The 1-based line of byte offset `at`.
fn line_of(text: &str, at: usize) -> usize {
    text.as_bytes()[..at.min(text.len())]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

/// The 1-based line where `key` is set (`key =` at the start of a line).
pub fn key_line(text: &str, key: &str) -> Option<usize> {
    text.lines()
        .position(|l| {
            l.trim_start()
                .strip_prefix(key)
                .is_some_and(|rest| rest.trim_start().starts_with('='))
        })
        .map(|i| i + 1)
}

pub fn file_duration(
    path: &Path,
    text: &str,
    key: &str,
    v: Option<String>,
) -> Result<Option<Duration>, Fail> {
    v.map(|s| {
        parse_duration(&s).map_err(|e| {
            let line = key_line(text, key).unwrap_or(0);
            Fail::usage(format!("config file {}, line {line}: {key}: {e}", path.display()))
        })
    })
    .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(text: &str) -> String {
        match parse("roster.toml", text) {
            Ok(c) => panic!("taken: {c:?}"),
            Err(f) => f.message,
        }
    }

    #[test]
    fn a_duration_written_as_a_number_is_told_to_be_a_string_with_a_unit() {
        let m = refusal("listen = \"127.0.0.1:0\"\nlease-ttl = 30\n");
        assert!(
            m.starts_with("config file roster.toml, line 2: lease-ttl: "),
            "{m}"
        );
        assert!(m.ends_with("write lease-ttl = \"30s\""), "{m}");
    }

    #[test]
    fn a_misspelt_key_gets_a_did_you_mean_and_a_strange_one_the_rule() {
        let m = refusal("# a comment\ngossip-intervall = \"1s\"\n");
        assert_eq!(
            m,
            "config file roster.toml, line 2: unknown key `gossip-intervall`; did you mean `gossip-interval`?"
        );
        let m = refusal("colour = \"red\"\n");
        assert!(
            m.contains("unknown key `colour`; keys are the agent's flag names"),
            "{m}"
        );
    }

    #[test]
    fn a_toml_syntax_error_says_what_and_where_and_nothing_else() {
        let m = refusal("fanout = 3\nlisten = \"127.0.0.1:0\n");
        assert!(m.starts_with("config file roster.toml, line 2: "), "{m}");
        assert!(!m.contains("flag names"), "no unrelated suffix: {m}");
    }

    #[test]
    fn the_references_example_file_parses_and_sets_every_key() {
        let doc = include_str!("../../../docs/reference/cli.md");
        let section = doc.split("### Config file").nth(1).unwrap();
        let example = section
            .split("```toml\n")
            .nth(1)
            .and_then(|b| b.split("```").next())
            .unwrap();
        parse("cli.md", example).unwrap_or_else(|f| panic!("{}", f.message));
        // Every key the file takes, as serde lists them for an unknown one.
        let unknown = toml::from_str::<FileConfig>("zzz-not-a-key = 1\n").unwrap_err();
        let every = unknown
            .message()
            .split("expected one of ")
            .nth(1)
            .unwrap()
            .to_string();
        let keys: Vec<&str> = every.split('`').skip(1).step_by(2).collect();
        assert!(keys.len() > 20, "{every}");
        let listed: Vec<&str> = example.lines().filter_map(|l| l.split(" = ").next()).collect();
        for key in keys {
            assert!(listed.contains(&key), "the example of cli.md sets no {key}");
        }
    }

    #[test]
    fn only_a_near_key_is_suggested() {
        assert_eq!(nearest("lisen", &["listen", "join"]), Some("listen"));
        assert_eq!(nearest("fanuot", &["fanout", "join"]), Some("fanout"));
        assert_eq!(nearest("zzz", &["listen", "join"]), None);
    }
}
