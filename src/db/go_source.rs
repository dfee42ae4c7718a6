//! SQL against a Go Synkronus database, the import's source (docs/api.md §19.1). Only read, in
//! one `REPEATABLE READ READ ONLY` transaction; the big tables are streamed through portals in
//! batches so memory stays flat whatever their size.

use chrono::{DateTime, Utc};
use tokio_postgres::{Client, IsolationLevel, Portal, Transaction};

use crate::db::DbResult;
use crate::domain::go_import::SchemaFacts;

/// One connection to the source, its driver running on a task of its own.
#[tracing::instrument(name = "db.go_source.connect", level = "debug", skip_all)]
pub async fn connect(conn: &str) -> anyhow::Result<Client> {
    let config = super::parse_connection(conn).map_err(anyhow::Error::msg)?;
    let unix_only = config.get_hosts().iter().all(|h| matches!(h, tokio_postgres::config::Host::Unix(_)));
    let client = if unix_only {
        let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
        tokio::spawn(connection);
        client
    } else {
        let (client, connection) = config.connect(super::tls::make_connector()?).await?;
        tokio::spawn(connection);
        client
    };
    // `timestamp` columns (the Go users table) are then read as UTC.
    client.batch_execute("SET TIME ZONE 'UTC'").await?;
    Ok(client)
}

/// The one snapshot everything is read from.
#[tracing::instrument(name = "db.go_source.snapshot", level = "debug", skip_all)]
pub async fn snapshot(client: &mut Client) -> DbResult<Transaction<'_>> {
    Ok(client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?)
}

#[tracing::instrument(name = "db.go_source.schema_facts", level = "debug", skip_all)]
pub async fn schema_facts(tx: &Transaction<'_>) -> DbResult<SchemaFacts> {
    let rows = tx
        .query(
            "SELECT table_name::text, column_name::text FROM information_schema.columns
             WHERE table_schema = current_schema()
               AND table_name IN ('users', 'observations', 'attachment_operations', 'sync_version',
                                  'user_client_presence')",
            &[],
        )
        .await?;
    let mut facts = SchemaFacts::default();
    for row in rows {
        let (table, column): (String, String) = (row.get(0), row.get(1));
        match (table.as_str(), column.as_str()) {
            ("users", _) => facts.has_users = true,
            ("observations", "author") => facts.has_author = true,
            ("observations", "device_id") => facts.has_device_id = true,
            ("observations", "tags") => facts.has_tags = true,
            ("observations", _) => facts.has_observations = true,
            ("attachment_operations", _) => facts.has_attachment_operations = true,
            ("sync_version", "repository_generation") => facts.has_generation = true,
            ("sync_version", _) => facts.has_sync_version = true,
            ("user_client_presence", _) => facts.has_presence = true,
            _ => {}
        }
    }
    Ok(facts)
}

/// The counter's last value and the repository generation (1 when the source has none).
#[tracing::instrument(name = "db.go_source.counter", level = "debug", skip_all)]
pub async fn counter(db: &impl tokio_postgres::GenericClient, facts: &SchemaFacts) -> DbResult<(i64, i64)> {
    let generation = if facts.has_generation { "coalesce(repository_generation, 1)" } else { "1" };
    let sql =
        format!("SELECT coalesce(current_version, 0), {generation}::bigint FROM sync_version WHERE id = 1");
    Ok(db.query_opt(&sql, &[]).await?.map(|r| (r.get(0), r.get(1))).unwrap_or((0, 1)))
}

/// Rows per kind, and the highest version used, as the source holds them.
#[derive(Debug, Clone, Default)]
pub struct SourceCounts {
    pub users: i64,
    pub observations: i64,
    /// Attachments whose latest operation is a create or update.
    pub attachments: i64,
    /// Attachments whose latest operation is a delete.
    pub deleted_attachments: i64,
    pub presence: i64,
    pub highest_version: i64,
}

#[tracing::instrument(name = "db.go_source.counts", level = "debug", skip_all)]
pub async fn counts(tx: &Transaction<'_>, facts: &SchemaFacts) -> DbResult<SourceCounts> {
    let presence =
        if facts.has_presence { "(SELECT count(*) FROM user_client_presence)" } else { "0::bigint" };
    let sql = format!(
        "WITH latest AS ({LATEST_OPERATIONS})
         SELECT (SELECT count(*) FROM users), (SELECT count(*) FROM observations),
                (SELECT count(*) FROM latest WHERE operation <> 'delete'),
                (SELECT count(*) FROM latest WHERE operation = 'delete'),
                {presence},
                greatest((SELECT max(version) FROM observations), (SELECT max(version) FROM latest), 0)::bigint"
    );
    let r = tx.query_one(&sql, &[]).await?;
    Ok(SourceCounts {
        users: r.get(0),
        observations: r.get(1),
        attachments: r.get(2),
        deleted_attachments: r.get(3),
        presence: r.get(4),
        highest_version: r.get(5),
    })
}

/// Each attachment's latest operation (the Go manifest's own rule: the highest version wins).
const LATEST_OPERATIONS: &str = "SELECT DISTINCT ON (attachment_id) attachment_id::text, operation::text,
        client_id::text, version, size::bigint, content_type::text, created_at::timestamptz
    FROM attachment_operations ORDER BY attachment_id, version DESC NULLS LAST, id DESC";

#[derive(Debug, Clone)]
pub struct GoUser {
    pub id: Option<uuid::Uuid>,
    pub username: String,
    pub password_hash: String,
    pub role: String,
    pub created_at: Option<DateTime<Utc>>,
}

/// Opens the users stream (by username).
#[tracing::instrument(name = "db.go_source.users", level = "debug", skip_all)]
pub async fn users(tx: &Transaction<'_>) -> DbResult<Portal> {
    let sql = "SELECT id::text, username::text, coalesce(password_hash, '')::text, coalesce(role, '')::text,
                      created_at::timestamptz FROM users ORDER BY username";
    Ok(tx.bind(sql, &[]).await?)
}

#[tracing::instrument(name = "db.go_source.next_users", level = "debug", skip_all)]
pub async fn next_users(tx: &Transaction<'_>, portal: &Portal, n: i32) -> DbResult<Vec<GoUser>> {
    let rows = tx.query_portal(portal, n).await?;
    Ok(rows
        .iter()
        .map(|r| GoUser {
            id: r.get::<_, Option<String>>(0).and_then(|id| id.parse().ok()),
            username: r.get(1),
            password_hash: r.get(2),
            role: r.get(3),
            created_at: r.get(4),
        })
        .collect())
}

/// One observation as the Go server stores it; JSON columns as text.
#[derive(Debug, Clone)]
pub struct GoObservation {
    pub id: String,
    pub form_type: String,
    pub form_version: String,
    pub data: String,
    pub created_at: Option<DateTime<Utc>>,
    pub updated_at: Option<DateTime<Utc>>,
    pub synced_at: Option<DateTime<Utc>>,
    pub deleted: bool,
    pub version: Option<i64>,
    pub geolocation: Option<String>,
    pub author: Option<String>,
    pub device_id: Option<String>,
    pub tags: Option<String>,
}

/// Opens the observations stream, in version order. `tags` may be a text array or jsonb:
/// `to_json` gives the same JSON array for both.
#[tracing::instrument(name = "db.go_source.observations", level = "debug", skip_all)]
pub async fn observations(tx: &Transaction<'_>, facts: &SchemaFacts) -> DbResult<Portal> {
    let optional =
        |present: bool, expr: &str| if present { expr.to_string() } else { "NULL::text".to_string() };
    let sql = format!(
        "SELECT observation_id::text, coalesce(form_type, '')::text, coalesce(form_version, '')::text,
                coalesce(data, 'null'::jsonb)::text, created_at::timestamptz, updated_at::timestamptz,
                synced_at::timestamptz, coalesce(deleted, false), version, geolocation::text, {}, {}, {}
         FROM observations ORDER BY version",
        optional(facts.has_author, "author::text"),
        optional(facts.has_device_id, "device_id::text"),
        optional(facts.has_tags, "to_json(tags)::text"),
    );
    Ok(tx.bind(sql.as_str(), &[]).await?)
}

#[tracing::instrument(name = "db.go_source.next_observations", level = "debug", skip_all)]
pub async fn next_observations(
    tx: &Transaction<'_>,
    portal: &Portal,
    n: i32,
) -> DbResult<Vec<GoObservation>> {
    let rows = tx.query_portal(portal, n).await?;
    Ok(rows
        .iter()
        .map(|r| GoObservation {
            id: r.get(0),
            form_type: r.get(1),
            form_version: r.get(2),
            data: r.get(3),
            created_at: r.get(4),
            updated_at: r.get(5),
            synced_at: r.get(6),
            deleted: r.get(7),
            version: r.get(8),
            geolocation: r.get(9),
            author: r.get(10),
            device_id: r.get(11),
            tags: r.get(12),
        })
        .collect())
}

/// An attachment's latest operation.
#[derive(Debug, Clone)]
pub struct GoAttachment {
    pub id: String,
    pub operation: String,
    pub client_id: Option<String>,
    pub version: Option<i64>,
    pub size: Option<i64>,
    pub content_type: Option<String>,
    pub created_at: Option<DateTime<Utc>>,
}

/// Opens the stream of each attachment's latest operation, in version order.
#[tracing::instrument(name = "db.go_source.attachments", level = "debug", skip_all)]
pub async fn attachments(tx: &Transaction<'_>) -> DbResult<Portal> {
    let sql = format!("SELECT * FROM ({LATEST_OPERATIONS}) latest ORDER BY version");
    Ok(tx.bind(sql.as_str(), &[]).await?)
}

#[tracing::instrument(name = "db.go_source.next_attachments", level = "debug", skip_all)]
pub async fn next_attachments(tx: &Transaction<'_>, portal: &Portal, n: i32) -> DbResult<Vec<GoAttachment>> {
    let rows = tx.query_portal(portal, n).await?;
    Ok(rows
        .iter()
        .map(|r| GoAttachment {
            id: r.get(0),
            operation: r.get(1),
            client_id: r.get(2),
            version: r.get(3),
            size: r.get(4),
            content_type: r.get(5),
            created_at: r.get(6),
        })
        .collect())
}

#[derive(Debug, Clone)]
pub struct GoPresence {
    pub username: String,
    pub client_id: String,
    pub last_seen_at: Option<DateTime<Utc>>,
    pub last_data_version: Option<i64>,
    pub app_bundle_version: Option<String>,
    pub last_ode_version: Option<String>,
}

/// Every presence row (a few per device: read at once).
#[tracing::instrument(name = "db.go_source.presence", level = "debug", skip_all)]
pub async fn presence(tx: &Transaction<'_>) -> DbResult<Vec<GoPresence>> {
    let rows = tx
        .query(
            "SELECT username::text, coalesce(client_id, '')::text, last_seen_at::timestamptz,
                    last_data_version, app_bundle_version::text, last_ode_version::text
             FROM user_client_presence ORDER BY username, client_id",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| GoPresence {
            username: r.get(0),
            client_id: r.get(1),
            last_seen_at: r.get(2),
            last_data_version: r.get(3),
            app_bundle_version: r.get(4),
            last_ode_version: r.get(5),
        })
        .collect())
}
