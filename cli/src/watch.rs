//! `roster watch`: a service's instances, then its changes as they arrive. When the agent
//! goes away (a restart), the watch reconnects with a jittered backoff and asks for what
//! changed since what it printed ([`RemoteWatch`]), so it neither repeats nor misses a
//! change; `--once` ends it instead.

use roster::api::InstanceView;
use roster::client::{ClientError, RemoteWatch, WatchError, WatchEvent};

use crate::commands::{check_service, from_client, refused, settings};
use crate::{output, ClientArgs, Fail};

pub(crate) async fn watch(c: &ClientArgs, service: String, once: bool, all: bool) -> Result<(), Fail> {
    check_service(&service)?;
    let (secret, tls) = settings(c)?;
    let mut watch = RemoteWatch::new(&c.agent, secret, tls, &service, all);
    // Whether this outage's lines said how to start an agent already: once is enough.
    let mut hinted = false;
    // One listener for the whole watch: a Ctrl-C that comes while a line is printed is
    // not lost, as it was with a listener made anew for each event.
    let mut ctrl_c = std::pin::pin!(tokio::signal::ctrl_c());
    loop {
        // Biased: the listener is polled, so registered, before the first event is printed.
        let event = tokio::select! {
            biased;
            _ = &mut ctrl_c => return Ok(()),
            e = watch.next() => e,
        };
        match event {
            Ok(WatchEvent::Up(i)) => print(c, "up", &i),
            Ok(WatchEvent::Status(i)) => print(c, "status", &i),
            Ok(WatchEvent::Down {
                service,
                instance,
                last,
            }) => down(c, &service, &instance, last),
            Ok(WatchEvent::Lost { why, .. }) if once => return Err(from_client(why)),
            Ok(WatchEvent::Lost { why, retry_in }) => eprintln!(
                "roster: watch: {}; reconnecting in {} (--once to stop instead)",
                lost_line(why, &mut hinted),
                humantime::format_duration(retry_in)
            ),
            Ok(WatchEvent::Resumed) => {
                hinted = false;
                eprintln!(
                    "roster: watch: reconnected to {}; what changed meanwhile follows",
                    c.agent
                );
            }
            Err(WatchError::Client(e)) => return Err(from_client(e)),
            Err(WatchError::Refused(m)) => return Err(refused(m)),
        }
    }
}

/// Why the watch lost its agent, for its reconnect line: an unreachable agent's "start one
/// with `roster agent`" only the first time (`hinted`), not on every retry.
fn lost_line(why: ClientError, hinted: &mut bool) -> String {
    match why {
        ClientError::Unreachable { url, why } if *hinted => {
            format!("cannot reach a roster agent at {url}: {why}")
        }
        e @ ClientError::Unreachable { .. } => {
            *hinted = true;
            from_client(e).message
        }
        other => from_client(other).message,
    }
}

/// Prints an instance `up` (new, or moved) or `status` (only its status or note changed).
fn print(c: &ClientArgs, event: &str, i: &InstanceView) {
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
        output::text_line(&text_line(event, i));
    }
}

/// An `up` or `status` line: the event (padded so that the service lines up under `down`'s),
/// then the service, instance, address, status, metadata and, in parentheses, the note,
/// each two spaces apart; empty trailing fields are left out.
fn text_line(event: &str, i: &InstanceView) -> String {
    let mut line = format!(
        "{event:<4}  {}  {}  {}  {}  {}",
        i.service,
        i.instance,
        i.address,
        i.status,
        output::meta_line(&i.meta)
    );
    line.truncate(line.trim_end().len());
    if !i.note.is_empty() {
        line.push_str(&format!("  ({})", i.note));
    }
    line
}

fn down(c: &ClientArgs, service: &str, instance: &str, last: Option<InstanceView>) {
    let (address, meta) = last.map(|i| (i.address, i.meta)).unwrap_or_default();
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

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(meta: &[(&str, &str)], status: &str, note: &str) -> InstanceView {
        InstanceView {
            service: "web".into(),
            instance: "web-1".into(),
            address: "127.0.0.1:8080".into(),
            meta: meta.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            status: status.into(),
            note: note.into(),
            node: "bf3cb7f1ae8fdd64".into(),
            registered_at_ms: 0,
            lease_expires_at_ms: 0,
        }
    }

    #[test]
    fn a_status_line_separates_the_event_from_the_service_and_shows_the_note() {
        let i = instance(&[("zone", "b")], "critical", "HTTP 503");
        assert_eq!(
            text_line("status", &i),
            "status  web  web-1  127.0.0.1:8080  critical  zone=b  (HTTP 503)"
        );
        let bare = instance(&[], "critical", "connection refused");
        assert_eq!(
            text_line("status", &bare),
            "status  web  web-1  127.0.0.1:8080  critical  (connection refused)"
        );
    }

    #[test]
    fn a_reconnect_line_says_how_to_start_an_agent_once_and_has_no_stray_space() {
        let refused = || ClientError::Unreachable {
            url: "ws://127.0.0.1:7420".into(),
            why: "Connection refused (os error 111)".into(),
        };
        let closed = ClientError::Protocol {
            url: "ws://127.0.0.1:7420".into(),
            why: "closed the connection".into(),
        };
        let mut hinted = false;
        assert_eq!(
            lost_line(closed, &mut hinted),
            "the roster agent at ws://127.0.0.1:7420 closed the connection"
        );
        let first = lost_line(refused(), &mut hinted);
        assert!(first.contains("start one with `roster agent`"), "{first}");
        let again = lost_line(refused(), &mut hinted);
        assert_eq!(
            again,
            "cannot reach a roster agent at ws://127.0.0.1:7420: Connection refused (os error 111)"
        );
    }

    #[test]
    fn an_up_line_keeps_its_shape_without_a_note() {
        assert_eq!(
            text_line("up", &instance(&[("zone", "a")], "passing", "")),
            "up    web  web-1  127.0.0.1:8080  passing  zone=a"
        );
        assert_eq!(
            text_line("up", &instance(&[], "passing", "")),
            "up    web  web-1  127.0.0.1:8080  passing"
        );
    }
}
