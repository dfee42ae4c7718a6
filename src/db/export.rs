//! SQL for exports and observation statistics (docs/api.md §13, 17.8). Exports read `records` inside one
//! REPEATABLE READ snapshot through server-side portals, so memory never depends on the row count.

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use serde_json::Value;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Portal, Row, Transaction};

use crate::db::DbResult;
use crate::domain::export::{ExportFilter, ExportRow};

/// `$1` form types (empty = all), `$2` since, `$3` snapshot head, `$4` include deleted.
const FILTER: &str = "(cardinality($1::text[]) = 0 OR form_type = ANY($1::text[])) \
     AND change_id > $2 AND change_id <= $3 AND ($4 OR NOT deleted)";

/// `data` as its stored text: the writers use it as it is when it is canonical.
const ROW_COLUMNS: &str = "id, form_type, form_version, data, deleted, created_at, updated_at, synced_at, \
     geolocation, author, device_id, tags, change_id";

/// Starts the export's snapshot on `tx` (which must have been opened REPEATABLE READ READ ONLY)
/// and returns its head: every row read later in `tx` is at or below it.
pub async fn snapshot_head(tx: &Transaction<'_>) -> Result<(i64, DateTime<Utc>), tokio_postgres::Error> {
    // An export is background work: its counting scans must not fan out over parallel workers
    // and take every core from the pushes committing meanwhile.
    tx.batch_execute("SET LOCAL max_parallel_workers_per_gather = 0").await?;
    let row = tx.query_one("SELECT head, now() FROM change_head", &[]).await?;
    Ok((row.get(0), row.get(1)))
}

/// The head as of now, for HEAD requests that only need the header.
pub async fn current_head(db: &impl GenericClient) -> DbResult<i64> {
    Ok(db.query_one("SELECT head FROM change_head", &[]).await?.get(0))
}

fn params<'a>(filter: &'a ExportFilter, head: &'a i64) -> [&'a (dyn ToSql + Sync); 4] {
    [&filter.form_types, &filter.since_change_id, head, &filter.include_deleted]
}

/// The distinct form types the filter selects, in byte order (so entry names are stable).
pub async fn form_types(
    tx: &Transaction<'_>,
    filter: &ExportFilter,
    head: i64,
) -> Result<Vec<String>, tokio_postgres::Error> {
    let sql = format!(
        "SELECT form_type FROM records WHERE {FILTER} GROUP BY form_type ORDER BY form_type COLLATE \"C\""
    );
    let rows = tx.query(&sql, &params(filter, &head)).await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// How many rows the export will write (job progress).
pub async fn count(
    tx: &Transaction<'_>,
    filter: &ExportFilter,
    head: i64,
) -> Result<i64, tokio_postgres::Error> {
    let sql = format!("SELECT count(*) FROM records WHERE {FILTER}");
    Ok(tx.query_one(&sql, &params(filter, &head)).await?.get(0))
}

/// A portal over the selected rows in change_id order, optionally of one form type.
/// `data_only` selects just `data` as JSON text, for the type-inference pass.
pub async fn open_rows(
    tx: &Transaction<'_>,
    filter: &ExportFilter,
    head: i64,
    form_type: Option<&str>,
    data_only: bool,
) -> Result<Portal, tokio_postgres::Error> {
    let columns = if data_only { "data" } else { ROW_COLUMNS };
    let one_type = if form_type.is_some() { " AND form_type = $5" } else { "" };
    let sql = format!("SELECT {columns} FROM records WHERE {FILTER}{one_type} ORDER BY change_id");
    let stmt = tx.prepare(&sql).await?;
    let [a, b, c, d] = params(filter, &head);
    match form_type {
        Some(ft) => tx.bind(&stmt, &[a, b, c, d, &ft]).await,
        None => tx.bind(&stmt, &[a, b, c, d]).await,
    }
}

/// The next batch of `data` texts from an `open_rows(.., data_only = true)` portal.
pub async fn fetch_data(
    tx: &Transaction<'_>,
    portal: &Portal,
    batch: i32,
) -> Result<Vec<String>, tokio_postgres::Error> {
    Ok(tx.query_portal(portal, batch).await?.iter().map(|r| r.get(0)).collect())
}

/// The next batch of rows from an `open_rows(.., data_only = false)` portal.
pub async fn fetch_rows(
    tx: &Transaction<'_>,
    portal: &Portal,
    batch: i32,
) -> Result<Vec<ExportRow>, tokio_postgres::Error> {
    Ok(tx.query_portal(portal, batch).await?.iter().map(export_row).collect())
}

fn export_row(row: &Row) -> ExportRow {
    let tags: Option<Value> = row.get("tags");
    ExportRow {
        observation_id: row.get("id"),
        form_type: row.get("form_type"),
        form_version: row.get("form_version"),
        created_at: row.get("created_at"),
        updated_at: row.get("updated_at"),
        deleted: row.get("deleted"),
        version: row.get("change_id"),
        data: row.get("data"),
        synced_at: row.get("synced_at"),
        // A stored JSON null is "no geolocation".
        geolocation: row.get::<_, Option<Value>>("geolocation").filter(|g| !g.is_null()),
        author: row.get("author"),
        device_id: row.get("device_id"),
        tags: tags.and_then(|t| match t {
            Value::Array(items) => Some(
                items
                    .into_iter()
                    .map(|v| match v {
                        Value::String(s) => s,
                        other => other.to_string(),
                    })
                    .collect(),
            ),
            _ => None,
        }),
    }
}
