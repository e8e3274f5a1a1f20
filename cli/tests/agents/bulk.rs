//! Writes in bulk through a real agent: a deploy from a file, found whole by the reads,
//! and an agent SIGKILLed while batches arrive keeps every batch it acknowledged.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use super::{test_seed, text, Agent, Rng};

/// Writes a JSON-lines file of `n` instances of `service`, ids `<prefix>-<i>`.
fn deploy_file(dir: &Path, name: &str, service: &str, prefix: &str, n: usize) -> PathBuf {
    let lines: Vec<String> = (0..n)
        .map(|i| {
            format!(
                r#"{{"service": "{service}", "address": "127.0.0.1:{}", "id": "{prefix}-{i}", "meta": {{"batch": "{prefix}"}}}}"#,
                1 + i % 60_000
            )
        })
        .collect();
    let path = dir.join(name);
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

fn from_file(agent: &Agent, path: &Path) -> std::process::Output {
    agent.roster(&["register", "--from-file", path.to_str().unwrap()])
}

#[test]
fn five_thousand_instances_from_a_file_are_all_listed_and_a_bad_line_sends_nothing() {
    let root = tempfile::tempdir().unwrap();
    let a = Agent::start(&root.path().join("a"), "a", &[]);
    let mut lines = Vec::new();
    for (s, n) in [("web", 3_000), ("api", 2_000)] {
        let f = deploy_file(root.path(), &format!("{s}.jsonl"), s, s, n);
        lines.push(std::fs::read_to_string(f).unwrap());
    }
    let all = root.path().join("deploy.jsonl");
    std::fs::write(&all, lines.concat()).unwrap();
    let out = from_file(&a, &all);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let ids: Vec<&str> = std::str::from_utf8(&out.stdout).unwrap().lines().collect();
    assert_eq!(ids.len(), 5_000);
    assert_eq!((ids[0], ids[4_999]), ("web-0", "api-1999"), "ids in file order");
    let ls: BTreeMap<String, u64> = a
        .json(&["ls"])
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["service"].as_str().unwrap().to_string(),
                v["instances"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(ls, BTreeMap::from([("api".into(), 2_000), ("web".into(), 3_000)]));
    let web = a.instances("web");
    assert_eq!(web.len(), 3_000);
    assert!(web.iter().all(|i| i["meta"]["batch"] == "web"), "metadata kept");

    // A bad line 4,000 refuses the file: nothing of it reaches the agent.
    let mut bad: Vec<String> = (0..4_500)
        .map(|i| {
            format!(
                r#"{{"service": "late", "address": "127.0.0.1:{}", "id": "l{i}"}}"#,
                i + 1
            )
        })
        .collect();
    bad[3_999] = r#"{"service": "late", "address": "127.0.0.1"}"#.to_string();
    let path = root.path().join("bad.jsonl");
    std::fs::write(&path, bad.join("\n")).unwrap();
    let out = from_file(&a, &path);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("bad.jsonl line 4000: invalid address"), "{err}");
    assert!(
        a.instances("late").is_empty(),
        "a refused file registered something"
    );
}

/// What the agent holds of the crash test's batches: instances by batch number.
fn batches_held(agent: &Agent) -> BTreeMap<usize, usize> {
    let mut out = BTreeMap::new();
    for i in agent.instances("bulk") {
        let id = i["instance"].as_str().unwrap();
        let k: usize = id
            .trim_start_matches('b')
            .split('-')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        *out.entry(k).or_default() += 1;
    }
    out
}

/// Each batch is one `roster register --from-file` of [`BATCH`] instances; the agent is
/// SIGKILLed at a seeded moment while they arrive, and restarted on its data directory.
const BATCH: usize = 500;

#[test]
fn an_agent_killed_during_bulk_writes_keeps_every_acknowledged_batch_whole() {
    let seed = test_seed("an_agent_killed_during_bulk_writes_keeps_every_acknowledged_batch_whole");
    let mut rng = Rng(seed);
    let root = tempfile::tempdir().unwrap();
    let args = ["--crash-guard", "off"];
    let mut agent = Agent::start(&root.path().join("a"), "a", &args);
    let files = root.path().join("files");
    std::fs::create_dir_all(&files).unwrap();
    let mut acked: Vec<usize> = Vec::new();
    let mut next = 0;
    for round in 0..3 {
        let ctx = format!("seed {seed}, round {round}");
        let stop = AtomicBool::new(false);
        let wait = rng.millis(200, 1_500);
        let url = agent.url.clone();
        let (done, in_flight, (dir, port)) = std::thread::scope(|s| {
            let (stop, files, start) = (&stop, &files, next);
            let writer = s.spawn(move || {
                let mut done = Vec::new();
                for k in start.. {
                    if stop.load(Ordering::SeqCst) {
                        return (done, None);
                    }
                    let f = deploy_file(files, &format!("b{k}.jsonl"), "bulk", &format!("b{k}"), BATCH);
                    let out =
                        super::roster(&["register", "--from-file", f.to_str().unwrap(), "--agent", &url]);
                    if !out.status.success() {
                        return (done, Some(k));
                    }
                    done.push(k);
                }
                unreachable!()
            });
            std::thread::sleep(wait);
            let killed = agent.kill9();
            stop.store(true, Ordering::SeqCst);
            let (done, in_flight) = writer.join().unwrap();
            (done, in_flight, killed)
        });
        next = done
            .last()
            .map_or(next, |k| k + 1)
            .max(in_flight.map_or(0, |k| k + 1));
        acked.extend(done);
        agent = Agent::start_on(&dir, "a", &format!("127.0.0.1:{port}"), &args);
        let held = batches_held(&agent);
        for k in &acked {
            assert_eq!(
                held.get(k),
                Some(&BATCH),
                "{ctx}: acknowledged batch {k} is not whole"
            );
        }
        // A batch in flight at the kill was saved in one transaction: all of it or none.
        for (k, n) in &held {
            assert!(
                acked.contains(k) || (Some(*k) == in_flight && *n == BATCH),
                "{ctx}: batch {k} holds {n} instances, acknowledged: {}",
                acked.contains(k)
            );
        }
        if let Some(k) = in_flight.filter(|k| held.contains_key(k)) {
            acked.push(k); // registered after all: it must stay
        }
        eprintln!("{ctx}: killed after {wait:?}; {} batches held", held.len());
    }
    assert!(
        !acked.is_empty(),
        "seed {seed}: no batch was acknowledged before a kill"
    );
}
