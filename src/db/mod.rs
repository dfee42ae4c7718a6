//! Database access: the pool, migrations, and one module of SQL per table family.

pub mod attachments;
pub mod audit;
pub mod backup;
pub mod bundles;
pub mod commit;
pub mod drivers;
pub mod embedded;
pub mod error;
pub mod export;
pub mod export_jobs;
pub mod formspecs;
pub mod go_import;
pub mod go_source;
pub mod login_attempts;
pub mod marks;
pub mod presence;
pub mod record_row;
pub mod records;
pub mod replicas;
pub mod scope;
pub mod stats;
pub mod status;
pub mod supervision;
pub mod tls;
pub mod users;

pub use error::{is_connection_error, is_unstorable_text, BoxError, Conflict, DbError, DbResult};

use std::time::Duration;

use deadpool_postgres::{Hook, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};

mod embedded_migrations {
    refinery::embed_migrations!("migrations");
}

/// Validates a `DB_CONNECTION` value (URL or libpq key=value) without connecting.
pub fn parse_connection(conn: &str) -> Result<tokio_postgres::Config, String> {
    conn.parse::<tokio_postgres::Config>().map_err(|e| format!("cannot parse connection string: {e}"))
}

/// Builds a pool whose waits are bounded, so a vanished database yields 503s instead of hangs.
pub fn create_pool(conn: &str, max_size: usize) -> anyhow::Result<Pool> {
    build_pool(conn, max_size, "")
}

/// A pool for the reads every device sync makes, pull pages (`records::pull_page`) and attachment
/// manifests, whose connections plan every prepared statement generically: once per connection,
/// then reused.
///
/// PostgreSQL plans a prepared statement anew for each execution (a "custom" plan, knowing its
/// parameters) until it judges a generic plan no dearer, and for these statements it rarely does:
/// the generic plan's costs assume an unknown `LIMIT` or cursor. They are written so that every
/// plan reads each source along its index from the cursor (see `records::page_sql`,
/// `scope::pull` and `scope::manifest`), and their generic plans run as fast as the custom ones
/// where devices ask most, near the head, so planning was the largest part of a sync with nothing
/// new: at 8.6M records an admin's empty pull took 0.53 ms, 0.26 ms planned generically, and a
/// scoped user's empty attachment manifest 3.7 ms, 0.48 ms (its statement 2.1 ms, 0.12 ms planned
/// generically). Other requests keep PostgreSQL's choice, so these connections are a pool of
/// their own rather than a setting sent and reset around each read.
pub fn create_sync_pool(conn: &str, max_size: usize) -> anyhow::Result<Pool> {
    build_pool(conn, max_size, " -c plan_cache_mode=force_generic_plan")
}

fn build_pool(conn: &str, max_size: usize, extra_options: &str) -> anyhow::Result<Pool> {
    let mut pg_config = parse_connection(conn).map_err(anyhow::Error::msg)?;
    if pg_config.get_connect_timeout().is_none() {
        pg_config.connect_timeout(Duration::from_secs(5));
    }
    // Every query here is short and index-driven; JIT compilation only adds milliseconds to them
    // (10 ms on a 500-record pull page, measured), so it is switched off for our sessions.
    let options = match pg_config.get_options() {
        Some(existing) if !existing.is_empty() => format!("{existing} -c jit=off{extra_options}"),
        _ => format!("-c jit=off{extra_options}"),
    };
    pg_config.options(&options);
    let manager_config = ManagerConfig { recycling_method: RecyclingMethod::Fast };
    // TLS over a Unix socket is pointless (libpq skips it too), and rustls refuses the empty
    // server name tokio-postgres passes for socket paths.
    let unix_only = pg_config.get_hosts().iter().all(|h| matches!(h, tokio_postgres::config::Host::Unix(_)));
    let manager = if unix_only {
        Manager::from_config(pg_config, tokio_postgres::NoTls, manager_config)
    } else {
        Manager::from_config(pg_config, tls::make_connector()?, manager_config)
    };
    let pool = Pool::builder(manager)
        .max_size(max_size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(Duration::from_secs(10)))
        .create_timeout(Some(Duration::from_secs(5)))
        .recycle_timeout(Some(Duration::from_secs(5)))
        .post_create(Hook::sync_fn(|client, _| {
            drivers::record(client);
            Ok(())
        }))
        .build()?;
    Ok(pool)
}

/// Waits for the database to answer: 5 s per attempt, for up to 60 s (docs/api.md §2).
pub async fn wait_until_reachable(pool: &Pool) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let attempt = tokio::time::timeout(Duration::from_secs(5), async {
            let client = pool.get().await?;
            client.simple_query("SELECT 1").await?;
            anyhow::Ok(())
        })
        .await;
        match attempt {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) if tokio::time::Instant::now() >= deadline => {
                return Err(e.context("database unreachable after 60 s"))
            }
            Err(_) if tokio::time::Instant::now() >= deadline => {
                anyhow::bail!("database unreachable after 60 s (connection attempts time out)")
            }
            _ => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// An arbitrary but fixed key: several processes starting at once migrate one after another.
const MIGRATION_LOCK_KEY: i64 = 0x5359_4e4b_0001;

pub async fn migrate(pool: &Pool) -> anyhow::Result<()> {
    migrate_to(pool, None).await
}

/// The migrations this binary carries, as (version, name), oldest first.
pub fn known_migrations() -> Vec<(i64, String)> {
    let runner = embedded_migrations::migrations::runner();
    let mut known: Vec<(i64, String)> =
        runner.get_migrations().iter().map(|m| (i64::from(m.version()), m.name().to_string())).collect();
    known.sort();
    known
}

/// Applies migrations up to `target` (all of them when `None`). A restore migrates to the
/// archive's version first, loads, then migrates the rest, so data migrations run on its rows.
pub async fn migrate_to(pool: &Pool, target: Option<i64>) -> anyhow::Result<()> {
    let mut runner = embedded_migrations::migrations::runner();
    if let Some(version) = target {
        let version =
            version.try_into().map_err(|_| anyhow::anyhow!("schema version {version} out of range"))?;
        runner = runner.set_target(refinery::Target::Version(version));
    }
    let mut client = pool.get().await?;
    client.execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK_KEY]).await?;
    let client_ref: &mut tokio_postgres::Client = &mut client;
    let result = runner.run_async(client_ref).await;
    client.execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK_KEY]).await?;
    result?;
    Ok(())
}
