//! Probes and counters: `GET /status`, the health checks, `/version` and the scrape-time metrics.

use deadpool_postgres::GenericClient;

use crate::db::DbResult;

pub struct Counts {
    pub observations: i64,
    pub attachments: i64,
    pub head: i64,
    pub active_bundle_version: Option<String>,
}

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
pub async fn ping(db: &impl GenericClient) -> DbResult<()> {
    db.batch_execute("SELECT 1").await?;
    Ok(())
}

/// The server's `version()` string and the database name.
pub async fn server_version(db: &impl GenericClient) -> DbResult<(String, String)> {
    let row = db.query_one("SELECT version(), current_database()", &[]).await?;
    Ok((row.get(0), row.get(1)))
}

/// The change head and the active bundle version, shared by every process on this database.
pub async fn head_and_active_bundle(db: &impl GenericClient) -> DbResult<(i64, Option<String>)> {
    let row = db
        .query_one("SELECT (SELECT head FROM change_head), (SELECT version FROM bundle_active)", &[])
        .await?;
    Ok((row.get(0), row.get(1)))
}
