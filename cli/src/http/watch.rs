//! Watches over HTTP: a stream of server-sent events (`?watch`), and a blocking query
//! (`?index=N&wait=30s`) that answers once the service's instances differ from what the
//! client has, as Consul's blocking queries do.

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures_util::{FutureExt, Stream};
use tokio::time::Instant;

use super::params::ServiceQuery;
use super::read;
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
        if read::index(&read::select(&app.node, service, q)) != seen {
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
/// instance that stops matching them goes `down`.
pub fn events(
    app: App,
    service: String,
    q: ServiceQuery,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let changes = if q.wide() {
        app.node.watch_all(&service)
    } else {
        app.node.watch(&service)
    };
    let state = (changes, BTreeSet::<String>::new(), q, app.stop.clone());
    let stream = futures_util::stream::unfold(state, |(mut changes, mut shown, q, stop)| async move {
        loop {
            let e = tokio::select! {
                () = stop.cancelled() => return None,
                e = changes.recv() => e?,
            };
            if let Some(sse) = event(&mut shown, &q, e) {
                return Some((Ok(sse), (changes, shown, q, stop)));
            }
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
}

/// The server-sent event for a change, given the ids the client shows; `None` when it
/// shows nothing new.
fn event(shown: &mut BTreeSet<String>, q: &ServiceQuery, e: roster::Event) -> Option<SseEvent> {
    let down = |service: &str, id: &str| {
        SseEvent::default()
            .event("down")
            .data(serde_json::json!({ "service": service, "instance": id }).to_string())
    };
    match e {
        roster::Event::Up(i) | roster::Event::Status(i) if !q.admits(&i) => {
            shown.remove(&i.id).then(|| down(&i.service, &i.id))
        }
        roster::Event::Status(i) if shown.contains(&i.id) => Some(instance("status", &i)),
        roster::Event::Up(i) | roster::Event::Status(i) => {
            shown.insert(i.id.clone());
            Some(instance("up", &i))
        }
        roster::Event::Down { service, id, .. } => shown.remove(&id).then(|| down(&service, &id)),
    }
}

fn instance(kind: &str, i: &roster::Instance) -> SseEvent {
    SseEvent::default()
        .event(kind)
        .data(output::instance_json(&i.view()).to_string())
}
