//! What every other reader of records asks (docs/api.md §20.4): may this user see this record, or
//! this attachment, now. Each question is one statement, so it is answered in one snapshot.

use std::sync::LazyLock;

use deadpool_postgres::GenericClient;

use crate::db::DbResult;
use crate::domain::scope::ALL;

/// SQL that is true when the user `$user` sees everything: no set in force, an admin, or a user
/// of a rule without `where` over every form type (their stored keys are `*` alone). Other
/// statements embed it with their own parameter number.
pub fn sees_all_sql(user: &str) -> String {
    format!(
        "((SELECT active_version FROM scope_state) = 0
          OR coalesce((SELECT role = 'admin' FROM users WHERE username = {user}), false)
          OR {holds_all})",
        holds_all = holds_all_sql(user)
    )
}

/// SQL that is true when the set in force gives `$user` everything through a rule (see
/// `Visibility::stored_keys`).
pub fn holds_all_sql(user: &str) -> String {
    format!("coalesce((SELECT '{ALL}' = ANY(keys) FROM scope_user_keys WHERE username = {user}), false)")
}

/// SQL that is true when `$user`'s read after the cursor `{after}` must take the scoped path
/// (`scope::pull`, `scope::manifest`): they do not see everything, or a redelivery addressed to
/// them lies after the cursor (a device pulling from 0 has nothing to redeliver).
pub fn reads_scoped_sql(user: &str, after: &str) -> String {
    format!(
        "(NOT {sees_all} OR EXISTS (
             SELECT 1 FROM scope_event_users eu JOIN scope_events e ON e.id = eu.event_id
              WHERE eu.username = {user} AND e.base IS NOT NULL AND e.base + e.size > {after} AND {after} > 0))",
        sees_all = sees_all_sql(user)
    )
}

/// SQL that is true when the user `$user` may see the record `{record}` (a row alias of
/// `records`) now: everything (see [`sees_all_sql`]), their own record, or live in one of their
/// buckets.
pub fn visible_sql(record: &str, user: &str) -> String {
    format!(
        "({sees_all} OR {record}.created_by = {user} OR EXISTS (
             SELECT 1 FROM scope_user_keys k, scope_rows s
              WHERE k.username = {user} AND s.key = ANY(k.keys) AND s.record_id = {record}.id AND s.live))",
        sees_all = sees_all_sql(user)
    )
}

/// True when `username` sees every record (no set in force, or an admin).
#[tracing::instrument(name = "db.scope.read.sees_all", level = "debug", skip_all)]
pub async fn sees_all(db: &impl GenericClient, username: &str) -> DbResult<bool> {
    let sql = format!("SELECT {}", sees_all_sql("$1"));
    Ok(db.query_one(&sql, &[&username]).await?.get(0))
}

/// True while a scope set is in force.
#[tracing::instrument(name = "db.scope.read.is_scoped", level = "debug", skip_all)]
pub async fn is_scoped(db: &impl GenericClient) -> DbResult<bool> {
    Ok(db.query_one("SELECT active_version > 0 FROM scope_state", &[]).await?.get(0))
}

/// True when the record exists and `username` may see it now.
#[tracing::instrument(name = "db.scope.read.record_visible", level = "debug", skip_all)]
pub async fn record_visible(db: &impl GenericClient, username: &str, record_id: &str) -> DbResult<bool> {
    let sql = format!("SELECT {} FROM records r WHERE r.id = $2", visible_sql("r", "$1"));
    Ok(db.query_opt(&sql, &[&username, &record_id]).await?.is_some_and(|row| row.get(0)))
}

/// SQL that is true when `$user` may download the attachment `{attachment}` (an alias of
/// `attachments`): everything visible, their own upload, or named by a record they may see.
pub fn attachment_visible_sql(attachment: &str, user: &str) -> String {
    format!(
        "({sees_all} OR {attachment}.uploaded_by = {user} OR EXISTS (
             SELECT 1 FROM attachment_refs ar JOIN records r ON r.id = ar.record_id
              WHERE ar.attachment_id = {attachment}.id AND ar.left_at IS NULL AND {visible}))",
        sees_all = sees_all_sql(user),
        visible = visible_sql("r", user)
    )
}

/// True when the attachment exists and `username` may download it now.
#[tracing::instrument(name = "db.scope.read.attachment_visible", level = "debug", skip_all)]
pub async fn attachment_visible(
    db: &impl GenericClient,
    username: &str,
    attachment_id: &str,
) -> DbResult<bool> {
    // Built once and prepared once per connection: every download under a set asks.
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!("SELECT {} FROM attachments a WHERE a.id = $2", attachment_visible_sql("a", "$1"))
    });
    let statement = db.prepare_cached(&SQL).await?;
    Ok(db.query_opt(&statement, &[&username, &attachment_id]).await?.is_some_and(|row| row.get(0)))
}

/// Live records by form type that a user with `keys` receives (their own included), or every
/// live record when `keys` is `None`: the preview of docs/api.md §20.2. Read along the keys'
/// rows and the author's records, so it costs what the user receives.
#[tracing::instrument(name = "db.scope.read.visible_counts", level = "debug", skip_all)]
pub async fn visible_counts(
    db: &impl GenericClient,
    username: &str,
    keys: Option<&[String]>,
) -> DbResult<std::collections::BTreeMap<String, i64>> {
    let rows = match keys {
        None => {
            db.query("SELECT form_type, count(*) FROM records WHERE NOT deleted GROUP BY form_type", &[])
                .await?
        }
        Some(keys) => {
            db.query(
                "WITH ids AS (
                     SELECT id FROM records WHERE created_by = $1
                     UNION
                     SELECT record_id FROM scope_rows WHERE key = ANY($2) AND live)
                 SELECT r.form_type, count(*) FROM ids JOIN records r USING (id)
                  WHERE NOT r.deleted GROUP BY r.form_type",
                &[&username, &keys],
            )
            .await?
        }
    };
    Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
}
