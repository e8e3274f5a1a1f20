//! What a process did besides CPU: context switches (from `/proc`, summed over its
//! threads) and system calls (from `perf stat`, when it is installed and allowed).
//!
//! `/proc/<pid>/status` counts the switches of the main thread only, so the figures sum
//! `/proc/<pid>/task/*/status`; a thread that exits during the run takes its switches with
//! it (tokio's blocking threads live 10 s idle, longer than the gaps between saves).
//! `/proc/<pid>/io` counts only `read`/`write`-like calls (`syscr`, `syscw`), not `recv`,
//! `send`, `epoll_wait` or `futex`, so it is printed only when perf cannot count them all.

use std::process::{Child, Command, Stdio};

use crate::Error;

/// Context switches of every live thread of `pid`: voluntary (it waited) and not (it was
/// preempted).
pub fn context_switches(pid: u32) -> Result<(u64, u64), Error> {
    let mut total = (0, 0);
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        // A thread may exit between the listing and the read.
        let Ok(status) = std::fs::read_to_string(task?.path().join("status")) else {
            continue;
        };
        total.0 += field(&status, "voluntary_ctxt_switches:").unwrap_or(0);
        total.1 += field(&status, "nonvoluntary_ctxt_switches:").unwrap_or(0);
    }
    Ok(total)
}

/// `read`- and `write`-like system calls of `pid` (`syscr + syscw` of `/proc/<pid>/io`).
pub fn rw_syscalls(pid: u32) -> Result<u64, Error> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io"))?;
    Ok(field(&io, "syscr:").unwrap_or(0) + field(&io, "syscw:").unwrap_or(0))
}

fn field(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.trim().parse().ok())
}

/// `perf stat` counting the system calls of one process until it is stopped.
pub struct SyscallCount {
    child: Option<Child>,
}

impl SyscallCount {
    /// Attaches to `pid`; `None` when perf is missing or may not count it.
    pub fn start(pid: u32) -> Option<SyscallCount> {
        let child = Command::new("perf")
            .args([
                "stat",
                "-x,",
                "--no-big-num",
                "-e",
                "raw_syscalls:sys_enter",
                "-p",
            ])
            .arg(pid.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .ok()?;
        Some(SyscallCount { child: Some(child) })
    }

    /// Stops perf (SIGINT, so it prints its count) and reads the count.
    pub fn stop(mut self) -> Option<u64> {
        let child = self.child.take()?;
        let _ = Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status();
        let out = child.wait_with_output().ok()?;
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .find(|l| l.contains("raw_syscalls:sys_enter"))
            .and_then(|l| l.split(',').next())
            .and_then(|v| v.trim().parse().ok())
    }
}

impl Drop for SyscallCount {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
