//! DNS with a real client: `dig` against agents started with `--dns-listen`.

use std::net::UdpSocket;

use super::*;

/// An agent serving DNS on a free loopback port, and that port.
fn dns_agent(dir: &Path, name: &str, extra: &[&str]) -> (Agent, u16) {
    let agent = Agent::start(dir, name, &[&["--dns-listen", "127.0.0.1:0"], extra].concat());
    let deadline = Instant::now() + Duration::from_secs(10);
    let port = loop {
        let line = agent
            .stdout
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("the agent printed where it serves DNS");
        if let Some(rest) = line.strip_prefix("DNS on 127.0.0.1:") {
            break rest.split_whitespace().next().unwrap().parse().unwrap();
        }
    };
    (agent, port)
}

/// `dig` at an agent: the answer section's records (`+short`), and the status.
fn dig(port: u16, name: &str, kind: &str, extra: &[&str]) -> (Vec<String>, String) {
    dig_section(port, name, kind, extra, "ANSWER")
}

/// As [`dig`], the records of another section (`AUTHORITY`, `ADDITIONAL`).
fn dig_section(port: u16, name: &str, kind: &str, extra: &[&str], section: &str) -> (Vec<String>, String) {
    let out = Command::new("dig")
        .args([
            "@127.0.0.1",
            "-p",
            &port.to_string(),
            name,
            kind,
            "+tries=1",
            "+time=3",
        ])
        .args(extra)
        .output()
        .expect("dig runs (tests/prepare installs bind9-dnsutils)");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "dig {name} {kind}: {text}");
    let status = text
        .lines()
        .find_map(|l| l.split("status: ").nth(1))
        .map(|s| s.split(',').next().unwrap().to_string())
        .unwrap_or_else(|| panic!("no status in {text}"));
    let mut answers = Vec::new();
    let mut in_answer = false;
    for l in text.lines() {
        if l.starts_with(&format!(";; {section} SECTION")) {
            in_answer = true;
        } else if l.is_empty() || l.starts_with(";;") {
            in_answer = false;
        } else if in_answer {
            answers.push(l.split_whitespace().collect::<Vec<_>>().join(" "));
        }
    }
    (answers, status)
}

fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !f() {
        assert!(Instant::now() < deadline, "not within 15 s: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn srv_and_a_answers_follow_a_registration_on_every_agent() {
    let root = tempfile::tempdir().unwrap();
    let (a, pa) = dns_agent(&root.path().join("a"), "a", &[]);
    let (_b, pb) = dns_agent(&root.path().join("b"), "b", &["--join", &a.url]);
    let (_c, pc) = dns_agent(&root.path().join("c"), "c", &["--join", &a.url]);
    assert_eq!(
        dig(pa, "web.service.roster", "A", &[]).1,
        "NXDOMAIN",
        "nothing registered yet"
    );
    let out = a.roster(&["register", "web", "10.0.0.7:8080", "--id", "web-1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = a.roster(&["register", "web", "db.example.com:9000", "--id", "web-2"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for port in [pa, pb, pc] {
        eventually("the A record everywhere", || {
            dig(port, "web.service.roster", "A", &[]).0 == ["web.service.roster. 0 IN A 10.0.0.7"]
        });
        let (srv, status) = dig(port, "web.service.roster", "SRV", &["+tcp"]);
        assert_eq!(status, "NOERROR");
        assert_eq!(
            srv,
            [
                "web.service.roster. 0 IN SRV 1 1 8080 0a000007.addr.roster.",
                "web.service.roster. 0 IN SRV 1 1 9000 db.example.com.",
            ],
            "on the agent at port {port}"
        );
        assert_eq!(
            dig(port, "0a000007.addr.roster", "A", &[]).0,
            ["0a000007.addr.roster. 0 IN A 10.0.0.7"]
        );
    }
    // Out of service: no records, but the name exists. Gone: NXDOMAIN.
    let out = a.roster(&["maint", "enable", "web", "web-1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    eventually("web-1 leaves the answers", || {
        dig(pc, "web.service.roster", "A", &[]).0.is_empty()
    });
    assert_eq!(dig(pc, "web.service.roster", "A", &[]).1, "NOERROR");
    for id in ["web-1", "web-2"] {
        assert!(a.roster(&["deregister", "web", id]).status.success());
    }
    eventually("web is gone", || {
        dig(pb, "web.service.roster", "SRV", &[]).1 == "NXDOMAIN"
    });
    assert_eq!(
        dig(pb, "example.com", "A", &[]).1,
        "REFUSED",
        "not a recursive resolver"
    );
    assert_eq!(dig(pb, "what.roster", "A", &[]).1, "NXDOMAIN");
}

#[test]
fn a_zone_name_answers_with_that_zones_instances_and_every_answer_puts_the_agents_zone_first() {
    let root = tempfile::tempdir().unwrap();
    let (a, pa) = dns_agent(&root.path().join("a"), "a", &["--zone", "eu-1"]);
    let b = Agent::start(&root.path().join("b"), "b", &["--join", &a.url]);
    // a's own instance sorts last by id: only its zone puts it first.
    assert!(a
        .roster(&["register", "web", "10.0.0.7:8080", "--id", "web-z"])
        .status
        .success());
    assert!(b
        .roster(&["register", "web", "10.0.0.8:8080", "--id", "web-b"])
        .status
        .success());
    eventually("both instances on a", || {
        dig(pa, "web.service.roster", "A", &[]).0.len() == 2
    });
    assert_eq!(
        dig(pa, "web.service.roster", "A", &[]).0,
        [
            "web.service.roster. 0 IN A 10.0.0.7",
            "web.service.roster. 0 IN A 10.0.0.8"
        ],
        "a's zone first"
    );
    assert_eq!(
        dig(pa, "eu-1.zone.web.service.roster", "A", &[]).0,
        ["eu-1.zone.web.service.roster. 0 IN A 10.0.0.7"]
    );
    assert_eq!(
        dig(pa, "default.zone.web.service.roster", "A", &[]).0,
        ["default.zone.web.service.roster. 0 IN A 10.0.0.8"],
        "b set no zone: it is in the default zone"
    );
    assert_eq!(dig(pa, "eu-2.zone.web.service.roster", "A", &[]).1, "NXDOMAIN");
}

#[test]
fn the_domain_and_ttl_are_the_operators_and_bad_queries_leave_the_server_serving() {
    let root = tempfile::tempdir().unwrap();
    let (a, port) = dns_agent(
        &root.path().join("a"),
        "a",
        &["--dns-domain", "Svc.Example", "--dns-ttl", "5s"],
    );
    assert!(a
        .roster(&["register", "api", "[2001:db8::9]:443", "--id", "api-1"])
        .status
        .success());
    eventually("the AAAA record", || {
        !dig(port, "api.service.svc.example", "AAAA", &[]).0.is_empty()
    });
    assert_eq!(
        dig(port, "API.service.svc.example", "AAAA", &[]).0,
        ["api.service.svc.example. 5 IN AAAA 2001:db8::9"],
        "names are case-insensitive"
    );
    assert!(
        dig(port, "api.service.svc.example", "A", &[]).0.is_empty(),
        "no IPv4 address"
    );
    // A name of 300 bytes (no encoder makes one: the limit is 255) is answered FORMERR.
    let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for _ in 0..5 {
        q.push(60);
        q.extend([b'a'; 60]);
    }
    q.extend([0, 0, 1, 0, 1]);
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.send_to(&q, ("127.0.0.1", port)).unwrap();
    let mut buf = [0u8; 512];
    let n = s.recv(&mut buf).expect("an answer to a name too long");
    assert!(n >= 12 && buf[..2] == [0x12, 0x34], "the same id");
    assert_eq!(buf[3] & 0x0f, 1, "FORMERR");
    // Garbage: no answer is owed, and the server goes on.
    s.send_to(b"\xff\xfe not dns", ("127.0.0.1", port)).unwrap();
    assert_eq!(dig(port, "api.service.svc.example", "AAAA", &[]).1, "NOERROR");
}

#[test]
fn the_agent_refuses_dns_settings_it_cannot_honour_in_one_line() {
    let root = tempfile::tempdir().unwrap();
    let d = path_str(&root.path().join("d"));
    let busy = UdpSocket::bind("127.0.0.1:0").unwrap();
    let busy_addr = busy.local_addr().unwrap().to_string();
    for (args, says, code) in [
        (
            vec!["--dns-listen", "127.0.0.1:0", "--dns-domain", "a..b"],
            "not a domain name",
            2,
        ),
        (
            vec!["--dns-listen", "127.0.0.1:0", "--dns-ttl", "2h"],
            "over 1h",
            2,
        ),
        // A port in use is a failure to bind (1), as for --listen.
        (vec!["--dns-listen", &busy_addr], "cannot listen for DNS", 1),
    ] {
        let out = roster(&[&["agent", "--listen", "127.0.0.1:0", "--data-dir", &d][..], &args].concat());
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.contains(says) && err.lines().count() == 1, "{args:?}: {err}");
    }
}

#[test]
fn rfc_2782_names_metadata_names_and_an_soa_in_every_negative_answer() {
    let root = tempfile::tempdir().unwrap();
    let (a, port) = dns_agent(&root.path().join("a"), "a", &["--dns-ttl", "5s"]);
    for (id, addr, zone) in [
        ("web-1", "10.0.0.7:8080", "eu-1"),
        ("web-2", "10.0.0.8:8080", "EU-2"),
    ] {
        let meta = format!("zone={zone}");
        assert!(a
            .roster(&["register", "web", addr, "--id", id, "--meta", &meta])
            .status
            .success());
    }
    eventually("both SRV records", || {
        dig(port, "web.service.roster", "SRV", &[]).0.len() == 2
    });
    let (mut srv, status) = dig(port, "_web._tcp.service.roster", "SRV", &[]);
    srv.sort();
    assert_eq!(status, "NOERROR");
    assert_eq!(
        srv,
        [
            "_web._tcp.service.roster. 5 IN SRV 1 1 8080 0a000007.addr.roster.",
            "_web._tcp.service.roster. 5 IN SRV 1 1 8080 0a000008.addr.roster.",
        ]
    );
    assert_eq!(
        dig(port, "eu-1.zone.meta.web.service.roster", "A", &[]).0,
        ["eu-1.zone.meta.web.service.roster. 5 IN A 10.0.0.7"]
    );
    assert_eq!(
        dig(port, "eu-2.zone.meta.web.service.roster", "A", &[]).0,
        ["eu-2.zone.meta.web.service.roster. 5 IN A 10.0.0.8"],
        "values compare without regard to case"
    );
    let soa = "roster. 5 IN SOA ns.roster. hostmaster.roster. 1 3600 600 86400 5";
    for (name, kind, code) in [
        ("eu-3.zone.meta.web.service.roster", "A", "NXDOMAIN"),
        ("nope.service.roster", "A", "NXDOMAIN"),
        ("web._udp.service.roster", "SRV", "NXDOMAIN"),
        ("web.service.roster", "AAAA", "NOERROR"),
    ] {
        let (authority, status) = dig_section(port, name, kind, &[], "AUTHORITY");
        assert_eq!(status, code, "{name} {kind}");
        assert_eq!(authority, [soa], "{name} {kind}: the SOA of the zone");
    }
    assert_eq!(dig(port, "roster", "SOA", &[]).0, [soa]);
    assert!(
        dig_section(port, "web.service.roster", "A", &[], "AUTHORITY")
            .0
            .is_empty(),
        "a positive answer has no SOA"
    );
}
