//! Pure types and rules: no I/O on the network or the database.
pub mod api_version;
pub mod attachment;
pub mod audit;
pub mod bundle;
pub mod export;
pub mod formspec;
pub mod go_import;
pub mod json_text;
pub mod mime;
pub mod page_token;
pub mod problem;
pub mod role;
pub mod scope;
pub mod sync;
pub mod time;
pub mod user;
