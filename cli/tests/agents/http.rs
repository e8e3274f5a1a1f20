//! The HTTP API with real clients: curl for every endpoint, watches, bad input and tokens.
//! (The reference's examples and its Python client run in `doc_examples`.)

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::*;

/// An agent with its HTTP API on a free loopback port, and the API's base URL.
fn http_agent(dir: &Path, name: &str, extra: &[&str]) -> (Agent, String) {
    let agent = Agent::start(dir, name, &[&["--http-listen", "127.0.0.1:0"], extra].concat());
    let url = http_url(&agent);
    (agent, url)
}

/// The base URL the agent printed at its start.
pub(super) fn http_url(agent: &Agent) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let line = agent
            .stdout
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("the agent printed where its HTTP API listens");
        if let Some(url) = line.strip_prefix("HTTP API on ") {
            return url.to_string();
        }
    }
}

/// An HTTP answer: its status, headers (lowercase names) and body.
pub(super) struct Reply {
    pub(super) code: u16,
    headers: String,
    pub(super) body: String,
}

impl Reply {
    pub(super) fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// The error's kind, asserting the status and that the body is one error object.
    pub(super) fn error(&self, code: u16) -> String {
        assert_eq!(self.code, code, "{}", self.body);
        let v = self.json();
        let message = v["error"]["message"].as_str().unwrap();
        assert!(!message.is_empty() && !message.contains('\n'), "{message}");
        v["error"]["kind"].as_str().unwrap().to_string()
    }

    pub(super) fn header(&self, name: &str) -> Option<String> {
        self.headers.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    }
}

/// `curl` with `args`; any status is an answer.
pub(super) fn curl(args: &[&str]) -> Reply {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "30", "-D", "-", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .expect("curl runs (.ci/run installs it)");
    assert!(out.status.success(), "curl {args:?}: {}", text(&out.stderr));
    let all = String::from_utf8(out.stdout).unwrap();
    let (rest, code) = all.rsplit_once('\n').unwrap();
    let (headers, body) = rest.split_once("\r\n\r\n").unwrap_or((rest, ""));
    Reply {
        code: code.trim().parse().unwrap(),
        headers: headers.to_string(),
        body: body.to_string(),
    }
}

fn put(url: &str, body: &str) -> Reply {
    curl(&[
        "-X",
        "PUT",
        url,
        "-H",
        "content-type: application/json",
        "-d",
        body,
    ])
}

/// The instance ids a read shows.
fn ids(reply: &Reply) -> Vec<String> {
    assert_eq!(reply.code, 200, "{}", reply.body);
    reply
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["instance"].as_str().unwrap().to_string())
        .collect()
}

fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !f() {
        assert!(Instant::now() < deadline, "not within 15 s: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_registration_over_http_reaches_every_agent_and_each_endpoint_answers_json() {
    let root = tempfile::tempdir().unwrap();
    let (a, ha) = http_agent(&root.path().join("a"), "a", &[]);
    let (_b, hb) = http_agent(&root.path().join("b"), "b", &["--join", &a.url]);
    let web1 = format!("{ha}/v1/services/web/instances/web-1");
    let r = put(&web1, r#"{"address": "10.0.0.7:8080", "meta": {"zone": "eu-1"}}"#);
    assert_eq!(
        r.json(),
        serde_json::json!({"service": "web", "instance": "web-1"})
    );
    put(
        &format!("{ha}/v1/services/web/instances/web-2"),
        r#"{"address": "10.0.0.8:8080"}"#,
    );
    eventually("b shows both", || {
        ids(&curl(&[&format!("{hb}/v1/services/web")])) == ["web-1", "web-2"]
    });
    assert_eq!(
        ids(&curl(&[&format!("{hb}/v1/services/web?meta=zone:eu-1")])),
        ["web-1"]
    );
    let services = curl(&[&format!("{hb}/v1/services")]).json();
    assert!(services
        .as_array()
        .unwrap()
        .contains(&serde_json::json!({"service": "web", "instances": 2})));
    let members = curl(&[&format!("{hb}/v1/members")]).json();
    assert_eq!(members.as_array().unwrap().len(), 2, "{members}");
    assert_eq!(curl(&[&format!("{ha}/v1/status")]).json()["name"], "a");
    assert_eq!(
        curl(&[&format!("{ha}/v1/explain/web/web-1")]).json()["live"],
        true
    );
    // Maintenance takes it out of every agent's reads, and puts it back.
    let maint = format!("{web1}/maintenance");
    let r = put(&maint, r#"{"reason": "deploying"}"#);
    assert_eq!(r.json()["changed"], serde_json::json!(["web/web-1"]));
    eventually("b hides web-1", || {
        ids(&curl(&[&format!("{hb}/v1/services/web")])) == ["web-2"]
    });
    let hidden = curl(&[&format!("{hb}/v1/services/web?status=maintenance")]).json();
    assert_eq!(hidden[0]["note"], "deploying");
    curl(&["-X", "DELETE", &maint]);
    eventually("b shows web-1 again", || {
        ids(&curl(&[&format!("{hb}/v1/services/web")])).len() == 2
    });
    // Deregistered: gone everywhere; again, it is not found.
    let r = curl(&["-X", "DELETE", &web1]);
    assert_eq!(r.json()["deregistered"], true);
    eventually("b no longer shows web-1", || {
        ids(&curl(&[&format!("{hb}/v1/services/web")])) == ["web-2"]
    });
    assert_eq!(curl(&["-X", "DELETE", &web1]).error(404), "not_found");
    // Not this agent's: it cannot deregister what b does not own, and says who does.
    let r = curl(&["-X", "DELETE", &format!("{hb}/v1/services/web/instances/web-2")]);
    assert_eq!(r.error(409), "failed");
    assert!(r.body.contains("registered by node a"), "{}", r.body);
    assert_eq!(curl(&[&format!("{ha}/v1/nothing")]).error(404), "not_found");
    assert_eq!(
        curl(&["-X", "POST", &format!("{ha}/v1/services")]).error(405),
        "invalid"
    );
    // A service nobody registered is an empty list, so a watch or a blocking query may
    // wait for its first instance.
    assert!(ids(&curl(&[&format!("{ha}/v1/services/db")])).is_empty());
}

/// `curl -N` on an event stream, its lines collected.
struct Stream {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Stream {
    fn open(url: &str) -> Stream {
        Self::open_with(url, &[])
    }

    /// As [`Stream::open`], with more curl arguments (a header).
    fn open_with(url: &str, args: &[&str]) -> Stream {
        let mut child = Command::new("curl")
            .args(["-sN", url])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let rx = lines_of(stdout);
        Stream { child, lines: rx }
    }

    /// The next event (`event:` and `data:`), skipping comments, within 15 s.
    fn next(&self) -> (String, Value) {
        let (kind, data, _) = self.next_with_id();
        (kind, data)
    }

    /// The next event and its `id:`, if it has one.
    fn next_with_id(&self) -> (String, Value, Option<String>) {
        let (mut kind, mut id) = (None, None);
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(15))
                .expect("an event within 15 s");
            if let Some(k) = line.strip_prefix("event: ") {
                kind = Some(k.to_string());
            } else if let Some(i) = line.strip_prefix("id: ") {
                id = Some(i.to_string());
            } else if let Some(d) = line.strip_prefix("data: ") {
                return (kind.take().unwrap(), serde_json::from_str(d).unwrap(), id);
            }
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn an_http_watch_streams_changes_and_a_blocking_query_answers_when_they_happen() {
    let root = tempfile::tempdir().unwrap();
    let (_a, h) = http_agent(&root.path().join("a"), "a", &[]);
    let inst = |id: &str| format!("{h}/v1/services/web/instances/{id}");
    put(
        &inst("web-1"),
        r#"{"address": "10.0.0.7:8080", "meta": {"zone": "eu-1"}}"#,
    );
    let watch = Stream::open(&format!("{h}/v1/services/web?watch&meta=zone:eu-1"));
    let (kind, data) = watch.next();
    assert_eq!((kind.as_str(), &data["instance"]), ("up", &Value::from("web-1")));
    // Outside the filter: nothing. Inside: up, then down when it leaves the filter.
    put(
        &inst("web-2"),
        r#"{"address": "10.0.0.8:8080", "meta": {"zone": "eu-2"}}"#,
    );
    put(
        &inst("web-3"),
        r#"{"address": "10.0.0.9:8080", "meta": {"zone": "eu-1"}}"#,
    );
    let (kind, data) = watch.next();
    assert_eq!((kind.as_str(), &data["instance"]), ("up", &Value::from("web-3")));
    put(
        &inst("web-3"),
        r#"{"address": "10.0.0.9:8080", "meta": {"zone": "eu-2"}}"#,
    );
    let (kind, data) = watch.next();
    assert_eq!(kind, "down");
    assert_eq!(
        data,
        serde_json::json!({"service": "web", "instance": "web-3", "address": "10.0.0.9:8080"})
    );
    curl(&["-X", "DELETE", &inst("web-1")]);
    let (kind, data) = watch.next();
    assert_eq!(
        (kind.as_str(), &data["instance"]),
        ("down", &Value::from("web-1"))
    );

    // A blocking query with the current index waits for a change, then answers with it.
    let first = curl(&[&format!("{h}/v1/services/web")]);
    let index = first.header("x-roster-index").unwrap();
    let unchanged = curl(&[&format!("{h}/v1/services/web?index={index}&wait=200ms")]);
    assert_eq!(
        unchanged.header("x-roster-index").unwrap(),
        index,
        "nothing changed"
    );
    let (tx, rx) = mpsc::channel();
    let url = format!("{h}/v1/services/web?index={index}&wait=60s");
    std::thread::spawn(move || tx.send(curl(&[&url])));
    assert!(
        rx.recv_timeout(Duration::from_millis(500)).is_err(),
        "the query waits while nothing changes"
    );
    put(&inst("web-4"), r#"{"address": "10.0.0.10:8080"}"#);
    let answer = rx
        .recv_timeout(Duration::from_secs(15))
        .expect("an answer once web-4 came");
    assert_ne!(answer.header("x-roster-index").unwrap(), index);
    assert!(ids(&answer).contains(&"web-4".to_string()));
}

#[test]
fn bad_http_input_is_refused_clearly_and_the_agent_keeps_serving() {
    let root = tempfile::tempdir().unwrap();
    let (_a, h) = http_agent(&root.path().join("a"), "a", &[]);
    let port: u16 = h.rsplit(':').next().unwrap().parse().unwrap();
    // A head that never ends and a body that never comes, held open meanwhile.
    let mut slow_head = TcpStream::connect(("127.0.0.1", port)).unwrap();
    slow_head
        .write_all(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let mut slow_body = TcpStream::connect(("127.0.0.1", port)).unwrap();
    slow_body
        .write_all(b"PUT /v1/services/web/instances/w HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        .unwrap();
    let inst = format!("{h}/v1/services/web/instances/web-1");
    for (body, code, says) in [
        ("{not json", 400, "not the JSON"),
        // An array would be read as the fields in order ("expected a string"): say what
        // the body should be instead.
        (
            "[1,2]",
            400,
            "the body is an array; this endpoint takes a JSON object",
        ),
        (
            "\"10.0.0.7:80\"",
            400,
            "the body is a string; this endpoint takes a JSON object",
        ),
        (
            r#"{"address": "10.0.0.7:80", "colour": "red"}"#,
            400,
            "unknown field `colour`",
        ),
        (r#"{"meta": {}}"#, 400, "missing field `address`"),
        (r#"{"address": "nowhere"}"#, 400, "nowhere"),
        (
            r#"{"address": "10.0.0.7:80", "ttl": "soon"}"#,
            400,
            "is not a duration",
        ),
        (
            r#"{"address": "10.0.0.7:80", "checks": [{"tcp": "a:1", "http": "http://a/"}]}"#,
            400,
            "exactly one",
        ),
        (
            r#"{"address": "10.0.0.7:80", "checks": [{"exec": "true --quiet"}]}"#,
            400,
            "--enable-exec-checks",
        ),
    ] {
        let r = put(&inst, body);
        assert_eq!(r.error(code), "invalid", "{body}");
        assert!(r.body.contains(says), "{body}: {}", r.body);
    }
    let big = root.path().join("big.json");
    std::fs::write(&big, format!("{{\"address\": \"{}\"}}", "a".repeat(10 << 20))).unwrap();
    let r = curl(&[
        "-X",
        "PUT",
        &inst,
        "--data-binary",
        &format!("@{}", big.display()),
    ]);
    assert_eq!(r.error(413), "invalid");
    let r = curl(&[&format!("{h}/v1/services/web?wait=5s")]);
    assert!(r.body.contains("wait goes with index"), "{}", r.body);
    let long = "a".repeat(300);
    assert_eq!(curl(&[&format!("{h}/v1/services/{long}")]).error(400), "invalid");
    assert_eq!(
        curl(&[&format!("{h}/v1/services/web?status=sleepy")]).error(400),
        "invalid"
    );
    assert_eq!(
        ids(&curl(&[&format!("{h}/v1/services/web")])).len(),
        0,
        "nothing was registered"
    );
    // The slow ones: the head is cut off, the body answered 408, and the agent served all
    // along.
    let mut buf = Vec::new();
    slow_head.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let _ = slow_head.read_to_end(&mut buf);
    assert!(
        !String::from_utf8_lossy(&buf).contains(" 200 "),
        "a head that never ended was not served"
    );
    let mut answer = String::new();
    slow_body.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let _ = slow_body.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert_eq!(curl(&[&format!("{h}/v1/status")]).code, 200);
}

fn token_file(path: &Path, tokens: &[&str]) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, tokens.join("\n") + "\n").unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[test]
fn tokens_are_asked_for_refused_when_wrong_and_rotate_without_a_restart() {
    let root = tempfile::tempdir().unwrap();
    let file = root.path().join("tokens");
    let (old, new) = ("old-token-0123456789", "the-new-token-0123456789abcdef");
    token_file(&file, &["# operators' tokens", old]);
    let (a, h) = http_agent(
        &root.path().join("a"),
        "a",
        &["--http-token-file", &path_str(&file), "--http-require-token"],
    );
    let services = format!("{h}/v1/services");
    let bearer = |t: &str| format!("authorization: Bearer {t}");
    let r = curl(&[&services]);
    assert_eq!(r.error(401), "unauthorized");
    assert_eq!(r.header("www-authenticate").as_deref(), Some("Bearer"));
    assert_eq!(
        curl(&[&services, "-H", &bearer("wrong-token-0123456789")]).error(403),
        "forbidden"
    );
    assert_eq!(curl(&[&services, "-H", &bearer(old)]).code, 200);
    // Rotation: both for a while, then the new one only.
    token_file(&file, &[old, new]);
    eventually("the new token is taken", || {
        curl(&[&services, "-H", &bearer(new)]).code == 200
    });
    assert_eq!(curl(&[&services, "-H", &bearer(old)]).code, 200);
    token_file(&file, &[new]);
    eventually("the old token is refused", || {
        curl(&[&services, "-H", &bearer(old)]).code == 403
    });
    // A broken edit keeps the tokens read before, and says so.
    token_file(&file, &["short"]);
    std::thread::sleep(Duration::from_millis(1_500));
    assert_eq!(curl(&[&services, "-H", &bearer(new)]).code, 200);
    eventually("the log says the file is kept", || {
        a.log().contains("the tokens read before stay in use")
    });
}

#[test]
fn the_agent_refuses_http_settings_it_cannot_honour_in_one_line() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("d");
    let d = path_str(&dir);
    let d = d.as_str();
    let open_file = root.path().join("open-tokens");
    std::fs::write(&open_file, "a-token-of-enough-length\n").unwrap();
    std::fs::set_permissions(&open_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let open = path_str(&open_file);
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy_addr = busy.local_addr().unwrap().to_string();
    for (args, says, code) in [
        (vec!["--http-listen", "0.0.0.0:0"], "--http-token-file", 2),
        (vec!["--http-token-file", &open], "chmod 600", 2),
        (vec!["--http-require-token"], "needs --http-token-file", 2),
        // A port in use is a failure to bind (1), as for --listen.
        (vec!["--http-listen", &busy_addr], "cannot listen for HTTP", 1),
        (
            vec!["--http-listen", "off", "--http-require-token"],
            "drop them",
            2,
        ),
    ] {
        let out = roster(&[&["agent", "--listen", "127.0.0.1:0", "--data-dir", d][..], &args].concat());
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.contains(says) && err.lines().count() == 1, "{args:?}: {err}");
    }
    let agent = Agent::start(&dir, "quiet", &["--http-listen", "off"]);
    let printed: Vec<String> = (0..3)
        .filter_map(|_| agent.stdout.recv_timeout(Duration::from_secs(5)).ok())
        .collect();
    assert!(printed.iter().any(|l| l == "HTTP API off"), "{printed:?}");
}

#[test]
fn metrics_are_in_prometheus_text_and_discovery_lists_the_passing_instances() {
    let root = tempfile::tempdir().unwrap();
    let (a, h) = http_agent(&root.path().join("a"), "a", &[]);
    let (_b, _) = http_agent(&root.path().join("b"), "b", &["--join", &a.url]);
    let inst = |id: &str| format!("{h}/v1/services/web/instances/{id}");
    put(
        &inst("web-1"),
        r#"{"address": "10.0.0.7:8080", "meta": {"zone": "eu-1", "app.version": "2"}}"#,
    );
    put(
        &inst("web-2"),
        r#"{"address": "10.0.0.8:8080", "checks": [{"ttl": "30s"}]}"#,
    );
    put(
        &format!("{h}/v1/services/db/instances/db-1"),
        r#"{"address": "10.0.0.9:5432"}"#,
    );
    eventually("b is connected", || {
        curl(&[&format!("{h}/metrics")])
            .body
            .contains("roster_members{state=\"alive\"} 2")
    });
    let m = curl(&[&format!("{h}/metrics")]);
    assert_eq!(m.code, 200);
    assert!(m
        .header("content-type")
        .unwrap()
        .starts_with("application/openmetrics-text"));
    for line in [
        "roster_instances{status=\"passing\"} 2",
        "roster_instances{status=\"critical\"} 1",
        "roster_services 2",
        "roster_crash_guard 0",
        "# TYPE roster_refusals counter",
        "roster_refusals_total{reason=\"malformed\"} 0",
        "# TYPE roster_save_seconds histogram",
        "# TYPE roster_snapshot_seconds histogram",
    ] {
        assert!(m.body.lines().any(|l| l == line), "{line} in:\n{}", m.body);
    }
    let saves = |body: &str| {
        body.lines()
            .find_map(|l| l.strip_prefix("roster_save_seconds_count "))
            .map(|n| n.parse::<u64>().unwrap())
    };
    assert!(saves(&m.body).is_some(), "{}", m.body);
    eventually("a save was timed", || {
        saves(&curl(&[&format!("{h}/metrics")]).body) >= Some(1)
    });
    assert!(m.body.ends_with("# EOF\n"), "the OpenMetrics end marker");
    // Discovery: one group per passing instance (web-2 waits for its first pass).
    let sd = curl(&[&format!("{h}/v1/sd/prometheus")]).json();
    let targets: Vec<&str> = sd
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["targets"][0].as_str().unwrap())
        .collect();
    assert_eq!(targets, ["10.0.0.9:5432", "10.0.0.7:8080"], "{sd}");
    let web = &sd[1]["labels"];
    assert_eq!(web["__meta_roster_service"], "web");
    assert_eq!(web["__meta_roster_instance"], "web-1");
    assert_eq!(web["__meta_roster_meta_app_version"], "2");
    curl(&["-X", "PUT", &format!("{}/pass", inst("web-2"))]);
    eventually("the pass is counted", || {
        let m = curl(&[&format!("{h}/metrics")]).body;
        m.lines()
            .any(|l| l == "roster_check_results_total{kind=\"ttl\",outcome=\"pass\"} 1")
            && m.lines().any(|l| l == "roster_instances_lapsed_total 0")
            && m.lines().any(|l| l == "roster_changes_grafted_total 0")
    });
    let only_web = curl(&[&format!("{h}/v1/sd/prometheus?service=web")]).json();
    assert_eq!(only_web.as_array().unwrap().len(), 2, "{only_web}");
    assert_eq!(
        curl(&[&format!("{h}/v1/sd/prometheus?job=x")]).error(400),
        "invalid"
    );
}

/// What an HTTP error says to change is a JSON field or a path segment, never a flag of
/// the `roster` CLI, which an HTTP client does not have.
#[test]
fn http_errors_name_json_fields_not_cli_flags() {
    let root = tempfile::tempdir().unwrap();
    let (a, ha) = http_agent(&root.path().join("a"), "a", &["--enable-exec-checks"]);
    let (_b, hb) = http_agent(&root.path().join("b"), "b", &["--join", &a.url]);
    let no_cli_flag = |r: &Reply| {
        for flag in ["--id", "--ttl", "--check-", "--meta", "--from-file"] {
            assert!(!r.body.contains(flag), "{flag} in an HTTP error: {}", r.body);
        }
    };
    let inst = |h: &str, id: &str| format!("{h}/v1/services/web/instances/{id}");
    assert_eq!(put(&inst(&ha, "w1"), r#"{"address": "127.0.0.1:80"}"#).code, 200);
    for (r, code) in [
        (
            put(&inst(&ha, "w2"), r#"{"address": "127.0.0.1:80", "ttl": "25h"}"#),
            400,
        ),
        (
            put(
                &inst(&ha, "w2"),
                r#"{"address": "127.0.0.1:80", "checks": [{"exec": ""}]}"#,
            ),
            400,
        ),
        (curl(&["-X", "PUT", &format!("{}/pass", inst(&ha, "w1"))]), 404),
    ] {
        r.error(code);
        no_cli_flag(&r);
    }
    eventually("b to see w1", || {
        ids(&curl(&[&format!("{hb}/v1/services/web")])).len() == 1
    });
    let r = put(&inst(&hb, "w1"), r#"{"address": "127.0.0.2:80"}"#);
    assert_eq!(r.error(409), "failed");
    assert!(r.body.contains("registered by node a"), "{}", r.body);
    no_cli_flag(&r);
}

/// A CLI given the HTTP API's port is told it reached the HTTP API and which port to give,
/// not that no agent runs there.
#[test]
fn a_cli_pointed_at_the_http_port_is_told_it_reached_the_http_api() {
    let root = tempfile::tempdir().unwrap();
    let (_a, h) = http_agent(&root.path().join("a"), "a", &[]);
    let ws = h.replace("http://", "ws://");
    let out = roster(&["ls", "--agent", &ws]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("HTTP API") && err.contains("--listen"), "{err}");
    assert!(!err.contains("start one with"), "an agent answers there: {err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// A request the server cannot even parse gets the API's JSON error body, as every other
/// error does, not a bare 400; and the agent goes on serving.
#[test]
fn a_garbage_request_gets_the_json_error_body() {
    let root = tempfile::tempdir().unwrap();
    let (_a, h) = http_agent(&root.path().join("a"), "a", &[]);
    let port: u16 = h.rsplit(':').next().unwrap().parse().unwrap();
    for garbage in [
        &b"GARBAGE\r\n\r\n"[..],
        b"GET /v1/status HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
        b"GET /v1/status HTTP/1.1\r\nno colon here\r\n\r\n",
    ] {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(garbage).unwrap();
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        let shown = String::from_utf8_lossy(garbage);
        let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
        assert!(head.starts_with("HTTP/1.1 400 "), "{shown:?}: {answer}");
        assert!(
            head.contains("content-type: application/json"),
            "{shown:?}: {head}"
        );
        let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{shown:?}: {e}: {body:?}"));
        assert_eq!(v["error"]["kind"], "invalid", "{body}");
    }
    assert_eq!(curl(&[&format!("{h}/v1/status")]).code, 200);
}

/// A 404 about an instance says which request lists the service's instances, and names no
/// `roster` command (an HTTP client may have none); the CLI's errors still name the command.
#[test]
fn an_instance_not_found_points_http_clients_at_a_request_and_the_cli_at_a_command() {
    let root = tempfile::tempdir().unwrap();
    let (a, h) = http_agent(&root.path().join("a"), "a", &[]);
    let inst = format!("{h}/v1/services/web/instances/nope");
    for (r, listing) in [
        (
            curl(&["-X", "DELETE", &inst]),
            "; GET /v1/services/web lists its instances",
        ),
        (
            curl(&["-X", "PUT", &format!("{inst}/maintenance")]),
            "; GET /v1/services/web?all lists its instances with their nodes",
        ),
        (
            curl(&[&format!("{h}/v1/explain/web/nope")]),
            "; GET /v1/services/web lists the live ones",
        ),
    ] {
        assert_eq!(r.error(404), "not_found");
        let message = r.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(message.ends_with(listing), "{message}");
        assert!(
            !message.contains("roster "),
            "a CLI command in an HTTP error: {message}"
        );
    }
    for (args, listing) in [
        (
            &["deregister", "web", "nope"][..],
            "; `roster get web` lists them",
        ),
        (
            &["maint", "enable", "web", "nope"],
            "; `roster get web --all` lists them with their nodes",
        ),
        (
            &["explain", "web", "nope"],
            "; `roster get web` lists the live ones",
        ),
    ] {
        let out = a.roster(args);
        assert_eq!(out.status.code(), Some(1));
        let err = text(&out.stderr);
        assert!(err.trim_end().ends_with(listing), "{args:?}: {err}");
        assert_eq!(err.matches("lists").count(), 1, "{args:?}: {err}");
    }
}

#[test]
fn one_instance_is_read_alone_whatever_its_status_and_a_missing_one_is_404() {
    let root = tempfile::tempdir().unwrap();
    let (_a, h) = http_agent(&root.path().join("a"), "a", &[]);
    let web1 = format!("{h}/v1/services/web/instances/web-1");
    put(&web1, r#"{"address": "10.0.0.7:8080", "meta": {"zone": "eu-1"}}"#);
    put(&format!("{web1}/maintenance"), r#"{"reason": "deploying"}"#);
    let r = curl(&[&web1]);
    assert_eq!(r.code, 200, "{}", r.body);
    let one = r.json();
    assert_eq!(
        (&one["instance"], &one["status"], &one["meta"]["zone"]),
        (
            &Value::from("web-1"),
            &Value::from("maintenance"),
            &Value::from("eu-1")
        ),
        "{one}"
    );
    let r = curl(&[&format!("{h}/v1/services/web/instances/web-9")]);
    assert_eq!(r.error(404), "not_found");
    assert!(r.body.contains("?all"), "{}", r.body);
    let r = curl(&[&format!("{h}/v1/services/web/instances/Web%209")]);
    assert_eq!(r.error(400), "invalid");
}

#[test]
fn fields_keep_only_the_named_fields_of_each_instance_and_an_unknown_one_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let (_a, h) = http_agent(&root.path().join("a"), "a", &[]);
    put(
        &format!("{h}/v1/services/web/instances/web-1"),
        r#"{"address": "10.0.0.7:8080", "meta": {"zone": "eu-1"}}"#,
    );
    let r = curl(&[&format!("{h}/v1/services/web?fields=instance,meta")]);
    assert_eq!(r.code, 200, "{}", r.body);
    assert_eq!(
        r.json(),
        serde_json::json!([{"instance": "web-1", "meta": {"zone": "eu-1"}}])
    );
    let full = curl(&[&format!("{h}/v1/services/web")]);
    assert_eq!(
        full.header("x-roster-index"),
        r.header("x-roster-index"),
        "the index is the same"
    );
    let watch = Stream::open(&format!("{h}/v1/services/web?watch&fields=status"));
    let (kind, data) = watch.next();
    assert_eq!(
        (kind.as_str(), data),
        ("up", serde_json::json!({"status": "passing"}))
    );
    let r = curl(&[&format!("{h}/v1/services/web?fields=instance,lease")]);
    assert_eq!(r.error(400), "invalid");
    let said = r.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        said.contains("\"lease\"") && said.contains("lease_expires_at"),
        "{said}"
    );
}

#[test]
fn an_http_watch_resumed_with_last_event_id_gets_what_changed_once_and_nothing_else() {
    let root = tempfile::tempdir().unwrap();
    let (_a, h) = http_agent(&root.path().join("a"), "a", &[]);
    let inst = |id: &str| format!("{h}/v1/services/web/instances/{id}");
    put(&inst("web-1"), r#"{"address": "10.0.0.7:8080"}"#);
    put(&inst("web-2"), r#"{"address": "10.0.0.8:8080"}"#);
    put(&inst("web-4"), r#"{"address": "10.0.0.10:8080"}"#);
    let watch = Stream::open(&format!("{h}/v1/services/web?watch"));
    let mut last = None;
    for want in ["web-1", "web-2", "web-4"] {
        let (kind, data, id) = watch.next_with_id();
        assert_eq!((kind.as_str(), &data["instance"]), ("up", &Value::from(want)));
        last = Some(id.expect("every event has an id"));
    }
    drop(watch);

    // While the client is away: one goes, one changes, one comes; web-4 stays as it was.
    curl(&["-X", "DELETE", &inst("web-1")]);
    put(&inst("web-2"), r#"{"address": "10.0.0.18:8080"}"#);
    put(&inst("web-3"), r#"{"address": "10.0.0.9:8080"}"#);
    let header = format!("Last-Event-ID: {}", last.unwrap());
    let watch = Stream::open_with(&format!("{h}/v1/services/web?watch"), &["-H", &header]);
    let mut seen = Vec::new();
    for _ in 0..3 {
        let (kind, data) = watch.next();
        seen.push(format!("{kind} {}", data["instance"].as_str().unwrap()));
    }
    seen.sort();
    assert_eq!(seen, ["down web-1", "up web-2", "up web-3"]);
    // Nothing else came before the next change: no repeat of web-4. A live `down` says
    // where the instance was.
    curl(&["-X", "DELETE", &inst("web-3")]);
    let (kind, data) = watch.next();
    assert_eq!(kind, "down");
    assert_eq!(
        data,
        serde_json::json!({"service": "web", "instance": "web-3", "address": "10.0.0.9:8080"})
    );

    let bad = curl(&["-H", "Last-Event-ID: 42", &format!("{h}/v1/services/web?watch")]);
    assert_eq!(bad.error(400), "invalid");
    assert!(bad.body.contains("reconnect without it"), "{}", bad.body);
}
