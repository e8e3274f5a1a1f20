//! Rate limits for log lines about the same source: at most one line per key (a peer, an
//! address) per interval, each saying how many were held back since the last.
//!
//! A hostile or broken peer can make the same mistake thousands of times a second; the log
//! must stay readable and the disk must not fill.

use std::collections::HashMap;
use std::hash::Hash;

/// The most keys remembered; past it, keys whose interval has passed are forgotten, and a
/// new key is logged only once there is room.
const MAX_KEYS: usize = 4_096;

/// One log line per key per interval.
#[derive(Debug)]
pub(crate) struct QuietLog<K> {
    every_ms: u64,
    /// For each key: when it was last logged, and how many lines were held back since.
    last: HashMap<K, (u64, u64)>,
}

impl<K: Hash + Eq> QuietLog<K> {
    /// At most one line per key every `every_ms`.
    pub(crate) fn new(every_ms: u64) -> Self {
        Self {
            every_ms,
            last: HashMap::new(),
        }
    }

    /// Whether to log about `key` now: `Some(n)` with the number of lines held back since
    /// the last one, or `None` to stay quiet.
    pub(crate) fn allow(&mut self, key: K, now_ms: u64) -> Option<u64> {
        if let Some((at, held)) = self.last.get_mut(&key) {
            if now_ms < at.saturating_add(self.every_ms) {
                *held += 1;
                return None;
            }
            let n = *held;
            *at = now_ms;
            *held = 0;
            return Some(n);
        }
        if self.last.len() >= MAX_KEYS {
            let every = self.every_ms;
            self.last.retain(|_, (at, _)| now_ms < at.saturating_add(every));
            if self.last.len() >= MAX_KEYS {
                return None;
            }
        }
        self.last.insert(key, (now_ms, 0));
        Some(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_key_per_interval_counting_what_was_held_back() {
        let mut q = QuietLog::new(60_000);
        assert_eq!(q.allow("a", 0), Some(0));
        assert_eq!(q.allow("a", 1), None);
        assert_eq!(q.allow("a", 59_999), None);
        assert_eq!(q.allow("b", 2), Some(0));
        assert_eq!(q.allow("a", 60_000), Some(2));
        assert_eq!(q.allow("a", 60_001), None);
    }
}
