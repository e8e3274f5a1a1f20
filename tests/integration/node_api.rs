//! The embedded API as a service uses it: `roster::Node` on loopback.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use roster::api::{ClientMessage, EventView, Request, ServerMessage};
use roster::client::{Client, ClientError};
use roster::transport::handshake::Secret;
use roster::{Event, Node, Service};
use tokio_tungstenite::tungstenite::client::ClientRequestBuilder;
use tokio_tungstenite::tungstenite::Message as WsMessage;

const SECRET: &[u8] = b"sixteen-bytes-or-more-secret";

async fn node(dir: Option<&std::path::Path>, join: &[String]) -> Node {
    let mut b = Node::builder()
        .listen("127.0.0.1:0")
        .join(join.iter().cloned())
        .gossip_interval(Duration::from_millis(100))
        .lease_ttl(Duration::from_secs(3));
    if let Some(d) = dir {
        b = b.data_dir(d);
    }
    b.start().await.unwrap()
}

/// An agent on a free loopback port that asks every client, loopback too, for the secret.
async fn agent_requiring_the_secret() -> Node {
    Node::builder()
        .listen("127.0.0.1:0")
        .cluster_secret(SECRET)
        .serve_clients(true)
        .require_client_auth(true)
        .start()
        .await
        .unwrap()
}

/// Polls `done` every 10 ms; whether it held within `limit`.
async fn within(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    tokio::time::timeout(limit, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .is_ok()
}

async fn next_event(w: &mut roster::Watch) -> Event {
    tokio::time::timeout(Duration::from_secs(5), w.next())
        .await
        .expect("an event within 5 s")
        .expect("the watch is open")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_is_found_watched_and_dropping_its_handle_deregisters_it() {
    let dir = tempfile::tempdir().unwrap();
    let a = node(Some(dir.path()), &[]).await;
    let b = node(None, &[a.url().to_string()]).await;
    let mut changes = b.watch("web");

    let reg = a
        .register(
            Service::new("web", "127.0.0.1:8080")
                .meta("zone", "a")
                .id("web-1"),
        )
        .await
        .unwrap();
    assert_eq!(reg.id(), "web-1");
    // Read-your-writes on the registering node, at once.
    assert_eq!(a.lookup("web").len(), 1);
    match next_event(&mut changes).await {
        Event::Up(i) => {
            assert_eq!((i.id.as_str(), i.address.as_str()), ("web-1", "127.0.0.1:8080"));
            assert_eq!(i.meta.get("zone").map(String::as_str), Some("a"));
            assert_eq!(i.node, a.id());
        }
        other => panic!("expected up, got {other:?}"),
    }
    let found = b.lookup("web");
    assert_eq!(found.len(), 1);
    assert_eq!(b.services(), vec![("web".to_string(), 1)]);

    drop(reg);
    match next_event(&mut changes).await {
        Event::Down { service, id, address } => assert_eq!(
            (service.as_str(), id.as_str(), address.as_str()),
            ("web", "web-1", "127.0.0.1:8080")
        ),
        other => panic!("expected down, got {other:?}"),
    }
    assert!(b.lookup("web").is_empty());
    // A watch started now sees the current instances first.
    let again = a
        .register(Service::new("web", "127.0.0.1:8081").id("web-2"))
        .await
        .unwrap();
    assert!(within(Duration::from_secs(5), || !b.lookup("web").is_empty()).await);
    let mut late = b.watch("web");
    assert!(matches!(next_event(&mut late).await, Event::Up(i) if i.id == "web-2"));
    again.deregister().await.unwrap();
    b.shutdown().await.unwrap();
    a.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_resumes_its_identity_and_registrations_from_its_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let a = node(Some(dir.path()), &[]).await;
    let id = a.id();
    let instance = a
        .register_owned(Service::new("db", "127.0.0.1:5432"))
        .await
        .unwrap();
    let kept = a.register(Service::new("cache", "127.0.0.1:6379")).await.unwrap();
    kept.keep();
    let gone = a.register(Service::new("tmp", "127.0.0.1:1")).await.unwrap();
    gone.deregister().await.unwrap();
    a.shutdown().await.unwrap();

    let a = node(Some(dir.path()), &[]).await;
    assert_eq!(a.id(), id, "the identity survives a restart");
    let dbs = a.lookup("db");
    assert_eq!(dbs.len(), 1);
    assert_eq!(dbs[0].id, instance);
    assert_eq!(a.lookup("cache").len(), 1, "a kept registration comes back");
    assert!(a.lookup("tmp").is_empty(), "a deregistered one does not");
    a.deregister("db", &instance).await.unwrap();
    assert!(matches!(
        a.deregister("db", &instance).await,
        Err(roster::Error::NotFound(_))
    ));
    a.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_to_register_is_refused_and_changes_nothing() {
    let a = node(None, &[]).await;
    use roster::registry::InvalidInput as I;
    // The registry's rules come back typed (`Error::Input`), the node's own as a message.
    let typed = |r: &Result<_, roster::Error>, want: fn(&I) -> bool| matches!(r, Err(e) if e.is_invalid() && e.invalid_input().is_some_and(want));
    for (s, want) in [
        (
            Service::new("Not Valid", "127.0.0.1:1"),
            Some((|e| matches!(e, I::ServiceName { .. })) as fn(&I) -> bool),
        ),
        (
            Service::new("web", "nohost"),
            Some(|e| matches!(e, I::Endpoint { .. })),
        ),
        (
            Service::new("web", "127.0.0.1:1").meta("k", "v".repeat(5_000)),
            Some(|e| matches!(e, I::Metadata { .. })),
        ),
        (
            Service::new("web", "127.0.0.1:1").id("has space"),
            Some(|e| matches!(e, I::ProviderId { .. })),
        ),
        (Service::new("roster", "127.0.0.1:1"), None),
        (
            Service::new("web", "127.0.0.1:1").ttl(Duration::from_millis(10)),
            None,
        ),
    ] {
        let r = a.register(s.clone()).await.map(drop);
        match want {
            Some(want) => assert!(typed(&r, want), "{s:?}: {r:?}"),
            None => assert!(matches!(r, Err(roster::Error::Invalid(_))), "{s:?}: {r:?}"),
        }
    }
    assert!(a.services().is_empty());
    assert!(matches!(
        Node::builder().listen("127.0.0.1:0").fanout(0).start().await,
        Err(roster::Error::Setting { name: "fanout", .. })
    ));
    assert!(matches!(
        Node::builder()
            .listen("127.0.0.1:0")
            .join(["http://x:1"])
            .start()
            .await,
        Err(roster::Error::Setting { name: "join", .. })
    ));
    assert!(matches!(
        Node::builder()
            .listen("127.0.0.1:0")
            .advertise("nowhere")
            .start()
            .await,
        Err(roster::Error::Setting {
            name: "advertise",
            ..
        })
    ));
    assert!(matches!(
        Node::builder()
            .listen("127.0.0.1:0")
            .cluster_secret("short")
            .start()
            .await,
        Err(roster::Error::Invalid(_))
    ));
    a.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_prove_the_secret_when_the_agent_asks_and_garbage_is_cut() {
    let a = agent_requiring_the_secret().await;
    let url = a.url().to_string();
    let no = Client::connect(&url, None).await.unwrap_err();
    assert!(matches!(no, ClientError::Unauthorized { .. }), "{no}");
    assert!(no.to_string().contains("--cluster-secret-file"), "{no}");
    let wrong = Secret::new(b"another-secret-of-enough-bytes".to_vec()).unwrap();
    let bad = Client::connect(&url, Some(&wrong)).await.unwrap_err();
    assert!(matches!(bad, ClientError::Unauthorized { .. }), "{bad}");

    // Garbage after the upgrade: the agent cuts that client and keeps serving.
    let req =
        ClientRequestBuilder::new(url.parse().unwrap()).with_sub_protocol(roster::api::CLIENT_SUBPROTOCOL);
    let (mut ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
    let _hello = ws.next().await;
    ws.send(WsMessage::binary(vec![0xff; 100])).await.unwrap();
    let end = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match ws.next().await {
                None | Some(Err(_)) | Some(Ok(WsMessage::Close(_))) => break,
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
    assert!(end.is_ok(), "the agent closes a client that sent garbage");

    let right = Secret::new(SECRET.to_vec()).unwrap();
    let mut c = Client::connect(&url, Some(&right)).await.unwrap();
    assert_eq!(
        c.request(Request::Services).await.unwrap(),
        ServerMessage::Services(vec![])
    );
    // One connection serves request after request (authenticated once), a watch too.
    let register = |port: u16| Request::Register {
        service: "web".into(),
        address: format!("10.0.0.1:{port}"),
        meta: vec![],
        instance: Some("web-1".into()),
        ttl_ms: None,
        checks: vec![],
    };
    for port in [8080, 8081] {
        assert_eq!(
            c.request(register(port)).await.unwrap(),
            ServerMessage::Registered {
                instance: "web-1".into()
            }
        );
    }
    match c
        .request(Request::Instances {
            service: "web".into(),
            all: false,
            near: None,
        })
        .await
        .unwrap()
    {
        ServerMessage::Instances(is) => {
            assert_eq!(is.len(), 1);
            assert_eq!(is[0].address, "10.0.0.1:8081");
        }
        other => panic!("{other:?}"),
    }
    match c
        .request(Request::Watch {
            service: "web".into(),
            all: false,
        })
        .await
        .unwrap()
    {
        ServerMessage::Event(EventView::Up(i)) => assert_eq!(i.address, "10.0.0.1:8081"),
        other => panic!("{other:?}"),
    }
    a.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_ends_when_its_node_shuts_down_and_a_sync_without_peers_is_not_throttled() {
    let a = Node::builder()
        .listen("127.0.0.1:0")
        .sync_min_interval(Duration::from_secs(3600))
        .start()
        .await
        .unwrap();
    // No peer: nothing was asked, so the throttle is not used up.
    assert!(!a.sync().await.unwrap());
    assert!(!a.sync().await.unwrap());
    let mut w = a.watch("web");
    a.shutdown().await.unwrap();
    let end = tokio::time::timeout(Duration::from_secs(5), w.next()).await;
    assert!(matches!(end, Ok(None)), "the watch ends: {end:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_refuses_a_key_given_twice_a_ttl_over_a_day_and_hosts_that_are_not_hosts() {
    let a = Node::builder()
        .listen("127.0.0.1:0")
        .serve_clients(true)
        .start()
        .await
        .unwrap();
    let mut c = Client::connect(a.url(), None).await.unwrap();
    let register = |address: &str, meta: Vec<(&str, &str)>, ttl_ms: Option<u64>| Request::Register {
        service: "web".into(),
        address: address.into(),
        meta: meta
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        instance: Some("web-1".into()),
        ttl_ms,
        checks: vec![],
    };
    for (req, needle) in [
        (
            register("10.0.0.1:80", vec![("zone", "a"), ("zone", "b")], None),
            "given twice",
        ),
        (register("10.0.0.1:80", vec![("zone", "a\nb")], None), "printable"),
        (
            register("10.0.0.1:80", vec![], Some(24 * 3600 * 1000 + 1)),
            "at most 24h",
        ),
        (register("`$(id)`;rm:80", vec![], None), "invalid address"),
    ] {
        match c.request(req).await.unwrap() {
            ServerMessage::Error { kind, message, .. } => {
                assert_eq!(kind, roster::api::ErrorKind::Invalid, "{message}");
                assert!(message.contains(needle), "{message:?} does not say {needle:?}");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
    assert_eq!(
        c.request(Request::Services).await.unwrap(),
        ServerMessage::Services(vec![])
    );
    // The embedded API refuses the same.
    let twice = a
        .register(Service::new("web", "10.0.0.1:80").meta("k", "1").meta("k", "2"))
        .await;
    assert!(
        matches!(&twice, Err(e) if matches!(e.invalid_input(), Some(roster::registry::InvalidInput::Metadata { .. }))),
        "{twice:?}"
    );
    let long = a
        .register(Service::new("web", "10.0.0.1:80").ttl(Duration::from_secs(25 * 3600)))
        .await;
    assert!(matches!(long, Err(roster::Error::Invalid(_))), "{long:?}");
    assert!(a.lookup("web").is_empty());
    a.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_does_not_prove_the_secret_gets_no_proof_from_the_agent() {
    let a = agent_requiring_the_secret().await;
    let wrong = Secret::new(b"a guessed secret of enough bytes".to_vec()).unwrap();
    for attempt in ["no proof", "a wrong proof"] {
        let req = ClientRequestBuilder::new(a.url().parse().unwrap())
            .with_sub_protocol(roster::api::CLIENT_SUBPROTOCOL);
        let (mut ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
        let Some(Ok(WsMessage::Binary(hello))) = ws.next().await else {
            panic!("no hello")
        };
        let ServerMessage::Hello(hello) = roster::api::decode(&hello).unwrap() else {
            panic!("not a hello")
        };
        let msg = if attempt == "no proof" {
            ClientMessage::Request(Request::Services)
        } else {
            let nonce = [5; roster::api::NONCE_LEN];
            let proof = wrong.prove(roster::api::CLIENT_LABEL, &[&hello.nonce, &nonce]);
            ClientMessage::Auth { nonce, proof }
        };
        ws.send(WsMessage::binary(roster::api::encode(&msg)))
            .await
            .unwrap();
        // Everything the agent sends until it closes: an error, never its proof.
        let mut answers = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), async {
            while let Some(Ok(m)) = ws.next().await {
                if let WsMessage::Binary(b) = m {
                    answers.push(roster::api::decode::<ServerMessage>(&b).unwrap());
                }
            }
        })
        .await
        .expect("the agent closes within 5 s");
        assert!(
            matches!(
                answers.as_slice(),
                [ServerMessage::Error {
                    kind: roster::api::ErrorKind::Unauthorized,
                    ..
                }]
            ),
            "{attempt}: {answers:?}"
        );
    }
    a.shutdown().await.unwrap();
}

/// How long the lease of a lone node's registration runs, as a lookup shows it.
async fn lease_of_a_lone_node(per_member: Option<Duration>) -> Duration {
    let mut b = Node::builder()
        .listen("127.0.0.1:0")
        .lease_ttl(Duration::from_secs(3));
    if let Some(d) = per_member {
        b = b.lease_per_member(d);
    }
    let node = b.start().await.unwrap();
    let _reg = node
        .register(Service::new("web", "127.0.0.1:8080").id("web-1"))
        .await
        .unwrap();
    let found = node.lookup("web");
    let i = found.first().expect("the registration is found");
    let lease = i.lease_expires_at.duration_since(i.registered_at).unwrap();
    node.shutdown().await.unwrap();
    lease
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_grows_per_member_unless_that_is_set_to_zero() {
    // One member (itself): 24 s by default (from a lease issued just before the write),
    // more than the 3 s asked.
    let grown = lease_of_a_lone_node(None).await;
    assert!(
        grown > Duration::from_secs(20),
        "default lease of a lone node: {grown:?}"
    );
    // Zero per member: the lease asked, whatever the size.
    let kept = lease_of_a_lone_node(Some(Duration::ZERO)).await;
    assert!(
        kept <= Duration::from_secs(3),
        "a lease of 3 s with nothing per member: {kept:?}"
    );
    // Past the longest lease is refused by name.
    let err = Node::builder()
        .listen("127.0.0.1:0")
        .lease_per_member(Duration::from_secs(25 * 3600))
        .start()
        .await
        .expect_err("refused");
    assert!(err.to_string().contains("lease per member"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deregistration_just_before_shutdown_reaches_peers_before_the_farewell() {
    // A lease far longer than the test: only the pushed removal can take it away.
    let start = |join: Vec<String>| {
        Node::builder()
            .listen("127.0.0.1:0")
            .join(join)
            .gossip_interval(Duration::from_millis(100))
            .lease_ttl(Duration::from_secs(600))
            .start()
    };
    let b = start(vec![]).await.unwrap();
    let a = start(vec![b.url().to_string()]).await.unwrap();
    let reg = a
        .register(Service::new("web", "127.0.0.1:8080").id("web-1"))
        .await
        .unwrap();
    assert!(
        within(Duration::from_secs(10), || !b.lookup("web").is_empty()).await,
        "the registration reaches b"
    );
    reg.deregister().await.unwrap();
    a.shutdown().await.unwrap();
    assert!(
        within(Duration::from_secs(10), || b.lookup("web").is_empty()).await,
        "b still lists web-1 after a deregistered it and shut down: {:?}",
        b.lookup("web")
    );
    b.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_sent_without_waiting_are_answered_in_order_and_registrations_before_a_read_are_in_it() {
    let dir = tempfile::tempdir().unwrap();
    let a = Node::builder()
        .listen("127.0.0.1:0")
        .data_dir(dir.path())
        .serve_clients(true)
        .start()
        .await
        .unwrap();
    let mut c = Client::connect(a.url(), None).await.unwrap();
    let register = |id: &str, port: u16| Request::Register {
        service: "web".into(),
        address: format!("10.0.0.1:{port}"),
        meta: vec![],
        instance: Some(id.into()),
        ttl_ms: None,
        checks: vec![],
    };
    // More than the agent reads ahead, a bad one among them, a write to one instance
    // twice, then a removal and a read that must see every write before it.
    let mut sent = Vec::new();
    for i in 0..200u16 {
        sent.push(register(&format!("w{i}"), 1000 + i));
    }
    sent.insert(50, register("bad", 0));
    sent.push(register("w3", 9));
    sent.push(Request::Deregister {
        service: "web".into(),
        instance: "w0".into(),
    });
    sent.push(Request::Instances {
        service: "web".into(),
        all: false,
        near: None,
    });
    for r in &sent {
        c.start(r.clone()).await.unwrap();
    }
    for r in &sent {
        let answer = tokio::time::timeout(Duration::from_secs(10), c.recv())
            .await
            .unwrap()
            .unwrap();
        match (r, answer) {
            (
                Request::Register {
                    instance, address, ..
                },
                answer,
            ) if address.ends_with(":0") => {
                assert!(
                    matches!(answer, ServerMessage::Error { .. }),
                    "{instance:?}: {answer:?}"
                );
            }
            (Request::Register { instance, .. }, ServerMessage::Registered { instance: got }) => {
                assert_eq!(instance.as_deref(), Some(got.as_str()));
            }
            (Request::Deregister { .. }, ServerMessage::Deregistered) => {}
            (Request::Instances { .. }, ServerMessage::Instances(list)) => {
                assert_eq!(list.len(), 199, "w1..w199");
                assert!(list.iter().all(|i| i.instance != "w0" && i.instance != "bad"));
                let w3 = list.iter().find(|i| i.instance == "w3").unwrap();
                assert_eq!(w3.address, "10.0.0.1:9");
            }
            (r, answer) => panic!("{r:?} answered {answer:?}"),
        }
    }
    a.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_node_told_no_address_listens_on_a_free_loopback_port_not_the_agents() {
    let a = Node::builder().start().await.unwrap();
    let addr = a.local_addr();
    assert!(addr.ip().is_loopback(), "{addr}");
    assert_ne!(addr.port(), 7420, "the agent's default port");
    assert!(a.url().ends_with(&format!(":{}", addr.port())), "{}", a.url());
    a.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_is_synced_once_it_caught_up_with_a_peer_and_reads_then_show_the_cluster() {
    let a = node(None, &[]).await;
    assert!(a.is_synced(), "a node without seeds has nobody to wait for");
    let regs = a
        .register_many(
            (0..50)
                .map(|i| Service::new("web", format!("10.0.0.1:{}", 1000 + i)).id(format!("w{i}")))
                .collect(),
        )
        .await
        .unwrap();
    let b = node(None, &[a.url().to_string()]).await;
    assert!(b.synced(Duration::from_secs(10)).await, "b caught up with a");
    // At once, no polling: what a held when b caught up shows in b's reads.
    assert_eq!(b.lookup("web").len(), 50);
    assert!(b.status().await.unwrap().synced);

    // A node whose only seed answers nowhere is not synced, and says so.
    let lone = node(None, &["ws://127.0.0.1:1".to_string()]).await;
    assert!(!lone.synced(Duration::from_millis(500)).await);
    assert!(!lone.status().await.unwrap().synced);
    drop(regs);
    for n in [lone, b, a] {
        n.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_returned_from_main_prints_its_one_line_message() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let e = Node::builder().listen(&addr).start().await.unwrap_err();
    // `fn main() -> Result<(), Box<dyn Error>>` prints `Error: {:?}`.
    let boxed: Box<dyn std::error::Error> = Box::new(e);
    let printed = format!("{boxed:?}");
    assert_eq!(printed, boxed.to_string());
    assert!(
        printed.starts_with(&format!("cannot listen on {addr}")),
        "{printed}"
    );
    assert!(printed.contains("pick another --listen address"), "{printed}");
    assert_eq!(printed.lines().count(), 1, "{printed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deregistration_returns_once_its_change_was_handed_to_every_connected_peer() {
    let a = node(None, &[]).await;
    let b = node(None, &[a.url().to_string()]).await;
    let web = || Service::new("web", "127.0.0.1:80").id("web-1");
    let first = a.register(web()).await.unwrap();
    assert!(within(Duration::from_secs(10), || b.lookup("web").len() == 1).await);
    let mut reg = Some(first);
    for round in 0..20 {
        let r = match reg.take() {
            Some(r) => r,
            None => a.register(web()).await.unwrap(),
        };
        r.deregister().await.unwrap();
        // At once, before any timer of the node runs again: its push went to b.
        let (head, through) = a
            .transport()
            .inspect(|n, _| (n.buffer_head(), n.pushed_through()))
            .await
            .unwrap();
        assert!(
            through >= head,
            "round {round}: pushed through {through}, head {head}"
        );
    }
    b.shutdown().await.unwrap();
    a.shutdown().await.unwrap();
}
