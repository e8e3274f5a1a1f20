//! Errors of the HTTP API: `{"error": {"kind", "message"}}` with the status that fits.
//!
//! The kinds are the client protocol's (`invalid`, `not_found`, `throttled`, `failed`,
//! `unauthorized`), plus `forbidden` for a token the agent does not hold, so a program
//! can match on them whichever interface it uses.

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

/// A refused request; nothing changed.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
    retry_after: Option<Duration>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            message: message.into(),
            retry_after: None,
        }
    }

    /// 400: the request broke a rule.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid", message)
    }

    /// 404.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// 401: no credentials.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    /// 403: credentials the agent does not accept.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", message)
    }

    /// `self`, with `hint` (the request that lists what was not found) after the message of
    /// a 404.
    pub fn or_listed(mut self, hint: impl FnOnce() -> String) -> Self {
        if self.status == StatusCode::NOT_FOUND {
            self.message = format!("{}; {}", self.message, hint());
        }
        self
    }

    /// 503: the agent cannot do it now.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "failed", message)
    }
}

impl From<roster::Error> for ApiError {
    fn from(e: roster::Error) -> Self {
        use roster::Error as E;
        match e {
            E::Invalid(m) => Self::invalid(m),
            e @ E::Input(_) => Self::invalid(e.to_string()),
            E::Setting { message, .. } => Self::invalid(message),
            E::NotFound(m) => Self::not_found(m),
            E::OwnedElsewhere(m) => Self::new(StatusCode::CONFLICT, "failed", m),
            E::Throttled { message, retry_after } => Self {
                retry_after: Some(retry_after),
                ..Self::new(StatusCode::TOO_MANY_REQUESTS, "throttled", message)
            },
            E::TaskFailed(_) | E::System(_) => {
                Self::new(StatusCode::INTERNAL_SERVER_ERROR, "failed", e.to_string())
            }
            other => Self::unavailable(other.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": { "kind": self.kind, "message": self.message } });
        let mut r = (self.status, Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Some(after) = self.retry_after {
            // Whole seconds, rounded up: a client that waits this long is not refused again.
            let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
            if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                r.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        r
    }
}
