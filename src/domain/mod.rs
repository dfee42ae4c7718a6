//! Pure types and rules: no I/O on the network or the database.
pub mod export;
