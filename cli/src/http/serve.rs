//! The HTTP server loop: hyper's HTTP/1.1 connections, bounded in number and in how long a
//! request's head may take to arrive (a slow client cannot hold a connection open by
//! trickling its headers); each request goes to the router with the client's address.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;
use tracing::{debug, warn};

use tokio_rustls::TlsAcceptor;

use super::bare_errors::JsonBareErrors;
use super::Client;

/// The most HTTP connections open at once (watches included); past it, new ones are
/// closed at once.
pub const MAX_CONNECTIONS: usize = 1024;
/// How long a request's head (its line and headers) may take to arrive.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long open connections have to finish when the agent stops.
const DRAIN: Duration = Duration::from_secs(5);

/// Accepts connections (through TLS when `tls` is set) until `stop`, then waits for the
/// open ones to end.
pub async fn accept(
    listener: TcpListener,
    router: Router,
    tls: Option<TlsAcceptor>,
    stop: CancellationToken,
) {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let tracker = TaskTracker::new();
    loop {
        let (stream, addr) = tokio::select! {
            () = stop.cancelled() => break,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // Out of file descriptors, most likely: wait for some to close.
                    warn!("HTTP accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            debug!(%addr, "HTTP connection closed: {MAX_CONNECTIONS} are open");
            continue;
        };
        tracker.spawn(connection(
            stream,
            addr,
            (router.clone(), tls.clone()),
            stop.clone(),
            permit,
        ));
    }
    tracker.close();
    tracker.wait().await;
}

/// Serves one connection's requests until it closes, or the agent stops: after a TLS
/// handshake (within [`HEADER_TIMEOUT`]) when the API serves HTTPS.
async fn connection(
    stream: TcpStream,
    addr: SocketAddr,
    (router, tls): (Router, Option<TlsAcceptor>),
    stop: CancellationToken,
    _permit: OwnedSemaphorePermit,
) {
    let Some(tls) = tls else {
        let client = Client {
            addr,
            certificate: false,
        };
        return serve(stream, client, router, stop).await;
    };
    match tokio::time::timeout(HEADER_TIMEOUT, tls.accept(stream)).await {
        Ok(Ok(stream)) => {
            // rustls checked it against the CA: a certificate shown is one of the cluster's.
            let certificate = stream
                .get_ref()
                .1
                .peer_certificates()
                .is_some_and(|c| !c.is_empty());
            serve(stream, Client { addr, certificate }, router, stop).await;
        }
        Ok(Err(e)) => debug!(%addr, "HTTPS handshake failed: {e}"),
        Err(_) => debug!(%addr, "HTTPS handshake not done within {HEADER_TIMEOUT:?}"),
    }
}

/// Serves HTTP/1.1 on `io` until the client leaves or the agent stops; a request hyper
/// cannot parse is answered with the API's JSON error ([`JsonBareErrors`]).
async fn serve<I>(io: I, client: Client, router: Router, stop: CancellationToken)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let addr = client.addr;
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        req.extensions_mut().insert(client);
        router.clone().oneshot(req.map(axum::body::Body::new))
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT);
    let conn = builder.serve_connection(TokioIo::new(JsonBareErrors::new(io)), service);
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                debug!(%addr, "HTTP connection ended: {e}");
            }
        }
        () = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(DRAIN, conn).await;
        }
    }
}
