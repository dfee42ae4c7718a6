//! The `AttachmentStore` owns attachment files: it moves staged uploads into the
//! content-addressed blob store and records them through the ChangeLog, and it builds the cached
//! image variants. It is not an actor but a plain value every handler shares (cheap to clone):
//! what it guards is ordered by locks, not by a mailbox (docs/architecture.md, "Attachments").
//! Handlers stream request bodies into a [`Staging`] temp file themselves (the payload belongs to
//! the request), and read finished blobs straight from storage. It is the only code that deletes
//! attachment files: a repository reset goes through it, serialised with every upload, so no
//! upload can commit a row whose file the reset then removes.
//!
//! Keys in the attachments storage area (docs/storage.md): `blobs/<aa>/<sha256>` (immutable
//! content, named by its hash, so racing uploads with different bytes never touch the same key)
//! and `variants/<sha256>-<quality>` (resized images). Uploads in flight are staged in
//! `ATTACHMENTS_PATH/tmp/` on the node's own disk whatever the backend.

use std::io::{BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use deadpool_postgres::Pool;
use futures_util::Stream;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, RwLock, Semaphore};

use crate::actors::change_log::{AttachmentCommit, ChangeLogHandle};
use crate::db::attachments::{self, AttachmentRow, NewAttachment};
use crate::db::records::Head;
use crate::domain::attachment::{scaled_size, Quality};
use crate::domain::audit::Origin;
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::storage::{Area, StorageError};

/// A temp file is stale (left by a crash or a killed process) once untouched this long; live
/// uploads write continuously, so other processes sharing the folder never lose theirs.
const STALE_TEMP_AGE: Duration = Duration::from_secs(15 * 60);
/// Decoding large images takes memory; this many resizes run at once.
const MAX_CONCURRENT_RESIZES: usize = 2;
/// Bigger images are served as they are rather than decoded.
const MAX_IMAGE_SIDE: u32 = 20_000;

/// Where attachment files live.
#[derive(Clone, Debug)]
pub struct BlobPaths {
    root: PathBuf,
}

impl BlobPaths {
    pub fn new(root: &Path) -> Self {
        BlobPaths { root: root.to_path_buf() }
    }

    pub fn tmp_dir(&self) -> PathBuf {
        self.root.join("tmp")
    }

    /// Where a blob lies in the local layout under ATTACHMENTS_PATH (what `synkronus import`
    /// writes before its files are stored; see docs/storage.md).
    pub fn blob(&self, sha256: &str) -> PathBuf {
        self.root.join(blob_key(sha256))
    }

    fn create_dirs(&self) -> std::io::Result<()> {
        std::fs::create_dir_all(self.tmp_dir())
    }

    fn new_temp(&self) -> TempFile {
        TempFile { path: self.tmp_dir().join(format!("{}.part", uuid::Uuid::new_v4().simple())) }
    }
}

/// The storage key of an attachment's content, sharded by the first two hex digits so no
/// folder grows without bound.
pub fn blob_key(sha256: &str) -> String {
    let shard = sha256.get(..2).unwrap_or("00");
    format!("blobs/{shard}/{sha256}")
}

pub fn variant_key(sha256: &str, quality: Quality) -> String {
    format!("variants/{sha256}-{}", quality.as_str())
}

/// Stores a file under a content-addressed key: a key that exists already holds these bytes.
async fn put_content(area: &Area, key: &str, src: &Path) -> ApiResult<()> {
    match area.put_file(key, src).await {
        Ok(()) | Err(StorageError::AlreadyExists(_)) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// A file in `tmp/` that is removed when dropped, so every failure path (an error, a dropped
/// connection cancelling the handler) cleans up, the stored copy made or not.
#[derive(Debug)]
pub struct TempFile {
    path: PathBuf,
}

impl TempFile {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// An upload fully written to a temp file, hashed and fsynced.
#[derive(Debug)]
pub struct Staged {
    temp: TempFile,
    pub sha256: String,
    pub size: u64,
}

/// An upload being written to a new temp file, hashed as it goes. The handler feeds it the
/// request's chunks (and decides what a bad or too large body answers); dropped unfinished, the
/// temp file goes with it.
pub struct Staging {
    temp: TempFile,
    file: tokio::fs::File,
    hasher: Sha256,
    size: u64,
}

impl Staging {
    pub async fn new(paths: &BlobPaths) -> std::io::Result<Self> {
        let temp = paths.new_temp();
        let file = tokio::fs::File::create(&temp.path).await?;
        Ok(Staging { temp, file, hasher: Sha256::new(), size: 0 })
    }

    /// Bytes written so far.
    pub fn size(&self) -> u64 {
        self.size
    }

    pub async fn write(&mut self, chunk: &[u8]) -> std::io::Result<()> {
        self.size += chunk.len() as u64;
        self.hasher.update(chunk);
        self.file.write_all(chunk).await
    }

    /// Flushed and fsynced: the upload as the store takes it.
    pub async fn finish(mut self) -> std::io::Result<Staged> {
        self.file.flush().await?;
        self.file.sync_all().await?;
        Ok(Staged { temp: self.temp, sha256: hex::encode(self.hasher.finalize()), size: self.size })
    }
}

/// The only writer and deleter of attachment files. Nothing in it is state a mailbox would have
/// to serialise: uploads and resizes hold `files` shared, a reset holds it exclusively, and the
/// database lock of `db::attachments::lock_files_*` orders the same across nodes.
#[derive(Clone)]
pub struct AttachmentStore {
    pool: Pool,
    change_log: ChangeLogHandle,
    paths: BlobPaths,
    area: Area,
    resizes: Arc<Semaphore>,
    /// Held shared by each upload (from its first look at the table until its row is committed)
    /// and each resize, and exclusively by a reset (from its commit until the files are gone).
    /// Fair: work arriving during a reset waits for it, here rather than holding a pooled
    /// connection while it waits for the database lock, which uploads and resets of other nodes
    /// sharing the folder take (`db::attachments::lock_files_shared`, taken inside this one).
    files: Arc<RwLock<()>>,
}

impl AttachmentStore {
    /// Creates the folders (start-up, so a failure stops the server with a clear message) and
    /// starts the hourly housekeeping.
    pub fn start(
        pool: Pool,
        change_log: ChangeLogHandle,
        root: &Path,
        area: Area,
        tasks: &crate::shutdown::Tasks,
    ) -> anyhow::Result<Self> {
        let paths = BlobPaths::new(root);
        paths.create_dirs().map_err(|e| anyhow::anyhow!("ATTACHMENTS_PATH: {}: {e}", root.display()))?;
        let store = AttachmentStore {
            pool,
            change_log,
            paths,
            area,
            resizes: Arc::new(Semaphore::new(MAX_CONCURRENT_RESIZES)),
            files: Arc::new(RwLock::new(())),
        };
        // At start, then hourly: stale temp files and stored files no row refers to.
        let (tmp, area, pool, files) =
            (store.paths.tmp_dir(), store.area.clone(), store.pool.clone(), store.files.clone());
        tasks.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(3600));
            loop {
                tick.tick().await;
                let tmp = tmp.clone();
                let _ = tokio::task::spawn_blocking(move || sweep_temp(&tmp, STALE_TEMP_AGE)).await;
                sweep_orphans(&area, &pool, &files).await;
            }
        });
        Ok(store)
    }

    pub fn paths(&self) -> BlobPaths {
        self.paths.clone()
    }

    /// Moves a staged upload into place and records it (docs/api.md §10.2).
    pub async fn store(&self, msg: Store) -> ApiResult<AttachmentCommit> {
        to_the_end("Store", self.clone().store_inner(msg)).await
    }

    /// The resized copy of an image for `quality`, made on first use; `None` serves the original
    /// (not an image, already small enough, or not decodable).
    pub async fn variant(&self, sha256: String, quality: Quality) -> ApiResult<Option<String>> {
        to_the_end("Variant", self.clone().variant_inner(sha256, quality)).await
    }

    /// Empties the repository (through the change log) and then deletes every attachment file,
    /// with no upload or resize running in between (docs/api.md §17.3).
    pub async fn reset_repository(&self, origin: Origin) -> ApiResult<Head> {
        to_the_end("ResetRepository", self.clone().reset_inner(origin)).await
    }
}

/// Listed without the lock; the last check of the rows and the deletes hold it exclusively, so
/// no upload commits a row for a file being removed.
async fn sweep_orphans(area: &Area, pool: &Pool, files: &RwLock<()>) {
    let swept = async {
        let candidates = crate::storage::sweep::attachment_candidates(area, pool).await?;
        let _exclusive = files.write().await;
        crate::storage::sweep::remove_attachment_orphans(area, pool, candidates).await
    }
    .await;
    match swept {
        Ok(0) => {}
        Ok(removed) => tracing::info!(removed, "removed attachment files without a row"),
        Err(error) => tracing::warn!(%error, "attachment orphan sweep failed"),
    }
}

/// Deletes temp files untouched for `age`; returns how many went.
pub fn sweep_temp(tmp: &Path, age: Duration) -> usize {
    let Ok(entries) = std::fs::read_dir(tmp) else { return 0 };
    let now = SystemTime::now();
    let mut removed = 0;
    for entry in entries.flatten() {
        let stale = entry
            .metadata()
            .and_then(|m| m.modified())
            .map(|t| now.duration_since(t).unwrap_or_default() >= age)
            .unwrap_or(false);
        if stale && std::fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    if removed > 0 {
        tracing::info!(removed, "removed stale attachment temp files");
    }
    removed
}

/// Moves a staged upload into place and records it (docs/api.md §10.2).
pub struct Store {
    pub staged: Staged,
    pub id: String,
    pub content_type: String,
    pub uploaded_by: String,
    pub client_id: Option<String>,
}

/// A call's work, run to its end (an upload recorded, a reset's files removed) even if the
/// request goes away.
async fn to_the_end<T: 'static>(
    message: &'static str,
    work: impl std::future::Future<Output = ApiResult<T>> + 'static,
) -> ApiResult<T> {
    super::to_the_end("attachment store", message, work).await
}

impl AttachmentStore {
    async fn store_inner(self, msg: Store) -> ApiResult<AttachmentCommit> {
        let _no_reset = self.files.read_owned().await;
        // The same for resets on other nodes sharing the folder.
        let mut guard_connection = self.pool.get().await?;
        let no_reset_anywhere = guard_connection.transaction().await?;
        attachments::lock_files_shared(&no_reset_anywhere).await?;
        // Answers the common retry without touching the blob store; the ChangeLog commit below
        // still decides every race.
        let existing = attachments::find(&no_reset_anywhere, &msg.id).await?;
        if let Some(row) = existing {
            if row.sha256 != msg.staged.sha256 {
                return Err(ApiError::of(ErrorCode::AttachmentExists));
            }
            // A store that lost the blob (a restore from an older bucket snapshot, an
            // operator's mistake) is repaired by the device re-sending the same bytes.
            let key = blob_key(&row.sha256);
            if self.area.head(&key).await?.is_none() {
                tracing::warn!(attachment = %row.id, "stored file was missing; the identical re-upload restored it");
                put_content(&self.area, &key, msg.staged.temp.path()).await?;
            }
            return Ok(AttachmentCommit { row, created: false });
        }
        let Store { staged, id, content_type, uploaded_by, client_id } = msg;
        crate::monitoring::attachment_uploaded(staged.size);
        put_content(&self.area, &blob_key(&staged.sha256), staged.temp.path()).await?;
        drop(staged.temp);
        let new = NewAttachment {
            id,
            sha256: staged.sha256,
            size: staged.size as i64,
            content_type,
            uploaded_by,
            client_id,
        };
        let committed = self.change_log.commit_attachment(new).await;
        // Only the lock was in it; a failed rollback ends the transaction as well.
        let _ = no_reset_anywhere.rollback().await;
        committed
    }

    async fn variant_inner(self, sha256: String, quality: Quality) -> ApiResult<Option<String>> {
        let _no_reset = self.files.read_owned().await;
        let (paths, area) = (&self.paths, &self.area);
        let key = variant_key(&sha256, quality);
        if area.head(&key).await?.is_some() {
            return Ok(Some(key));
        }
        let _permit = self.resizes.clone().acquire_owned().await.map_err(ApiError::internal)?;
        // Whoever held the permit before may have just made the same variant.
        if area.head(&key).await?.is_some() {
            return Ok(Some(key));
        }
        // The decoder reads a local file: the blob itself, or a copy fetched from the store.
        let fetched = paths.new_temp();
        let source = match area.local_path(&blob_key(&sha256)) {
            Some(path) => path,
            None => {
                area.fetch_to(&blob_key(&sha256), fetched.path()).await?;
                fetched.path().to_path_buf()
            }
        };
        let temp = paths.new_temp();
        let out = temp.path().to_path_buf();
        let made = actix_web::web::block(move || make_variant(&source, &out, quality)).await?;
        match made {
            Ok(true) => {
                put_content(area, &key, temp.path()).await?;
                Ok(Some(key))
            }
            Ok(false) => Ok(None),
            Err(e) => {
                tracing::warn!(sha256 = %sha256, error = %e, "image variant not made; serving the original");
                Ok(None)
            }
        }
    }

    /// Empties the repository and removes the attachment files, as one step for uploads.
    async fn reset_inner(self, origin: Origin) -> ApiResult<Head> {
        let _exclusive = self.files.write_owned().await;
        let mut guard_connection = self.pool.get().await?;
        let exclusive_everywhere = guard_connection.transaction().await?;
        attachments::lock_files_exclusive(&exclusive_everywhere).await?;
        let head = self.change_log.reset_repository(origin).await?;
        // Files go only after the commit: a failed reset must not lose attachments still
        // referenced.
        remove_files(&self.area).await;
        let _ = exclusive_everywhere.rollback().await;
        Ok(head)
    }
}

/// Removes stored attachment content and resized copies; uploads in flight (`tmp/`) are left
/// alone. What a failure leaves has no row: the orphan sweep removes it later.
async fn remove_files(area: &Area) {
    for prefix in ["blobs/", "variants/"] {
        if let Err(e) = area.delete_prefix(prefix).await {
            tracing::warn!(error = %e, prefix, "could not remove attachment data after reset");
        }
    }
}

/// Writes the resized image to `out`; `false` when the original is to be served.
fn make_variant(source: &Path, out: &Path, quality: Quality) -> Result<bool, image::ImageError> {
    use image::{ImageFormat, ImageReader};
    let open = || -> Result<_, image::ImageError> {
        let mut reader =
            ImageReader::new(BufReader::new(std::fs::File::open(source)?)).with_guessed_format()?;
        let mut limits = image::Limits::default();
        limits.max_image_width = Some(MAX_IMAGE_SIDE);
        limits.max_image_height = Some(MAX_IMAGE_SIDE);
        reader.limits(limits);
        Ok(reader)
    };
    let reader = open()?;
    let format = reader.format();
    if !matches!(format, Some(ImageFormat::Jpeg | ImageFormat::Png | ImageFormat::WebP | ImageFormat::Gif)) {
        return Ok(false);
    }
    let (width, height) = reader.into_dimensions()?;
    let Some((w, h)) = scaled_size(width, height, quality.max_side()) else {
        return Ok(false);
    };
    let resized = open()?.decode()?.resize_exact(w, h, image::imageops::FilterType::Triangle);
    let mut out = std::io::BufWriter::new(std::fs::File::create(out)?);
    match format {
        Some(ImageFormat::Jpeg) => {
            let encoder = image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 85);
            resized.to_rgb8().write_with_encoder(encoder)?;
        }
        Some(f) => resized.write_to(&mut out, f)?,
        None => return Ok(false),
    }
    let file = out.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    Ok(true)
}

/// A ZIP (stored, not compressed: attachments are mostly already-compressed media) of `rows`,
/// written on a blocking thread and streamed through a small bounded channel, so memory does not
/// depend on the attachments' sizes. A failure mid-way ends the stream with an error, which
/// aborts the response instead of sending a truncated archive that looks complete.
pub fn zip_stream(area: Area, rows: Vec<AttachmentRow>) -> impl Stream<Item = Result<Bytes, std::io::Error>> {
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    let errors = tx.clone();
    let runtime = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        if let Err(e) = write_zip(&area, &runtime, &rows, ChannelWriter::new(tx)) {
            tracing::warn!(error = %e, "attachment ZIP export stopped");
            let _ = errors.blocking_send(Err(std::io::Error::other("export failed")));
        }
    });
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) })
}

fn write_zip(
    area: &Area,
    runtime: &tokio::runtime::Handle,
    rows: &[AttachmentRow],
    out: ChannelWriter,
) -> zip::result::ZipResult<()> {
    use zip::write::SimpleFileOptions;
    let mut zip = zip::ZipWriter::new_stream(out);
    for row in rows {
        let options = SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored)
            .large_file(row.size >= i64::from(u32::MAX));
        zip.start_file(row.id.as_str(), options)?;
        let key = blob_key(&row.sha256);
        match area.local_path(&key) {
            Some(path) => {
                std::io::copy(&mut std::fs::File::open(path)?, &mut zip)?;
            }
            None => {
                let stream = runtime.block_on(area.get(&key, None)).map_err(std::io::Error::other)?;
                let reader = tokio_util::io::StreamReader::new(stream);
                let mut blocking = tokio_util::io::SyncIoBridge::new_with_handle(reader, runtime.clone());
                std::io::copy(&mut blocking, &mut zip)?;
            }
        }
    }
    let mut out = zip.finish()?.into_inner();
    out.flush()?;
    Ok(())
}

/// `std::io::Write` into a bounded channel in 64 KiB pieces; a gone receiver (the client hung up)
/// turns into a write error that stops the writer.
struct ChannelWriter {
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
    buf: Vec<u8>,
}

const CHUNK: usize = 64 * 1024;

impl ChannelWriter {
    fn new(tx: mpsc::Sender<Result<Bytes, std::io::Error>>) -> Self {
        ChannelWriter { tx, buf: Vec::with_capacity(CHUNK) }
    }

    fn send(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "client went away"))
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.send()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_removes_only_stale_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let old = dir.path().join("old.part");
        let fresh = dir.path().join("fresh.part");
        std::fs::write(&old, b"x").expect("write");
        std::fs::write(&fresh, b"y").expect("write");
        let past = SystemTime::now() - Duration::from_secs(3600);
        std::fs::File::options().write(true).open(&old).expect("open").set_modified(past).expect("mtime");
        assert_eq!(sweep_temp(dir.path(), STALE_TEMP_AGE), 1);
        assert!(!old.exists());
        assert!(fresh.exists());
    }

    #[test]
    fn temp_files_vanish_when_dropped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let paths = BlobPaths::new(dir.path());
        paths.create_dirs().expect("dirs");
        let dropped = paths.new_temp();
        std::fs::write(&dropped.path, b"a").expect("write");
        let dropped_path = dropped.path.clone();
        drop(dropped);
        assert!(!dropped_path.exists());
        assert_eq!(blob_key("abcdef"), "blobs/ab/abcdef");
    }
}
