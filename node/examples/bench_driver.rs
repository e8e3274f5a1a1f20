//! The change driver of `bench/compare`: one client connection to a local agent, and one
//! registration per line of standard input, timed.
//!
//! ```sh
//! cargo run --release -p roster --example bench_driver -- ws://127.0.0.1:7420
//! ```
//!
//! Each input line is `<instance> <seq>`: register (or update) instance `<instance>` of
//! service `bench` with metadata `seq=<seq>`. Each output line is
//! `<instance> <seq> <sent_ns> <acked_ns>`: wall-clock nanoseconds just before the request
//! was written and when the agent's answer arrived (the agent answers once the
//! registration is on its disk and on its way to its peers). A failed request prints
//! `error <instance> <seq> <message>` and the driver goes on. The same line protocol is
//! spoken by the Serf and etcd drivers in `bench/compare`, so all three systems are driven
//! the same way: over one open connection, never by starting a process per change. (The
//! agent closes a client connection idle for 30 s; the driver then connects again before
//! its next request, outside the timed part; so it does when a connection that has not
//! served a request yet is older than 4 s, since the agent gives a new connection 5 s.)

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, Write};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Reconnect before a request when the connection has been idle this long (the agent's
/// idle limit is 30 s) ...
const IDLE: Duration = Duration::from_secs(20);
/// ... or, before its first request, this long (the agent gives a new connection 5 s).
const UNUSED: Duration = Duration::from_secs(4);

use roster::api::{Request, ServerMessage};
use roster::client::Client;

fn now_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos()
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| roster::DEFAULT_AGENT_URL.to_string());
    // The connection, when it was last used (or opened), and whether it served a request.
    let mut client = (Client::connect(&url, None).await?, Instant::now(), false);
    // One request at a time: blocking on standard input between requests is fine.
    let mut out = std::io::stdout().lock();
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let mut words = line.split_whitespace();
        let (Some(instance), Some(seq)) = (words.next(), words.next()) else {
            continue;
        };
        let req = Request::Register {
            service: "bench".into(),
            address: "10.0.0.1:80".into(),
            meta: vec![("seq".into(), seq.into())],
            instance: Some(instance.into()),
            ttl_ms: None,
            checks: vec![],
        };
        if client.1.elapsed() > if client.2 { IDLE } else { UNUSED } {
            client = (Client::connect(&url, None).await?, Instant::now(), false);
        }
        let sent = now_ns();
        let answer = client.0.request(req).await;
        let acked = now_ns();
        let reply = match answer {
            Ok(ServerMessage::Registered { .. }) => format!("{instance} {seq} {sent} {acked}\n"),
            Ok(other) => format!("error {instance} {seq} unexpected answer {other:?}\n"),
            Err(e) => format!("error {instance} {seq} {e}\n"),
        };
        out.write_all(reply.as_bytes())?;
        out.flush()?;
        if reply.starts_with("error") {
            client = (Client::connect(&url, None).await?, Instant::now(), false);
        } else {
            client.1 = Instant::now();
            client.2 = true;
        }
    }
    Ok(())
}
