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
    toml::from_str(&text).map_err(|e| {
        let what = e.message().lines().next().unwrap_or("invalid TOML").trim().to_string();
        // An unknown key's span is its table; point at the key itself.
        let line = what
            .strip_prefix("unknown field `")
            .and_then(|r| r.split('`').next())
            .and_then(|k| key_line(&text, k))
            .unwrap_or_else(|| line_of(&text, e.span().map_or(0, |s| s.start)));
        Fail::usage(format!(
            "config file {shown}, line {line}: {what}; keys are the agent's flag names (listen, join, data-dir, ...)"
        ))
    })
    .map(|config| (config, text))
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
