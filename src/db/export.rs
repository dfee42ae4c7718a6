//! SQL for exports and observation statistics (docs/api.md §13, 17.8). Exports read `records` inside one
//! REPEATABLE READ snapshot through server-side portals, so memory never depends on the row count.

use std::sync::atomic::{AtomicI64, Ordering};

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Portal, Row, Statement, Transaction};

use crate::db::DbResult;
use crate::domain::export::{ExportFilter, ExportRow};

/// `$1` form types (empty = all), `$2` since, `$3` snapshot head, `$4` include deleted; and the
/// viewer's visible set (docs/api.md §20.4), named by the snapshot's setting (see `snapshot_head`).
const FILTER: &str = "(cardinality($1::text[]) = 0 OR form_type = ANY($1::text[])) \
     AND change_id > $2 AND change_id <= $3 AND ($4 OR NOT deleted) AND {VISIBLE}";

/// The export's viewer, set for the snapshot's transaction; empty for an admin's export.
const VIEWER: &str = "current_setting('synkronus.export_viewer', true)";

fn filter_sql() -> String {
    let visible = crate::db::scope::read::visible_sql("records", VIEWER);
    FILTER.replace("{VISIBLE}", &format!("(coalesce({VIEWER}, '') = '' OR {visible})"))
}

/// `data`, `geolocation` and `tags` as their stored text: the writers use it as it is when it is
/// canonical. Read by position in `export_row`.
const ROW_COLUMNS: &str = "id, form_type, form_version, data, deleted, created_at, updated_at, synced_at, \
     geolocation::text, author, device_id, tags::text, change_id";

/// Starts the export's snapshot on `tx` (which must have been opened REPEATABLE READ READ ONLY)
/// and returns its head: every row read later in `tx` is at or below it.
#[tracing::instrument(name = "db.export.snapshot_head", level = "debug", skip_all)]
pub async fn snapshot_head(
    tx: &Transaction<'_>,
    filter: &ExportFilter,
) -> Result<(i64, DateTime<Utc>), tokio_postgres::Error> {
    // An export is background work: its counting scans must not fan out over parallel workers
    // and take every core from the pushes committing meanwhile. Its statements stream plain
    // columns, where JIT compiling gains nothing and cost 90-240 ms a statement at 10M records.
    // Its keyset pages (`TypeRows`) are planned for their own values every time: a
    // generic plan knows neither the form type nor the LIMIT.
    tx.batch_execute(
        "SET LOCAL max_parallel_workers_per_gather = 0; SET LOCAL jit = off;
         SET LOCAL plan_cache_mode = force_custom_plan",
    )
    .await?;
    let viewer = filter.viewer.as_deref().unwrap_or("");
    tx.execute("SELECT set_config('synkronus.export_viewer', $1, true)", &[&viewer]).await?;
    let row = tx.query_one("SELECT head, now() FROM change_head", &[]).await?;
    Ok((row.get(0), row.get(1)))
}

/// The head as of now, for HEAD requests that only need the header.
#[tracing::instrument(name = "db.export.current_head", level = "debug", skip_all)]
pub async fn current_head(db: &impl GenericClient) -> DbResult<i64> {
    Ok(db.query_one("SELECT head FROM change_head", &[]).await?.get(0))
}

fn params<'a>(filter: &'a ExportFilter, head: &'a i64) -> [&'a (dyn ToSql + Sync); 4] {
    [&filter.form_types, &filter.since_change_id, head, &filter.include_deleted]
}

/// The distinct form types the filter selects, in byte order (so entry names are stable).
#[tracing::instrument(name = "db.export.form_types", level = "debug", skip_all)]
pub async fn form_types(
    tx: &Transaction<'_>,
    filter: &ExportFilter,
    head: i64,
) -> Result<Vec<String>, tokio_postgres::Error> {
    let sql = format!(
        "SELECT form_type FROM records WHERE {} GROUP BY form_type ORDER BY form_type COLLATE \"C\"",
        filter_sql()
    );
    let rows = tx.query(&sql, &params(filter, &head)).await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// How many rows the export will write (job progress).
#[tracing::instrument(name = "db.export.count", level = "debug", skip_all)]
pub async fn count(
    tx: &Transaction<'_>,
    filter: &ExportFilter,
    head: i64,
) -> Result<i64, tokio_postgres::Error> {
    let sql = format!("SELECT count(*) FROM records WHERE {}", filter_sql());
    Ok(tx.query_one(&sql, &params(filter, &head)).await?.get(0))
}

/// A portal over the selected rows in change_id order, optionally of one form type.
/// `data_only` selects just `data` as JSON text, for the type-inference pass, in no particular
/// order: what it infers does not depend on the order, and without one PostgreSQL reads the
/// table straight through instead of along the change_id index (a third less time per row when
/// the export covers most of the table). One form type's rows in order come from
/// [`TypeRows`] instead.
#[tracing::instrument(name = "db.export.open_rows", level = "debug", skip_all)]
pub async fn open_rows(
    tx: &Transaction<'_>,
    filter: &ExportFilter,
    head: i64,
    form_type: Option<&str>,
    data_only: bool,
) -> Result<Portal, tokio_postgres::Error> {
    let columns = if data_only { "data" } else { ROW_COLUMNS };
    let one_type = if form_type.is_some() { " AND form_type = $5" } else { "" };
    let order = if data_only { "" } else { " ORDER BY change_id" };
    let sql = format!("SELECT {columns} FROM records WHERE {}{one_type}{order}", filter_sql());
    let stmt = tx.prepare(&sql).await?;
    let [a, b, c, d] = params(filter, &head);
    match form_type {
        Some(ft) => tx.bind(&stmt, &[a, b, c, d, &ft]).await,
        None => tx.bind(&stmt, &[a, b, c, d]).await,
    }
}

/// One form type's rows in change_id order, read in keyset pages along `(form_type, change_id)`
/// rather than through a portal. PostgreSQL plans a portal for all its rows, and for one type of
/// many it chose to walk the whole change_id index and filter: 3.8 s a type at 10M records of 20
/// types, against 0.5 s along the type's index. The row comparison can only be served by that
/// index, and the LIMIT makes reading along it the cheap plan, as for typed pull pages
/// (`records::pull_page`).
pub struct TypeRows<'a> {
    statement: Statement,
    filter: &'a ExportFilter,
    head: i64,
    form_type: &'a str,
    /// The change_id the next page starts after. Atomic only so that `next` can take `&self`
    /// from the reader's `Fn` fetcher; one page is read at a time.
    after: AtomicI64,
}

impl<'a> TypeRows<'a> {
    #[tracing::instrument(name = "db.export.open", level = "debug", skip_all)]
    pub async fn open(
        tx: &Transaction<'_>,
        filter: &'a ExportFilter,
        head: i64,
        form_type: &'a str,
    ) -> Result<TypeRows<'a>, tokio_postgres::Error> {
        // $1 form types, $2 after, $3 snapshot head, $4 include deleted, $5 the form type, $6 limit.
        let statement = tx
            .prepare(&format!(
                "SELECT {ROW_COLUMNS} FROM records
                 WHERE (cardinality($1::text[]) = 0 OR form_type = ANY($1::text[]))
                   AND (form_type, change_id) > ($5, $2) AND (form_type, change_id) <= ($5, $3)
                   AND ($4 OR NOT deleted) AND (coalesce({VIEWER}, '') = '' OR {visible})
                 ORDER BY form_type, change_id LIMIT $6",
                visible = crate::db::scope::read::visible_sql("records", VIEWER)
            ))
            .await?;
        let after = AtomicI64::new(filter.since_change_id);
        Ok(TypeRows { statement, filter, head, form_type, after })
    }

    /// The next page of at most `limit` rows.
    #[tracing::instrument(name = "db.export.next", level = "debug", skip_all)]
    pub async fn next(
        &self,
        tx: &Transaction<'_>,
        limit: i32,
    ) -> Result<Vec<ExportRow>, tokio_postgres::Error> {
        let (f, after, limit) = (self.filter, self.after.load(Ordering::Relaxed), i64::from(limit));
        let params: [&(dyn ToSql + Sync); 6] =
            [&f.form_types, &after, &self.head, &f.include_deleted, &self.form_type, &limit];
        let rows: Vec<ExportRow> = tx.query(&self.statement, &params).await?.iter().map(export_row).collect();
        if let Some(last) = rows.last() {
            self.after.store(last.version, Ordering::Relaxed);
        }
        Ok(rows)
    }
}

/// The next batch of `data` texts from an `open_rows(.., data_only = true)` portal.
#[tracing::instrument(name = "db.export.fetch_data", level = "debug", skip_all)]
pub async fn fetch_data(
    tx: &Transaction<'_>,
    portal: &Portal,
    batch: i32,
) -> Result<Vec<String>, tokio_postgres::Error> {
    Ok(tx.query_portal(portal, batch).await?.iter().map(|r| r.get(0)).collect())
}

/// The next batch of rows from an `open_rows(.., data_only = false)` portal.
#[tracing::instrument(name = "db.export.fetch_rows", level = "debug", skip_all)]
pub async fn fetch_rows(
    tx: &Transaction<'_>,
    portal: &Portal,
    batch: i32,
) -> Result<Vec<ExportRow>, tokio_postgres::Error> {
    Ok(tx.query_portal(portal, batch).await?.iter().map(export_row).collect())
}

fn export_row(row: &Row) -> ExportRow {
    ExportRow {
        observation_id: row.get(0),
        form_type: row.get(1),
        form_version: row.get(2),
        data: row.get(3),
        deleted: row.get(4),
        created_at: row.get(5),
        updated_at: row.get(6),
        synced_at: row.get(7),
        geolocation: row.get(8),
        author: row.get(9),
        device_id: row.get(10),
        tags: row.get(11),
        version: row.get(12),
    }
}
