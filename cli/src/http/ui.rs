//! The service map at `/ui/`: a page of plain HTML, CSS and JavaScript (cli/ui/, no build
//! step) embedded in the binary, that reads the HTTP API as any client does.
//!
//! Each file is embedded twice: as written, and gzipped (cli/ui/gz/, made by
//! `bash cli/ui/compress`; a test checks they match). A client that accepts gzip gets the
//! gzipped bytes, so nothing is compressed while serving. The files hold no data, so they
//! are served without the API's credentials: the page asks for a token when the API
//! answers 401.

use axum::extract::Path;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;

use super::error::ApiError;

/// A file of the page: its name, type, bytes and gzipped bytes.
struct File {
    name: &'static str,
    kind: &'static str,
    plain: &'static [u8],
    gzip: &'static [u8],
}

macro_rules! file {
    ($name:literal, $kind:literal) => {
        File {
            name: $name,
            kind: $kind,
            plain: include_bytes!(concat!("../../ui/", $name)),
            gzip: include_bytes!(concat!("../../ui/gz/", $name, ".gz")),
        }
    };
}

/// Every file of the page.
const FILES: [File; 3] = [
    file!("index.html", "text/html; charset=utf-8"),
    file!("app.js", "text/javascript; charset=utf-8"),
    file!("style.css", "text/css; charset=utf-8"),
];

/// What the page may load and connect to: this agent only (no CDN, no external fonts).
const CSP: &str = "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'";

/// The page's routes: `/` and `/ui` redirect to `/ui/`.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(root))
        .route("/ui", get(|| async { Redirect::permanent("/ui/") }))
        .route("/ui/", get(|h: HeaderMap| async move { serve("index.html", &h) }))
        .route(
            "/ui/{file}",
            get(|Path(name): Path<String>, h: HeaderMap| async move { serve(&name, &h) }),
        )
}

/// `/`: a redirect to the page, for a browser. A WebSocket upgrade (a CLI given this port
/// instead of the agent's `--listen` one) gets the API's JSON error, which the CLI
/// recognises to say which port to give.
async fn root(headers: HeaderMap) -> Response {
    if headers.contains_key(header::UPGRADE) {
        return ApiError::not_found(
            "this is the agent's HTTP API; a WebSocket client connects to its --listen address",
        )
        .into_response();
    }
    Redirect::permanent("/ui/").into_response()
}

/// One file, gzipped when the client accepts it; 404 for a name the page does not have.
fn serve(name: &str, headers: &HeaderMap) -> Response {
    let Some(f) = FILES.iter().find(|f| f.name == name) else {
        let body = format!("no file {name:?} in the page; open /ui/\n");
        return (StatusCode::NOT_FOUND, body).into_response();
    };
    let gzip = accepts_gzip(headers);
    let body = if gzip { f.gzip } else { f.plain };
    let mut r = body.into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(f.kind));
    h.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    if gzip {
        h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    r
}

/// Whether `Accept-Encoding` names gzip (with a q-value other than 0).
fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|part| {
            let mut it = part.split(';').map(str::trim);
            let coding = it.next().unwrap_or_default();
            let refused = it.any(|p| p.replace(' ', "") == "q=0" || p.replace(' ', "") == "q=0.0");
            (coding.eq_ignore_ascii_case("gzip") || coding == "*") && !refused
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asking(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_str(v).unwrap_or(HeaderValue::from_static("")),
        );
        h
    }

    #[test]
    fn gzip_is_served_only_to_clients_that_accept_it() {
        assert!(accepts_gzip(&asking("gzip, deflate, br")));
        assert!(accepts_gzip(&asking("br;q=1.0, gzip;q=0.8")));
        assert!(!accepts_gzip(&asking("gzip;q=0")));
        assert!(!accepts_gzip(&asking("br")));
        assert!(!accepts_gzip(&HeaderMap::new()));
    }
}
