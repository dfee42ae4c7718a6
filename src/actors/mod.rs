//! Actors own the server's single-owner state; handlers talk to them with messages.

pub mod export_jobs;

use actix::{Actor, Addr};

use crate::config::{Config, DatabaseConfig};

/// The addresses of the running actors.
#[derive(Clone)]
pub struct Actors {
    pub export_jobs: Addr<export_jobs::ExportJobs>,
}

/// Starts every actor; called once by the app factory.
pub async fn start(config: &Config, _pool: &deadpool_postgres::Pool) -> anyhow::Result<Actors> {
    let export_jobs = export_jobs::ExportJobs::new(config, &connection_string(config)?)?.start();
    Ok(Actors { export_jobs })
}

/// The connection the main pool uses, for actors that need a pool of their own (an embedded
/// cluster is already running by the time actors start).
fn connection_string(config: &Config) -> anyhow::Result<String> {
    Ok(match &config.database {
        DatabaseConfig::External(conn) => conn.clone(),
        DatabaseConfig::Embedded { pg_run_as, pg_bin_dir } => crate::db::embedded::EmbeddedPostgres::new(
            config.data_root.join("postgres"),
            pg_bin_dir.clone(),
            pg_run_as,
        )?
        .connection_string(crate::startup::EMBEDDED_DB_NAME),
    })
}
