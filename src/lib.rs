//! Synkronus-compatible offline-first sync server.
pub mod actors;
pub mod auth;
pub mod cli;
pub mod config;
pub mod db;
pub mod domain;
pub mod error;
#[cfg(test)]
mod fuzz;
pub mod http;
pub mod monitoring;
pub mod schema_check;
pub mod startup;
pub mod state;
pub mod telemetry;
