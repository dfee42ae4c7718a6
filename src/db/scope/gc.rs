//! What scoped sync leaves behind, removed in small batches when nothing is being prepared: the
//! rows of families no set in force uses, attachment references once no set is in force, and
//! the slots of preparations that were replaced before they finished.

use deadpool_postgres::Transaction;

use crate::db::scope::{rules_of, state};
use crate::db::DbResult;

const GC_BATCH: i64 = 10_000;

/// Removes one batch of leftovers; returns how many rows went (0: nothing left, or a set is being
/// prepared, which needs every family's rows as they are).
#[tracing::instrument(name = "db.scope.gc.collect", level = "debug", skip_all)]
pub async fn collect(tx: &Transaction<'_>) -> DbResult<u64> {
    // Holding the state row keeps a new preparation from starting (its `UPDATE` waits) while
    // this batch deletes rows the preparation would otherwise count on. Exclusively: the batch
    // may update the row itself (`gc_pending`), and two nodes each holding it shared and then
    // updating it deadlock.
    tx.execute("SELECT 1 FROM scope_state FOR NO KEY UPDATE", &[]).await?;
    let state = state(tx).await?;
    let pending: bool = tx.query_one("SELECT gc_pending FROM scope_state", &[]).await?.get(0);
    if !pending || state.preparing_version.is_some() {
        return Ok(0);
    }
    let removed = collect_batch(tx, state.active_version).await?;
    if removed == 0 {
        tx.execute("UPDATE scope_state SET gc_pending = false", &[]).await?;
    }
    Ok(removed)
}

async fn collect_batch(tx: &Transaction<'_>, active_version: i64) -> DbResult<u64> {
    let abandoned = tx
        .execute(
            "DELETE FROM scope_event_slots WHERE ctid IN (
                 SELECT s.ctid FROM scope_event_slots s JOIN scope_events e ON e.id = s.event_id
                  WHERE e.base IS NULL LIMIT $1)",
            &[&GC_BATCH],
        )
        .await?;
    if abandoned > 0 {
        return Ok(abandoned);
    }
    tx.execute(
        "DELETE FROM scope_events e WHERE e.base IS NULL
            AND NOT EXISTS (SELECT 1 FROM scope_event_slots s WHERE s.event_id = e.id)
            AND NOT EXISTS (SELECT 1 FROM scope_sets v WHERE v.event_id = e.id AND v.state = 'preparing')",
        &[],
    )
    .await?;
    let Some(active) = rules_of(tx, active_version).await? else {
        let refs = tx
            .execute(
                "DELETE FROM attachment_refs WHERE ctid IN (SELECT ctid FROM attachment_refs LIMIT $1)",
                &[&GC_BATCH],
            )
            .await?;
        let rows = tx
            .execute(
                "DELETE FROM scope_rows WHERE ctid IN (SELECT ctid FROM scope_rows WHERE key NOT LIKE '@%' LIMIT $1)",
                &[&GC_BATCH],
            )
            .await?;
        return Ok(refs + rows);
    };
    let kept: Vec<String> = active.families().iter().map(|f| f.id()).collect();
    Ok(tx
        .execute(
            "DELETE FROM scope_rows WHERE ctid IN (
                 SELECT ctid FROM scope_rows
                  WHERE key NOT LIKE '@%' AND NOT split_part(key, '=', 1) = ANY($1) LIMIT $2)",
            &[&kept, &GC_BATCH],
        )
        .await?)
}
