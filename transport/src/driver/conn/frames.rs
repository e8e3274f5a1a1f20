//! The handshake's frames on a WebSocket, both sides of the handshake, and a refusal the
//! peer can log.

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::WebSocketStream;

use super::{ws_fail, Fail, PeerCert, Shared, CLOSE_LINGER, MAX_CLOSE_REASON};
use crate::driver::now_ms;
use crate::driver::tls::{self};
use crate::handshake::{self, HandshakeError, HandshakeMessage, RefusalKind, NONCE_LEN};
use crate::proto::{DialTarget, NodeInfo};

pub(super) fn cut(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

pub(super) fn close_frame(code: CloseCode, reason: &str) -> CloseFrame {
    CloseFrame {
        code,
        reason: cut(reason, MAX_CLOSE_REASON).into(),
    }
}

pub(super) fn nonce() -> Result<[u8; NONCE_LEN], Fail> {
    let mut n = [0u8; NONCE_LEN];
    getrandom::fill(&mut n).map_err(|e| Fail::Network(format!("no random nonce from the OS: {e}")))?;
    Ok(n)
}

/// Reads the next handshake frame, skipping pings.
pub(super) async fn recv_frame<S>(ws: &mut WebSocketStream<S>) -> Result<HandshakeMessage, Fail>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    loop {
        match ws.next().await {
            None => return Err(Fail::Network("the peer hung up during the handshake".into())),
            Some(Err(e)) => return Err(ws_fail(e)),
            Some(Ok(WsMessage::Binary(b))) => return HandshakeMessage::decode(&b).map_err(Fail::Handshake),
            Some(Ok(WsMessage::Text(_))) => {
                return Err(Fail::Handshake(HandshakeError::Malformed("a text frame".into())))
            }
            Some(Ok(WsMessage::Close(f))) => {
                let why = f.map(|f| f.reason.to_string()).unwrap_or_default();
                return Err(Fail::Network(format!(
                    "the peer closed during the handshake: {why}"
                )));
            }
            Some(Ok(WsMessage::Ping(_) | WsMessage::Pong(_) | WsMessage::Frame(_))) => {}
        }
    }
}

pub(super) async fn send_frame<S>(ws: &mut WebSocketStream<S>, msg: &HandshakeMessage) -> Result<(), Fail>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    ws.send(WsMessage::binary(msg.encode())).await.map_err(ws_fail)
}

/// Tells the peer why we stop (a refusal frame, then a close frame), briefly.
pub(super) async fn refuse<S>(ws: &mut WebSocketStream<S>, fail: &Fail)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let goodbye = async {
        if let Fail::Handshake(e) = fail {
            if let Some(refusal) = e.to_refusal() {
                let _ = send_frame(ws, &refusal).await;
            }
        }
        if let Some(frame) = fail.close_frame() {
            let _ = ws.close(Some(frame)).await;
        }
    };
    let _ = tokio::time::timeout(CLOSE_LINGER, goodbye).await;
}

pub(super) async fn server_handshake<S>(
    ws: &mut WebSocketStream<S>,
    shared: &Shared,
    cert: &PeerCert,
) -> Result<NodeInfo, Fail>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut server = handshake::Server::new(&shared.handshake, nonce()?);
    let hello = recv_frame(ws).await?;
    let challenge = server.on_hello(hello, now_ms()).map_err(Fail::Handshake)?;
    send_frame(ws, &challenge).await?;
    let proof = recv_frame(ws).await?;
    let (peer, welcome) = server.on_proof(proof).map_err(Fail::Handshake)?;
    check_certificate_names(ws, cert, &peer).await?;
    send_frame(ws, &welcome).await?;
    Ok(peer)
}

/// With TLS, a peer may speak only as the node its certificate names: a DNS name
/// `node-<id>` (the id as 16 hex digits, as `roster members` shows it). A peer that claims
/// another id is refused with the reason, before any protocol message.
pub(super) async fn check_certificate_names<S>(
    ws: &mut WebSocketStream<S>,
    cert: &PeerCert,
    peer: &NodeInfo,
) -> Result<(), Fail>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let named = match cert {
        PeerCert::NoTls => true,
        PeerCert::Missing => false,
        PeerCert::Shown(der) => tls::names_node(der, &peer.id.to_string()),
    };
    if named {
        return Ok(());
    }
    let fail = Fail::CertificateNamesAnother {
        claimed: peer.id.to_string(),
    };
    let _ = send_frame(
        ws,
        &HandshakeMessage::refused(RefusalKind::Secret, &fail.to_line()),
    )
    .await;
    Err(fail)
}

pub(super) async fn client_handshake<S>(
    ws: &mut WebSocketStream<S>,
    shared: &Shared,
    target: &DialTarget,
    cert: &PeerCert,
) -> Result<NodeInfo, Fail>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (mut client, hello) = handshake::Client::start(&shared.handshake, nonce()?, now_ms());
    send_frame(ws, &hello).await?;
    let challenge = recv_frame(ws).await?;
    let (peer, proof) = client
        .on_challenge(challenge, now_ms())
        .map_err(Fail::Handshake)?;
    if let DialTarget::Peer { id, .. } = target {
        if *id != peer.id {
            let _ = send_frame(
                ws,
                &HandshakeMessage::refused(RefusalKind::Unavailable, "not the node dialed"),
            )
            .await;
            return Err(Fail::WrongPeer {
                expected: id.to_string(),
                got: peer.id.to_string(),
            });
        }
    }
    check_certificate_names(ws, cert, &peer).await?;
    send_frame(ws, &proof).await?;
    client
        .on_outcome(recv_frame(ws).await?)
        .map_err(Fail::Handshake)?;
    Ok(peer)
}
