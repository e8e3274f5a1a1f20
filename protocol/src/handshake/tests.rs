//! The handshake's unit tests: whole exchanges through the encoding, every refusal, and
//! what a proof binds.

use super::*;

const NOW: u64 = 1_700_000_000_000;

fn cfg(id: u64, cluster: &str, secret: Option<&str>) -> HandshakeConfig {
    HandshakeConfig {
        cluster: cluster.to_string(),
        node: NodeInfo {
            id: ReplicaId(id),
            name: format!("node{id}"),
            url: format!("ws://127.0.0.1:{}", 7000 + id),
            zone: Default::default(),
        },
        secret: secret.map(|s| Secret::new(s).unwrap()),
        max_skew_ms: 5_000,
    }
}

/// Runs a whole exchange through the encoding, as two drivers would. Returns what each
/// side concluded: the client's view of the server and the server's view of the client.
fn run(
    client: &HandshakeConfig,
    server: &HandshakeConfig,
    client_now: u64,
    server_now: u64,
) -> (Result<NodeInfo, HandshakeError>, Result<NodeInfo, HandshakeError>) {
    let wire = |m: &HandshakeMessage| HandshakeMessage::decode(&m.encode()).unwrap();
    let (mut c, hello) = Client::start(client, [1; NONCE_LEN], client_now);
    let mut s = Server::new(server, [2; NONCE_LEN]);
    let challenge = match s.on_hello(wire(&hello), server_now) {
        Ok(m) => m,
        Err(e) => {
            let refusal = e.to_refusal().unwrap();
            return (
                Err(c.on_challenge(wire(&refusal), client_now).unwrap_err()),
                Err(e),
            );
        }
    };
    let (server_info, proof) = match c.on_challenge(wire(&challenge), client_now) {
        Ok(x) => x,
        Err(e) => {
            let refusal = e.to_refusal().unwrap();
            return (Err(e), Err(s.on_proof(wire(&refusal)).unwrap_err()));
        }
    };
    match s.on_proof(wire(&proof)) {
        Ok((client_info, welcome)) => match c.on_outcome(wire(&welcome)) {
            Ok(()) => (Ok(server_info), Ok(client_info)),
            Err(e) => (Err(e), Ok(client_info)),
        },
        Err(e) => {
            let refusal = e.to_refusal().unwrap();
            (Err(c.on_outcome(wire(&refusal)).unwrap_err()), Err(e))
        }
    }
}

const SECRET: &str = "correct horse battery staple";

#[test]
fn the_same_secret_authenticates_both_sides() {
    let (a, b) = (cfg(1, "prod", Some(SECRET)), cfg(2, "prod", Some(SECRET)));
    let (server_seen, client_seen) = run(&a, &b, NOW, NOW);
    assert_eq!(server_seen.unwrap(), b.node);
    assert_eq!(client_seen.unwrap(), a.node);
}

#[test]
fn two_nodes_without_a_secret_shake_hands() {
    let (a, b) = (cfg(1, "dev", None), cfg(2, "dev", None));
    let (s, c) = run(&a, &b, NOW, NOW);
    assert_eq!((s.unwrap().id, c.unwrap().id), (ReplicaId(2), ReplicaId(1)));
}

#[test]
fn a_wrong_secret_is_refused_on_both_sides_and_backs_off_as_auth() {
    let (a, b) = (
        cfg(1, "prod", Some(SECRET)),
        cfg(2, "prod", Some("another secret entirely")),
    );
    // The listener checks the dialer's proof first, so it is the one to find it wrong.
    let (c, s) = run(&a, &b, NOW, NOW);
    let s = s.unwrap_err();
    assert_eq!(s, HandshakeError::BadProof);
    assert_eq!(s.failure(), Failure::Auth);
    let c = c.unwrap_err();
    assert!(
        matches!(
            c,
            HandshakeError::Refused {
                kind: RefusalKind::Secret,
                ..
            }
        ),
        "{c}"
    );
    assert_eq!(c.failure(), Failure::Auth);
    assert!(c.to_string().contains("wrong cluster secret"), "{c}");
}

#[test]
fn a_secret_on_one_side_only_is_refused_by_name() {
    let (with, without) = (cfg(1, "prod", Some(SECRET)), cfg(2, "prod", None));
    let (c, s) = run(&without, &with, NOW, NOW);
    assert_eq!(s.unwrap_err(), HandshakeError::MissingProof);
    assert!(matches!(
        c.unwrap_err(),
        HandshakeError::Refused {
            kind: RefusalKind::Secret,
            ..
        }
    ));
    let (c, s) = run(&with, &without, NOW, NOW);
    assert_eq!(s.unwrap_err(), HandshakeError::UnexpectedProof);
    assert_eq!(c.unwrap_err().kind(), RefusalKind::Secret);
}

#[test]
fn a_forged_or_reflected_proof_is_refused() {
    let (a, b) = (cfg(1, "prod", Some(SECRET)), cfg(2, "prod", Some(SECRET)));
    let (mut c, hello) = Client::start(&a, [1; NONCE_LEN], NOW);
    let mut s = Server::new(&b, [2; NONCE_LEN]);
    let challenge = s.on_hello(hello, NOW).unwrap();
    let (_, proof) = c.on_challenge(challenge, NOW).unwrap();
    let HandshakeMessage::Proof { proof: client_proof } = proof else {
        unreachable!()
    };
    // To the listener: forged and missing proofs.
    let forged = HandshakeMessage::Proof {
        proof: Some([0; PROOF_LEN]),
    };
    assert_eq!(s.on_proof(forged).unwrap_err(), HandshakeError::BadProof);
    assert_eq!(
        s.on_proof(HandshakeMessage::Proof { proof: None }).unwrap_err(),
        HandshakeError::MissingProof
    );
    // To the dialer: its own proof reflected back as the listener's, a forged one, none.
    for (proof, e) in [
        (client_proof, HandshakeError::BadProof),
        (Some([0; PROOF_LEN]), HandshakeError::BadProof),
        (None, HandshakeError::MissingProof),
    ] {
        assert_eq!(c.on_outcome(HandshakeMessage::Welcome { proof }), Err(e));
    }
    // The real one passes.
    let (_, welcome) = s
        .on_proof(HandshakeMessage::Proof { proof: client_proof })
        .unwrap();
    assert_eq!(c.on_outcome(welcome), Ok(()));
}

#[test]
fn a_listener_proves_the_secret_only_to_a_dialer_that_proved_it_first() {
    let (a, b) = (cfg(1, "prod", Some(SECRET)), cfg(2, "prod", Some(SECRET)));
    // A dialer without the secret (an attacker collecting proofs to guess it offline).
    let (_, hello) = Client::start(&a, [1; NONCE_LEN], NOW);
    let HandshakeMessage::Hello(dialer_hello) = hello.clone() else {
        unreachable!()
    };
    let mut s = Server::new(&b, [2; NONCE_LEN]);
    let challenge = s.on_hello(hello, NOW).unwrap();
    let HandshakeMessage::Challenge {
        hello: listener_hello,
        ..
    } = challenge.clone()
    else {
        unreachable!()
    };
    let listener_proof = b.prove(SERVER, &dialer_hello, &listener_hello).unwrap();
    let mut sent = vec![challenge.encode()];
    for attempt in [
        HandshakeMessage::Proof { proof: None },
        HandshakeMessage::Proof {
            proof: Some([7; PROOF_LEN]),
        },
    ] {
        let refusal = s.on_proof(attempt).unwrap_err().to_refusal().unwrap();
        sent.push(refusal.encode());
    }
    for frame in &sent {
        assert!(
            !frame.windows(PROOF_LEN).any(|w| w == listener_proof),
            "the listener sent its proof to a dialer that proved nothing: {frame:?}"
        );
    }
}

#[test]
fn a_wrong_cluster_is_refused_by_name() {
    let (a, b) = (cfg(1, "prod", Some(SECRET)), cfg(2, "staging", Some(SECRET)));
    let (c, s) = run(&a, &b, NOW, NOW);
    let s = s.unwrap_err();
    assert_eq!(
        s,
        HandshakeError::Cluster {
            ours: "staging".into(),
            theirs: "prod".into()
        }
    );
    assert!(s.to_string().contains("\"prod\"") && s.to_string().contains("\"staging\""));
    let c = c.unwrap_err();
    assert_eq!(c.kind(), RefusalKind::Cluster);
    assert!(c.to_string().contains("wrong cluster"), "{c}");
}

#[test]
fn a_wrong_protocol_version_is_refused_by_name() {
    let a = cfg(1, "prod", None);
    let (_, hello) = Client::start(&a, [1; NONCE_LEN], NOW);
    let future = postcard::to_stdvec(&(PROTOCOL_VERSION + 1, hello)).unwrap();
    let e = HandshakeMessage::decode(&future).unwrap_err();
    assert_eq!(
        e,
        HandshakeError::Version {
            ours: PROTOCOL_VERSION,
            theirs: PROTOCOL_VERSION + 1
        }
    );
    assert!(e.to_string().starts_with("wrong protocol version"));
    assert_eq!(e.failure(), Failure::Auth);
    // Even when the rest of the frame is something this build cannot read.
    let mut odd = postcard::to_stdvec(&(PROTOCOL_VERSION + 1)).unwrap();
    odd.extend_from_slice(&[0xff; 9]);
    assert!(matches!(
        HandshakeMessage::decode(&odd),
        Err(HandshakeError::Version { .. })
    ));
}

#[test]
fn a_peer_clock_too_far_ahead_is_refused_and_behind_is_fine() {
    let (a, b) = (cfg(1, "prod", Some(SECRET)), cfg(2, "prod", Some(SECRET)));
    let (c, s) = run(&a, &b, NOW + 5_001, NOW);
    assert_eq!(
        s.unwrap_err(),
        HandshakeError::Skew {
            ahead_ms: 5_001,
            max_ms: 5_000
        }
    );
    let c = c.unwrap_err();
    assert_eq!(c.kind(), RefusalKind::Skew);
    // A clock is set right while the node runs: not the minutes of a wrong secret.
    assert_eq!(c.failure(), Failure::Clock);
    // The server ahead: the client refuses it.
    let (c, _) = run(&a, &b, NOW, NOW + 60_000);
    assert!(matches!(
        c.unwrap_err(),
        HandshakeError::Skew { ahead_ms: 60_000, .. }
    ));
    // Within the allowance either way.
    let (c, s) = run(&a, &b, NOW + 5_000, NOW);
    assert!(c.is_ok() && s.is_ok());
}

#[test]
fn frames_out_of_turn_are_malformed() {
    let a = cfg(1, "prod", None);
    let s = Server::new(&a, [2; NONCE_LEN]);
    assert!(matches!(
        s.on_proof(HandshakeMessage::Proof { proof: None }),
        Err(HandshakeError::Malformed(_))
    ));
    let mut s = Server::new(&a, [2; NONCE_LEN]);
    assert!(matches!(
        s.on_hello(HandshakeMessage::Welcome { proof: None }, NOW),
        Err(HandshakeError::Malformed(_))
    ));
    let (mut c, hello) = Client::start(&a, [1; NONCE_LEN], NOW);
    assert!(matches!(
        c.on_outcome(HandshakeMessage::Welcome { proof: None }),
        Err(HandshakeError::Malformed(_))
    ));
    assert!(matches!(
        c.on_challenge(hello, NOW),
        Err(HandshakeError::Malformed(_))
    ));
}

#[test]
fn garbage_trailing_bytes_and_overlong_fields_are_malformed() {
    for garbage in [
        &[][..],
        &[1][..],
        &[1, 0xff, 0xff, 0xff, 0xff, 0xff][..],
        &[0xff; 64][..],
    ] {
        assert!(HandshakeMessage::decode(garbage).is_err());
    }
    let mut bytes = HandshakeMessage::Welcome { proof: None }.encode();
    bytes.push(0);
    assert!(matches!(
        HandshakeMessage::decode(&bytes),
        Err(HandshakeError::Malformed(_))
    ));
    let mut a = cfg(1, "prod", None);
    a.cluster = "x".repeat(MAX_CLUSTER_LEN + 1);
    let (_, hello) = Client::start(&a, [1; NONCE_LEN], NOW);
    let e = HandshakeMessage::decode(&hello.encode()).unwrap_err();
    assert!(e.to_string().contains("cluster name"), "{e}");
}

#[test]
fn a_short_secret_is_refused_and_a_secret_never_prints() {
    assert_eq!(Secret::new("short"), Err(SecretError::TooShort(5)));
    let s = Secret::new(SECRET).unwrap();
    assert!(!format!("{s:?}").contains("horse"));
}
