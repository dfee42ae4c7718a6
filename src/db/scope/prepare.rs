//! Preparing a new version of the scope set, in batches that each commit their progress, and the
//! switch that puts it in force (docs/architecture.md, "Scoped sync": preparation and switch).

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use deadpool_postgres::{GenericClient, Transaction};

use crate::db::commit::{INDEX_PROBES_ONLY_RESET_SQL, INDEX_PROBES_ONLY_SQL};
use crate::db::records::CHANGELOG_LOCK;
use crate::db::scope::{set_version, SetVersion};
use crate::db::{DbError, DbResult};
use crate::domain::role::Role;
use crate::domain::scope::refs::attachment_refs;
use crate::domain::scope::{
    changed_keys, KeyPlan, ScopeRules, Touched, UserAttributes, UserFacts, Visibility, ALL,
};

/// Held (as a session lock) by the node preparing a version.
pub const PREPARATION_LOCK: i64 = 0x5359_4e4b_0030;

/// Records read per batch, without any lock (the reading and the key computation are most of a
/// batch's time).
pub const BATCH: i64 = 1_000;

/// Records written per transaction: a commit that comes to one of them waits for at most one
/// chunk's writes, and a crash loses at most one chunk.
pub const WRITE_CHUNK: usize = 200;

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

/// One record as the scan read it: the change it was read at and what the new families need of it.
#[derive(Debug)]
pub struct Scanned {
    id: String,
    change_id: i64,
    keys: Vec<String>,
    refs: Vec<String>,
}

/// The records after the scan's position `after`, in id order.
#[derive(Debug)]
pub struct Batch {
    after: String,
    records: Vec<Scanned>,
}

impl Batch {
    pub fn records_read(&self) -> usize {
        self.records.len()
    }

    /// The chunks to write in turn, each with the scan position it follows.
    pub fn chunks(&self) -> impl Iterator<Item = (&str, &[Scanned])> {
        self.records.chunks(WRITE_CHUNK).scan(self.after.as_str(), |after, chunk| {
            let follows = *after;
            *after = chunk.last().map_or(follows, |r| r.id.as_str());
            Some((follows, chunk))
        })
    }
}

/// When the tables a preparation fills are analyzed. They grow faster than autovacuum analyzes
/// them (once a minute at most): planned with the statistics of a table a tenth of its size, the
/// chunk's lookups by record (the stale keys' delete, the slots' keys) scanned the whole of
/// `scope_rows`, 80-95 ms a chunk at 1M records and growing, while pushes waited (chunks were then
/// written under the change-log lock; docs/benchmarks-history.md, "Scoped sync's cost: fifth
/// measurement"). Analyzed each time the scan has doubled, the statistics are never off by more
/// than half, for a logarithmic number of analyses.
#[derive(Debug)]
pub struct Statistics {
    scanned: usize,
    next: usize,
}

impl Default for Statistics {
    fn default() -> Self {
        Statistics { scanned: 0, next: FIRST_ANALYZE }
    }
}

/// Records scanned before the first analysis: one batch. From 10,000 on, the first chunks were
/// planned from the statistics of the tables before the preparation (often empty) while they
/// filled by thousands of rows a second, and the slots' statement took 21-29 ms of each under the
/// lock (docs/benchmarks-history.md, "Scoped sync's cost: sixth measurement").
const FIRST_ANALYZE: usize = BATCH as usize;

impl Statistics {
    /// Counts `read` more records and analyzes once the count reaches the next mark (outside any
    /// lock: an analysis samples the tables, it does not block writers).
    pub async fn refresh_after(&mut self, db: &impl GenericClient, read: usize) -> DbResult<()> {
        if self.due_after(read) {
            db.batch_execute("ANALYZE scope_rows, scope_event_slots, attachment_refs").await?;
        }
        Ok(())
    }

    fn due_after(&mut self, read: usize) -> bool {
        self.scanned += read;
        if self.scanned < self.next {
            return false;
        }
        self.next = self.scanned.saturating_mul(2);
        true
    }
}

/// The next records of the scan in id order, read without a lock, with their keys and references
/// computed; `None` when the scan is complete or the version is no longer being prepared.
///
/// Only records last changed at or below the head the scan began at: a later change was committed
/// while the version was being prepared, so its commit wrote its keys and references and the
/// catch-up gives it its slot. Without that bound a push rate above the scan's kept it from ever
/// ending.
#[tracing::instrument(name = "db.scope.prepare.read_batch", level = "debug", skip_all)]
pub async fn read_batch(db: &impl GenericClient, plan: &Plan) -> DbResult<Option<Batch>> {
    let Some(set) = set_version(db, plan.version).await? else { return Ok(None) };
    if set.state != "preparing" {
        return Ok(None);
    }
    let head = set.scan_head.ok_or_else(|| {
        DbError::Other(format!("scope set version {} is scanned before it began", set.version).into())
    })?;
    let after = set.scan_after.unwrap_or_default();
    let rows = db
        .query(
            "SELECT id, change_id, form_type, data FROM records
              WHERE id > $1 AND change_id <= $3 ORDER BY id LIMIT $2",
            &[&after, &BATCH, &head],
        )
        .await?;
    if rows.is_empty() {
        return Ok(None);
    }
    let mut records = Vec::with_capacity(rows.len());
    for row in &rows {
        let id: String = row.get(0);
        let (form_type, data): (&str, &str) = (row.get(2), row.get(3));
        let keys = plan.backfill.record_keys(form_type, data).map_err(|e| stored_data_error(&id, e))?;
        let refs = match plan.refs {
            true => attachment_refs(data).map_err(|e| stored_data_error(&id, e))?,
            false => Vec::new(),
        };
        records.push(Scanned { change_id: row.get(1), id, keys, refs });
    }
    Ok(Some(Batch { after, records }))
}

/// How far a chunk's write went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkWrite {
    /// Its first `n` (at least one) records were written and the scan moved past them: all of
    /// them, or up to a record an unfinished commit holds (the caller reads again from there).
    Written(usize),
    /// Nothing was written, since a commit holds its first record or a row it had to write: the
    /// caller rolls back and reads again a little later.
    Held,
    /// The scan moved under the reader (a repository reset started it again, or the version was
    /// replaced): nothing was written, and the caller reads again.
    Moved,
}

/// How long a chunk waits for a row lock before it gives way. A commit writes the key rows of the
/// records it updates before it updates them, so one that comes to a record a chunk has locked
/// while the chunk waits for its key rows is a deadlock; giving way long before PostgreSQL's
/// deadlock check (after a second), the chunk is the one to roll back, never the commit.
const CHUNK_LOCK_TIMEOUT_SQL: &str = "SET LOCAL lock_timeout = '50ms'";

/// Writes what [`read_batch`] computed for `chunk` (the next records after the scan's position, in
/// its order) and moves the position past them. A record changed since it was read is left alone:
/// its commit wrote the new families' keys and references itself (every commit since the version
/// was stored does), and the catch-up gives it its slot.
///
/// Without the change-log lock: each record is locked `FOR SHARE` as it is checked, so a commit
/// that has not changed it yet cannot until this chunk is written (it then writes keys over these,
/// at its later change_id), and one that has changed it and not finished holds its row, which is
/// skipped rather than waited for (waiting, the scan and commits updating the same records locked
/// each other: docs/architecture.md). The write stops before the first record skipped so, and the
/// scan's position with it; the caller reads again from there, when that commit has finished.
/// Holding the change-log lock instead, a chunk's writes and commit made every push wait (the
/// push p99 during a preparation: docs/benchmarks-history.md). The set's row is locked first,
/// so a reset or a replacement of the version waits for the chunk, or the chunk sees it.
#[tracing::instrument(name = "db.scope.prepare.write_chunk", level = "debug", skip_all)]
pub async fn write_chunk(
    tx: &Transaction<'_>,
    plan: &Plan,
    chunk: &[Scanned],
    after: &str,
) -> DbResult<ChunkWrite> {
    tx.batch_execute(CHUNK_LOCK_TIMEOUT_SQL).await?;
    match write_locked(tx, plan, chunk, after).await {
        Err(e) if e.is_lock_timeout() => Ok(ChunkWrite::Held),
        written => written,
    }
}

async fn write_locked(
    tx: &Transaction<'_>,
    plan: &Plan,
    chunk: &[Scanned],
    after: &str,
) -> DbResult<ChunkWrite> {
    let locked = tx
        .query_opt(
            "SELECT state, scan_head IS NOT NULL, coalesce(scan_after, ''), slots FROM scope_sets
              WHERE version = $1 FOR UPDATE",
            &[&plan.version],
        )
        .await?;
    let Some(set) = locked else { return Ok(ChunkWrite::Moved) };
    let (state, began, scan_after, slots): (String, bool, String, i64) =
        (set.get(0), set.get(1), set.get(2), set.get(3));
    if state != "preparing" || !began || scan_after != after {
        return Ok(ChunkWrite::Moved);
    }
    let read_ids: Vec<&str> = chunk.iter().map(|r| r.id.as_str()).collect();
    let free: std::collections::HashMap<String, i64> = tx
        .query(
            "SELECT r.id, r.change_id FROM records r WHERE r.id = ANY($1) FOR SHARE OF r SKIP LOCKED",
            &[&read_ids],
        )
        .await?
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    // Records are deleted only by a reset, which then moves the scan: a missing one is held.
    let held = chunk.iter().position(|r| !free.contains_key(&r.id)).unwrap_or(chunk.len());
    let chunk = &chunk[..held];
    let Some(last) = chunk.last() else { return Ok(ChunkWrite::Held) };
    let current: Vec<&Scanned> = chunk.iter().filter(|r| free.get(&r.id) == Some(&r.change_id)).collect();
    let ids: Vec<&str> = current.iter().map(|r| r.id.as_str()).collect();
    if !plan.backfill.is_empty() {
        let (mut keys, mut key_records, mut key_changes) = (Vec::new(), Vec::new(), Vec::new());
        for record in &current {
            for key in &record.keys {
                keys.push(key.as_str());
                key_records.push(record.id.as_str());
                key_changes.push(record.change_id);
            }
        }
        let families: Vec<&str> = plan.backfill.family_ids().collect();
        // Rows of these families left by an earlier preparation that was replaced may be stale;
        // the records are unchanged since they were read (and locked), so what was computed is
        // their state.
        // Planned from statistics, this delete scanned the whole table in the first chunks of a
        // preparation (before its first analysis, the table filling by thousands of rows a
        // second): 30-40 ms a chunk, then under the change-log lock, which pushes waited behind
        // for up to 250 ms (docs/benchmarks-history.md, "Scoped sync's cost: sixth measurement").
        // As in a commit, it probes the index per record at any size; only it: planned so, the
        // slots' statement below reads every slot of the version for each chunk.
        tx.batch_execute(INDEX_PROBES_ONLY_SQL).await?;
        tx.execute(
            "DELETE FROM scope_rows s USING unnest($1::text[]) AS b(id)
             WHERE s.record_id = b.id AND split_part(s.key, '=', 1) = ANY($2)
               AND NOT EXISTS (SELECT 1 FROM unnest($3::text[], $4::text[]) AS k(key, record_id)
                               WHERE k.key = s.key AND k.record_id = s.record_id)",
            &[&ids, &families, &keys, &key_records],
        )
        .await?;
        tx.batch_execute(INDEX_PROBES_ONLY_RESET_SQL).await?;
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
        let (mut refs, mut ref_records) = (Vec::new(), Vec::new());
        for record in &current {
            for attachment in &record.refs {
                refs.push(attachment.as_str());
                ref_records.push(record.id.as_str());
            }
        }
        tx.execute("DELETE FROM attachment_refs WHERE record_id = ANY($1)", &[&ids]).await?;
        tx.execute(
            "INSERT INTO attachment_refs (attachment_id, record_id)
             SELECT * FROM unnest($1::text[], $2::text[]) ON CONFLICT DO NOTHING",
            &[&refs, &ref_records],
        )
        .await?;
    }
    let slots = assign_slots(tx, plan, &ids, slots).await?;
    tx.execute(
        "UPDATE scope_sets SET scan_after = $2, scanned = scanned + $3, slots = $4 WHERE version = $1",
        &[&plan.version, &last.id, &(chunk.len() as i64), &slots],
    )
    .await?;
    Ok(ChunkWrite::Written(chunk.len()))
}

fn stored_data_error(id: &str, error: serde_json::Error) -> DbError {
    DbError::Other(format!("record {id}: stored data is not JSON: {error}").into())
}

/// Gives each of `ids` that is in a touched bucket a slot in the version's redelivery (keeping
/// the slot a record already has) and lists it under each touched key it is in. Returns the
/// number of slots handed out so far.
async fn assign_slots(tx: &Transaction<'_>, plan: &Plan, ids: &[&str], slots: i64) -> DbResult<i64> {
    if plan.touched.is_nothing() || ids.is_empty() {
        return Ok(slots);
    }
    let (all, families) = (plan.touched.every_record(), plan.touched.families());
    let row = tx
        .query_one(
            "WITH keys AS (
                 SELECT record_id, key FROM scope_rows
                  WHERE record_id = ANY($2) AND split_part(key, '=', 1) = ANY($4)
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
    let ids: Vec<&str> = rows.iter().map(|row| row.get(0)).collect();
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
    // Every user's keys start now, so no manifest reads the uploads written under the old ones.
    tx.execute("DELETE FROM scope_uploads", &[]).await?;
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
        if new_rules.is_some() {
            tx.execute(
                "INSERT INTO scope_user_keys (username, keys, since)
                 VALUES ($1, $2, (SELECT head FROM change_head))",
                &[&user.username, &new.stored_keys()],
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tables_are_analyzed_each_time_the_scan_doubles() {
        let mut statistics = Statistics::default();
        let due: Vec<usize> =
            (1..=10_000).filter(|_| statistics.due_after(1_000)).map(|n| n * 1_000).collect();
        let doublings: Vec<usize> = (0..14).map(|k| 1_000 << k).collect();
        assert_eq!(due, doublings, "from the first batch on, up to 8,192,000");
        let mut uneven = Statistics::default();
        assert!(!uneven.due_after(999));
        assert!(uneven.due_after(700), "the mark is reached within a batch");
        assert!(!uneven.due_after(1_000));
        assert!(uneven.due_after(1_000), "next at twice 1,699");
    }
}
