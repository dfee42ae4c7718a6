//! Black-box tests: the real server on a random port against a real PostgreSQL.
mod helpers;

mod export;
mod foundation;
