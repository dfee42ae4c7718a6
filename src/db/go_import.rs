//! SQL of the import's target side (docs/api.md §19.2): the emptiness check, batched inserts of
//! what the source held with its versions as change_ids, and the head. Everything runs in the
//! caller's one transaction, so a failure leaves the target as it was.

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;

use crate::db::record_row::{self, JsonColumn, Row, Rows};
use crate::db::DbResult;

/// What the target already holds.
#[derive(Debug, Clone, Default)]
pub struct TargetState {
    pub records: i64,
    pub revisions: i64,
    pub attachments: i64,
    pub tombstones: i64,
    pub bundle_versions: i64,
    pub head: i64,
    pub usernames: Vec<String>,
    /// Versions of the scope set: records imported under one would get no keys.
    pub scope_versions: i64,
}

/// `None` when the schema is not there yet (a dry run against a database never migrated).
#[tracing::instrument(name = "db.go_import.target_state", level = "debug", skip_all)]
pub async fn target_state(db: &impl GenericClient) -> DbResult<Option<TargetState>> {
    let migrated: bool =
        db.query_one("SELECT to_regclass('attachment_tombstones') IS NOT NULL", &[]).await?.get(0);
    if !migrated {
        return Ok(None);
    }
    let r = db
        .query_one(
            "SELECT (SELECT count(*) FROM records), (SELECT count(*) FROM record_revisions),
                    (SELECT count(*) FROM attachments), (SELECT count(*) FROM attachment_tombstones),
                    (SELECT count(*) FROM bundle_versions), (SELECT head FROM change_head),
                    (SELECT coalesce(array_agg(username ORDER BY username), '{}') FROM users)",
            &[],
        )
        .await?;
    let scoped: bool = db.query_one("SELECT to_regclass('scope_sets') IS NOT NULL", &[]).await?.get(0);
    let scope_versions: i64 =
        if scoped { db.query_one("SELECT count(*) FROM scope_sets", &[]).await?.get(0) } else { 0 };
    Ok(Some(TargetState {
        scope_versions,
        records: r.get(0),
        revisions: r.get(1),
        attachments: r.get(2),
        tombstones: r.get(3),
        bundle_versions: r.get(4),
        head: r.get(5),
        usernames: r.get(6),
    }))
}

/// Removes the bootstrap admin (and, by cascade, its tokens and presence): the source's users
/// replace it.
#[tracing::instrument(name = "db.go_import.remove_users", level = "debug", skip_all)]
pub async fn remove_users(db: &impl GenericClient) -> DbResult<()> {
    db.batch_execute("DELETE FROM revoked_tokens; DELETE FROM users;").await?;
    Ok(())
}

pub struct NewUser {
    pub id: uuid::Uuid,
    pub username: String,
    pub password_hash: String,
    pub role: &'static str,
    pub created_at: DateTime<Utc>,
}

#[tracing::instrument(name = "db.go_import.insert_users", level = "debug", skip_all)]
pub async fn insert_users(db: &impl GenericClient, users: &[NewUser]) -> DbResult<()> {
    let ids: Vec<uuid::Uuid> = users.iter().map(|u| u.id).collect();
    let names: Vec<&str> = users.iter().map(|u| u.username.as_str()).collect();
    let hashes: Vec<&str> = users.iter().map(|u| u.password_hash.as_str()).collect();
    let roles: Vec<&str> = users.iter().map(|u| u.role).collect();
    let created: Vec<DateTime<Utc>> = users.iter().map(|u| u.created_at).collect();
    db.execute(
        "INSERT INTO users (id, username, password_hash, role, created_at)
         SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::timestamptz[])",
        &[&ids, &names, &hashes, &roles, &created],
    )
    .await?;
    Ok(())
}

/// A record as imported: its current state only (the Go server keeps no history).
pub struct NewRecord {
    pub id: String,
    pub form_type: String,
    pub form_version: String,
    pub data: String,
    pub deleted: bool,
    pub created_at: Option<DateTime<Utc>>,
    pub updated_at: Option<DateTime<Utc>>,
    pub synced_at: DateTime<Utc>,
    pub geolocation: Option<String>,
    pub author: Option<String>,
    pub device_id: Option<String>,
    pub tags: Option<String>,
    pub change_id: i64,
}

/// One binary `COPY` per batch (about twice the rate of a multi-row insert), of the record row's
/// columns (`db::record_row`); the JSON columns go as the source's text: `data` is the text of the
/// source's `jsonb`, valid by construction, and PostgreSQL checks `geolocation` and `tags`.
#[tracing::instrument(name = "db.go_import.insert_records", level = "debug", skip_all)]
pub async fn insert_records(db: &tokio_postgres::Transaction<'_>, records: &[NewRecord]) -> DbResult<()> {
    let mut rows = Rows::with_capacity(records.len());
    for r in records {
        rows.push(Row {
            id: &r.id,
            form_type: &r.form_type,
            form_version: &r.form_version,
            data: &r.data,
            deleted: r.deleted,
            created_at: r.created_at,
            updated_at: r.updated_at,
            synced_at: r.synced_at,
            geolocation: r.geolocation.as_deref().map(JsonColumn::Text),
            author: r.author.as_deref(),
            device_id: r.device_id.as_deref(),
            tags: r.tags.as_deref().map(JsonColumn::Text),
            change_id: r.change_id,
            // The Go server keeps no provenance: what the columns default to.
            client_id: "",
            transmission_id: None,
            pushed_by: "",
            overwrote_version: None,
            conflict: false,
            created_by: r.author.as_deref().unwrap_or(""),
        });
    }
    let sink = db.copy_in(record_row::COPY_SQL.as_str()).await?;
    record_row::copy_rows(sink, std::iter::once(rows)).await
}

/// A current attachment (with its blob already in place) or, with `sha256: None`, a tombstone.
pub struct NewAttachment {
    pub id: String,
    pub sha256: Option<String>,
    pub size: i64,
    pub content_type: String,
    pub client_id: Option<String>,
    pub created_at: DateTime<Utc>,
    pub change_id: i64,
}

#[tracing::instrument(name = "db.go_import.insert_attachments", level = "debug", skip_all)]
pub async fn insert_attachments(db: &impl GenericClient, batch: &[NewAttachment]) -> DbResult<()> {
    let (current, deleted): (Vec<&NewAttachment>, Vec<&NewAttachment>) =
        batch.iter().partition(|a| a.sha256.is_some());
    let ids = |v: &[&NewAttachment]| v.iter().map(|a| a.id.clone()).collect::<Vec<String>>();
    let clients =
        |v: &[&NewAttachment]| v.iter().map(|a| a.client_id.clone()).collect::<Vec<Option<String>>>();
    let times = |v: &[&NewAttachment]| v.iter().map(|a| a.created_at).collect::<Vec<DateTime<Utc>>>();
    let change_ids = |v: &[&NewAttachment]| v.iter().map(|a| a.change_id).collect::<Vec<i64>>();
    if !current.is_empty() {
        let hashes: Vec<Option<String>> = current.iter().map(|a| a.sha256.clone()).collect();
        let sizes: Vec<i64> = current.iter().map(|a| a.size).collect();
        let types: Vec<&str> = current.iter().map(|a| a.content_type.as_str()).collect();
        db.execute(
            "INSERT INTO attachments (id, sha256, size, content_type, uploaded_by, client_id, created_at, change_id)
             SELECT i, h, s, t, '', c, ca, ch
             FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::timestamptz[], $7::bigint[])
                  AS u(i, h, s, t, c, ca, ch)",
            &[&ids(&current), &hashes, &sizes, &types, &clients(&current), &times(&current), &change_ids(&current)],
        )
        .await?;
    }
    if !deleted.is_empty() {
        db.execute(
            "INSERT INTO attachment_tombstones (id, client_id, deleted_at, change_id)
             SELECT * FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::bigint[])",
            &[&ids(&deleted), &clients(&deleted), &times(&deleted), &change_ids(&deleted)],
        )
        .await?;
    }
    Ok(())
}

/// Sets the head and the generation, and counts the statistics from the imported rows.
#[tracing::instrument(name = "db.go_import.finish", level = "debug", skip_all)]
pub async fn finish(db: &impl GenericClient, head: i64, generation: i64) -> DbResult<()> {
    db.execute("UPDATE change_head SET head = $1, repository_generation = $2", &[&head, &generation]).await?;
    super::stats::recount(db).await?;
    Ok(())
}

/// change_ids used twice across records, attachments and tombstones (a source whose versions
/// were not unique): at most `limit` of them.
#[tracing::instrument(name = "db.go_import.duplicate_change_ids", level = "debug", skip_all)]
pub async fn duplicate_change_ids(db: &impl GenericClient, limit: i64) -> DbResult<Vec<i64>> {
    let rows = db
        .query(
            "SELECT change_id FROM (SELECT change_id FROM records UNION ALL SELECT change_id FROM attachments
                                    UNION ALL SELECT change_id FROM attachment_tombstones) c
             GROUP BY change_id HAVING count(*) > 1 ORDER BY change_id LIMIT $1",
            &[&limit],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// Rows per kind in the target, for the final report.
#[derive(Debug, Clone, Default)]
pub struct TargetCounts {
    pub users: i64,
    pub records: i64,
    pub attachments: i64,
    pub tombstones: i64,
    pub bundle_versions: i64,
    pub presence: i64,
    pub head: i64,
    pub generation: i64,
    pub active_bundle: Option<String>,
}

#[tracing::instrument(name = "db.go_import.counts", level = "debug", skip_all)]
pub async fn counts(db: &impl GenericClient) -> DbResult<TargetCounts> {
    let r = db
        .query_one(
            "SELECT (SELECT count(*) FROM users), (SELECT count(*) FROM records),
                    (SELECT count(*) FROM attachments), (SELECT count(*) FROM attachment_tombstones),
                    (SELECT count(*) FROM bundle_versions), (SELECT count(*) FROM device_presence),
                    h.head, h.repository_generation, (SELECT version FROM bundle_active)
             FROM change_head h",
            &[],
        )
        .await?;
    Ok(TargetCounts {
        users: r.get(0),
        records: r.get(1),
        attachments: r.get(2),
        tombstones: r.get(3),
        bundle_versions: r.get(4),
        presence: r.get(5),
        head: r.get(6),
        generation: r.get(7),
        active_bundle: r.get(8),
    })
}
