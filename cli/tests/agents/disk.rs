//! The data directory under trouble: in use, corrupt, empty, unreadable, or on a full disk.

use super::*;

#[test]
fn a_data_dir_in_use_or_corrupt_is_refused_with_the_way_out() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("a");
    let _a = Agent::start(&dir, "a", &[]);
    let out = roster(&[
        "agent",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("roster.redb") && err.contains("in use"), "{err}");

    let bad = root.path().join("bad");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::write(bad.join("roster.redb"), vec![0x5a; 8192]).unwrap();
    let out = roster(&[
        "agent",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        bad.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("roster.redb") && err.contains("move it aside"),
        "{err}"
    );
}

/// Runs `roster agent` on `dir`, which should refuse to start: its output, or `None` when
/// it was still running after `limit` (then it is killed by its pid).
fn agent_refusal(dir: &Path, limit: Duration) -> Option<Output> {
    let mut child = Command::new(BIN)
        .env("ROSTER_HTTP_LISTEN", "127.0.0.1:0")
        .args(["agent", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir)
        .env_remove("ROSTER_AGENT")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(child.wait_with_output().unwrap())
}

#[test]
fn an_empty_store_file_is_refused_at_start_and_never_becomes_a_new_node() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("a");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("roster.redb");
    std::fs::write(&file, b"").unwrap();
    let out = agent_refusal(&dir, Duration::from_secs(10))
        .expect("the agent started on an empty roster.redb as a new node instead of refusing it");
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains(&file.display().to_string())
            && err.contains("empty")
            && err.contains("move it aside")
            && err.lines().count() == 1,
        "{err}"
    );
    assert_eq!(
        std::fs::metadata(&file).unwrap().len(),
        0,
        "the file was left as it was"
    );
}

/// A small tmpfs mounted for one test (Linux, as root), unmounted when dropped.
struct SmallDisk {
    dir: PathBuf,
}

impl SmallDisk {
    /// `None` when this process cannot mount one (not root).
    fn mount(dir: &Path, size: &str) -> Option<SmallDisk> {
        std::fs::create_dir_all(dir).unwrap();
        let uid = Command::new("id").arg("-u").output().ok()?;
        if text(&uid.stdout) != "0" {
            return None;
        }
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .unwrap();
        assert!(status.success(), "mount -t tmpfs failed as root");
        Some(SmallDisk {
            dir: dir.to_path_buf(),
        })
    }

    /// Fills the disk with one file; returns its path.
    fn fill(&self) -> PathBuf {
        use std::io::Write;
        let path = self.dir.join("filler");
        let mut f = std::fs::File::create(&path).unwrap();
        let chunk = vec![0x42u8; 64 * 1024];
        loop {
            match f.write(&chunk) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(28) => break,
                Err(e) => panic!("filling the disk: {e}"),
            }
        }
        // And the last few bytes.
        while let Ok(1..) = f.write(&[0x42]) {}
        path
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
    }
}

#[test]
fn a_full_disk_refuses_changes_with_a_clear_error_and_the_agent_writes_again_once_space_is_freed() {
    let root = tempfile::tempdir().unwrap();
    let Some(disk) = SmallDisk::mount(&root.path().join("disk"), "4m") else {
        eprintln!("skipped: mounting a small tmpfs needs root (CI runs as root)");
        return;
    };
    // Declared after the disk, so the agent is killed before the disk is unmounted. Its
    // log is kept off the small disk.
    let log = root.path().join("a.log");
    let a = Agent::start_with_log(&disk.dir.join("a"), "a", "127.0.0.1:0", &[], Some(&log));
    assert!(a
        .roster(&["register", "web", "127.0.0.1:80", "--id", "w001"])
        .status
        .success());
    assert!(a
        .roster(&["register", "batch", "127.0.0.1:1", "--ttl", "2s"])
        .status
        .success());

    let filler = disk.fill();
    // A change the store's files have room for is saved: an own write is durable once its
    // journal's append is synced, and the journal reuses the page it frees each time the
    // database's synced commit (the saver's, about once a second) empties it; redb reuses
    // the pages earlier transactions freed. Writes go on until such a commit needs the
    // file to grow: it fails, and the writes after it are refused (58 were saved in runs
    // here).
    let mut saved = vec!["w001".to_string()];
    let out = loop {
        let id = format!("w{:03}", saved.len() + 1);
        let out = a.roster(&["register", "web", "127.0.0.1:81", "--id", &id]);
        if !out.status.success() {
            break out;
        }
        saved.push(id);
        assert!(saved.len() <= 400, "{} saved on a full disk", saved.len());
    };
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("roster.redb cannot be written")
            && err.contains("No space left on device")
            && err.contains("check the free space")
            && err.lines().count() == 1,
        "{err}"
    );
    let ids = |a: &Agent| -> Vec<String> {
        a.instances("web")
            .iter()
            .map(|i| i["instance"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(ids(&a), saved, "what was not saved is not registered");
    let out = a.roster(&["deregister", "web", "w001"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert_eq!(ids(&a), saved, "what was not saved is not deregistered");
    let store = &a.json(&["status"])["store"];
    assert!(
        store["last_error"]
            .as_str()
            .unwrap()
            .contains("No space left on device")
            && store["since_ms"].as_u64().unwrap() > 0,
        "{store}"
    );
    let human = text(&a.roster(&["status"]).stdout);
    assert!(
        human.contains("store:           DEGRADED: cannot be written since"),
        "{human}"
    );
    within(
        Duration::from_secs(10),
        "a registration whose ttl passed is gone though its removal cannot be saved",
        || a.instances("batch").is_empty(),
    );
    // Time for a retry loop to show in the log, if there were one (it warned every 250 ms).
    // Expected: the warning without a secret, one that the disk cannot be written, one for
    // the passed ttl, and at most one more if a reopen fails with another error.
    std::thread::sleep(Duration::from_secs(2));
    let logged = std::fs::read_to_string(&log).unwrap();
    let lines = |what: &str| logged.lines().filter(|l| l.contains(what)).count();
    assert!(
        lines("batch") <= 2 && (1..=3).contains(&lines("cannot be written")) && lines(" WARN ") <= 4,
        "the log says it once, not on every retry:\n{logged}"
    );

    // Space is freed: the same agent process writes again, no restart.
    std::fs::remove_file(filler).unwrap();
    let refused = format!("w{:03}", saved.len() + 1);
    within(Duration::from_secs(15), "a register works again", || {
        a.roster(&["register", "web", "127.0.0.1:81", "--id", &refused])
            .status
            .success()
    });
    assert!(a.roster(&["deregister", "web", "w001"]).status.success());
    saved[0] = refused;
    saved.sort();
    assert_eq!(ids(&a), saved);
    within(
        Duration::from_secs(5),
        "status shows the store healthy again",
        || a.json(&["status"])["store"].is_null(),
    );
    // What was answered as saved, on the full disk too, was saved.
    let (dir, _) = a.kill9();
    let a = Agent::start_with_log(&dir, "a", "127.0.0.1:0", &[], Some(&log));
    assert_eq!(ids(&a), saved, "after a restart");
    drop(a);
}

/// A data directory whose replica cannot be read (a history poisoned before roster checked
/// what peers send: a counter past any a node mints) stops the agent with one line that
/// names the way out; `--reset-identity` starts it under a new id with its registrations,
/// without wiping the directory by hand.
#[test]
fn an_unreadable_replica_is_refused_and_reset_identity_recovers_the_nodes_registrations() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("a");
    let a = Agent::start(&dir, "a", &[]);
    assert!(a
        .roster(&["register", "web", "127.0.0.1:80", "--id", "w1"])
        .status
        .success());
    let old_id = a.json(&["status"])["node"].as_str().unwrap().to_string();
    let (dir, _) = a.kill9();

    {
        let meta: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new("meta");
        let db = redb::Database::open(dir.join("roster.redb")).unwrap();
        let tx = db.begin_write().unwrap();
        tx.open_table(meta)
            .unwrap()
            .insert("context", [2u8, 0xff, 0xff, 0xff].as_slice())
            .unwrap();
        tx.commit().unwrap();
    }
    let dir_arg = dir.display().to_string();
    let args = ["agent", "--listen", "127.0.0.1:0", "--data-dir", &dir_arg];
    let out = roster(&args);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    assert!(err.contains("--reset-identity"), "{err}");

    let b = Agent::start(&dir, "a", &["--reset-identity"]);
    let status = b.json(&["status"]);
    assert_ne!(status["node"].as_str().unwrap(), old_id, "a new identity");
    let got = b.json(&["get", "web"]);
    assert_eq!(got[0]["instance"], "w1", "its registration is back: {got}");
    assert_eq!(
        got[0]["node"], status["node"],
        "written under the new identity: {got}"
    );
    drop(b);
    // The next start, without the flag, keeps the new identity.
    let c = Agent::start(&dir, "a", &[]);
    assert_eq!(c.json(&["status"])["node"], status["node"]);
}
