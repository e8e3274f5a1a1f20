//! The client side of the client protocol: what `roster` commands use to ask an agent.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use roster_transport::driver::{ClientStream, ClientTls};

use crate::api::CLIENT_SUBPROTOCOL;
use roster_transport::handshake::Secret;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::ClientRequestBuilder;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::WebSocketStream;

use crate::api::{
    self, ClientMessage, Request, ServerHello, ServerMessage, AGENT_LABEL, CLIENT_LABEL, MAX_ANSWER_BYTES,
    NONCE_LEN,
};

mod watch;

pub use watch::{RemoteWatch, WatchError, WatchEvent};

/// How long connecting and authenticating may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an answer may take.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a client could not talk to an agent.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing answered, or not a roster agent.
    #[error(
        "cannot reach a roster agent at {url}: {why}; start one with `roster agent` or pass --agent URL"
    )]
    Unreachable {
        /// The agent URL.
        url: String,
        /// Why.
        why: String,
    },
    /// Something answered at the URL over HTTP, but not as a roster agent's client port
    /// does: an HTTP server, or a roster agent's HTTP API (`--http-listen`).
    #[error("{url} is not a roster agent's client port: {why}")]
    NotAnAgent {
        /// The agent URL.
        url: String,
        /// What answered, and what to pass instead.
        why: String,
    },
    /// The agent turned the connection away for now (too many new client connections from
    /// this address), and kept doing so until the connect timeout.
    #[error(
        "the roster agent at {url} is busy: it turns away new client connections from this address for now; retry in {retry_after_s} s, or reuse one connection for many requests"
    )]
    Busy {
        /// The agent URL.
        url: String,
        /// The agent's hint, in seconds.
        retry_after_s: u64,
    },
    /// The agent refused our proof, or could not prove its own.
    #[error("cannot authenticate to the roster agent at {url}: {why}")]
    Unauthorized {
        /// The agent URL.
        url: String,
        /// Why.
        why: String,
    },
    /// The agent broke the protocol or hung up.
    #[error("the roster agent at {url} {why}")]
    Protocol {
        /// The agent URL.
        url: String,
        /// What happened.
        why: String,
    },
}

/// A connection to an agent, authenticated if the agent asked for it.
#[derive(Debug)]
pub struct Client {
    url: String,
    ws: WebSocketStream<Box<dyn ClientStream>>,
    hello: ServerHello,
}

impl Client {
    /// Connects to the agent at `url` (`ws://host:port`) and authenticates with `secret`
    /// when the agent asks for it.
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn connect(url: &str, secret: Option<&Secret>) -> Result<Self, ClientError> {
        Self::connect_tls(url, secret, None).await
    }

    /// As [`Client::connect`], and `wss://host:port` with `tls`: the agent's certificate
    /// is checked against its CA, and a client certificate shown if `tls` holds one.
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn connect_tls(
        url: &str,
        secret: Option<&Secret>,
        tls: Option<&ClientTls>,
    ) -> Result<Self, ClientError> {
        let deadline = tokio::time::Instant::now() + CONNECT_TIMEOUT;
        loop {
            let attempt = tokio::time::timeout_at(deadline, Self::open(url, secret, tls)).await;
            match attempt {
                // Turned away for now: wait as the agent asks (jittered, so clients turned
                // away together do not come back together), while the timeout allows.
                Ok(Err(ClientError::Busy { retry_after_s, .. }))
                    if tokio::time::Instant::now() + Duration::from_secs(retry_after_s) < deadline =>
                {
                    let wait_ms = retry_after_s.max(1) * 1_000;
                    let jitter = getrandom::u64().unwrap_or_default() % (wait_ms / 2 + 1);
                    tokio::time::sleep(Duration::from_millis(wait_ms / 2 + jitter)).await;
                }
                Ok(r) => return r,
                Err(_) => {
                    return Err(ClientError::Unreachable {
                        url: url.to_string(),
                        why: format!("no answer within {CONNECT_TIMEOUT:?}"),
                    })
                }
            }
        }
    }

    async fn open(url: &str, secret: Option<&Secret>, tls: Option<&ClientTls>) -> Result<Self, ClientError> {
        let mut client = Self {
            url: url.to_string(),
            ws: upgrade(url, tls).await?,
            hello: ServerHello {
                node: String::new(),
                name: String::new(),
                nonce: [0; NONCE_LEN],
                auth_required: false,
            },
        };
        let hello = client.agent_hello().await?;
        // A client that holds the secret always makes the agent prove it, whatever the
        // agent's hello says: an impostor without the secret would simply say that it asks
        // for none.
        match (secret, hello.auth_required) {
            (Some(secret), _) => client.authenticate(secret, &hello.nonce).await?,
            (None, true) => {
                return Err(ClientError::Unauthorized {
                    url: client.url.clone(),
                    why: "it requires the cluster secret from clients not on loopback; pass --cluster-secret-file FILE (or set ROSTER_CLUSTER_SECRET_FILE)".into(),
                });
            }
            (None, false) => {}
        }
        client.hello = hello;
        Ok(client)
    }

    /// The agent's first message, its hello.
    async fn agent_hello(&mut self) -> Result<ServerHello, ClientError> {
        let first = match self.recv().await {
            // An agent with TLS closes on a client not on loopback that showed no certificate.
            Err(ClientError::Protocol { url, why }) if why.contains("client certificate") => {
                return Err(ClientError::Unauthorized {
                    url,
                    why: format!(
                        "it {why}; pass --tls-cert FILE and --tls-key FILE (a certificate of its CA)"
                    ),
                });
            }
            other => other?,
        };
        match first {
            ServerMessage::Hello(h) => Ok(h),
            other => Err(self.protocol(format!("sent {other:?} instead of its hello"))),
        }
    }

    /// Proves the secret to the agent, then checks the agent's proof: the agent proves it
    /// only after ours was right, so its proof is no oracle for a client without the secret.
    async fn authenticate(
        &mut self,
        secret: &Secret,
        agent_nonce: &[u8; NONCE_LEN],
    ) -> Result<(), ClientError> {
        let unauthorized = |url: &str, why: String| ClientError::Unauthorized {
            url: url.to_string(),
            why,
        };
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce).map_err(|e| ClientError::Unreachable {
            url: self.url.clone(),
            why: format!("no random nonce: {e}"),
        })?;
        let proof = secret.prove(CLIENT_LABEL, &[agent_nonce, &nonce]);
        self.send(&ClientMessage::Auth { nonce, proof }).await?;
        let not_proved = "the agent did not prove it holds the cluster secret";
        match self.recv().await {
            Ok(ServerMessage::AuthOk { proof }) => {
                if secret.verify(AGENT_LABEL, &[agent_nonce, &nonce], &proof) {
                    Ok(())
                } else {
                    Err(unauthorized(
                        &self.url,
                        format!("{not_proved} (its proof is wrong); check --agent"),
                    ))
                }
            }
            Ok(ServerMessage::Error { message, .. }) => Err(unauthorized(&self.url, message)),
            Ok(other) => Err(unauthorized(
                &self.url,
                format!(
                    "{not_proved} (it answered {} instead); check --agent",
                    other.name()
                ),
            )),
            Err(ClientError::Protocol { why, .. }) => Err(unauthorized(
                &self.url,
                format!("{not_proved} (it {why}); check --agent"),
            )),
            Err(e) => Err(e),
        }
    }

    fn protocol(&self, why: String) -> ClientError {
        ClientError::Protocol {
            url: self.url.clone(),
            why,
        }
    }

    /// The agent's hello.
    pub fn hello(&self) -> &ServerHello {
        &self.hello
    }

    async fn send(&mut self, msg: &ClientMessage) -> Result<(), ClientError> {
        let bytes = api::encode(msg);
        self.ws
            .send(WsMessage::binary(bytes))
            .await
            .map_err(|e| self.protocol(format!("hung up: {e}")))
    }

    /// The next message from the agent.
    ///
    /// # Errors
    /// [`ClientError::Protocol`] when it hung up or sent something malformed.
    pub async fn recv(&mut self) -> Result<ServerMessage, ClientError> {
        loop {
            match self.ws.next().await {
                None => return Err(self.protocol("hung up".into())),
                Some(Err(e)) => return Err(self.protocol(format!("hung up: {e}"))),
                Some(Ok(WsMessage::Binary(b))) => {
                    return api::decode(&b).map_err(|e| self.protocol(format!("sent {e}")));
                }
                Some(Ok(WsMessage::Close(f))) => {
                    let why = f.map(|f| f.reason.to_string()).unwrap_or_default();
                    return Err(self.protocol(if why.is_empty() {
                        "closed the connection".to_string()
                    } else {
                        format!("closed the connection: {why}")
                    }));
                }
                Some(Ok(_)) => {}
            }
        }
    }

    /// Sends a request and waits for its answer (for a watch: its first message; call
    /// [`Client::recv`] for the next).
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn request(&mut self, req: Request) -> Result<ServerMessage, ClientError> {
        self.send(&ClientMessage::Request(req)).await?;
        match tokio::time::timeout(ANSWER_TIMEOUT, self.recv()).await {
            Ok(r) => r,
            Err(_) => Err(self.protocol(format!("sent no answer within {ANSWER_TIMEOUT:?}"))),
        }
    }

    /// Sends a request whose answers stream (a watch), without waiting.
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn start(&mut self, req: Request) -> Result<(), ClientError> {
        self.send(&ClientMessage::Request(req)).await
    }
}

/// A connection to the agent at `url` (TCP, and TLS for `wss://`), upgraded to the client
/// protocol's WebSocket.
async fn upgrade(
    url: &str,
    tls: Option<&ClientTls>,
) -> Result<WebSocketStream<Box<dyn ClientStream>>, ClientError> {
    let unreachable = |why: String| ClientError::Unreachable {
        url: url.to_string(),
        why,
    };
    let (uri, stream) = connect(url, tls).await?;
    let request = ClientRequestBuilder::new(uri).with_sub_protocol(CLIENT_SUBPROTOCOL);
    let config = WebSocketConfig::default()
        .max_message_size(Some(MAX_ANSWER_BYTES))
        .max_frame_size(Some(MAX_ANSWER_BYTES));
    let (ws, _) = tokio_tungstenite::client_async_with_config(request, stream, Some(config))
        .await
        .map_err(|e| match e {
            tokio_tungstenite::tungstenite::Error::Http(r) if r.status().as_u16() == 503 => {
                ClientError::Busy {
                    url: url.to_string(),
                    retry_after_s: r
                        .headers()
                        .get("Retry-After")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(1)
                        .min(3_600),
                }
            }
            tokio_tungstenite::tungstenite::Error::Http(r) => ClientError::NotAnAgent {
                url: url.to_string(),
                why: what_answered(&r),
            },
            other => unreachable(other.to_string()),
        })?;
    Ok(ws)
}

/// What answered a WebSocket upgrade with a plain HTTP response, and what to do: roster's
/// HTTP API answers with its JSON error body (`{"error": {"kind": ...}}`).
fn what_answered(r: &tokio_tungstenite::tungstenite::http::Response<Option<Vec<u8>>>) -> String {
    let body = r.body().as_deref().unwrap_or_default();
    if is_roster_http_error(body) {
        format!(
            "it answered HTTP {} as a roster agent's HTTP API (its --http-listen address) does; \
             pass --agent ws://HOST:PORT with the agent's --listen address (port 7420 by default)",
            r.status()
        )
    } else {
        format!(
            "an HTTP server answered {}; pass --agent ws://HOST:PORT with a roster agent's --listen address",
            r.status()
        )
    }
}

/// Whether `body` looks like roster's HTTP API's error, `{"error":{"kind":...`, without a
/// JSON parser (the client protocol's side of the crate has none).
fn is_roster_http_error(body: &[u8]) -> bool {
    let compact: Vec<u8> = body
        .iter()
        .copied()
        .filter(|b| !b.is_ascii_whitespace())
        .collect();
    compact.starts_with(br#"{"error":{"kind":"#)
}

/// The URL checked, and a byte stream to its host: TCP, with TLS over it for `wss://`.
async fn connect(
    url: &str,
    tls: Option<&ClientTls>,
) -> Result<(tokio_tungstenite::tungstenite::http::Uri, Box<dyn ClientStream>), ClientError> {
    let unreachable = |why: String| ClientError::Unreachable {
        url: url.to_string(),
        why,
    };
    let secure = url.starts_with("wss://");
    if !secure && !url.starts_with("ws://") {
        return Err(unreachable(
            "the URL is not ws://host:port or wss://host:port".into(),
        ));
    }
    let uri: tokio_tungstenite::tungstenite::http::Uri =
        url.parse().map_err(|e| unreachable(format!("not a URL: {e}")))?;
    let host = uri
        .host()
        .map(|h| h.trim_start_matches('[').trim_end_matches(']').to_string())
        .ok_or_else(|| unreachable("the URL has no host".into()))?;
    let port = uri
        .port_u16()
        .ok_or_else(|| unreachable("the URL has no port".into()))?;
    let tcp = TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    let stream: Box<dyn ClientStream> =
        match (secure, tls) {
            (false, _) => Box::new(tcp),
            (true, None) => return Err(unreachable(
                "a wss:// agent needs the CA of its certificate; pass --tls-ca FILE (or set ROSTER_TLS_CA)"
                    .into(),
            )),
            (true, Some(tls)) => Box::new(
                tls.connect(tcp, &host)
                    .await
                    .map_err(|e| unreachable(format!("TLS: {e}")))?,
            ),
        };
    Ok((uri, stream))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A listener that turns every WebSocket upgrade away with `503` and `Retry-After: 1`,
    /// counting the connections.
    async fn always_busy() -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("ws://{}", listener.local_addr().unwrap());
        let seen = Arc::new(AtomicUsize::new(0));
        let count = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let mut buf = [0u8; 2048];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(
                        b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\n\r\n",
                    )
                    .await;
            }
        });
        (url, seen)
    }

    #[tokio::test]
    async fn an_agent_that_turns_clients_away_is_retried_as_it_asks_then_named_busy() {
        let (url, seen) = always_busy().await;
        let err = Client::connect(&url, None).await.unwrap_err();
        assert!(matches!(err, ClientError::Busy { retry_after_s: 1, .. }), "{err}");
        assert!(err.to_string().contains("is busy"), "{err}");
        assert!(!err.to_string().contains("start one"), "{err}");
        // Retried while the connect timeout allowed, each after about the hinted second.
        let tries = seen.load(Ordering::SeqCst);
        assert!((2..=10).contains(&tries), "{tries} connections");
    }
}
