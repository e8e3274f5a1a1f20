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
