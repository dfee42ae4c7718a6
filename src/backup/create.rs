//! `synkronus backup --output FILE`: safe while the server runs. Every table is copied inside one
//! REPEATABLE READ, READ ONLY transaction, so the archive holds the database of one moment (a
//! push is in it whole or not at all); the files are those that moment's rows refer to. Files
//! are immutable once referenced (blobs are named by their hash, bundle versions never change),
//! so reading them after the snapshot gives the snapshot's bytes.
//!
//! This is a one-off command: archive writes are plain blocking writes between the awaits of the
//! COPY stream, on the command's own runtime, where nothing else waits for the thread.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use futures_util::StreamExt;
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipWriter};

use super::{
    comment_placeholder, seal, table_part, Counts, Hashing, Manifest, MigrationEntry, PartEntry,
    SequenceEntry, TableEntry, ATTACHMENTS_DIR, BUNDLES_DIR, FORMAT, FORMAT_VERSION, MANIFEST,
};
use crate::actors::attachment_store::{blob_key, variant_key};
use crate::actors::bundle_store::{version_prefix, zip_key};
use crate::config::Config;
use crate::db;
use crate::domain::attachment::Quality;
use crate::storage::{Area, Storage};

type Archive = ZipWriter<BufWriter<File>>;

/// Writes the archive to `output` (through `output.partial`, renamed once complete and sealed,
/// so an interrupted backup never leaves a file that looks like one).
pub async fn run(config: &Config, output: &Path) -> anyhow::Result<()> {
    let manifest = crate::startup::with_database(config, async |conn| {
        let pool = db::create_pool(conn, 1)?;
        db::wait_until_reachable(&pool).await?;
        let mut client = pool.get().await?;
        write(config, &mut client, output).await
    })
    .await?;
    println!(
        "backup written to {}: schema version {}, change head {}, {} rows in {} tables, {} files ({} bytes), taken at {}",
        output.display(),
        manifest.schema_version,
        manifest.change_head,
        manifest.counts.rows,
        manifest.tables.len(),
        manifest.counts.files,
        manifest.counts.file_bytes,
        manifest.created_at.to_rfc3339(),
    );
    Ok(())
}

async fn write(
    config: &Config,
    client: &mut deadpool_postgres::Object,
    output: &Path,
) -> anyhow::Result<Manifest> {
    let partial = PathBuf::from(format!("{}.partial", output.display()));
    let file = File::create(&partial).with_context(|| format!("cannot create {}", partial.display()))?;
    let written = async {
        let mut archive = ZipWriter::new(BufWriter::with_capacity(1 << 20, file));
        let manifest = write_parts(config, client, &mut archive).await?;
        archive.start_file(MANIFEST, deflated())?;
        serde_json::to_writer_pretty(&mut archive, &manifest)?;
        archive.set_comment(comment_placeholder())?;
        let file = archive.finish()?.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        drop(file);
        seal(&partial)?;
        anyhow::Ok(manifest)
    }
    .await;
    match written {
        Ok(manifest) => {
            std::fs::rename(&partial, output)
                .with_context(|| format!("cannot write {}", output.display()))?;
            Ok(manifest)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            Err(e)
        }
    }
}

fn deflated() -> SimpleFileOptions {
    SimpleFileOptions::default()
        .compression_method(CompressionMethod::Deflated)
        .compression_level(Some(1))
        .large_file(true)
}

/// Tables, then files, all read from one snapshot.
async fn write_parts(
    config: &Config,
    client: &mut deadpool_postgres::Object,
    archive: &mut Archive,
) -> anyhow::Result<Manifest> {
    let tx = db::backup::snapshot(client).await?;
    let created_at = db::backup::now(&tx).await?;
    let migrations = db::backup::applied_migrations(&tx).await?;
    let Some(&(schema_version, _)) = migrations.last() else {
        anyhow::bail!("the database has no schema yet: nothing to back up");
    };
    let head = db::records::head_and_generation(&tx).await?;
    let mut parts = Vec::new();
    let mut tables = Vec::new();
    let mut counts = Counts::default();
    for table in db::backup::tables(&tx).await? {
        let name = table_part(&table.name);
        archive.start_file(name.as_str(), deflated())?;
        let mut out = Hashing::new(&mut *archive);
        let mut rows = 0u64;
        let stream = db::backup::copy_out(&tx, &table).await?;
        futures_util::pin_mut!(stream);
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.with_context(|| format!("copying table {}", table.name))?;
            // COPY's text format escapes newlines inside values: one line is one row.
            rows += chunk.iter().filter(|&&b| b == b'\n').count() as u64;
            out.write_all(&chunk)?;
        }
        let (_, sha256, size) = out.finish();
        counts.rows += rows;
        parts.push(PartEntry { name: name.clone(), size, sha256 });
        tables.push(TableEntry { name: table.name, columns: table.columns, rows, part: name });
    }
    let sequences = db::backup::sequences(&tx)
        .await?
        .into_iter()
        .map(|s| SequenceEntry { name: s.name, last_value: s.last_value })
        .collect();
    let hashes = db::backup::attachment_hashes(&tx).await?;
    let versions = db::backup::stored_bundle_versions(&tx).await?;
    tx.commit().await?;

    let storage = Storage::open(&config.storage())?;
    add_attachments(&storage.attachments, archive, &hashes, &mut parts, &mut counts).await?;
    add_bundles(&storage.bundles, archive, &versions, &mut parts, &mut counts).await?;
    Ok(Manifest {
        format: FORMAT.into(),
        format_version: FORMAT_VERSION,
        server_version: env!("CARGO_PKG_VERSION").into(),
        schema_version,
        migrations: migrations.into_iter().map(|(version, name)| MigrationEntry { version, name }).collect(),
        created_at,
        change_head: head.change_id,
        repository_generation: head.repository_generation,
        tables,
        sequences,
        counts,
        parts,
    })
}

/// Every blob the snapshot refers to, and the image variants made of it so far.
async fn add_attachments(
    area: &Area,
    archive: &mut Archive,
    hashes: &[String],
    parts: &mut Vec<PartEntry>,
    counts: &mut Counts,
) -> anyhow::Result<()> {
    for sha256 in hashes {
        let blob = blob_key(sha256);
        if area.head(&blob).await?.is_none() {
            anyhow::bail!(
                "attachment content {sha256} is referenced by the database but missing ({blob}); a repository \
                 reset during the backup removes files: run the backup again"
            );
        }
        parts.push(add_file(archive, area, ATTACHMENTS_DIR, &blob, CompressionMethod::Stored).await?);
        counts.attachment_blobs += 1;
        for quality in [Quality::Large, Quality::Medium, Quality::Small] {
            let variant = variant_key(sha256, quality);
            if area.head(&variant).await?.is_some() {
                parts.push(
                    add_file(archive, area, ATTACHMENTS_DIR, &variant, CompressionMethod::Stored).await?,
                );
                counts.attachment_variants += 1;
            }
        }
    }
    counts.files += counts.attachment_blobs + counts.attachment_variants;
    counts.file_bytes +=
        parts.iter().filter(|p| p.name.starts_with(ATTACHMENTS_DIR)).map(|p| p.size).sum::<u64>();
    Ok(())
}

/// Every stored bundle version: its folder and the ZIP it was pushed as.
async fn add_bundles(
    area: &Area,
    archive: &mut Archive,
    versions: &[String],
    parts: &mut Vec<PartEntry>,
    counts: &mut Counts,
) -> anyhow::Result<()> {
    for version in versions {
        let mut keys: Vec<String> =
            area.list(&version_prefix(version)).await?.into_iter().map(|entry| entry.key).collect();
        if keys.is_empty() {
            anyhow::bail!(
                "app bundle version {version} is referenced by the database but its files are missing; \
                 retention during the backup removes versions: run the backup again"
            );
        }
        keys.sort();
        let zip = zip_key(version);
        if area.head(&zip).await?.is_some() {
            keys.push(zip);
        }
        for key in keys {
            let part = add_file(archive, area, BUNDLES_DIR, &key, CompressionMethod::Deflated).await?;
            counts.files += 1;
            counts.file_bytes += part.size;
            parts.push(part);
        }
        counts.bundle_versions += 1;
    }
    Ok(())
}

/// Streams one stored file into the archive as `<prefix><key>` (the key is its path relative to
/// the area's folder, so archives are the same whatever the backend).
async fn add_file(
    archive: &mut Archive,
    area: &Area,
    prefix: &str,
    key: &str,
    method: CompressionMethod,
) -> anyhow::Result<PartEntry> {
    let name = format!("{prefix}{key}");
    let size = area.head(key).await?.with_context(|| format!("{key} is missing"))?;
    let options =
        SimpleFileOptions::default().compression_method(method).large_file(size >= u64::from(u32::MAX));
    archive.start_file(name.as_str(), options)?;
    let mut out = Hashing::new(&mut *archive);
    let mut stream = area.get(key, None).await?;
    while let Some(chunk) = stream.next().await {
        out.write_all(&chunk.with_context(|| format!("cannot read {key}"))?)?;
    }
    let (_, sha256, size) = out.finish();
    Ok(PartEntry { name, size, sha256 })
}
