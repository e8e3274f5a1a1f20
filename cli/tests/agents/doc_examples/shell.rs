//! The flow's shell: one bash process that runs the examples' commands one after the other,
//! so that what one sets (`export ROSTER_HTTP=...`) holds for the next, as in a terminal.

use std::io::{Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Ends a command's output; bash prints it, then the exit code, after each command.
const END: u8 = 0x1e;
/// The longest a foreground command of the docs may take.
pub const COMMAND_LIMIT: Duration = Duration::from_secs(30);

/// A running bash, killed (by pid) and reaped when dropped.
pub struct Shell {
    child: Child,
    stdin: ChildStdin,
    output: mpsc::Receiver<Vec<u8>>,
    pending: Vec<u8>,
}

impl Shell {
    /// Starts bash with `cmd`'s directory and environment; its stderr goes to its stdout,
    /// in the order written, as a terminal shows both.
    pub fn start(mut cmd: Command) -> Shell {
        cmd.args(["--noprofile", "--norc"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        let mut child = cmd.spawn().expect("bash runs");
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"exec 2>&1\n").unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let (tx, output) = mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n @ 1..) = stdout.read(&mut buf) {
                if tx.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        Shell {
            child,
            stdin,
            output,
            pending: Vec::new(),
        }
    }

    /// Runs `command` (stdin empty) and returns what it printed and its exit code, or an
    /// error if it did not finish within [`COMMAND_LIMIT`].
    pub fn run(&mut self, command: &str) -> Result<(String, i32), String> {
        let script = format!("{{ {command}\n}} </dev/null\nprintf '\\036%d\\n' $?\n");
        self.stdin
            .write_all(script.as_bytes())
            .map_err(|e| format!("the shell is gone: {e}"))?;
        let deadline = Instant::now() + COMMAND_LIMIT;
        loop {
            if let Some(end) = self.pending.iter().position(|b| *b == END) {
                if let Some(nl) = self.pending[end..].iter().position(|b| *b == b'\n') {
                    let rest = self.pending.split_off(end + nl + 1);
                    let done = std::mem::replace(&mut self.pending, rest);
                    let out = String::from_utf8_lossy(&done[..end]).into_owned();
                    let code = String::from_utf8_lossy(&done[end + 1..end + nl])
                        .parse()
                        .unwrap_or(-1);
                    return Ok((out, code));
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.output.recv_timeout(left) {
                Ok(bytes) => self.pending.extend(bytes),
                Err(_) => {
                    return Err(format!(
                        "did not finish within {COMMAND_LIMIT:?}; it printed: {}",
                        String::from_utf8_lossy(&self.pending)
                    ))
                }
            }
        }
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
