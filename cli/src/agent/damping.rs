//! The damping's settings (`--damping-share`, `--damping-window`, `--damping-bound`,
//! `--serve-unreachable`), flags over the config file, checked.

use std::time::Duration;

use super::config::FileConfig;
use super::from_file::FromFile;
use super::AgentArgs;
use crate::Fail;

/// A duration from its flag or, without one, from its config file key.
pub type DurationSetting<'a> =
    dyn Fn(Option<Duration>, &str, Option<String>) -> Result<Option<Duration>, Fail> + 'a;

/// The damping's settings, flags over the config file, checked: the window within the
/// bound, the bound at most a day.
pub fn damping(
    args: &AgentArgs,
    file: &FileConfig,
    duration: &DurationSetting<'_>,
    from_file: &FromFile,
) -> Result<roster::Damping, Fail> {
    let d = roster::Damping::default();
    let share = match (args.damping_share, file.damping_share) {
        (Some(s), _) => s,
        (None, Some(s)) if s <= 100 => s,
        (None, Some(s)) => {
            return Err(from_file.name(
                "damping-share",
                Fail::usage(format!(
                    "damping-share {s} is not a percentage: give 0 to 100 (100 never damps)"
                )),
            ))
        }
        (None, None) => d.share_pct,
    };
    let window =
        duration(args.damping_window, "damping-window", file.damping_window.clone())?.unwrap_or(d.window);
    let bound = duration(args.damping_bound, "damping-bound", file.damping_bound.clone())?.unwrap_or(d.bound);
    if window.is_zero() || window > bound || bound > Duration::from_secs(24 * 3600) {
        return Err(Fail::usage(format!(
            "--damping-window {} and --damping-bound {} do not fit: give a window above 0 and at most the bound, and a bound of at most 24h",
            humantime::format_duration(window),
            humantime::format_duration(bound)
        )));
    }
    Ok(roster::Damping {
        share_pct: share,
        window,
        bound,
        serve_unreachable: args.serve_unreachable || file.serve_unreachable.unwrap_or(false),
    })
}
