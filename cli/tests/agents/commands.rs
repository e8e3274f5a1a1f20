//! The client commands and the agent's flags as an operator meets them: bad input, an
//! unreachable agent, the config file, JSON answers, roster id, and instances owned
//! elsewhere.

use super::*;

#[test]
fn bad_input_gets_a_clear_error_and_changes_nothing() {
    let root = tempfile::tempdir().unwrap();
    let a = Agent::start(&root.path().join("a"), "a", &[]);
    let big = format!("k={}", "x".repeat(5_000));
    let cases: Vec<(Vec<&str>, i32, &str)> = vec![
        (
            vec!["register", "Bad Name", "127.0.0.1:80"],
            2,
            "invalid service name",
        ),
        (vec!["register", "web", "no-port"], 2, "invalid address"),
        (vec!["register", "web", "127.0.0.1:99999"], 2, "invalid address"),
        (vec!["register", "web", "`$(id)`;rm:80"], 2, "invalid address"),
        (vec!["register", "web", "a_b.example:80"], 2, "invalid address"),
        (vec!["register", "web", "10.0.0.256:80"], 2, "invalid address"),
        (
            vec![
                "register",
                "web",
                "127.0.0.1:80",
                "--meta",
                "zone=a\ndown  web  web-2",
            ],
            2,
            "printable",
        ),
        (
            vec!["register", "web", "127.0.0.1:80", "--meta", "zone=\u{1b}[31mred"],
            2,
            "printable",
        ),
        (
            vec!["register", "web", "127.0.0.1:80", "--meta", &big],
            2,
            "metadata",
        ),
        (
            vec!["register", "web", "127.0.0.1:80", "--meta", "novalue"],
            2,
            "KEY=VALUE",
        ),
        (
            vec!["register", "web", "127.0.0.1:80", "--id", "a/b"],
            2,
            "instance id",
        ),
        (
            vec!["register", "web", "127.0.0.1:80", "--ttl", "soon"],
            2,
            "durations",
        ),
        (vec!["register", "roster", "127.0.0.1:80"], 2, "reserved"),
        (vec!["register", "web"], 2, "ADDRESS"),
        (vec!["get", "web", "--frobnicate"], 2, "--frobnicate"),
        (vec!["get", "web"], 1, "no live instances of web"),
        (vec!["deregister", "web", "web-9"], 1, "owns no instance"),
        (vec!["explain", "web", "web-9"], 1, "no registration"),
    ];
    for (args, code, needle) in cases {
        let out = a.roster(&args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "roster {args:?}: {err}");
        assert!(
            err.contains(needle),
            "roster {args:?}: {err:?} does not say {needle:?}"
        );
        // Every error but the argument parser's is one line.
        if code == 1 || !err.starts_with("error: ") {
            assert_eq!(err.lines().count(), 1, "one line: {err:?}");
            assert!(err.starts_with("roster: error: "), "{err:?}");
        }
    }
    // Input the agent would refuse, or once accepted (or cut the connection over), is
    // refused before it is sent: exit 2, one line.
    let mut many = vec!["register", "web", "127.0.0.1:80"];
    many.extend(std::iter::repeat_n(["--meta", "k=v"], 10_000).flatten());
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "register",
                "web",
                "127.0.0.1:80",
                "--meta",
                "zone=a",
                "--meta",
                "zone=b",
            ],
            "\"zone\" is given twice",
        ),
        (many, "10000 pairs"),
        (
            vec!["register", "web", "127.0.0.1:80", "--ttl", "25h"],
            "at most 24h",
        ),
        (
            vec!["register", "web", "127.0.0.1:80", "--ttl", "500000000000days"],
            "at most 24h",
        ),
        (
            vec!["register", "web", "127.0.0.1:80", "--ttl", "500ms"],
            "at least 1s",
        ),
    ];
    for (args, needle) in cases {
        let out = a.roster(&args);
        let err = text(&out.stderr);
        let shown = &args[..args.len().min(8)];
        assert_eq!(out.status.code(), Some(2), "roster {shown:?}: {err}");
        assert!(
            err.contains(needle),
            "roster {shown:?}: {err:?} does not say {needle:?}"
        );
        assert_eq!(err.lines().count(), 1, "one line: {err:?}");
        assert!(err.starts_with("roster: error: "), "{err:?}");
    }
    assert_eq!(a.json(&["ls"]), serde_json::json!([]));

    // Bad agent flags stop it before it starts.
    let never = root.path().join("never").display().to_string();
    for (args, needle) in [
        (vec!["agent", "--gossip-interval", "fast"], "durations"),
        (
            vec!["agent", "--fanout", "0", "--data-dir", "/tmp/roster-never"],
            "fanout",
        ),
        (
            vec!["agent", "--join", "http://x:1", "--data-dir", "/tmp/roster-never"],
            "join URL",
        ),
        (
            vec!["agent", "--max-clock-skew", "1h", "--data-dir", &never],
            "max clock skew",
        ),
        (
            vec![
                "agent",
                "--listen",
                "127.0.0.1:0",
                "--cluster-secret-file",
                "/nonexistent",
            ],
            "secret file",
        ),
        (
            vec!["agent", "--listen", "0.0.0.0:0", "--data-dir", &never],
            "--cluster-secret-file",
        ),
        (
            vec![
                "agent",
                "--listen",
                "127.0.0.1:0",
                "--advertise",
                "nowhere",
                "--data-dir",
                &never,
            ],
            "--advertise",
        ),
    ] {
        let out = roster(&args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "roster {args:?}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stderr).contains(needle),
            "roster {args:?}: {}",
            text(&out.stderr)
        );
    }
}

#[test]
fn a_client_that_cannot_reach_its_agent_exits_3_and_says_how_to_start_one() {
    // A port nothing listens on: bind one, note it, release it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("ws://127.0.0.1:{port}");
    let out = roster(&["ls", "--agent", &url]);
    assert_eq!(out.status.code(), Some(3));
    let err = text(&out.stderr);
    assert!(err.contains(&url) && err.contains("roster agent"), "{err}");
    let out = roster(&["ls", "--agent", "http://127.0.0.1:7420"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    // ROSTER_AGENT is the flag's variable.
    let out = Command::new(BIN)
        .args(["ls"])
        .env("ROSTER_AGENT", &url)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert!(text(&out.stderr).contains(&url));
}

/// `--agent` of another scheme (the HTTP API's `http://`, a bare address) says which
/// address to give instead; nothing is sent.
#[test]
fn an_agent_url_that_is_not_ws_says_to_give_the_agents_listen_address() {
    for (url, http) in [
        ("http://127.0.0.1:7421", true),
        ("https://127.0.0.1:7421", true),
        ("127.0.0.1:7420", false),
    ] {
        let out = roster(&["ls", "--agent", url]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.ends_with(
                "pass --agent ws://HOST:PORT with the agent's --listen address (port 7420 by default)"
            ),
            "{err}"
        );
        assert_eq!(err.contains("the agent's HTTP API"), http, "{err}");
    }
}

#[test]
fn the_config_file_and_variables_set_the_agents_flags_and_flags_win() {
    let root = tempfile::tempdir().unwrap();
    let cfg = root.path().join("roster.toml");
    std::fs::write(
        &cfg,
        format!(
            "listen = \"127.0.0.1:0\"\nnode-name = \"from-file\"\ngossip-interval = \"200ms\"\ndata-dir = \"{}\"\n",
            root.path().join("data").display()
        ),
    )
    .unwrap();
    let start = |env: &[(&str, &str)], args: &[&str]| {
        let mut cmd = Command::new(BIN);
        // Agents of parallel tests share loopback: none takes the HTTP API's default port.
        cmd.env("ROSTER_HTTP_LISTEN", "127.0.0.1:0");
        cmd.arg("agent").args(args).arg("--config").arg(&cfg);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.stdout(Stdio::piped()).stderr(Stdio::null());
        let mut child = cmd.spawn().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().unwrap().unwrap();
        let _ = child.kill();
        let _ = child.wait();
        first
    };
    let first = start(&[], &[]);
    assert!(first.contains("node from-file"), "{first}");
    assert!(start(&[("ROSTER_NODE_NAME", "from-env")], &[]).contains("node from-env"));
    assert!(
        start(&[("ROSTER_NODE_NAME", "from-env")], &["--node-name", "from-flag"]).contains("node from-flag")
    );

    std::fs::write(&cfg, "listen = 5\n").unwrap();
    let out = roster(&["agent", "--config", cfg.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("line 1"), "{}", text(&out.stderr));
    std::fs::write(
        &cfg,
        "# lease-ttl = 1s\nlisten = \"127.0.0.1:0\"\nlease-ttl = \"soon\"\n",
    )
    .unwrap();
    let out = roster(&["agent", "--config", cfg.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("line 3"), "{}", text(&out.stderr));
    // A value the node refuses names the file and the line too, unless a flag set it.
    std::fs::write(&cfg, "listen = \"127.0.0.1:0\"\n\nfanout = 65\n").unwrap();
    let out = roster(&["agent", "--config", cfg.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!(
            "config file {}, line 3: fanout 65 is out of range",
            cfg.display()
        )),
        "{err}"
    );
    let out = roster(&["agent", "--config", cfg.to_str().unwrap(), "--fanout", "70"]);
    let err = text(&out.stderr);
    assert!(
        err.contains("fanout 70 is out of range") && !err.contains("config file"),
        "{err}"
    );
    std::fs::write(&cfg, "listen = \"127.0.0.1:0\"\ngossip-intervall = \"1s\"\n").unwrap();
    let out = roster(&["agent", "--config", cfg.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("line 2") && err.contains("gossip-intervall"),
        "{err}"
    );
}

#[test]
fn status_members_explain_and_sync_answer_in_json() {
    let root = tempfile::tempdir().unwrap();
    let a = Agent::start(&root.path().join("a"), "a", &["--sync-min-interval", "1h"]);
    let b = Agent::start(&root.path().join("b"), "b", &["--join", &a.url]);
    within(Duration::from_secs(5), "b is connected", || {
        b.json(&["status"])["peers"].as_array().unwrap().len() == 1
    });
    let s = b.json(&["status"]);
    for k in [
        "node",
        "name",
        "version",
        "uptime_ms",
        "peers",
        "launches_recent",
        "crash_guard",
        "counters",
    ] {
        assert!(s.get(k).is_some(), "status has {k}: {s}");
    }
    for k in [
        "connections_opened",
        "connections_accepted",
        "frames_sent",
        "bytes_sent",
        "frames_received",
        "bytes_received",
        "deltas_applied",
        "full_syncs_sent",
        "full_syncs_received",
    ] {
        assert!(s["counters"][k].is_u64(), "counters has {k}: {s}");
    }
    assert_eq!(s["name"], "b");
    assert_eq!(s["crash_guard"], false);

    within(Duration::from_secs(5), "a lists b as a live member", || {
        a.json(&["members"])
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["name"] == "b")
    });
    let m = a.json(&["members"]);
    let names: Vec<&str> = m
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["a", "b"]);
    assert!(m
        .as_array()
        .unwrap()
        .iter()
        .all(|x| x["state"] == "alive" && x["last_heard_ms"].is_u64() && x["lease_left_ms"].is_u64()));
    // Synced: when a last took state from b over their connection; a is itself.
    within(
        Duration::from_secs(5),
        "a says when it last synced with b",
        || {
            let m = a.json(&["members"]);
            let by = |n: &str| {
                m.as_array()
                    .unwrap()
                    .iter()
                    .find(|x| x["name"] == n)
                    .cloned()
                    .unwrap()
            };
            by("b")["synced_ms"].is_u64() && by("a")["synced_ms"].is_null()
        },
    );

    assert!(b
        .roster(&["register", "web", "127.0.0.1:80", "--id", "w"])
        .status
        .success());
    let x = b.json(&["explain", "web", "w"]);
    assert_eq!(x["live"], true);
    assert_eq!(x["writes"][0]["node_name"], "b");
    within(
        Duration::from_secs(40),
        "a acknowledges the write in a digest",
        || {
            let _ = a.roster(&["sync"]);
            !b.json(&["explain", "web", "w"])["acknowledged_by"]
                .as_array()
                .unwrap()
                .is_empty()
                || !a.json(&["explain", "web", "w"])["acknowledged_by"]
                    .as_array()
                    .unwrap()
                    .is_empty()
        },
    );

    // A manual sync runs once per --sync-min-interval; the throttle outlives a restart.
    let (dir, port) = a.kill9();
    let a = Agent::start_on(
        &dir,
        "a",
        &format!("127.0.0.1:{port}"),
        &["--sync-min-interval", "1h"],
    );
    let out = a.roster(&["sync"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("next may run in"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn roster_id_makes_and_prints_a_data_dirs_identity_without_counting_a_start() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("a");
    let d = path_str(&dir);
    let first = roster(&["id", "--data-dir", &d]);
    assert!(first.status.success(), "{}", text(&first.stderr));
    let id = text(&first.stdout).trim().to_string();
    assert!(
        id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "{id:?}"
    );
    assert!(
        text(&first.stderr).contains("new node identity"),
        "{}",
        text(&first.stderr)
    );
    let again = roster(&["id", "--data-dir", &d, "--json"]);
    let v: Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(v["node"], id.as_str());
    assert_eq!(v["tls_name"], format!("node-{id}"));
    assert_eq!(v["made"], false);
    // The agent started on it is that node, and its first start is its first launch.
    let a = Agent::start(&dir, "a", &[]);
    let status = a.json(&["status"]);
    assert_eq!(status["node"], id.as_str());
    assert_eq!(status["launches_recent"], 1);
    // While the agent holds the directory, `roster id` says so and points at `status`.
    let busy = roster(&["id", "--data-dir", &d]);
    assert_eq!(busy.status.code(), Some(1), "{}", text(&busy.stderr));
    assert!(
        text(&busy.stderr).contains("roster status"),
        "{}",
        text(&busy.stderr)
    );
}

#[test]
fn an_agent_with_nobody_to_join_opens_no_connection() {
    let root = tempfile::tempdir().unwrap();
    let a = Agent::start(&root.path().join("a"), "a", &[]);
    assert!(a.roster(&["register", "web", "127.0.0.1:80"]).status.success());
    std::thread::sleep(Duration::from_millis(1_500));
    let s = a.json(&["status"]);
    assert_eq!(s["counters"]["connections_opened"], 0, "{s}");
    assert_eq!(s["counters"]["frames_sent"], 0, "{s}");
}

/// An instance id another live node keeps alive is refused with its owner named; once the
/// owner deregisters it, it is free. (Two nodes keeping one instance would each take it
/// from the other.)
#[test]
fn registering_an_instance_another_live_node_owns_is_refused_naming_the_owner() {
    let root = tempfile::tempdir().unwrap();
    let a = Agent::start(&root.path().join("a"), "a", &[]);
    let b = Agent::start(&root.path().join("b"), "b", &["--join", &a.url]);
    assert!(a
        .roster(&["register", "web", "127.0.0.1:80", "--id", "w1"])
        .status
        .success());
    within(Duration::from_secs(10), "b to see w1", || {
        b.instances("web").len() == 1
    });
    let out = b.roster(&["register", "web", "127.0.0.2:80", "--id", "w1"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    assert!(err.contains("registered by node a"), "{err}");
    assert_eq!(
        b.json(&["get", "web"])[0]["address"],
        "127.0.0.1:80",
        "nothing changed"
    );
    // Deregistering it through b is refused the same way: the error names the owner.
    let out = b.roster(&["deregister", "web", "w1"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("registered by node a") && err.contains(&a.url) && err.lines().count() == 1,
        "{err}"
    );
    // An instance nobody holds is still just not found.
    let out = b.roster(&["deregister", "web", "w9"]);
    assert!(
        text(&out.stderr).contains("owns no instance"),
        "{}",
        text(&out.stderr)
    );

    assert!(a.roster(&["deregister", "web", "w1"]).status.success());
    within(Duration::from_secs(10), "w1 to be free on b", || {
        b.roster(&["register", "web", "127.0.0.2:80", "--id", "w1"])
            .status
            .success()
    });
    within(Duration::from_secs(10), "a to see b's w1", || {
        a.json(&["get", "web"])[0]["address"] == "127.0.0.2:80"
    });
}

#[test]
fn a_watch_ends_on_ctrl_c_even_right_after_it_printed_a_line() {
    let root = tempfile::tempdir().unwrap();
    let a = Agent::start(&root.path().join("a"), "a", &[]);
    let out = a.roster(&["register", "web", "127.0.0.1:8080", "--id", "web-1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // A Ctrl-C that came while the watch was between two events used to be lost, and the
    // watch ran on.
    for _ in 0..20 {
        let mut w = Watcher::start(&a, "web");
        w.next(Duration::from_secs(5)).expect("the watch lists web-1");
        let pid = w.child.id().to_string();
        Command::new("kill").args(["-INT", &pid]).status().unwrap();
        let mut status = None;
        within(Duration::from_secs(5), "the watch ends on SIGINT", || {
            status = w.child.try_wait().unwrap();
            status.is_some()
        });
        let status = status.unwrap();
        assert_eq!(
            status.code(),
            Some(0),
            "Ctrl-C ends a watch with exit 0, not {status}"
        );
    }
}

/// Every value the agent takes from its config file and refuses (out of range, malformed,
/// an address in use, a file that cannot be read) is named by the file and its line, with
/// the code it has when a flag gives it; a flag's value is not blamed on the file.
#[test]
fn a_refused_value_from_the_config_file_is_named_by_the_file_and_its_line() {
    let root = tempfile::tempdir().unwrap();
    // A port in use for the whole test.
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = format!("\"{}\"", busy.local_addr().unwrap());
    let cfg = root.path().join("roster.toml");
    let mut runs = 0;
    // The file: a comment, the keys an agent needs, then `key = value` on its last line.
    let mut start = |key: &str, value: &str, flags: &[&str]| {
        runs += 1;
        let data = root.path().join(format!("data-{runs}"));
        let base = [
            ("listen", "\"127.0.0.1:0\"".to_string()),
            ("http-listen", "\"127.0.0.1:0\"".to_string()),
            ("data-dir", format!("\"{}\"", data.display())),
        ];
        let mut lines = vec!["# the agent's settings".to_string()];
        lines.extend(
            base.iter()
                .filter(|(k, _)| *k != key)
                .map(|(k, v)| format!("{k} = {v}")),
        );
        lines.push(format!("{key} = {value}"));
        std::fs::write(&cfg, lines.join("\n") + "\n").unwrap();
        let out = Command::new(BIN)
            .args(["agent", "--config", &path_str(&cfg)])
            .args(flags)
            .env_remove("ROSTER_HTTP_LISTEN")
            .env_remove("ROSTER_LISTEN")
            .env_remove("ROSTER_DATA_DIR")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (out.status.code(), text(&out.stderr), lines.len())
    };
    let cases: Vec<(&str, &str, i32, &str)> = vec![
        ("dns-ttl", "\"2h\"", 2, "DNS TTL 2h is over 1h"),
        ("dns-domain", "\"bad domain\"", 2, "DNS domain \"bad domain\""),
        ("advertise", "\"nowhere\"", 2, "advertise URL \"nowhere\""),
        ("listen", "\"nowhere\"", 2, "cannot listen on nowhere"),
        ("listen", &busy, 1, "cannot listen on 127.0.0.1:"),
        (
            "http-listen",
            "\"nowhere\"",
            2,
            "cannot listen for HTTP on nowhere",
        ),
        ("http-listen", &busy, 1, "cannot listen for HTTP on 127.0.0.1:"),
        ("dns-listen", "\"nowhere\"", 2, "cannot listen for DNS on nowhere"),
        (
            "http-token-file",
            "\"/nonexistent/tokens\"",
            2,
            "/nonexistent/tokens",
        ),
        (
            "cluster-secret-file",
            "\"/nonexistent/secret\"",
            2,
            "/nonexistent/secret",
        ),
    ];
    for (key, value, code, said) in cases {
        let (got, err, line) = start(key, value, &[]);
        assert_eq!(got, Some(code), "{key} = {value}: {err}");
        let named = format!("roster: error: config file {}, line {line}: ", cfg.display());
        assert!(err.starts_with(&named), "{key} = {value}: {err}");
        assert!(err.contains(said), "{key} = {value}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    // The same value from a flag: the flag is where to look, not the file.
    let (got, err, _) = start("node-name", "\"a\"", &["--dns-ttl", "2h"]);
    assert_eq!(got, Some(2), "{err}");
    assert_eq!(
        err,
        "roster: error: DNS TTL 2h is over 1h; use at most 1h (answers older than that mislead)"
    );
}
