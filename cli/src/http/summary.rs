//! `GET /v1/summary`: each service's instance counts by status, as one list (what a
//! dashboard shows first), and as a blocking query over that list (`?index=N&wait=30s`)
//! that answers once any count differs from what the client has.
//!
//! Apart from `GET /v1/services`, which stays as cheap as it was: the counts read every
//! instance's status.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use axum::Json;
use tokio::time::Instant;

use super::error::ApiError;
use super::params::{self, Pairs, DEFAULT_WAIT, MAX_WAIT};
use super::read::INDEX_HEADER;
use super::App;

/// `GET /v1/summary`: `[{"service", "instances", "passing", "warning", "critical",
/// "maintenance"}]`, with the list's index in `X-Roster-Index`.
pub async fn summary(State(app): State<App>, Pairs(pairs): Pairs) -> Result<Response, ApiError> {
    let (index, wait) = parse(pairs)?;
    let mut changes = app.node.changes();
    let deadline = Instant::now() + wait;
    let mut counts = app.node.service_counts();
    if let Some(seen) = index {
        while fingerprint(&counts) == seen {
            tokio::select! {
                () = app.stop.cancelled() => break,
                () = tokio::time::sleep_until(deadline) => break,
                more = changes.next() => if !more { break },
            }
            counts = app.node.service_counts();
        }
    }
    Ok(answer(&counts))
}

/// `?index=N` and `?wait=DURATION` (with an index); anything else is refused by name.
fn parse(pairs: Vec<(String, String)>) -> Result<(Option<u64>, Duration), ApiError> {
    let mut index = None;
    let mut wait = None;
    for (k, v) in pairs {
        match k.as_str() {
            "index" => index = Some(params::index(&v)?),
            "wait" => wait = Some(v),
            other => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter {other:?}; /v1/summary takes index and wait"
                )))
            }
        }
    }
    let Some(w) = wait else {
        return Ok((index, DEFAULT_WAIT));
    };
    if index.is_none() {
        return Err(ApiError::invalid(
            "wait goes with index (a blocking query: ?index=N&wait=30s)",
        ));
    }
    let wait = humantime::parse_duration(&w)
        .ok()
        .filter(|d| *d <= MAX_WAIT)
        .ok_or_else(|| {
            ApiError::invalid(format!("wait {w:?} is not a duration of at most 10m (e.g. 30s)"))
        })?;
    Ok((index, wait))
}

/// A fingerprint of the counts: it changes when any of them does.
fn fingerprint(counts: &[(String, roster::StatusCounts)]) -> u64 {
    let mut h = DefaultHasher::new();
    counts.hash(&mut h);
    h.finish()
}

fn answer(counts: &[(String, roster::StatusCounts)]) -> Response {
    let list: Vec<serde_json::Value> = counts
        .iter()
        .map(|(s, c)| {
            serde_json::json!({
                "service": s, "instances": c.total(), "passing": c.passing,
                "warning": c.warning, "critical": c.critical, "maintenance": c.maintenance,
                "unreachable": c.unreachable,
            })
        })
        .collect();
    let mut r = Json(list).into_response();
    if let Ok(v) = HeaderValue::from_str(&fingerprint(counts).to_string()) {
        r.headers_mut().insert(INDEX_HEADER, v);
    }
    r
}
