//! Actors own the server's single-owner state; handlers talk to them with messages.

/// The addresses of the running actors.
#[derive(Clone)]
pub struct Actors {}

/// Starts every actor; called once by the app factory.
pub async fn start(
    _config: &crate::config::Config,
    _pool: &deadpool_postgres::Pool,
) -> anyhow::Result<Actors> {
    Ok(Actors {})
}
