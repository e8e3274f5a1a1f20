//! Real nodes over loopback WebSockets, each on `127.0.0.1:0` with short intervals:
//! convergence through a seed, refusal of a wrong secret or cluster, limits on what a raw
//! client sends, and the farewell of a node that shuts down (full states in chunks:
//! `transport_chunks`; TLS: `transport_tls`).
//!
//! Waits poll for a condition with a generous timeout and return as soon as it holds, so
//! the tests assert behaviour, not timing. Every test shuts down every node it started.

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::{SinkExt, StreamExt};
use roster_registry::{Endpoint, Metadata, ProviderId, Replica, ReplicaId, ServiceName};
use roster_transport::backoff::BackoffPolicy;
use roster_transport::driver::{self, DriverConfig, Handle};
use roster_transport::handshake::{self, HandshakeConfig, HandshakeMessage, Secret};
use roster_transport::message::{Envelope, Message};
use roster_transport::proto::{Config, NodeInfo, MEMBERS_SERVICE};
use roster_transport::registry::Hlc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{sleep, timeout, Instant};
use tokio_tungstenite::tungstenite::client::ClientRequestBuilder;
use tokio_tungstenite::tungstenite::http::Uri;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::WebSocketStream;
use tokio_util::sync::CancellationToken;

use crate::transport_chunks::whole;

pub(crate) const SECRET: &str = "loopback test secret, 32 bytes..";
pub(crate) const CLUSTER: &str = "loopback";
/// How long any wait may take before the test fails; conditions usually hold in well
/// under a second.
pub(super) const PATIENCE: Duration = Duration::from_secs(20);

pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// A configuration with short intervals, so a test takes seconds.
pub(crate) fn config(name: &str, secret: Option<&str>) -> DriverConfig {
    let mut c = DriverConfig::new(CLUSTER, name);
    c.secret = secret.map(|s| Secret::new(s).unwrap());
    c.protocol = Config {
        gossip_interval_ms: 50,
        digest_interval_ms: 500,
        member_lease_ttl_ms: 30_000,
        expire_holdoff_ms: 60_000,
        rotate_interval_ms: 0,
        backoff: BackoffPolicy {
            base_ms: 50,
            cap_ms: 1_000,
            auth_cap_ms: 60_000,
            healthy_after_ms: 1_000,
            jitter_permille: 500,
            reconnect_spread_ms: 200,
        },
        ..Config::default()
    };
    c
}

pub(crate) async fn start(id: u64, config: DriverConfig, seeds: &[&Handle]) -> Handle {
    start_with(Replica::new(ReplicaId(id)), config, seeds).await
}

/// Starts a node that resumes `replica`.
pub(crate) async fn start_with(replica: Replica, config: DriverConfig, seeds: &[&Handle]) -> Handle {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let seeds = seeds.iter().map(|h| h.info().url.clone()).collect();
    driver::start(listener, config, replica, seeds, CancellationToken::new()).unwrap()
}

/// Waits until `cond` holds, polling; fails the test after [`PATIENCE`].
pub(crate) async fn eventually(what: &str, cond: impl FnMut() -> bool) {
    eventually_within(PATIENCE, what, cond).await;
}

/// [`eventually`] with a patience of its own, for a wait that moves far more than usual.
pub(crate) async fn eventually_within(patience: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + patience;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "timed out after {patience:?} waiting for {what}"
        );
        sleep(Duration::from_millis(20)).await;
    }
}

pub(super) async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    timeout(PATIENCE, f)
        .await
        .unwrap_or_else(|_| panic!("timed out after {PATIENCE:?}: {what}"))
}

pub(crate) fn shows(node: &Handle, service: &str, provider: &str) -> bool {
    let service = ServiceName::new(service).unwrap();
    let replica = node.replica();
    let found = replica
        .instances(&service, now_ms())
        .any(|i| i.provider.as_str() == provider);
    found
}

pub(crate) fn members(node: &Handle) -> usize {
    let service = ServiceName::new(MEMBERS_SERVICE).unwrap();
    let replica = node.replica();
    let count = replica.instances(&service, now_ms()).count();
    count
}

pub(crate) async fn register(node: &Handle, service: &str, provider: &str, port: u16) {
    node.register(
        ServiceName::new(service).unwrap(),
        ProviderId::new(provider).unwrap(),
        Endpoint::new("10.1.2.3", port).unwrap(),
        Metadata::new(),
    )
    .await
    .unwrap();
}

pub(crate) async fn shutdown_all(nodes: &[&Handle]) {
    for n in nodes {
        within("a node to shut down", n.shutdown()).await;
        assert!(n.is_stopped());
    }
}

/// Three nodes (A the seed of B and C) that know each other and see each other's members.
pub(crate) async fn cluster_of_three(secret: Option<&str>) -> (Handle, Handle, Handle) {
    let a = start(1, config("a", secret), &[]).await;
    let b = start(2, config("b", secret), &[&a]).await;
    let c = start(3, config("c", secret), &[&a]).await;
    eventually("every node to see three members", || {
        [&a, &b, &c].iter().all(|n| members(n) == 3)
    })
    .await;
    (a, b, c)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_joined_through_a_seed_converge() {
    let (a, b, c) = cluster_of_three(Some(SECRET)).await;
    register(&c, "web", "web-1", 8080).await;
    // A local write is readable at once.
    assert!(shows(&c, "web", "web-1"));
    eventually("the registration on C to reach A and B", || {
        shows(&a, "web", "web-1") && shows(&b, "web", "web-1")
    })
    .await;
    let mut events = b.subscribe();
    register(&a, "db", "db-1", 5432).await;
    let up = within("B to hear of db-1", async {
        loop {
            if let roster_registry::Change::Up(i) = &*events.recv().await.unwrap() {
                if i.provider.as_str() == "db-1" {
                    return i.clone();
                }
            }
        }
    })
    .await;
    assert_eq!(up.endpoint.port(), 5432);
    assert!(c
        .deregister(
            ServiceName::new("web").unwrap(),
            ProviderId::new("web-1").unwrap()
        )
        .await
        .unwrap());
    eventually("the deregistration to reach A and B", || {
        !shows(&a, "web", "web-1") && !shows(&b, "web", "web-1")
    })
    .await;
    for n in [&a, &b, &c] {
        let counters = n.counters();
        assert!(counters.protocol.connections >= 1, "{counters:?}");
        assert_eq!(counters.driver.handshakes_refused, 0, "{counters:?}");
    }
    shutdown_all(&[&a, &b, &c]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_without_a_secret_converge_on_loopback() {
    let (a, b, c) = cluster_of_three(None).await;
    register(&b, "cache", "cache-1", 6379).await;
    eventually("the registration to reach A and C", || {
        shows(&a, "cache", "cache-1") && shows(&c, "cache", "cache-1")
    })
    .await;
    shutdown_all(&[&a, &b, &c]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_a_secret_may_not_listen_beyond_loopback() {
    let listener = TcpListener::bind("0.0.0.0:0").await.unwrap();
    let e = driver::start(
        listener,
        config("open", None),
        Replica::new(ReplicaId(9)),
        vec![],
        CancellationToken::new(),
    )
    .unwrap_err();
    assert!(matches!(e, driver::StartError::Unauthenticated { .. }), "{e}");
    assert!(e.to_string().contains("loopback"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_a_wrong_secret_is_refused_and_does_not_join() {
    let a = start(1, config("a", Some(SECRET)), &[]).await;
    let b = start(2, config("b", Some("a different secret, also long")), &[&a]).await;
    // A, the listener, checks B's proof with its own secret and refuses (it proves nothing
    // to B); B hears the refusal.
    eventually("the refusal to be counted on both sides", || {
        let (a, b) = (a.counters().driver, b.counters().driver);
        a.handshakes_refused >= 1 && b.dial_failures >= 1 && b.handshakes_rejected >= 1
    })
    .await;
    // A node with no secret at all is refused too.
    let c = start(3, config("c", None), &[&a]).await;
    eventually("the refusal of a node without a secret", || {
        c.counters().driver.handshakes_rejected >= 1 && a.counters().driver.handshakes_refused >= 2
    })
    .await;
    assert!(a.connected().is_empty() && b.connected().is_empty() && c.connected().is_empty());
    assert_eq!(members(&a), 1, "A must not learn of B or C");
    assert_eq!((members(&b), members(&c)), (1, 1));
    assert_eq!(a.counters().protocol.connections, 0);
    shutdown_all(&[&a, &b, &c]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_of_another_cluster_is_refused() {
    let a = start(1, config("a", Some(SECRET)), &[]).await;
    let mut other = config("b", Some(SECRET));
    other.cluster = "elsewhere".into();
    let b = start(2, other, &[&a]).await;
    eventually("A to refuse B's cluster and B to hear why", || {
        a.counters().driver.handshakes_refused >= 1 && b.counters().driver.handshakes_rejected >= 1
    })
    .await;
    assert!(a.connected().is_empty() && b.connected().is_empty());
    assert_eq!((members(&a), members(&b)), (1, 1));
    shutdown_all(&[&a, &b]).await;
}

/// A WebSocket client that speaks the subprotocol and nothing else.
pub(crate) async fn raw_client(node: &Handle) -> WebSocketStream<TcpStream> {
    let tcp = TcpStream::connect(node.local_addr()).await.unwrap();
    let uri: Uri = node.info().url.parse().unwrap();
    let request = ClientRequestBuilder::new(uri).with_sub_protocol("roster.v1");
    tokio_tungstenite::client_async(request, tcp).await.unwrap().0
}

/// A raw client that authenticates as a node with the cluster secret.
pub(crate) async fn authenticated_client(node: &Handle) -> WebSocketStream<TcpStream> {
    let mut ws = raw_client(node).await;
    let cfg = HandshakeConfig {
        cluster: CLUSTER.into(),
        node: NodeInfo {
            id: ReplicaId(0xbad),
            name: "raw".into(),
            url: "ws://127.0.0.1:9".into(),
            zone: Default::default(),
        },
        secret: Some(Secret::new(SECRET).unwrap()),
        max_skew_ms: 5_000,
    };
    let (mut client, hello) = handshake::Client::start(&cfg, [7; handshake::NONCE_LEN], now_ms());
    ws.send(WsMessage::binary(hello.encode())).await.unwrap();
    let challenge = HandshakeMessage::decode(&next_binary(&mut ws).await).unwrap();
    let (_, proof) = client.on_challenge(challenge, now_ms()).unwrap();
    ws.send(WsMessage::binary(proof.encode())).await.unwrap();
    let outcome = HandshakeMessage::decode(&next_binary(&mut ws).await).unwrap();
    client.on_outcome(outcome).unwrap();
    ws
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dialer_that_does_not_prove_the_secret_gets_no_proof_from_a_node() {
    let a = start(1, config("a", Some(SECRET)), &[]).await;
    // Dialers without the secret: one sends no proof, one a proof under a guessed secret.
    for guess in [None, Some("a guessed secret of enough bytes")] {
        let mut ws = raw_client(&a).await;
        let cfg = HandshakeConfig {
            cluster: CLUSTER.into(),
            node: NodeInfo {
                id: ReplicaId(0xbad),
                name: "raw".into(),
                url: "ws://127.0.0.1:9".into(),
                zone: Default::default(),
            },
            secret: guess.map(|g| Secret::new(g).unwrap()),
            max_skew_ms: 5_000,
        };
        let (mut client, hello) = handshake::Client::start(&cfg, [7; handshake::NONCE_LEN], now_ms());
        ws.send(WsMessage::binary(hello.encode())).await.unwrap();
        let challenge = HandshakeMessage::decode(&next_binary(&mut ws).await).unwrap();
        let (_, proof) = client.on_challenge(challenge, now_ms()).unwrap();
        ws.send(WsMessage::binary(proof.encode())).await.unwrap();
        // Everything the node sends until it closes: a refusal, never its welcome (the one
        // frame that carries its proof; the node would not close after one).
        let mut frames = Vec::new();
        within("the node to refuse and close", async {
            while let Some(Ok(m)) = ws.next().await {
                if let WsMessage::Binary(b) = m {
                    let frame = HandshakeMessage::decode(&b);
                    let welcomed = matches!(frame, Ok(HandshakeMessage::Welcome { .. }));
                    frames.push(frame);
                    if welcomed {
                        break;
                    }
                }
            }
        })
        .await;
        assert!(
            matches!(
                frames.as_slice(),
                [Ok(HandshakeMessage::Refused {
                    kind: handshake::RefusalKind::Secret,
                    ..
                })]
            ),
            "{frames:?}"
        );
    }
    shutdown_all(&[&a]).await;
}

pub(crate) async fn next_binary(ws: &mut WebSocketStream<TcpStream>) -> Vec<u8> {
    within("a binary frame", async {
        loop {
            match ws.next().await.unwrap().unwrap() {
                WsMessage::Binary(b) => return b.to_vec(),
                WsMessage::Close(f) => panic!("closed: {f:?}"),
                _ => {}
            }
        }
    })
    .await
}

/// Reads until the node closes the connection; returns its close code, if it sent one.
pub(crate) async fn closed(ws: &mut WebSocketStream<TcpStream>) -> Option<CloseCode> {
    within("the node to close the connection", async {
        loop {
            match ws.next().await {
                Some(Ok(WsMessage::Close(f))) => return f.map(|f| f.code),
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return None,
            }
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_and_garbage_frames_are_refused_and_the_node_keeps_serving() {
    let a = start(1, config("a", Some(SECRET)), &[]).await;
    let b = start(2, config("b", Some(SECRET)), &[&a]).await;
    eventually("A and B to see each other", || {
        members(&a) == 2 && members(&b) == 2
    })
    .await;

    // Oversize, before authenticating.
    let mut ws = raw_client(&a).await;
    let _ = ws.send(WsMessage::binary(vec![0u8; 2 << 20])).await;
    // The node closes with 1009; the rest of our frame, unread, may turn that into a reset.
    assert!(matches!(closed(&mut ws).await, Some(CloseCode::Size) | None));
    eventually("the oversize frame to be counted", || {
        a.counters().driver.oversize >= 1
    })
    .await;

    // Garbage instead of a hello.
    let mut ws = raw_client(&a).await;
    ws.send(WsMessage::binary(vec![0xff; 64])).await.unwrap();
    assert_eq!(closed(&mut ws).await, Some(CloseCode::Policy));
    eventually("the garbage hello to be refused", || {
        a.counters().driver.handshakes_refused >= 1
    })
    .await;

    // Garbage after authenticating, then an oversize message.
    let mut ws = authenticated_client(&a).await;
    ws.send(WsMessage::binary(vec![0xff; 64])).await.unwrap();
    assert_eq!(closed(&mut ws).await, Some(CloseCode::Protocol));
    eventually("the malformed message to be counted", || {
        a.counters().driver.malformed >= 1
    })
    .await;
    let mut ws = authenticated_client(&a).await;
    let _ = ws.send(WsMessage::binary(vec![1u8; (1 << 20) + 1])).await;
    assert!(matches!(closed(&mut ws).await, Some(CloseCode::Size) | None));
    eventually("the second oversize message to be counted", || {
        a.counters().driver.oversize >= 2
    })
    .await;

    // A text frame is no message either.
    let mut ws = authenticated_client(&a).await;
    ws.send(WsMessage::text("hello?")).await.unwrap();
    assert_eq!(closed(&mut ws).await, Some(CloseCode::Protocol));

    // A WebSocket client that does not ask for the subprotocol does not get in.
    let tcp = TcpStream::connect(a.local_addr()).await.unwrap();
    assert!(tokio_tungstenite::client_async(a.info().url.as_str(), tcp)
        .await
        .is_err());

    // Plain garbage on the TCP port.
    let mut tcp = TcpStream::connect(a.local_addr()).await.unwrap();
    tcp.write_all(b"\x00\x01 not http at all\r\n\r\n").await.unwrap();

    // The node still serves: a registration converges both ways.
    register(&a, "web", "web-a", 80).await;
    register(&b, "web", "web-b", 81).await;
    eventually("registrations to converge after the attacks", || {
        [&a, &b]
            .iter()
            .all(|n| shows(n, "web", "web-a") && shows(n, "web", "web-b"))
    })
    .await;
    assert_eq!(members(&a), 2, "the raw clients never became members");
    shutdown_all(&[&a, &b]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_frames_is_slowed_and_a_silent_client_and_too_many_connections_are_cut() {
    let mut flooded = config("flooded", Some(SECRET));
    flooded.limits.frames_per_second = 20;
    flooded.limits.frame_burst = 40;
    let mut impatient = config("impatient", Some(SECRET));
    impatient.limits.handshake_timeout = Duration::from_millis(300);
    let mut full = config("full", Some(SECRET));
    full.protocol.max_inbound = 2;
    let (a, b, c) = (
        start(1, flooded, &[]).await,
        start(2, impatient, &[]).await,
        start(3, full, &[]).await,
    );

    // A flood of valid messages, over the rate limit: read no faster than the limit allows,
    // and read whole on a connection left open (back-pressure, not a cut).
    let mut ws = authenticated_client(&a).await;
    let before = a.counters().driver.frames_received;
    let started = Instant::now();
    for _ in 0..100 {
        let ack = Envelope::stamped(Message::Ack { seq: 0 }, Hlc::new(now_ms(), 0));
        ws.send(WsMessage::binary(whole(&ack))).await.unwrap();
    }
    eventually("the flood to be slowed", || {
        a.counters().driver.frames_throttled >= 1
    })
    .await;
    let read = a.counters().driver.frames_received - before;
    // The burst, the rate for every second begun since, and the one frame read and waiting.
    let allowed = 40 + 20 * started.elapsed().as_secs_f64().ceil() as u64 + 1;
    assert!(read <= allowed, "{read} frames read, at most {allowed} allowed");
    eventually("the whole flood to be read", || {
        a.counters().driver.frames_received - before >= 100
    })
    .await;

    // A client that connects and says nothing is cut at the handshake timeout.
    let mut silent = TcpStream::connect(b.local_addr()).await.unwrap();
    let mut buf = [0u8; 64];
    let read = within("the silent client to be cut", silent.read(&mut buf)).await;
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    eventually("the timeout to be counted", || {
        b.counters().driver.handshake_timeouts >= 1
    })
    .await;

    // Two silent clients fill the inbound cap; a third is dropped before any handshake.
    let _one = TcpStream::connect(c.local_addr()).await.unwrap();
    let _two = TcpStream::connect(c.local_addr()).await.unwrap();
    eventually("both to be taken up", || {
        c.counters().driver.inbound_accepted >= 2
    })
    .await;
    let mut third = TcpStream::connect(c.local_addr()).await.unwrap();
    let read = within("the third to be dropped", third.read(&mut buf)).await;
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    assert_eq!(c.counters().driver.inbound_over_cap, 1);
    shutdown_all(&[&a, &b, &c]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_shuts_down_is_gone_from_its_peers_at_once() {
    let (a, b, c) = cluster_of_three(Some(SECRET)).await;
    // Leases far longer than the test: only the farewell can remove these.
    register(&c, "api", "api-c", 9000).await;
    register(&c, "api", "api-c2", 9001).await;
    eventually("C's registrations to reach A and B", || {
        [&a, &b]
            .iter()
            .all(|n| shows(n, "api", "api-c") && shows(n, "api", "api-c2"))
    })
    .await;
    // The wait below is shorter than the node's lease (30 s) and no sweep runs for 60 s:
    // only the farewell delta can make the registrations go.
    within("C to shut down", c.shutdown()).await;
    assert!(c.is_stopped());
    assert!(
        c.register(
            ServiceName::new("api").unwrap(),
            ProviderId::new("late").unwrap(),
            Endpoint::new("10.0.0.1", 1).unwrap(),
            Metadata::new(),
        )
        .await
        .is_err(),
        "a stopped node takes no writes"
    );
    eventually("A and B to drop C's registrations and membership", || {
        [&a, &b]
            .iter()
            .all(|n| !shows(n, "api", "api-c") && !shows(n, "api", "api-c2") && members(n) == 2)
    })
    .await;
    register(&a, "api", "api-a", 9002).await;
    eventually("A and B to go on without C", || shows(&b, "api", "api-a")).await;
    shutdown_all(&[&a, &b]).await;
}

/// A self-signed certificate for 127.0.0.1 in a fresh directory, trusted by itself, shared
/// by the nodes of ids 1 to 4 (it names each: `node-<id>`).
pub(crate) fn tls_files(tag: &str) -> (driver::TlsConfig, std::path::PathBuf) {
    let mut names = vec!["127.0.0.1".to_string(), "localhost".to_string()];
    names.extend((1..=4u64).map(|id| format!("node-{}", ReplicaId(id))));
    let key = rcgen::generate_simple_self_signed(names).unwrap();
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    let dir = std::env::temp_dir().join(format!("roster-tls-{}-{nanos}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert_pem, key_pem) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert_pem, key.cert.pem()).unwrap();
    std::fs::write(&key_pem, key.signing_key.serialize_pem()).unwrap();
    let tls = driver::TlsConfig {
        cert_pem: cert_pem.clone(),
        key_pem,
        ca_pem: cert_pem,
    };
    (tls, dir)
}

pub(crate) fn with_tls(mut config: DriverConfig, tls: &driver::TlsConfig) -> DriverConfig {
    config.tls = Some(tls.clone());
    config
}

// Chunking: messages larger than a frame.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_that_cannot_work_together_stop_the_start() {
    let mut tiny_frames = config("tiny", Some(SECRET));
    tiny_frames.limits.max_frame_size = 1_000;
    let mut starved_queue = config("starved", Some(SECRET));
    starved_queue.limits.send_queue_bytes = starved_queue.limits.max_envelope_bytes - 1;
    for (config, what) in [
        (tiny_frames, "max_frame_size"),
        (starved_queue, "send_queue_bytes"),
    ] {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let e = driver::start(
            listener,
            config,
            Replica::new(ReplicaId(1)),
            vec![],
            CancellationToken::new(),
        )
        .unwrap_err();
        assert!(matches!(e, driver::StartError::Config(_)), "{e}");
        assert!(e.to_string().contains(what), "{e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_under_reconnect_pressure_sheds_peers_with_a_retry_after_hint() {
    let mut cfg = config("a", None);
    cfg.limits.peer_accepts_per_second = 1;
    cfg.limits.peer_accept_burst = 2;
    let a = start(1, cfg, &[]).await;
    // Two upgrades within the burst pass; the third from the same address is shed.
    let _one = raw_client(&a).await;
    let _two = raw_client(&a).await;
    let tcp = TcpStream::connect(a.local_addr()).await.unwrap();
    let uri: Uri = a.info().url.parse().unwrap();
    let request = ClientRequestBuilder::new(uri).with_sub_protocol("roster.v1");
    match tokio_tungstenite::client_async(request, tcp).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status().as_u16(), 503);
            let secs: u64 = resp.headers()["Retry-After"].to_str().unwrap().parse().unwrap();
            assert!((1..=5).contains(&secs), "Retry-After {secs}");
        }
        other => panic!("expected a 503 with Retry-After, got {:?}", other.map(|_| ())),
    }
    assert_eq!(a.counters().driver.peers_shed, 1);
    // A node dialing it takes the hint: it does not come back at once.
    let mut bcfg = config("b", None);
    bcfg.protocol.backoff.base_ms = 10;
    let b = start(2, bcfg, &[&a]).await;
    sleep(Duration::from_millis(800)).await;
    assert!(
        b.counters().protocol.dials <= 1,
        "the dialer came back within the hint: {} dials",
        b.counters().protocol.dials
    );
    shutdown_all(&[&a, &b]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_under_the_crash_guard_turns_peers_away_for_its_window() {
    let mut cfg = config("a", None);
    // A window of two minutes: peers come back after it, spread over half as long again.
    cfg.resume.crash_guard = Some(roster_transport::proto::CrashGuard {
        launches: 5,
        window: Duration::from_secs(120),
    });
    let a = start(1, cfg, &[]).await;
    let upgrade = || async {
        let tcp = TcpStream::connect(a.local_addr()).await.unwrap();
        let uri: Uri = a.info().url.parse().unwrap();
        let request = ClientRequestBuilder::new(uri).with_sub_protocol("roster.v1");
        tokio_tungstenite::client_async(request, tcp).await
    };
    match upgrade().await {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status().as_u16(), 503);
            let secs: u64 = resp.headers()["Retry-After"].to_str().unwrap().parse().unwrap();
            assert!((120..180).contains(&secs), "Retry-After {secs}");
        }
        other => panic!("expected a 503, got {:?}", other.map(|_| ())),
    }
    // When the guard clears, peers are welcome again.
    a.set_crash_guard(false).await.unwrap();
    assert!(upgrade().await.is_ok());
    shutdown_all(&[&a]).await;
}
