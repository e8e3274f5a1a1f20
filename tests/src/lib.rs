//! Integration tests live in `integration/`; this crate has no library code.
