//! `synkronus storage copy --to URL` and `synkronus storage gc` (docs/storage.md). The command
//! line (`src/cli.rs`) gives `gc` its database, so storage imports nothing above it (a test in
//! tests/api/conventions.rs checks).

use clap::Subcommand;
use futures_util::{StreamExt, TryStreamExt};

use super::{sweep, Area, Entry, Storage, StorageError};
use crate::config::{Config, StorageConfig, StorageUrl};

#[derive(Subcommand)]
pub enum StorageCommand {
    /// Copy every stored file to another STORAGE_URL (same AWS_* settings). Resumable and
    /// idempotent: files already there with the same size are skipped. Safe while the server runs.
    Copy {
        #[arg(long)]
        to: String,
    },
    /// Remove files that no database row refers to, older than an hour (the server also does
    /// this at start and every hour).
    Gc,
}

/// `synkronus storage copy --to URL`.
pub async fn copy(config: &Config, to: &str) -> anyhow::Result<()> {
    let url = StorageUrl::parse(to).map_err(|e| anyhow::anyhow!("--to: {e}"))?;
    let from = Storage::open(&config.storage())?;
    let target = Storage::open(&StorageConfig { url: Some(url.clone()), ..config.storage() })?;
    target.check_at_start().await?;
    let scratch = config.data_root.join(format!(".storage-copy-{}", uuid::Uuid::new_v4().simple()));
    tokio::fs::create_dir_all(&scratch).await?;
    let report = copy_all(&from, &target, &scratch).await;
    let _ = tokio::fs::remove_dir_all(&scratch).await;
    let report = report?;
    println!(
        "copied {} files ({} bytes) to {url}; {} were already there",
        report.copied, report.bytes, report.skipped
    );
    Ok(())
}

/// `synkronus storage gc`, on the migrated database the command line opened.
pub async fn gc(config: &Config, pool: &deadpool_postgres::Pool) -> anyhow::Result<()> {
    let storage = Storage::open(&config.storage())?;
    let candidates = sweep::attachment_candidates(&storage.attachments, pool).await?;
    let attachments = sweep::remove_attachment_orphans(&storage.attachments, pool, candidates).await?;
    let bundles = sweep::sweep_bundles(&storage.bundles, pool).await?;
    println!("removed {attachments} attachment files and {bundles} bundle files without a row");
    Ok(())
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct CopyReport {
    pub copied: u64,
    pub skipped: u64,
    pub bytes: u64,
}

/// Copies every file of every area (uploads in flight, under `tmp/`, excepted).
/// Files fetched from an object store pass through `scratch`, a local folder.
pub async fn copy_all(from: &Storage, to: &Storage, scratch: &std::path::Path) -> anyhow::Result<CopyReport> {
    let mut report = CopyReport::default();
    for ((name, src), (_, dst)) in from.areas().into_iter().zip(to.areas()) {
        let entries: Vec<Entry> =
            src.list("").await?.into_iter().filter(|e| !e.key.starts_with("tmp/")).collect();
        let results: Vec<Option<u64>> = futures_util::stream::iter(entries)
            .map(|entry| copy_one(src, dst, entry, scratch))
            .buffer_unordered(4)
            .try_collect()
            .await
            .map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
        for copied in results {
            match copied {
                Some(bytes) => {
                    report.copied += 1;
                    report.bytes += bytes;
                }
                None => report.skipped += 1,
            }
        }
    }
    Ok(report)
}

/// `Some(size)` when copied, `None` when the target already had it.
async fn copy_one(
    src: &Area,
    dst: &Area,
    entry: Entry,
    scratch: &std::path::Path,
) -> anyhow::Result<Option<u64>> {
    match dst.head(&entry.key).await? {
        Some(size) if size == entry.size => return Ok(None),
        Some(size) => {
            anyhow::bail!("{} is already at the target with another size ({size} bytes)", entry.key)
        }
        None => {}
    }
    let temp = scratch.join(uuid::Uuid::new_v4().simple().to_string());
    let local = match src.local_path(&entry.key) {
        Some(path) => path,
        None => {
            src.fetch_to(&entry.key, &temp).await?;
            temp.clone()
        }
    };
    let stored = dst.put_file(&entry.key, &local).await;
    let _ = tokio::fs::remove_file(&temp).await;
    match stored {
        Ok(()) => Ok(Some(entry.size)),
        Err(StorageError::AlreadyExists(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}
