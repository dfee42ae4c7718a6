//! Black-box tests: the real server on a random port against a real PostgreSQL.
// All of this crate is test code, where a failed expectation should stop the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod helpers;

mod attachments;
mod audit;
mod auth;
mod backup;
mod bundles;
mod cli;
mod clients2026;
mod cluster;
mod commit_ahead;
mod compress;
mod conventions;
mod crash;
mod defaults;
mod export;
mod formspecs;
mod goimport;
mod health;
mod hostile;
mod membudget;
mod metrics;
mod openapi;
mod portal;
mod pull_stream;
mod replica;
mod resilience;
mod scope_model;
mod scopes;
mod shutdown;
mod stats;
mod storage;
mod sync;
mod telemetry;
mod users;
