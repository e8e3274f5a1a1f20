//! Reads: from the local replica (no network), shaped as the CLI's `--json` output.

use axum::extract::State;
use std::collections::BTreeMap;

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::error::ApiError;
use super::params::{self, Pairs, Params, ServiceQuery};
use super::selection::{index, select};
use super::{resume, watch, App};
use crate::output;

/// The header that carries a service's index (see [`index`]).
pub const INDEX_HEADER: HeaderName = HeaderName::from_static("x-roster-index");
/// The header with which a client resumes an event stream (see [`resume`]).
const LAST_EVENT_ID: HeaderName = HeaderName::from_static("last-event-id");

/// `GET /v1/services`: every live service and its instance count.
pub async fn services(State(app): State<App>) -> Json<serde_json::Value> {
    let list: Vec<serde_json::Value> = app
        .node
        .services()
        .into_iter()
        .map(|(s, n)| serde_json::json!({ "service": s, "instances": n }))
        .collect();
    Json(serde_json::Value::Array(list))
}

/// `GET /v1/services/{service}`: its instances (filtered), as a list, a blocking query
/// (`?index=`) or a stream of events (`?watch`).
pub async fn service(
    State(app): State<App>,
    Params(name): Params<String>,
    Pairs(pairs): Pairs,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    params::service(&name)?;
    let q = ServiceQuery::parse(pairs)?;
    if q.watch {
        let resumed = match headers.get(LAST_EVENT_ID) {
            Some(v) => resume::parse(v.to_str().unwrap_or_default())?,
            None => BTreeMap::new(),
        };
        return Ok(watch::events(app, name, q, resumed).into_response());
    }
    if let Some(seen) = q.index {
        watch::until_changed(&app, &name, &q, seen).await;
    }
    let list = select(&app.node, &name, &q);
    let index = index(&list);
    let list = match &q.near {
        Some(near) => app
            .node
            .near_first(list, &app.node.near_zone(near).map_err(near_refused)?),
        None => list,
    };
    Ok(answer(&list, index, q.fields))
}

fn near_refused(e: roster::InvalidZone) -> ApiError {
    ApiError::invalid(format!("near: {e}, or {}", roster::NEAR_AGENT))
}

/// `GET /v1/services/{service}/instances/{instance}`: one live instance, whatever its
/// status (as `?all` shows it); 404 when it is not live here.
pub async fn instance(
    State(app): State<App>,
    Params((service, id)): Params<(String, String)>,
) -> Result<Json<serde_json::Value>, ApiError> {
    params::instance(&service, &id)?;
    let found = app.node.lookup_all(&service).into_iter().find(|i| i.id == id);
    match found {
        Some(i) => Ok(Json(output::instance_json(&i.view()))),
        None => Err(ApiError::not_found(format!(
            "no live instance {id:?} of {service:?} here; GET /v1/services/{service}?all lists the live ones"
        ))),
    }
}

/// The instances as JSON, with `index` (that of the list by id, whatever the order
/// shown) in the index header.
fn answer(list: &[roster::Instance], index: u64, fields: Option<output::Fields>) -> Response {
    let body: Vec<output::InstanceJson<'_>> = list
        .iter()
        .map(|i| output::InstanceJson::of(i).only(fields))
        .collect();
    let mut r = Json(body).into_response();
    if let Ok(v) = HeaderValue::from_str(&index.to_string()) {
        r.headers_mut().insert(INDEX_HEADER, v);
    }
    r
}

/// `GET /v1/members`: the nodes of the cluster, as this agent sees them.
pub async fn members(State(app): State<App>) -> Result<Json<serde_json::Value>, ApiError> {
    let list = app.node.members().await?;
    let views: Vec<roster::api::MemberView> = list.iter().map(roster::Member::view).collect();
    Ok(Json(serde_json::to_value(views).unwrap_or_default()))
}

/// `GET /v1/status`: this agent.
pub async fn status(State(app): State<App>) -> Result<Json<serde_json::Value>, ApiError> {
    let s = app.node.status().await?;
    Ok(Json(serde_json::to_value(s).unwrap_or_default()))
}

/// `GET /v1/explain/{service}/{instance}`: where a registration came from.
pub async fn explain(
    State(app): State<App>,
    Params((service, instance)): Params<(String, String)>,
) -> Result<Json<serde_json::Value>, ApiError> {
    params::instance(&service, &instance)?;
    let x = app.node.explain(&service, &instance).await.map_err(|e| {
        ApiError::from(e).or_listed(|| format!("GET /v1/services/{service} lists the live ones"))
    })?;
    Ok(Json(serde_json::to_value(x).unwrap_or_default()))
}
