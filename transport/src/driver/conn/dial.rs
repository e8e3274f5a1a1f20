//! Dialing a peer: its URL, TCP and TLS, the upgrade, then the handshake as the dialer.

use std::future::Future;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::ClientRequestBuilder;
use tokio_tungstenite::tungstenite::http::Uri;

use super::{
    bounded, client_handshake, refuse, run, tls_dial_fail, ws_fail, ConnEvent, Fail, PeerCert, Shared,
    SUBPROTOCOL,
};
use crate::driver::limits::bump;
use crate::driver::tls::{self, Tls};
use crate::proto::DialTarget;

/// The host and port of a `ws://` or `wss://` URL, and whether it is `wss`.
pub(super) fn parse_url(url: &str) -> Result<(Uri, String, u16, bool), Fail> {
    let bad = |why: &str| Fail::Network(format!("cannot dial {url:?}: {why}"));
    let uri: Uri = url.parse().map_err(|_| bad("not a URL"))?;
    let tls = match uri.scheme_str() {
        Some("ws") => false,
        Some("wss") => true,
        _ => return Err(bad("the scheme is neither ws nor wss")),
    };
    let host = uri.host().ok_or_else(|| bad("no host"))?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
        .to_string();
    let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
    Ok((uri, host, port, tls))
}

/// Dials `target`: TCP, TLS for `wss://`, the upgrade, the handshake, then the connection.
/// A failure before the connection is up is reported as `DialFailed`.
pub(in crate::driver) async fn dial(target: DialTarget, shared: Arc<Shared>) {
    let url = match &target {
        DialTarget::Peer { url, .. } | DialTarget::Seed { url } => url.clone(),
    };
    let result = match parse_url(&url) {
        Err(fail) => Err(fail),
        Ok((uri, host, port, tls)) => {
            let tcp = async move {
                let tcp = TcpStream::connect((host.as_str(), port))
                    .await
                    .map_err(|e| Fail::Network(e.to_string()))?;
                let _ = tcp.set_nodelay(true);
                Ok((tcp, host))
            };
            match (tls, shared.tls.as_ref().map(Tls::connector)) {
                (false, _) => {
                    dial_over(&shared, &target, uri, async {
                        Ok((tcp.await?.0, PeerCert::NoTls))
                    })
                    .await
                }
                (true, Some(connector)) => {
                    let stream = async move {
                        let (tcp, host) = tcp.await?;
                        let name = tls::server_name(&host).map_err(Fail::Tls)?;
                        let s = connector.connect(name, tcp).await.map_err(tls_dial_fail)?;
                        let cert = tls::leaf(s.get_ref().1.peer_certificates());
                        Ok((s, cert))
                    };
                    dial_over(&shared, &target, uri, stream).await
                }
                (true, None) => Err(Fail::Network(format!(
                    "cannot dial {url}: this node has no TLS configuration"
                ))),
            }
        }
    };
    match result {
        Ok(()) | Err(Fail::Cancelled) => {}
        Err(fail) => {
            fail.record(&shared, &url, None);
            bump(&shared.counts.dial_failures);
            let failure = fail.failure();
            let _ = shared
                .events
                .send(ConnEvent::DialFailed { target, failure })
                .await;
        }
    }
}

pub(super) async fn dial_over<S>(
    shared: &Arc<Shared>,
    target: &DialTarget,
    uri: Uri,
    stream: impl Future<Output = Result<(S, PeerCert), Fail>>,
) -> Result<(), Fail>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let establish = async {
        let (stream, cert) = stream.await?;
        let request = ClientRequestBuilder::new(uri).with_sub_protocol(SUBPROTOCOL);
        let (mut ws, _) =
            tokio_tungstenite::client_async_with_config(request, stream, Some(shared.ws_config()))
                .await
                .map_err(ws_fail)?;
        match client_handshake(&mut ws, shared, target, &cert).await {
            Ok(peer) => Ok((ws, peer)),
            Err(fail) => {
                refuse(&mut ws, &fail).await;
                Err(fail)
            }
        }
    };
    let (ws, peer) = bounded(shared, establish).await?;
    let seed = match target {
        DialTarget::Seed { url } => Some(url.clone()),
        DialTarget::Peer { .. } => None,
    };
    run(ws, shared.next_conn(), peer, true, seed, Arc::clone(shared)).await;
    Ok(())
}
