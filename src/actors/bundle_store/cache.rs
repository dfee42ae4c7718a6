//! Each node's bounded read-through cache of bundle versions kept in an object store (docs/api.md
//! §18.1, `BUNDLE_CACHE_BYTES`). Versions are immutable, so a cached copy never goes stale: during
//! an object-store outage, every cached version keeps being served. Layout under
//! `DATA_ROOT/bundle-cache`: `versions/<id>/` and `versions/<id>.zip` (as in APP_BUNDLE_PATH; the
//! ZIP is written last, so a version with its ZIP is complete), `tmp/` for fetches in flight.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use futures_util::{StreamExt, TryStreamExt};

use super::files::{version_dir, version_prefix, zip_key, zip_path};
use super::VersionInfo;
use crate::error::ApiResult;
use crate::storage::Area;

struct Cached {
    size: u64,
    used: Instant,
}

pub(super) struct BundleCache {
    root: PathBuf,
    limit: u64,
    area: Area,
    entries: std::sync::Mutex<HashMap<String, Cached>>,
    /// One fetch or adoption at a time: two requests for an uncached version wait for one copy.
    fetching: tokio::sync::Mutex<()>,
}

fn version_size(info: &VersionInfo, zip: u64) -> u64 {
    info.manifest.files.iter().map(|file| file.size).sum::<u64>() + zip
}

impl BundleCache {
    /// Opens the cache, keeping complete versions from an earlier run and dropping the rest.
    pub(super) fn open(root: PathBuf, limit: u64, area: Area) -> anyhow::Result<Self> {
        let versions = root.join("versions");
        std::fs::create_dir_all(&versions)?;
        let _ = std::fs::remove_dir_all(root.join("tmp"));
        std::fs::create_dir_all(root.join("tmp"))?;
        let mut entries = HashMap::new();
        for entry in std::fs::read_dir(&versions)?.flatten() {
            let path = entry.path();
            if !path.is_dir() {
                continue;
            }
            let version = entry.file_name().to_string_lossy().into_owned();
            match std::fs::metadata(zip_path(&root, &version)) {
                Ok(zip) => {
                    let size = dir_size(&path) + zip.len();
                    entries.insert(version, Cached { size, used: Instant::now() });
                }
                Err(_) => {
                    let _ = std::fs::remove_dir_all(&path);
                }
            }
        }
        Ok(BundleCache {
            root,
            limit,
            area,
            entries: std::sync::Mutex::new(entries),
            fetching: Default::default(),
        })
    }

    pub(super) fn root(&self) -> &Path {
        &self.root
    }

    fn touch(&self, version: &str) -> bool {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.get_mut(version).map(|cached| cached.used = Instant::now()).is_some()
    }

    /// Makes `info`'s files readable at `info.dir` and `info.zip_path`, fetching them once;
    /// `active` is never evicted to make room.
    pub(super) async fn ensure(&self, info: &VersionInfo, active: Option<&str>) -> ApiResult<()> {
        if self.touch(&info.version) {
            return Ok(());
        }
        let _one = self.fetching.lock().await;
        if self.touch(&info.version) {
            return Ok(());
        }
        let temp = self.root.join("tmp").join(uuid::Uuid::new_v4().simple().to_string());
        let fetched = self.fetch(info, &temp).await;
        let _ = tokio::fs::remove_dir_all(&temp).await;
        let zip = fetched?;
        self.insert(&info.version, version_size(info, zip), active).await;
        Ok(())
    }

    async fn fetch(&self, info: &VersionInfo, temp: &Path) -> ApiResult<u64> {
        let prefix = version_prefix(&info.version);
        futures_util::stream::iter(&info.manifest.files)
            .map(|file| {
                let dest = file.path.split('/').fold(temp.to_path_buf(), |dir, part| dir.join(part));
                let key = format!("{prefix}{}", file.path);
                async move { self.area.fetch_to(&key, &dest).await }
            })
            .buffer_unordered(8)
            .try_collect::<()>()
            .await?;
        tokio::fs::create_dir_all(temp).await?;
        let dir = version_dir(&self.root, &info.version);
        let _ = tokio::fs::remove_dir_all(&dir).await;
        tokio::fs::rename(temp, &dir).await?;
        let zip = zip_path(&self.root, &info.version);
        self.area.fetch_to(&zip_key(&info.version), &zip).await?;
        Ok(tokio::fs::metadata(&zip).await?.len())
    }

    /// Takes in a version this node has just stored (its unpacked folder and its ZIP), unless it
    /// fetched the version already: the activation's notification reaches this node while the
    /// upload is still being taken in, and each replaced the other's folder under the requests
    /// reading it (a download then answered 404 until the version left the cache).
    pub(super) async fn adopt(
        &self,
        info: &VersionInfo,
        staging: &Path,
        upload: &Path,
        active: Option<&str>,
    ) {
        let _one = self.fetching.lock().await;
        if self.touch(&info.version) {
            return;
        }
        let dir = version_dir(&self.root, &info.version);
        let moved = async {
            let _ = tokio::fs::remove_dir_all(&dir).await;
            tokio::fs::rename(staging, &dir).await?;
            tokio::fs::rename(upload, zip_path(&self.root, &info.version)).await?;
            tokio::fs::metadata(zip_path(&self.root, &info.version)).await.map(|m| m.len())
        }
        .await;
        match moved {
            Ok(zip) => self.insert(&info.version, version_size(info, zip), active).await,
            Err(error) => {
                tracing::warn!(%error, version = %info.version, "cannot cache a new app bundle version");
                let _ = tokio::fs::remove_dir_all(&dir).await;
            }
        }
    }

    async fn insert(&self, version: &str, size: u64, active: Option<&str>) {
        let victims = {
            let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            entries.insert(version.to_owned(), Cached { size, used: Instant::now() });
            let mut total: u64 = entries.values().map(|c| c.size).sum();
            let mut by_age: Vec<(String, Instant, u64)> = entries
                .iter()
                .filter(|(name, _)| name.as_str() != version && Some(name.as_str()) != active)
                .map(|(name, c)| (name.clone(), c.used, c.size))
                .collect();
            by_age.sort_by_key(|(_, used, _)| *used);
            let mut victims = Vec::new();
            for (name, _, size) in by_age {
                if total <= self.limit {
                    break;
                }
                total = total.saturating_sub(size);
                entries.remove(&name);
                victims.push(name);
            }
            victims
        };
        for victim in victims {
            self.remove_files(&victim).await;
        }
    }

    /// Forgets a version (retention removed it).
    pub(super) async fn remove(&self, version: &str) {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).remove(version);
        self.remove_files(version).await;
    }

    async fn remove_files(&self, version: &str) {
        let _ = tokio::fs::remove_file(zip_path(&self.root, version)).await;
        let _ = tokio::fs::remove_dir_all(version_dir(&self.root, version)).await;
    }
}

fn dir_size(dir: &Path) -> u64 {
    walkdir::WalkDir::new(dir)
        .into_iter()
        .flatten()
        .filter_map(|entry| entry.metadata().ok())
        .filter(|meta| meta.is_file())
        .map(|meta| meta.len())
        .sum()
}
