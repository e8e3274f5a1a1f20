//! The exit-code table of docs/reference/cli.md, walked: every code it lists is what real
//! runs of the binary exit with, the cases the reference names among them.

use super::*;

/// The codes of cli.md's exit-code table, in order.
fn documented_codes() -> Vec<i32> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/reference/cli.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let table = doc.split("| code | meaning | examples |").nth(1).unwrap();
    table
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| l.split('|').nth(1).unwrap().trim().parse().unwrap())
        .collect()
}

/// A loopback port nothing listens on: bound, noted, released.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn every_code_of_the_reference_table_is_what_its_cases_exit_with() {
    let root = tempfile::tempdir().unwrap();
    let a = Agent::start(&root.path().join("a"), "a", &["--http-listen", "127.0.0.1:0"]);
    // The agent's HTTP API, asked as if it were its client port.
    let http_port = super::http::http_url(&a).replace("http://", "ws://");
    // A port in use, held for the whole test: binding it fails.
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = busy.local_addr().unwrap().to_string();
    let data = path_str(&root.path().join("b"));
    let agent = |args: &[&str]| {
        let (listening, code, err) = agent_start_output(&[args, &["--data-dir", &data]].concat(), &[]);
        assert!(
            listening.is_empty(),
            "the agent started ({listening}) with {args:?}"
        );
        (code, err)
    };
    let client = |args: &[&str]| {
        let out = roster(args);
        (out.status.code(), text(&out.stderr))
    };
    let unreachable = format!("ws://127.0.0.1:{}", free_port());
    let http_url = format!("http://127.0.0.1:{}", a.port);
    // (the case, what the run exited with and said, the code the table gives it)
    type Run<'a> = (&'a str, (Option<i32>, String), i32);
    let runs: Vec<Run> = vec![
        ("--version", client(&["--version"]), 0),
        (
            "get finds no live instance",
            client(&["get", "web", "--agent", &a.url]),
            1,
        ),
        (
            "deregister of an instance the agent does not own",
            client(&["deregister", "web", "web-9", "--agent", &a.url]),
            1,
        ),
        ("agent: --listen in use", agent(&["--listen", &busy]), 1),
        (
            "agent: --http-listen in use",
            agent(&["--listen", "127.0.0.1:0", "--http-listen", &busy]),
            1,
        ),
        (
            "agent: --dns-listen in use",
            agent(&["--listen", "127.0.0.1:0", "--dns-listen", &busy]),
            1,
        ),
        ("a command-line error", client(&["get"]), 2),
        (
            "an invalid service name",
            client(&["get", "Web", "--agent", &a.url]),
            2,
        ),
        (
            "--agent is not a ws:// URL",
            client(&["ls", "--agent", &http_url]),
            2,
        ),
        (
            "agent: --http-listen does not parse",
            agent(&["--listen", "127.0.0.1:0", "--http-listen", "nowhere"]),
            2,
        ),
        (
            "nothing listens at --agent",
            client(&["ls", "--agent", &unreachable]),
            3,
        ),
        (
            "--agent is the port of an agent's HTTP API",
            client(&["ls", "--agent", &http_port]),
            3,
        ),
    ];
    let mut walked = Vec::new();
    for (case, (code, err), want) in &runs {
        assert_eq!(*code, Some(*want), "{case}: {err}");
        if *want != 0 {
            assert!(
                err.starts_with("roster: error: ") || err.starts_with("error: "),
                "{case}: {err}"
            );
        }
        if !walked.contains(want) {
            walked.push(*want);
        }
    }
    assert_eq!(
        walked,
        documented_codes(),
        "a run for each code of the table, in its order"
    );
}
