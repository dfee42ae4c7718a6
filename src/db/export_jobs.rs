//! SQL for export jobs (docs/api.md §13.4, §18.2): one row per job, written by the node that runs
//! it, read by whichever node is asked.

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use serde_json::Value;
use tokio_postgres::Row;

use crate::db::{DbError, DbResult};
use crate::domain::export::{ExportFormat, JobState, JobView};

/// A job as created, queued on `node`.
pub struct NewJob {
    pub id: String,
    pub owner: String,
    pub format: ExportFormat,
    pub filters: Value,
    pub node: String,
    pub lease_expires_at: DateTime<Utc>,
    pub file_name: String,
    pub created_at: DateTime<Utc>,
}

#[tracing::instrument(name = "db.export_jobs.insert", level = "debug", skip_all)]
pub async fn insert(db: &impl GenericClient, job: &NewJob) -> DbResult<()> {
    db.execute(
        "INSERT INTO export_jobs (id, owner, format, filters, state, node, lease_expires_at, file_name, created_at)
         VALUES ($1, $2, $3, $4, 'queued', $5, $6, $7, $8)",
        &[
            &job.id,
            &job.owner,
            &job.format.as_str(),
            &job.filters,
            &job.node,
            &job.lease_expires_at,
            &job.file_name,
            &job.created_at,
        ],
    )
    .await?;
    Ok(())
}

/// A stored job: what clients see, and where its file is.
pub struct StoredJob {
    pub view: JobView,
    /// Under DATA_ROOT/exports/.
    pub file_name: String,
}

#[tracing::instrument(name = "db.export_jobs.find", level = "debug", skip_all)]
pub async fn find(db: &impl GenericClient, id: &str) -> DbResult<Option<StoredJob>> {
    let row = db
        .query_opt(
            "SELECT id, owner, format, state, rows_done, rows_total, change_id, error, file_name,
                    created_at, started_at, finished_at, expires_at
             FROM export_jobs WHERE id = $1",
            &[&id],
        )
        .await?;
    row.map(|row| stored_job(&row)).transpose()
}

fn stored_job(row: &Row) -> DbResult<StoredJob> {
    let format: String = row.get("format");
    let state: String = row.get("state");
    let unexpected =
        |what: &str, value: &str| DbError::other(format!("export_jobs: unknown {what} '{value}'"));
    let view = JobView {
        id: row.get("id"),
        owner: row.get("owner"),
        format: ExportFormat::parse(&format).ok_or_else(|| unexpected("format", &format))?,
        state: JobState::parse(&state).ok_or_else(|| unexpected("state", &state))?,
        rows_done: u64::try_from(row.get::<_, i64>("rows_done")).unwrap_or(0),
        rows_total: row.get::<_, Option<i64>>("rows_total").and_then(|n| u64::try_from(n).ok()),
        change_id: row.get("change_id"),
        created_at: row.get("created_at"),
        started_at: row.get("started_at"),
        finished_at: row.get("finished_at"),
        expires_at: row.get("expires_at"),
        error: row.get("error"),
    };
    Ok(StoredJob { view, file_name: row.get("file_name") })
}

/// What the running node reports about one of its jobs, lease included.
#[derive(Debug, Clone, PartialEq)]
pub struct JobReport {
    pub state: JobState,
    pub rows_done: u64,
    pub rows_total: Option<u64>,
    pub change_id: Option<i64>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub expires_at: Option<DateTime<Utc>>,
    pub error: Option<String>,
}

/// Writes `report` and the lease of `node`'s job `id`. False when the job is no longer that node's
/// unfinished job: a sweep failed it (the lease had run out) or it is gone.
#[tracing::instrument(name = "db.export_jobs.report", level = "debug", skip_all)]
pub async fn report(
    db: &impl GenericClient,
    id: &str,
    node: &str,
    report: &JobReport,
    lease_expires_at: DateTime<Utc>,
) -> DbResult<bool> {
    let count = |n: Option<u64>| n.map(|n| i64::try_from(n).unwrap_or(i64::MAX));
    let updated = db
        .execute(
            "UPDATE export_jobs SET state = $3, rows_done = $4, rows_total = $5, change_id = $6,
                    started_at = $7, finished_at = $8, expires_at = $9, error = $10, lease_expires_at = $11
             WHERE id = $1 AND node = $2 AND state IN ('queued', 'running')",
            &[
                &id,
                &node,
                &report.state.as_str(),
                &count(Some(report.rows_done)),
                &count(report.rows_total),
                &report.change_id,
                &report.started_at,
                &report.finished_at,
                &report.expires_at,
                &report.error,
                &lease_expires_at,
            ],
        )
        .await?;
    Ok(updated == 1)
}

/// Fails every unfinished job whose lease ran out before `now`: its node died (or lost the
/// database for longer than a lease). Returns (job, node) of each.
#[tracing::instrument(name = "db.export_jobs.fail_abandoned", level = "debug", skip_all)]
pub async fn fail_abandoned(
    db: &impl GenericClient,
    now: DateTime<Utc>,
    expires_at: DateTime<Utc>,
) -> DbResult<Vec<(String, String)>> {
    let rows = db
        .query(
            "UPDATE export_jobs
             SET state = 'failed', finished_at = $1, expires_at = $2,
                 error = 'The server node running this export (' || node || ') stopped before it finished; \
                          start the export again'
             WHERE state IN ('queued', 'running') AND lease_expires_at < $1
             RETURNING id, node",
            &[&now, &expires_at],
        )
        .await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// Removes the jobs past their expiry; returns their file names, for the caller to delete.
#[tracing::instrument(name = "db.export_jobs.delete_expired", level = "debug", skip_all)]
pub async fn delete_expired(db: &impl GenericClient, now: DateTime<Utc>) -> DbResult<Vec<String>> {
    let rows =
        db.query("DELETE FROM export_jobs WHERE expires_at <= $1 RETURNING file_name", &[&now]).await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}
