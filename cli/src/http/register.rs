//! Writes: registrations owned by the agent (as `roster register` makes them), their
//! removal, TTL passes, maintenance and `sync`.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::Json;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::ApiError;
use super::params::{self, Pairs, Params};
use super::App;
use crate::instances_file::RawCheck;

/// The largest request body taken (a registration with its metadata and checks).
pub const MAX_BODY: usize = 64 * 1024;
/// How long a request body may take to arrive once its head has.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// A registration's body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RegisterBody {
    /// `host:port`.
    address: String,
    #[serde(default)]
    meta: BTreeMap<String, String>,
    /// End it after this long without another registration (`30s`); none: never.
    ttl: Option<String>,
    /// As in a `roster register --from-file` line.
    #[serde(default)]
    checks: Vec<RawCheck>,
}

/// An example of a registration's body, for errors.
const REGISTER_EXAMPLE: &str = r#"{"address": "10.0.0.7:8080"}"#;
/// An example of a maintenance request's body, for errors.
const REASON_EXAMPLE: &str = r#"{"reason": "deploy 42"}"#;

/// The body, read within [`BODY_TIMEOUT`] and [`MAX_BODY`], as JSON of `T`; a body that
/// is not an object is refused with `example`, one that is.
async fn read_json<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: Body,
    example: &str,
) -> Result<T, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid",
            format!("the request body is over {MAX_BODY} bytes; a registration fits well within it"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return Err(too_large());
    }
    let bytes = tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, MAX_BODY))
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "invalid",
                format!("the request body did not arrive within {BODY_TIMEOUT:?}; send it whole, at once"),
            )
        })?
        .map_err(|_| too_large())?;
    // Serde takes an array for a struct (its fields in order), so `[1,2]` would be refused
    // as "expected a string": say what the body is, and what it should be, instead.
    let kind = match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(_)) | Err(_) => None,
        Ok(Value::Array(_)) => Some("an array"),
        Ok(Value::String(_)) => Some("a string"),
        Ok(Value::Number(_)) => Some("a number"),
        Ok(Value::Bool(_)) => Some("a boolean"),
        Ok(Value::Null) => Some("null"),
    };
    if let Some(kind) = kind {
        return Err(ApiError::invalid(format!(
            "the body is {kind}; this endpoint takes a JSON object, e.g. {example} (see docs/reference/http.md)"
        )));
    }
    serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::invalid(format!(
            "the body is not the JSON this endpoint takes: {e}; see docs/reference/http.md"
        ))
    })
}

fn duration(field: &str, v: &str) -> Result<Duration, ApiError> {
    humantime::parse_duration(v)
        .map_err(|e| ApiError::invalid(format!("{field} {v:?} is not a duration (e.g. 30s): {e}")))
}

/// The service a body describes.
fn service(name: &str, id: Option<&str>, body: RegisterBody) -> Result<roster::Service, ApiError> {
    let mut s = roster::Service::new(name, body.address);
    if let Some(id) = id {
        s = s.id(id);
    }
    for (k, v) in body.meta {
        s = s.meta(k, v);
    }
    if let Some(t) = body.ttl {
        s = s.ttl(duration("ttl", &t)?);
    }
    for c in body.checks {
        s = s.check(c.check().map_err(ApiError::invalid)?);
    }
    Ok(s)
}

/// `PUT /v1/services/{service}/instances/{instance}`: registers (or updates) it.
pub async fn register(
    State(app): State<App>,
    Params((name, id)): Params<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    params::instance(&name, &id)?;
    let body: RegisterBody = read_json(&headers, body, REGISTER_EXAMPLE).await?;
    let id = app.node.register_owned(service(&name, Some(&id), body)?).await?;
    Ok(Json(json!({ "service": name, "instance": id })))
}

/// `POST /v1/services/{service}/instances`: registers it under the agent's default id for
/// the service, which the answer names.
pub async fn register_default(
    State(app): State<App>,
    Params(name): Params<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    params::service(&name)?;
    let body: RegisterBody = read_json(&headers, body, REGISTER_EXAMPLE).await?;
    let id = app.node.register_owned(service(&name, None, body)?).await?;
    Ok(Json(json!({ "service": name, "instance": id })))
}

/// `DELETE /v1/services/{service}/instances/{instance}`; `?any-owner`: an operator's
/// removal, whatever node owns it.
pub async fn deregister(
    State(app): State<App>,
    Params((name, id)): Params<(String, String)>,
    Pairs(pairs): Pairs,
) -> Result<Json<Value>, ApiError> {
    params::instance(&name, &id)?;
    if params::any_owner(pairs)? {
        app.node.remove_as_operator(&name, &id).await?;
    } else {
        app.node.deregister(&name, &id).await.map_err(|e| {
            ApiError::from(e).or_listed(|| format!("GET /v1/services/{name} lists its instances"))
        })?;
    }
    Ok(Json(
        json!({ "service": name, "instance": id, "deregistered": true }),
    ))
}

/// `PUT .../pass`: a TTL check's pass.
pub async fn pass(
    State(app): State<App>,
    Params((name, id)): Params<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    params::instance(&name, &id)?;
    app.node.pass(&name, &id)?;
    Ok(Json(json!({ "service": name, "instance": id, "passed": true })))
}

/// The body of a maintenance request: `{"reason": "..."}`, or none.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Reason {
    reason: Option<String>,
}

async fn reason(headers: &HeaderMap, body: Body) -> Result<String, ApiError> {
    let empty = headers
        .get(header::CONTENT_LENGTH)
        .is_some_and(|v| v.as_bytes() == b"0");
    let r: Reason = if empty || !headers.contains_key(header::CONTENT_TYPE) {
        Reason::default()
    } else {
        read_json(headers, body, REASON_EXAMPLE).await?
    };
    Ok(r.reason.unwrap_or_else(|| "maintenance".to_string()))
}

async fn maintenance(
    app: &App,
    target: Option<(&str, &str)>,
    reason: Option<&str>,
) -> Result<Json<Value>, ApiError> {
    if let Some((s, i)) = target {
        params::instance(s, i)?;
    }
    let changed = app.node.maintenance(target, reason).await.map_err(|e| {
        let service = target.map_or("", |(s, _)| s);
        ApiError::from(e)
            .or_listed(|| format!("GET /v1/services/{service}?all lists its instances with their nodes"))
    })?;
    Ok(Json(json!({ "changed": changed })))
}

/// `PUT .../maintenance`: out of reads, with a reason, until `DELETE`.
pub async fn maintenance_on(
    State(app): State<App>,
    Params((name, id)): Params<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let why = reason(&headers, body).await?;
    maintenance(&app, Some((&name, &id)), Some(&why)).await
}

/// `DELETE .../maintenance`: back in service.
pub async fn maintenance_off(
    State(app): State<App>,
    Params((name, id)): Params<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    maintenance(&app, Some((&name, &id)), None).await
}

/// `PUT /v1/maintenance`: every instance this agent owns.
pub async fn maintenance_all_on(
    State(app): State<App>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let why = reason(&headers, body).await?;
    maintenance(&app, None, Some(&why)).await
}

/// `DELETE /v1/maintenance`.
pub async fn maintenance_all_off(State(app): State<App>) -> Result<Json<Value>, ApiError> {
    maintenance(&app, None, None).await
}

/// `POST /v1/sync`: asks a peer for what this agent lacks (throttled, as `roster sync`).
pub async fn sync(State(app): State<App>) -> Result<Json<Value>, ApiError> {
    let asked = app.node.sync().await?;
    Ok(Json(json!({ "asked": asked })))
}
