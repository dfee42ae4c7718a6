//! Black-box tests: the real server on a random port against a real PostgreSQL.
mod helpers;

mod attachments;
mod bundles;
mod clients2026;
mod formspecs;
mod foundation;
mod sync;
