//! Helpers for the bundle tests.
