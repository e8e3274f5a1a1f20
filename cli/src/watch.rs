//! `roster watch`: a service's instances, then its changes as they arrive.

use std::collections::BTreeMap;

use roster::api::{EventView, Request, ServerMessage};

use crate::commands::{check_service, connect, from_client, refused};
use crate::{output, ClientArgs, Fail};

pub(crate) async fn watch(c: &ClientArgs, service: String) -> Result<(), Fail> {
    check_service(&service)?;
    let mut client = connect(c).await?;
    client
        .start(Request::Watch {
            service: service.clone(),
        })
        .await
        .map_err(from_client)?;
    // Addresses of the instances seen up, so a down line can name them too.
    let mut seen: BTreeMap<String, (String, Vec<(String, String)>)> = BTreeMap::new();
    loop {
        let msg = tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(()),
            m = client.recv() => m.map_err(from_client)?,
        };
        match msg {
            ServerMessage::Event(EventView::Up(i)) => {
                seen.insert(i.instance.clone(), (i.address.clone(), i.meta.clone()));
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
            ServerMessage::Event(EventView::Down { service, instance }) => {
                let (address, meta) = seen.remove(&instance).unwrap_or_default();
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
            other => return Err(refused(other)),
        }
    }
}
