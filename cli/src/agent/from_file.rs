//! Which of the agent's settings its config file gave, so that a refusal of one of them
//! names the file and the line to fix rather than only the flag.

use std::path::{Path, PathBuf};

use super::config::{key_line, FileConfig};
use super::AgentArgs;
use crate::Fail;

/// The config file's path and text, and the keys whose values the agent uses from it (no
/// flag or variable beat them).
#[derive(Debug, Default)]
pub struct FromFile {
    path: PathBuf,
    text: String,
    keys: Vec<&'static str>,
}

impl FromFile {
    /// `keys` lists each key with whether its value came from the file.
    pub fn new(path: &Path, text: String, keys: &[(&'static str, bool)]) -> Self {
        Self {
            path: path.to_path_buf(),
            text,
            keys: keys.iter().filter(|(_, used)| *used).map(|(k, _)| *k).collect(),
        }
    }

    /// The file's text (empty without one).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// `fail`, a refusal of the setting `key` (a flag's name without `--`), prefixed with
    /// `config file PATH, line N: ` when the file gave its value; as it is otherwise.
    pub fn name(&self, key: &str, fail: Fail) -> Fail {
        if !self.keys.contains(&key) {
            return fail;
        }
        Fail {
            message: format!(
                "config file {}, line {}: {}",
                self.path.display(),
                key_line(&self.text, key).unwrap_or(0),
                fail.message
            ),
            ..fail
        }
    }
}

/// Each key of the config file that a refusal can be about, and whether the agent uses the
/// file's value for it (no flag or `ROSTER_<FLAG>` variable gave one).
pub fn keys_used(args: &AgentArgs, file: &FileConfig) -> [(&'static str, bool); 18] {
    [
        ("listen", args.listen.is_none() && file.listen.is_some()),
        ("advertise", args.advertise.is_none() && file.advertise.is_some()),
        ("join", args.join.is_empty() && file.join.is_some()),
        (
            "cluster-secret-file",
            args.cluster_secret_file.is_none() && file.cluster_secret_file.is_some(),
        ),
        ("fanout", args.fanout.is_none() && file.fanout.is_some()),
        (
            "gossip-interval",
            args.gossip_interval.is_none() && file.gossip_interval.is_some(),
        ),
        ("lease-ttl", args.lease_ttl.is_none() && file.lease_ttl.is_some()),
        (
            "lease-per-member",
            args.lease_per_member.is_none() && file.lease_per_member.is_some(),
        ),
        (
            "max-clock-skew",
            args.max_clock_skew.is_none() && file.max_clock_skew.is_some(),
        ),
        (
            "http-listen",
            args.http_listen.is_none() && file.http_listen.is_some(),
        ),
        (
            "http-token-file",
            args.http_token_file.is_none() && file.http_token_file.is_some(),
        ),
        (
            "dns-listen",
            args.dns_listen.is_none() && file.dns_listen.is_some(),
        ),
        (
            "dns-domain",
            args.dns_domain.is_none() && file.dns_domain.is_some(),
        ),
        ("dns-ttl", args.dns_ttl.is_none() && file.dns_ttl.is_some()),
        ("zone", args.zone.is_none() && file.zone.is_some()),
        (
            "damping-share",
            args.damping_share.is_none() && file.damping_share.is_some(),
        ),
        (
            "damping-window",
            args.damping_window.is_none() && file.damping_window.is_some(),
        ),
        (
            "damping-bound",
            args.damping_bound.is_none() && file.damping_bound.is_some(),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exit::Exit;

    #[test]
    fn a_refusal_of_a_value_from_the_file_names_the_file_and_line_and_keeps_its_code() {
        let text = "# the agent\nlisten = \"127.0.0.1:0\"\ndns-ttl = \"2h\"\n".to_string();
        let file = FromFile::new(
            Path::new("/etc/roster.toml"),
            text,
            &[("dns-ttl", true), ("listen", false)],
        );
        let named = file.name("dns-ttl", Fail::usage("DNS TTL 2h is over 1h"));
        assert_eq!(
            named.message,
            "config file /etc/roster.toml, line 3: DNS TTL 2h is over 1h"
        );
        assert_eq!(named.code, Exit::Usage);
        // A flag set it: the file is not where to look.
        let busy = file.name("listen", Fail::failed("cannot listen on 127.0.0.1:1"));
        assert_eq!(busy.message, "cannot listen on 127.0.0.1:1");
        assert_eq!(busy.code, Exit::Failed);
    }
}
