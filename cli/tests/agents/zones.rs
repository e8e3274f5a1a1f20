//! Zones: a node's zone set by flag, variable or config file, known to every member, shown
//! by `members`, `status`, the HTTP API and metrics; a bad one refused before the start.

use super::http::{curl, http_url};
use super::*;

/// The zone `x` lists for the node named `name`, if it lists that node.
fn zone_of(x: &Agent, name: &str) -> Option<Value> {
    x.json(&["members"])
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == name)
        .map(|m| m["zone"].clone())
}

#[test]
fn every_agent_shows_each_members_zone_and_one_without_is_in_the_default_zone() {
    let root = tempfile::tempdir().unwrap();
    let a = Agent::start(&root.path().join("a"), "a", &["--zone", "eu-west-1a"]);
    let config = root.path().join("b.toml");
    std::fs::write(&config, "zone = \"eu-west-1b\"\n").unwrap();
    let b = Agent::start(
        &root.path().join("b"),
        "b",
        &["--config", config.to_str().unwrap(), "--join", &a.url],
    );
    let c = Agent::start(&root.path().join("c"), "c", &["--join", &a.url]);
    for x in [&a, &b, &c] {
        within(Duration::from_secs(10), "every agent knows every zone", || {
            zone_of(x, "a") == Some("eu-west-1a".into())
                && zone_of(x, "b") == Some("eu-west-1b".into())
                && zone_of(x, "c") == Some("default".into())
        });
    }
    assert_eq!(b.json(&["status"])["zone"], "eu-west-1b");
    let table = text(&a.roster(&["members"]).stdout);
    assert!(table.lines().next().unwrap().contains("ZONE"), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("b ") && l.contains("eu-west-1b")),
        "{table}"
    );

    let h = http_url(&a);
    let members = curl(&[&format!("{h}/v1/members")]).json();
    let zones: Vec<&str> = members
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["zone"].as_str())
        .collect();
    assert_eq!(zones, ["eu-west-1a", "eu-west-1b", "default"]);
    let metrics = curl(&[&format!("{h}/metrics")]).body;
    for line in [
        "roster_zone{zone=\"eu-west-1a\"} 1",
        "roster_zone_members{zone=\"eu-west-1a\"} 1",
        "roster_zone_members{zone=\"eu-west-1b\"} 1",
        "roster_zone_members{zone=\"default\"} 1",
    ] {
        assert!(metrics.lines().any(|l| l == line), "no {line:?} in:\n{metrics}");
    }
}

#[test]
fn a_zone_that_is_not_a_dns_label_is_refused_by_name_before_the_agent_starts() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("a");
    let dir_arg = dir.to_str().unwrap();
    let flag = roster(&[
        "agent",
        "--data-dir",
        dir_arg,
        "--listen",
        "127.0.0.1:0",
        "--zone",
        "EU_1",
    ]);
    assert!(!flag.status.success());
    let err = text(&flag.stderr);
    assert!(
        err.contains("--zone") && err.contains("lowercase letters, digits and '-'"),
        "{err}"
    );

    let config = root.path().join("bad.toml");
    std::fs::write(&config, "node-name = \"a\"\nzone = \"eu 1\"\n").unwrap();
    let file = roster(&[
        "agent",
        "--data-dir",
        dir_arg,
        "--listen",
        "127.0.0.1:0",
        "--config",
        config.to_str().unwrap(),
    ]);
    assert!(!file.status.success());
    let err = text(&file.stderr);
    assert!(
        err.contains("bad.toml, line 2") && err.contains("\"eu 1\" is not a zone name"),
        "{err}"
    );
    assert!(!dir.exists(), "nothing was written for a refused start");
}

#[test]
fn get_near_and_near_put_the_instances_of_the_readers_zone_first() {
    let root = tempfile::tempdir().unwrap();
    let a = Agent::start(&root.path().join("a"), "a", &["--zone", "eu-1"]);
    let b = Agent::start(&root.path().join("b"), "b", &["--zone", "eu-2", "--join", &a.url]);
    assert!(a
        .roster(&["register", "web", "10.0.0.7:8080", "--id", "web-a"])
        .status
        .success());
    assert!(b
        .roster(&["register", "web", "10.0.0.8:8080", "--id", "web-b"])
        .status
        .success());
    let ids = |x: &Agent, args: &[&str]| -> Vec<String> {
        x.json(&[&["get", "web"], args].concat())
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["instance"].as_str().unwrap().to_string())
            .collect()
    };
    within(
        Duration::from_secs(10),
        "both instances and both zones known on a and b",
        || ids(&a, &[]).len() == 2 && ids(&b, &[]).len() == 2 && zone_of(&b, "a") == Some("eu-1".into()),
    );
    assert_eq!(ids(&b, &[]), ["web-a", "web-b"], "by id without --near");
    assert_eq!(ids(&b, &["--near"]), ["web-b", "web-a"], "b's own zone first");
    assert_eq!(ids(&b, &["--near", "eu-1"]), ["web-a", "web-b"]);
    assert_eq!(
        ids(&a, &["--near", "eu-3"]),
        ["web-a", "web-b"],
        "none in that zone: by id"
    );
    let bad = b.roster(&["get", "web", "--near", "EU"]);
    assert_eq!(bad.status.code(), Some(2), "a usage error");
    let err = text(&bad.stderr);
    assert!(err.contains("--near: zone \"EU\" is not a zone name"), "{err}");

    let h = http_url(&b);
    let near = curl(&[&format!("{h}/v1/services/web?near=_agent")]);
    let order: Vec<String> = near
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["instance"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(order, ["web-b", "web-a"]);
    let plain = curl(&[&format!("{h}/v1/services/web")]);
    assert_eq!(
        near.header("x-roster-index"),
        plain.header("x-roster-index"),
        "the index is the list's, whatever the order shown"
    );
    assert_eq!(
        curl(&[&format!("{h}/v1/services/web?near=Not%20a%20zone")]).error(400),
        "invalid"
    );
}

/// The statuses agent `x` lists for the instances of `web`, with `--all`, by instance.
fn statuses(x: &Agent) -> std::collections::BTreeMap<String, String> {
    let out = x.roster(&["get", "web", "--all", "--json"]);
    let list: Vec<Value> = match out.status.code() {
        Some(0) => serde_json::from_slice(&out.stdout).unwrap(),
        _ => Vec::new(),
    };
    list.iter()
        .map(|i| {
            (
                i["instance"].as_str().unwrap().to_string(),
                i["status"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// A whole zone of three lost at once (each SIGKILLed) is a zone cut off, as its peers in
/// another zone see it: its instances are listed as `unreachable` (not served, so a plain
/// `get` leaves them out), its members too; restarted, they are passing again.
#[test]
fn a_zone_lost_at_once_is_shown_unreachable_elsewhere_and_passing_again_when_it_is_back() {
    let root = tempfile::tempdir().unwrap();
    let o = Agent::start(&root.path().join("o"), "o", &["--zone", "z-o"]);
    let start = |name: &str| {
        Agent::start(
            &root.path().join(name),
            name,
            &["--zone", "z-a", "--join", &o.url],
        )
    };
    let zone: Vec<Agent> = ["a1", "a2", "a3"].iter().map(|n| start(n)).collect();
    for (i, a) in zone.iter().enumerate() {
        let id = format!("web-{i}");
        assert!(a
            .roster(&["register", "web", "10.0.0.7:8080", "--id", &id])
            .status
            .success());
    }
    let ids: Vec<String> = (0..3).map(|i| format!("web-{i}")).collect();
    let all_are = |x: &Agent, status: &str| {
        let now = statuses(x);
        ids.iter()
            .all(|id| now.get(id).map(String::as_str) == Some(status))
    };
    within(
        Duration::from_secs(15),
        "o lists the zone's instances passing",
        || all_are(&o, "passing"),
    );

    let dirs: Vec<_> = zone.into_iter().map(Agent::kill9).collect();
    within(
        Duration::from_secs(30),
        "o lists the lost zone's instances as unreachable",
        || all_are(&o, "unreachable"),
    );
    assert!(
        o.instances("web").is_empty(),
        "a plain get serves no unreachable instance"
    );
    let members = o.json(&["members"]);
    let unreachable = members
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["state"] == "unreachable")
        .count();
    assert_eq!(unreachable, 3, "{members}");

    let back: Vec<Agent> = dirs
        .iter()
        .zip(["a1", "a2", "a3"])
        .map(|((dir, _), name)| Agent::start(dir, name, &["--zone", "z-a", "--join", &o.url]))
        .collect();
    within(Duration::from_secs(20), "o lists them passing again", || {
        all_are(&o, "passing")
    });
    drop(back);
}

#[test]
fn damping_settings_that_do_not_fit_are_refused_by_name_before_the_agent_starts() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("a");
    let dir_arg = dir.to_str().unwrap();
    let base = ["agent", "--data-dir", dir_arg, "--listen", "127.0.0.1:0"];
    let window = roster(&[&base[..], &["--damping-window", "20m"]].concat());
    assert!(!window.status.success());
    let err = text(&window.stderr);
    assert!(
        err.contains("--damping-window 20m and --damping-bound 10m do not fit"),
        "{err}"
    );

    let share = roster(&[&base[..], &["--damping-share", "101"]].concat());
    assert!(!share.status.success());
    assert!(
        text(&share.stderr).contains("--damping-share"),
        "{}",
        text(&share.stderr)
    );

    let config = root.path().join("bad.toml");
    std::fs::write(&config, "node-name = \"a\"\ndamping-share = 150\n").unwrap();
    let file = roster(&[&base[..], &["--config", config.to_str().unwrap()]].concat());
    assert!(!file.status.success());
    let err = text(&file.stderr);
    assert!(
        err.contains("bad.toml, line 2") && err.contains("damping-share 150 is not a percentage"),
        "{err}"
    );
    assert!(!dir.exists(), "nothing was written for a refused start");
}
