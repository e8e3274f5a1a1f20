//! Chunking: how an encoded [`crate::message::Envelope`] larger than one WebSocket frame
//! crosses the wire, and how the receiver puts it back together.
//!
//! After the handshake (whose frames are untouched), every binary WebSocket message a node
//! sends starts with a one-byte tag:
//!
//! | tag    | name    | after the tag                                              |
//! |--------|---------|------------------------------------------------------------|
//! | `0x00` | `WHOLE` | a whole encoded envelope                                   |
//! | `0x01` | `FIRST` | the envelope's total length (`u64`, little-endian), then its first bytes |
//! | `0x02` | `MORE`  | the next bytes of the envelope begun by the last `FIRST`   |
//!
//! An envelope that fits in one frame with its tag goes `WHOLE` (one byte of overhead);
//! a larger one goes as a `FIRST` then `MORE` chunks, each as large as the frame limit
//! allows, and is complete when the bytes received reach the total.
//!
//! Why the total up front rather than a "last chunk" tag: the receiver refuses an envelope
//! over [`super::Limits::max_envelope_bytes`] at its first chunk, holding no more than that;
//! it knows when the envelope is complete without another tag; and chunks that overrun the
//! total, or a new envelope that starts before the last one is complete (a truncated
//! envelope), are told apart and refused by name. WebSocket runs over one ordered,
//! reliable stream, so chunks need no sequence numbers: a receiver holds at most one
//! partial envelope per connection, and anything out of that order is a broken peer.
//!
//! Rate limiting: a continuation chunk rides on the token its `FIRST` paid when it is at
//! least half the receiver's frame limit, or when it completes the envelope; a smaller one
//! pays a token like any frame. So a legitimate large envelope costs one token however
//! many chunks it takes, while a flood of tiny chunks is refused like a flood of tiny
//! frames; and since one envelope's chunks carry at most `max_envelope_bytes`, one token
//! buys a bounded amount of work.

use std::borrow::Cow;

/// A whole envelope follows.
pub(super) const TAG_WHOLE: u8 = 0x00;
/// The total length of an envelope, then its first bytes.
pub(super) const TAG_FIRST: u8 = 0x01;
/// The next bytes of the envelope being received.
pub(super) const TAG_MORE: u8 = 0x02;
/// The bytes of the total length in a `FIRST` chunk.
const TOTAL_LEN: usize = 8;
/// What a `FIRST` chunk carries besides envelope bytes.
const FIRST_OVERHEAD: usize = 1 + TOTAL_LEN;
/// The smallest frame limit a node accepts in its configuration: room for every handshake
/// frame, and for chunks that are mostly payload.
pub(super) const MIN_FRAME: usize = 4 * 1024;

/// Splits an encoded envelope into WebSocket messages of at most `frame` bytes each (tag
/// included). `frame` is at least [`MIN_FRAME`] (the configuration is checked at start);
/// a smaller one is raised so that every chunk carries at least one byte.
pub(super) fn split(envelope: &[u8], frame: usize) -> Split<'_> {
    Split {
        rest: envelope,
        frame: frame.max(FIRST_OVERHEAD + 1),
        started: false,
    }
}

/// The WebSocket messages of one envelope, in order; see [`split`].
#[derive(Debug)]
pub(super) struct Split<'a> {
    rest: &'a [u8],
    frame: usize,
    started: bool,
}

impl Iterator for Split<'_> {
    type Item = Vec<u8>;

    fn next(&mut self) -> Option<Vec<u8>> {
        if !self.started {
            self.started = true;
            let total = self.rest.len();
            if total < self.frame {
                let mut out = Vec::with_capacity(1 + total);
                out.push(TAG_WHOLE);
                out.extend_from_slice(self.rest);
                self.rest = &[];
                return Some(out);
            }
            let (head, rest) = self.rest.split_at(self.frame - FIRST_OVERHEAD);
            let mut out = Vec::with_capacity(self.frame);
            out.push(TAG_FIRST);
            // A usize always fits in a u64 on the platforms Rust supports.
            out.extend_from_slice(&(total as u64).to_le_bytes());
            out.extend_from_slice(head);
            self.rest = rest;
            return Some(out);
        }
        if self.rest.is_empty() {
            return None;
        }
        let (head, rest) = self.rest.split_at(self.rest.len().min(self.frame - 1));
        let mut out = Vec::with_capacity(1 + head.len());
        out.push(TAG_MORE);
        out.extend_from_slice(head);
        self.rest = rest;
        Some(out)
    }
}

/// Why a peer's binary message was refused by the chunk layer. The connection is closed
/// with this reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum ChunkError {
    /// A binary message without even a tag.
    #[error("an empty binary message (no chunk tag)")]
    Empty,
    /// A tag this build does not know.
    #[error("unknown chunk tag {0:#04x}")]
    UnknownTag(u8),
    /// A `FIRST` chunk too short to hold the total length.
    #[error("a first chunk cut short in its length")]
    ShortFirst,
    /// An envelope (whole, or declared by its first chunk) over the limit.
    #[error("a {size}-byte message, over the {max}-byte limit")]
    TooLarge {
        /// The envelope's size.
        size: u64,
        /// `max_envelope_bytes`.
        max: usize,
    },
    /// A `FIRST` chunk that holds all of its envelope (it should have gone whole).
    #[error("a first chunk of {len} bytes holding all of its {total}-byte message")]
    NotChunked {
        /// The bytes the chunk carried.
        len: usize,
        /// The total it declared.
        total: usize,
    },
    /// A `MORE` chunk with no envelope begun.
    #[error("a continuation chunk without a first chunk")]
    NoStart,
    /// A new envelope (`WHOLE` or `FIRST`) before the last one was complete.
    #[error("a new message with the last one incomplete ({got} of {total} bytes)")]
    Incomplete {
        /// The bytes received of the incomplete envelope.
        got: usize,
        /// Its declared total.
        total: usize,
    },
    /// A `MORE` chunk that goes past its envelope's total.
    #[error("a chunk of {len} bytes past the end of its {total}-byte message ({got} received)")]
    Overrun {
        /// The bytes the chunk carried.
        len: usize,
        /// The bytes received before it.
        got: usize,
        /// The declared total.
        total: usize,
    },
}

impl ChunkError {
    /// Whether this is a size refusal (counted as oversize, closed with 1009) rather than
    /// a malformed message.
    pub(super) fn is_oversize(&self) -> bool {
        matches!(self, ChunkError::TooLarge { .. })
    }
}

/// What one binary message gave.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Step<'a> {
    /// A complete envelope's bytes (borrowed from a `WHOLE` message, or reassembled).
    Envelope(Cow<'a, [u8]>),
    /// A chunk was taken; its envelope is not complete yet.
    Partial,
}

/// The envelope being received in chunks.
#[derive(Debug)]
struct Partial {
    total: usize,
    bytes: Vec<u8>,
}

/// Puts chunked envelopes back together, one connection's worth: at most one partial
/// envelope, never more than `max_envelope` bytes.
#[derive(Debug)]
pub(super) struct Reassembler {
    max_envelope: usize,
    free_chunk: usize,
    partial: Option<Partial>,
}

impl Reassembler {
    /// A reassembler refusing envelopes over `max_envelope` bytes; `frame` is this node's
    /// frame limit (continuation chunks of at least half of it ride free, see the module
    /// docs).
    pub(super) fn new(max_envelope: usize, frame: usize) -> Self {
        Self {
            max_envelope,
            free_chunk: (frame / 2).max(1),
            partial: None,
        }
    }

    /// Whether `msg` rides on the rate-limit token its envelope's first chunk paid: a
    /// continuation of the envelope being received that is large or completes it.
    pub(super) fn rides_free(&self, msg: &[u8]) -> bool {
        match (msg.split_first(), &self.partial) {
            (Some((&TAG_MORE, data)), Some(p)) => {
                data.len() >= self.free_chunk || p.bytes.len().saturating_add(data.len()) == p.total
            }
            _ => false,
        }
    }

    /// Whether an envelope is partly received.
    #[cfg(test)]
    fn is_partial(&self) -> bool {
        self.partial.is_some()
    }

    /// Takes one binary message from the peer.
    ///
    /// # Errors
    /// [`ChunkError`] when the message breaks the chunk format or the size limit; the
    /// connection should be closed (the partial envelope, if any, is dropped).
    pub(super) fn push<'a>(&mut self, msg: &'a [u8]) -> Result<Step<'a>, ChunkError> {
        let result = self.take(msg);
        if result.is_err() {
            self.partial = None;
        }
        result
    }

    fn take<'a>(&mut self, msg: &'a [u8]) -> Result<Step<'a>, ChunkError> {
        let (&tag, body) = msg.split_first().ok_or(ChunkError::Empty)?;
        match tag {
            TAG_WHOLE => {
                self.idle()?;
                self.check_size(body.len() as u64)?;
                Ok(Step::Envelope(Cow::Borrowed(body)))
            }
            TAG_FIRST => {
                self.idle()?;
                let (len, data) = body.split_at_checked(TOTAL_LEN).ok_or(ChunkError::ShortFirst)?;
                let mut total = [0u8; TOTAL_LEN];
                total.copy_from_slice(len);
                let total = u64::from_le_bytes(total);
                self.check_size(total)?;
                let total = usize::try_from(total).map_err(|_| ChunkError::TooLarge {
                    size: total,
                    max: self.max_envelope,
                })?;
                if data.len() >= total {
                    return Err(ChunkError::NotChunked {
                        len: data.len(),
                        total,
                    });
                }
                // Memory follows the bytes received (see `MORE`), not the total announced.
                self.partial = Some(Partial {
                    total,
                    bytes: data.to_vec(),
                });
                Ok(Step::Partial)
            }
            TAG_MORE => {
                let p = self.partial.as_mut().ok_or(ChunkError::NoStart)?;
                let got = p.bytes.len();
                if body.len() > p.total.saturating_sub(got) {
                    return Err(ChunkError::Overrun {
                        len: body.len(),
                        got,
                        total: p.total,
                    });
                }
                let needed = got + body.len();
                if needed > p.bytes.capacity() {
                    // Double, but never past the total: at most `max_envelope` bytes held.
                    let target = p.bytes.capacity().saturating_mul(2).max(needed).min(p.total);
                    p.bytes.reserve_exact(target - got);
                }
                p.bytes.extend_from_slice(body);
                if p.bytes.len() < p.total {
                    return Ok(Step::Partial);
                }
                let done = self.partial.take().map(|p| p.bytes).unwrap_or_default();
                Ok(Step::Envelope(Cow::Owned(done)))
            }
            other => Err(ChunkError::UnknownTag(other)),
        }
    }

    fn idle(&self) -> Result<(), ChunkError> {
        match &self.partial {
            Some(p) => Err(ChunkError::Incomplete {
                got: p.bytes.len(),
                total: p.total,
            }),
            None => Ok(()),
        }
    }

    fn check_size(&self, size: u64) -> Result<(), ChunkError> {
        if size > self.max_envelope as u64 {
            return Err(ChunkError::TooLarge {
                size,
                max: self.max_envelope,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FRAME: usize = MIN_FRAME;
    const MAX: usize = 64 * FRAME;

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 % 251) as u8).collect()
    }

    /// Sends `envelope` through `split` and a fresh reassembler; returns the chunks and
    /// what came out.
    fn round_trip(envelope: &[u8], frame: usize) -> (Vec<Vec<u8>>, Vec<u8>) {
        let chunks: Vec<Vec<u8>> = split(envelope, frame).collect();
        let mut r = Reassembler::new(MAX, frame);
        let mut out = None;
        for (i, c) in chunks.iter().enumerate() {
            assert!(c.len() <= frame, "chunk {i} has {} bytes", c.len());
            if let Some(p) = &r.partial {
                assert!(
                    p.bytes.capacity() <= p.total,
                    "more memory than the message needs"
                );
            }
            match r.push(c).unwrap() {
                Step::Envelope(bytes) => {
                    assert_eq!(i, chunks.len() - 1, "complete before the last chunk");
                    out = Some(bytes.into_owned());
                }
                Step::Partial => assert!(i < chunks.len() - 1, "the last chunk left it partial"),
            }
        }
        assert!(!r.is_partial());
        (chunks, out.unwrap())
    }

    #[test]
    fn envelopes_round_trip_at_sizes_around_the_frame_limit() {
        let sizes = [
            0,
            1,
            FRAME - 2,
            FRAME - 1,
            FRAME,
            FRAME + 1,
            FRAME + 8,
            FRAME + 9,
            FRAME + 10,
            2 * FRAME - 10,
            2 * FRAME - 9,
            2 * FRAME - 8,
            2 * FRAME,
            10 * FRAME + 123,
            MAX - 1,
            MAX,
        ];
        for size in sizes {
            let env = pattern(size);
            let (chunks, out) = round_trip(&env, FRAME);
            assert_eq!(out, env, "size {size}");
            let expected = if size < FRAME {
                1
            } else {
                // FIRST carries FRAME - 9, each MORE FRAME - 1.
                1 + (size - (FRAME - 9)).div_ceil(FRAME - 1)
            };
            assert_eq!(chunks.len(), expected, "size {size}");
            let tag = if size < FRAME { TAG_WHOLE } else { TAG_FIRST };
            assert_eq!(chunks[0][0], tag, "size {size}");
            assert!(chunks[1..].iter().all(|c| c[0] == TAG_MORE && c.len() > 1));
        }
    }

    #[test]
    fn a_legitimate_chunked_envelope_pays_one_token() {
        for size in [FRAME, FRAME + 10, 3 * FRAME, 3 * FRAME + 5, MAX] {
            let mut r = Reassembler::new(MAX, FRAME);
            let paid = split(&pattern(size), FRAME)
                .filter(|c| {
                    let free = r.rides_free(c);
                    r.push(c).unwrap();
                    !free
                })
                .count();
            assert_eq!(paid, 1, "size {size}");
        }
        // A whole envelope pays too.
        let r = Reassembler::new(MAX, FRAME);
        assert!(!r.rides_free(&[TAG_WHOLE, 1, 2]));
    }

    #[test]
    fn small_continuation_chunks_pay_a_token_each() {
        let mut r = Reassembler::new(MAX, FRAME);
        let first = first_chunk(1_000, &[0; 10]);
        assert!(!r.rides_free(&first));
        r.push(&first).unwrap();
        let tiny = [TAG_MORE, 7];
        for _ in 0..100 {
            assert!(!r.rides_free(&tiny));
            assert_eq!(r.push(&tiny), Ok(Step::Partial));
        }
        // The chunk that completes it rides free, whatever its size.
        let last = [&[TAG_MORE][..], &[0; 890]].concat();
        assert!(r.rides_free(&last));
        assert!(matches!(r.push(&last), Ok(Step::Envelope(b)) if b.len() == 1_000));
        // No envelope begun: nothing rides free.
        assert!(!r.rides_free(&[TAG_MORE; FRAME]));
    }

    fn first_chunk(total: u64, data: &[u8]) -> Vec<u8> {
        [&[TAG_FIRST][..], &total.to_le_bytes(), data].concat()
    }

    #[test]
    fn over_the_limit_is_refused_at_the_first_chunk_or_whole() {
        let mut r = Reassembler::new(MAX, FRAME);
        let over = MAX as u64 + 1;
        assert_eq!(
            r.push(&first_chunk(over, &[0; 16])),
            Err(ChunkError::TooLarge { size: over, max: MAX })
        );
        assert_eq!(
            r.push(&first_chunk(u64::MAX, &[])),
            Err(ChunkError::TooLarge {
                size: u64::MAX,
                max: MAX
            })
        );
        // Exactly the limit is fine.
        assert_eq!(r.push(&first_chunk(MAX as u64, &[0; 16])), Ok(Step::Partial));
        // A whole envelope over the limit (possible when the limit is below the frame).
        let mut small = Reassembler::new(100, FRAME);
        assert_eq!(
            small.push(&[&[TAG_WHOLE][..], &[0; 101]].concat()),
            Err(ChunkError::TooLarge { size: 101, max: 100 })
        );
        assert!(small.push(&[&[TAG_WHOLE][..], &[0; 100]].concat()).is_ok());
        assert!(ChunkError::TooLarge { size: 1, max: 0 }.is_oversize());
        assert!(!ChunkError::NoStart.is_oversize());
    }

    #[test]
    fn truncated_envelopes_are_refused_when_the_next_one_starts() {
        let env = pattern(3 * FRAME);
        let chunks: Vec<Vec<u8>> = split(&env, FRAME).collect();
        assert_eq!(chunks.len(), 4);
        // The last chunk lost, then a whole message.
        let mut r = Reassembler::new(MAX, FRAME);
        for c in &chunks[..3] {
            assert_eq!(r.push(c), Ok(Step::Partial));
        }
        let got = (FRAME - 9) + 2 * (FRAME - 1);
        assert_eq!(
            r.push(&[TAG_WHOLE, 1]),
            Err(ChunkError::Incomplete {
                got,
                total: 3 * FRAME
            })
        );
        assert!(!r.is_partial(), "an error drops the partial envelope");
        // A new first chunk before the last one ended.
        let mut r = Reassembler::new(MAX, FRAME);
        r.push(&chunks[0]).unwrap();
        assert!(matches!(r.push(&chunks[0]), Err(ChunkError::Incomplete { .. })));
        // A first chunk cut inside its length.
        assert_eq!(r.push(&[TAG_FIRST, 1, 2, 3]), Err(ChunkError::ShortFirst));
        assert_eq!(r.push(&[TAG_FIRST]), Err(ChunkError::ShortFirst));
    }

    #[test]
    fn out_of_order_chunks_are_refused() {
        let env = pattern(3 * FRAME);
        let chunks: Vec<Vec<u8>> = split(&env, FRAME).collect();
        // A continuation first.
        let mut r = Reassembler::new(MAX, FRAME);
        assert_eq!(r.push(&chunks[1]), Err(ChunkError::NoStart));
        // A continuation after its envelope completed has no start.
        let mut r = Reassembler::new(MAX, FRAME);
        for c in &chunks {
            r.push(c).unwrap();
        }
        assert_eq!(r.push(&chunks[3]), Err(ChunkError::NoStart));
        // A repeated continuation runs past the total.
        let mut r = Reassembler::new(MAX, FRAME);
        for c in [&chunks[0], &chunks[1], &chunks[1]] {
            assert_eq!(r.push(c), Ok(Step::Partial));
        }
        assert_eq!(
            r.push(&chunks[2]),
            Err(ChunkError::Overrun {
                len: FRAME - 1,
                got: (FRAME - 9) + 2 * (FRAME - 1),
                total: 3 * FRAME
            })
        );
        // Swapped continuations add up to the total but garble the bytes: the envelope
        // decoder refuses them (a WebSocket cannot reorder them anyway).
        let mut r = Reassembler::new(MAX, FRAME);
        let mut out = None;
        for c in [&chunks[0], &chunks[2], &chunks[1], &chunks[3]] {
            if let Step::Envelope(b) = r.push(c).unwrap() {
                out = Some(b.into_owned());
            }
        }
        assert_ne!(out.unwrap(), env);
        // A first chunk that holds its whole envelope.
        let mut r = Reassembler::new(MAX, FRAME);
        assert_eq!(
            r.push(&first_chunk(3, &[1, 2, 3])),
            Err(ChunkError::NotChunked { len: 3, total: 3 })
        );
        assert_eq!(
            r.push(&first_chunk(0, &[])),
            Err(ChunkError::NotChunked { len: 0, total: 0 })
        );
    }

    #[test]
    fn garbage_is_refused_without_panicking() {
        let mut r = Reassembler::new(MAX, FRAME);
        assert_eq!(r.push(&[]), Err(ChunkError::Empty));
        assert_eq!(r.push(&[0xff; 64]), Err(ChunkError::UnknownTag(0xff)));
        assert_eq!(r.push(&[3]), Err(ChunkError::UnknownTag(3)));
        assert_eq!(ChunkError::UnknownTag(0xff).to_string(), "unknown chunk tag 0xff");
        // Every short message, and a pseudo-random stream of them: errors or steps, never
        // a panic, never more held than the limit.
        for len in 0..12 {
            for first in 0..=u8::MAX {
                let mut msg = vec![first; len];
                if let Some(b) = msg.get_mut(1) {
                    *b = 0x10;
                }
                let _ = Reassembler::new(MAX, FRAME).push(&msg);
            }
        }
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut r = Reassembler::new(MAX, FRAME);
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let len = (seed % 40) as usize;
            let mut msg: Vec<u8> = (0..len).map(|i| (seed >> (i % 8 * 8)) as u8).collect();
            if let Some(t) = msg.first_mut() {
                *t %= 4;
            }
            let _ = r.push(&msg);
            if let Some(p) = &r.partial {
                assert!(p.total <= MAX && p.bytes.len() < p.total && p.bytes.capacity() <= p.total);
            }
        }
    }
}
