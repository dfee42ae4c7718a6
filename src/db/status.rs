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

/// The change head and the active bundle version, shared by every process on this database.
#[tracing::instrument(name = "db.status.head_and_active_bundle", level = "debug", skip_all)]
pub async fn head_and_active_bundle(db: &impl GenericClient) -> DbResult<(i64, Option<String>)> {
    let row = db
        .query_one("SELECT (SELECT head FROM change_head), (SELECT version FROM bundle_active)", &[])
        .await?;
    Ok((row.get(0), row.get(1)))
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
