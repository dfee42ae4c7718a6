//! SQL for attachment metadata.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use tokio_postgres::Row;

use crate::db::DbResult;

#[derive(Debug, Clone)]
pub struct AttachmentRow {
    pub id: String,
    pub sha256: String,
    pub size: i64,
    pub content_type: String,
    pub uploaded_by: String,
    pub client_id: Option<String>,
    pub created_at: DateTime<Utc>,
    pub change_id: i64,
    /// A tombstone (docs/api.md §19.2): the attachment was deleted at `change_id`; only `id`,
    /// `client_id`, `created_at` (the deletion time) and `change_id` mean anything then.
    pub deleted: bool,
}

/// The attachment files' lock for every node sharing the folder (docs/deploy.md): an upload takes
/// it shared from its first look at the table until its row is committed, a repository reset
/// exclusively from before its commit until the files are gone. Transaction-scoped, so it goes
/// with the transaction however its holder ends.
const FILES_LOCK: i64 = 0x5359_4e4b_0020;

/// Waits until no reset runs on any node, then keeps resets out until the transaction ends.
#[tracing::instrument(name = "db.attachments.lock_files_shared", level = "debug", skip_all)]
pub async fn lock_files_shared(tx: &impl GenericClient) -> DbResult<()> {
    tx.execute("SELECT pg_advisory_xact_lock_shared($1)", &[&FILES_LOCK]).await?;
    Ok(())
}

/// Waits until no upload is between its look at the table and its commit on any node, then keeps
/// uploads out until the transaction ends.
#[tracing::instrument(name = "db.attachments.lock_files_exclusive", level = "debug", skip_all)]
pub async fn lock_files_exclusive(tx: &impl GenericClient) -> DbResult<()> {
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&FILES_LOCK]).await?;
    Ok(())
}

const COLUMNS: &str = "id, sha256, size, content_type, uploaded_by, client_id, created_at, change_id";

fn from_row(r: &Row) -> AttachmentRow {
    AttachmentRow {
        id: r.get(0),
        sha256: r.get(1),
        size: r.get(2),
        content_type: r.get(3),
        uploaded_by: r.get(4),
        client_id: r.get(5),
        created_at: r.get(6),
        change_id: r.get(7),
        deleted: false,
    }
}

#[tracing::instrument(name = "db.attachments.find", level = "debug", skip_all)]
pub async fn find(db: &impl GenericClient, id: &str) -> DbResult<Option<AttachmentRow>> {
    let sql = format!("SELECT {COLUMNS} FROM attachments WHERE id = $1");
    Ok(db.query_opt(&sql, &[&id]).await?.map(|r| from_row(&r)))
}

/// What an upload wants recorded.
#[derive(Debug, Clone)]
pub struct NewAttachment {
    pub id: String,
    pub sha256: String,
    pub size: i64,
    pub content_type: String,
    pub uploaded_by: String,
    pub client_id: Option<String>,
}

/// Inserts the row and counts it (src/db/stats.rs): call it in the change log's transaction. A
/// tombstone of the same id (an imported deletion) goes in the same statement, and so does the
/// uploader's write mark (src/db/marks.rs): their later reads show the upload.
#[tracing::instrument(name = "db.attachments.insert", level = "debug", skip_all)]
pub async fn insert(db: &impl GenericClient, a: &NewAttachment, change_id: i64) -> DbResult<AttachmentRow> {
    let sql = format!(
        "WITH revived AS (DELETE FROM attachment_tombstones WHERE id = $1),
         marked AS (
             INSERT INTO write_marks AS m (username, change_id) VALUES ($5, $7)
             ON CONFLICT (username) DO UPDATE SET change_id = greatest(m.change_id, excluded.change_id)
         )
         INSERT INTO attachments (id, sha256, size, content_type, uploaded_by, client_id, change_id)
         VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING {COLUMNS}"
    );
    let row = db
        .query_one(
            &sql,
            &[&a.id, &a.sha256, &a.size, &a.content_type, &a.uploaded_by, &a.client_id, &change_id],
        )
        .await?;
    super::stats::count_attachment(db).await?;
    Ok(from_row(&row))
}

/// Attachments recorded (and, with `deletions`, deleted) after a cursor, up to the snapshot head,
/// with that head (one statement).
#[tracing::instrument(name = "db.attachments.changes_after", level = "debug", skip_all)]
pub async fn changes_after(
    db: &impl GenericClient,
    after: i64,
    deletions: bool,
) -> DbResult<(i64, Vec<AttachmentRow>)> {
    static SQL: LazyLock<[String; 2]> =
        LazyLock::new(|| [changes_sql(AFTER, false), changes_sql(AFTER, true)]);
    changes_where(db, &SQL[usize::from(deletions)], &after).await
}

/// Attachments recorded or deleted after a moment, up to the snapshot head, with that head.
#[tracing::instrument(name = "db.attachments.changes_since", level = "debug", skip_all)]
pub async fn changes_since(
    db: &impl GenericClient,
    since: DateTime<Utc>,
) -> DbResult<(i64, Vec<AttachmentRow>)> {
    static SQL: LazyLock<String> = LazyLock::new(|| changes_sql(SINCE, true));
    changes_where(db, &SQL, &since).await
}

/// A statement for [`changes_where`]: the changes that meet `conditions` on `attachments`, then on
/// `attachment_tombstones` (left out without `deletions`).
fn changes_sql([condition, tombstone_condition]: [&str; 2], deletions: bool) -> String {
    let tombstones = if deletions {
        format!(
            "UNION ALL SELECT id, '', 0, '', '', client_id, deleted_at, change_id, true FROM attachment_tombstones
             WHERE {tombstone_condition} AND change_id <= h.head"
        )
    } else {
        String::new()
    };
    format!(
        "WITH h AS (SELECT head FROM change_head)
         SELECT h.head, a.* FROM h LEFT JOIN LATERAL (
             SELECT {COLUMNS}, false FROM attachments WHERE {condition} AND change_id <= h.head
             {tombstones}
             ORDER BY change_id
         ) a ON true"
    )
}

const AFTER: [&str; 2] = ["change_id > $1", "change_id > $1"];
const SINCE: [&str; 2] = ["created_at > $1", "deleted_at > $1"];

/// The rows of `sql` (one of [`changes_sql`]'s, built once: devices ask for the manifest at every
/// sync, and each text is prepared once per connection) with its head.
async fn changes_where(
    db: &impl GenericClient,
    sql: &str,
    param: &(dyn tokio_postgres::types::ToSql + Sync),
) -> DbResult<(i64, Vec<AttachmentRow>)> {
    let sql = db.prepare_cached(sql).await?;
    let rows = db.query(&sql, &[param]).await?;
    let head: i64 = rows.first().map(|r| r.get(0)).unwrap_or(0);
    let items = rows
        .iter()
        .filter(|r| r.get::<_, Option<String>>(1).is_some())
        .map(|r| AttachmentRow {
            id: r.get(1),
            sha256: r.get(2),
            size: r.get(3),
            content_type: r.get(4),
            uploaded_by: r.get(5),
            client_id: r.get(6),
            created_at: r.get(7),
            change_id: r.get(8),
            deleted: r.get(9),
        })
        .collect();
    Ok((head, items))
}
