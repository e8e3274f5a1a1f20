//! Real nodes over TLS: they converge, refuse plain clients and untrusted certificates, and
//! refuse a peer whose certificate names another node.

use std::time::{SystemTime, UNIX_EPOCH};

use roster_registry::{Replica, ReplicaId};
use roster_transport::driver;
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::client::ClientRequestBuilder;
use tokio_util::sync::CancellationToken;

use crate::transport_loopback::{
    config, eventually, members, register, shows, shutdown_all, start, tls_files, with_tls, within, SECRET,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_nodes_converge_and_refuse_plain_clients_and_untrusted_certificates() {
    let (cluster_tls, cluster_dir) = tls_files("cluster");
    let (stranger_tls, stranger_dir) = tls_files("stranger");
    let a = start(1, with_tls(config("a", Some(SECRET)), &cluster_tls), &[]).await;
    let b = start(2, with_tls(config("b", Some(SECRET)), &cluster_tls), &[&a]).await;
    assert!(a.info().url.starts_with("wss://127.0.0.1:"), "{}", a.info().url);
    eventually("A and B to see each other over TLS", || {
        members(&a) == 2 && members(&b) == 2
    })
    .await;
    register(&b, "web", "web-tls", 443).await;
    eventually("the registration to reach A over TLS", || {
        shows(&a, "web", "web-tls")
    })
    .await;

    // A client without TLS gets nowhere.
    let tcp = TcpStream::connect(a.local_addr()).await.unwrap();
    let plain = format!("ws://{}", a.local_addr());
    let request = ClientRequestBuilder::new(plain.parse().unwrap()).with_sub_protocol("roster.v1");
    assert!(within(
        "a plain client to be refused",
        tokio_tungstenite::client_async(request, tcp)
    )
    .await
    .is_err());

    // A node whose certificate A does not trust, and which does not trust A's, cannot join
    // even with the right secret.
    let c = start(3, with_tls(config("c", Some(SECRET)), &stranger_tls), &[&a]).await;
    eventually("the stranger to refuse A's certificate", || {
        let d = c.counters().driver;
        d.handshakes_refused >= 1 && d.dial_failures >= 1
    })
    .await;
    assert_eq!((members(&a), members(&c)), (2, 1));

    // Files that cannot be read stop the start, naming the file.
    let mut missing = cluster_tls.clone();
    missing.key_pem = cluster_dir.join("absent.pem");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let e = driver::start(
        listener,
        with_tls(config("d", Some(SECRET)), &missing),
        Replica::new(ReplicaId(4)),
        vec![],
        CancellationToken::new(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("absent.pem"), "{e}");

    shutdown_all(&[&a, &b, &c]).await;
    std::fs::remove_dir_all(cluster_dir).unwrap();
    std::fs::remove_dir_all(stranger_dir).unwrap();
}

/// A cluster CA in a fresh directory, and a function that issues a certificate for
/// 127.0.0.1 carrying the extra DNS names given, as a [`driver::TlsConfig`].
fn cluster_ca(tag: &str) -> (impl Fn(&str, &[String]) -> driver::TlsConfig, std::path::PathBuf) {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    let dir = std::env::temp_dir().join(format!("roster-ca-{}-{nanos}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_pem = dir.join("ca.pem");
    std::fs::write(&ca_pem, params.self_signed(&key).unwrap().pem()).unwrap();
    let issuer = rcgen::Issuer::new(params, key);
    let out = dir.clone();
    let issue = move |file: &str, names: &[String]| {
        let key = rcgen::KeyPair::generate().unwrap();
        let all = [&["127.0.0.1".to_string()][..], names].concat();
        let cert = rcgen::CertificateParams::new(all)
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        let (cert_pem, key_pem) = (out.join(format!("{file}.pem")), out.join(format!("{file}.key")));
        std::fs::write(&cert_pem, cert.pem()).unwrap();
        std::fs::write(&key_pem, key.serialize_pem()).unwrap();
        driver::TlsConfig {
            cert_pem,
            key_pem,
            ca_pem: ca_pem.clone(),
        }
    };
    (issue, dir)
}

#[tokio::test]
async fn a_peer_whose_certificate_names_another_node_is_refused_at_the_handshake() {
    let (issue, dir) = cluster_ca("names");
    let node = |id: u64| format!("node-{}", ReplicaId(id));
    let a = start(
        1,
        with_tls(config("a", Some(SECRET)), &issue("a", &[node(1)])),
        &[],
    )
    .await;
    // B holds a certificate of the cluster CA, but one that names node 3: it may not speak
    // as node 2.
    let b = start(
        2,
        with_tls(config("b", Some(SECRET)), &issue("b", &[node(3)])),
        &[&a],
    )
    .await;
    eventually("A to refuse B's handshake", || {
        a.counters().driver.handshakes_refused >= 1
    })
    .await;
    // C's certificate names C: it joins, so the refusal was about the name only.
    let c = start(
        3,
        with_tls(config("c", Some(SECRET)), &issue("c", &[node(3)])),
        &[&a],
    )
    .await;
    eventually("A and C to see each other", || {
        members(&a) == 2 && members(&c) == 2
    })
    .await;
    assert_eq!(members(&b), 1, "B joined as node 2 with a certificate of node 3");
    assert_eq!(members(&a), 2, "A let B in");
    shutdown_all(&[&a, &b, &c]).await;
    std::fs::remove_dir_all(dir).unwrap();
}
