//! Resuming an event stream: the `id:` of each server-sent event says what the client
//! shows after it, and a client that reconnects with it as `Last-Event-ID` gets only what
//! changed since (the client protocol's `WatchFrom`), from any agent.
//!
//! An id is `r1` and, for each instance shown, `;INSTANCE=FINGERPRINT` (16 hex digits of
//! [`roster::api::fingerprint`]), in id order: instance ids hold neither `;` nor `=`.

use std::collections::BTreeMap;
use std::fmt::Write;

use roster::registry::ProviderId;

use super::error::ApiError;

/// The longest event id the API sends, and the longest `Last-Event-ID` it reads. A stream
/// that shows more (about 300 instances with short ids) sends no new ids: a client that
/// reconnects then resumes from the last one it had, and may see changes again (never
/// fewer).
pub const MAX_EVENT_ID_BYTES: usize = 8 * 1024;
/// What every id starts with; another form of id would start otherwise.
const PREFIX: &str = "r1";
/// The fewest bytes an instance takes in an id: `;`, a one-byte id, `=`, 16 hex digits.
const MIN_ENTRY_BYTES: usize = 19;

/// The id of an event after which the client shows `shown` (instance id to fingerprint);
/// `None` when it would be longer than [`MAX_EVENT_ID_BYTES`].
pub fn event_id(shown: &BTreeMap<String, u64>) -> Option<String> {
    // Each instance takes at least `;I=` and 16 digits: past that many, none is written
    // (a stream of 10,000 instances would otherwise write 8 kB for each of its events).
    if PREFIX.len() + shown.len() * MIN_ENTRY_BYTES > MAX_EVENT_ID_BYTES {
        return None;
    }
    let mut id = String::from(PREFIX);
    for (instance, fingerprint) in shown {
        // Writing to a String cannot fail.
        let _ = write!(id, ";{instance}={fingerprint:016x}");
        if id.len() > MAX_EVENT_ID_BYTES {
            return None;
        }
    }
    Some(id)
}

/// What a client that sends `Last-Event-ID: header` shows.
///
/// # Errors
/// `invalid` when it is not an id this API sends.
pub fn parse(header: &str) -> Result<BTreeMap<String, u64>, ApiError> {
    let refuse = || {
        ApiError::invalid(
            "Last-Event-ID is not an event id this API sends; reconnect without it to watch from the start",
        )
    };
    if header.len() > MAX_EVENT_ID_BYTES {
        return Err(refuse());
    }
    let mut parts = header.split(';');
    if parts.next() != Some(PREFIX) {
        return Err(refuse());
    }
    let mut shown = BTreeMap::new();
    for part in parts {
        let (instance, fingerprint) = part.split_once('=').ok_or_else(refuse)?;
        ProviderId::new(instance).map_err(|_| refuse())?;
        if fingerprint.len() != 16 {
            return Err(refuse());
        }
        let fingerprint = u64::from_str_radix(fingerprint, 16).map_err(|_| refuse())?;
        shown.insert(instance.to_string(), fingerprint);
    }
    Ok(shown)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_id_reads_back_as_what_the_client_shows() {
        let shown = BTreeMap::from([("web-1".to_string(), 7), ("web-2".to_string(), u64::MAX)]);
        let id = event_id(&shown).unwrap();
        assert_eq!(id, "r1;web-1=0000000000000007;web-2=ffffffffffffffff");
        assert_eq!(parse(&id).unwrap(), shown);
        assert_eq!(parse("r1").unwrap(), BTreeMap::new());
    }

    #[test]
    fn ids_the_api_never_sends_are_refused() {
        for bad in [
            "",
            "r2",
            "r1;web-1",
            "r1;web-1=7",
            "r1;Web 1=0000000000000007",
            "r1;w=zzzzzzzzzzzzzzzz",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        assert!(parse(&format!("r1;{}", "a".repeat(MAX_EVENT_ID_BYTES))).is_err());
    }

    #[test]
    fn a_state_too_large_for_an_id_gets_none() {
        let shown: BTreeMap<String, u64> = (0..1000).map(|n| (format!("instance-{n}"), n)).collect();
        assert_eq!(event_id(&shown), None);
    }
}
