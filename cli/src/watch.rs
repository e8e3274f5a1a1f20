//! `roster watch`: a service's instances, then its changes as they arrive. When the agent
//! goes away (a restart), the watch reconnects with a jittered backoff and asks for what
//! changed since what it printed (`Request::WatchFrom`), so it neither repeats nor misses a
//! change; `--once` ends it instead.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use roster::api::{fingerprint, EventView, InstanceView, Request, ServerMessage};
use roster::client::ClientError;
use roster::transport::backoff::{Backoff, BackoffPolicy, Failure};

use crate::commands::{check_service, connect, from_client, refused};
use crate::{output, ClientArgs, Fail};

/// Reconnects: from 200 ms, doubling to 5 s, each drawn within ±50%; after a watch that
/// lived 10 s, within 200 ms to 1.2 s (the watchers of a restarted agent spread out).
const POLICY: BackoffPolicy = BackoffPolicy {
    base_ms: 200,
    cap_ms: 5_000,
    auth_cap_ms: 60_000,
    healthy_after_ms: 10_000,
    jitter_permille: 500,
    reconnect_spread_ms: 1_000,
};

/// What the watch printed of each instance.
type Shown = BTreeMap<String, InstanceView>;

/// How one connection's watch ended.
enum End {
    /// The agent could not be reached, or went away: try again (unless `--once`).
    Lost(Fail),
    /// The agent refused the watch (a bad service name, a wrong secret): give up.
    Refused(Fail),
}

pub(crate) async fn watch(c: &ClientArgs, service: String, once: bool, all: bool) -> Result<(), Fail> {
    check_service(&service)?;
    let mut shown = Shown::new();
    let mut backoff = Backoff::default();
    let start = Instant::now();
    let mut first = true;
    loop {
        let opened = Instant::now();
        let end = tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(()),
            end = follow(c, (&service, all), &mut shown, first) => end,
        };
        let fail = match end {
            End::Lost(f) if !once => f,
            End::Lost(f) | End::Refused(f) => return Err(f),
        };
        let lived = u64::try_from(opened.elapsed().as_millis()).unwrap_or(u64::MAX);
        let now = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
        let delay = if first {
            backoff.fail(&POLICY, Failure::Network, now, draw())
        } else {
            backoff.closed(&POLICY, lived, now, draw())
        };
        first = false;
        eprintln!(
            "roster: watch: {}; reconnecting in {} (--once to stop instead)",
            fail.message,
            humantime::format_duration(Duration::from_millis(delay))
        );
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(()),
            () = tokio::time::sleep(Duration::from_millis(delay)) => {}
        }
    }
}

fn draw() -> u64 {
    let mut b = [0u8; 8];
    let _ = getrandom::fill(&mut b);
    u64::from_le_bytes(b)
}

/// One connection's watch: what changed since `shown`, then every change, printed and
/// noted in `shown`, until the connection ends. A first connection that cannot be made at
/// all is refused (a wrong `--agent` fails at once, as other commands do).
async fn follow(c: &ClientArgs, (service, all): (&str, bool), shown: &mut Shown, first: bool) -> End {
    let mut client = match connect(c).await {
        Ok(client) => client,
        Err(f) if first => return End::Refused(f),
        Err(f) => return End::Lost(f),
    };
    let known = shown.iter().map(|(id, i)| (id.clone(), fingerprint(i))).collect();
    let asked = Request::WatchFrom {
        service: service.to_string(),
        known,
        all,
    };
    if let Err(e) = client.start(asked).await {
        return End::Lost(from_client(e));
    }
    loop {
        match client.recv().await {
            Ok(ServerMessage::Event(EventView::Up(i) | EventView::Status(i))) => up(c, shown, i),
            Ok(ServerMessage::Event(EventView::Down { service, instance })) => {
                down(c, shown, &service, &instance);
            }
            Ok(other) => return End::Refused(refused(other)),
            Err(e @ ClientError::Protocol { .. }) => return End::Lost(from_client(e)),
            Err(e) => return End::Refused(from_client(e)),
        }
    }
}

/// Prints an instance `up` when it is new or its address or metadata changed, `status`
/// when only its status (or note) did, and nothing when it shows what was printed for it
/// already (written again unchanged: a re-registration, a restarted owner).
fn up(c: &ClientArgs, shown: &mut Shown, i: InstanceView) {
    let event = match shown.get(&i.instance) {
        Some(was) if fingerprint(was) == fingerprint(&i) => return,
        Some(was) if (&was.address, &was.meta) == (&i.address, &i.meta) => "status",
        _ => "up",
    };
    if c.json {
        output::json_line(&serde_json::json!({
            "event": event,
            "service": i.service,
            "instance": i.instance,
            "address": i.address,
            "meta": output::meta_json(&i.meta),
            "status": i.status,
            "note": i.note,
        }));
    } else {
        let line = format!(
            "{event:<6}{}  {}  {}  {}  {}",
            i.service,
            i.instance,
            i.address,
            i.status,
            output::meta_line(&i.meta)
        );
        output::text_line(line.trim_end());
    }
    shown.insert(i.instance.clone(), i);
}

fn down(c: &ClientArgs, shown: &mut Shown, service: &str, instance: &str) {
    let (address, meta) = shown
        .remove(instance)
        .map(|i| (i.address, i.meta))
        .unwrap_or_default();
    if c.json {
        output::json_line(&serde_json::json!({
            "event": "down",
            "service": service,
            "instance": instance,
            "address": address,
            "meta": output::meta_json(&meta),
        }));
    } else {
        output::text_line(&format!("down  {service}  {instance}  {address}"));
    }
}
