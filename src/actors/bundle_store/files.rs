//! Where the bundle store keeps its files under APP_BUNDLE_PATH: `versions/<id>/` (the unpacked
//! version), `versions/<id>.zip` (the upload as pushed) and `tmp/` (uploads and staging folders).
//! Only the store writes or removes these.

use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::domain::bundle::{build_manifest, extract, ManifestFile, ValidatedBundle};

/// Staging entries older than this at start-up belong to no running upload.
const STALE_STAGING_AGE: Duration = Duration::from_secs(6 * 3600);

pub fn version_dir(root: &Path, version: &str) -> PathBuf {
    root.join("versions").join(version)
}

pub fn zip_path(root: &Path, version: &str) -> PathBuf {
    root.join("versions").join(format!("{version}.zip"))
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

/// A version's folder and ZIP left by a crash between rename and commit have no row: they are
/// orphans, in the way of the version about to take their id.
pub(super) async fn remove_unrecorded(paths: [&Path; 2]) {
    for leftover in paths {
        if tokio::fs::symlink_metadata(leftover).await.is_ok() {
            tracing::warn!(path = %leftover.display(), "removing an unrecorded app bundle leftover");
            remove_path(leftover).await;
        }
    }
}

/// Removes a file or a folder; a failure is logged, as nothing waits on it.
pub(super) async fn remove_path(path: &Path) {
    let result = match tokio::fs::symlink_metadata(path).await {
        Ok(meta) if meta.is_dir() => tokio::fs::remove_dir_all(path).await,
        Ok(_) => tokio::fs::remove_file(path).await,
        Err(_) => return,
    };
    if let Err(error) = result {
        tracing::warn!(%error, path = %path.display(), "cannot remove app bundle files");
    }
}
