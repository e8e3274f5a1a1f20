//! A hostile (or broken) cluster member: it holds the secret, passes the handshake, and
//! sends well-formed deltas built with the public API that would poison a replica that
//! believed them. Each is refused; the cluster keeps every live owner's registrations and
//! keeps taking new ones.
//!
//! Three real nodes on loopback (`transport_loopback`'s helpers); the hostile peer is a raw
//! WebSocket client speaking the peer protocol.

use futures_util::SinkExt;
use roster_registry::{CausalContext, Endpoint, Hlc, ProviderId, Replica, ReplicaId, ServiceName, State};
use roster_transport::driver::Handle;
use roster_transport::message::{Envelope, Message};
use tokio_tungstenite::tungstenite::Message as WsMessage;

use crate::transport_chunks::whole;
use crate::transport_loopback::{
    authenticated_client, closed, cluster_of_three, eventually, members, now_ms, register, shows,
    shutdown_all,
};

/// Sends `message` to `node` as a hostile peer; returns the open connection.
async fn send_poison(
    node: &Handle,
    message: Message,
) -> tokio_tungstenite::WebSocketStream<tokio::net::TcpStream> {
    let mut ws = authenticated_client(node).await;
    let envelope = Envelope::stamped(message, Hlc::new(now_ms(), 0));
    ws.send(WsMessage::binary(whole(&envelope))).await.unwrap();
    ws
}

/// A forger's replica that has seen `node`'s whole state and a write of `target` 1,000
/// counters ahead of it, and then removed all of it: the public `Replica::retire` then
/// retires `target` past its next 1,000 writes (which every replica would drop on arrival).
fn forger_ahead_of(node: &Handle, target: ReplicaId) -> Replica {
    let state = node.replica().state().clone();
    let ahead = state.context().seen_through(target) + 1_000;
    let mut forger = Replica::new(ReplicaId(0xbad));
    forger.apply(state, now_ms());
    let mut runaway = Replica::from_state(target, State::new(), ahead);
    let write = write_web(&mut runaway, "p-forged", 6665, now_ms());
    forger.apply(write.delta, now_ms());
    forger.expire(now_ms() + 2 * 24 * 3_600_000, 0);
    forger
}

fn web() -> ServiceName {
    ServiceName::new("web").unwrap()
}

/// `r` registers `web/<provider>` at `10.6.6.6:<port>`, stamped `at_ms`, with a minute's
/// lease.
fn write_web(r: &mut Replica, provider: &str, port: u16, at_ms: u64) -> roster_registry::Applied {
    let p = ProviderId::new(provider).unwrap();
    let ep = Endpoint::new("10.6.6.6", port).unwrap();
    r.register(web(), p, ep, Default::default(), 60_000, Hlc::new(at_ms, 0))
        .unwrap()
}

/// Every node still shows `web/p-a` (owned by a) and three members, and a new
/// registration on b still reaches a.
async fn cluster_intact(nodes: [&Handle; 3], port: u16) {
    for n in nodes {
        assert!(shows(n, "web", "p-a"), "{} lost a's registration", n.info().name);
        assert_eq!(members(n), 3, "{} lost a member", n.info().name);
    }
    let provider = format!("p-b-{port}");
    register(nodes[1], "web", &provider, port).await;
    eventually("a write on b to reach a", || shows(nodes[0], "web", &provider)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_with_the_secret_cannot_poison_the_cluster_with_crafted_deltas() {
    let (a, b, c) = cluster_of_three(Some(crate::transport_loopback::SECRET)).await;
    register(&a, "web", "p-a", 8080).await;
    eventually("a's registration on every node", || {
        [&a, &b, &c].iter().all(|n| shows(n, "web", "p-a"))
    })
    .await;

    // Retiring a live node, as a delta and as a full state: refused, connection closed.
    let mut forger = forger_ahead_of(&b, a.info().id);
    let retire_a = forger.retire(a.info().id, Hlc::new(now_ms(), 0)).unwrap().delta;
    let as_full = retire_a.elide_for(&CausalContext::new());
    for message in [Message::delta(1, &retire_a), Message::elided(1, &as_full)] {
        let mut ws = send_poison(&b, message).await;
        closed(&mut ws).await;
    }
    // Retiring the receiver itself: refused, and answered: b writes its entries again
    // above the retired counters, after which the same retirement covers nothing live.
    let mut forger = forger_ahead_of(&b, b.info().id);
    let retire_b = forger.retire(b.info().id, Hlc::new(now_ms(), 0)).unwrap().delta;
    let mut ws = send_poison(&b, Message::delta(1, &retire_b)).await;
    closed(&mut ws).await;
    assert!(b.counters().protocol.forgeries_refuted > 0);
    let _ws = send_poison(&b, Message::elided(1, &retire_b.elide_for(&CausalContext::new()))).await;
    cluster_intact([&a, &b, &c], 9001).await;

    // A dot under a's id far above anything a minted, sent to b (a runaway counter) and
    // to a itself (a forged dot of its own): refused, connection closed.
    let mut runaway = Replica::from_state(a.info().id, State::new(), 1 << 40);
    let forged = write_web(&mut runaway, "p-a", 6666, now_ms()).delta;
    for to in [&b, &a] {
        let mut ws = send_poison(to, Message::delta(1, &forged)).await;
        closed(&mut ws).await;
    }
    cluster_intact([&a, &b, &c], 9002).await;

    // A write forged under a's id, within reach of a's counter, overwriting a's instance:
    // b takes it (nothing tells it apart), but a refuses it when it is forwarded, ships
    // the truth about its dots, and every node drops the forgery.
    let seen = b.replica().context().max_counter(a.info().id);
    let mut close = Replica::from_state(a.info().id, State::new(), seen + 1_000);
    let overwrite = write_web(&mut close, "p-a", 6668, now_ms()).delta;
    let _ws = send_poison(&b, Message::delta(1, &overwrite)).await;
    eventually("a to refute the forgery", || {
        a.counters().protocol.forgeries_refuted > 0
    })
    .await;
    eventually("every node to show a's own write again", || {
        [&a, &b, &c].iter().all(|n| {
            let r = n.replica();
            let p = ProviderId::new("p-a").unwrap();
            let explained = r.explain(&web(), &p, now_ms());
            explained.is_some_and(|e| e.live && e.writes.iter().all(|(_, w)| w.endpoint.port() == 8080))
        })
    })
    .await;
    cluster_intact([&a, &b, &c], 9004).await;

    // Another member writes over a's instance under its own id (a legal-looking write):
    // a writes it again.
    let mut stranger = Replica::new(ReplicaId(0xbad));
    stranger.apply(b.replica().state().clone(), now_ms());
    let over = write_web(&mut stranger, "p-a", 6669, now_ms() + 1).delta;
    let _ws = send_poison(&b, Message::delta(1, &over)).await;
    eventually("a to write its instance over the stranger's", || {
        a.counters().protocol.overwrites_repaired > 0
    })
    .await;
    eventually("every node to show a's instance again", || {
        [&a, &b, &c].iter().all(|n| {
            let r = n.replica();
            let (p, w) = (ProviderId::new("p-a").unwrap(), web());
            let back = r
                .instances(&w, now_ms())
                .any(|i| i.provider == &p && i.registration.endpoint.port() == 8080);
            back
        })
    })
    .await;

    // A registration written in 2100 would never expire: refused (the connection stays,
    // since a clock a little ahead is mended by time), never shown.
    let mut future = Replica::new(ReplicaId(0xbad));
    let year_2100 = 4_102_444_800_000;
    let planted = write_web(&mut future, "p-forever", 6667, year_2100).delta;
    let refused_before = b.counters().protocol.states_refused;
    let _ws = send_poison(&b, Message::delta(1, &planted)).await;
    eventually("b to refuse the planted registration", || {
        b.counters().protocol.states_refused > refused_before
    })
    .await;
    cluster_intact([&a, &b, &c], 9003).await;
    for n in [&a, &b, &c] {
        assert!(
            !shows(n, "web", "p-forever"),
            "{} shows the planted registration",
            n.info().name
        );
    }
    let a_written = a.replica();
    let key_writes = a_written
        .explain(&web(), &ProviderId::new("p-a").unwrap(), now_ms())
        .unwrap();
    assert!(
        key_writes.writes.iter().all(|(_, r)| r.endpoint.port() == 8080),
        "a's own registration was overwritten: {key_writes:?}"
    );
    shutdown_all(&[&a, &b, &c]).await;
}
