//! The encoding of registry states, deltas and digests: one format version byte, then
//! postcard.
//!
//! postcard is not self-describing, so the version byte is what lets a future build refuse
//! (or translate) an old encoding instead of misreading it. Decoding refuses trailing bytes
//! (postcard's `from_bytes` would silently ignore them) and checks every invariant of the
//! decoded state, so bytes from a peer can never panic the node or corrupt its replica.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::context::CausalContext;
use crate::dotfun::DotFun;
use crate::error::DecodeError;
use crate::state::{legacy, Elided, State, Wire};
use crate::value::Registration;

/// The format version this build writes and reads.
///
/// 3: registrations carry a status and the time they were first registered. 2 (read from
/// disk only): without them, read as passing and first registered when written. 1 (read
/// from disk only): one lease per provider, moved to the node that wrote it.
pub const FORMAT_VERSION: u8 = 3;

/// The oldest format [`decode_state`] still reads.
pub const OLDEST_FORMAT_VERSION: u8 = 1;

pub(crate) fn encode_value<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    // Serializing these types cannot fail: every field has a fixed serde shape and nothing
    // has a length postcard cannot represent.
    let size =
        postcard::experimental::serialized_size(value).expect("postcard failed to size a registry value");
    // Sized first: one allocation, where growing from empty took one per doubling (about
    // six for a delta of one change, on every save and every send).
    let mut out = Vec::with_capacity(1 + size);
    out.push(FORMAT_VERSION);
    postcard::to_extend(value, out).expect("postcard failed to encode a registry value")
}

pub(crate) fn decode_value<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, DecodeError> {
    decode_since(bytes, FORMAT_VERSION)
}

/// Decodes a value whose encoding has not changed since format `oldest`.
pub(crate) fn decode_since<T: DeserializeOwned>(bytes: &[u8], oldest: u8) -> Result<T, DecodeError> {
    let (&version, body) = bytes.split_first().ok_or(DecodeError::Empty)?;
    if !(oldest..=FORMAT_VERSION).contains(&version) {
        return Err(DecodeError::UnsupportedVersion {
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    decode_body(body)
}

/// Decodes the registrations stored under one key, converting format 2.
pub(crate) fn decode_registrations(bytes: &[u8]) -> Result<DotFun<Registration>, DecodeError> {
    match bytes.split_first() {
        Some((&2, body)) => Ok(legacy::upgrade(decode_body(body)?)),
        _ => decode_value(bytes),
    }
}

fn decode_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, DecodeError> {
    let (value, rest) = postcard::take_from_bytes(body).map_err(DecodeError::Malformed)?;
    if !rest.is_empty() {
        return Err(DecodeError::TrailingBytes(rest.len()));
    }
    Ok(value)
}

/// Encodes a state or a delta.
pub fn encode_state(state: &State) -> Vec<u8> {
    encode_value(&state.wire())
}

/// Decodes a state or a delta, checking every invariant. A state of format 1 or 2 (a data
/// directory written by an older build) is converted (see [`FORMAT_VERSION`]).
///
/// # Errors
/// [`DecodeError`] for empty, truncated, extended, wrong-version or invalid input.
pub fn decode_state(bytes: &[u8]) -> Result<State, DecodeError> {
    match bytes.split_first() {
        Some((&1, body)) => return Ok(decode_body::<legacy::WireV1>(body)?.into_state()?),
        Some((&2, body)) => return Ok(decode_body::<legacy::WireV2>(body)?.into_state()?),
        _ => {}
    }
    let w: Wire = decode_value(bytes)?;
    Ok(State::from_parts(
        w.regs,
        w.leases.into_iter().collect(),
        w.ctx,
        w.touched,
    )?)
}

/// Encodes a digest (a causal context).
pub fn encode_context(ctx: &CausalContext) -> Vec<u8> {
    encode_value(ctx)
}

/// Decodes a digest (a causal context).
///
/// # Errors
/// [`DecodeError`] for empty, truncated, extended, wrong-version or invalid input.
pub fn decode_context(bytes: &[u8]) -> Result<CausalContext, DecodeError> {
    // Unchanged since format 2: a data directory of the build before saved its context so.
    let ctx: CausalContext = decode_since(bytes, 2)?;
    ctx.validate()?;
    Ok(ctx)
}

/// Encodes an elided state.
pub fn encode_elided(e: &Elided) -> Vec<u8> {
    encode_value(e)
}

/// Decodes an elided state. Its invariants are checked when it is joined
/// ([`crate::Replica::apply_elided`]), against the receiver's own state.
///
/// # Errors
/// [`DecodeError`] for empty, truncated, extended or wrong-version input.
pub fn decode_elided(bytes: &[u8]) -> Result<Elided, DecodeError> {
    let e: Elided = decode_value(bytes)?;
    e.ctx.validate()?;
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::{decode_state, encode_state};
    use crate::{Endpoint, Hlc, ProviderId, Replica, ReplicaId, ServiceName, State};

    /// A full state with several registrations and the leases of three nodes, joined in
    /// an order unlike the encoded one.
    fn three_nodes() -> State {
        let mut all = Replica::new(ReplicaId(9));
        for (node, provider) in [(0x30, "c"), (0x10, "a"), (0x20, "b")] {
            let mut w = Replica::new(ReplicaId(node));
            for (service, port) in [("web", 80), ("api", 81)] {
                let s = ServiceName::new(service).unwrap();
                let p = ProviderId::new(provider).unwrap();
                let ep = Endpoint::new("10.0.0.1", port).unwrap();
                w.register(s, p, ep, Default::default(), 30_000, Hlc::new(1_000 + node, 0))
                    .unwrap();
            }
            all.apply(w.state().clone(), 1_000);
        }
        all.state().clone()
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn a_state_of_several_nodes_keeps_its_encoding() {
        // Pinned before the maps became persistent: data directories and peers of older
        // builds must read these bytes as before.
        let bytes = encode_state(&three_nodes());
        assert_eq!(hex(&bytes), THREE_NODES_HEX, "the encoding changed");
        assert_eq!(decode_state(&bytes).unwrap(), three_nodes());
    }

    #[test]
    fn a_format_2_state_is_read_as_passing_and_first_registered_when_written() {
        let bytes: Vec<u8> = (0..THREE_NODES_V2_HEX.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&THREE_NODES_V2_HEX[i..i + 2], 16).unwrap())
            .collect();
        let state = decode_state(&bytes).unwrap();
        assert_eq!(state, three_nodes());
        assert!(state.regs.values().all(|f| f
            .iter()
            .all(|(_, r)| r.status == crate::Status::passing() && r.since_ms == r.written.millis())));
    }

    const THREE_NODES_HEX: &str = "03060361706901610110030831302e302e302e3151000000f8078080e01f10010361706901620120030831302e302e302e315100000088088080a02020010361706901630130030831302e302e302e315100000098088080e02030010377656201610110020831302e302e302e3150000000f8078080e01f10010377656201620120020831302e302e302e315000000088088080a02020010377656201630130020831302e302e302e315000000098088080e020300103100110018080e01fb0ea01200120018080a020b0ea01300130018080e020b0ea0103100320033003000000";

    /// The same state in format 2, before registrations carried a status.
    const THREE_NODES_V2_HEX: &str = "02060361706901610110030831302e302e302e3151008080e01f10010361706901620120030831302e302e302e3151008080a02020010361706901630130030831302e302e302e3151008080e02030010377656201610110020831302e302e302e3150008080e01f10010377656201620120020831302e302e302e3150008080a02020010377656201630130020831302e302e302e3150008080e020300103100110018080e01fb0ea01200120018080a020b0ea01300130018080e020b0ea0103100320033003000000";
}
