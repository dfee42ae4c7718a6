//! SQL of scoped sync (docs/api.md §20; the design: docs/architecture.md, "Scoped sync"): the
//! versions of the scope set and the state pointer, the keys written with records, redelivery
//! events, the scoped pull page, and what readers filter by.

pub mod devices;
pub mod gc;
pub mod manifest;
pub mod prepare;
pub mod pull;
pub mod read;
pub mod users;
pub mod write;

use std::sync::Arc;

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use serde_json::Value;

use crate::db::records::CHANGELOG_LOCK;
use crate::db::{DbError, DbResult};
use crate::domain::scope::ScopeRules;

/// The set in force and the one being prepared, as one snapshot saw them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScopeState {
    /// 0 when no set is in force.
    pub active_version: i64,
    pub preparing_version: Option<i64>,
    /// Rises with every change of either: a group written ahead commits only if it has not moved.
    pub revision: i64,
}

/// One version of the set; `rules` is `None` for a version that returns to "no set".
#[derive(Debug, Clone)]
pub struct SetVersion {
    pub version: i64,
    pub rules: Option<Arc<ScopeRules>>,
    pub state: String,
    pub created_at: DateTime<Utc>,
    pub created_by: String,
    pub activated_at: Option<DateTime<Utc>>,
    pub event_id: Option<i64>,
    pub scan_after: Option<String>,
    pub scan_head: Option<i64>,
    pub slots: i64,
    pub scanned: i64,
    pub to_scan: i64,
}

#[tracing::instrument(name = "db.scope.state", level = "debug", skip_all)]
pub async fn state(db: &impl GenericClient) -> DbResult<ScopeState> {
    let row =
        db.query_one("SELECT active_version, preparing_version, revision FROM scope_state", &[]).await?;
    Ok(ScopeState { active_version: row.get(0), preparing_version: row.get(1), revision: row.get(2) })
}

const SET_COLUMNS: &str =
    "version, rules, state, created_at, created_by, activated_at, event_id, scan_after, \
     scan_head, slots, scanned, to_scan";

fn set_from_row(row: &tokio_postgres::Row) -> DbResult<SetVersion> {
    let version: i64 = row.get(0);
    let rules = match row.get::<_, Option<Value>>(1) {
        None => None,
        Some(raw) => Some(Arc::new(ScopeRules::parse(&raw).map_err(|problems| {
            DbError::Other(format!("stored scope set version {version} does not parse: {problems:?}").into())
        })?)),
    };
    Ok(SetVersion {
        version,
        rules,
        state: row.get(2),
        created_at: row.get(3),
        created_by: row.get(4),
        activated_at: row.get(5),
        event_id: row.get(6),
        scan_after: row.get(7),
        scan_head: row.get(8),
        slots: row.get(9),
        scanned: row.get(10),
        to_scan: row.get(11),
    })
}

#[tracing::instrument(name = "db.scope.set_version", level = "debug", skip_all)]
pub async fn set_version(db: &impl GenericClient, version: i64) -> DbResult<Option<SetVersion>> {
    let sql = format!("SELECT {SET_COLUMNS} FROM scope_sets WHERE version = $1");
    db.query_opt(&sql, &[&version]).await?.as_ref().map(set_from_row).transpose()
}

/// The rules of a version (`None`: no set, or version 0).
#[tracing::instrument(name = "db.scope.rules_of", level = "debug", skip_all)]
pub async fn rules_of(db: &impl GenericClient, version: i64) -> DbResult<Option<Arc<ScopeRules>>> {
    if version == 0 {
        return Ok(None);
    }
    let set = set_version(db, version)
        .await?
        .ok_or_else(|| DbError::Other(format!("scope set version {version} is missing").into()))?;
    Ok(set.rules)
}

/// What a new version of the set was stored as. `version` 0: nothing to do (back to no set
/// while none was in force or being prepared).
#[derive(Debug, Clone, Copy)]
pub struct NewVersion {
    pub version: i64,
    pub replaced: Option<i64>,
    pub previous_active: i64,
}

/// Stores a new version of the set (`None`: back to no set) as the one being prepared, replacing
/// one still being prepared. Runs under the change-log lock: every commit after it writes the new
/// set's keys too, every commit before it is visible to the preparation's scan.
#[tracing::instrument(name = "db.scope.create_version", level = "debug", skip_all)]
pub async fn create_version(
    tx: &deadpool_postgres::Transaction<'_>,
    rules: Option<&ScopeRules>,
    actor: &str,
    now: DateTime<Utc>,
) -> DbResult<NewVersion> {
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&CHANGELOG_LOCK]).await?;
    let current = state(tx).await?;
    if rules.is_none() && current.active_version == 0 && current.preparing_version.is_none() {
        return Ok(NewVersion { version: 0, replaced: None, previous_active: 0 });
    }
    let replaced: Option<i64> = tx
        .query_opt(
            "UPDATE scope_sets SET state = 'replaced' WHERE state = 'preparing' RETURNING version",
            &[],
        )
        .await?
        .map(|row| row.get(0));
    let version: i64 =
        tx.query_one("SELECT coalesce(max(version), 0) + 1 FROM scope_sets", &[]).await?.get(0);
    let event: i64 = tx.query_one("INSERT INTO scope_events DEFAULT VALUES RETURNING id", &[]).await?.get(0);
    let raw = rules.map(ScopeRules::to_json);
    tx.execute(
        "INSERT INTO scope_sets (version, rules, state, created_at, created_by, event_id)
         VALUES ($1, $2, 'preparing', $3, $4, $5)",
        &[&version, &raw, &now, &actor, &event],
    )
    .await?;
    tx.execute(
        "UPDATE scope_state SET preparing_version = $1, revision = revision + 1,
                gc_pending = gc_pending OR $2",
        &[&version, &replaced.is_some()],
    )
    .await?;
    Ok(NewVersion { version, replaced, previous_active: current.active_version })
}

/// Empties everything derived from records (docs/api.md §17.3's reset): keys, references,
/// redeliveries. A set being prepared starts its scan again.
#[tracing::instrument(name = "db.scope.reset", level = "debug", skip_all)]
pub async fn reset(db: &impl GenericClient) -> DbResult<()> {
    db.batch_execute(
        "DELETE FROM scope_rows; DELETE FROM attachment_refs; DELETE FROM scope_uploads;
         DELETE FROM scope_event_users;
         DELETE FROM scope_event_slots WHERE event_id IN (SELECT id FROM scope_events WHERE base IS NOT NULL);
         DELETE FROM scope_events WHERE base IS NOT NULL;
         DELETE FROM scope_event_slots WHERE event_id IN (SELECT event_id FROM scope_sets WHERE state = 'preparing');
         UPDATE scope_sets SET scan_after = NULL, scan_head = NULL, slots = 0, scanned = 0, to_scan = 0
          WHERE state = 'preparing';",
    )
    .await?;
    Ok(())
}
