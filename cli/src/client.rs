//! The client side of the client protocol: what `roster` commands use to ask an agent.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use roster_transport::driver::{ClientStream, ClientTls, CLIENT_SUBPROTOCOL};
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
        match tokio::time::timeout(CONNECT_TIMEOUT, Self::open(url, secret, tls)).await {
            Ok(r) => r,
            Err(_) => Err(ClientError::Unreachable {
                url: url.to_string(),
                why: format!("no answer within {CONNECT_TIMEOUT:?}"),
            }),
        }
    }

    async fn open(url: &str, secret: Option<&Secret>, tls: Option<&ClientTls>) -> Result<Self, ClientError> {
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
        let stream: Box<dyn ClientStream> = match (secure, tls) {
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
        let request = ClientRequestBuilder::new(uri).with_sub_protocol(CLIENT_SUBPROTOCOL);
        let config = WebSocketConfig::default()
            .max_message_size(Some(MAX_ANSWER_BYTES))
            .max_frame_size(Some(MAX_ANSWER_BYTES));
        let (ws, _) = tokio_tungstenite::client_async_with_config(request, stream, Some(config))
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let mut client = Self {
            url: url.to_string(),
            ws,
            hello: ServerHello {
                node: String::new(),
                name: String::new(),
                nonce: [0; NONCE_LEN],
                auth_required: false,
            },
        };
        let first = match client.recv().await {
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
        let hello = match first {
            ServerMessage::Hello(h) => h,
            other => return Err(client.protocol(format!("sent {other:?} instead of its hello"))),
        };
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
                    return Err(self.protocol(format!("closed the connection {why}")));
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
