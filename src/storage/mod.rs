//! Where files live (docs/api.md §18.1): attachment blobs and variants, app-bundle versions and
//! export-job files, each in its own [`Area`]. Two backends: local folders (the default, today's
//! layout under `ATTACHMENTS_PATH`, `APP_BUNDLE_PATH` and `DATA_ROOT/exports`) and an S3-compatible
//! object store (`STORAGE_URL=s3://…`). Both give the same guarantees: a file is visible whole or
//! not at all, and a create never overwrites (the caller learns [`StorageError::AlreadyExists`]).

mod local;
mod object;
pub mod ops;
pub mod sweep;

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures_util::stream::BoxStream;

use crate::config::{StorageConfig, StorageUrl};
pub use object::ObjectArea;

/// An unreachable object store answers within this (docs/api.md §18.1 asks 10 s for a 503).
pub const STORE_TIMEOUT: Duration = Duration::from_secs(8);

/// A file's bytes as they arrive; memory stays flat whatever the size.
pub type ByteStream = BoxStream<'static, Result<Bytes, std::io::Error>>;

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("file not found: {0}")]
    NotFound(String),
    #[error("file already exists: {0}")]
    AlreadyExists(String),
    /// The object store did not answer, refused, or failed: the request may succeed later.
    #[error("file storage unavailable: {0}")]
    Unavailable(String),
    #[error("file storage I/O error: {0}")]
    Io(#[from] std::io::Error),
}

impl StorageError {
    pub fn is_unavailable(&self) -> bool {
        matches!(self, StorageError::Unavailable(_))
    }
}

pub type StorageResult<T> = Result<T, StorageError>;

/// One stored file as a listing shows it.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Relative to the area, `/`-separated.
    pub key: String,
    pub size: u64,
    pub modified: SystemTime,
}

/// One kind of files: a folder, or a prefix in a bucket. Keys are `/`-separated relative paths.
#[derive(Clone)]
pub enum Area {
    Local(PathBuf),
    Object(ObjectArea),
}

impl std::fmt::Debug for Area {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Area::Local(root) => write!(f, "Local({})", root.display()),
            Area::Object(area) => write!(f, "Object({})", area.describe()),
        }
    }
}

impl Area {
    /// Where a key is on this node's disk, for the local backend only.
    pub fn local_path(&self, key: &str) -> Option<PathBuf> {
        match self {
            Area::Local(root) => Some(local::path(root, key)),
            Area::Object(_) => None,
        }
    }

    pub fn is_local(&self) -> bool {
        matches!(self, Area::Local(_))
    }

    /// For spans: which backend a call went to.
    fn backend(&self) -> &'static str {
        match self {
            Area::Local(_) => "local",
            Area::Object(_) => "object",
        }
    }

    /// Stores the file at `src` under `key` unless the key exists ([`StorageError::AlreadyExists`]).
    /// `src` is left for the caller to remove; big files go up in parts.
    #[tracing::instrument(name = "storage.put_file", level = "debug", skip(self, src), fields(backend = self.backend()))]
    pub async fn put_file(&self, key: &str, src: &Path) -> StorageResult<()> {
        match self {
            Area::Local(root) => local::put_file(root, key, src).await,
            Area::Object(area) => area.put_file(key, src).await,
        }
    }

    /// Stores `bytes` under `key` unless the key exists.
    #[tracing::instrument(name = "storage.put_bytes", level = "debug", skip(self, bytes), fields(backend = self.backend()))]
    pub async fn put_bytes(&self, key: &str, bytes: Bytes) -> StorageResult<()> {
        match self {
            Area::Local(root) => local::put_bytes(root, key, bytes).await,
            Area::Object(area) => area.put_bytes(key, bytes).await,
        }
    }

    /// Stores every file under the folder `src` below `prefix` (a local folder is moved).
    #[tracing::instrument(name = "storage.put_dir", level = "debug", skip(self, src), fields(backend = self.backend()))]
    pub async fn put_dir(&self, prefix: &str, src: &Path) -> StorageResult<()> {
        match self {
            Area::Local(root) => local::put_dir(root, prefix, src).await,
            Area::Object(area) => area.put_dir(prefix, src).await,
        }
    }

    /// The size of `key`, `None` when it does not exist.
    #[tracing::instrument(name = "storage.head", level = "debug", skip(self), fields(backend = self.backend()))]
    pub async fn head(&self, key: &str) -> StorageResult<Option<u64>> {
        match self {
            Area::Local(root) => local::head(root, key).await,
            Area::Object(area) => area.head(key).await,
        }
    }

    /// Streams `key`, or the bytes `range` of it.
    #[tracing::instrument(name = "storage.get", level = "debug", skip(self, range), fields(backend = self.backend()))]
    pub async fn get(&self, key: &str, range: Option<Range<u64>>) -> StorageResult<ByteStream> {
        match self {
            Area::Local(root) => local::get(root, key, range).await,
            Area::Object(area) => area.get(key, range).await,
        }
    }

    /// Copies `key` into the local file `dest`, which appears whole or not at all.
    #[tracing::instrument(name = "storage.fetch_to", level = "debug", skip(self, dest), fields(backend = self.backend()))]
    pub async fn fetch_to(&self, key: &str, dest: &Path) -> StorageResult<()> {
        let mut stream = self.get(key, None).await?;
        local::write_stream(dest, &mut stream).await
    }

    /// Removes `key`; a missing key is not an error.
    #[tracing::instrument(name = "storage.delete", level = "debug", skip(self), fields(backend = self.backend()))]
    pub async fn delete(&self, key: &str) -> StorageResult<()> {
        match self {
            Area::Local(root) => local::delete(root, key).await,
            Area::Object(area) => area.delete(key).await,
        }
    }

    /// Removes every key below `prefix` (a folder, ending in `/`).
    #[tracing::instrument(name = "storage.delete_prefix", level = "debug", skip(self), fields(backend = self.backend()))]
    pub async fn delete_prefix(&self, prefix: &str) -> StorageResult<()> {
        match self {
            Area::Local(root) => local::delete_dir(root, prefix).await,
            Area::Object(area) => area.delete_prefix(prefix).await,
        }
    }

    /// Every file below `prefix` (`""` for all), in no particular order.
    #[tracing::instrument(name = "storage.list", level = "debug", skip(self), fields(backend = self.backend()))]
    pub async fn list(&self, prefix: &str) -> StorageResult<Vec<Entry>> {
        match self {
            Area::Local(root) => local::list(root, prefix).await,
            Area::Object(area) => area.list(prefix).await,
        }
    }
}

/// The three areas of one deployment.
#[derive(Clone, Debug)]
pub struct Storage {
    pub attachments: Area,
    pub bundles: Area,
    pub exports: Area,
}

impl Storage {
    /// The areas `settings` name; an S3 bucket is not contacted yet (see [`Storage::check`]).
    pub fn open(settings: &StorageConfig) -> anyhow::Result<Storage> {
        Ok(match &settings.url {
            None => Storage {
                attachments: Area::Local(settings.attachments_path.clone()),
                bundles: Area::Local(settings.app_bundle_path.clone()),
                exports: Area::Local(settings.exports_path.clone()),
            },
            Some(StorageUrl::File(root)) => Storage {
                attachments: Area::Local(root.join("attachments")),
                bundles: Area::Local(root.join("app-bundles")),
                exports: Area::Local(root.join("exports")),
            },
            Some(StorageUrl::S3 { bucket, prefix }) => {
                let (store, reader) = object::connect(bucket, &settings.aws)?;
                let area = |name: &str| {
                    Area::Object(ObjectArea::new(
                        store.clone(),
                        reader.clone(),
                        bucket,
                        &format!("{prefix}{name}/"),
                    ))
                };
                Storage {
                    attachments: area("attachments"),
                    bundles: area("app-bundles"),
                    exports: area("exports"),
                }
            }
        })
    }

    pub fn is_local(&self) -> bool {
        self.attachments.is_local()
    }

    pub fn areas(&self) -> [(&'static str, &Area); 3] {
        [("attachments", &self.attachments), ("app-bundles", &self.bundles), ("exports", &self.exports)]
    }

    /// Whether the store answers (for `/health`): a listing of nothing, bounded in time.
    pub async fn check(&self) -> StorageResult<()> {
        match &self.attachments {
            Area::Local(root) => {
                tokio::fs::metadata(root).await?;
                Ok(())
            }
            Area::Object(area) => area.check().await,
        }
    }

    /// A bucket that does not exist stops start-up, naming the variable; an unreachable store
    /// only warns (routes that need files answer 503 until it is back).
    pub async fn check_at_start(&self) -> anyhow::Result<()> {
        for (name, area) in self.areas() {
            if let Some(root) = area.local_path("") {
                std::fs::create_dir_all(&root).map_err(|e| {
                    anyhow::anyhow!("STORAGE_URL: cannot create {} ({name}): {e}", root.display())
                })?;
            }
        }
        match self.check().await {
            Ok(()) => Ok(()),
            Err(StorageError::NotFound(what)) => anyhow::bail!("STORAGE_URL: {what}"),
            Err(error) if !self.is_local() => {
                tracing::warn!(%error, "the object store does not answer; file routes answer 503 until it does");
                Ok(())
            }
            Err(error) => anyhow::bail!("STORAGE_URL: {error}"),
        }
    }
}

/// A fresh unique name for temp files.
pub(crate) fn temp_name() -> String {
    format!(".tmp-{}", uuid::Uuid::new_v4().simple())
}
