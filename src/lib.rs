//! Synkronus-compatible offline-first sync server.
pub mod actors;
pub mod auth;
pub mod backup;
pub mod cli;
pub mod clock;
pub mod config;
pub mod db;
pub mod domain;
pub mod error;
pub mod export;
pub mod http;
pub mod import;
pub mod memory;
pub mod monitoring;
pub mod schema_check;
pub mod shutdown;
pub mod startup;
pub mod state;
pub mod storage;
pub mod telemetry;
#[cfg(test)]
mod testing;
