//! `VersionInfo`: what the bundle store knows of one stored version, shared with every read of it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use chrono::{DateTime, Utc};

use super::files::{version_dir, zip_path};
use crate::db;
use crate::domain::bundle::{BundleManifest, ManifestFile};
use crate::error::{ApiError, ApiResult};

/// One stored version: its manifest (computed once, at upload) and where its files are.
#[derive(Debug)]
pub struct VersionInfo {
    pub version: String,
    pub created_at: DateTime<Utc>,
    pub manifest: BundleManifest,
    /// The serialised manifest, served as is by `GET /app-bundle/manifest`.
    pub manifest_body: Bytes,
    /// The version's own immutable folder.
    pub dir: PathBuf,
    /// The validated ZIP as pushed (docs/api.md §17.6).
    pub zip_path: PathBuf,
    by_path: HashMap<String, usize>,
}

impl VersionInfo {
    pub(super) fn new(root: &Path, created_at: DateTime<Utc>, manifest: BundleManifest) -> ApiResult<Self> {
        let manifest_body = Bytes::from(serde_json::to_vec(&manifest).map_err(ApiError::internal)?);
        let by_path = manifest.files.iter().enumerate().map(|(i, file)| (file.path.clone(), i)).collect();
        Ok(VersionInfo {
            version: manifest.version.clone(),
            created_at,
            dir: version_dir(root, &manifest.version),
            zip_path: zip_path(root, &manifest.version),
            manifest_body,
            manifest,
            by_path,
        })
    }

    pub(super) fn from_row(root: &Path, row: db::bundles::VersionRow) -> ApiResult<Self> {
        let manifest: BundleManifest = serde_json::from_value(row.manifest).map_err(|e| {
            ApiError::internal(format!("stored manifest of {} is unreadable: {e}", row.version))
        })?;
        Self::new(root, row.created_at, manifest)
    }

    /// The manifest entry of a file, `None` for unknown paths and directories.
    pub fn file(&self, path: &str) -> Option<&ManifestFile> {
        self.by_path.get(path).and_then(|&index| self.manifest.files.get(index))
    }

    /// Where a listed file is stored. Only call with a path [`Self::file`] knows: those were
    /// checked safe when the bundle was validated.
    pub fn file_path(&self, path: &str) -> PathBuf {
        path.split('/').fold(self.dir.clone(), |dir, segment| dir.join(segment))
    }
}
