//! Large messages between real nodes: states of several MiB sent in chunks (over TLS too),
//! chunks that break the rules, and a state too large to send.

use futures_util::SinkExt;
use roster_registry::{
    codec, CausalContext, Endpoint, Metadata, ProviderId, Replica, ReplicaId, ServiceName,
};
use roster_transport::driver::{self, Handle};
use roster_transport::message::{Envelope, Message};
use roster_transport::registry::{Hlc, HlcClock};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message as WsMessage;

use crate::transport_loopback::{
    authenticated_client, closed, config, eventually, eventually_within, members, now_ms, register, shows,
    shutdown_all, start, start_with, tls_files, with_tls, PATIENCE, SECRET,
};

/// The chunk tags of the wire format (see the driver's docs), written here from their
/// description: a whole message; the first chunk of a larger one, then its total length
/// (`u64`, little-endian); the chunks after it.
const WHOLE: u8 = 0x00;
const FIRST: u8 = 0x01;
const MORE: u8 = 0x02;

/// An envelope as one WebSocket message.
pub(crate) fn whole(envelope: &Envelope) -> Vec<u8> {
    [&[WHOLE][..], &envelope.encode()].concat()
}

/// A first chunk announcing `total` bytes and carrying `data`.
fn first_chunk(total: usize, data: &[u8]) -> Vec<u8> {
    [&[FIRST][..], &(total as u64).to_le_bytes(), data].concat()
}

/// `bytes` as chunks of at most `frame` bytes, each as full as it may be.
fn chunked(bytes: &[u8], frame: usize) -> Vec<Vec<u8>> {
    let (head, rest) = bytes.split_at(frame - 9);
    let mut out = vec![first_chunk(bytes.len(), head)];
    out.extend(rest.chunks(frame - 1).map(|c| [&[MORE][..], c].concat()));
    out
}

/// A replica owned by `id` with `count` registrations with short names: `count / 100`
/// providers `{tag}{p}`, each in the 100 services `{tag}{s}`, under an hour-long lease.
/// (Few providers: registering a new provider costs time in the number of providers.)
fn big_replica(id: u64, tag: &str, count: usize) -> Replica {
    let mut replica = Replica::new(ReplicaId(id));
    let mut clock = HlcClock::new();
    let services: Vec<ServiceName> = (0..100)
        .map(|s| ServiceName::new(&format!("{tag}{s}")).unwrap())
        .collect();
    for p in 0..count.div_ceil(services.len()) {
        let provider = ProviderId::new(&format!("{tag}{p}")).unwrap();
        for (s, service) in services.iter().enumerate().take(count - p * services.len()) {
            replica
                .register(
                    service.clone(),
                    provider.clone(),
                    Endpoint::new("10.0.0.1", (p * 100 + s) as u16 % 60_000 + 1).unwrap(),
                    Metadata::new(),
                    3_600_000,
                    clock.tick(now_ms()),
                )
                .unwrap();
        }
    }
    replica
}

/// The size of `replica`'s full state as a node that knows nothing receives it.
fn full_state_size(replica: &Replica) -> usize {
    codec::encode_elided(&replica.elide_for(&CausalContext::new())).len()
}

fn registrations(node: &Handle) -> usize {
    node.replica().state().registration_count()
}

/// A holds a registry of 80,000 registrations, B one of 40,000: full states of about 3.0
/// and 1.5 MB. B joins through A and both converge to the same state, with the frame and
/// message limits at their default 1 MiB: A's state crosses its inbound connection, B's
/// its outbound one.
async fn a_large_registry_syncs_in_chunks(tls: Option<&driver::TlsConfig>) {
    let cfg = |name: &str| {
        let c = config(name, Some(SECRET));
        assert_eq!(
            (c.limits.max_message_size, c.limits.max_frame_size),
            (1 << 20, 1 << 20)
        );
        match tls {
            Some(t) => with_tls(c, t),
            None => c,
        }
    };
    let built = Instant::now();
    let (big_a, big_b) = (big_replica(1, "a", 80_000), big_replica(2, "b", 40_000));
    let (size_a, size_b) = (full_state_size(&big_a), full_state_size(&big_b));
    // More than twice and more than once the 1 MiB limits.
    assert!(
        size_a > 2 << 20 && size_b > 1 << 20,
        "{size_a} and {size_b} bytes"
    );
    eprintln!(
        "full states of {size_a} and {size_b} bytes built in {:?}",
        built.elapsed()
    );

    let started = Instant::now();
    let a = start_with(big_a, cfg("a"), &[]).await;
    let b = start_with(big_b, cfg("b"), &[&a]).await;
    // Both registries and both members on each side: the same contexts (cheap to compare
    // while waiting), then the same states. About 5 s alone in a debug build; beside other
    // tests on two cores it once took more than the usual patience, so it has three times it.
    eventually_within(PATIENCE * 3, "both nodes to hold both registries", || {
        let (ra, rb) = (a.replica(), b.replica());
        ra.state().registration_count() == 120_002
            && rb.state().registration_count() == 120_002
            && ra.context() == rb.context()
    })
    .await;
    let took = started.elapsed();
    eventually("both nodes to hold the same state", || {
        a.replica().state() == b.replica().state()
    })
    .await;
    eprintln!(
        "both held both registries after {took:?}, the same state after {:?}",
        started.elapsed()
    );
    assert_eq!((members(&a), members(&b)), (2, 2));
    for n in [&a, &b] {
        let d = n.counters().driver;
        assert_eq!(
            (
                d.oversize,
                d.oversize_sent,
                d.malformed,
                d.frames_throttled,
                d.slow_peers
            ),
            (0, 0, 0, 0, 0),
            "{d:?}"
        );
        assert!(n.counters().protocol.full_syncs_received >= 1);
    }
    shutdown_all(&[&a, &b]).await;
    eprintln!("and shut down after {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_of_several_mebibytes_syncs_in_chunks() {
    a_large_registry_syncs_in_chunks(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_of_several_mebibytes_syncs_in_chunks_over_tls() {
    let (tls, dir) = tls_files("chunks");
    a_large_registry_syncs_in_chunks(Some(&tls)).await;
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunk_violations_are_refused_and_a_chunked_message_counts_once() {
    const FRAME: usize = 8 << 10;
    const BURST: u32 = 40;
    let mut strict = config("strict", Some(SECRET));
    strict.limits.max_message_size = FRAME;
    strict.limits.max_frame_size = FRAME;
    strict.limits.max_envelope_bytes = 4 << 20;
    strict.limits.frames_per_second = 20;
    strict.limits.frame_burst = BURST;
    let a = start(1, strict, &[]).await;

    // A full state in more chunks than the burst allows frames: it counts as one message.
    let donor = big_replica(7, "d", 20_000);
    let state = Envelope::stamped(
        Message::elided(0, &donor.elide_for(&CausalContext::new())),
        Hlc::new(now_ms(), 0),
    );
    let chunks = chunked(&state.encode(), FRAME);
    assert!(chunks.len() > 2 * BURST as usize, "{} chunks", chunks.len());
    let mut ws = authenticated_client(&a).await;
    for c in chunks {
        ws.send(WsMessage::binary(c)).await.unwrap();
    }
    eventually("the chunked state to be applied", || registrations(&a) == 20_001).await;
    drop(ws);

    // Over the limit, as its first chunk announces: refused before any more arrives.
    let mut ws = authenticated_client(&a).await;
    ws.send(WsMessage::binary(first_chunk(5 << 20, &[0; 100])))
        .await
        .unwrap();
    assert_eq!(closed(&mut ws).await, Some(CloseCode::Size));
    eventually("the oversize announcement to be counted", || {
        a.counters().driver.oversize == 1
    })
    .await;

    // A continuation without a first chunk, a message cut short by the next one, an unknown
    // tag and an empty message: each is malformed.
    let violations: [&[Vec<u8>]; 4] = [
        &[vec![MORE, 1, 2, 3]],
        &[first_chunk(1_000, &[0; 100]), vec![WHOLE, 1]],
        &[vec![0x07; 32]],
        &[vec![]],
    ];
    for (i, frames) in violations.into_iter().enumerate() {
        let mut ws = authenticated_client(&a).await;
        for f in frames {
            ws.send(WsMessage::binary(f.clone())).await.unwrap();
        }
        assert_eq!(closed(&mut ws).await, Some(CloseCode::Protocol), "violation {i}");
        eventually("the violation to be counted", || {
            a.counters().driver.malformed == i as u64 + 1
        })
        .await;
    }

    // A flood of tiny continuation chunks is a flood of frames: slowed, as frames are.
    let mut ws = authenticated_client(&a).await;
    ws.send(WsMessage::binary(first_chunk(1 << 20, &[0; 100])))
        .await
        .unwrap();
    for _ in 0..2 * BURST {
        ws.send(WsMessage::binary(vec![MORE, 0])).await.unwrap();
    }
    eventually("the flood to be slowed", || {
        a.counters().driver.frames_throttled >= 1
    })
    .await;
    drop(ws);

    // None of it reached the replica; the node still takes writes.
    register(&a, "web", "web-a", 80).await;
    assert!(shows(&a, "web", "web-a"));
    assert_eq!(registrations(&a), 20_002);
    shutdown_all(&[&a]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_too_large_to_send_and_a_peer_that_does_not_read_are_cut() {
    // A node whose full state (about 800 kB) is over its own message limit.
    let mut small = config("small", Some(SECRET));
    small.limits.max_envelope_bytes = 256 << 10;
    // A node whose send queue holds two full states at most.
    let mut tight = config("tight", Some(SECRET));
    tight.limits.max_envelope_bytes = 1 << 20;
    tight.limits.send_queue_bytes = 2 << 20;
    // Answer every digest with a full state, however recent the last one.
    tight.protocol.full_sync_pause_ms = 0;
    let (a, b) = (
        start_with(big_replica(1, "a", 20_000), small, &[]).await,
        start_with(big_replica(2, "b", 20_000), tight, &[]).await,
    );
    let ask_for_everything = || {
        let digest = Envelope::stamped(
            Message::digest(&CausalContext::new(), false, None),
            Hlc::new(now_ms(), 0),
        );
        WsMessage::binary(whole(&digest))
    };

    // A peer with nothing asks for everything: A will not send it, and says why.
    let mut ws = authenticated_client(&a).await;
    ws.send(ask_for_everything()).await.unwrap();
    assert_eq!(closed(&mut ws).await, Some(CloseCode::Error));
    eventually("the message A would not send to be counted", || {
        a.counters().driver.oversize_sent == 1
    })
    .await;

    // A peer that asks for everything again and again and reads nothing: once the socket
    // buffers are full, B's queue grows to its byte budget and the peer is cut.
    let mut ws = authenticated_client(&b).await;
    for _ in 0..60 {
        ws.send(ask_for_everything()).await.unwrap();
    }
    eventually("the peer that does not read to be cut", || {
        b.counters().driver.slow_peers >= 1 && b.connected().is_empty()
    })
    .await;
    drop(ws);
    assert_eq!(b.counters().driver.slow_peers, 1, "one cut, counted once");
    assert_eq!(b.counters().driver.oversize_sent, 0);
    shutdown_all(&[&a, &b]).await;
}
