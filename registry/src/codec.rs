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
use crate::error::DecodeError;
use crate::state::{Elided, State, Wire};

/// The format version this build writes and reads.
///
/// 2: one lease per node (keyed by node id). 1 (read from disk only): one lease per
/// provider, converted on decode (see [`crate::state::legacy`]).
pub const FORMAT_VERSION: u8 = 2;

/// The oldest format [`decode_state`] still reads.
pub const OLDEST_FORMAT_VERSION: u8 = 1;

fn encode_value<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    let out = vec![FORMAT_VERSION];
    // Serializing these types into a Vec cannot fail: every field has a fixed serde shape
    // and nothing has a length postcard cannot represent.
    match postcard::to_extend(value, out) {
        Ok(v) => v,
        Err(e) => unreachable!("postcard failed to encode a registry value: {e}"),
    }
}

fn decode_value<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, DecodeError> {
    let (&version, body) = bytes.split_first().ok_or(DecodeError::Empty)?;
    if version != FORMAT_VERSION {
        return Err(DecodeError::UnsupportedVersion {
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    decode_body(body)
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

/// Decodes a state or a delta, checking every invariant. A state of format 1 (a data
/// directory written before leases were per node) is converted: see
/// [`crate::state::legacy`].
///
/// # Errors
/// [`DecodeError`] for empty, truncated, extended, wrong-version or invalid input.
pub fn decode_state(bytes: &[u8]) -> Result<State, DecodeError> {
    if let Some((&1, body)) = bytes.split_first() {
        let w: crate::state::legacy::WireV1 = decode_body(body)?;
        return Ok(w.into_state()?);
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
    let ctx: CausalContext = decode_value(bytes)?;
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
