//! SQL for device presence.

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;

use crate::db::DbResult;

pub struct PresenceUpsert {
    pub username: String,
    pub client_id: String,
    pub last_seen_at: DateTime<Utc>,
    pub last_data_version: Option<i64>,
    pub app_bundle_version: Option<String>,
    pub client_version: Option<String>,
}

/// One statement for the whole batch; rows of users deleted meanwhile are skipped.
#[tracing::instrument(name = "db.presence.upsert_many", level = "debug", skip_all)]
pub async fn upsert_many(db: &impl GenericClient, batch: &[PresenceUpsert]) -> DbResult<()> {
    let usernames: Vec<&str> = batch.iter().map(|p| p.username.as_str()).collect();
    let client_ids: Vec<&str> = batch.iter().map(|p| p.client_id.as_str()).collect();
    let seen: Vec<DateTime<Utc>> = batch.iter().map(|p| p.last_seen_at).collect();
    let versions: Vec<Option<i64>> = batch.iter().map(|p| p.last_data_version).collect();
    let bundles: Vec<Option<&str>> = batch.iter().map(|p| p.app_bundle_version.as_deref()).collect();
    let clients: Vec<Option<&str>> = batch.iter().map(|p| p.client_version.as_deref()).collect();
    db.execute(
        "INSERT INTO device_presence (username, client_id, last_seen_at, last_data_version, app_bundle_version, client_version)
         SELECT u.* FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::bigint[], $5::text[], $6::text[])
              AS u(username, client_id, seen, version, bundle, client)
         WHERE EXISTS (SELECT 1 FROM users WHERE users.username = u.username)
         ON CONFLICT (username, client_id) DO UPDATE SET
             last_seen_at = GREATEST(device_presence.last_seen_at, EXCLUDED.last_seen_at),
             last_data_version = COALESCE(EXCLUDED.last_data_version, device_presence.last_data_version),
             app_bundle_version = COALESCE(EXCLUDED.app_bundle_version, device_presence.app_bundle_version),
             client_version = COALESCE(EXCLUDED.client_version, device_presence.client_version)",
        &[&usernames, &client_ids, &seen, &versions, &bundles, &clients],
    )
    .await?;
    Ok(())
}

#[derive(Debug, Clone)]
pub struct DeviceRow {
    pub username: String,
    pub client_id: String,
    pub last_seen_at: DateTime<Utc>,
    pub last_data_version: Option<i64>,
    pub app_bundle_version: Option<String>,
    pub client_version: Option<String>,
}

/// Devices, optionally of one user and/or last seen before `seen_before` (the caller's clock,
/// which also stamped the sightings), by last sighting.
#[tracing::instrument(name = "db.presence.list", level = "debug", skip_all)]
pub async fn list(
    db: &impl GenericClient,
    username: Option<&str>,
    seen_before: Option<DateTime<Utc>>,
) -> DbResult<(i64, Vec<DeviceRow>)> {
    let rows = db
        .query(
            "SELECT (SELECT head FROM change_head), username, client_id, last_seen_at, last_data_version,
                    app_bundle_version, client_version
             FROM device_presence
             WHERE ($1::text IS NULL OR username = $1)
               AND ($2::timestamptz IS NULL OR last_seen_at < $2)
             ORDER BY last_seen_at DESC, username, client_id",
            &[&username, &seen_before],
        )
        .await?;
    let head = match rows.first() {
        Some(r) => r.get(0),
        None => crate::db::records::head(db).await?,
    };
    Ok((
        head,
        rows.iter()
            .map(|r| DeviceRow {
                username: r.get(1),
                client_id: r.get(2),
                last_seen_at: r.get(3),
                last_data_version: r.get(4),
                app_bundle_version: r.get(5),
                client_version: r.get(6),
            })
            .collect(),
    ))
}

/// Every device row, for attaching presence to the user list.
#[tracing::instrument(name = "db.presence.all_by_user", level = "debug", skip_all)]
pub async fn all_by_user(
    db: &impl GenericClient,
) -> DbResult<std::collections::HashMap<String, Vec<DeviceRow>>> {
    let (_, rows) = list(db, None, None).await?;
    let mut by_user: std::collections::HashMap<String, Vec<DeviceRow>> = std::collections::HashMap::new();
    for row in rows {
        by_user.entry(row.username.clone()).or_default().push(row);
    }
    Ok(by_user)
}
