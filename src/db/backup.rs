//! SQL of `synkronus backup` and `synkronus restore` (docs/operations.md): the catalogue of the
//! app's schema read generically (every table, column, foreign key and sequence, so tables added by
//! later migrations are covered without touching this file), COPY out and in, and the checks and
//! updates around a restore.

use bytes::Bytes;
use chrono::{DateTime, Utc};
use deadpool_postgres::{GenericClient, Transaction};
use tokio_postgres::{CopyInSink, CopyOutStream, IsolationLevel};

use super::DbResult;

/// refinery's bookkeeping: the archive records the applied migrations instead of this table, and
/// a restore writes it by migrating.
const MIGRATION_TABLE: &str = "refinery_schema_history";

/// Session settings that make COPY's text format read back exactly what it wrote, whatever the
/// server's or database's defaults: ISO dates, UTC, every float digit, hex bytea.
const EXACT_TEXT: &str = "SET LOCAL DateStyle = 'ISO, YMD'; SET LOCAL TimeZone = 'UTC';
    SET LOCAL IntervalStyle = 'postgres'; SET LOCAL extra_float_digits = 3; SET LOCAL bytea_output = 'hex';";

/// A table of the app's schema and the columns COPY moves (generated columns are left out:
/// PostgreSQL computes them again).
#[derive(Debug, Clone)]
pub struct Table {
    pub name: String,
    pub columns: Vec<String>,
}

/// A sequence and its last value (`None`: never used).
#[derive(Debug, Clone)]
pub struct Sequence {
    pub name: String,
    pub last_value: Option<i64>,
}

/// What a restore target already holds (docs/api.md §18.4: only the bootstrap admin may be there).
#[derive(Debug, Default)]
pub struct TargetContents {
    pub records: i64,
    pub attachments: i64,
    pub bundle_versions: i64,
    /// At most two usernames: enough to tell "the bootstrap admin alone" from anything more.
    pub users: Vec<String>,
}

/// `"name"`, with embedded quotes doubled.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn column_list(columns: &[String]) -> String {
    columns.iter().map(|c| quote_ident(c)).collect::<Vec<_>>().join(", ")
}

/// One snapshot of the whole database, read-only: every COPY inside it sees the same moment.
#[tracing::instrument(name = "db.backup.snapshot", level = "debug", skip_all)]
pub async fn snapshot(client: &mut deadpool_postgres::Object) -> DbResult<Transaction<'_>> {
    let tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?;
    tx.batch_execute(EXACT_TEXT).await?;
    Ok(tx)
}

/// The restore's one transaction.
#[tracing::instrument(name = "db.backup.load_transaction", level = "debug", skip_all)]
pub async fn load_transaction(client: &mut deadpool_postgres::Object) -> DbResult<Transaction<'_>> {
    let tx = client.transaction().await?;
    tx.batch_execute(EXACT_TEXT).await?;
    Ok(tx)
}

/// The snapshot's time (the transaction's start).
#[tracing::instrument(name = "db.backup.now", level = "debug", skip_all)]
pub async fn now(db: &impl GenericClient) -> DbResult<DateTime<Utc>> {
    Ok(db.query_one("SELECT now()", &[]).await?.get(0))
}

/// Applied migrations as (version, name), oldest first; empty for a database never migrated.
#[tracing::instrument(name = "db.backup.applied_migrations", level = "debug", skip_all)]
pub async fn applied_migrations(db: &impl GenericClient) -> DbResult<Vec<(i64, String)>> {
    let exists: bool = db.query_one("SELECT to_regclass($1) IS NOT NULL", &[&MIGRATION_TABLE]).await?.get(0);
    if !exists {
        return Ok(Vec::new());
    }
    let rows = db
        .query(
            &format!("SELECT version::bigint, coalesce(name, '') FROM {MIGRATION_TABLE} ORDER BY version"),
            &[],
        )
        .await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// Every ordinary table of the current schema but refinery's, by name.
#[tracing::instrument(name = "db.backup.tables", level = "debug", skip_all)]
pub async fn tables(db: &impl GenericClient) -> DbResult<Vec<Table>> {
    let rows = db
        .query(
            "SELECT c.relname::text,
                    array_agg(a.attname::text ORDER BY a.attnum) FILTER (WHERE a.attnum IS NOT NULL)
             FROM pg_class c
             JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = current_schema()
             LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
                                      AND a.attgenerated = ''
             WHERE c.relkind = 'r' AND c.relname <> $1
             GROUP BY c.relname ORDER BY c.relname",
            &[&MIGRATION_TABLE],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| Table { name: r.get(0), columns: r.get::<_, Option<Vec<String>>>(1).unwrap_or_default() })
        .collect())
}

/// (referencing table, referenced table) for every foreign key inside the current schema.
#[tracing::instrument(name = "db.backup.foreign_keys", level = "debug", skip_all)]
pub async fn foreign_keys(db: &impl GenericClient) -> DbResult<Vec<(String, String)>> {
    let rows = db
        .query(
            "SELECT child.relname::text, parent.relname::text
             FROM pg_constraint k
             JOIN pg_class child ON child.oid = k.conrelid
             JOIN pg_class parent ON parent.oid = k.confrelid
             JOIN pg_namespace n ON n.oid = child.relnamespace AND n.nspname = current_schema()
             WHERE k.contype = 'f'",
            &[],
        )
        .await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// Every sequence of the current schema. Sequences are outside snapshots: read after the tables,
/// a value is at least what any copied row used.
#[tracing::instrument(name = "db.backup.sequences", level = "debug", skip_all)]
pub async fn sequences(db: &impl GenericClient) -> DbResult<Vec<Sequence>> {
    let rows = db
        .query(
            "SELECT sequencename::text, last_value FROM pg_sequences
             WHERE schemaname = current_schema() ORDER BY sequencename",
            &[],
        )
        .await?;
    Ok(rows.iter().map(|r| Sequence { name: r.get(0), last_value: r.get(1) }).collect())
}

/// The table's rows in COPY text format, streamed.
#[tracing::instrument(name = "db.backup.copy_out", level = "debug", skip_all)]
pub async fn copy_out(db: &Transaction<'_>, table: &Table) -> DbResult<CopyOutStream> {
    let sql = format!("COPY {} ({}) TO STDOUT", quote_ident(&table.name), column_list(&table.columns));
    Ok(db.copy_out(&sql).await?)
}

/// A sink taking COPY text format for the table.
#[tracing::instrument(name = "db.backup.copy_in", level = "debug", skip_all)]
pub async fn copy_in(db: &Transaction<'_>, table: &str, columns: &[String]) -> DbResult<CopyInSink<Bytes>> {
    let sql = format!("COPY {} ({}) FROM STDIN", quote_ident(table), column_list(columns));
    Ok(db.copy_in(&sql).await?)
}

/// The distinct attachment contents (sha256) the snapshot refers to.
#[tracing::instrument(name = "db.backup.attachment_hashes", level = "debug", skip_all)]
pub async fn attachment_hashes(db: &impl GenericClient) -> DbResult<Vec<String>> {
    let rows = db.query("SELECT DISTINCT sha256 FROM attachments ORDER BY 1", &[]).await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// Bundle versions whose files exist (retention marks removed ones and deletes their files).
#[tracing::instrument(name = "db.backup.stored_bundle_versions", level = "debug", skip_all)]
pub async fn stored_bundle_versions(db: &impl GenericClient) -> DbResult<Vec<String>> {
    let rows =
        db.query("SELECT version FROM bundle_versions WHERE removed_at IS NULL ORDER BY seq", &[]).await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// Sessions on this database other than ours: a server still running on the restore target.
#[tracing::instrument(name = "db.backup.other_sessions", level = "debug", skip_all)]
pub async fn other_sessions(db: &impl GenericClient) -> DbResult<i64> {
    Ok(db
        .query_one(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'",
            &[],
        )
        .await?
        .get(0))
}

/// What the (migrated) target holds.
#[tracing::instrument(name = "db.backup.target_contents", level = "debug", skip_all)]
pub async fn target_contents(db: &impl GenericClient) -> DbResult<TargetContents> {
    let row = db
        .query_one(
            "SELECT (SELECT count(*) FROM records), (SELECT count(*) FROM attachments),
                    (SELECT count(*) FROM bundle_versions),
                    ARRAY(SELECT username FROM users ORDER BY username LIMIT 2)",
            &[],
        )
        .await?;
    Ok(TargetContents {
        records: row.get(0),
        attachments: row.get(1),
        bundle_versions: row.get(2),
        users: row.get(3),
    })
}

/// Empties every listed table at once (foreign keys among them allow it only together).
#[tracing::instrument(name = "db.backup.truncate", level = "debug", skip_all)]
pub async fn truncate(db: &Transaction<'_>, tables: &[Table]) -> DbResult<()> {
    if tables.is_empty() {
        return Ok(());
    }
    let names: Vec<String> = tables.iter().map(|t| quote_ident(&t.name)).collect();
    // A restore replaces the audit log with the archive's own copy: the append-only trigger lets
    // a transaction that says so empty it, as the retention sweep does.
    db.batch_execute("SET LOCAL synkronus.audit_sweep = 'on'").await?;
    db.batch_execute(&format!("TRUNCATE {}", names.join(", "))).await?;
    Ok(())
}

/// Puts a sequence back where the archive found it (or at its start when it was never used).
#[tracing::instrument(name = "db.backup.set_sequence", level = "debug", skip_all)]
pub async fn set_sequence(db: &Transaction<'_>, sequence: &Sequence) -> DbResult<()> {
    let name = quote_ident(&sequence.name);
    match sequence.last_value {
        Some(value) => {
            db.execute("SELECT setval($1::text::regclass, $2, true)", &[&name, &value]).await?;
        }
        None => db.batch_execute(&format!("ALTER SEQUENCE {name} RESTART")).await?,
    }
    Ok(())
}

/// Raises the repository generation (docs/api.md §17.2) above both the restored one and `replaced`
/// (the target's before the restore), and returns it.
#[tracing::instrument(name = "db.backup.raise_generation", level = "debug", skip_all)]
pub async fn raise_generation(db: &Transaction<'_>, replaced: i64) -> DbResult<i64> {
    Ok(db
        .query_one(
            "UPDATE change_head SET repository_generation = greatest(repository_generation, $1) + 1
             RETURNING repository_generation",
            &[&replaced],
        )
        .await?
        .get(0))
}
