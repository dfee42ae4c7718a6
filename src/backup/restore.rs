//! `synkronus restore --input FILE [--force]`, with the server stopped. In order: the archive is
//! verified (nothing is touched before it passes); the target is brought to the archive's schema
//! version and must be empty (only the bootstrap admin) unless `--force`; the files are unpacked
//! into staging folders beside their destinations; then ONE transaction empties every table,
//! COPYs every table in, sets the sequences and raises the repository generation (docs/api.md
//! §17.2), the staged files are moved into place and the transaction commits. Files go in before
//! the commit, so the restored rows never point at a missing file; they are content-addressed or
//! immutable per version, so moving them over existing ones is harmless. Last, the remaining
//! migrations of this binary run, and with `--force` files the archive does not hold are removed.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use bytes::Bytes;
use deadpool_postgres::Transaction;
use futures_util::SinkExt;
use sha2::{Digest, Sha256};
use zip::ZipArchive;

use super::verify::{open, verify};
use super::{load_order, safe_relative, Hashing, Manifest, TableEntry, ATTACHMENTS_DIR, BUNDLES_DIR};
use crate::config::Config;
use crate::db;
use crate::storage::{Storage, StorageError};

/// Verifies, then restores `input` into the configured database and folders.
pub async fn run(config: &Config, input: &Path, force: bool) -> anyhow::Result<()> {
    let owned = input.to_path_buf();
    let manifest = tokio::task::spawn_blocking(move || verify(&owned)).await?.map_err(anyhow::Error::msg)?;
    check_schema_known(&manifest)?;
    let generation = crate::startup::with_database(config, async |conn| {
        restore(config, conn, input, &manifest, force).await
    })
    .await?;
    println!(
        "restored {} (taken at {}, schema version {}): {} rows in {} tables, {} files; repository generation \
         raised to {generation}, so devices that synced after the backup reset",
        input.display(),
        manifest.created_at.to_rfc3339(),
        manifest.schema_version,
        manifest.counts.rows,
        manifest.tables.len(),
        manifest.counts.files,
    );
    Ok(())
}

/// Every migration the archive's database had must be one this binary carries, under the same name.
fn check_schema_known(manifest: &Manifest) -> anyhow::Result<()> {
    let known = db::known_migrations();
    let latest = known.last().map(|(v, _)| *v).unwrap_or(0);
    for m in &manifest.migrations {
        if !known.iter().any(|(v, name)| *v == m.version && *name == m.name) {
            anyhow::bail!(
                "the archive's schema version {} (migration V{}__{}) is unknown to this synkronus {} (latest \
                 schema version {latest}); restore it with the synkronus release that wrote it ({}) or a newer one",
                manifest.schema_version,
                m.version,
                m.name,
                env!("CARGO_PKG_VERSION"),
                manifest.server_version,
            );
        }
    }
    Ok(())
}

async fn restore(
    config: &Config,
    conn: &str,
    input: &Path,
    manifest: &Manifest,
    force: bool,
) -> anyhow::Result<i64> {
    let pool = db::create_pool(conn, 1)?;
    db::wait_until_reachable(&pool).await?;
    prepare_target(config, &pool, manifest, force).await?;
    let staging = Arc::new(Staging::new(config)?);
    let (src, parts, stage) = (input.to_path_buf(), manifest.clone(), staging.clone());
    tokio::task::spawn_blocking(move || stage_files(&src, &parts, &stage)).await??;
    let generation = load(&pool, input, manifest, &staging, config).await?;
    db::migrate(&pool).await.context("migrating the restored database to this synkronus")?;
    if force {
        prune(&Storage::open(&config.storage())?, manifest).await;
    }
    Ok(generation)
}

/// Nobody else connected, a schema not newer than the archive's (brought to it), and empty.
async fn prepare_target(
    config: &Config,
    pool: &deadpool_postgres::Pool,
    manifest: &Manifest,
    force: bool,
) -> anyhow::Result<()> {
    let db = pool.get().await?;
    // A server stopped a moment ago may still have sessions closing: they get a few seconds.
    let mut others = db::backup::other_sessions(&db).await?;
    for _ in 0..10 {
        if others == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        others = db::backup::other_sessions(&db).await?;
    }
    if others > 0 {
        anyhow::bail!(
            "{others} other session(s) are connected to the target database: stop the server (and other clients \
             of the database) before restoring"
        );
    }
    if let Some(&(current, _)) = db::backup::applied_migrations(&db).await?.last() {
        if current > manifest.schema_version {
            anyhow::bail!(
                "the target database is at schema version {current}, newer than the archive's {}: restore into a \
                 new, empty database (or an empty DATA_ROOT); the restore then migrates it to this synkronus",
                manifest.schema_version
            );
        }
    }
    drop(db);
    db::migrate_to(pool, Some(manifest.schema_version)).await.context("preparing the target's schema")?;
    let contents = db::backup::target_contents(&pool.get().await?).await?;
    let bootstrap_only = match contents.users.as_slice() {
        [] => true,
        [only] => *only == config.admin_username,
        _ => false,
    };
    let empty =
        contents.records == 0 && contents.attachments == 0 && contents.bundle_versions == 0 && bootstrap_only;
    if !empty && !force {
        anyhow::bail!(
            "the target is not empty ({} observations, {} attachments, {} bundle versions, users {}): restore \
             refuses to replace it; add --force to replace everything in it",
            contents.records,
            contents.attachments,
            contents.bundle_versions,
            contents.users.join(", "),
        );
    }
    Ok(())
}

/// Unpacking folders inside ATTACHMENTS_PATH and APP_BUNDLE_PATH (same file systems as the
/// destinations, so moving into place is a rename), removed when dropped.
struct Staging {
    attachments: PathBuf,
    bundles: PathBuf,
}

impl Staging {
    fn new(config: &Config) -> anyhow::Result<Self> {
        let name = format!("restore-{}", uuid::Uuid::new_v4().simple());
        let staging = Staging {
            attachments: config.attachments_path.join("tmp").join(&name),
            bundles: config.app_bundle_path.join("tmp").join(&name),
        };
        for dir in [&staging.attachments, &staging.bundles] {
            std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        }
        Ok(staging)
    }

    /// Where a file part is unpacked; `None` for table parts.
    fn place_of(&self, part: &str) -> Option<PathBuf> {
        let (root, rest) = if let Some(rest) = part.strip_prefix(ATTACHMENTS_DIR) {
            (&self.attachments, rest)
        } else {
            (&self.bundles, part.strip_prefix(BUNDLES_DIR)?)
        };
        safe_relative(rest).map(|relative| root.join(relative))
    }

    /// Stores every unpacked file under the same key in its storage area (docs/storage.md);
    /// a forced restore replaces a file of the same name.
    async fn move_into_place(&self, storage: &Storage) -> anyhow::Result<()> {
        for (staged, area) in [(&self.attachments, &storage.attachments), (&self.bundles, &storage.bundles)] {
            for entry in walkdir::WalkDir::new(staged) {
                let entry = entry?;
                if !entry.file_type().is_file() {
                    continue;
                }
                let relative = entry.path().strip_prefix(staged)?;
                let key: Vec<String> = relative.iter().map(|s| s.to_string_lossy().into_owned()).collect();
                let key = key.join("/");
                let stored = match area.put_file(&key, entry.path()).await {
                    Err(StorageError::AlreadyExists(_)) => {
                        area.delete(&key).await?;
                        area.put_file(&key, entry.path()).await
                    }
                    other => other,
                };
                stored.with_context(|| format!("cannot store {key}"))?;
            }
        }
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.attachments);
        let _ = std::fs::remove_dir_all(&self.bundles);
    }
}

/// Unpacks every file part, checking it again against the manifest as it is written.
fn stage_files(input: &Path, manifest: &Manifest, staging: &Staging) -> anyhow::Result<()> {
    let mut archive = open(input).map_err(anyhow::Error::msg)?;
    for part in &manifest.parts {
        let Some(dest) = staging.place_of(&part.name) else { continue };
        if let Some(dir) = dest.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut entry = archive.by_name(&part.name)?;
        let mut out = Hashing::new(File::create(&dest)?);
        std::io::copy(&mut entry, &mut out).with_context(|| format!("cannot unpack {}", part.name))?;
        let (file, sha256, size) = out.finish();
        if sha256 != part.sha256 || size != part.size {
            anyhow::bail!("part {} changed since it was verified", part.name);
        }
        file.sync_all()?;
    }
    Ok(())
}

/// The one transaction: empty, COPY everything in, sequences, generation; files moved in; commit.
async fn load(
    pool: &deadpool_postgres::Pool,
    input: &Path,
    manifest: &Manifest,
    staging: &Arc<Staging>,
    config: &Config,
) -> anyhow::Result<i64> {
    let mut client = pool.get().await?;
    let tx = db::backup::load_transaction(&mut client).await?;
    let target_tables = db::backup::tables(&tx).await?;
    let foreign_keys = db::backup::foreign_keys(&tx).await?;
    // Devices of a replaced repository may hold a higher generation than the archive's.
    let replaced = db::records::head_and_generation(&tx).await?.repository_generation;
    db::backup::truncate(&tx, &target_tables).await?;
    let mut archive = open(input).map_err(anyhow::Error::msg)?;
    let names: Vec<String> = manifest.tables.iter().map(|t| t.name.clone()).collect();
    for name in load_order(&names, &foreign_keys) {
        let Some(table) = manifest.tables.iter().find(|t| t.name == name) else { continue };
        if !target_tables.iter().any(|t| t.name == name) {
            anyhow::bail!("table {name} of the archive does not exist in the target's schema");
        }
        copy_table(&tx, &mut archive, manifest, table).await?;
    }
    let target_sequences = db::backup::sequences(&tx).await?;
    for sequence in &manifest.sequences {
        if target_sequences.iter().any(|s| s.name == sequence.name) {
            let sequence =
                db::backup::Sequence { name: sequence.name.clone(), last_value: sequence.last_value };
            db::backup::set_sequence(&tx, &sequence).await?;
        }
    }
    let generation = db::backup::raise_generation(&tx, replaced).await?;
    staging.move_into_place(&Storage::open(&config.storage())?).await?;
    tx.commit().await.context("committing the restored database")?;
    Ok(generation)
}

/// Streams one table's dump into COPY, checking its checksum and row count on the way.
async fn copy_table(
    tx: &Transaction<'_>,
    archive: &mut ZipArchive<BufReader<File>>,
    manifest: &Manifest,
    table: &TableEntry,
) -> anyhow::Result<()> {
    let expected = manifest.parts.iter().find(|p| p.name == table.part).map(|p| p.sha256.as_str());
    let sink = db::backup::copy_in(tx, &table.name, &table.columns).await?;
    futures_util::pin_mut!(sink);
    let mut entry = archive.by_name(&table.part)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = entry.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        sink.send(Bytes::copy_from_slice(&buf[..n]))
            .await
            .with_context(|| format!("loading table {}", table.name))?;
    }
    let rows = sink.finish().await.with_context(|| format!("loading table {}", table.name))?;
    if Some(hex::encode(hasher.finalize()).as_str()) != expected || rows != table.rows {
        anyhow::bail!("table {} changed since it was verified", table.name);
    }
    Ok(())
}

/// After a forced restore: removes stored files the archive does not hold (the replaced
/// repository's).
async fn prune(storage: &Storage, manifest: &Manifest) {
    let keep: HashSet<(bool, &str)> = manifest
        .parts
        .iter()
        .filter_map(|p| match p.name.strip_prefix(ATTACHMENTS_DIR) {
            Some(rest) => Some((true, rest)),
            None => p.name.strip_prefix(BUNDLES_DIR).map(|rest| (false, rest)),
        })
        .collect();
    let areas = [
        (true, &storage.attachments, "blobs/"),
        (true, &storage.attachments, "variants/"),
        (false, &storage.bundles, "versions/"),
    ];
    for (is_attachment, area, prefix) in areas {
        let entries = match area.list(prefix).await {
            Ok(entries) => entries,
            Err(error) => {
                tracing::warn!(%error, prefix, "cannot list stored files to prune");
                continue;
            }
        };
        for entry in entries {
            if !keep.contains(&(is_attachment, entry.key.as_str())) {
                let _ = area.delete(&entry.key).await;
            }
        }
    }
}
