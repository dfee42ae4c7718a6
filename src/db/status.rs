//! Probes and counters: `GET /status`, the health checks, `/version` and the scrape-time metrics.

use deadpool_postgres::GenericClient;

use crate::db::DbResult;

pub struct Counts {
    pub observations: i64,
    pub attachments: i64,
    pub head: i64,
    pub active_bundle_version: Option<String>,
}

#[tracing::instrument(name = "db.status.counts", level = "debug", skip_all)]
pub async fn counts(db: &impl GenericClient) -> DbResult<Counts> {
    // The kept counts (src/db/stats.rs), read in the same statement as the head: counting
    // millions of rows would take seconds.
    let row = db
        .query_one(
            "SELECT (SELECT coalesce(sum(n), 0)::bigint FROM observation_counts),
                    (SELECT n FROM attachment_count),
                    (SELECT head FROM change_head), (SELECT version FROM bundle_active)",
            &[],
        )
        .await?;
    Ok(Counts {
        observations: row.get(0),
        attachments: row.get(1),
        head: row.get(2),
        active_bundle_version: row.get(3),
    })
}

/// A round trip that touches no table: is the database answering at all?
#[tracing::instrument(name = "db.status.ping", level = "debug", skip_all)]
pub async fn ping(db: &impl GenericClient) -> DbResult<()> {
    db.batch_execute("SELECT 1").await?;
    Ok(())
}

/// The server's `version()` string and the database name.
#[tracing::instrument(name = "db.status.server_version", level = "debug", skip_all)]
pub async fn server_version(db: &impl GenericClient) -> DbResult<(String, String)> {
    let row = db.query_one("SELECT version(), current_database()", &[]).await?;
    Ok((row.get(0), row.get(1)))
}

/// What `/metrics` reads from the database when scraped: values shared by every process on it, so
/// right whichever process changed them last.
pub struct ScrapeValues {
    pub head: i64,
    pub active_bundle: Option<String>,
    /// The scope set in force (0: none).
    pub scope_active_version: i64,
    pub scope_preparing: Option<ScopePreparation>,
}

/// The version of the scope set being prepared and how far its scan has come (docs/api.md §20.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScopePreparation {
    pub version: i64,
    pub scanned: i64,
    pub to_scan: i64,
}

#[tracing::instrument(name = "db.status.scrape_values", level = "debug", skip_all)]
pub async fn scrape_values(db: &impl GenericClient) -> DbResult<ScrapeValues> {
    let row = db
        .query_one(
            "SELECT (SELECT head FROM change_head), (SELECT version FROM bundle_active),
                    s.active_version, s.preparing_version, p.scanned, p.to_scan
               FROM scope_state s LEFT JOIN scope_sets p ON p.version = s.preparing_version",
            &[],
        )
        .await?;
    let preparing: Option<i64> = row.get(3);
    Ok(ScrapeValues {
        head: row.get(0),
        active_bundle: row.get(1),
        scope_active_version: row.get(2),
        scope_preparing: preparing.map(|version| ScopePreparation {
            version,
            scanned: row.get::<_, Option<i64>>(4).unwrap_or(0),
            to_scan: row.get::<_, Option<i64>>(5).unwrap_or(0),
        }),
    })
}

/// Where a hot standby's replay stands.
pub struct ReplicaPosition {
    pub replay_lsn: Option<String>,
    /// Zero when replay has applied everything received (an idle primary sends no new
    /// transactions, so the last replayed one's age would otherwise grow without any lag).
    pub lag_seconds: f64,
}

#[tracing::instrument(name = "db.status.replica_position", level = "debug", skip_all)]
pub async fn replica_position(db: &impl GenericClient) -> DbResult<ReplicaPosition> {
    let row = db
        .query_one(
            "SELECT pg_last_wal_replay_lsn()::text,
                    CASE WHEN pg_last_wal_receive_lsn() IS NOT DISTINCT FROM pg_last_wal_replay_lsn() THEN 0
                         ELSE coalesce(extract(epoch FROM now() - pg_last_xact_replay_timestamp()), 0)
                    END::float8",
            &[],
        )
        .await?;
    Ok(ReplicaPosition { replay_lsn: row.get(0), lag_seconds: row.get(1) })
}
