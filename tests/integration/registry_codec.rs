//! The encoding: states, deltas and digests round-trip; golden vectors pin the format;
//! truncated, extended, wrong-version and random bytes are refused with a typed error.

use quickcheck::TestResult;
use roster_registry::codec::{self, FORMAT_VERSION};
use roster_registry::{DecodeError, Endpoint, Hlc, ProviderId, Replica, ReplicaId, ServiceName, State};

use crate::support::{check, Rules, Schedule, Sim};

const CASES: u64 = 2_000;

/// The one-registration delta the golden vector pins: `web` offered by `web-1` at
/// 10.0.0.7:8080 with two metadata pairs, written by replica 0x0102 at a fixed time.
fn golden_delta() -> State {
    let mut r = Replica::new(ReplicaId(0x0102));
    let meta = [
        ("zone".to_string(), "a".to_string()),
        ("version".to_string(), "1.4".to_string()),
    ]
    .into();
    r.register(
        ServiceName::new("web").unwrap(),
        ProviderId::new("web-1").unwrap(),
        Endpoint::parse("10.0.0.7:8080").unwrap(),
        meta,
        30_000,
        Hlc::new(1_700_000_000_000, 0),
    )
    .unwrap()
    .delta
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn golden_vector_pins_the_encoding_of_a_registration_delta() {
    let bytes = codec::encode_state(&golden_delta());
    // Changing this vector is a wire-format change: bump FORMAT_VERSION and say so in the
    // CHANGELOG.
    assert_eq!(hex(&bytes), GOLDEN_DELTA_HEX, "the encoding changed");
    assert_eq!(codec::decode_state(&bytes).unwrap(), golden_delta());
}

const GOLDEN_DELTA_HEX: &str = "030103776562057765622d31018202020831302e302e302e37903f020776657273696f6e03312e34047a6f6e650161000080d095ffbc31808080c0d6fcf3c50182020101820201820201808080c0d6fcf3c501b0ea01018202020000010000";

/// The leave of the golden delta's node a second later: its registration and lease
/// removed, its farewell (a lease of TTL 0: protocol version 6) written.
fn golden_leave() -> State {
    let mut r = Replica::new(ReplicaId(0x0102));
    r.apply(golden_delta(), 1_700_000_000_000);
    r.deregister_all(Hlc::new(1_700_000_001_000, 0)).delta
}

#[test]
fn golden_vector_pins_the_encoding_of_a_leave() {
    let bytes = codec::encode_state(&golden_leave());
    assert_eq!(hex(&bytes), GOLDEN_LEAVE_HEX, "the encoding changed");
    let decoded = codec::decode_state(&bytes).unwrap();
    assert_eq!(decoded, golden_leave());
    let mut peer = Replica::new(ReplicaId(7));
    peer.apply(golden_delta(), 1_700_000_000_500);
    peer.apply(decoded, 1_700_000_001_000);
    assert!(peer.lease_of(ReplicaId(0x0102)).is_some_and(|l| l.is_farewell()));
}

const GOLDEN_LEAVE_HEX: &str = "0300018202018202038080a0dfd6fcf3c50100018202030000010103776562057765622d3100";

/// The same delta in format 2, before registrations carried a status and the time they
/// were first registered.
const GOLDEN_DELTA_V2_HEX: &str = "020103776562057765622d31018202020831302e302e302e37903f020776657273696f6e03312e34047a6f6e650161808080c0d6fcf3c50182020101820201820201808080c0d6fcf3c501b0ea01018202020000010000";

#[test]
fn a_format_2_state_is_read_as_passing_and_registered_when_it_was_written() {
    let state = codec::decode_state(&unhex(GOLDEN_DELTA_V2_HEX)).unwrap();
    assert_eq!(state, golden_delta());
    // It keeps the keys it names, as format 3 would.
    assert!(state.is_delta());
}

fn unhex(h: &str) -> Vec<u8> {
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
        .collect()
}

/// The same delta in format 1, when each provider had a lease of its own (`web-1`'s).
const GOLDEN_DELTA_V1_HEX: &str = "010103776562057765622d31018202020831302e302e302e37903f020776657273696f6e03312e34047a6f6e650161808080c0d6fcf3c50182020101057765622d3101820201808080c0d6fcf3c501b0ea01018202020000010000";

#[test]
fn a_format_1_state_is_read_with_each_lease_moved_to_the_node_that_wrote_it() {
    let bytes: Vec<u8> = (0..GOLDEN_DELTA_V1_HEX.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&GOLDEN_DELTA_V1_HEX[i..i + 2], 16).unwrap())
        .collect();
    let state = codec::decode_state(&bytes).unwrap();
    assert_eq!(state, golden_delta());
    // It is read as a full state (its key hints named providers' leases).
    assert!(!state.is_delta());
}

#[test]
fn golden_vector_pins_the_encoding_of_a_digest() {
    let bytes = codec::encode_context(golden_delta().context());
    assert_eq!(hex(&bytes), GOLDEN_DIGEST_HEX, "the encoding changed");
}

const GOLDEN_DIGEST_HEX: &str = "03018202020000";

#[test]
fn a_digest_saved_in_format_2_is_read_as_it_was() {
    let bytes = unhex(&GOLDEN_DIGEST_HEX.replacen("03", "02", 1));
    assert_eq!(codec::decode_context(&bytes).unwrap(), *golden_delta().context());
}

#[test]
fn states_deltas_digests_and_elided_states_round_trip() {
    check(
        "encoding_round_trips",
        CASES,
        (|s: Schedule| {
            let sim = Sim::run(Rules::default(), &s);
            let st = sim.replicas[0].state();
            let ok_state = codec::decode_state(&codec::encode_state(st)).as_ref() == Ok(st);
            let ok_deltas = sim
                .minted
                .iter()
                .all(|d| codec::decode_state(&codec::encode_state(d)).as_ref() == Ok(d));
            let ok_ctx =
                codec::decode_context(&codec::encode_context(st.context())).as_ref() == Ok(st.context());
            let e = sim.replicas[0].elide_for(sim.replicas[1].context());
            let ok_elided = codec::decode_elided(&codec::encode_elided(&e)).as_ref() == Ok(&e);
            ok_state && ok_deltas && ok_ctx && ok_elided
        }) as fn(Schedule) -> bool,
    );
}

#[test]
fn truncated_encodings_are_refused() {
    check(
        "truncated_encodings_are_refused",
        300,
        (|s: Schedule| {
            let sim = Sim::run(Rules::default(), &s);
            let bytes = codec::encode_state(sim.replicas[0].state());
            // Every proper prefix is refused, never misread as a smaller state.
            let all_refused = (0..bytes.len()).all(|n| codec::decode_state(&bytes[..n]).is_err());
            TestResult::from_bool(all_refused)
        }) as fn(Schedule) -> TestResult,
    );
}

#[test]
fn extended_encodings_are_refused_with_the_count_of_extra_bytes() {
    let mut bytes = codec::encode_state(&golden_delta());
    bytes.extend_from_slice(&[0, 1, 2]);
    assert_eq!(codec::decode_state(&bytes), Err(DecodeError::TrailingBytes(3)));
}

#[test]
fn another_format_version_is_refused_by_name() {
    let mut bytes = codec::encode_state(&golden_delta());
    bytes[0] = FORMAT_VERSION + 1;
    let err = codec::decode_state(&bytes).unwrap_err();
    assert!(matches!(err, DecodeError::UnsupportedVersion { found, .. } if found == FORMAT_VERSION + 1));
    assert!(err.to_string().contains("upgrade"), "{err}");
    assert_eq!(codec::decode_state(&[]), Err(DecodeError::Empty));
}

#[test]
fn random_bytes_never_panic_and_never_decode_into_an_invalid_state() {
    check(
        "random_bytes_are_refused",
        20_000,
        (|body: Vec<u8>| {
            let mut bytes = vec![FORMAT_VERSION];
            bytes.extend(body);
            // Either refused, or a state that passes every invariant and re-encodes to itself.
            match codec::decode_state(&bytes) {
                Err(_) => true,
                Ok(s) => codec::encode_state(&s) == bytes,
            }
        }) as fn(Vec<u8>) -> bool,
    );
}

#[test]
fn mutated_encodings_never_panic() {
    check(
        "mutated_encodings_never_panic",
        5_000,
        (|s: Schedule, at: usize, byte: u8| {
            let sim = Sim::run(Rules::default(), &s);
            let mut bytes = codec::encode_state(sim.replicas[0].state());
            let i = at % bytes.len();
            bytes[i] = byte;
            let _ = codec::decode_state(&bytes);
            let _ = codec::decode_elided(&bytes);
            let _ = codec::decode_context(&bytes);
            true
        }) as fn(Schedule, usize, u8) -> bool,
    );
}

#[test]
fn a_store_dot_outside_the_context_is_refused() {
    // The golden delta with its context swapped for an empty one: its dots are then
    // stored without having been seen, which no replica can reach.
    let valid = hex(&codec::encode_state(&golden_delta()));
    let ctx = &hex(&codec::encode_context(golden_delta().context()))[2..];
    let empty = &hex(&codec::encode_context(&roster_registry::CausalContext::new()))[2..];
    assert_eq!(valid.matches(ctx).count(), 1);
    let forged = valid.replace(ctx, empty);
    let bytes: Vec<u8> = (0..forged.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&forged[i..i + 2], 16).unwrap())
        .collect();
    let err = codec::decode_state(&bytes).unwrap_err();
    assert!(matches!(err, DecodeError::Invalid(_)), "{err}");
}
