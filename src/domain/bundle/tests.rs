//! Bundle tests.
