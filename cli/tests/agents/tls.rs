//! TLS between agents and for clients: mutual TLS over wss, refused certificates, the TLS
//! flags, and the warning without TLS beyond loopback.

use super::*;

/// A test certificate authority, and certificates it signs for 127.0.0.1, written as PEM
/// files in a directory.
struct TestCa {
    dir: PathBuf,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    ca: PathBuf,
}

impl TestCa {
    fn new(dir: &Path, tag: &str) -> TestCa {
        let dir = dir.join(format!("ca-{tag}"));
        std::fs::create_dir_all(&dir).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("roster test CA {tag}"));
        let cert = params.self_signed(&key).unwrap();
        let ca = dir.join("ca.pem");
        std::fs::write(&ca, cert.pem()).unwrap();
        TestCa {
            dir,
            issuer: rcgen::Issuer::new(params, key),
            ca,
        }
    }

    /// A certificate for 127.0.0.1 named `name`: its certificate and key files.
    fn issue(&self, name: &str) -> (PathBuf, PathBuf) {
        self.issue_with(name, &[])
    }

    /// As [`TestCa::issue`], carrying the DNS names `extra` too.
    fn issue_with(&self, name: &str, extra: &[String]) -> (PathBuf, PathBuf) {
        let key = rcgen::KeyPair::generate().unwrap();
        let names = [&["127.0.0.1".to_string(), "localhost".to_string()][..], extra].concat();
        let mut params = rcgen::CertificateParams::new(names).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let (cert_pem, key_pem) = (
            self.dir.join(format!("{name}.pem")),
            self.dir.join(format!("{name}.key")),
        );
        std::fs::write(&cert_pem, cert.pem()).unwrap();
        std::fs::write(&key_pem, key.serialize_pem()).unwrap();
        (cert_pem, key_pem)
    }

    /// The agent flags for a certificate `name` of this CA (naming no node).
    fn flags(&self, name: &str) -> Vec<String> {
        self.flags_for(self.issue(name))
    }

    /// The agent flags for the agent `name` on data directory `dir`, with a certificate
    /// that names its node id (`node-<id>`), which `roster id` makes before the first start.
    fn node_flags(&self, dir: &Path, name: &str) -> Vec<String> {
        self.node_flags_with(dir, name, &[])
    }

    /// As [`TestCa::node_flags`], the certificate carrying the names `extra` too.
    fn node_flags_with(&self, dir: &Path, name: &str, extra: &[String]) -> Vec<String> {
        let out = roster(&["id", "--data-dir", &path_str(dir)]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let id = text(&out.stdout).trim().to_string();
        let names = [&[format!("node-{id}")][..], extra].concat();
        self.flags_for(self.issue_with(name, &names))
    }

    fn flags_for(&self, (cert, key): (PathBuf, PathBuf)) -> Vec<String> {
        [
            "--tls-cert",
            &path_str(&cert),
            "--tls-key",
            &path_str(&key),
            "--tls-ca",
            &path_str(&self.ca),
        ]
        .map(String::from)
        .to_vec()
    }
}

pub(super) fn path_str(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn two_agents_with_mutual_tls_converge_over_wss_and_the_cli_reads_with_the_ca() {
    let root = tempfile::tempdir().unwrap();
    let ca = TestCa::new(root.path(), "cluster");
    let secret = secret_file(root.path(), "secret", STRONG_SECRET);
    let secret = path_str(&secret);
    let a_flags = [
        ca.node_flags(&root.path().join("a"), "a"),
        vec!["--cluster-secret-file".into(), secret.clone()],
    ]
    .concat();
    let a = Agent::start(&root.path().join("a"), "a", &strs(&a_flags));
    assert!(a.url.starts_with("wss://127.0.0.1:"), "{}", a.url);
    let b_flags = [
        ca.node_flags(&root.path().join("b"), "b"),
        vec![
            "--cluster-secret-file".into(),
            secret.clone(),
            "--join".into(),
            a.url.clone(),
        ],
    ]
    .concat();
    let b = Agent::start(&root.path().join("b"), "b", &strs(&b_flags));
    let ca_file = path_str(&ca.ca);
    let ask = |agent: &Agent, args: &[&str]| {
        roster(&[args, &["--agent", &agent.url, "--tls-ca", &ca_file]].concat())
    };
    let out = ask(&b, &["register", "web", "127.0.0.1:8080", "--id", "web-1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    within(
        Duration::from_secs(10),
        "B's registration to reach A over mutual TLS",
        || {
            let out = ask(&a, &["get", "web", "--json"]);
            out.status.success() && text(&out.stdout).contains("web-1")
        },
    );
    // Without the CA the CLI cannot check the agent: a usage error, nothing sent.
    let out = roster(&["get", "web", "--agent", &a.url]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("--tls-ca"), "{}", text(&out.stderr));
    // With a CA that did not sign the agent's certificate, the CLI refuses the agent.
    let other = TestCa::new(root.path(), "other");
    let out = roster(&["get", "web", "--agent", &a.url, "--tls-ca", &path_str(&other.ca)]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    // A node of the same CA whose certificate names A, not itself: refused by name.
    let a_id = a.json(&["status", "--tls-ca", &ca_file])["node"]
        .as_str()
        .unwrap()
        .to_string();
    let c_flags = [
        ca.flags_for(ca.issue_with("c", &[format!("node-{a_id}")])),
        vec![
            "--cluster-secret-file".into(),
            secret.clone(),
            "--join".into(),
            a.url.clone(),
        ],
    ]
    .concat();
    let c = Agent::start(&root.path().join("c"), "c", &strs(&c_flags));
    // A logs refusals from one address once a minute; C's own log says why.
    within(
        Duration::from_secs(10),
        "A to refuse C by its certificate's name",
        || c.log().contains("does not name node-"),
    );
    let out = ask(&a, &["members", "--json"]);
    assert_eq!(
        serde_json::from_slice::<Vec<Value>>(&out.stdout).unwrap().len(),
        2,
        "C got in"
    );
    drop(c);
}

#[test]
fn a_peer_without_a_client_certificate_or_with_one_of_another_ca_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let ca = TestCa::new(root.path(), "cluster");
    let other = TestCa::new(root.path(), "other");
    let secret = path_str(&secret_file(root.path(), "secret", STRONG_SECRET));
    let a_flags = [
        ca.flags("a"),
        vec!["--cluster-secret-file".into(), secret.clone()],
    ]
    .concat();
    let a = Agent::start(&root.path().join("a"), "a", &strs(&a_flags));
    let ca_file = path_str(&ca.ca);
    let members = |agent: &Agent| -> usize {
        let out = roster(&["members", "--json", "--agent", &agent.url, "--tls-ca", &ca_file]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        serde_json::from_slice::<Vec<Value>>(&out.stdout).unwrap().len()
    };
    // A node whose certificate another CA signed: it trusts A's CA, but A does not trust it.
    let (cert, key) = other.issue("stranger");
    let stranger_flags = [
        "--tls-cert",
        &path_str(&cert),
        "--tls-key",
        &path_str(&key),
        "--tls-ca",
        &ca_file,
        "--cluster-secret-file",
        &secret,
        "--join",
        &a.url,
    ];
    let stranger = Agent::start(&root.path().join("stranger"), "stranger", &stranger_flags);
    within(
        Duration::from_secs(10),
        "A to refuse the stranger, or let it in",
        || a.log().contains("certificate") || members(&a) > 1,
    );
    assert_eq!(members(&a), 1, "A let in a node of another CA");
    drop(stranger);
    // A peer that dials A over TLS but shows no client certificate: once the upgrade says
    // it is a peer (subprotocol roster.v1), A closes with the reason.
    let reason = peer_without_certificate(&a.url, &ca.ca);
    assert!(reason.contains("client certificate"), "{reason}");
    assert_eq!(members(&a), 1);
}

/// Dials `url` over TLS trusting `ca`, shows no client certificate, asks for the peer
/// protocol, and returns the reason of the close frame that answers.
fn peer_without_certificate(url: &str, ca: &Path) -> String {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::client::ClientRequestBuilder;
    use tokio_tungstenite::tungstenite::Message;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let tls = roster::transport::driver::ClientTls::load(ca, None).unwrap();
        let addr = url.strip_prefix("wss://").unwrap();
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let stream = tls.connect(tcp, "127.0.0.1").await.unwrap();
        let request = ClientRequestBuilder::new(url.parse().unwrap()).with_sub_protocol("roster.v1");
        let (mut ws, _) = tokio_tungstenite::client_async(request, stream).await.unwrap();
        // A hello would follow; the listener must not get as far as reading it.
        let _ = ws.send(Message::Binary(vec![0u8; 4].into())).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            match tokio::time::timeout_at(deadline, ws.next()).await {
                Ok(Some(Ok(Message::Close(Some(frame))))) => return frame.reason.to_string(),
                Ok(Some(Ok(_))) => continue,
                other => return format!("no close frame: {other:?}"),
            }
        }
    })
}

/// Runs `roster agent` with `args` and `envs` until it says where it listens (or exits);
/// returns that line (empty if none), its exit code if it exited, and its stderr.
pub(super) fn agent_start_output(args: &[&str], envs: &[(&str, &str)]) -> (String, Option<i32>, String) {
    let mut child = Command::new(BIN)
        .env("ROSTER_HTTP_LISTEN", "127.0.0.1:0")
        .arg("agent")
        .args(args)
        .envs(envs.iter().copied())
        .env("ROSTER_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("listening on") {
        line.clear();
        if stdout.read_line(&mut line).unwrap() == 0 {
            break;
        }
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let code = if line.starts_with("listening on") {
        None
    } else {
        out.status.code()
    };
    (line.trim().to_string(), code, text(&out.stderr))
}

#[test]
fn tls_flags_come_all_three_or_none_and_a_bad_file_exits_2_changing_nothing() {
    let root = tempfile::tempdir().unwrap();
    let ca = TestCa::new(root.path(), "cluster");
    let (cert, key) = ca.issue("a");
    let (cert, key, ca_file) = (path_str(&cert), path_str(&key), path_str(&ca.ca));
    let data = root.path().join("data");
    let data_s = path_str(&data);
    let base = ["--listen", "127.0.0.1:0", "--data-dir", &data_s];
    let (_, code, err) = agent_start_output(&[&base[..], &["--tls-cert", &cert]].concat(), &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--tls-key and --tls-ca missing"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let (_, code, err) = agent_start_output(
        &[&base[..], &["--tls-cert", &cert, "--tls-key", &key]].concat(),
        &[],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--tls-ca missing"), "{err}");
    let missing = path_str(&root.path().join("nope.pem"));
    let (_, code, err) = agent_start_output(
        &[
            &base[..],
            &["--tls-cert", &missing, "--tls-key", &key, "--tls-ca", &ca_file],
        ]
        .concat(),
        &[],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("nope.pem"), "{err}");
    assert!(!data.exists(), "a refused start created its data directory");
    // All three from the environment: the agent serves wss://.
    let (line, code, err) = agent_start_output(
        &base,
        &[
            ("ROSTER_TLS_CERT", &cert),
            ("ROSTER_TLS_KEY", &key),
            ("ROSTER_TLS_CA", &ca_file),
        ],
    );
    assert_eq!(code, None, "{err}");
    assert!(line.starts_with("listening on wss://127.0.0.1:"), "{line}");
    // And from the config file.
    let config = root.path().join("agent.toml");
    std::fs::write(
        &config,
        format!("tls-cert = {cert:?}\ntls-key = {key:?}\ntls-ca = {ca_file:?}\n"),
    )
    .unwrap();
    let (line, code, err) = agent_start_output(&[&base[..], &["--config", &path_str(&config)]].concat(), &[]);
    assert_eq!(code, None, "{err}");
    assert!(line.starts_with("listening on wss://127.0.0.1:"), "{line}");
}

#[test]
fn an_agent_with_a_secret_and_no_tls_beyond_loopback_warns_that_messages_are_not_protected() {
    let root = tempfile::tempdir().unwrap();
    let secret = path_str(&secret_file(root.path(), "secret", STRONG_SECRET));
    let ca = TestCa::new(root.path(), "cluster");
    let start = |name: &str, listen: &str, extra: &[&str]| -> String {
        let data = path_str(&root.path().join(name));
        let args = [
            &[
                "--listen",
                listen,
                "--data-dir",
                &data,
                "--cluster-secret-file",
                &secret,
            ][..],
            extra,
        ]
        .concat();
        let (line, code, err) = agent_start_output(&args, &[]);
        assert_eq!(code, None, "the agent {name} did not start: {err}");
        assert!(line.starts_with("listening on"), "{line}");
        err
    };
    let exposed = start("exposed", "0.0.0.0:0", &["--advertise", "ws://127.0.0.1:9"]);
    let warning: Vec<&str> = exposed.lines().filter(|l| l.contains("not protected")).collect();
    assert_eq!(warning.len(), 1, "{exposed}");
    assert!(
        warning[0].contains("WARN") && warning[0].contains("--tls-cert"),
        "{exposed}"
    );
    let local = start("local", "127.0.0.1:0", &[]);
    assert!(!local.contains("not protected"), "{local}");
    let flags = ca.flags("tls");
    let with_tls = start(
        "tls",
        "0.0.0.0:0",
        &[&strs(&flags)[..], &["--advertise", "wss://127.0.0.1:9"]].concat(),
    );
    assert!(!with_tls.contains("not protected"), "{with_tls}");
}

/// This host's address on its way out (not loopback), if it has one.
fn outside_address() -> Option<std::net::IpAddr> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("198.51.100.1:9").ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_loopback()).then_some(ip)
}

/// An agent on 0.0.0.0 with a secret and a certificate of `ca` naming its node and `ip`,
/// and the path of its secret file.
fn remote_tls_agent(root: &Path, ca: &TestCa, ip: std::net::IpAddr, extra: &[&str]) -> (Agent, String) {
    let secret = path_str(&secret_file(root, "secret", STRONG_SECRET));
    let dir = root.join("a");
    let flags = [
        ca.node_flags_with(&dir, "a", &[ip.to_string()]),
        [
            "--cluster-secret-file",
            &secret,
            "--advertise",
            "wss://127.0.0.1:9",
        ]
        .map(String::from)
        .to_vec(),
    ]
    .concat();
    let a = Agent::start_on(&dir, "a", "0.0.0.0:0", &[&strs(&flags)[..], extra].concat());
    (a, secret)
}

#[test]
fn a_client_not_on_loopback_must_show_a_client_certificate_to_a_tls_agent() {
    let ip = outside_address().expect("this test needs an address other than loopback");
    let root = tempfile::tempdir().unwrap();
    let ca = TestCa::new(root.path(), "cluster");
    let (a, secret) = remote_tls_agent(root.path(), &ca, ip, &[]);
    let url = format!("wss://{ip}:{}", a.port);
    let ca_file = path_str(&ca.ca);
    let base = [
        "members",
        "--json",
        "--agent",
        &url,
        "--tls-ca",
        &ca_file,
        "--cluster-secret-file",
        &secret,
    ];
    let out = roster(&base);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("client certificate"),
        "{}",
        text(&out.stderr)
    );
    let (cert, key) = ca.issue_with("me", &[]);
    let out = roster(
        &[
            &base[..],
            &["--tls-cert", &path_str(&cert), "--tls-key", &path_str(&key)],
        ]
        .concat(),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    // From loopback, the CA is enough.
    let local = format!("wss://127.0.0.1:{}", a.port);
    let out = roster(&["members", "--json", "--agent", &local, "--tls-ca", &ca_file]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// `curl` over HTTPS: its status code, or `None` when no HTTP answer came (a refused
/// handshake).
fn https(url: &str, extra: &[&str]) -> Option<u16> {
    let out = Command::new("curl")
        .args([
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "10",
            url,
        ])
        .args(extra)
        .output()
        .unwrap();
    let code: u16 = text(&out.stdout).parse().unwrap_or(0);
    (out.status.success() && code != 0).then_some(code)
}

#[test]
fn the_http_api_serves_https_with_the_agents_tls_files_and_a_client_certificate_admits() {
    let ip = outside_address().expect("this test needs an address other than loopback");
    let root = tempfile::tempdir().unwrap();
    let ca = TestCa::new(root.path(), "cluster");
    let other = TestCa::new(root.path(), "other");
    let (a, _) = remote_tls_agent(root.path(), &ca, ip, &["--http-listen", "0.0.0.0:0"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let port = loop {
        let line = a
            .stdout
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap();
        if let Some(rest) = line.strip_prefix("HTTP API on https://") {
            break rest.rsplit(':').next().unwrap().to_string();
        }
    };
    let ca_file = path_str(&ca.ca);
    let trust = ["--cacert", ca_file.as_str()];
    assert_eq!(
        https(&format!("https://127.0.0.1:{port}/v1/status"), &trust),
        Some(200)
    );
    assert_eq!(
        https(&format!("http://127.0.0.1:{port}/v1/status"), &[]),
        None,
        "no plain HTTP"
    );
    // Beyond loopback: neither a token nor a certificate, then a certificate of the CA.
    let remote = format!("https://{ip}:{port}/v1/services");
    assert_eq!(https(&remote, &trust), Some(401));
    let (cert, key) = ca.issue("client");
    let (cert, key) = (path_str(&cert), path_str(&key));
    let with_cert = [&trust[..], &["--cert", &cert, "--key", &key]].concat();
    assert_eq!(https(&remote, &with_cert), Some(200));
    let (cert, key) = other.issue("stranger");
    let (cert, key) = (path_str(&cert), path_str(&key));
    let stranger = [&trust[..], &["--cert", &cert, "--key", &key]].concat();
    assert_eq!(
        https(&remote, &stranger),
        None,
        "a certificate of another CA is refused"
    );
    assert_eq!(https(&remote, &trust), Some(401), "and the agent still serves");
}

/// The port an agent serves its HTTP API on, from the line it printed.
fn http_port(agent: &Agent) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let line = agent
            .stdout
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap();
        if let Some(rest) = line.strip_prefix("HTTP API on ") {
            return rest.rsplit(':').next().unwrap().to_string();
        }
    }
}

#[test]
fn an_https_check_passes_with_a_certificate_of_the_agents_ca_and_fails_without_tls() {
    let root = tempfile::tempdir().unwrap();
    let ca = TestCa::new(root.path(), "cluster");
    let http = ["--http-listen", "127.0.0.1:0"];
    let flags = ca.flags("a");
    let a = Agent::start(&root.path().join("a"), "a", &[&strs(&flags)[..], &http].concat());
    let tls_port = http_port(&a);
    // The other end of each check: a's own HTTPS API (a certificate of the CA), and the
    // plain HTTP API of an agent without TLS.
    let plain = Agent::start(&root.path().join("p"), "p", &http);
    let plain_port = http_port(&plain);
    let ca_file = path_str(&ca.ca);
    let with_ca = |args: &[&str]| a.roster(&[args, &["--tls-ca", &ca_file]].concat());
    for (id, port) in [("web-1", &tls_port), ("web-2", &plain_port)] {
        let url = format!("https://127.0.0.1:{port}/v1/status");
        let out = with_ca(&[
            "register",
            "web",
            "127.0.0.1:80",
            "--id",
            id,
            "--check-http",
            &url,
            "--check-interval",
            "1s",
        ]);
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let status = |id: &str| {
        let out = with_ca(&["get", "web", id, "--json"]);
        let i: Value = serde_json::from_slice(&out.stdout).unwrap();
        (
            i["status"].as_str().unwrap().to_string(),
            i["note"].as_str().unwrap().to_string(),
        )
    };
    within(Duration::from_secs(10), "web-1 passes over HTTPS", || {
        status("web-1").0 == "passing"
    });
    // The check of a server that speaks no TLS does not pass.
    assert_eq!(status("web-2").0, "critical", "{:?}", status("web-2"));

    // An agent without TLS files refuses an https check, saying what to do.
    let url = format!("https://127.0.0.1:{tls_port}/v1/status");
    let out = plain.roster(&["register", "web", "127.0.0.1:80", "--check-http", &url]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("--tls-ca"), "{}", text(&out.stderr));
}
