//! The agent's side of the client protocol (see [`crate::api`]).

use std::collections::VecDeque;
use std::sync::Weak;
use std::time::Duration;

use futures_util::{FutureExt, SinkExt, StreamExt};
use roster_registry::ServiceName;
use roster_transport::driver::ClientConn;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use crate::api::{
    self, ClientMessage, ErrorKind, EventView, RegisterItem, Request, ServerHello, ServerMessage,
    AGENT_LABEL, CLIENT_LABEL, MAX_BATCH_REQUEST_BYTES, MAX_REQUEST_BYTES, NONCE_LEN,
};
use crate::node::{Answer, Error, Event, Inner, Node, Service};

/// How long a client has to say hello and send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a connection may wait for its next request after an answer (a client may ask
/// again on the same connection, as a program that registers often would).
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// The most registrations of one connection waiting for their commit: a client may send
/// requests without waiting for each answer; past this many, the agent reads no more
/// until it has answered the oldest.
const MAX_IN_FLIGHT: usize = 64;

/// Serves client connections until the node stops.
pub(crate) async fn accept(
    inner: Weak<Inner>,
    mut rx: mpsc::Receiver<ClientConn>,
    cancel: CancellationToken,
) {
    let tracker = TaskTracker::new();
    loop {
        let conn = tokio::select! {
            () = cancel.cancelled() => break,
            c = rx.recv() => match c {
                Some(c) => c,
                None => break,
            },
        };
        let Some(inner) = inner.upgrade() else { break };
        tracker.spawn(serve(Node { inner }, conn, cancel.clone()));
    }
    tracker.close();
    tracker.wait().await;
}

type Ws = tokio_tungstenite::WebSocketStream<Box<dyn roster_transport::driver::ClientStream>>;

async fn send(ws: &mut Ws, msg: &ServerMessage) -> Result<(), String> {
    ws.send(WsMessage::binary(api::encode(msg)))
        .await
        .map_err(|e| e.to_string())
}

async fn recv(ws: &mut Ws) -> Result<ClientMessage, String> {
    loop {
        match ws.next().await {
            None => return Err("the client hung up".into()),
            Some(Err(e)) => return Err(e.to_string()),
            Some(Ok(WsMessage::Binary(b))) => {
                let msg = if b.len() > MAX_BATCH_REQUEST_BYTES {
                    None
                } else {
                    Some(api::decode(&b).map_err(|e| e.to_string())?)
                };
                let batch = matches!(
                    msg,
                    Some(ClientMessage::Request(
                        Request::RegisterMany { .. } | Request::WatchFrom { .. }
                    ))
                );
                let max = if batch {
                    MAX_BATCH_REQUEST_BYTES
                } else {
                    MAX_REQUEST_BYTES
                };
                match msg {
                    Some(m) if b.len() <= max => return Ok(m),
                    _ => {
                        let m = format!(
                            "a request of {} bytes is too large (at most {MAX_REQUEST_BYTES}, or \
                             {MAX_BATCH_REQUEST_BYTES} for a batch); send fewer items per batch",
                            b.len()
                        );
                        let _ = send(ws, &error(ErrorKind::Invalid, m.clone())).await;
                        return Err(m);
                    }
                }
            }
            Some(Ok(WsMessage::Close(_))) => return Err("the client closed".into()),
            Some(Ok(WsMessage::Text(_))) => return Err("a text frame".into()),
            Some(Ok(_)) => {}
        }
    }
}

fn error(kind: ErrorKind, message: impl Into<String>) -> ServerMessage {
    ServerMessage::Error {
        kind,
        message: message.into(),
        retry_after_ms: None,
    }
}

fn from_error(e: Error) -> ServerMessage {
    match e {
        Error::Invalid(m) => error(ErrorKind::Invalid, m),
        e @ Error::Input(_) => error(ErrorKind::Invalid, e.to_string()),
        Error::Setting { message, .. } => error(ErrorKind::Invalid, message),
        Error::NotFound(m) => error(ErrorKind::NotFound, m),
        Error::OwnedElsewhere(m) => error(ErrorKind::Failed, m),
        Error::Throttled { message, retry_after } => ServerMessage::Error {
            kind: ErrorKind::Throttled,
            message,
            retry_after_ms: Some(u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX)),
        },
        other => error(ErrorKind::Failed, other.to_string()),
    }
}

/// Authenticates the client if it must, and returns its request.
async fn open(node: &Node, ws: &mut Ws, loopback: bool) -> Result<Request, String> {
    let mut nonce = [0u8; NONCE_LEN];
    getrandom::fill(&mut nonce).map_err(|e| format!("no random nonce: {e}"))?;
    let auth_required = node.inner.secret.is_some() && (node.inner.client_auth_always || !loopback);
    let hello = ServerHello {
        node: node.id(),
        name: node.name().to_string(),
        nonce,
        auth_required,
    };
    send(ws, &ServerMessage::Hello(hello)).await?;
    let mut msg = recv(ws).await?;
    // A client that sent a proof gets ours only if its proof was right (it always sends one
    // when it holds the secret, even on loopback, so that it can check ours).
    if let ClientMessage::Auth { nonce: theirs, proof } = msg {
        let Some(secret) = &node.inner.secret else {
            let m = "this agent has no cluster secret, so it cannot prove one; drop --cluster-secret-file, or give the agent the secret";
            let _ = send(ws, &error(ErrorKind::Unauthorized, m)).await;
            return Err("a client sent a proof of a secret this agent does not have".into());
        };
        if !secret.verify(CLIENT_LABEL, &[&nonce, &theirs], &proof) {
            let m = "wrong cluster secret; pass the agent's --cluster-secret-file";
            let _ = send(ws, &error(ErrorKind::Unauthorized, m)).await;
            return Err("a client's proof of the secret was wrong".into());
        }
        let proof = secret.prove(AGENT_LABEL, &[&nonce, &theirs]);
        send(ws, &ServerMessage::AuthOk { proof }).await?;
        msg = recv(ws).await?;
    } else if auth_required {
        let m =
            "this agent requires the cluster secret from clients not on loopback; pass --cluster-secret-file";
        let _ = send(ws, &error(ErrorKind::Unauthorized, m)).await;
        return Err("a client not on loopback sent no proof of the secret".into());
    }
    match msg {
        ClientMessage::Request(r) => Ok(r),
        ClientMessage::Auth { .. } => {
            let m = "this connection is authenticated already; send the request";
            let _ = send(ws, &error(ErrorKind::Invalid, m)).await;
            Err("a second authentication".into())
        }
    }
}

async fn serve(node: Node, conn: ClientConn, cancel: CancellationToken) {
    let loopback = conn.peer.ip().is_loopback();
    let peer = conn.peer;
    let mut conn = conn;
    let request = match tokio::time::timeout(REQUEST_TIMEOUT, open(&node, &mut conn.ws, loopback)).await {
        Ok(Ok(r)) => {
            // Its proof (or, where none is asked, its first request) is in: it no longer
            // counts against its address's cap of unauthenticated connections.
            conn.authenticated();
            r
        }
        Ok(Err(why)) => {
            debug!(%peer, "client refused: {why}");
            let _ = conn.ws.close(None).await;
            return;
        }
        Err(_) => {
            debug!(%peer, "client sent no request within {REQUEST_TIMEOUT:?}");
            let _ = conn.ws.close(None).await;
            return;
        }
    };
    requests(&node, &mut conn.ws, request, &cancel).await;
    let _ = tokio::time::timeout(Duration::from_secs(1), conn.ws.close(None)).await;
}

/// An answer on its way: ready, or a registration waiting for its commit.
enum Pending {
    Ready(ServerMessage),
    Register { instance: String, answer: Answer },
}

impl Pending {
    async fn answer(self) -> ServerMessage {
        match self {
            Self::Ready(m) => m,
            Self::Register { instance, answer } => match answer.await {
                Ok(Ok(())) => ServerMessage::Registered { instance },
                Ok(Err(e)) => from_error(e),
                Err(_) => from_error(Error::Stopped),
            },
        }
    }
}

/// Answers a client's requests, in order, until it leaves, idles or the node stops.
/// Registrations the client sent without waiting (up to [`MAX_IN_FLIGHT`]) are queued
/// together, so they share commits; any other request waits for them first.
async fn requests(node: &Node, ws: &mut Ws, first: Request, cancel: &CancellationToken) {
    let mut pending: VecDeque<Pending> = VecDeque::new();
    let mut next = Some(first);
    loop {
        if let Some(request) = next.take() {
            debug!(?request, "client request");
            match request {
                Request::Register {
                    service: name,
                    address,
                    meta,
                    instance,
                    ttl_ms,
                    checks,
                } => {
                    let s = service(RegisterItem {
                        service: name,
                        address,
                        meta,
                        instance,
                        ttl_ms,
                        checks,
                    });
                    pending.push_back(match node.register_queued(&s) {
                        Ok((instance, answer)) => Pending::Register { instance, answer },
                        Err(e) => Pending::Ready(from_error(e)),
                    });
                }
                other => {
                    if !flush(ws, &mut pending).await {
                        return;
                    }
                    match other {
                        Request::Watch { service, all } => {
                            watch(node, ws, &service, (Vec::new(), all), cancel).await;
                            return;
                        }
                        Request::WatchFrom { service, known, all } => {
                            watch(node, ws, &service, (known, all), cancel).await;
                            return;
                        }
                        _ => {}
                    }
                    if matches!(other, Request::Leave) {
                        leave(node, ws).await;
                        return;
                    }
                    if send(ws, &answer(node, other).await).await.is_err() {
                        return;
                    }
                }
            }
        }
        if pending.is_empty() {
            // Nothing owed: wait for the next request, if the client has one.
            match next_request(ws, cancel).await {
                Some(r) => next = Some(r),
                None => return,
            }
            continue;
        }
        // Read ahead what the client has sent already; else answer the oldest.
        if pending.len() < MAX_IN_FLIGHT {
            if let Some(r) = recv(ws).now_or_never() {
                match request_of(ws, r).await {
                    Some(r) => next = Some(r),
                    None => return,
                }
                continue;
            }
        }
        if let Some(p) = pending.pop_front() {
            if send(ws, &p.answer().await).await.is_err() {
                return;
            }
        }
    }
}

/// Answers a `Leave`, then leaves: on a task of its own, since leaving waits for every
/// client connection to end, this one included.
async fn leave(node: &Node, ws: &mut Ws) {
    info!(
        node = node.name(),
        "a client asked this node to leave the cluster"
    );
    let _ = send(ws, &ServerMessage::Left).await;
    let node = node.clone();
    tokio::spawn(async move {
        if let Err(e) = node.shutdown().await {
            warn!("left the cluster, but the last save failed: {e}");
        }
    });
}

/// Sends every pending answer, in order. False when the client is gone.
async fn flush(ws: &mut Ws, pending: &mut VecDeque<Pending>) -> bool {
    while let Some(p) = pending.pop_front() {
        if send(ws, &p.answer().await).await.is_err() {
            return false;
        }
    }
    true
}

/// The client's next request, within [`IDLE_TIMEOUT`].
async fn next_request(ws: &mut Ws, cancel: &CancellationToken) -> Option<Request> {
    let received = tokio::select! {
        () = cancel.cancelled() => return None,
        r = tokio::time::timeout(IDLE_TIMEOUT, recv(ws)) => r.ok()?,
    };
    request_of(ws, received).await
}

/// The request in what a client sent, if it is one.
async fn request_of(ws: &mut Ws, received: Result<ClientMessage, String>) -> Option<Request> {
    match received {
        Ok(ClientMessage::Request(r)) => Some(r),
        Ok(ClientMessage::Auth { .. }) => {
            let m = "this connection is authenticated already; send the request";
            let _ = send(ws, &error(ErrorKind::Invalid, m)).await;
            None
        }
        // It hung up (a one-shot client does), or sent garbage.
        Err(_) => None,
    }
}

/// The answer to one request (not a watch, nor a single registration).
async fn answer(node: &Node, request: Request) -> ServerMessage {
    match request {
        // Both are served by `requests`, never here.
        Request::Watch { .. } | Request::WatchFrom { .. } | Request::Register { .. } | Request::Leave => {
            error(
                ErrorKind::Failed,
                "this request is served on its own; send it again",
            )
        }
        Request::RegisterMany { items } => {
            let services = items.into_iter().map(service).collect();
            match node.register_many_owned(services).await {
                Ok(instances) => ServerMessage::RegisteredMany { instances },
                Err(e) => from_error(e),
            }
        }
        Request::Deregister { service, instance } => match node.deregister(&service, &instance).await {
            Ok(()) => ServerMessage::Deregistered,
            Err(e) => from_error(e),
        },
        Request::Services => {
            ServerMessage::Services(node.services().into_iter().map(|(s, n)| (s, n as u64)).collect())
        }
        Request::Instances { service, all, near } => match ServiceName::new(&service) {
            Err(e) => error(ErrorKind::Invalid, e.to_string()),
            Ok(_) => {
                let near = match near.as_deref().map(|z| node.near_zone(z)).transpose() {
                    Ok(near) => near,
                    Err(e) => return error(ErrorKind::Invalid, format!("--near: {e}")),
                };
                let found = if all {
                    node.lookup_all(&service)
                } else {
                    node.lookup(&service)
                };
                let found = match near {
                    Some(zone) => node.near_first(found, &zone),
                    None => found,
                };
                ServerMessage::Instances(found.iter().map(|i| i.view()).collect())
            }
        },
        Request::Pass { service, instance } => match node.pass(&service, &instance) {
            Ok(()) => ServerMessage::Passed,
            Err(e) => from_error(e),
        },
        Request::Maintenance { instance, reason } => {
            let target = instance.as_ref().map(|(s, i)| (s.as_str(), i.as_str()));
            match node.maintenance(target, reason.as_deref()).await {
                Ok(changed) => ServerMessage::Maintenance { changed },
                Err(e) => from_error(e),
            }
        }
        Request::Members => match node.members().await {
            Ok(m) => ServerMessage::Members(m.iter().map(crate::node::Member::view).collect()),
            Err(e) => from_error(e),
        },
        Request::Status => match node.status().await {
            Ok(s) => ServerMessage::Status(Box::new(s)),
            Err(e) => from_error(e),
        },
        Request::Explain { service, instance } => match node.explain(&service, &instance).await {
            Ok(x) => ServerMessage::Explain(Box::new(x)),
            Err(e) => from_error(e),
        },
        Request::RemoveAsOperator { service, instance } => {
            match node.remove_as_operator(&service, &instance).await {
                Ok(()) => ServerMessage::Deregistered,
                Err(e) => from_error(e),
            }
        }
        Request::ForceLeave { node: target } => match node.force_leave(&target).await {
            Ok(node) => ServerMessage::ForcedLeave { node },
            Err(e) => from_error(e),
        },
        Request::Sync => match node.sync().await {
            Ok(asked) => ServerMessage::Synced { asked },
            Err(e) => from_error(e),
        },
    }
}

/// The instance a register request names.
fn service(item: RegisterItem) -> Service {
    let mut s = Service::new(item.service, item.address);
    for (k, v) in item.meta {
        s = s.meta(k, v);
    }
    if let Some(i) = item.instance {
        s = s.id(i);
    }
    if let Some(t) = item.ttl_ms {
        s = s.ttl(Duration::from_millis(t));
    }
    for c in item.checks {
        s = s.check(c);
    }
    s
}

/// Streams what differs between a service's instances and what the client shows (`known`,
/// by fingerprint), then its changes, until the client leaves or the node stops.
async fn watch(
    node: &Node,
    ws: &mut Ws,
    service: &str,
    (known, all): (Vec<(String, u64)>, bool),
    cancel: &CancellationToken,
) {
    if let Err(e) = ServiceName::new(service) {
        let _ = send(ws, &error(ErrorKind::Invalid, e.to_string())).await;
        return;
    }
    let mut events = node.watch_from(service, &known.into_iter().collect(), all);
    // The current instances first, then a marker-free stream of changes.
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            e = events.recv() => {
                let Some(e) = e else { return };
                let view = match e {
                    Event::Up(i) => EventView::Up(i.view()),
                    Event::Status(i) => EventView::Status(i.view()),
                    Event::Down { service, id, .. } => EventView::Down { service, instance: id },
                };
                if send(ws, &ServerMessage::Event(view)).await.is_err() {
                    return;
                }
            }
            m = ws.next() => match m {
                None | Some(Err(_)) | Some(Ok(WsMessage::Close(_))) => return,
                Some(Ok(_)) => {}
            },
        }
    }
}
