//! An agent SIGKILLed at any moment keeps every acknowledged write: a seeded writer and
//! checker.

use super::*;

/// The services the crash test writes to.
const CRASH_SERVICES: [&str; 3] = ["web", "db", "cache"];

/// A write that got no answer: it may have happened or not.
struct InFlight {
    key: Key,
    /// The address it registered, or `None` for a deregistration.
    to: Option<String>,
    /// When the client gave up, and what it said.
    failed_at: Instant,
    said: String,
}

/// One writer's keys and what it knows was acknowledged on them.
struct Writer {
    keys: Vec<Key>,
    acked: Regs,
    rng: Rng,
    port: u16,
}

impl Writer {
    fn new(n: usize, rng: Rng) -> Writer {
        let keys = CRASH_SERVICES
            .iter()
            .flat_map(|s| (0..3).map(move |i| (s.to_string(), format!("w{n}-{i}"))))
            .collect();
        Writer {
            keys,
            acked: Regs::new(),
            rng,
            port: 1_000 * (n as u16 + 1),
        }
    }

    /// Registers (at a new address) or deregisters random keys through `roster register`
    /// and `roster deregister`, at most `max` times, until `stop` is set or a write fails
    /// (the agent was killed): that write is returned, in flight.
    fn run(&mut self, url: &str, max: usize, stop: &std::sync::atomic::AtomicBool) -> Option<InFlight> {
        for _ in 0..max {
            if stop.load(std::sync::atomic::Ordering::SeqCst) {
                return None;
            }
            let key = self.keys[self.rng.below(self.keys.len() as u64) as usize].clone();
            let to = if self.acked.contains_key(&key) && self.rng.below(2) == 0 {
                None
            } else {
                self.port = self.port.wrapping_add(1).max(1);
                Some(format!("127.0.0.1:{}", self.port))
            };
            let out = match &to {
                Some(addr) => roster(&["register", &key.0, addr, "--id", &key.1, "--agent", url]),
                None => roster(&["deregister", &key.0, &key.1, "--agent", url]),
            };
            if !out.status.success() {
                return Some(InFlight {
                    key,
                    to,
                    failed_at: Instant::now(),
                    said: text(&out.stderr),
                });
            }
            match to {
                Some(addr) => self.acked.insert(key, addr),
                None => self.acked.remove(&key),
            };
        }
        None
    }
}

/// What an agent holds of the crash test's services.
fn regs(agent: &Agent) -> Regs {
    let mut out = Regs::new();
    for s in CRASH_SERVICES {
        for i in agent.instances(s) {
            let key = (s.to_string(), i["instance"].as_str().unwrap().to_string());
            out.insert(key, i["address"].as_str().unwrap().to_string());
        }
    }
    out
}

/// Serf 0.9.4 wrote its snapshot lazily, so an agent killed at the wrong moment could not
/// rejoin from it. Here an agent is SIGKILLed at seeded moments and restarted on its data
/// directory each time: its store opens, every acknowledged register and deregister holds
/// (a write in flight at the kill may have happened or not), it keeps its node id, and it
/// rejoins its peer, which then holds exactly what it holds. The seed fixes the schedule
/// (the kinds of moment, the delays, the writes); where a kill lands among the writes
/// still varies from run to run.
#[test]
fn an_agent_killed_at_any_moment_keeps_every_acknowledged_write_and_rejoins() {
    use std::sync::atomic::{AtomicBool, Ordering};

    let seed = test_seed("an_agent_killed_at_any_moment_keeps_every_acknowledged_write_and_rejoins");
    let mut rng = Rng(seed);
    let root = tempfile::tempdir().unwrap();
    let a = Agent::start(&root.path().join("a"), "a", &[]);
    let b_args = ["--join", a.url.as_str(), "--crash-guard", "off"];
    let mut b = Agent::start(&root.path().join("b"), "b", &b_args);
    let id = b.json(&["status"])["node"].clone();
    let mut writers = [Writer::new(0, Rng(rng.next())), Writer::new(1, Rng(rng.next()))];

    // Each kind of moment three times, in a seeded order.
    let mut kills = [Kill::Burst, Kill::AtStart, Kill::AfterWrite].repeat(3);
    for i in (1..kills.len()).rev() {
        kills.swap(i, rng.below(i as u64 + 1) as usize);
    }

    for (round, kill) in kills.into_iter().enumerate() {
        let ctx = format!("seed {seed}, round {round} ({kill:?})");
        let stop = AtomicBool::new(false);
        let (in_flight, killed_at, (dir, port)) = match kill {
            Kill::AfterWrite => {
                let n = 1 + rng.below(4) as usize;
                let w = &mut writers[rng.below(2) as usize];
                let failed = w.run(&b.url.clone(), n, &stop);
                if let Some(f) = failed {
                    panic!("{ctx}: a write failed while the agent was up: {}", f.said);
                }
                let killed_at = Instant::now();
                (Vec::new(), killed_at, b.kill9())
            }
            Kill::Burst | Kill::AtStart => {
                if let Kill::AtStart = kill {
                    let (dir, port) = b.kill9();
                    b = Agent::start_on(&dir, "b", &format!("127.0.0.1:{port}"), &b_args);
                }
                let wait = match kill {
                    Kill::AtStart => rng.millis(0, 60),
                    _ => rng.millis(20, 400),
                };
                let url = b.url.clone();
                std::thread::scope(|s| {
                    let running: Vec<_> = writers
                        .iter_mut()
                        .map(|w| {
                            let (url, stop) = (&url, &stop);
                            s.spawn(move || w.run(url, usize::MAX, stop))
                        })
                        .collect();
                    std::thread::sleep(wait);
                    let killed_at = Instant::now();
                    let killed = b.kill9();
                    stop.store(true, Ordering::SeqCst);
                    let in_flight: Vec<InFlight> =
                        running.into_iter().filter_map(|t| t.join().unwrap()).collect();
                    (in_flight, killed_at, killed)
                })
            }
        };
        for f in &in_flight {
            assert!(
                f.failed_at > killed_at,
                "{ctx}: a write failed while the agent was up: {}",
                f.said
            );
        }

        // Restarted on the same directory and port: the store opens (a corrupt one stops
        // the agent before it listens), and the same node is back.
        b = Agent::start_on(&dir, "b", &format!("127.0.0.1:{port}"), &b_args);
        assert_eq!(b.json(&["status"])["node"], id, "{ctx}: the node id changed");

        // At once, from disk: every acknowledged write, and for a write in flight its
        // outcome either way.
        let got = regs(&b);
        let acked: Regs = writers.iter().flat_map(|w| w.acked.clone()).collect();
        let keys: std::collections::BTreeSet<&Key> = got.keys().chain(acked.keys()).collect();
        for key in keys {
            let (had, has) = (acked.get(key), got.get(key));
            let either = in_flight
                .iter()
                .find(|f| &f.key == key)
                .is_some_and(|f| f.to.as_ref() == has);
            assert!(
                had == has || either,
                "{ctx}: {key:?} was acknowledged as {had:?}, the restarted agent has {has:?}"
            );
        }
        for w in &mut writers {
            w.acked = got
                .iter()
                .filter(|(k, _)| w.keys.contains(k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
        }
        let probes = b.instances("probe").len();
        assert_eq!(probes, round, "{ctx}: the probes of earlier rounds");
        let mut counts: BTreeMap<String, u64> = BTreeMap::new();
        for (s, _) in got.keys() {
            *counts.entry(s.clone()).or_default() += 1;
        }
        if round > 0 {
            counts.insert("probe".to_string(), round as u64);
        }
        let ls: BTreeMap<String, u64> = b
            .json(&["ls"])
            .as_array()
            .unwrap()
            .iter()
            .map(|x| {
                (
                    x["service"].as_str().unwrap().to_string(),
                    x["instances"].as_u64().unwrap(),
                )
            })
            .collect();
        assert_eq!(ls, counts, "{ctx}: `roster ls` on the restarted agent");

        // It rejoins: connected to its peer, listed alive by it, and the peer holds
        // exactly its registrations (what was lost in flight dropped, what was rewritten
        // updated), and a new one.
        let out = b.roster(&["register", "probe", "127.0.0.1:1", "--id", &format!("r{round}")]);
        assert!(out.status.success(), "{ctx}: {}", text(&out.stderr));
        within(
            Duration::from_secs(5),
            &format!("{ctx}: the peer holds what b holds"),
            || regs(&a) == got && a.instances("probe").len() == round + 1,
        );
        within(
            Duration::from_secs(5),
            &format!("{ctx}: the peer is connected to b"),
            || {
                a.json(&["status"])["peers"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|p| p["node"] == id)
            },
        );
        within(
            Duration::from_secs(5),
            &format!("{ctx}: the peer lists b alive"),
            || {
                a.json(&["members"])
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|m| m["node"] == id && m["name"] == "b" && m["state"] == "alive")
            },
        );
    }
}
