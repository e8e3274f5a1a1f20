//! `roster members`: a node that left shown apart from one that failed, on every agent.

use super::*;

/// How `x` lists the node named `name`, if it does.
fn state_of(x: &Agent, name: &str) -> Option<String> {
    x.json(&["members"])
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == name)
        .and_then(|m| m["state"].as_str().map(str::to_string))
}

/// Whether `x` has a link to the node named `name`.
fn linked(x: &Agent, name: &str) -> bool {
    x.json(&["status"])["peers"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["name"] == name)
}

fn everyone_shows(agents: &[&Agent], name: &str, state: &str) {
    for x in agents {
        within(Duration::from_secs(15), &format!("{name} {state}"), || {
            state_of(x, name).as_deref() == Some(state)
        });
    }
}

#[test]
fn members_shows_a_node_that_left_as_left_and_a_killed_one_as_failed_on_every_agent() {
    let root = tempfile::tempdir().unwrap();
    let names = ["a", "b", "c", "d"];
    // One outbound link each: four links at most among six pairs, so some agent hears of
    // a departure only through the others.
    let a = Agent::start(&root.path().join("a"), "a", &["--fanout", "1"]);
    let seed = a.url.clone();
    let join = ["--fanout", "1", "--join", &seed];
    let mut agents = vec![Some(a)];
    for n in &names[1..] {
        agents.push(Some(Agent::start(&root.path().join(n), n, &join)));
    }
    let all: Vec<&Agent> = agents.iter().flatten().collect();
    for x in &all {
        within(Duration::from_secs(10), "every agent lists four members", || {
            x.json(&["members"]).as_array().unwrap().len() == 4
        });
    }
    // An agent notes the members it has no link to at its reconnect round (every 10 s,
    // jittered); a node gone before that is not listed by it at all.
    std::thread::sleep(Duration::from_secs(13));
    let (leaver, watcher) = (0..4)
        .flat_map(|l| (0..4).map(move |w| (l, w)))
        .find(|&(l, w)| l != w && !linked(all[w], names[l]) && !linked(all[l], names[w]))
        .expect("four links among six pairs leave a pair unlinked");
    let killed = (0..4).find(|&k| k != leaver && k != watcher).unwrap();
    eprintln!("{} leaves; {} has no link to it", names[leaver], names[watcher]);
    drop(all);

    let out = agents[leaver].as_ref().unwrap().roster(&["leave"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut l = agents[leaver].take().unwrap();
    within(Duration::from_secs(10), "the leaver exits", || {
        l.child.try_wait().unwrap().is_some()
    });
    let (l_dir, l_port) = (l.dir.clone(), l.port);
    drop(l);
    let others: Vec<&Agent> = agents.iter().flatten().collect();
    everyone_shows(&others, names[leaver], "left");

    let (k_dir, k_port) = agents[killed].take().unwrap().kill9();
    let rest: Vec<&Agent> = agents.iter().flatten().collect();
    everyone_shows(&rest, names[killed], "failed");
    for x in &rest {
        assert_eq!(state_of(x, names[leaver]).as_deref(), Some("left"), "still left");
    }

    // Both come back from their disks: alive again, the one that left too.
    let seed = rest[0].url.clone();
    let back = |dir: &Path, name: &str, port: u16, extra: &[&str]| {
        let join = [&["--fanout", "1", "--join", &seed][..], extra].concat();
        Agent::start_on(dir, name, &format!("127.0.0.1:{port}"), &join)
    };
    let k = back(&k_dir, names[killed], k_port, &[]);
    let l = back(&l_dir, names[leaver], l_port, &["--leave-on-terminate"]);
    let mut all: Vec<&Agent> = agents.iter().flatten().collect();
    all.extend([&k, &l]);
    everyone_shows(&all, names[killed], "alive");
    everyone_shows(&all, names[leaver], "alive");

    drop(all);

    // SIGTERM with --leave-on-terminate is a departure too.
    assert!(l.terminate().success());
    let mut rest: Vec<&Agent> = agents.iter().flatten().collect();
    rest.push(&k);
    everyone_shows(&rest, names[leaver], "left");
}
