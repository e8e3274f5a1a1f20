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

/// What the watch printed of an instance: its address and metadata.
type Shown = BTreeMap<String, (String, Vec<(String, String)>)>;

/// How one connection's watch ended.
enum End {
    /// The agent could not be reached, or went away: try again (unless `--once`).
    Lost(Fail),
    /// The agent refused the watch (a bad service name, a wrong secret): give up.
    Refused(Fail),
}

pub(crate) async fn watch(c: &ClientArgs, service: String, once: bool) -> Result<(), Fail> {
    check_service(&service)?;
    let mut shown = Shown::new();
    let mut backoff = Backoff::default();
    let start = Instant::now();
    let mut first = true;
    loop {
        let opened = Instant::now();
        let end = tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(()),
            end = follow(c, &service, &mut shown, first) => end,
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
async fn follow(c: &ClientArgs, service: &str, shown: &mut Shown, first: bool) -> End {
    let mut client = match connect(c).await {
        Ok(client) => client,
        Err(f) if first => return End::Refused(f),
        Err(f) => return End::Lost(f),
    };
    let known = shown
        .iter()
        .map(|(id, (address, meta))| (id.clone(), fingerprint(address, meta)))
        .collect();
    let asked = Request::WatchFrom {
        service: service.to_string(),
        known,
    };
    if let Err(e) = client.start(asked).await {
        return End::Lost(from_client(e));
    }
    loop {
        match client.recv().await {
            Ok(ServerMessage::Event(EventView::Up(i))) => up(c, shown, i),
            Ok(ServerMessage::Event(EventView::Down { service, instance })) => {
                down(c, shown, &service, &instance);
            }
            Ok(other) => return End::Refused(refused(other)),
            Err(e @ ClientError::Protocol { .. }) => return End::Lost(from_client(e)),
            Err(e) => return End::Refused(from_client(e)),
        }
    }
}

/// Prints an instance up, unless it shows what was printed for it already (written again
/// with the same address and metadata: a re-registration, a restarted owner).
fn up(c: &ClientArgs, shown: &mut Shown, i: InstanceView) {
    let now = (i.address.clone(), i.meta.clone());
    if shown.get(&i.instance) == Some(&now) {
        return;
    }
    shown.insert(i.instance.clone(), now);
    if c.json {
        output::json_line(&serde_json::json!({
            "event": "up",
            "service": i.service,
            "instance": i.instance,
            "address": i.address,
            "meta": output::meta_json(&i.meta),
        }));
    } else {
        output::text_line(&format!(
            "up    {}  {}  {}  {}",
            i.service,
            i.instance,
            i.address,
            output::meta_line(&i.meta)
        ));
    }
}

fn down(c: &ClientArgs, shown: &mut Shown, service: &str, instance: &str) {
    let (address, meta) = shown.remove(instance).unwrap_or_default();
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
