//! SQL for the audit log (docs/api.md §18.4). Entries are appended by the transaction of the
//! action they record; the table refuses UPDATE and DELETE (migration V10) except in the
//! retention sweep's own transaction.

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use serde_json::Value;

use crate::db::DbResult;
use crate::domain::audit::{AuditFilter, Entry};

/// A stored entry.
#[derive(Debug, Clone)]
pub struct AuditRow {
    pub id: i64,
    pub at: DateTime<Utc>,
    pub actor: Option<String>,
    pub action: String,
    pub target: Option<String>,
    pub client_ip: Option<std::net::IpAddr>,
    pub request_id: Option<String>,
    pub node: String,
    pub details: Value,
}

/// Appends `entry`; call it on the transaction that performs the action. The entry of a write
/// also marks its actor's writes (src/db/marks.rs), in the same transaction, so every audited
/// write is one that user's later reads reflect, whichever node or replica serves them.
#[tracing::instrument(name = "db.audit.append", level = "debug", skip_all)]
pub async fn append(db: &impl GenericClient, entry: &Entry) -> DbResult<()> {
    let origin = &entry.origin;
    if let (true, Some(actor)) = (entry.action.is_write(), &origin.actor) {
        super::marks::mark_write(db, actor).await?;
    }
    db.execute(
        "INSERT INTO audit_log (actor, action, target, client_ip, request_id, node, details)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
        &[
            &origin.actor,
            &entry.action.as_str(),
            &entry.target,
            &origin.client_ip,
            &origin.request_id,
            &origin.node,
            &entry.details,
        ],
    )
    .await?;
    Ok(())
}

/// Appends several entries of one action (in order).
#[tracing::instrument(name = "db.audit.append_all", level = "debug", skip_all)]
pub async fn append_all(db: &impl GenericClient, entries: &[Entry]) -> DbResult<()> {
    for entry in entries {
        append(db, entry).await?;
    }
    Ok(())
}

/// Up to `limit` entries matching `filter` with an id below `before`, newest first.
#[tracing::instrument(name = "db.audit.list", level = "debug", skip_all)]
pub async fn list(
    db: &impl GenericClient,
    filter: &AuditFilter,
    before: i64,
    limit: i64,
) -> DbResult<Vec<AuditRow>> {
    let rows = db
        .query(
            "SELECT id, at, actor, action, target, client_ip, request_id, node, details
             FROM audit_log
             WHERE id < $1
               AND ($2::text IS NULL OR actor = $2)
               AND ($3::text IS NULL OR action = $3)
               AND ($4::timestamptz IS NULL OR at >= $4)
               AND ($5::timestamptz IS NULL OR at <= $5)
             ORDER BY id DESC
             LIMIT $6",
            &[&before, &filter.actor, &filter.action, &filter.since, &filter.until, &limit],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| AuditRow {
            id: row.get("id"),
            at: row.get("at"),
            actor: row.get("actor"),
            action: row.get("action"),
            target: row.get("target"),
            client_ip: row.get("client_ip"),
            request_id: row.get("request_id"),
            node: row.get("node"),
            details: row.get("details"),
        })
        .collect())
}

/// The retention sweep: deletes entries older than `days` days. The only statement the table's
/// trigger lets delete, because this transaction alone sets `synkronus.audit_sweep`.
#[tracing::instrument(name = "db.audit.sweep", level = "debug", skip_all)]
pub async fn sweep(db: &mut deadpool_postgres::Object, days: u32) -> DbResult<u64> {
    let tx = db.transaction().await?;
    tx.batch_execute("SET LOCAL synkronus.audit_sweep = 'on'").await?;
    let removed = tx
        .execute("DELETE FROM audit_log WHERE at < now() - make_interval(days => $1)", &[&(days as i32)])
        .await?;
    tx.commit().await?;
    Ok(removed)
}
