//! What an operator reaches for: one instance read alone, whatever its status.

use super::*;

#[test]
fn roster_get_with_an_instance_shows_that_one_whatever_its_status() {
    let root = tempfile::tempdir().unwrap();
    let a = Agent::start(&root.path().join("a"), "a", &[]);
    for (id, addr) in [("web-1", "127.0.0.1:8080"), ("web-2", "127.0.0.1:8081")] {
        assert!(a.roster(&["register", "web", addr, "--id", id]).status.success());
    }
    assert!(a
        .roster(&["maint", "enable", "web", "web-2", "--reason", "deploy 42"])
        .status
        .success());
    let one = a.json(&["get", "web", "web-2"]);
    assert_eq!(one["instance"], "web-2", "one object, not a list: {one}");
    assert_eq!(one["status"], "maintenance");
    assert_eq!(one["note"], "deploy 42");
    let out = a.roster(&["get", "web", "web-1"]);
    let table = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(table.lines().count(), 2, "a header and one row: {table}");
    assert!(table.lines().nth(1).unwrap().starts_with("web-1 "), "{table}");

    let out = a.roster(&["get", "web", "web-9"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(out.stdout.is_empty());
    assert!(
        err.contains("\"web-9\"") && err.contains("roster get web --all"),
        "{err}"
    );
    let out = a.roster(&["get", "web", "Web 9"]);
    assert_eq!(out.status.code(), Some(2), "a bad id is bad input");
}

#[test]
fn force_leave_writes_a_gone_node_dead_at_once_and_is_refused_for_one_that_answers() {
    let root = tempfile::tempdir().unwrap();
    let (a, b) = two_agents(root.path());
    assert!(a
        .roster(&["register", "db", "127.0.0.1:5432", "--id", "db-1"])
        .status
        .success());
    within(Duration::from_secs(5), "b holds a's registration", || {
        b.instances("db").len() == 1
    });
    // A node that answers is refused, by name, and nothing changes.
    let out = b.roster(&["force-leave", "a"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("answers") && err.lines().count() == 1, "{err}");
    assert_eq!(b.instances("db").len(), 1);
    let out = b.roster(&["force-leave", "nobody"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("roster members"),
        "{}",
        text(&out.stderr)
    );

    // a is gone for good; b comes back alone from its disk, where a's lease has most of
    // a minute left (once b's saver committed it).
    std::thread::sleep(SAVED_AFTER);
    drop(a.kill9());
    let (dir, port) = b.kill9();
    let b = Agent::start_on(&dir, "b", &format!("127.0.0.1:{port}"), &LONG);
    assert_eq!(
        b.instances("db").len(),
        1,
        "a's registration, until its lease ends"
    );
    let done = b.json(&["force-leave", "a"]);
    assert_eq!(done["written_dead"], true, "{done}");
    assert!(
        b.instances("db").is_empty(),
        "gone at once, not when the lease ends"
    );
    let members = b.json(&["members"]);
    assert!(
        !members
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["name"] == "a" && m["state"] == "alive"),
        "{members}"
    );
}

#[test]
fn an_operator_removes_an_instance_of_another_node_logged_and_counted() {
    let root = tempfile::tempdir().unwrap();
    let (a, b) = two_agents(root.path());
    for id in ["web-1", "web-2"] {
        assert!(a
            .roster(&["register", "web", "127.0.0.1:80", "--id", id])
            .status
            .success());
    }
    within(Duration::from_secs(5), "b holds a's registrations", || {
        b.instances("web").len() == 2
    });
    // a is gone for good, its instances stranded on b until a's lease ends (once b's
    // saver committed them).
    std::thread::sleep(SAVED_AFTER);
    drop(a.kill9());
    let (dir, port) = b.kill9();
    let http = ["--http-listen", "127.0.0.1:0"];
    let b = Agent::start_on(
        &dir,
        "b",
        &format!("127.0.0.1:{port}"),
        &[&LONG[..], &http].concat(),
    );
    let h = super::http::http_url(&b);
    assert_eq!(b.instances("web").len(), 2);

    // A normal write still checks the owner; the operator's removal does not.
    let out = b.roster(&["deregister", "web", "web-1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("registered by node a"),
        "{}",
        text(&out.stderr)
    );
    let out = b.roster(&["deregister", "web", "web-1", "--any-owner"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let left: Vec<Value> = b.instances("web");
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0]["instance"], "web-2");
    let url = format!("{h}/v1/services/web/instances/web-2");
    assert_eq!(super::http::curl(&["-X", "DELETE", &url]).code, 409);
    let r = super::http::curl(&["-X", "DELETE", &format!("{url}?any-owner")]);
    assert_eq!(r.code, 200, "{}", r.body);
    assert!(b.instances("web").is_empty());
    let r = super::http::curl(&["-X", "DELETE", &format!("{url}?any-owner")]);
    assert_eq!(r.error(404), "not_found");

    let metrics = super::http::curl(&[&format!("{h}/metrics")]).body;
    assert!(
        metrics.lines().any(|l| l == "roster_operator_removals_total 2"),
        "{metrics}"
    );
    within(Duration::from_secs(5), "the log says who removed what", || {
        b.log()
            .matches("an operator removed an instance of another node")
            .count()
            == 2
    });
}

/// Leases long enough that nothing lapses while a test runs.
const LONG: [&str; 2] = ["--lease-ttl", "60s"];

/// Agents `a` and `b` under `root`, `b` joined to `a`, with `LONG` leases.
fn two_agents(root: &std::path::Path) -> (Agent, Agent) {
    let a = Agent::start(&root.join("a"), "a", &LONG);
    let b = Agent::start(&root.join("b"), "b", &[&LONG[..], &["--join", &a.url]].concat());
    (a, b)
}
