//! The import's steps, each reading one kind from the source snapshot in batches and writing it
//! into the target's transaction (or, in a dry run, only counting it): users, observations,
//! attachments (with their files), files without an operation, presence, bundle versions.

use std::collections::HashSet;
use std::path::PathBuf;

use anyhow::Context as _;
use chrono::Utc;

use crate::actors::attachment_store::BlobPaths;
use crate::db::go_import::{self as target, NewAttachment, NewRecord, NewUser};
use crate::db::go_source::{self as source, GoAttachment};
use crate::db::presence::PresenceUpsert;
use crate::domain::go_import::{self as rules, AttachmentFate, SchemaFacts};
use crate::import::bundles::{self, GoBundles};
use crate::import::files::{copy_blob, SourceFiles, Written};
use crate::import::report::{Progress, Report};

const USER_BATCH: i32 = 1_000;
const OBSERVATION_BATCH: i32 = 5_000;
const ATTACHMENT_BATCH: i32 = 500;

/// What the steps share: both sides, the files, and what was done so far.
pub struct Ctx<'a> {
    pub source: &'a tokio_postgres::Transaction<'a>,
    pub target: &'a deadpool_postgres::Transaction<'a>,
    pub facts: &'a SchemaFacts,
    /// `None` in a dry run: nothing is written.
    pub blobs: Option<BlobPaths>,
    pub bundle_root: Option<PathBuf>,
    pub files: SourceFiles,
    pub report: Report,
    pub progress: Progress,
    pub written: Written,
    pub done: Done,
}

/// What was (or, in a dry run, would be) written.
#[derive(Debug, Default)]
pub struct Done {
    pub users: HashSet<String>,
    pub records: i64,
    pub attachments: i64,
    pub tombstones: i64,
    pub orphans: i64,
    pub presence: i64,
    pub bundle_versions: i64,
    pub highest_version: i64,
}

impl Ctx<'_> {
    fn writing(&self) -> bool {
        self.blobs.is_some()
    }
}

/// Users with their bcrypt hashes; a role this server does not know refuses the whole import.
pub async fn users(ctx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let portal = source::users(ctx.source).await?;
    let mut refused = Vec::new();
    loop {
        let batch = source::next_users(ctx.source, &portal, USER_BATCH).await.context("reading users")?;
        if batch.is_empty() {
            break;
        }
        let mut rows = Vec::with_capacity(batch.len());
        for u in &batch {
            let Some(role) = rules::role(&u.role) else {
                refused.push(format!("'{}' ({})", u.username, u.role));
                continue;
            };
            if !u.password_hash.starts_with("$2") {
                ctx.report.warn(
                    "password",
                    format!("user '{}' has no bcrypt hash: reset their password", u.username),
                );
            }
            ctx.done.users.insert(u.username.clone());
            rows.push(NewUser {
                id: u.id.unwrap_or_else(uuid::Uuid::new_v4),
                username: u.username.clone(),
                password_hash: u.password_hash.clone(),
                role: role.as_str(),
                created_at: u.created_at.unwrap_or_else(Utc::now),
            });
        }
        if ctx.writing() && !rows.is_empty() {
            target::insert_users(ctx.target, &rows).await.context("writing users")?;
        }
        ctx.progress.rows(batch.len());
    }
    if !refused.is_empty() {
        anyhow::bail!(
            "refused: {} user(s) with a role this server does not know (only read-only, read-write and admin): {}; \
             give them one of those roles in the source and run the import again",
            refused.len(),
            refused.join(", ")
        );
    }
    Ok(())
}

/// Observations, each at `change_id = version`, in version order. The next batch is read from
/// the source while the previous one is written to the target.
pub async fn observations(ctx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let (src, dst, writing) = (ctx.source, ctx.target, ctx.writing());
    let portal = source::observations(src, ctx.facts).await?;
    let read = || async {
        source::next_observations(src, &portal, OBSERVATION_BATCH)
            .await
            .context("reading observations from the source")
    };
    let mut batch = read().await?;
    while !batch.is_empty() {
        let mut rows = Vec::with_capacity(batch.len());
        for o in batch {
            let change_id =
                rules::change_id(o.version).map_err(|e| anyhow::anyhow!("observation '{}': {e}", o.id))?;
            ctx.done.highest_version = ctx.done.highest_version.max(change_id);
            rows.push(record(o, change_id));
        }
        let write = async {
            if writing {
                let (first, last) = (rows.first().map(|r| r.change_id), rows.last().map(|r| r.change_id));
                target::insert_records(dst, &rows)
                    .await
                    .with_context(|| format!("writing observations (versions {first:?} to {last:?})"))?;
            }
            anyhow::Ok(())
        };
        let (written, next) = tokio::join!(write, read());
        written?;
        ctx.done.records += rows.len() as i64;
        ctx.progress.rows(rows.len());
        batch = next?;
    }
    Ok(())
}

fn record(o: source::GoObservation, change_id: i64) -> NewRecord {
    NewRecord {
        synced_at: o.synced_at.or(o.updated_at).or(o.created_at).unwrap_or_else(Utc::now),
        id: o.id,
        form_type: o.form_type,
        form_version: o.form_version,
        data: o.data,
        deleted: o.deleted,
        created_at: o.created_at,
        updated_at: o.updated_at,
        geolocation: o.geolocation,
        author: o.author,
        device_id: o.device_id,
        tags: o.tags,
        change_id,
    }
}

/// Each attachment's latest operation: a current attachment (its file copied) or a tombstone.
pub async fn attachments(ctx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let portal = source::attachments(ctx.source).await?;
    loop {
        let batch = source::next_attachments(ctx.source, &portal, ATTACHMENT_BATCH)
            .await
            .context("reading attachment operations from the source")?;
        if batch.is_empty() {
            return Ok(());
        }
        let mut rows = Vec::with_capacity(batch.len());
        for op in &batch {
            if let Some(row) = attachment(ctx, op).await? {
                rows.push(row);
            }
        }
        if ctx.writing() && !rows.is_empty() {
            target::insert_attachments(ctx.target, &rows).await.context("writing attachments")?;
        }
        ctx.progress.rows(batch.len());
    }
}

async fn attachment(ctx: &mut Ctx<'_>, op: &GoAttachment) -> anyhow::Result<Option<NewAttachment>> {
    let change_id =
        rules::change_id(op.version).map_err(|e| anyhow::anyhow!("attachment '{}': {e}", op.id))?;
    let fate =
        rules::attachment_fate(&op.operation).map_err(|e| anyhow::anyhow!("attachment '{}': {e}", op.id))?;
    ctx.done.highest_version = ctx.done.highest_version.max(change_id);
    let path = ctx.files.path_of(&op.id);
    // A file with an operation is no orphan, whatever became of it.
    ctx.files.sizes.remove(&op.id);
    let created_at = op.created_at.unwrap_or_else(Utc::now);
    if fate == AttachmentFate::Deleted {
        ctx.done.tombstones += 1;
        let row = NewAttachment {
            id: op.id.clone(),
            sha256: None,
            size: 0,
            content_type: String::new(),
            client_id: op.client_id.clone(),
            created_at,
            change_id,
        };
        return Ok(Some(row));
    }
    let Some(path) = path else {
        ctx.report.warn(
            "missing file",
            format!(
                "attachment '{}' (version {change_id}) has no file in the attachments folder: not imported",
                op.id
            ),
        );
        return Ok(None);
    };
    let (sha256, size) = copy(ctx, path).await.with_context(|| format!("copying attachment '{}'", op.id))?;
    if op.size.is_some_and(|declared| declared != size) {
        ctx.report.warn(
            "size",
            format!("attachment '{}': the source says {:?} bytes, the file has {size}", op.id, op.size),
        );
    }
    ctx.done.attachments += 1;
    Ok(Some(NewAttachment {
        id: op.id.clone(),
        sha256: Some(sha256),
        size,
        content_type: crate::domain::attachment::content_type(op.content_type.as_deref(), &op.id),
        client_id: op.client_id.clone(),
        created_at,
        change_id,
    }))
}

/// Hashes (and, unless a dry run, copies) one file off the executor.
async fn copy(ctx: &mut Ctx<'_>, path: PathBuf) -> anyhow::Result<(String, i64)> {
    let blobs = ctx.blobs.clone();
    let started = std::time::Instant::now();
    let copied = tokio::task::spawn_blocking(move || copy_blob(&path, blobs.as_ref())).await??;
    if let Some(created) = copied.created {
        ctx.written.add(created);
    }
    ctx.progress.file(copied.size, started.elapsed());
    Ok((copied.sha256, i64::try_from(copied.size)?))
}

/// Files no operation mentions: imported as created at new change_ids after `base`. Returns the
/// head after them.
pub async fn orphans(ctx: &mut Ctx<'_>, base: i64) -> anyhow::Result<i64> {
    let mut ids: Vec<String> = ctx.files.sizes.keys().cloned().collect();
    ids.sort();
    let mut head = base;
    let mut rows = Vec::new();
    for id in ids {
        let Some(path) = ctx.files.path_of(&id) else { continue };
        head += 1;
        let modified = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
        let (sha256, size) = copy(ctx, path).await.with_context(|| format!("copying file '{id}'"))?;
        ctx.report.warn(
            "file without operation",
            format!(
                "'{id}' has no attachment operation in the source: imported as created at change_id {head}"
            ),
        );
        rows.push(NewAttachment {
            content_type: crate::domain::attachment::content_type(None, &id),
            id,
            sha256: Some(sha256),
            size,
            client_id: None,
            created_at: modified.map(Into::into).unwrap_or_else(Utc::now),
            change_id: head,
        });
    }
    ctx.done.orphans = rows.len() as i64;
    ctx.done.attachments += rows.len() as i64;
    if ctx.writing() && !rows.is_empty() {
        target::insert_attachments(ctx.target, &rows).await.context("writing files without operation")?;
    }
    Ok(head)
}

/// Device presence (2026 sources); rows of users not imported are reported and left out.
pub async fn presence(ctx: &mut Ctx<'_>) -> anyhow::Result<()> {
    if !ctx.facts.has_presence {
        return Ok(());
    }
    let rows = source::presence(ctx.source).await.context("reading presence")?;
    let mut batch = Vec::with_capacity(rows.len());
    for p in rows {
        if !ctx.done.users.contains(&p.username) {
            ctx.report.warn(
                "presence",
                format!("device '{}' of unknown user '{}': left out", p.client_id, p.username),
            );
            continue;
        }
        batch.push(PresenceUpsert {
            username: p.username,
            client_id: p.client_id,
            last_seen_at: p.last_seen_at.unwrap_or_else(Utc::now),
            last_data_version: p.last_data_version,
            app_bundle_version: p.app_bundle_version,
            client_version: p.last_ode_version,
        });
    }
    ctx.progress.rows(batch.len());
    ctx.done.presence = batch.len() as i64;
    if ctx.writing() {
        for chunk in batch.chunks(1_000) {
            crate::db::presence::upsert_many(ctx.target, chunk).await.context("writing presence")?;
        }
    }
    Ok(())
}

/// Every bundle version with its Go id; the active one active, its forms registered.
pub async fn bundle_versions(ctx: &mut Ctx<'_>, go: &GoBundles) -> anyhow::Result<()> {
    for id in &go.versions {
        let (source_dir, root) = (go.dir.join(id), ctx.bundle_root.clone());
        let id_owned = id.clone();
        let (prepared, written) = tokio::task::spawn_blocking(move || {
            let mut written = Written::default();
            let prepared = bundles::prepare(&source_dir, &id_owned, root.as_deref(), &mut written);
            (prepared, written)
        })
        .await?;
        ctx.written.extend(written);
        let prepared = prepared.with_context(|| format!("importing bundle version '{id}'"))?;
        if let Some(problem) = &prepared.problem {
            ctx.report.warn(
                "bundle validation",
                format!("version '{id}' fails validation ({problem}): imported as it is"),
            );
        }
        if ctx.writing() {
            let m = &prepared.manifest;
            let manifest = serde_json::to_value(m)?;
            crate::db::bundles::insert(
                ctx.target,
                id,
                &m.name,
                &m.entry_point,
                prepared.created_at,
                &manifest,
            )
            .await
            .with_context(|| format!("recording bundle version '{id}'"))?;
            if go.active.as_deref() == Some(id.as_str()) {
                crate::db::bundles::set_active(ctx.target, id).await?;
                let warnings =
                    crate::db::formspecs::register_bundle_forms(ctx.target, id, &prepared.forms).await?;
                for w in warnings {
                    ctx.report.warn("form spec", w.message());
                }
            }
        }
        ctx.done.bundle_versions += 1;
    }
    Ok(())
}
