//! What a request names and asks: path segments and query parameters, checked, with a
//! JSON error for anything the API does not take.

use std::collections::BTreeSet;
use std::time::Duration;

use axum::extract::{FromRequestParts, Path, Query};
use axum::http::request::Parts;
use roster::registry::{ProviderId, ServiceName};
use serde::de::DeserializeOwned;

use super::error::ApiError;
use crate::output::Fields;

/// Path parameters, with a JSON error when they do not decode.
pub struct Params<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Params<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(t)| Params(t))
            .map_err(|e| ApiError::invalid(format!("the path: {}", e.body_text())))
    }
}

/// Query parameters as pairs, in order, with a JSON error when they do not decode.
pub struct Pairs(pub Vec<(String, String)>);

impl<S: Send + Sync> FromRequestParts<S> for Pairs {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Query::<Vec<(String, String)>>::from_request_parts(parts, state)
            .await
            .map(|Query(q)| Pairs(q))
            .map_err(|e| ApiError::invalid(format!("the query: {}", e.body_text())))
    }
}

/// A service name, checked as a registration checks it.
pub fn service(name: &str) -> Result<(), ApiError> {
    ServiceName::new(name)
        .map(|_| ())
        .map_err(|e| ApiError::invalid(e.to_string()))
}

/// A service name and an instance id, checked.
pub fn instance(service_name: &str, id: &str) -> Result<(), ApiError> {
    service(service_name)?;
    ProviderId::new(id)
        .map(|_| ())
        .map_err(|e| ApiError::invalid(e.to_string()))
}

/// The longest a blocking query waits.
pub const MAX_WAIT: Duration = Duration::from_secs(600);
/// How long a blocking query waits unless told.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(300);
/// The statuses an instance can have.
const STATUSES: [&str; 5] = [
    "passing",
    "warning",
    "critical",
    "maintenance",
    roster::UNREACHABLE,
];
/// The most `meta` filters a query may give.
const MAX_META_FILTERS: usize = 16;

/// What `GET /v1/services/{service}` asks.
#[derive(Debug, Default)]
pub struct ServiceQuery {
    /// `?status=passing,warning`: only these (any status may be asked for).
    pub status: Option<BTreeSet<String>>,
    /// `?meta=key:value` (repeatable): only instances with each pair.
    pub meta: Vec<(String, String)>,
    /// `?all`: every instance, whatever its status (else passing and warning ones).
    pub all: bool,
    /// `?watch`: a stream of server-sent events.
    pub watch: bool,
    /// `?index=N`: answer when the instances' index differs from N (a blocking query).
    pub index: Option<u64>,
    /// `?wait=30s`: how long a blocking query waits at most.
    pub wait: Duration,
    /// `?fields=instance,address`: only these fields of each instance (every one if absent).
    pub fields: Option<Fields>,
    /// `?near=eu-west-1a` or `?near=_agent`: the instances owned by nodes of that zone (or
    /// of the agent's) first.
    pub near: Option<String>,
}

impl ServiceQuery {
    /// Reads the pairs; an unknown parameter or a bad value is refused by name.
    pub fn parse(pairs: Vec<(String, String)>) -> Result<Self, ApiError> {
        let mut q = ServiceQuery {
            wait: DEFAULT_WAIT,
            ..ServiceQuery::default()
        };
        let mut wait = None;
        for (k, v) in pairs {
            match k.as_str() {
                "status" => q.status = Some(statuses(&v)?),
                "meta" => {
                    let (mk, mv) = v.split_once(':').ok_or_else(|| {
                        ApiError::invalid(format!("meta filter {v:?} is not KEY:VALUE (e.g. ?meta=zone:eu-1)"))
                    })?;
                    if q.meta.len() == MAX_META_FILTERS {
                        return Err(ApiError::invalid(format!(
                            "more than {MAX_META_FILTERS} meta filters; give fewer"
                        )));
                    }
                    q.meta.push((mk.to_string(), mv.to_string()));
                }
                "all" => q.all = flag(&k, &v)?,
                "watch" => q.watch = flag(&k, &v)?,
                "index" => q.index = Some(index(&v)?),
                "wait" => wait = Some(v),
                "fields" => q.fields = Some(Fields::parse(&v).map_err(ApiError::invalid)?),
                "near" => {
                    if v != roster::NEAR_AGENT {
                        roster::Zone::new(&v).map_err(|e| {
                            ApiError::invalid(format!("near: {e}, or {}", roster::NEAR_AGENT))
                        })?;
                    }
                    q.near = Some(v);
                }
                other => {
                    return Err(ApiError::invalid(format!(
                        "unknown query parameter {other:?}; this endpoint takes status, meta, all, watch, index, wait, fields and near"
                    )))
                }
            }
        }
        if let Some(w) = wait {
            if q.index.is_none() {
                return Err(ApiError::invalid(
                    "wait goes with index (a blocking query: ?index=N&wait=30s)",
                ));
            }
            q.wait = humantime::parse_duration(&w)
                .ok()
                .filter(|d| *d <= MAX_WAIT)
                .ok_or_else(|| {
                    ApiError::invalid(format!("wait {w:?} is not a duration of at most 10m (e.g. 30s)"))
                })?;
        }
        if q.watch && q.index.is_some() {
            return Err(ApiError::invalid("give watch or index, not both"));
        }
        Ok(q)
    }

    /// Whether the query may show instances that reads leave out (critical, maintenance).
    pub fn wide(&self) -> bool {
        self.all
            || self.status.as_ref().is_some_and(|s| {
                s.contains("critical") || s.contains("maintenance") || s.contains(roster::UNREACHABLE)
            })
    }

    /// Whether `i` passes the status and metadata filters.
    pub fn admits(&self, i: &roster::Instance) -> bool {
        self.status.as_ref().is_none_or(|s| s.contains(i.status_name()))
            && self.meta.iter().all(|(k, v)| i.meta.get(k) == Some(v))
    }
}

fn statuses(v: &str) -> Result<BTreeSet<String>, ApiError> {
    v.split(',')
        .map(|s| {
            let s = s.trim();
            if STATUSES.contains(&s) {
                Ok(s.to_string())
            } else {
                Err(ApiError::invalid(format!(
                    "status {s:?} is not one of passing, warning, critical, maintenance, unreachable"
                )))
            }
        })
        .collect()
}

/// The query of a `DELETE` of an instance: `?any-owner` or nothing.
pub fn any_owner(pairs: Vec<(String, String)>) -> Result<bool, ApiError> {
    let mut any = false;
    for (k, v) in pairs {
        if k != "any-owner" {
            return Err(ApiError::invalid(format!(
                "unknown query parameter {k:?}; this endpoint takes any-owner only"
            )));
        }
        any = flag(&k, &v)?;
    }
    Ok(any)
}

/// `?index=N`: the `X-Roster-Index` of the last answer, for a blocking query.
pub(super) fn index(v: &str) -> Result<u64, ApiError> {
    v.parse().map_err(|_| {
        ApiError::invalid(format!(
            "index {v:?} is not a number; pass the X-Roster-Index of the last answer"
        ))
    })
}

/// `?flag`, `?flag=true` or `?flag=false`.
fn flag(k: &str, v: &str) -> Result<bool, ApiError> {
    match v {
        "" | "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(ApiError::invalid(format!(
            "{k}={v:?}: give {k}, {k}=true or {k}=false"
        ))),
    }
}
