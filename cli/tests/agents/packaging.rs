//! What packaging relies on: systemd's readiness protocol, shell completions, the man
//! pages, and the unit and config file shipped in docs/ops/.

use std::os::unix::net::UnixDatagram;

use super::*;

const OPS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/ops");

#[test]
fn the_agent_tells_systemd_it_is_ready_once_it_serves_and_that_it_is_stopping() {
    let root = tempfile::tempdir().unwrap();
    let socket = root.path().join("notify");
    let systemd = UnixDatagram::bind(&socket).unwrap();
    systemd.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut child = Reaped(
        Command::new(BIN)
            .args(["agent", "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"])
            .arg("--data-dir")
            .arg(root.path().join("d"))
            .env("NOTIFY_SOCKET", &socket)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut buf = [0u8; 256];
    let n = systemd.recv(&mut buf).expect("READY=1 within 15 s");
    assert_eq!(String::from_utf8_lossy(&buf[..n]).trim(), "READY=1");
    // Ready means serving: what the agent printed by then names a live HTTP API.
    let mut printed = String::new();
    let mut out = BufReader::new(child.0.stdout.take().unwrap());
    while !printed.contains("HTTP API on ") {
        out.read_line(&mut printed).unwrap();
    }
    let url = printed
        .lines()
        .find_map(|l| l.strip_prefix("HTTP API on "))
        .unwrap()
        .to_string();
    let status = Command::new("curl")
        .args(["-fsS", &format!("{url}/v1/status")])
        .output()
        .unwrap();
    assert!(status.status.success(), "{}", text(&status.stderr));
    Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    let n = systemd.recv(&mut buf).expect("STOPPING=1 after SIGTERM");
    assert_eq!(String::from_utf8_lossy(&buf[..n]).trim(), "STOPPING=1");
    assert!(child.0.wait().unwrap().success());
}

/// A child killed (by its pid) and reaped when dropped, the test failing first or not.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn completions_and_man_pages_come_from_the_commands_themselves() {
    for (shell, marker) in [
        ("bash", "_roster()"),
        ("zsh", "#compdef roster"),
        ("fish", "complete -c roster"),
    ] {
        let out = roster(&["completions", shell]);
        let script = text(&out.stdout);
        assert!(
            out.status.success() && script.contains(marker),
            "{shell}: {script}"
        );
        assert!(
            script.contains("http-listen"),
            "{shell} completes the agent's flags"
        );
    }
    let out = roster(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2));
    let page = text(&roster(&["man"]).stdout);
    assert!(page.starts_with(".ie") && page.contains(".TH roster 1"), "{page}");
    let agent = text(&roster(&["man", "agent"]).stdout);
    assert!(
        agent.contains(".TH roster-agent 1") && agent.contains("dns\\-listen"),
        "{agent}"
    );
    let out = roster(&["man", "nothing"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("roster --help"));
}

#[test]
fn the_shipped_unit_waits_for_readiness_and_the_shipped_config_starts_an_agent() {
    let unit = std::fs::read_to_string(format!("{OPS}/roster.service")).unwrap();
    assert!(unit.lines().any(|l| l == "Type=notify"), "{unit}");
    let exec = unit.lines().find_map(|l| l.strip_prefix("ExecStart=")).unwrap();
    let help = text(&roster(&["agent", "--help"]).stdout);
    for flag in exec.split_whitespace().filter(|w| w.starts_with("--")) {
        assert!(
            help.contains(flag),
            "the unit's {flag} is a flag of `roster agent`"
        );
    }
    // The example config, as shipped, is read whole (an unknown key would be refused);
    // the ports are moved off the defaults, which parallel tests must not take.
    let root = tempfile::tempdir().unwrap();
    let agent = Agent::start(
        &root.path().join("d"),
        "packaged",
        &[
            "--config",
            &format!("{OPS}/roster.toml"),
            "--http-listen",
            "127.0.0.1:0",
        ],
    );
    assert!(agent.roster(&["status"]).status.success());
}
