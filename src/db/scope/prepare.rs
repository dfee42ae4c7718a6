//! Preparing a new version of the scope set, in batches that each commit their progress, and the
//! switch that puts it in force (docs/architecture.md, "Scoped sync": preparation and switch).

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use deadpool_postgres::{GenericClient, Transaction};

use crate::db::records::CHANGELOG_LOCK;
use crate::db::scope::{set_version, SetVersion};
use crate::db::{DbError, DbResult};
use crate::domain::role::Role;
use crate::domain::scope::refs::attachment_refs;
use crate::domain::scope::{
    changed_keys, KeyPlan, ScopeRules, Touched, UserAttributes, UserFacts, Visibility, ALL,
};

/// Records per batch: a batch holds the change-log lock (a commit waits for at most one batch, and
/// no record changes under it) and commits its progress with its rows, so a crash loses at most
/// one batch.
pub const BATCH: i64 = 1_000;

/// What a preparation does for one version, derived once from the two sets.
pub struct Plan {
    pub version: i64,
    pub event_id: i64,
    /// Keys of the families the set in force does not have: computed for every record.
    pub backfill: KeyPlan,
    /// Buckets that may change hands: every record in one gets a slot in the redelivery.
    pub touched: Touched,
    /// Attachment references were not kept before (no set was in force): compute them too.
    pub refs: bool,
}

impl Plan {
    pub fn new(set: &SetVersion, active: Option<&ScopeRules>) -> DbResult<Plan> {
        let event_id = set.event_id.ok_or_else(|| {
            DbError::Other(format!("scope set version {} has no event", set.version).into())
        })?;
        let new = set.rules.as_deref();
        let old_families = active.map(ScopeRules::families).unwrap_or_default();
        let new_families: BTreeSet<_> = new.map(ScopeRules::families).unwrap_or_default();
        Ok(Plan {
            version: set.version,
            event_id,
            backfill: KeyPlan::new(new_families.difference(&old_families)),
            touched: Touched::between(active, new),
            refs: active.is_none() && new.is_some(),
        })
    }
}

/// Fixes where the scan starts from: the head now (records changed after it are caught up) and
/// how many records there are to scan (for progress).
#[tracing::instrument(name = "db.scope.prepare.begin", level = "debug", skip_all)]
pub async fn begin(db: &impl GenericClient, version: i64) -> DbResult<()> {
    db.execute(
        "UPDATE scope_sets SET scan_head = (SELECT head FROM change_head),
                to_scan = (SELECT count(*) FROM records)
         WHERE version = $1 AND state = 'preparing' AND scan_head IS NULL",
        &[&version],
    )
    .await?;
    Ok(())
}

/// Scans the next batch of records by id; false when the scan is complete.
///
/// Only records last changed at or below the head the scan began at: a later change was committed
/// while the version was being prepared, so its commit wrote its keys and references and the
/// catch-up gives it its slot. Without that bound a push rate above the scan's kept it from ever
/// ending. The batch runs under the change-log lock rather than holding its rows `FOR SHARE`: a
/// commit updating two of them in another order than the scan's deadlocked with it.
#[tracing::instrument(name = "db.scope.prepare.scan_batch", level = "debug", skip_all)]
pub async fn scan_batch(tx: &Transaction<'_>, plan: &Plan) -> DbResult<bool> {
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&CHANGELOG_LOCK]).await?;
    let Some(set) = set_version(tx, plan.version).await? else { return Ok(false) };
    if set.state != "preparing" {
        return Ok(false);
    }
    let head = set.scan_head.ok_or_else(|| {
        DbError::Other(format!("scope set version {} is scanned before it began", set.version).into())
    })?;
    let after = set.scan_after.clone().unwrap_or_default();
    let rows = tx
        .query(
            "SELECT id, change_id, form_type, data FROM records
              WHERE id > $1 AND change_id <= $3 ORDER BY id LIMIT $2",
            &[&after, &BATCH, &head],
        )
        .await?;
    let Some(last) = rows.last() else { return Ok(false) };
    let last_id: String = last.get(0);
    let mut ids = Vec::with_capacity(rows.len());
    let (mut keys, mut key_records, mut key_changes) = (Vec::new(), Vec::new(), Vec::new());
    let (mut refs, mut ref_records) = (Vec::new(), Vec::new());
    for row in &rows {
        let id: String = row.get(0);
        let change_id: i64 = row.get(1);
        let form_type: &str = row.get(2);
        let data: &str = row.get(3);
        for key in plan.backfill.record_keys(form_type, data).map_err(|e| stored_data_error(&id, e))? {
            keys.push(key);
            key_records.push(id.clone());
            key_changes.push(change_id);
        }
        if plan.refs {
            for attachment in attachment_refs(data).map_err(|e| stored_data_error(&id, e))? {
                refs.push(attachment);
                ref_records.push(id.clone());
            }
        }
        ids.push(id);
    }
    if !plan.backfill.is_empty() {
        let families: Vec<&str> = plan.backfill.family_ids().collect();
        // Rows of these families left by an earlier preparation that was replaced may be stale;
        // no record changes under the change-log lock, so what it computed is their current state.
        tx.execute(
            "DELETE FROM scope_rows s USING unnest($1::text[]) AS b(id)
             WHERE s.record_id = b.id AND split_part(s.key, '=', 1) = ANY($2)
               AND NOT EXISTS (SELECT 1 FROM unnest($3::text[], $4::text[]) AS k(key, record_id)
                               WHERE k.key = s.key AND k.record_id = s.record_id)",
            &[&ids, &families, &keys, &key_records],
        )
        .await?;
        tx.execute(
            "INSERT INTO scope_rows (key, record_id, change_id, live)
             SELECT key, record_id, change_id, true FROM unnest($1::text[], $2::text[], $3::int8[]) AS k(key, record_id, change_id)
             ON CONFLICT (key, record_id) DO UPDATE SET change_id = EXCLUDED.change_id, live = true
             WHERE scope_rows.change_id < EXCLUDED.change_id OR NOT scope_rows.live",
            &[&keys, &key_records, &key_changes],
        )
        .await?;
    }
    if plan.refs {
        tx.execute("DELETE FROM attachment_refs WHERE record_id = ANY($1)", &[&ids]).await?;
        tx.execute(
            "INSERT INTO attachment_refs (attachment_id, record_id)
             SELECT * FROM unnest($1::text[], $2::text[]) ON CONFLICT DO NOTHING",
            &[&refs, &ref_records],
        )
        .await?;
    }
    let slots = assign_slots(tx, plan, &ids, set.slots).await?;
    tx.execute(
        "UPDATE scope_sets SET scan_after = $2, scanned = scanned + $3, slots = $4 WHERE version = $1",
        &[&plan.version, &last_id, &(ids.len() as i64), &slots],
    )
    .await?;
    Ok(true)
}

fn stored_data_error(id: &str, error: serde_json::Error) -> DbError {
    DbError::Other(format!("record {id}: stored data is not JSON: {error}").into())
}

/// Gives each of `ids` that is in a touched bucket a slot in the version's redelivery (keeping
/// the slot a record already has) and lists it under each touched key it is in. Returns the
/// number of slots handed out so far.
async fn assign_slots(tx: &Transaction<'_>, plan: &Plan, ids: &[String], slots: i64) -> DbResult<i64> {
    if plan.touched.is_nothing() || ids.is_empty() {
        return Ok(slots);
    }
    let (all, families): (bool, Vec<String>) = match &plan.touched {
        Touched::All => (true, Vec::new()),
        Touched::Families(ids) => (false, ids.iter().cloned().collect()),
    };
    let row = tx
        .query_one(
            "WITH keys AS (
                 SELECT record_id, key FROM scope_rows
                  WHERE NOT $3 AND record_id = ANY($2) AND split_part(key, '=', 1) = ANY($4)
                 UNION ALL
                 SELECT b.id, $5::text COLLATE \"C\" FROM unnest($2::text[]) AS b(id) WHERE $3
             ), fresh AS (
                 SELECT k.record_id, k.key FROM keys k
                  WHERE NOT EXISTS (SELECT 1 FROM scope_event_slots s
                                     WHERE s.event_id = $1 AND s.record_id = k.record_id AND s.key = k.key)
             ), existing AS (
                 SELECT DISTINCT ON (s.record_id) s.record_id, s.slot FROM scope_event_slots s
                  WHERE s.event_id = $1 AND s.record_id IN (SELECT record_id FROM fresh)
             ), numbered AS (
                 SELECT d.record_id, $6 + row_number() OVER (ORDER BY d.record_id) AS slot
                   FROM (SELECT DISTINCT record_id FROM fresh
                          WHERE record_id NOT IN (SELECT record_id FROM existing)) d
             ), inserted AS (
                 INSERT INTO scope_event_slots (event_id, key, slot, record_id)
                 SELECT $1, f.key, coalesce(x.slot, n.slot), f.record_id
                   FROM fresh f LEFT JOIN existing x USING (record_id) LEFT JOIN numbered n USING (record_id)
                 RETURNING 1
             )
             SELECT count(*) FROM numbered",
            &[&plan.event_id, &ids, &all, &families, &ALL, &slots],
        )
        .await?;
    let fresh: i64 = row.get(0);
    Ok(slots + fresh)
}

/// Gives slots to the records changed since the scan (or the last catch-up) started; returns how
/// many records it looked at. Repeated until few remain, then once more inside the switch.
#[tracing::instrument(name = "db.scope.prepare.catch_up", level = "debug", skip_all)]
pub async fn catch_up(tx: &Transaction<'_>, plan: &Plan, limit: Option<i64>) -> DbResult<i64> {
    let Some(set) = set_version(tx, plan.version).await? else { return Ok(0) };
    let Some(since) = set.scan_head else { return Ok(0) };
    let rows = tx
        .query(
            "SELECT id, change_id FROM records WHERE change_id > $1 ORDER BY change_id LIMIT $2",
            &[&since, &limit.unwrap_or(i64::MAX)],
        )
        .await?;
    let Some(last) = rows.last() else { return Ok(0) };
    let up_to: i64 = last.get(1);
    let ids: Vec<String> = rows.iter().map(|row| row.get(0)).collect();
    let slots = assign_slots(tx, plan, &ids, set.slots).await?;
    tx.execute(
        "UPDATE scope_sets SET scan_head = $2, slots = $3 WHERE version = $1",
        &[&plan.version, &up_to, &slots],
    )
    .await?;
    Ok(ids.len() as i64)
}

/// What the switch did, for the audit log and the status.
#[derive(Debug, Clone)]
pub struct Switched {
    pub version: i64,
    pub previous: i64,
    pub base: i64,
    pub redelivered: i64,
    pub users_affected: usize,
}

/// Puts a prepared version in force, under the change-log lock: the last catch-up, each user's
/// keys and what changed hands for them, the redelivery block taken after the head, the state.
#[tracing::instrument(name = "db.scope.prepare.switch", level = "debug", skip_all)]
pub async fn switch(tx: &Transaction<'_>, plan: &Plan, now: DateTime<Utc>) -> DbResult<Option<Switched>> {
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&CHANGELOG_LOCK]).await?;
    let state = crate::db::scope::state(tx).await?;
    if state.preparing_version != Some(plan.version) {
        return Ok(None);
    }
    catch_up(tx, plan, None).await?;
    let Some(set) = set_version(tx, plan.version).await? else { return Ok(None) };
    let old_rules = crate::db::scope::rules_of(tx, state.active_version).await?;
    let new_rules = set.rules.clone();
    let users = all_users(tx).await?;
    let mut affected = 0;
    tx.execute("DELETE FROM scope_user_keys", &[]).await?;
    for user in &users {
        let old = Visibility::of(old_rules.as_deref(), user);
        let new = Visibility::of(new_rules.as_deref(), user);
        let changed: Vec<String> = changed_keys(&old, &new).into_iter().collect();
        if !changed.is_empty() && set.slots > 0 {
            affected += 1;
            tx.execute(
                "INSERT INTO scope_event_users (username, event_id, keys) VALUES ($1, $2, $3)",
                &[&user.username, &plan.event_id, &changed],
            )
            .await?;
        }
        if let Visibility::Keys(keys) = &new {
            let keys: Vec<&String> = keys.iter().collect();
            tx.execute(
                "INSERT INTO scope_user_keys (username, keys) VALUES ($1, $2)",
                &[&user.username, &keys],
            )
            .await?;
        }
    }
    let base = take_block(tx, plan.event_id, set.slots).await?;
    tx.execute("UPDATE scope_sets SET state = 'retired' WHERE state = 'active'", &[]).await?;
    tx.execute(
        "UPDATE scope_sets SET state = 'active', activated_at = $2 WHERE version = $1",
        &[&plan.version, &now],
    )
    .await?;
    let active_version = if new_rules.is_some() { plan.version } else { 0 };
    tx.execute(
        "UPDATE scope_state SET active_version = $1, preparing_version = NULL, revision = revision + 1,
                gc_pending = true",
        &[&active_version],
    )
    .await?;
    Ok(Some(Switched {
        version: plan.version,
        previous: state.active_version,
        base,
        redelivered: set.slots,
        users_affected: affected,
    }))
}

/// Commits an event's block: change_ids `base + 1 ..= base + size` after the head, which moves
/// past them. The caller holds the change-log lock.
#[tracing::instrument(name = "db.scope.prepare.take_block", level = "debug", skip_all)]
pub(super) async fn take_block(db: &impl GenericClient, event_id: i64, size: i64) -> DbResult<i64> {
    let base: i64 = db.query_one("SELECT head FROM change_head", &[]).await?.get(0);
    db.execute("UPDATE scope_events SET base = $2, size = $3 WHERE id = $1", &[&event_id, &base, &size])
        .await?;
    if size > 0 {
        db.execute("UPDATE change_head SET head = $1", &[&(base + size)]).await?;
    }
    Ok(base)
}

#[tracing::instrument(name = "db.scope.prepare.all_users", level = "debug", skip_all)]
pub(super) async fn all_users(db: &impl GenericClient) -> DbResult<Vec<UserFacts>> {
    let rows = db.query("SELECT username, role, attributes FROM users ORDER BY username", &[]).await?;
    rows.iter().map(user_facts).collect()
}

pub(super) fn user_facts(row: &tokio_postgres::Row) -> DbResult<UserFacts> {
    let username: String = row.get(0);
    let role: String = row.get(1);
    let role = Role::parse(&role)
        .ok_or_else(|| DbError::Other(format!("user {username} has role {role}").into()))?;
    let attributes = UserAttributes::parse(&row.get::<_, serde_json::Value>(2))
        .map_err(|_| DbError::Other(format!("user {username}: stored attributes do not parse").into()))?;
    Ok(UserFacts { username, role, attributes })
}
