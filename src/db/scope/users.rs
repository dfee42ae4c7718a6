//! A user's keys follow their role and attributes: written with every change of either, in the
//! transaction that makes the change, under the change-log lock (so a pull sees the user's keys
//! and the redelivery that goes with them together, and never one without the other).

use deadpool_postgres::GenericClient;

use crate::db::records::CHANGELOG_LOCK;
use crate::db::scope::prepare::take_block;
use crate::db::DbResult;
use crate::domain::scope::{changed_keys, UserFacts, Visibility, ALL};

/// What a change of one user's role or attributes did to what they receive.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserScopeChange {
    /// Records sent to the user's devices again (live or as tombstones).
    pub redelivered: i64,
}

/// Writes `after`'s keys and, when the buckets the user holds changed, a redelivery of every
/// record in them. `before` is `None` for a new user.
#[tracing::instrument(name = "db.scope.users.apply", level = "debug", skip_all)]
pub async fn apply(
    db: &impl GenericClient,
    before: Option<&UserFacts>,
    after: &UserFacts,
) -> DbResult<UserScopeChange> {
    db.execute("SELECT pg_advisory_xact_lock($1)", &[&CHANGELOG_LOCK]).await?;
    let state = crate::db::scope::state(db).await?;
    let active = crate::db::scope::rules_of(db, state.active_version).await?;
    let new = Visibility::of(active.as_deref(), after);
    // With no set in force the scope tables stay empty (docs/architecture.md, "Scoped sync").
    if active.is_none() {
        db.execute("DELETE FROM scope_user_keys WHERE username = $1", &[&after.username]).await?;
    } else {
        db.execute(
            "INSERT INTO scope_user_keys (username, keys, since)
             VALUES ($1, $2, (SELECT head FROM change_head))
             ON CONFLICT (username) DO UPDATE SET keys = EXCLUDED.keys,
                 since = CASE WHEN scope_user_keys.keys = EXCLUDED.keys THEN scope_user_keys.since
                              ELSE EXCLUDED.since END",
            &[&after.username, &new.stored_keys()],
        )
        .await?;
    }
    let Some(before) = before else { return Ok(UserScopeChange::default()) };
    let old = Visibility::of(active.as_deref(), before);
    let changed: Vec<String> = changed_keys(&old, &new).into_iter().collect();
    if changed.is_empty() {
        return Ok(UserScopeChange::default());
    }
    let event: i64 = db.query_one("INSERT INTO scope_events DEFAULT VALUES RETURNING id", &[]).await?.get(0);
    let size: i64 = if changed.iter().any(|key| key == ALL) {
        db.query_one(
            "WITH inserted AS (
                 INSERT INTO scope_event_slots (event_id, key, slot, record_id)
                 SELECT $1, $2, row_number() OVER (ORDER BY id), id FROM records
                 RETURNING 1)
             SELECT count(*) FROM inserted",
            &[&event, &ALL],
        )
        .await?
        .get(0)
    } else {
        db.query_one(
            "WITH numbered AS (
                 SELECT record_id, row_number() OVER (ORDER BY record_id) AS slot
                   FROM (SELECT DISTINCT record_id FROM scope_rows WHERE key = ANY($2)) d
             ), inserted AS (
                 INSERT INTO scope_event_slots (event_id, key, slot, record_id)
                 SELECT $1, r.key, n.slot, r.record_id FROM scope_rows r JOIN numbered n USING (record_id)
                  WHERE r.key = ANY($2)
             )
             SELECT count(*) FROM numbered",
            &[&event, &changed],
        )
        .await?
        .get(0)
    };
    take_block(db, event, size).await?;
    if size > 0 {
        db.execute(
            "INSERT INTO scope_event_users (username, event_id, keys) VALUES ($1, $2, $3)",
            &[&after.username, &event, &changed],
        )
        .await?;
    }
    Ok(UserScopeChange { redelivered: size })
}
