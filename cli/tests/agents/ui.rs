//! The service map (/ui/): tests/ui/browser.py drives it in headless Chromium against
//! real agents; and the gzipped copies the agent serves match the page's files.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use super::http::{curl, http_url};
use super::{Agent, BIN};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Debian's python3 (where python3-selenium is), else the first on PATH.
fn python() -> &'static str {
    if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

fn has_browser() -> bool {
    let selenium = Command::new(python())
        .args(["-c", "import selenium"])
        .status()
        .is_ok_and(|s| s.success());
    let chromium = ["/usr/bin/chromium", "/usr/bin/chromedriver"]
        .iter()
        .all(|p| Path::new(p).exists());
    selenium && chromium
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0")
}

#[test]
fn the_page_follows_registrations_checks_maintenance_and_restarts_in_a_real_browser() {
    if !has_browser() {
        assert!(
            !is_root(),
            "chromium, chromium-driver or python3-selenium is missing; run `bash tests/prepare` (it installs them as root)"
        );
        eprintln!("SKIPPED the browser test: chromium, chromium-driver and python3-selenium are not installed; run `sudo bash tests/prepare`");
        return;
    }
    let out = Command::new(python())
        .arg(repo().join("tests/ui/browser.py"))
        .arg(BIN)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "tests/ui/browser.py failed:\n{said}");
    for check in [
        "the page lists what the CLI registered on another agent",
        "a new registration appears without a reload",
        "a failing health check turns the instance critical",
        "maintenance switched on from the page is seen by roster get --all",
        "the members show their lease and when this agent synced with each",
        "light and dark follow the system, with readable text",
        "every main view fits a phone's width, its controls in view",
        "a read answered late does not hide a change the stream brought",
        "an agent restart shows reconnecting, then the same data",
        "no errors in the browser console",
    ] {
        assert!(
            said.contains(&format!("ok: {check}")),
            "not checked: {check}\n{said}"
        );
    }
}

#[test]
fn the_gzipped_copies_of_the_page_match_its_files() {
    let ui = repo().join("cli/ui");
    for f in ["index.html", "app.js", "style.css"] {
        let out = Command::new("gzip")
            .arg("-dc")
            .arg(ui.join("gz").join(format!("{f}.gz")))
            .output()
            .unwrap();
        assert!(out.status.success(), "gzip -dc cli/ui/gz/{f}.gz failed");
        let plain = std::fs::read(ui.join(f)).unwrap();
        assert!(
            out.stdout == plain,
            "cli/ui/gz/{f}.gz does not match cli/ui/{f}; run `bash cli/ui/compress` and commit"
        );
    }
}

#[test]
fn the_summary_counts_by_status_and_a_blocking_query_on_it_answers_when_a_count_moves() {
    let root = tempfile::tempdir().unwrap();
    let a = Agent::start(&root.path().join("a"), "a", &["--http-listen", "127.0.0.1:0"]);
    let h = http_url(&a);
    for id in ["web-1", "web-2"] {
        a.roster(&["register", "web", "10.0.0.7:80", "--id", id]);
    }
    a.roster(&["maint", "enable", "web", "web-2"]);
    let first = curl(&[&format!("{h}/v1/summary")]);
    assert_eq!(
        first.json(),
        serde_json::json!([{"service": "web", "instances": 2, "passing": 1, "warning": 0, "critical": 0, "maintenance": 1, "unreachable": 0}])
    );
    // GET /v1/services keeps its shape.
    let plain = curl(&[&format!("{h}/v1/services")]);
    assert_eq!(
        plain.json(),
        serde_json::json!([{"service": "web", "instances": 2}])
    );

    let index = first.header("x-roster-index").unwrap();
    let (tx, rx) = mpsc::channel();
    let url = format!("{h}/v1/summary?index={index}&wait=60s");
    std::thread::spawn(move || tx.send(curl(&[&url])));
    assert!(
        rx.recv_timeout(Duration::from_millis(500)).is_err(),
        "the query waits while no count moves"
    );
    a.roster(&["maint", "disable", "web", "web-2"]);
    let moved = rx
        .recv_timeout(Duration::from_secs(15))
        .expect("an answer once web-2 is back");
    assert_ne!(moved.header("x-roster-index").unwrap(), index);
    assert_eq!(moved.json()[0]["passing"], 2);

    let bad = curl(&[&format!("{h}/v1/summary?status=passing")]);
    assert_eq!(bad.error(400), "invalid");
}

#[test]
fn the_page_is_served_at_ui_gzipped_when_accepted_and_root_redirects_to_it() {
    let root = tempfile::tempdir().unwrap();
    let a = Agent::start(&root.path().join("a"), "a", &["--http-listen", "127.0.0.1:0"]);
    let h = http_url(&a);
    let r = curl(&[&format!("{h}/")]);
    assert_eq!((r.code, r.header("location").as_deref()), (308, Some("/ui/")));
    let page = curl(&[&format!("{h}/ui/")]);
    assert_eq!(page.code, 200);
    assert!(
        page.body.contains("<script type=\"module\" src=\"app.js\">"),
        "{}",
        page.body
    );
    assert_eq!(page.header("content-encoding"), None, "not asked for gzip");
    let js = curl(&[
        "-o",
        "/dev/null",
        "-H",
        "Accept-Encoding: gzip",
        &format!("{h}/ui/app.js"),
    ]);
    assert_eq!(js.header("content-encoding").as_deref(), Some("gzip"));
    assert!(js
        .header("content-security-policy")
        .unwrap()
        .contains("default-src 'self'"));
    let missing = curl(&[&format!("{h}/ui/nope.js")]);
    assert_eq!(missing.code, 404);
}
