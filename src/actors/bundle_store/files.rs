//! Where the bundle store keeps its files: keys `versions/<id>/…` (the unpacked version) and
//! `versions/<id>.zip` (the upload as pushed) in the bundles storage area, which is APP_BUNDLE_PATH
//! itself with the local backend; uploads and staging folders in `APP_BUNDLE_PATH/tmp/`. Reads
//! always use local files: the area's own with the local backend, this node's cache otherwise.
//! Only the store writes or removes these.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::cache::BundleCache;
use super::VersionInfo;
use crate::domain::bundle::{build_manifest, extract, ManifestFile, ValidatedBundle};
use crate::error::ApiResult;
use crate::storage::Area;

/// Staging entries older than this at start-up belong to no running upload.
const STALE_STAGING_AGE: Duration = Duration::from_secs(6 * 3600);

pub(super) fn version_dir(root: &Path, version: &str) -> PathBuf {
    root.join("versions").join(version)
}

pub(super) fn zip_path(root: &Path, version: &str) -> PathBuf {
    root.join("versions").join(format!("{version}.zip"))
}

pub fn version_prefix(version: &str) -> String {
    format!("versions/{version}/")
}

pub fn zip_key(version: &str) -> String {
    format!("versions/{version}.zip")
}

/// The versions' files in storage and where this node reads them.
#[derive(Clone)]
pub(super) struct BundleFiles {
    area: Area,
    cache: Option<Arc<BundleCache>>,
}

impl BundleFiles {
    pub(super) fn new(config: &crate::config::Config, area: Area) -> anyhow::Result<Self> {
        let cache = match &area {
            Area::Local(root) => {
                std::fs::create_dir_all(root.join("versions"))?;
                None
            }
            Area::Object(_) => {
                let root = config.data_root.join("bundle-cache");
                Some(Arc::new(BundleCache::open(root, config.bundle_cache_bytes, area.clone())?))
            }
        };
        Ok(BundleFiles { area, cache })
    }

    /// The folder that holds `versions/` for reads on this node.
    pub(super) fn local_root(&self) -> PathBuf {
        match (&self.cache, &self.area) {
            (Some(cache), _) => cache.root().to_path_buf(),
            (None, area) => area.local_path("").unwrap_or_default(),
        }
    }

    /// Stores a version's unpacked folder and ZIP under its new id, before its row is committed.
    /// Files left under that id by a crash have no row: they go first.
    pub(super) async fn publish(&self, version: &str, staging: &Path, upload: &Path) -> ApiResult<()> {
        self.unpublish(version).await?;
        self.area.put_dir(&version_prefix(version), staging).await?;
        self.area.put_file(&zip_key(version), upload).await?;
        Ok(())
    }

    /// Removes a version's stored files (a failed commit, or retention after its row went).
    pub(super) async fn unpublish(&self, version: &str) -> ApiResult<()> {
        self.area.delete(&zip_key(version)).await?;
        self.area.delete_prefix(&version_prefix(version)).await?;
        if let Some(cache) = &self.cache {
            cache.remove(version).await;
        }
        Ok(())
    }

    /// After the commit: the cache takes the staged copy; what is left of the upload goes.
    pub(super) async fn committed(
        &self,
        info: &VersionInfo,
        staging: &Path,
        upload: &Path,
        active: Option<&str>,
    ) {
        if let Some(cache) = &self.cache {
            cache.adopt(info, staging, upload, active).await;
        }
        let _ = tokio::fs::remove_dir_all(staging).await;
        let _ = tokio::fs::remove_file(upload).await;
    }

    /// Removes stored files of no stored version (docs/storage.md); a failure is logged.
    pub(super) async fn sweep(&self, pool: &deadpool_postgres::Pool) {
        match crate::storage::sweep::sweep_bundles(&self.area, pool).await {
            Ok(0) => {}
            Ok(removed) => tracing::info!(removed, "removed app bundle files without a row"),
            Err(error) => tracing::warn!(%error, "app bundle orphan sweep failed"),
        }
    }

    /// Makes a version's files readable on this node (a no-op with the local backend).
    pub(super) async fn ensure(&self, info: &VersionInfo, active: Option<&str>) -> ApiResult<()> {
        match &self.cache {
            Some(cache) => cache.ensure(info, active).await,
            None => Ok(()),
        }
    }
}

/// Where uploads and staging folders live: inside APP_BUNDLE_PATH, so renames are atomic.
pub fn staging_dir(root: &Path) -> PathBuf {
    root.join("tmp")
}

/// Extracts into `staging` and hashes every file once. The id is not known yet, so the
/// bundle hash is computed later from these entries.
pub(super) fn unpack(
    bundle: &ValidatedBundle,
    upload: &Path,
    staging: &Path,
    created_at: DateTime<Utc>,
) -> std::io::Result<Vec<ManifestFile>> {
    std::fs::create_dir_all(staging)?;
    extract(bundle, upload, staging)?;
    Ok(build_manifest("", "", &bundle.entry_point, created_at, staging)?.files)
}

/// Uploads and staging folders left by a crash. Only old ones: another process sharing
/// APP_BUNDLE_PATH may be receiving an upload right now.
pub(super) fn remove_stale_staging(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let age = entry.metadata().and_then(|meta| meta.modified()).ok().and_then(|t| t.elapsed().ok());
        if age.is_some_and(|age| age > STALE_STAGING_AGE) {
            let path = entry.path();
            let removed =
                if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
            if let Err(error) = removed {
                tracing::warn!(%error, path = %path.display(), "cannot remove a stale app bundle upload");
            }
        }
    }
}
