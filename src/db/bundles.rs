//! SQL for app bundle versions and the active pointer (docs/api.md §9.3), plus the LISTEN connection
//! that tells every process about a switch.

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use futures_util::StreamExt;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, Connection};

use crate::db::DbResult;

/// The NOTIFY channel announcing a change of the active pointer.
pub const SWITCH_CHANNEL: &str = "synkronus_bundle_active";

/// Serialises uploads, switches and retention across processes.
const BUNDLE_LOCK_KEY: i64 = 0x5359_4e4b_0003;

#[derive(Debug, Clone)]
pub struct VersionRow {
    pub version: String,
    pub name: String,
    pub created_at: DateTime<Utc>,
    pub manifest: Value,
}

const COLUMNS: &str = "version, name, created_at, manifest";

fn version_from_row(row: &tokio_postgres::Row) -> VersionRow {
    VersionRow {
        version: row.get("version"),
        name: row.get("name"),
        created_at: row.get("created_at"),
        manifest: row.get("manifest"),
    }
}

/// Takes the bundle lock until the end of the surrounding transaction.
#[tracing::instrument(name = "db.bundles.lock", level = "debug", skip_all)]
pub async fn lock(db: &impl GenericClient) -> DbResult<()> {
    db.execute("SELECT pg_advisory_xact_lock($1)", &[&BUNDLE_LOCK_KEY]).await?;
    Ok(())
}

/// Whether an id was ever assigned, including to versions that retention removed.
#[tracing::instrument(name = "db.bundles.id_used", level = "debug", skip_all)]
pub async fn id_used(db: &impl GenericClient, version: &str) -> DbResult<bool> {
    Ok(db.query_opt("SELECT 1 FROM bundle_versions WHERE version = $1", &[&version]).await?.is_some())
}

#[tracing::instrument(name = "db.bundles.insert", level = "debug", skip_all)]
pub async fn insert(
    db: &impl GenericClient,
    version: &str,
    name: &str,
    entry_point: &str,
    created_at: DateTime<Utc>,
    manifest: &Value,
) -> DbResult<()> {
    db.execute(
        "INSERT INTO bundle_versions (version, name, entry_point, created_at, manifest)
         VALUES ($1, $2, $3, $4, $5)",
        &[&version, &name, &entry_point, &created_at, manifest],
    )
    .await?;
    Ok(())
}

/// A version that still exists (not removed by retention).
#[tracing::instrument(name = "db.bundles.find", level = "debug", skip_all)]
pub async fn find(db: &impl GenericClient, version: &str) -> DbResult<Option<VersionRow>> {
    let sql = format!("SELECT {COLUMNS} FROM bundle_versions WHERE version = $1 AND removed_at IS NULL");
    Ok(db.query_opt(&sql, &[&version]).await?.map(|row| version_from_row(&row)))
}

/// The most recently uploaded version that still exists.
#[tracing::instrument(name = "db.bundles.newest", level = "debug", skip_all)]
pub async fn newest(db: &impl GenericClient) -> DbResult<Option<VersionRow>> {
    let sql =
        format!("SELECT {COLUMNS} FROM bundle_versions WHERE removed_at IS NULL ORDER BY seq DESC LIMIT 1");
    Ok(db.query_opt(&sql, &[]).await?.map(|row| version_from_row(&row)))
}

/// A versions-list entry.
#[derive(Debug, Clone)]
pub struct VersionSummary {
    pub version: String,
    pub name: String,
    pub created_at: DateTime<Utc>,
    pub active: bool,
}

/// Existing versions, newest (most recently uploaded) first.
#[tracing::instrument(name = "db.bundles.list", level = "debug", skip_all)]
pub async fn list(db: &impl GenericClient) -> DbResult<Vec<VersionSummary>> {
    let rows = db
        .query(
            "SELECT v.version, v.name, v.created_at, (v.version = a.version) IS TRUE AS active
             FROM bundle_versions v CROSS JOIN bundle_active a
             WHERE v.removed_at IS NULL ORDER BY v.seq DESC",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| VersionSummary {
            version: row.get("version"),
            name: row.get("name"),
            created_at: row.get("created_at"),
            active: row.get("active"),
        })
        .collect())
}

/// The active version (if any) and the pointer's generation.
#[tracing::instrument(name = "db.bundles.active", level = "debug", skip_all)]
pub async fn active(db: &impl GenericClient) -> DbResult<(Option<String>, i64)> {
    let row = db.query_one("SELECT version, generation FROM bundle_active", &[]).await?;
    Ok((row.get(0), row.get(1)))
}

/// Points at `version` and announces it to every process once the transaction commits.
/// Returns the new generation.
#[tracing::instrument(name = "db.bundles.set_active", level = "debug", skip_all)]
pub async fn set_active(db: &impl GenericClient, version: &str) -> DbResult<i64> {
    let row = db
        .query_one(
            "UPDATE bundle_active SET version = $1, generation = generation + 1 RETURNING generation",
            &[&version],
        )
        .await?;
    let generation: i64 = row.get(0);
    db.execute("SELECT pg_notify($1, $2)", &[&SWITCH_CHANNEL, &generation.to_string()]).await?;
    Ok(generation)
}

/// Whether `version` was uploaded before `other` (a switch to it is a rollback).
#[tracing::instrument(name = "db.bundles.uploaded_before", level = "debug", skip_all)]
pub async fn uploaded_before(db: &impl GenericClient, version: &str, other: &str) -> DbResult<bool> {
    let row = db
        .query_one(
            "SELECT (SELECT seq FROM bundle_versions WHERE version = $1)
                  < (SELECT seq FROM bundle_versions WHERE version = $2)",
            &[&version, &other],
        )
        .await?;
    Ok(row.get::<_, Option<bool>>(0).unwrap_or(false))
}

/// Versions retention removes (docs/api.md §9.3): while more than `keep` exist, the oldest that is
/// neither active nor `just_uploaded`. Call under the bundle lock.
#[tracing::instrument(name = "db.bundles.retention_victims", level = "debug", skip_all)]
pub async fn retention_victims(
    db: &impl GenericClient,
    keep: usize,
    just_uploaded: &str,
) -> DbResult<Vec<String>> {
    let rows = db
        .query(
            "SELECT v.version, (v.version = a.version) IS TRUE AS active
             FROM bundle_versions v CROSS JOIN bundle_active a
             WHERE v.removed_at IS NULL ORDER BY v.seq",
            &[],
        )
        .await?;
    let mut excess = rows.len().saturating_sub(keep);
    let mut victims = Vec::new();
    for row in &rows {
        if excess == 0 {
            break;
        }
        let version: String = row.get("version");
        if row.get::<_, bool>("active") || version == just_uploaded {
            continue;
        }
        victims.push(version);
        excess -= 1;
    }
    Ok(victims)
}

/// Marks versions removed; their ids stay taken forever.
#[tracing::instrument(name = "db.bundles.mark_removed", level = "debug", skip_all)]
pub async fn mark_removed(db: &impl GenericClient, versions: &[String]) -> DbResult<()> {
    db.execute(
        "UPDATE bundle_versions SET removed_at = now() WHERE version = ANY($1) AND removed_at IS NULL",
        &[&versions],
    )
    .await?;
    Ok(())
}

/// Opens a dedicated connection that LISTENs on [`SWITCH_CHANNEL`]. The receiver yields one
/// item per notification and ends when the connection is lost; keep the client alive meanwhile.
#[tracing::instrument(name = "db.bundles.listen_for_switches", level = "debug", skip_all)]
pub async fn listen_for_switches(
    conn: &str,
) -> anyhow::Result<(tokio_postgres::Client, mpsc::UnboundedReceiver<()>)> {
    let config = super::parse_connection(conn).map_err(anyhow::Error::msg)?;
    let unix_only = config.get_hosts().iter().all(|h| matches!(h, tokio_postgres::config::Host::Unix(_)));
    let (sender, receiver) = mpsc::unbounded_channel();
    let client = if unix_only {
        let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
        forward_notifications(connection, sender);
        client
    } else {
        let (client, connection) = config.connect(super::tls::make_connector()?).await?;
        forward_notifications(connection, sender);
        client
    };
    client.batch_execute(&format!("LISTEN {SWITCH_CHANNEL}")).await?;
    Ok((client, receiver))
}

/// Drives the connection, forwarding notifications; the default `Future` driver drops them.
fn forward_notifications<S, T>(mut connection: Connection<S, T>, sender: mpsc::UnboundedSender<()>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(_)) => {
                    if sender.send(()).is_err() {
                        break;
                    }
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(%error, "bundle switch listener connection failed");
                    break;
                }
            }
        }
    });
}
