//! The agent's HTTP/JSON API (`--http-listen`, 127.0.0.1:7421 by default): what the client
//! protocol does, for any language with an HTTP client, plus server-sent-event watches and
//! blocking queries. See docs/reference/http.md.
//!
//! It serves the same [`roster::Node`] the client protocol does, through its public API:
//! reads from the local replica, writes as `roster register` makes them (owned by the
//! agent, kept across its restarts). Its own listener, not the peers' one: operators
//! firewall the two apart, as they do Consul's 8500 and 8301, and on loopback by default it
//! needs no credentials, as the client protocol does there.

mod auth;
mod bare_errors;
mod error;
mod metrics;
mod params;
mod read;
mod register;
mod resume;
mod sd;
mod selection;
mod serve;
mod summary;
mod ui;
mod watch;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::routing::{get, post, put};
use axum::Router;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use auth::Tokens;
use error::ApiError;

/// Who sent a request, put on it by the server loop.
#[derive(Debug, Clone, Copy)]
struct Client {
    addr: SocketAddr,
    /// It showed a client certificate of the cluster's CA (HTTPS only; checked by rustls).
    certificate: bool,
}

/// Who may use the API besides clients on loopback.
pub struct Access {
    /// The tokens of `--http-token-file`; `None`: loopback only.
    pub tokens: Option<Tokens>,
    /// `--http-require-token`: loopback clients show a token too.
    pub loopback_needs_token: bool,
    /// HTTPS with the agent's TLS files; a client certificate of its CA then admits a
    /// client as a token does.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access")
            .field("tokens", &self.tokens)
            .field("loopback_needs_token", &self.loopback_needs_token)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// What every handler shares.
#[derive(Debug, Clone)]
struct App {
    node: roster::Node,
    access: Arc<Access>,
    /// Cancelled when the agent stops: watches and blocking queries end.
    stop: CancellationToken,
}

/// Binds the API's listener, before the node starts, so a busy port fails the start with
/// nothing started.
///
/// # Errors
/// One line naming the address and what to do: exit 2 for an address that does not parse,
/// 1 for one that cannot be bound (in use, not this host's), as for `--listen`.
pub async fn bind(addr: &str) -> Result<TcpListener, crate::Fail> {
    TcpListener::bind(addr).await.map_err(|e| {
        crate::Fail::bind(
            &e,
            format!("cannot listen for HTTP on {addr}: {e}; pick another --http-listen address, or `--http-listen off`"),
        )
    })
}

/// Serves the API on `listener` until `stop` is cancelled; the task ends once every
/// connection has.
pub fn spawn(
    node: roster::Node,
    listener: TcpListener,
    access: Access,
    stop: CancellationToken,
) -> JoinHandle<()> {
    let tls = access.tls.clone();
    let app = App {
        node,
        access: Arc::new(access),
        stop: stop.clone(),
    };
    tokio::spawn(serve::accept(listener, router(app), tls, stop))
}

fn router(app: App) -> Router {
    let instance = "/v1/services/{service}/instances/{instance}";
    Router::new()
        .route("/v1/services", get(read::services))
        .route("/v1/services/{service}", get(read::service))
        .route(
            "/v1/services/{service}/instances",
            post(register::register_default),
        )
        .route(
            instance,
            get(read::instance)
                .put(register::register)
                .delete(register::deregister),
        )
        .route(&format!("{instance}/pass"), put(register::pass))
        .route(
            &format!("{instance}/maintenance"),
            put(register::maintenance_on).delete(register::maintenance_off),
        )
        .route(
            "/v1/maintenance",
            put(register::maintenance_all_on).delete(register::maintenance_all_off),
        )
        .route("/v1/summary", get(summary::summary))
        .route("/v1/members", get(read::members))
        .route("/v1/status", get(read::status))
        .route("/v1/explain/{service}/{instance}", get(read::explain))
        .route("/v1/sync", post(register::sync))
        .route("/v1/sd/prometheus", get(sd::prometheus))
        .route("/metrics", get(metrics::metrics))
        .fallback(|| async {
            ApiError::not_found("no such endpoint; docs/reference/http.md lists them (GET /v1/services, ...)")
        })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                axum::http::StatusCode::METHOD_NOT_ALLOWED,
                "invalid",
                "this endpoint does not take that method; docs/reference/http.md lists what each takes",
            )
        })
        .layer(axum::middleware::from_fn_with_state(app.clone(), auth::check))
        .merge(ui::routes())
        .with_state(app)
}
