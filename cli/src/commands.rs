//! The client commands: check the input, ask the agent, print the answer.

use std::time::Duration;

use roster::api::{ErrorKind, RegisterItem, Request, ServerMessage};
use roster::client::{Client, ClientError};
use roster::registry::{metadata_from_pairs, Endpoint, ProviderId, ServiceName};
use roster::transport::driver::ClientTls;
use roster::transport::handshake::Secret;

use crate::{instances_file, output, ClientArgs, Fail};

/// What `--agent`, `--cluster-secret-file` and the TLS flags ask for, checked and loaded.
pub(crate) fn settings(c: &ClientArgs) -> Result<(Option<Secret>, Option<ClientTls>), Fail> {
    if !(c.agent.starts_with("ws://") || c.agent.starts_with("wss://")) {
        let http = c.agent.starts_with("http://") || c.agent.starts_with("https://");
        return Err(Fail::usage(format!(
            "--agent {:?} is not ws://host:port or wss://host:port{}; pass --agent ws://HOST:PORT \
             with the agent's --listen address (port 7420 by default)",
            c.agent,
            if http {
                " (an http:// URL is the agent's HTTP API, which the CLI does not use)"
            } else {
                ""
            }
        )));
    }
    let tls = match (&c.tls_ca, &c.tls_cert, &c.tls_key) {
        (None, None, None) => None,
        (Some(ca), cert, key) => {
            let identity =
                match (cert, key) {
                    (Some(cert), Some(key)) => Some((cert.as_path(), key.as_path())),
                    (None, None) => None,
                    _ => return Err(Fail::usage(
                        "a client certificate needs --tls-cert and --tls-key together; pass both, or neither",
                    )),
                };
            Some(ClientTls::load(ca, identity).map_err(|e| Fail::usage(format!("TLS: {e}")))?)
        }
        (None, _, _) => {
            return Err(Fail::usage(
                "--tls-cert and --tls-key need --tls-ca FILE, the CA that signs the agent's certificate",
            ))
        }
    };
    if c.agent.starts_with("wss://") && tls.is_none() {
        return Err(Fail::usage(format!(
            "--agent {} is wss://: pass --tls-ca FILE (the CA that signs the agent's certificate)",
            c.agent
        )));
    }
    let secret = match &c.cluster_secret_file {
        Some(p) => Some(Secret::new(crate::agent::read_secret(p)?).map_err(|e| Fail::usage(e.to_string()))?),
        None => None,
    };
    Ok((secret, tls))
}

pub(crate) async fn connect(c: &ClientArgs) -> Result<Client, Fail> {
    let (secret, tls) = settings(c)?;
    Client::connect_tls(&c.agent, secret.as_ref(), tls.as_ref())
        .await
        .map_err(from_client)
}

pub(crate) fn from_client(e: ClientError) -> Fail {
    match e {
        ClientError::Unreachable { .. }
        | ClientError::NotAnAgent { .. }
        | ClientError::Unauthorized { .. }
        | ClientError::Busy { .. } => Fail::unreachable(e.to_string()),
        ClientError::Protocol { .. } => Fail::failed(e.to_string()),
    }
}

/// [`refused`], and when the agent found no such instance, `hint`: the command that lists
/// them (the agent's message names none, as it reaches HTTP clients too).
fn refused_listing(msg: ServerMessage, hint: impl FnOnce() -> String) -> Fail {
    let not_found = matches!(
        &msg,
        ServerMessage::Error {
            kind: ErrorKind::NotFound,
            ..
        }
    );
    let mut fail = refused(msg);
    if not_found {
        fail.message = format!("{}; {}", fail.message, hint());
    }
    fail
}

/// Maps an agent's error answer to a failure; anything else is unexpected.
pub(crate) fn refused(msg: ServerMessage) -> Fail {
    match msg {
        ServerMessage::Error { kind, message, .. } => match kind {
            ErrorKind::Invalid => Fail::usage(message),
            ErrorKind::Unauthorized => Fail::unreachable(message),
            ErrorKind::NotFound | ErrorKind::Throttled | ErrorKind::Failed => Fail::failed(message),
        },
        other => Fail::failed(format!("the agent sent an unexpected answer: {other:?}")),
    }
}

async fn ask(c: &ClientArgs, req: Request) -> Result<ServerMessage, Fail> {
    let mut client = connect(c).await?;
    client.request(req).await.map_err(from_client)
}

pub(crate) fn check_service(s: &str) -> Result<(), Fail> {
    ServiceName::new(s)
        .map(|_| ())
        .map_err(|e| Fail::usage(e.to_string()))
}

pub async fn register(
    c: &ClientArgs,
    item: RegisterItem,
    meta: Vec<String>,
    ttl: Option<Duration>,
) -> Result<(), Fail> {
    // Checked here too, so bad input never reaches the agent.
    check_service(&item.service)?;
    Endpoint::parse(&item.address).map_err(|e| Fail::usage(e.to_string()))?;
    let mut pairs = Vec::new();
    for m in &meta {
        let Some((k, v)) = m.split_once('=') else {
            return Err(Fail::usage(format!("--meta {m:?} is not KEY=VALUE")));
        };
        pairs.push((k.to_string(), v.to_string()));
    }
    metadata_from_pairs(&pairs).map_err(|e| Fail::usage(e.to_string()))?;
    if let Some(i) = &item.instance {
        ProviderId::new(i).map_err(|e| Fail::usage(e.to_string()))?;
    }
    if let Some(t) = ttl {
        roster::check_ttl(t).map_err(Fail::usage)?;
    }
    let ttl_ms = ttl.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX));
    let service = item.service.clone();
    let item = RegisterItem {
        meta: pairs,
        ttl_ms,
        ..item
    };
    let answer = ask(c, Request::from(item)).await?;
    match answer {
        ServerMessage::Registered { instance } => {
            if c.json {
                output::json(&serde_json::json!({ "service": service, "instance": instance }));
            } else {
                output::text_line(&instance);
            }
            Ok(())
        }
        other => Err(refused(other)),
    }
}

/// `roster register --from-file`: every line checked first, then batches on one connection,
/// each registered all or none.
pub async fn register_from_file(c: &ClientArgs, path: &std::path::Path) -> Result<(), Fail> {
    let name = path.display().to_string();
    let lines = instances_file::read(path)?;
    let mut client = connect(c).await?;
    let mut done: Vec<(String, String)> = Vec::with_capacity(lines.len());
    for batch in instances_file::batches(&lines) {
        let items: Vec<RegisterItem> = batch.iter().map(|l| l.item.clone()).collect();
        let answer = client
            .request(Request::RegisterMany { items })
            .await
            .map_err(|e| match e {
                ClientError::Protocol { url, why } if why.contains("hung up") => Fail::failed(format!(
                    "the agent at {url} {why}; an agent older than this roster does not take batches: \
                     upgrade it, or register one by one"
                )),
                e => from_client(e),
            });
        let fail = match answer {
            Ok(ServerMessage::RegisteredMany { instances }) => {
                done.extend(batch.iter().map(|l| l.item.service.clone()).zip(instances));
                continue;
            }
            Ok(other) => refused(other),
            Err(f) => f,
        };
        let message = instances_file::locate(&name, batch, &fail.message);
        let before = match (done.len(), batch.first()) {
            (0, _) | (_, None) => String::new(),
            (n, Some(l)) => format!(" (the {n} instances before line {} are registered)", l.number),
        };
        return Err(Fail {
            code: fail.code,
            message: format!("{message}{before}"),
        });
    }
    if c.json {
        let v: Vec<_> = done
            .iter()
            .map(|(s, i)| serde_json::json!({ "service": s, "instance": i }))
            .collect();
        output::json(&v);
    } else {
        for (_, i) in &done {
            output::text_line(i);
        }
    }
    Ok(())
}

/// `roster deregister`; with `any_owner`, an operator's removal whatever node owns it.
pub async fn deregister(
    c: &ClientArgs,
    service: String,
    instance: String,
    any_owner: bool,
) -> Result<(), Fail> {
    check_service(&service)?;
    ProviderId::new(&instance).map_err(|e| Fail::usage(e.to_string()))?;
    let (s, i) = (service.clone(), instance.clone());
    let req = if any_owner {
        Request::RemoveAsOperator {
            service: s,
            instance: i,
        }
    } else {
        Request::Deregister {
            service: s,
            instance: i,
        }
    };
    match ask(c, req).await? {
        ServerMessage::Deregistered => {
            if c.json {
                output::json(
                    &serde_json::json!({ "service": service, "instance": instance, "deregistered": true }),
                );
            } else {
                println!("deregistered {instance} of {service}");
            }
            Ok(())
        }
        other => Err(refused_listing(other, || {
            format!("`roster get {service}` lists them")
        })),
    }
}

pub async fn ls(c: &ClientArgs) -> Result<(), Fail> {
    match ask(c, Request::Services).await? {
        ServerMessage::Services(list) => {
            if c.json {
                let v: Vec<_> = list
                    .iter()
                    .map(|(s, n)| serde_json::json!({ "service": s, "instances": n }))
                    .collect();
                output::json(&v);
            } else {
                let rows = list.iter().map(|(s, n)| vec![s.clone(), n.to_string()]).collect();
                output::table(&["SERVICE", "INSTANCES"], rows);
            }
            Ok(())
        }
        other => Err(refused(other)),
    }
}

pub async fn get(c: &ClientArgs, service: String, all: bool, near: Option<String>) -> Result<(), Fail> {
    check_service(&service)?;
    if let Some(z) = near.as_deref().filter(|z| *z != roster::NEAR_AGENT) {
        roster::Zone::new(z).map_err(|e| Fail::usage(format!("--near: {e}")))?;
    }
    match ask(
        c,
        Request::Instances {
            service: service.clone(),
            all,
            near,
        },
    )
    .await?
    {
        ServerMessage::Instances(list) => {
            if list.is_empty() {
                return Err(none_served(c, &service, all).await);
            }
            if c.json {
                output::json(&list.iter().map(output::instance_json).collect::<Vec<_>>());
            } else {
                output::instances(&list);
            }
            Ok(())
        }
        other => Err(refused(other)),
    }
}

/// `roster get SERVICE INSTANCE`: one live instance, whatever its status.
pub async fn get_one(c: &ClientArgs, service: String, instance: String) -> Result<(), Fail> {
    check_service(&service)?;
    ProviderId::new(&instance).map_err(|e| Fail::usage(e.to_string()))?;
    let all = Request::Instances {
        service: service.clone(),
        all: true,
        near: None,
    };
    let list = match ask(c, all).await? {
        ServerMessage::Instances(list) => list,
        other => return Err(refused(other)),
    };
    let Some(i) = list.into_iter().find(|i| i.instance == instance) else {
        return Err(Fail::failed(format!(
            "no live instance {instance:?} of {service:?}; `roster get {service} --all` lists the live ones"
        )));
    };
    if c.json {
        output::json(&output::instance_json(&i));
    } else {
        output::instances(std::slice::from_ref(&i));
    }
    Ok(())
}

/// Why `get` shows nothing: no live instance at all, or none served (asked again with
/// `all`, so the error says which).
async fn none_served(c: &ClientArgs, service: &str, all: bool) -> Fail {
    let hidden = if all {
        0
    } else {
        match ask(
            c,
            Request::Instances {
                service: service.to_string(),
                all: true,
                near: None,
            },
        )
        .await
        {
            Ok(ServerMessage::Instances(l)) => l.len(),
            _ => 0,
        }
    };
    Fail::failed(if hidden == 0 {
        format!("no live instances of {service}; `roster ls` lists the services that have some")
    } else {
        format!(
            "no served instances of {service}: {hidden} critical, in maintenance or unreachable; `roster get {service} --all` shows them"
        )
    })
}

/// `roster pass`: a TTL check's heartbeat.
pub async fn pass(c: &ClientArgs, service: String, instance: String) -> Result<(), Fail> {
    check_service(&service)?;
    ProviderId::new(&instance).map_err(|e| Fail::usage(e.to_string()))?;
    match ask(c, Request::Pass { service, instance }).await? {
        ServerMessage::Passed => Ok(()),
        other => Err(refused(other)),
    }
}

/// `roster maint enable|disable [SERVICE INSTANCE]`.
pub async fn maint(
    c: &ClientArgs,
    enable: bool,
    instance: Option<(String, String)>,
    reason: Option<String>,
) -> Result<(), Fail> {
    if let Some((s, i)) = &instance {
        check_service(s)?;
        ProviderId::new(i).map_err(|e| Fail::usage(e.to_string()))?;
    }
    if !enable && reason.is_some() {
        return Err(Fail::usage("--reason goes with `maint enable`"));
    }
    let reason = enable.then(|| reason.unwrap_or_else(|| "maintenance".to_string()));
    let service = instance.as_ref().map(|(s, _)| s.clone()).unwrap_or_default();
    match ask(c, Request::Maintenance { instance, reason }).await? {
        ServerMessage::Maintenance { changed } => {
            if c.json {
                output::json(&serde_json::json!({ "changed": changed }));
            } else {
                for k in &changed {
                    output::text_line(k);
                }
            }
            Ok(())
        }
        other => Err(refused_listing(other, || {
            format!("`roster get {service} --all` lists them with their nodes")
        })),
    }
}

pub async fn members(c: &ClientArgs) -> Result<(), Fail> {
    match ask(c, Request::Members).await? {
        ServerMessage::Members(list) => {
            if c.json {
                output::json(&list);
            } else {
                let rows = list
                    .iter()
                    .map(|m| {
                        vec![
                            m.name.clone(),
                            m.node.clone(),
                            m.address.clone(),
                            m.zone.clone().unwrap_or_else(|| "-".to_string()),
                            m.state.clone(),
                            output::ago(m.last_heard_ms),
                            m.lease_left_ms.map_or_else(|| "-".to_string(), output::within),
                            m.synced_ms.map_or_else(|| "-".to_string(), output::ago),
                        ]
                    })
                    .collect();
                output::table(
                    &[
                        "NAME",
                        "NODE",
                        "ADDRESS",
                        "ZONE",
                        "STATE",
                        "LAST HEARD",
                        "LEASE",
                        "SYNCED",
                    ],
                    rows,
                );
            }
            Ok(())
        }
        other => Err(refused(other)),
    }
}

pub async fn status(c: &ClientArgs) -> Result<(), Fail> {
    match ask(c, Request::Status).await? {
        ServerMessage::Status(s) => {
            if c.json {
                output::json(&s);
            } else {
                output::status(&s);
            }
            Ok(())
        }
        other => Err(refused(other)),
    }
}

pub async fn explain(c: &ClientArgs, service: String, instance: String) -> Result<(), Fail> {
    check_service(&service)?;
    ProviderId::new(&instance).map_err(|e| Fail::usage(e.to_string()))?;
    let hint = format!("`roster get {service}` lists the live ones");
    match ask(c, Request::Explain { service, instance }).await? {
        ServerMessage::Explain(x) => {
            if c.json {
                output::json(&x);
            } else {
                output::explain(&x);
            }
            Ok(())
        }
        other => Err(refused_listing(other, || hint)),
    }
}

pub async fn sync(c: &ClientArgs) -> Result<(), Fail> {
    match ask(c, Request::Sync).await? {
        ServerMessage::Synced { asked } => {
            if c.json {
                output::json(&serde_json::json!({ "asked": asked }));
            } else if asked {
                println!("asked a peer for an anti-entropy round");
            } else {
                println!("no peer is connected: nothing to sync with");
            }
            Ok(())
        }
        other => Err(refused(other)),
    }
}

pub async fn leave(c: &ClientArgs) -> Result<(), Fail> {
    match ask(c, Request::Leave).await? {
        ServerMessage::Left => {
            if c.json {
                output::json(&serde_json::json!({ "left": true }));
            } else {
                println!("the agent at {} is leaving the cluster and stopping", c.agent);
            }
            Ok(())
        }
        other => Err(refused(other)),
    }
}

/// `roster force-leave NODE`.
pub async fn force_leave(c: &ClientArgs, node: String) -> Result<(), Fail> {
    match ask(c, Request::ForceLeave { node: node.clone() }).await? {
        ServerMessage::ForcedLeave { node: id } => {
            if c.json {
                output::json(&serde_json::json!({ "node": id, "written_dead": true }));
            } else {
                println!("node {node} ({id}) written dead: its registrations are gone from every read");
            }
            Ok(())
        }
        other => Err(refused(other)),
    }
}
