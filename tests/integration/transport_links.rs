//! Real nodes over loopback, at the edges of their links: a link that goes silent (packets
//! dropped, no FIN) is found dead and its slot redialed; connections from one address that
//! never authenticate leave the inbound slots to others.
//!
//! A user-space TCP proxy stands in for a network that drops everything: it keeps both
//! sockets open and stops forwarding either way. Every wait is bounded and generous; every
//! node and proxy task started here is stopped at the end.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use roster_registry::{Replica, ReplicaId};
use roster_transport::driver::{self, ClientConn, DriverConfig, Handle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::client::ClientRequestBuilder;
use tokio_tungstenite::tungstenite::http::Uri;
use tokio_util::sync::CancellationToken;

use super::transport_loopback::{config, eventually, members, register, shows, shutdown_all, SECRET};

/// A TCP proxy to one address that can go silent: it then forwards nothing either way and
/// closes nothing, like a network that drops every packet.
struct Proxy {
    addr: SocketAddr,
    silent: Arc<AtomicBool>,
    /// Ends (a node's side of a proxied connection) that closed.
    closed: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Proxy {
    async fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let silent = Arc::new(AtomicBool::new(false));
        let closed = Arc::new(AtomicUsize::new(0));
        let (s, c) = (Arc::clone(&silent), Arc::clone(&closed));
        let task = tokio::spawn(async move {
            let mut pumps = tokio::task::JoinSet::new();
            while let Ok((down, _)) = listener.accept().await {
                let Ok(up) = TcpStream::connect(target).await else {
                    continue;
                };
                let (dr, dw) = down.into_split();
                let (ur, uw) = up.into_split();
                pumps.spawn(pump(dr, uw, Arc::clone(&s), Arc::clone(&c)));
                pumps.spawn(pump(ur, dw, Arc::clone(&s), Arc::clone(&c)));
            }
        });
        Proxy {
            addr,
            silent,
            closed,
            task,
        }
    }

    fn url(&self) -> String {
        format!("ws://{}", self.addr)
    }

    /// From now on, drop everything both ways and keep every socket open.
    fn go_silent(&self) {
        self.silent.store(true, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // Dropping the accept task drops its pumps and every socket they hold.
        self.task.abort();
    }
}

/// Copies `from` to `to` until `from` ends; while the proxy is silent, reads and drops.
/// When `from` ends it counts that end as closed, and passes the close on only if the
/// proxy is not silent (a silent network carries no FIN).
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    silent: Arc<AtomicBool>,
    closed: Arc<AtomicUsize>,
) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if !silent.load(Ordering::SeqCst) && to.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        }
    }
    closed.fetch_add(1, Ordering::SeqCst);
    if silent.load(Ordering::SeqCst) {
        // Hold the other socket open: nothing tells the other node.
        std::future::pending::<()>().await;
    }
}

/// The test configuration with quick liveness checks.
fn quick(name: &str) -> DriverConfig {
    let mut c = config(name, Some(SECRET));
    c.limits.ping_after = Duration::from_millis(200);
    c.limits.dead_after = Duration::from_millis(1_000);
    c
}

async fn start_at(id: u64, config: DriverConfig, seeds: Vec<String>) -> Handle {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    driver::start(
        listener,
        config,
        Replica::new(ReplicaId(id)),
        seeds,
        CancellationToken::new(),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_that_goes_silent_is_closed_and_its_slot_redialed_around_the_cut() {
    // B only accepts; A reaches it first through the proxy (as its seed), so the proxied
    // link is the only one between them.
    let mut bcfg = quick("b");
    bcfg.protocol.dial = false;
    let b = start_at(2, bcfg, vec![]).await;
    let proxy = Proxy::start(b.local_addr()).await;
    let a = start_at(1, quick("a"), vec![proxy.url()]).await;
    eventually("A and B to see each other", || {
        members(&a) == 2 && members(&b) == 2
    })
    .await;
    assert_eq!(
        a.connected(),
        vec![(b.info().id, true)],
        "one link, through the proxy"
    );
    register(&a, "web", "before", 80).await;
    eventually("a write to cross the proxy", || shows(&b, "web", "before")).await;
    let dials = a.counters().protocol.dials;

    // The network drops everything; no connection is closed by it.
    proxy.go_silent();
    eventually("both nodes to close the silent link", || {
        proxy.closed.load(Ordering::SeqCst) >= 2
    })
    .await;
    assert!(a.counters().driver.dead_links >= 1, "A counts it dead");
    assert!(b.counters().driver.dead_links >= 1, "B counts it dead");
    assert!(a.counters().driver.pings_sent >= 1, "A asked before giving up");

    // A's slot is free: it dials B again, at the URL B advertises, around the cut.
    register(&a, "web", "after", 81).await;
    eventually("a write made after the cut to reach B", || {
        shows(&b, "web", "after")
    })
    .await;
    assert!(a.counters().protocol.dials > dials, "A redialed");
    shutdown_all(&[&a, &b]).await;
    drop(proxy);
}

/// Opens a WebSocket from `from` with `subprotocol`; `None` when the node does not take it.
async fn upgrade_from(from: &str, node: &Handle, subprotocol: &str) -> Option<impl Sized> {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let tcp = socket.connect(node.local_addr()).await.ok()?;
    let uri: Uri = node.info().url.parse().unwrap();
    let request = ClientRequestBuilder::new(uri).with_sub_protocol(subprotocol);
    let ws = tokio::time::timeout(
        Duration::from_secs(5),
        tokio_tungstenite::client_async(request, tcp),
    )
    .await
    .ok()?
    .ok()?;
    Some(ws.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_connections_that_never_authenticate_from_one_address_leave_room_for_peers_and_clients() {
    // The application holds every client connection it is handed and never says one
    // authenticated: the worst client of all, from 127.0.0.2.
    let (tx, mut rx) = mpsc::channel::<ClientConn>(256);
    let mut acfg = config("a", Some(SECRET));
    acfg.clients = Some(driver::ClientProtocol {
        name: "roster.client.v1",
        conns: tx,
    });
    let a = start_at(1, acfg, vec![]).await;
    let held = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Some(c) = rx.recv().await {
            held.push(c);
        }
        held
    });
    let mut attackers = Vec::new();
    for _ in 0..70 {
        if let Some(ws) = upgrade_from("127.0.0.2", &a, "roster.client.v1").await {
            attackers.push(ws);
        }
    }
    let cap = driver::Limits::default().max_unauthenticated_per_address;
    assert_eq!(attackers.len(), cap, "one address holds at most its cap");
    assert!(a.counters().driver.unauthenticated_over_cap >= (70 - cap) as u64);

    // A peer from another address joins, and a client from it is handed over.
    let b = start_at(2, config("b", Some(SECRET)), vec![a.info().url.clone()]).await;
    eventually("B to join A despite the 70", || {
        members(&a) == 2 && members(&b) == 2
    })
    .await;
    assert!(
        upgrade_from("127.0.0.1", &a, "roster.client.v1").await.is_some(),
        "a client from another address gets in"
    );
    eventually("the client to be handed over", || {
        a.counters().driver.clients_accepted > cap as u64
    })
    .await;
    shutdown_all(&[&a, &b]).await;
    drop(attackers);
    held.abort();
}
