//! `roster watch`: a service's instances, then its changes as they arrive. When the agent
//! goes away (a restart), the watch reconnects with a jittered backoff and asks for what
//! changed since what it printed ([`RemoteWatch`]), so it neither repeats nor misses a
//! change; `--once` ends it instead.

use roster::api::InstanceView;
use roster::client::{RemoteWatch, WatchError, WatchEvent};

use crate::commands::{check_service, from_client, refused, settings};
use crate::{output, ClientArgs, Fail};

pub(crate) async fn watch(c: &ClientArgs, service: String, once: bool, all: bool) -> Result<(), Fail> {
    check_service(&service)?;
    let (secret, tls) = settings(c)?;
    let mut watch = RemoteWatch::new(&c.agent, secret, tls, &service, all);
    loop {
        let event = tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(()),
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
                from_client(why).message,
                humantime::format_duration(retry_in)
            ),
            Err(WatchError::Client(e)) => return Err(from_client(e)),
            Err(WatchError::Refused(m)) => return Err(refused(m)),
        }
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
