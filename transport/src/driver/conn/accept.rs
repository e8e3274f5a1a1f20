//! Accepting a connection: admission, the upgrade and its subprotocol, then the handshake
//! as the listener.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::{HeaderValue, StatusCode};
use tokio_tungstenite::WebSocketStream;
use tracing::{debug, warn};

use super::{
    refuse, run, server_handshake, ws_fail, ClientConn, ClientStream, Fail, PeerCert, Shared, SUBPROTOCOL,
};
use crate::driver::limits::bump;
use crate::driver::tls::{self, Tls};
use crate::driver::unauthenticated::PendingGuard;
use crate::proto::NodeInfo;

/// Counts an inbound connection for the inbound cap while it lives.
#[derive(Debug)]
pub(crate) struct InboundGuard(Arc<AtomicUsize>);

impl InboundGuard {
    pub(in crate::driver) fn new(count: Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(count)
    }
}

impl Drop for InboundGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Accepts the upgrade for peers that ask for [`SUBPROTOCOL`] and, when `clients` is set,
/// for clients that ask for its subprotocol (noting it in the flag); echoes it.
#[allow(clippy::result_large_err)] // the signature is tungstenite's
pub(super) fn check_subprotocol(
    req: &Request,
    mut resp: Response,
    clients: Option<(&'static str, &AtomicBool)>,
    admit: &mut dyn FnMut(bool) -> Option<u64>,
) -> Result<Response, ErrorResponse> {
    let offered: Vec<&str> = req
        .headers()
        .get_all("Sec-WebSocket-Protocol")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect();
    let busy = |retry_s: u64| {
        let mut e = ErrorResponse::new(Some("too many connections from this address; retry later".into()));
        *e.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        if let Ok(v) = HeaderValue::from_str(&retry_s.to_string()) {
            e.headers_mut().insert("Retry-After", v);
        }
        e
    };
    let chosen = if offered.contains(&SUBPROTOCOL) {
        if let Some(retry_s) = admit(false) {
            return Err(busy(retry_s));
        }
        SUBPROTOCOL
    } else if let Some((name, flag)) = clients.filter(|(name, _)| offered.contains(name)) {
        if let Some(retry_s) = admit(true) {
            return Err(busy(retry_s));
        }
        flag.store(true, Ordering::Relaxed);
        name
    } else {
        let clients = clients.map_or(String::new(), |(name, _)| format!(", clients {name}"));
        let mut e = ErrorResponse::new(Some(format!(
            "roster peers speak the {SUBPROTOCOL} subprotocol{clients}"
        )));
        *e.status_mut() = StatusCode::BAD_REQUEST;
        return Err(e);
    };
    resp.headers_mut()
        .insert("Sec-WebSocket-Protocol", HeaderValue::from_static(chosen));
    Ok(resp)
}

/// Runs `work` within the handshake timeout, unless the node shuts down first.
pub(super) async fn bounded<T>(
    shared: &Shared,
    work: impl Future<Output = Result<T, Fail>>,
) -> Result<T, Fail> {
    tokio::select! {
        () = shared.shutdown.cancelled() => Err(Fail::Cancelled),
        r = tokio::time::timeout(shared.limits.handshake_timeout, work) => r.unwrap_or(Err(Fail::Timeout)),
    }
}

/// Serves one accepted TCP connection: TLS if configured, the upgrade, then the handshake
/// and the connection (a peer), or the hand-off to the application (a client). `guard`
/// holds its place under the inbound cap until it ends.
pub(in crate::driver) async fn inbound(
    tcp: TcpStream,
    addr: SocketAddr,
    shared: Arc<Shared>,
    guard: InboundGuard,
    pending: PendingGuard,
) {
    let who = addr.to_string();
    let result = match shared.tls.as_ref().map(Tls::acceptor) {
        None => {
            accept_over(
                &shared,
                async { Ok((Box::new(tcp) as Box<dyn ClientStream>, PeerCert::NoTls)) },
                addr,
                (guard, pending),
            )
            .await
        }
        Some(acceptor) => {
            // A client that does not speak TLS is common noise (scanners): a network failure.
            // A certificate that does not verify is refused by rustls here; a connection
            // without one gets through, marked, and is sorted out once we know what it is.
            let tls = async move {
                acceptor
                    .accept(tcp)
                    .await
                    .map(|s| {
                        let cert = tls::leaf(s.get_ref().1.peer_certificates());
                        (Box::new(s) as Box<dyn ClientStream>, cert)
                    })
                    .map_err(|e| Fail::Network(format!("TLS: {e}")))
            };
            accept_over(&shared, tls, addr, (guard, pending)).await
        }
    };
    if let Err(fail) = result {
        fail.record(&shared, &who, Some(addr.ip()));
    }
}

pub(super) async fn accept_over(
    shared: &Arc<Shared>,
    stream: impl Future<Output = Result<(Box<dyn ClientStream>, PeerCert), Fail>>,
    addr: SocketAddr,
    (guard, pending): (InboundGuard, PendingGuard),
) -> Result<(), Fail> {
    let is_client = AtomicBool::new(false);
    let flag = shared.clients.as_ref().map(|c| (c.name, &is_client));
    let establish = async {
        let (stream, cert) = stream.await?;
        let uncertified = matches!(cert, PeerCert::Missing);
        let mut ws = tokio_tungstenite::accept_hdr_async_with_config(
            stream,
            #[allow(clippy::result_large_err)] // the signature is tungstenite's
            |req: &Request, resp: Response| {
                let mut admit = |client: bool| shed(shared, addr, client);
                check_subprotocol(req, resp, flag, &mut admit)
            },
            Some(shared.ws_config()),
        )
        .await
        .map_err(ws_fail)?;
        let client = is_client.load(Ordering::Relaxed);
        // Mutual TLS: a peer always shows a certificate of the cluster CA; a client does
        // unless it connects from loopback (the local CLI).
        if uncertified && (!client || !addr.ip().is_loopback()) {
            let fail = Fail::NoClientCertificate { client };
            refuse(&mut ws, &fail).await;
            return Err(fail);
        }
        if client {
            return Ok((ws, None));
        }
        match server_handshake(&mut ws, shared, &cert).await {
            Ok(peer) => Ok((ws, Some(peer))),
            Err(fail) => {
                refuse(&mut ws, &fail).await;
                Err(fail)
            }
        }
    };
    let (ws, peer) = bounded(shared, establish).await?;
    hand_over(shared, addr, ws, peer, (guard, pending)).await;
    Ok(())
}

/// Whether the upgrade of a connection from `addr` (a client's, or a peer's) is shed:
/// `None` admits it, `Some(s)` refuses it with a `Retry-After` of `s` seconds. What it sheds
/// is counted, and logged once a minute per address.
fn shed(shared: &Shared, addr: SocketAddr, client: bool) -> Option<u64> {
    if !client && shared.refuse_peers.load(Ordering::Relaxed) {
        bump(&shared.counts.peers_shed);
        // Under the crash guard: come back after its window, spread over half as long again.
        let retry = shared.guard_retry_s;
        return Some(retry + getrandom::u64().unwrap_or(0) % (retry / 2).max(1));
    }
    if shared.may_accept(addr.ip(), client) {
        return None;
    }
    let (count, what) = if client {
        (&shared.counts.clients_shed, "client")
    } else {
        (&shared.counts.peers_shed, "peer")
    };
    bump(count);
    if let Some(n) = shared.log_gate.admit(addr.ip(), Instant::now()) {
        warn!(
            node = shared.node(),
            peer = %addr,
            "shed a {what} connection: too many from that address \
             ({n} more refusals from it in the last minute not logged)"
        );
    }
    // A peer: come back in 1 to 5 s, spread. A client (a CLI command, a
    // script): in 1 s, which it spreads itself; its bucket refills in
    // milliseconds, and a client waits within a 5 s connect timeout.
    Some(match client {
        true => 1,
        false => 1 + getrandom::u64().unwrap_or(0) % 5,
    })
}

/// An established connection goes where it belongs: an authenticated peer's runs here
/// until it closes; a client's goes to the application (dropped if it takes none).
async fn hand_over(
    shared: &Arc<Shared>,
    addr: SocketAddr,
    ws: WebSocketStream<Box<dyn ClientStream>>,
    peer: Option<NodeInfo>,
    (guard, pending): (InboundGuard, PendingGuard),
) {
    match peer {
        Some(peer) => {
            // Authenticated: it no longer counts against its address's cap.
            drop(pending);
            run(ws, shared.next_conn(), peer, false, None, Arc::clone(shared)).await;
            drop(guard);
        }
        None => {
            if let Some(clients) = &shared.clients {
                bump(&shared.counts.clients_accepted);
                let conn = ClientConn {
                    ws,
                    peer: addr,
                    _slot: guard,
                    pending: Some(pending),
                };
                if clients.conns.send(conn).await.is_err() {
                    debug!(node = shared.node(), "a client connected while the node stops");
                }
            }
        }
    }
}
