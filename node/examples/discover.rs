//! A service that registers itself and a client that discovers it through a watch.
//!
//! ```sh
//! cargo run -p roster --example discover
//! ```
//!
//! Two roster nodes run in this one process, as two services on two machines would:
//! - the **echo service** listens on a TCP port, starts a node and registers itself as
//!   `echo` at that address;
//! - the **client** starts its own node, joins the first, watches `echo`, and connects to
//!   the first instance it hears of (pushed to it, no polling), then says hello.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use futures_util::StreamExt;
use roster::{Event, Node, Service};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let data = tempfile::tempdir()?;

    // The echo service: a TCP server, and a roster node that registers it.
    let server = TcpListener::bind("127.0.0.1:0").await?;
    let addr = server.local_addr()?.to_string();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = server.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n) = conn.read(&mut buf).await {
                    if n == 0 || conn.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    let service_node = Node::builder()
        .listen("127.0.0.1:0")
        .data_dir(data.path().join("service"))
        .node_name("echo-host")
        .start()
        .await?;
    let registration = service_node
        .register(Service::new("echo", &addr).meta("version", "1"))
        .await?;
    println!(
        "echo service: listening on {addr}, registered as {}",
        registration.id()
    );

    // The client: its own node, joined to the first; it finds `echo` through a watch.
    let client_node = Node::builder()
        .listen("127.0.0.1:0")
        .join([service_node.url()])
        .node_name("client-host")
        .start()
        .await?;
    let mut changes = client_node.watch("echo");
    let found = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(event) = changes.next().await {
            if let Event::Up(instance) = event {
                return Some(instance);
            }
        }
        None
    })
    .await?
    .ok_or("the node stopped")?;
    println!(
        "client: found {} instance {} at {} (registered by node {})",
        found.service, found.id, found.address, found.node
    );

    let mut conn = TcpStream::connect(&found.address).await?;
    conn.write_all(b"hello, echo").await?;
    let mut buf = [0u8; 64];
    let n = conn.read(&mut buf).await?;
    println!(
        "client: the service answered {:?}",
        String::from_utf8_lossy(&buf[..n])
    );

    // Leaving: the registration goes first, and the client sees it go.
    registration.deregister().await?;
    if let Ok(Some(Event::Down { id, .. })) =
        tokio::time::timeout(Duration::from_secs(5), changes.next()).await
    {
        println!("client: instance {id} went down");
    }
    client_node.shutdown().await?;
    service_node.shutdown().await?;
    Ok(())
}
