//! The service map (/ui/): tests/ui/browser.py drives it in headless Chromium against
//! real agents; and the gzipped copies the agent serves match the page's files.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::BIN;

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
        "an agent restart shows reconnecting, then the same data",
        "no errors in the browser console",
    ] {
        assert!(said.contains(&format!("ok: {check}")), "not checked: {check}\n{said}");
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
