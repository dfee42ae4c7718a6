//! Actors own the server's single-owner state; handlers talk to them with messages.

pub mod bundle_store;

use actix::Addr;

use bundle_store::BundleStore;

/// The addresses of the running actors.
#[derive(Clone)]
pub struct Actors {
    pub bundles: Addr<BundleStore>,
}

/// Starts every actor; called once by the app factory. `conn` is the database connection
/// string, for actors that need a dedicated connection (LISTEN).
pub async fn start(
    config: &crate::config::Config,
    pool: &deadpool_postgres::Pool,
    conn: &str,
) -> anyhow::Result<Actors> {
    let bundles = BundleStore::start(config, pool, conn).await?;
    Ok(Actors { bundles })
}
