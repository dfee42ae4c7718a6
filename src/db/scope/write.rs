//! What a commit writes for scoped sync, in its own transaction, while a set is in force or being
//! prepared: each written record's keys (and where it left a bucket), the attachments its data
//! names, and the tombstones addressed to a user whose update of a record outside their set was
//! refused; and each upload under the keys of the records that name it. Also the one read the
//! commit needs: which of a push's records its pusher may not touch.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use deadpool_postgres::GenericClient;

use crate::db::scope::read::holds_all_sql;
use crate::db::scope::{rules_of, ScopeState};
use crate::db::{DbError, DbResult};
use crate::domain::scope::refs::attachment_refs;
use crate::domain::scope::{KeyPlan, ScopeRules};
use crate::domain::sync::plan::{CurrentState, Decision, OutOfScope, Plan, Push};

/// The final state of each record a commit wrote: its id, the change_id it was written at, its
/// keys and the attachments it names, and whether it existed before the commit.
#[derive(Debug, Default)]
pub struct WrittenRecords {
    pub ids: Vec<String>,
    pub change_ids: Vec<i64>,
    pub existed: Vec<bool>,
    pub keys: Vec<Vec<String>>,
    pub refs: Vec<Vec<String>>,
}

impl WrittenRecords {
    pub fn push(&mut self, id: &str, change_id: i64, existed: bool, keys: Vec<String>, refs: Vec<String>) {
        self.ids.push(id.to_owned());
        self.change_ids.push(change_id);
        self.existed.push(existed);
        self.keys.push(keys);
        self.refs.push(refs);
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

/// Keys to write as columns: (key, record, change_id) rows.
#[derive(Default)]
struct KeyRows<'a> {
    keys: Vec<&'a str>,
    records: Vec<&'a str>,
    changes: Vec<i64>,
}

/// Writes the keys and references of `written`. A key the record has now is live at its
/// change_id; a key it had and lost is marked left at the same change_id (every key it has now was
/// just moved to that change_id, so the ones still older are exactly those it lost).
#[tracing::instrument(name = "db.scope.write.write", level = "debug", skip_all)]
pub async fn write(db: &impl GenericClient, written: &WrittenRecords) -> DbResult<()> {
    if written.is_empty() {
        return Ok(());
    }
    // A new record has no rows yet (nothing else writes keys of a record that does not exist), so
    // its keys are plain inserts, without the conflict check an upsert pays per row.
    let (mut new, mut stored) = (KeyRows::default(), KeyRows::default());
    let (mut refs, mut ref_records) = (Vec::new(), Vec::new());
    for (i, id) in written.ids.iter().enumerate() {
        let rows = if written.existed[i] { &mut stored } else { &mut new };
        for key in &written.keys[i] {
            rows.keys.push(key.as_str());
            rows.records.push(id.as_str());
            rows.changes.push(written.change_ids[i]);
        }
        for attachment in &written.refs[i] {
            refs.push(attachment.as_str());
            ref_records.push(id.as_str());
        }
    }
    if !new.keys.is_empty() {
        db.execute(
            "INSERT INTO scope_rows (key, record_id, change_id, live)
             SELECT key, record_id, change_id, true
               FROM unnest($1::text[], $2::text[], $3::int8[]) AS k(key, record_id, change_id)",
            &[&new.keys, &new.records, &new.changes],
        )
        .await?;
    }
    if !stored.keys.is_empty() {
        db.execute(
            "INSERT INTO scope_rows (key, record_id, change_id, live)
             SELECT key, record_id, change_id, true
               FROM unnest($1::text[], $2::text[], $3::int8[]) AS k(key, record_id, change_id)
             ON CONFLICT (key, record_id) DO UPDATE SET change_id = EXCLUDED.change_id, live = true
             WHERE scope_rows.change_id < EXCLUDED.change_id",
            &[&stored.keys, &stored.records, &stored.changes],
        )
        .await?;
    }
    let existing: Vec<(&str, i64)> = written
        .ids
        .iter()
        .zip(&written.change_ids)
        .zip(&written.existed)
        .filter(|(_, existed)| **existed)
        .map(|((id, change_id), _)| (id.as_str(), *change_id))
        .collect();
    if !existing.is_empty() {
        let (ids, changes): (Vec<&str>, Vec<i64>) = existing.into_iter().unzip();
        db.execute(
            "UPDATE scope_rows s SET live = false, change_id = u.change_id
               FROM unnest($1::text[], $2::int8[]) AS u(id, change_id)
              WHERE s.record_id = u.id AND s.live AND s.change_id < u.change_id",
            &[&ids, &changes],
        )
        .await?;
        // Every reference is marked dropped at the record's change, then the ones it still holds
        // are named again below: the dropped ones keep the change at which the record let go.
        db.execute(
            "UPDATE attachment_refs ar SET left_at = u.change_id
               FROM unnest($1::text[], $2::int8[]) AS u(id, change_id)
              WHERE ar.record_id = u.id AND ar.left_at IS NULL",
            &[&ids, &changes],
        )
        .await?;
    }
    if !refs.is_empty() {
        db.execute(
            "INSERT INTO attachment_refs (attachment_id, record_id)
             SELECT * FROM unnest($1::text[], $2::text[])
             ON CONFLICT (attachment_id, record_id) DO UPDATE SET left_at = NULL",
            &[&refs, &ref_records],
        )
        .await?;
    }
    Ok(())
}

/// Writes the upload of `attachment_id` at `change_id` under every live key of the records that
/// name it and under the personal key of each one's author, while a set is in force: the scoped
/// manifest reads a user's keys' uploads there (`scope::manifest`). Called in the upload's
/// transaction, under the change-log lock, so the set in force cannot switch in between.
#[tracing::instrument(name = "db.scope.write.note_upload", level = "debug", skip_all)]
pub async fn note_upload(db: &impl GenericClient, attachment_id: &str, change_id: i64) -> DbResult<()> {
    db.execute(
        "INSERT INTO scope_uploads (key, change_id, attachment_id)
         SELECT DISTINCT k.key, $2::int8, $1::text FROM (
             SELECT s.key FROM attachment_refs ar JOIN scope_rows s ON s.record_id = ar.record_id
              WHERE ar.attachment_id = $1 AND ar.left_at IS NULL AND s.live
             UNION ALL
             SELECT '@' || r.created_by FROM attachment_refs ar JOIN records r ON r.id = ar.record_id
              WHERE ar.attachment_id = $1 AND ar.left_at IS NULL) k
          WHERE (SELECT active_version FROM scope_state) > 0",
        &[&attachment_id, &change_id],
    )
    .await?;
    Ok(())
}

/// Addresses a tombstone of each refused record to its pusher alone, at the change_id the commit
/// gave the refusal: the device that tried to change it learns it may not hold it.
#[tracing::instrument(name = "db.scope.write.address_tombstones", level = "debug", skip_all)]
pub async fn address_tombstones(
    db: &impl GenericClient,
    usernames: &[&str],
    record_ids: &[&str],
    change_ids: &[i64],
) -> DbResult<()> {
    if record_ids.is_empty() {
        return Ok(());
    }
    db.execute(
        "INSERT INTO scope_rows (key, record_id, change_id, live)
         SELECT '@' || u, r, c, false FROM unnest($1::text[], $2::text[], $3::int8[]) AS t(u, r, c)
         ON CONFLICT (key, record_id) DO UPDATE SET change_id = EXCLUDED.change_id, live = false
         WHERE scope_rows.change_id < EXCLUDED.change_id",
        &[&usernames, &record_ids, &change_ids],
    )
    .await?;
    Ok(())
}

/// Of the stored records named by `(record_ids[i], pushers[i])`, those the pusher may not change:
/// they are neither theirs nor live in one of their buckets, and the pusher is not an admin.
/// Only meaningful while a set is in force; read after the change-log lock is held.
#[tracing::instrument(name = "db.scope.write.out_of_scope", level = "debug", skip_all)]
pub async fn out_of_scope(
    db: &impl GenericClient,
    record_ids: &[&str],
    pushers: &[&str],
) -> DbResult<Vec<(String, String)>> {
    if record_ids.is_empty() {
        return Ok(Vec::new());
    }
    let sql = format!(
        "SELECT DISTINCT p.id, p.pusher FROM unnest($1::text[], $2::text[]) AS p(id, pusher)
               JOIN records r ON r.id = p.id
               JOIN users u ON u.username = p.pusher
              WHERE u.role <> 'admin' AND r.created_by <> p.pusher AND NOT {holds_all}
                AND NOT EXISTS (SELECT 1 FROM scope_user_keys k, scope_rows s
                                 WHERE k.username = p.pusher AND s.key = ANY(k.keys)
                                   AND s.record_id = r.id AND s.live)",
        holds_all = holds_all_sql("p.pusher")
    );
    let rows = db.query(&sql, &[&record_ids, &pushers]).await?;
    Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
}

/// What a commit writes for scoped sync, as the versions in its base say: the key plan of the set
/// in force and of the one being prepared, and whether a set is in force (then updates outside a
/// pusher's set are refused).
pub struct CommitScope {
    pub keys: KeyPlan,
    pub enforce: bool,
}

/// The commit scope of the last versions a commit saw. A version's rules never change once
/// stored, so the pair of versions names its key plan: commits read the rules once per switch
/// instead of once per commit (a round trip on the commit's connection, which a push storm
/// waits for).
#[derive(Default)]
pub struct CommitScopes(Mutex<Option<(SetVersions, Arc<CommitScope>)>>);

/// The version in force (0: none) and the one being prepared.
type SetVersions = (i64, Option<i64>);

/// `None` when no set is in force or being prepared: the commit writes nothing for scopes.
pub async fn commit_scope(
    db: &impl GenericClient,
    state: ScopeState,
    known: &CommitScopes,
) -> DbResult<Option<Arc<CommitScope>>> {
    if state.active_version == 0 && state.preparing_version.is_none() {
        return Ok(None);
    }
    let versions = (state.active_version, state.preparing_version);
    // The cache holds a whole pair or nothing, so a lock poisoned by a panic elsewhere still
    // holds a consistent value.
    if let Some((seen, scope)) = known.0.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
        if *seen == versions {
            return Ok(Some(scope.clone()));
        }
    }
    let active = rules_of(db, state.active_version).await?;
    let preparing = match state.preparing_version {
        Some(version) => rules_of(db, version).await?,
        None => None,
    };
    // The families of both sets: a record written while a set is prepared already has the keys
    // it will need, so the preparation never misses it.
    let mut families = active.as_deref().map(ScopeRules::families).unwrap_or_default();
    families.extend(preparing.as_deref().map(ScopeRules::families).unwrap_or_default());
    let scope = Arc::new(CommitScope { keys: KeyPlan::new(&families), enforce: state.active_version > 0 });
    *known.0.lock().unwrap_or_else(|e| e.into_inner()) = Some((versions, scope.clone()));
    Ok(Some(scope))
}

/// The stored records of the applied pushes that their pushers may not change (see
/// [`out_of_scope`]), as the plan takes them.
pub async fn out_of_scope_of(
    db: &impl GenericClient,
    pushes: &[&Push],
    decisions: &[Decision],
    stored: &HashMap<String, CurrentState>,
) -> DbResult<OutOfScope> {
    let (mut ids, mut pushers) = (Vec::new(), Vec::new());
    for (push, decision) in pushes.iter().zip(decisions) {
        if !matches!(decision, Decision::Apply) {
            continue;
        }
        for record in push.records.iter().filter(|r| stored.contains_key(r.id())) {
            ids.push(record.id());
            pushers.push(push.pushed_by.as_str());
        }
    }
    Ok(out_of_scope(db, &ids, &pushers).await?.into_iter().map(|(id, pusher)| (pusher, id)).collect())
}

/// Writes the keys and attachment references of the records the plan leaves current, and the
/// tombstones of its refusals; nothing without a scope (no set in force or being prepared). The
/// commit runs it beside the records' writes on the same connection, so its statements follow
/// theirs without waiting for their answers.
pub async fn write_plan(
    db: &impl GenericClient,
    scope: Option<&CommitScope>,
    plan: &Plan<'_>,
    stored: &HashMap<String, CurrentState>,
) -> DbResult<()> {
    let Some(scope) = scope else { return Ok(()) };
    let mut superseded = vec![false; plan.revision_count()];
    for &i in &plan.superseded_in_batch {
        superseded[i] = true;
    }
    let mut written = WrittenRecords::default();
    for (revision, _) in plan.revisions().zip(&superseded).filter(|(_, superseded)| !**superseded) {
        let id = revision.record.id();
        let data = revision.data;
        let unreadable =
            |e: serde_json::Error| DbError::Other(format!("record {id}: data is not JSON: {e}").into());
        let keys = scope.keys.record_keys(revision.record.form_type(), data).map_err(unreadable)?;
        let refs = attachment_refs(data).map_err(unreadable)?;
        written.push(id, revision.change_id, stored.contains_key(id), keys, refs);
    }
    write(db, &written).await?;
    let pushers: Vec<&str> = plan.refusals.iter().map(|r| r.pushed_by).collect();
    let records: Vec<&str> = plan.refusals.iter().map(|r| r.record_id).collect();
    let changes: Vec<i64> = plan.refusals.iter().map(|r| r.change_id).collect();
    address_tombstones(db, &pushers, &records, &changes).await
}
