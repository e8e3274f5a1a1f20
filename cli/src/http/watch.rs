//! Watches over HTTP: a stream of server-sent events (`?watch`), and a blocking query
//! (`?index=N&wait=30s`) that answers once the service's instances differ from what the
//! client has, as Consul's blocking queries do.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures_util::{FutureExt, Stream};
use tokio::time::Instant;

use super::params::ServiceQuery;
use super::resume;
use super::selection::{index, select};
use super::App;
use crate::output;

/// How often an idle event stream sends a comment, so proxies and clients see it live.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Waits until the instances `q` shows of `service` have an index other than `seen`, the
/// query's wait (plus up to a sixteenth, so clients that asked together do not all come
/// back together) ends, or the agent stops.
pub async fn until_changed(app: &App, service: &str, q: &ServiceQuery, seen: u64) {
    // Subscribed first: a change between the read and the subscription is not missed.
    let mut changes = if q.wide() {
        app.node.watch_all(service)
    } else {
        app.node.watch(service)
    };
    let jitter = q.wait.as_millis() as u64 / 16;
    let extra = if jitter == 0 { 0 } else { rand_below(jitter) };
    let deadline = Instant::now() + q.wait + Duration::from_millis(extra);
    loop {
        if index(&select(&app.node, service, q)) != seen {
            return;
        }
        tokio::select! {
            () = app.stop.cancelled() => return,
            () = tokio::time::sleep_until(deadline) => return,
            e = changes.recv() => {
                if e.is_none() {
                    return;
                }
                // Take what else is ready, then read once: a watch starts with an event
                // for every instance, and one read covers them all.
                while let Some(Some(_)) = changes.recv().now_or_never() {}
            }
        }
    }
}

/// A number below `n` (`n` > 0) from the OS; 0 if it has none to give.
fn rand_below(n: u64) -> u64 {
    getrandom::u64().map_or(0, |r| r % n)
}

/// `?watch`: an `up` event for each instance shown now, then `up`, `status` and `down` as
/// they change, until the client leaves or the agent stops. The filters apply: an
/// instance that stops matching them goes `down`. Each event's id says what the client
/// shows after it; with `resumed` (from `Last-Event-ID`) the stream starts with what
/// changed since, not with everything.
pub fn events(
    app: App,
    service: String,
    q: ServiceQuery,
    resumed: BTreeMap<String, u64>,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let changes = app.node.watch_from(&service, &resumed, q.wide());
    let state = (changes, resumed, q, app.stop.clone());
    let stream = futures_util::stream::unfold(state, |(mut changes, mut shown, q, stop)| async move {
        loop {
            let e = tokio::select! {
                () = stop.cancelled() => return None,
                e = changes.recv() => e?,
            };
            if let Some((kind, data)) = event(&mut shown, &q, e) {
                // The id before the data, so a client reading line by line has it.
                let mut sse = SseEvent::default().event(kind);
                if let Some(id) = resume::event_id(&shown) {
                    sse = sse.id(id);
                }
                let sse = sse.data(data);
                return Some((Ok(sse), (changes, shown, q, stop)));
            }
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
}

/// The kind and data of the server-sent event for a change, given what the client shows
/// (instance id to fingerprint), which it updates; `None` when it shows nothing new.
fn event(
    shown: &mut BTreeMap<String, u64>,
    q: &ServiceQuery,
    e: roster::Event,
) -> Option<(&'static str, String)> {
    let down = |service: &str, id: &str, address: &str| {
        let data = serde_json::json!({ "service": service, "instance": id, "address": address });
        ("down", data.to_string())
    };
    match e {
        roster::Event::Up(i) | roster::Event::Status(i) if !q.admits(&i) => {
            shown.remove(&i.id).map(|_| down(&i.service, &i.id, &i.address))
        }
        roster::Event::Status(i) if shown.contains_key(&i.id) => Some(instance(shown, "status", &i, q)),
        roster::Event::Up(i) | roster::Event::Status(i) => Some(instance(shown, "up", &i, q)),
        roster::Event::Down { service, id, address } => {
            shown.remove(&id).map(|_| down(&service, &id, &address))
        }
    }
}

/// An `up` or `status` event for `i`, now shown.
fn instance(
    shown: &mut BTreeMap<String, u64>,
    kind: &'static str,
    i: &roster::Instance,
    q: &ServiceQuery,
) -> (&'static str, String) {
    shown.insert(i.id.clone(), roster::api::fingerprint(&i.view()));
    let data = serde_json::to_string(&output::InstanceJson::of(i).only(q.fields)).unwrap_or_default();
    (kind, data)
}
