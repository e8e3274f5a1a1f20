//! `GET /v1/sd/prometheus`: Prometheus's HTTP service discovery (`http_sd_configs`): one
//! target group per passing instance, its metadata as `__meta_roster_meta_<key>` labels.

use std::collections::BTreeSet;

use axum::extract::State;
use axum::Json;
use serde_json::{json, Map, Value};

use super::error::ApiError;
use super::params::{self, Pairs};
use super::App;

/// The most services one query may name.
const MAX_SERVICES: usize = 64;

/// `GET /v1/sd/prometheus[?service=web&service=api]`: every service unless named.
pub async fn prometheus(State(app): State<App>, Pairs(pairs): Pairs) -> Result<Json<Value>, ApiError> {
    let mut named = BTreeSet::new();
    for (k, v) in pairs {
        if k != "service" {
            return Err(ApiError::invalid(format!(
                "unknown query parameter {k:?}; this endpoint takes service (repeatable)"
            )));
        }
        params::service(&v)?;
        named.insert(v);
        if named.len() > MAX_SERVICES {
            return Err(ApiError::invalid(format!(
                "more than {MAX_SERVICES} services named; name fewer, or none for all"
            )));
        }
    }
    let services: Vec<String> = if named.is_empty() {
        app.node.services().into_iter().map(|(s, _)| s).collect()
    } else {
        named.into_iter().collect()
    };
    let mut groups = Vec::new();
    for service in services {
        for i in app.node.lookup(&service) {
            if i.status_name() == "passing" {
                groups.push(group(&i));
            }
        }
    }
    Ok(Json(Value::Array(groups)))
}

fn group(i: &roster::Instance) -> Value {
    let mut labels = Map::new();
    labels.insert("__meta_roster_service".into(), i.service.clone().into());
    labels.insert("__meta_roster_instance".into(), i.id.clone().into());
    labels.insert("__meta_roster_node".into(), i.node.clone().into());
    for (k, v) in &i.meta {
        labels.insert(format!("__meta_roster_meta_{}", label_name(k)), v.clone().into());
    }
    json!({ "targets": [i.address], "labels": labels })
}

/// A metadata key as a Prometheus label name: every character outside `[a-zA-Z0-9_]`
/// becomes `_` (as Prometheus's own Consul discovery does).
fn label_name(key: &str) -> String {
    key.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}
