//! One flow: a directory, a shell and the processes of the "other terminals", through which
//! the docs' steps run in order, each file going on from the state the one before left.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use snapbox::{Assert, Data, Redactions};

use super::markdown::{self, Example, Step};
use super::redact::{self, Ports};
use super::same::Same;
use super::shell::Shell;

/// How long a process of the flow may take to print the lines the doc shows, or to exit.
const PROCESS_LIMIT: Duration = Duration::from_secs(20);
/// How long an `eventually` block is run again until it matches.
const EVENTUALLY_LIMIT: Duration = Duration::from_secs(30);

/// A process of the flow (an agent, a watch), killed and reaped when dropped.
struct Process {
    child: Child,
    lines: mpsc::Receiver<String>,
    log: PathBuf,
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The state of one flow through the docs.
pub struct Flow {
    root: tempfile::TempDir,
    ports: Ports,
    shell: Shell,
    processes: BTreeMap<String, Process>,
    redactions: Redactions,
    failures: Vec<String>,
    /// The ids and times the doc showed, and what they stood for.
    same: Same,
    /// Outputs compared so far.
    compared: usize,
}

impl Flow {
    /// A fresh directory (the flow's working directory, and its `HOME`), free ports for
    /// the documented ones, and a shell.
    pub fn new() -> Flow {
        let root = tempfile::tempdir().unwrap();
        for dir in ["home", "work/target/release", "bin"] {
            std::fs::create_dir_all(root.path().join(dir)).unwrap();
        }
        // The README's `./target/release/roster` and `cargo run --release -p roster-cli --`
        // are the binary under test.
        std::os::unix::fs::symlink(crate::BIN, root.path().join("work/target/release/roster")).unwrap();
        let cargo = "#!/bin/sh\n[ \"$1 $2 $3 $4 $5\" = 'run --release -p roster-cli --' ] || { echo \"doc-test: only cargo run --release -p roster-cli -- runs here\" >&2; exit 127; }\nshift 5\nexec roster \"$@\"\n";
        let shim = root.path().join("bin/cargo");
        std::fs::write(&shim, cargo).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).unwrap();
        let ports = Ports::free();
        let shell = Shell::start(command("bash", root.path(), &ports));
        Flow {
            root,
            ports,
            shell,
            processes: BTreeMap::new(),
            redactions: redact::redactions(),
            failures: Vec::new(),
            same: Same::new(),
            compared: 0,
        }
    }

    /// Runs the steps of `file` (relative to the repository).
    pub fn file(&mut self, file: &str) {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(file);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
        for step in markdown::steps(file, &text) {
            if let Err(e) = self.step(file, step) {
                self.failures.push(e);
            }
        }
    }

    /// Panics with every disagreement found, each naming its file and line; else returns
    /// how many outputs were compared.
    pub fn finish(self) -> usize {
        assert!(
            self.failures.is_empty(),
            "{} doc example(s) disagree with the binary:\n\n{}",
            self.failures.len(),
            self.failures.join("\n")
        );
        self.compared
    }

    fn step(&mut self, file: &str, step: Step) -> Result<(), String> {
        match step {
            Step::Run(examples) => examples.iter().try_for_each(|ex| self.run(file, ex)),
            Step::Eventually(examples) => self.eventually(file, &examples),
            Step::Background { name, example } => self.background(file, &name, &example),
            Step::Output { name, line, expected } => {
                let lines = self.lines_of(file, line, &name, expected.lines().count())?;
                self.compare(
                    &format!("{file}:{line}: what `{name}` printed"),
                    &lines,
                    &expected,
                )
            }
            Step::File { path, content } => {
                std::fs::write(self.root.path().join("work").join(path), content).map_err(|e| e.to_string())
            }
            Step::Interrupt { name, line } => self.interrupt(file, line, &name),
            Step::Kill { name, line } => {
                let mut p = self.take(file, line, &name)?;
                p.child.kill().map_err(|e| e.to_string())?;
                p.child.wait().map(drop).map_err(|e| e.to_string())
            }
            Step::Exits { name, line } => {
                let mut p = self.take(file, line, &name)?;
                wait_exit(&mut p)
                    .map(drop)
                    .map_err(|e| format!("{file}:{line}: `{name}` {e}"))
            }
        }
    }

    /// Runs one command in the shell and compares its output with the doc's.
    fn run(&mut self, file: &str, ex: &Example) -> Result<(), String> {
        let label = format!("{file}:{}: `$ {}`", ex.line, ex.command);
        let (out, _code) = self
            .shell
            .run(&self.ports.to_real(&ex.command))
            .map_err(|e| format!("{label} {e}"))?;
        self.compare(&label, &out, &ex.expected)
    }

    fn eventually(&mut self, file: &str, examples: &[Example]) -> Result<(), String> {
        let deadline = Instant::now() + EVENTUALLY_LIMIT;
        loop {
            let last = examples.iter().try_for_each(|ex| self.run(file, ex));
            if last.is_ok() || Instant::now() > deadline {
                return last.map_err(|e| format!("{e}(not within {EVENTUALLY_LIMIT:?})\n"));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    fn background(&mut self, file: &str, name: &str, ex: &Example) -> Result<(), String> {
        if self.processes.contains_key(name) {
            return Err(format!("{file}:{}: `{name}` is already running", ex.line));
        }
        let log = self.root.path().join(format!("{name}.log"));
        let mut cmd = command("bash", self.root.path(), &self.ports);
        cmd.arg("-c")
            .arg(format!("exec {}", self.ports.to_real(&ex.command)));
        cmd.stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap());
        let mut child = cmd.spawn().map_err(|e| e.to_string())?;
        let lines = crate::lines_of(child.stdout.take().unwrap());
        self.processes
            .insert(name.to_string(), Process { child, lines, log });
        let got = self.lines_of(file, ex.line, name, ex.expected.lines().count())?;
        self.compare(
            &format!("{file}:{}: `$ {}`", ex.line, ex.command),
            &got,
            &ex.expected,
        )
    }

    /// The next `n` lines the process `name` prints.
    fn lines_of(&mut self, file: &str, line: usize, name: &str, n: usize) -> Result<String, String> {
        let p = self
            .processes
            .get_mut(name)
            .ok_or(format!("{file}:{line}: no process `{name}` runs here"))?;
        let deadline = Instant::now() + PROCESS_LIMIT;
        let mut got = String::new();
        for _ in 0..n {
            match p
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(l) => got.push_str(&format!("{l}\n")),
                Err(_) => {
                    let log = self
                        .ports
                        .to_doc(&std::fs::read_to_string(&p.log).unwrap_or_default());
                    let tail: Vec<&str> = log.lines().rev().take(5).collect();
                    return Err(format!(
                        "{file}:{line}: `{name}` printed only:\n{got}(its log ends: {tail:?})\n"
                    ));
                }
            }
        }
        Ok(got)
    }

    fn interrupt(&mut self, file: &str, line: usize, name: &str) -> Result<(), String> {
        let mut p = self.take(file, line, name)?;
        let pid = p.child.id().to_string();
        Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .map_err(|e| e.to_string())?;
        wait_exit(&mut p)
            .map(drop)
            .map_err(|e| format!("{file}:{line}: `{name}` after Ctrl-C {e}"))
    }

    fn take(&mut self, file: &str, line: usize, name: &str) -> Result<Process, String> {
        self.processes
            .remove(name)
            .ok_or(format!("{file}:{line}: no process `{name}` runs here"))
    }

    /// The output against the doc's, with ports given back and both sides redacted; then
    /// the values the doc shows twice against what they stood for.
    fn compare(&mut self, label: &str, actual: &str, expected: &str) -> Result<(), String> {
        self.compared += 1;
        let home = self.root.path().join("home").display().to_string();
        let actual = self.ports.to_doc(actual).replace(&home, "~");
        let tidy = |s: &str| -> String { s.lines().map(|l| format!("{}\n", redact::columns(l))).collect() };
        let (actual, expected) = (tidy(&actual), tidy(expected));
        Assert::new()
            .normalize_paths(false)
            .try_eq(
                Some(&"the binary"),
                Data::text(self.redactions.redact(&actual)),
                Data::text(self.redactions.redact(&expected)),
            )
            .map_err(|e| format!("{label} disagrees with the doc:\n{e}"))?;
        self.same.check(label, &actual, &expected)
    }
}

/// Waits for `p` to exit, or kills it after [`PROCESS_LIMIT`].
fn wait_exit(p: &mut Process) -> Result<std::process::ExitStatus, String> {
    let deadline = Instant::now() + PROCESS_LIMIT;
    loop {
        if let Some(status) = p.child.try_wait().map_err(|e| e.to_string())? {
            return Ok(status);
        }
        if Instant::now() > deadline {
            return Err(format!("did not exit within {PROCESS_LIMIT:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `program` in the flow's directory, with the flow's environment: `roster` and the cargo
/// shim on `PATH`, `HOME` in the flow, and the documented defaults on their stand-in ports.
fn command(program: &str, root: &Path, ports: &Ports) -> Command {
    let mut cmd = Command::new(program);
    let bin = Path::new(crate::BIN).parent().unwrap();
    let path = format!(
        "{}:{}:{}",
        root.join("bin").display(),
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("ROSTER_") || k.starts_with("XDG_")) {
        cmd.env_remove(k);
    }
    cmd.current_dir(root.join("work"))
        .env("PATH", path)
        .env("HOME", root.join("home"))
        .env("ROSTER_AGENT", format!("ws://127.0.0.1:{}", ports.real(7420)))
        .env("ROSTER_LISTEN", format!("127.0.0.1:{}", ports.real(7420)))
        .env("ROSTER_HTTP_LISTEN", format!("127.0.0.1:{}", ports.real(7421)))
        .env("NO_COLOR", "1");
    cmd
}
