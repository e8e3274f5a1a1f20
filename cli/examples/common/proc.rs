//! What the examples that run real agents read of a process, and where they find
//! `roster`. Included by each with `#[path]`; each uses part of it.

#![allow(dead_code)] // each example uses part of it

use std::path::{Path, PathBuf};
use std::process::Command;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The `roster` release binary, beside the directory of this example's binary.
pub fn roster_binary() -> Result<PathBuf, Error> {
    let exe = std::env::current_exe()?;
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("roster"))
        .filter(|p| p.is_file());
    bin.ok_or_else(|| {
        "no roster binary beside this example; run `cargo build --release -p roster-cli` first".into()
    })
}

/// The CPU time (user and system) a process has used, in seconds, at `ticks_per_s`
/// clock ticks a second.
pub fn cpu_seconds(pid: u32, ticks_per_s: f64) -> Result<f64, Error> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name, in parentheses, may hold spaces: count fields after it.
    let rest = stat.rsplit_once(')').ok_or("a malformed /proc stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks =
        |i: usize| -> Result<f64, Error> { Ok(fields.get(i).ok_or("a short /proc stat")?.parse::<f64>()?) };
    // Fields 14 and 15 of stat(5) (utime, stime); the state, field 3, is index 0 here.
    Ok((ticks(11)? + ticks(12)?) / ticks_per_s)
}

/// `VmRSS` and `VmHWM` of a process, in KiB.
pub fn memory_kib(pid: u32) -> Result<(u64, u64), Error> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .ok_or_else(|| format!("no {name} in /proc/{pid}/status"))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 if that fails), asked once.
pub fn ticks_per_second() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// Resolves when the example is interrupted (Ctrl-C) or terminated (SIGTERM): a `main`
/// that selects on it drops its run, and with it every process it started.
pub async fn stopped() -> std::io::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r,
        _ = term.recv() => Ok(()),
    }
}
