//! The handshake (being written).
