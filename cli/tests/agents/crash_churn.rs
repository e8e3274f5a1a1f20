//! An agent SIGKILLed while its peer's changes stream in and its own writes are answered:
//! restarted, it has every own acknowledged write at once (from disk) and every peer's
//! change once it has caught up (what it had not saved is fetched again).

use std::sync::atomic::{AtomicBool, Ordering};

use super::*;

/// The peer's instances (written through `a`) and the victim's own (through `b`).
const PEER: &str = "peerchurn";
const OWN: &str = "ownchurn";

/// What `agent` holds of `service`: instance -> address.
fn held(agent: &Agent, service: &str) -> BTreeMap<String, String> {
    agent
        .instances(service)
        .iter()
        .map(|i| {
            (
                i["instance"].as_str().unwrap().to_string(),
                i["address"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Registers instance `<prefix><i mod keys>` of `service` at a new address through `url`,
/// again and again until `stop` is set or a write fails; the acknowledged ones go into
/// `acked`, and a failed one is returned (in flight: it may have happened or not).
fn churn(
    url: &str,
    service: &str,
    prefix: &str,
    keys: usize,
    acked: &mut BTreeMap<String, String>,
    stop: &AtomicBool,
) -> Option<(String, String)> {
    let mut i = 0usize;
    while !stop.load(Ordering::SeqCst) {
        let id = format!("{prefix}{}", i % keys);
        let addr = format!("127.0.0.1:{}", 1_000 + i % 60_000);
        let out = roster(&["register", service, &addr, "--id", &id, "--agent", url]);
        if !out.status.success() {
            return Some((id, addr));
        }
        acked.insert(id, addr);
        i += 1;
    }
    None
}

#[test]
fn an_agent_killed_during_churn_restarts_with_its_acknowledged_writes_and_every_peer_change() {
    let seed =
        test_seed("an_agent_killed_during_churn_restarts_with_its_acknowledged_writes_and_every_peer_change");
    let mut rng = Rng(seed);
    let root = tempfile::tempdir().unwrap();
    let a = Agent::start(&root.path().join("a"), "a", &[]);
    let b_args = ["--join", a.url.as_str(), "--crash-guard", "off"];
    let mut b = Agent::start(&root.path().join("b"), "b", &b_args);
    let mut peer_acked = BTreeMap::new();
    let mut own_acked = BTreeMap::new();
    for round in 0..3 {
        let ctx = format!("seed {seed}, round {round}");
        let (kill_after, peer_after) = (rng.millis(150, 900), rng.millis(0, 300));
        let stop_own = AtomicBool::new(false);
        let stop_peer = AtomicBool::new(false);
        let b_url = b.url.clone();
        let (a_url, b_url) = (a.url.as_str(), b_url.as_str());
        let (peers, owns) = (&mut peer_acked, &mut own_acked);
        let (stop_p, stop_o) = (&stop_peer, &stop_own);
        let (in_flight, (dir, port)) = std::thread::scope(|s| {
            let peer = s.spawn(move || churn(a_url, PEER, "p", 40, peers, stop_p));
            let own = s.spawn(move || churn(b_url, OWN, "w", 8, owns, stop_o));
            std::thread::sleep(kill_after);
            let killed = b.kill9();
            stop_own.store(true, Ordering::SeqCst);
            // The peer goes on a while: changes the killed agent misses altogether.
            std::thread::sleep(peer_after);
            stop_peer.store(true, Ordering::SeqCst);
            let failed = peer.join().unwrap();
            assert!(failed.is_none(), "{ctx}: a write to the peer failed: {failed:?}");
            (own.join().unwrap(), killed)
        });
        b = Agent::start_on(&dir, "b", &format!("127.0.0.1:{port}"), &b_args);

        // At once, from disk: every acknowledged own write (one in flight at the kill
        // either way).
        let got = held(&b, OWN);
        for (id, addr) in &own_acked {
            let either = in_flight
                .as_ref()
                .is_some_and(|(i, a)| i == id && got.get(id) == Some(a));
            assert!(
                got.get(id) == Some(addr) || either,
                "{ctx}: own {id} was acknowledged at {addr}, the restarted agent has {:?}",
                got.get(id)
            );
        }
        own_acked.clone_from(&got);

        // Every change of the peer's, fetched again where the crash lost it.
        assert_eq!(held(&a, PEER), peer_acked, "{ctx}: the peer's own view");
        let took = within(
            Duration::from_secs(10),
            &format!("{ctx}: b holds every peer change"),
            || held(&b, PEER) == peer_acked,
        );
        eprintln!(
            "{ctx}: {} peer instances, caught up {took:?} after the restart",
            peer_acked.len()
        );
    }
}
