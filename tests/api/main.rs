//! Black-box tests: the real server on a random port against a real PostgreSQL.
mod helpers;

mod attachments;
mod auth;
mod bundles;
mod cli;
mod clients2026;
mod conventions;
mod crash;
mod defaults;
mod export;
mod formspecs;
mod health;
mod hostile;
mod metrics;
mod openapi;
mod portal;
mod resilience;
mod sync;
mod users;
