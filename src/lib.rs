//! Synkronus-compatible offline-first sync server.
pub mod domain;
