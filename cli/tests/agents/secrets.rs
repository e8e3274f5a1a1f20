//! The cluster secret and what clients are trusted with: an agent that cannot prove the
//! secret, escaped output from a hostile agent, secret files and their strength,
//! unauthenticated connections.

use super::*;

/// Writes a cluster secret file readable by its owner only, as `roster` requires.
pub(super) fn secret_file(dir: &Path, name: &str, secret: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, secret).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

pub(super) const STRONG_SECRET: &str = "q8Vw0yU3kq2m9Hc7r1XfLZb0pQe5T4nJ6sYdGa2uWkE=";

/// An impostor: a WebSocket server on a free loopback port that speaks the client
/// protocol's hello without holding any secret (it says it asks for none), then claims
/// success for everything: a forged proof, instances whose fields carry newlines and
/// escape sequences, a watch that forges a `down` line. It notes what each client sent.
struct FakeAgent {
    url: String,
    received: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    addr: std::net::SocketAddr,
}

const EVIL: &str = "a\n\u{1b}[31mdown  web  web-2  10.6.6.6:80\u{1b}[0m";

impl FakeAgent {
    fn start() -> FakeAgent {
        use roster::api::{
            decode, encode, ClientMessage, EventView, InstanceView, Request, ServerHello, ServerMessage,
        };
        use tokio_tungstenite::tungstenite;

        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let received = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (log, halt) = (received.clone(), stop.clone());
        std::thread::spawn(move || {
            for tcp in listener.incoming() {
                if halt.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                let Ok(tcp) = tcp else { continue };
                let log = log.clone();
                std::thread::spawn(move || {
                    #[allow(clippy::result_large_err)] // the signature is tungstenite's
                    let echo =
                        |req: &tungstenite::handshake::server::Request,
                         mut resp: tungstenite::handshake::server::Response| {
                            if let Some(p) = req.headers().get("Sec-WebSocket-Protocol") {
                                resp.headers_mut().insert("Sec-WebSocket-Protocol", p.clone());
                            }
                            Ok(resp)
                        };
                    let Ok(mut ws) = tungstenite::accept_hdr(tcp, echo) else {
                        return;
                    };
                    let send = |ws: &mut tungstenite::WebSocket<std::net::TcpStream>, m: &ServerMessage| {
                        ws.send(tungstenite::Message::binary(encode(m)))
                    };
                    let hello = ServerHello {
                        node: "00000000000000aa".into(),
                        name: "impostor".into(),
                        nonce: [9; 32],
                        auth_required: false,
                    };
                    if send(&mut ws, &ServerMessage::Hello(hello)).is_err() {
                        return;
                    }
                    let instance = |id: &str| InstanceView {
                        service: "web".into(),
                        instance: id.into(),
                        address: "10.0.0.1:80".into(),
                        meta: vec![("zone".into(), EVIL.into())],
                        status: format!("passing{EVIL}"),
                        note: EVIL.into(),
                        node: "00000000000000aa".into(),
                        registered_at_ms: 0,
                        lease_expires_at_ms: 0,
                    };
                    while let Ok(msg) = ws.read() {
                        let tungstenite::Message::Binary(b) = msg else {
                            continue;
                        };
                        let Ok(msg) = decode::<ClientMessage>(&b) else {
                            return;
                        };
                        log.lock().unwrap().push(match &msg {
                            ClientMessage::Auth { .. } => "auth".to_string(),
                            ClientMessage::Request(r) => format!("{r:?}"),
                        });
                        let answers = match msg {
                            ClientMessage::Auth { .. } => vec![ServerMessage::AuthOk { proof: [0; 32] }],
                            ClientMessage::Request(Request::Register { .. }) => {
                                vec![ServerMessage::Registered {
                                    instance: format!("web-1{EVIL}"),
                                }]
                            }
                            ClientMessage::Request(Request::Deregister { .. }) => {
                                vec![ServerMessage::Deregistered]
                            }
                            ClientMessage::Request(Request::Services) => {
                                vec![ServerMessage::Services(vec![("web".into(), 1)])]
                            }
                            ClientMessage::Request(Request::Instances { .. }) => {
                                vec![ServerMessage::Instances(vec![instance("web-1")])]
                            }
                            ClientMessage::Request(Request::Watch { .. } | Request::WatchFrom { .. }) => {
                                vec![
                                    ServerMessage::Event(EventView::Up(instance("web-1"))),
                                    ServerMessage::Event(EventView::Down {
                                        service: "web".into(),
                                        instance: "web-1".into(),
                                    }),
                                ]
                            }
                            ClientMessage::Request(_) => vec![ServerMessage::Synced { asked: true }],
                        };
                        for a in &answers {
                            if send(&mut ws, a).is_err() {
                                return;
                            }
                        }
                        if answers.len() > 1 {
                            let _ = ws.close(None);
                        }
                    }
                });
            }
        });
        FakeAgent {
            url: format!("ws://{addr}"),
            received,
            stop,
            addr,
        }
    }

    fn received(&self) -> Vec<String> {
        self.received.lock().unwrap().clone()
    }
}

impl Drop for FakeAgent {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        // Wake the accept loop so that it sees the flag.
        let _ = std::net::TcpStream::connect(self.addr);
    }
}

/// Runs `roster` with `args`, killing it (by pid) if it has not exited within `limit`.
fn roster_within(args: &[&str], limit: Duration) -> Output {
    let mut child = Command::new(BIN)
        .env("ROSTER_HTTP_LISTEN", "127.0.0.1:0")
        .args(args)
        .env_remove("ROSTER_AGENT")
        .env_remove("ROSTER_CLUSTER_SECRET_FILE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    child.wait_with_output().unwrap()
}

#[test]
fn a_cli_holding_the_secret_refuses_an_agent_that_cannot_prove_it() {
    let root = tempfile::tempdir().unwrap();
    let secret = secret_file(root.path(), "secret", STRONG_SECRET);
    let secret = secret.to_str().unwrap();
    let fake = FakeAgent::start();
    for args in [
        vec!["ls"],
        vec!["get", "web"],
        vec!["register", "web", "10.0.0.1:80"],
        vec!["deregister", "web", "web-1"],
    ] {
        let out = roster(
            &[
                &args[..],
                &["--agent", &fake.url, "--cluster-secret-file", secret],
            ]
            .concat(),
        );
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "roster {args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "one line: {err:?}");
        assert!(err.starts_with("roster: error: cannot authenticate"), "{err}");
        assert!(err.contains("did not prove it holds the cluster secret"), "{err}");
        assert!(
            out.stdout.is_empty(),
            "roster {args:?} printed {:?}",
            text(&out.stdout)
        );
    }
    // The impostor got proofs to check, never a request to answer.
    let got = fake.received();
    assert!(got.iter().all(|m| m == "auth"), "{got:?}");

    // A real agent without a secret cannot prove one either, and says so.
    let a = Agent::start(&root.path().join("a"), "a", &[]);
    let out = a.roster(&["ls", "--cluster-secret-file", secret]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("has no cluster secret"), "{err}");
    // An agent with the secret proves it to a client on loopback that holds it.
    let b = Agent::start(&root.path().join("b"), "b", &["--cluster-secret-file", secret]);
    let out = b.roster(&["register", "web", "10.0.0.1:80", "--cluster-secret-file", secret]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(b.instances("web").len(), 1);
}

#[test]
fn text_output_escapes_what_an_agent_sent() {
    let fake = FakeAgent::start();
    let forged =
        |stdout: &str| stdout.contains('\u{1b}') || stdout.lines().any(|l| l.starts_with("down  web  web-2"));
    let out = roster(&["get", "web", "--agent", &fake.url]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(stdout.lines().count(), 2, "a header and one row: {stdout}");
    assert!(!forged(&stdout), "{stdout:?}");
    assert!(stdout.contains("\\n\\u{1b}[31mdown"), "{stdout:?}");

    let out = roster(&["register", "web", "10.0.0.1:80", "--agent", &fake.url]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(stdout.lines().count(), 1, "{stdout:?}");
    assert!(!forged(&stdout), "{stdout:?}");

    // The impostor's watch sends one up, one down, then hangs up (with --once the CLI then
    // exits 1; without, it would reconnect).
    let out = roster_within(
        &["watch", "web", "--once", "--agent", &fake.url],
        Duration::from_secs(10),
    );
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout:?}");
    assert!(
        lines[0].starts_with("up    web  web-1  10.0.0.1:80  passinga\\n"),
        "{stdout:?}"
    );
    assert_eq!(lines[1], "down  web  web-1  10.0.0.1:80");
    assert!(!forged(&stdout), "{stdout:?}");
    // Each command reached the impostor (no secret here, so none was asked of it).
    let got = fake.received();
    assert!(got.iter().any(|r| r.starts_with("Watch")), "{got:?}");
    assert!(!got.contains(&"auth".to_string()), "{got:?}");
}

#[test]
fn a_secret_file_others_can_read_is_refused_with_the_chmod_to_run() {
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().unwrap();
    let path = secret_file(root.path(), "secret", STRONG_SECRET);
    let shown = path.display().to_string();
    let data = root.path().join("data");
    let a = Agent::start(&root.path().join("a"), "a", &["--cluster-secret-file", &shown]);
    for mode in [0o644, 0o640, 0o604, 0o660] {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        let agent = roster_within(
            &[
                "agent",
                "--listen",
                "127.0.0.1:0",
                "--data-dir",
                data.to_str().unwrap(),
                "--cluster-secret-file",
                &shown,
            ],
            Duration::from_secs(10),
        );
        let client = roster(&["ls", "--agent", &a.url, "--cluster-secret-file", &shown]);
        for (what, out) in [("agent", agent), ("ls", client)] {
            let err = text(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{what} with mode {mode:o}: {err}");
            assert_eq!(err.lines().count(), 1, "one line: {err:?}");
            assert!(err.contains(&format!("run `chmod 600 {shown}`")), "{err}");
            assert!(err.contains(&format!("{mode:04o}")), "{err}");
        }
        assert!(!data.exists(), "a refused start creates no data dir");
    }
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = roster(&["ls", "--agent", &a.url, "--cluster-secret-file", &shown]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn an_agent_with_a_short_or_repetitive_secret_warns_at_start() {
    let root = tempfile::tempdir().unwrap();
    let warnings = |name: &str, secret: &str| -> String {
        let path = secret_file(root.path(), &format!("{name}.secret"), secret);
        let (path, data) = (path.display().to_string(), root.path().join(name).join("data"));
        let data = data.display().to_string();
        let args = [
            "--listen",
            "127.0.0.1:0",
            "--node-name",
            name,
            "--cluster-secret-file",
            &path,
            "--data-dir",
            &data,
        ];
        let (line, _, stderr) = agent_start_output(&args, &[]);
        assert!(line.starts_with("listening on"), "the agent {name} did not start");
        stderr
    };
    let short = warnings("short", "twenty-byte-secret!!");
    assert!(
        short.contains("WARN") && short.contains("fewer than 32"),
        "{short}"
    );
    assert!(short.contains("head -c 32 /dev/urandom"), "{short}");
    let repetitive = warnings("repetitive", &"ab".repeat(20));
    assert!(repetitive.contains("2 distinct byte values"), "{repetitive}");
    let strong = warnings("strong", STRONG_SECRET);
    assert!(!strong.contains("cluster secret"), "{strong}");
}

/// Keeps `n` client connections from `from` to `port` open that never say a word after the
/// upgrade, opening a new one as each is cut or refused, until `stop` is set.
fn unauthenticated_clients(
    from: &'static str,
    port: u16,
    n: usize,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<()> {
    use futures_util::StreamExt;
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let mut tasks = tokio::task::JoinSet::new();
            for _ in 0..n {
                let stop = std::sync::Arc::clone(&stop);
                tasks.spawn(async move {
                    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                        let socket = tokio::net::TcpSocket::new_v4().unwrap();
                        socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
                        let Ok(tcp) = socket.connect(([127, 0, 0, 1], port).into()).await else {
                            tokio::time::sleep(Duration::from_millis(250)).await;
                            continue;
                        };
                        let request = tokio_tungstenite::tungstenite::client::ClientRequestBuilder::new(
                            format!("ws://127.0.0.1:{port}").parse().unwrap(),
                        )
                        .with_sub_protocol("roster.client.v1");
                        match tokio_tungstenite::client_async(request, tcp).await {
                            // Silent until the agent gives up on it.
                            Ok((mut ws, _)) => while let Some(Ok(_)) = ws.next().await {},
                            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
                        }
                    }
                });
            }
            while tasks.join_next().await.is_some() {}
        });
    })
}

/// 70 client connections from one address that never authenticated took all 64 inbound
/// slots, shutting out the local CLI and a peer, and made 3,900 WARN lines in 14 s. Now an
/// address holds a few such connections at most, and its refusals make a line a minute.
#[test]
fn unauthenticated_connections_from_one_address_leave_room_for_the_cli_and_peers_and_log_little() {
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    let a = Agent::start(&root.join("a"), "a", &[]);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let attack = unauthenticated_clients("127.0.0.2", a.port, 70, std::sync::Arc::clone(&stop));
    // Let the attack take what it can, and outlast the agent's 5 s wait for a request.
    std::thread::sleep(Duration::from_secs(6));
    let out = a.roster(&["status"]);
    assert!(
        out.status.success(),
        "the local CLI is served: {}",
        text(&out.stderr)
    );
    let b = Agent::start(&root.join("b"), "b", &["--join", &a.url]);
    within(Duration::from_secs(20), "a peer to join despite the 70", || {
        a.json(&["members"]).as_array().unwrap().len() == 2
    });
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    attack.join().unwrap();
    let log = a.log();
    let about: Vec<&str> = log.lines().filter(|l| l.contains("127.0.0.2")).collect();
    assert!(!about.is_empty(), "the refusals are logged: {log}");
    assert!(
        about.len() <= 3,
        "{} lines about one address: {about:#?}",
        about.len()
    );
    drop(b);
}
