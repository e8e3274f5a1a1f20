//! Golden vectors for every postcard format that crosses a process boundary, beside the
//! registry's own (`registry_codec`): peer messages, handshake frames, the client protocol,
//! and an own registration as saved on disk. A changed vector is a format change: bump the
//! version that guards it (`PROTOCOL_VERSION`, the handshake's, `CLIENT_PROTOCOL_VERSION`,
//! or the record's shape with a reader of the old one) and say so in the CHANGELOG.

use roster::api::{self, ClientMessage, InstanceView, MemberView, Request, ServerMessage};
use roster::check::Check;
use roster::store::OwnedRecord;
use roster_registry::{Hlc, ReplicaId, Status};
use roster_transport::handshake::{HandshakeMessage, Hello, RefusalKind};
use roster_transport::message::{ChangeId, Envelope, Message, Tagged};

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn peer_messages_keep_their_encoding() {
    let cases = [
        (Message::Ack { seq: 42 }, PEER_ACK),
        (
            Message::Delta {
                seq: 9,
                delta: vec![1, 2],
            },
            PEER_DELTA,
        ),
        (Message::Goodbye { reason: "bye".into() }, PEER_GOODBYE),
        (
            Message::DigestHash {
                hash: [7; 16],
                state: Some([8; 16]),
            },
            PEER_DIGEST_HASH,
        ),
    ];
    for (message, want) in cases {
        let env = Envelope::stamped(message, Hlc::new(1_700_000_000_000, 3));
        let bytes = env.encode();
        assert_eq!(hex(&bytes), want, "the encoding of {:?} changed", env.message);
        assert_eq!(Envelope::decode(&bytes).unwrap(), env);
    }
}

#[test]
fn tree_messages_keep_their_encoding() {
    let id = ChangeId {
        root: ReplicaId(0x0102),
        at: Hlc::new(1_700_000_000_000, 1),
    };
    let tagged = Tagged { id, hops: 3 };
    let cases = [
        (
            Message::Push {
                seq: Some(9),
                delta: vec![1, 2],
                ids: vec![tagged],
                announced: vec![tagged],
                resend: false,
            },
            PEER_PUSH,
        ),
        (
            Message::IHave {
                seq: Some(9),
                ids: vec![tagged],
            },
            PEER_IHAVE,
        ),
        (Message::Graft { ids: vec![id] }, PEER_GRAFT),
        (
            Message::Prune {
                roots: vec![ReplicaId(0x0102)],
            },
            PEER_PRUNE,
        ),
        (Message::ExchangeOnly, PEER_EXCHANGE_ONLY),
    ];
    let mut changed = Vec::new();
    for (message, want) in cases {
        let env = Envelope::stamped(message, Hlc::new(1_700_000_000_000, 3));
        let bytes = env.encode();
        if hex(&bytes) != want {
            changed.push(format!("{}: {}", env.message.kind(), hex(&bytes)));
        }
        assert_eq!(Envelope::decode(&bytes).unwrap(), env);
    }
    assert!(changed.is_empty(), "encodings changed: {changed:?}");
}

const PEER_PUSH: &str =
    "01838080c0d6fcf3c5010a0109020102018202818080c0d6fcf3c50103018202818080c0d6fcf3c5010300";
const PEER_IHAVE: &str = "000b0109018202818080c0d6fcf3c50103";
const PEER_GRAFT: &str = "000c018202818080c0d6fcf3c501";
const PEER_PRUNE: &str = "000d018202";
const PEER_EXCHANGE_ONLY: &str = "000e";

const PEER_ACK: &str = "00032a";
const PEER_DELTA: &str = "01838080c0d6fcf3c5010109020102";
const PEER_GOODBYE: &str = "000603627965";
const PEER_DIGEST_HASH: &str = "0007070707070707070707070707070707070108080808080808080808080808080808";

#[test]
fn handshake_frames_keep_their_encoding() {
    let hello = Hello {
        cluster: "default".into(),
        id: ReplicaId(0x0102),
        name: "a".into(),
        url: "ws://127.0.0.1:7420".into(),
        nonce: [9; 32],
        clock_ms: 1_700_000_000_000,
    };
    let cases = [
        (HandshakeMessage::Hello(hello), HANDSHAKE_HELLO),
        (HandshakeMessage::Proof { proof: Some([1; 32]) }, HANDSHAKE_PROOF),
        (
            HandshakeMessage::Refused {
                kind: RefusalKind::Cluster,
                reason: "another cluster".into(),
            },
            HANDSHAKE_REFUSED,
        ),
    ];
    for (frame, want) in cases {
        let bytes = frame.encode();
        assert_eq!(hex(&bytes), want, "the encoding of {frame:?} changed");
        assert_eq!(HandshakeMessage::decode(&bytes).unwrap(), frame);
    }
}

const HANDSHAKE_HELLO: &str = "07000764656661756c74820201611377733a2f2f3132372e302e302e313a37343230090909090909090909090909090909090909090909090909090909090909090980d095ffbc31";
const HANDSHAKE_PROOF: &str = "0702010101010101010101010101010101010101010101010101010101010101010101";
const HANDSHAKE_REFUSED: &str = "0704010f616e6f7468657220636c7573746572";

fn instance() -> InstanceView {
    InstanceView {
        service: "web".into(),
        instance: "web-1".into(),
        address: "10.0.0.7:8080".into(),
        meta: vec![("zone".into(), "a".into())],
        status: "passing".into(),
        note: String::new(),
        node: "0000000000000102".into(),
        registered_at_ms: 1_700_000_000_000,
        lease_expires_at_ms: 1_700_000_030_000,
    }
}

#[test]
fn client_messages_keep_their_encoding() {
    let register = ClientMessage::Request(Request::Register {
        service: "web".into(),
        address: "10.0.0.7:8080".into(),
        meta: vec![("zone".into(), "a".into())],
        instance: Some("web-1".into()),
        ttl_ms: Some(30_000),
        checks: vec![Check::tcp("10.0.0.7:8080")],
    });
    let bytes = api::encode(&register);
    assert_eq!(hex(&bytes), CLIENT_REGISTER, "the encoding of a register changed");
    assert_eq!(api::decode::<ClientMessage>(&bytes).unwrap(), register);
    let answer = ServerMessage::Instances(vec![instance()]);
    let bytes = api::encode(&answer);
    assert_eq!(hex(&bytes), CLIENT_INSTANCES, "the encoding of instances changed");
    assert_eq!(api::decode::<ServerMessage>(&bytes).unwrap(), answer);
    let member = MemberView {
        node: "0000000000000102".into(),
        name: "a".into(),
        address: "ws://10.0.0.7:7420".into(),
        zone: Some("eu-1".into()),
        state: "alive".into(),
        last_heard_ms: 1_200,
        lease_left_ms: Some(20_000),
        synced_ms: None,
    };
    let answer = ServerMessage::Members(vec![member]);
    let bytes = api::encode(&answer);
    assert_eq!(hex(&bytes), CLIENT_MEMBERS, "the encoding of members changed");
    assert_eq!(api::decode::<ServerMessage>(&bytes).unwrap(), answer);
}

const CLIENT_MEMBERS: &str =
    "050801103030303030303030303030303031303201611277733a2f2f31302e302e302e373a37343230010465752d3105616c697665b00901a09c0100";

const CLIENT_REGISTER: &str = "050100037765620d31302e302e302e373a3830383001047a6f6e65016101057765622d3101b0ea0101010d31302e302e302e373a38303830904e8827010300";
const CLIENT_INSTANCES: &str = "05060103776562057765622d310d31302e302e302e373a3830383001047a6f6e6501610770617373696e6700103030303030303030303030303031303280d095ffbc31b0ba97ffbc31";

#[test]
fn an_own_registration_keeps_its_encoding_on_disk() {
    let rec = OwnedRecord {
        service: "web".into(),
        instance: "web-1".into(),
        address: "10.0.0.7:8080".into(),
        meta: vec![("zone".into(), "a".into())],
        lease_ttl_ms: 30_000,
        registered_at_ms: 1_700_000_000_000,
        expires_at_ms: None,
        status: Status::passing(),
        maintenance: Some("deploy".into()),
        checks: vec![Check::ttl(std::time::Duration::from_secs(30))],
    };
    let bytes = postcard::to_stdvec(&rec).unwrap();
    assert_eq!(
        hex(&bytes),
        OWNED_RECORD,
        "the encoding of an owned record changed"
    );
    assert_eq!(OwnedRecord::decode(&bytes).unwrap(), rec);
}

const OWNED_RECORD: &str = "03776562057765622d310d31302e302e302e373a3830383001047a6f6e650161b0ea0180d095ffbc3100000001066465706c6f790103b0ea019875010300";

#[test]
fn decoding_arbitrary_handshake_bytes_never_panics() {
    fn prop(mut bytes: Vec<u8>, valid_prefix: bool) -> bool {
        if valid_prefix {
            let mut framed = postcard::to_stdvec(&roster_transport::message::PROTOCOL_VERSION).unwrap();
            framed.append(&mut bytes);
            bytes = framed;
        }
        let _ = HandshakeMessage::decode(&bytes);
        true
    }
    crate::support::check(
        "decoding_arbitrary_handshake_bytes_never_panics",
        2_000,
        prop as fn(Vec<u8>, bool) -> bool,
    );
}
