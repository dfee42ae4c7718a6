//! The files of an import: the Go attachment folder (one file per id), copied into the
//! content-addressed blob store the way an upload lands there (hashed while written to `tmp/`,
//! fsynced, renamed into `blobs/<aa>/<sha256>`), and a record of every file the import created so
//! that a failure removes them again.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::actors::attachment_store::BlobPaths;

/// The files of the source's attachment folder: id (the path below the folder, `/`-separated)
/// to size.
#[derive(Debug, Default)]
pub struct SourceFiles {
    pub root: Option<PathBuf>,
    pub sizes: HashMap<String, u64>,
}

impl SourceFiles {
    /// Every regular file below `root`; symbolic links and unreadable names are returned as
    /// warnings, not followed.
    pub fn scan(root: &Path) -> anyhow::Result<(Self, Vec<String>)> {
        if !root.is_dir() {
            anyhow::bail!("--attachments {}: not a folder", root.display());
        }
        let mut sizes = HashMap::new();
        let mut warnings = Vec::new();
        for entry in walkdir::WalkDir::new(root).follow_links(false).min_depth(1) {
            let entry = entry?;
            if entry.file_type().is_dir() {
                continue;
            }
            let relative = entry.path().strip_prefix(root)?;
            let id = relative.components().map(|c| c.as_os_str().to_str()).collect::<Option<Vec<&str>>>();
            match (entry.file_type().is_file(), id) {
                (true, Some(parts)) => {
                    sizes.insert(parts.join("/"), entry.metadata()?.len());
                }
                _ => warnings
                    .push(format!("{} is not a regular file with a UTF-8 name: skipped", relative.display())),
            }
        }
        Ok((SourceFiles { root: Some(root.to_path_buf()), sizes }, warnings))
    }

    pub fn total_bytes(&self) -> u64 {
        self.sizes.values().sum()
    }

    pub fn path_of(&self, id: &str) -> Option<PathBuf> {
        let root = self.root.as_ref()?;
        self.sizes.contains_key(id).then(|| id.split('/').fold(root.clone(), |p, s| p.join(s)))
    }
}

/// Files this import created; removed again unless the import commits.
#[derive(Debug, Default)]
pub struct Written {
    paths: Vec<PathBuf>,
}

impl Written {
    pub fn add(&mut self, path: PathBuf) {
        self.paths.push(path);
    }

    pub fn extend(&mut self, other: Written) {
        self.paths.extend(other.paths);
    }

    /// Stores every created file in the storage areas under its path relative to
    /// ATTACHMENTS_PATH or APP_BUNDLE_PATH (docs/storage.md), before the commit. With the default
    /// storage the files are already in place; otherwise the local copies were only staging, and
    /// `true` says they may go once the import committed.
    pub async fn publish(
        &self,
        storage: &crate::storage::Storage,
        config: &crate::config::Config,
    ) -> anyhow::Result<bool> {
        let mut staged = false;
        let roots =
            [(&config.attachments_path, &storage.attachments), (&config.app_bundle_path, &storage.bundles)];
        for path in &self.paths {
            for (root, area) in roots {
                let Ok(relative) = path.strip_prefix(root) else { continue };
                let key_of = |p: &Path| -> Vec<String> {
                    p.iter().map(|s| s.to_string_lossy().into_owned()).collect()
                };
                if area.local_path(&key_of(relative).join("/")).as_deref() == Some(path.as_path()) {
                    continue;
                }
                staged = true;
                for entry in walkdir::WalkDir::new(path).follow_links(false) {
                    let entry = entry?;
                    if !entry.file_type().is_file() {
                        continue;
                    }
                    let key = key_of(entry.path().strip_prefix(root)?).join("/");
                    match area.put_file(&key, entry.path()).await {
                        Ok(()) | Err(crate::storage::StorageError::AlreadyExists(_)) => {}
                        Err(e) => return Err(anyhow::anyhow!("cannot store {key}: {e}")),
                    }
                }
            }
        }
        Ok(staged)
    }

    /// Removes every created file and folder; what cannot be removed is returned.
    pub fn remove_all(&mut self) -> Vec<String> {
        let mut failed = Vec::new();
        for path in self.paths.drain(..).rev() {
            let result = match std::fs::symlink_metadata(&path) {
                Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(&path),
                Ok(_) => std::fs::remove_file(&path),
                Err(_) => Ok(()),
            };
            if let Err(e) = result {
                failed.push(format!("{}: {e}", path.display()));
            }
        }
        failed
    }
}

/// A copied (or, in a dry run, only read) file: its SHA-256, its size, and the blob this copy
/// created (`None` when the content was there already or nothing was written).
pub struct Copied {
    pub sha256: String,
    pub size: u64,
    pub created: Option<PathBuf>,
}

/// Reads `source` once, hashing it; with `blobs`, writes it to a temp file on the way and moves
/// that into the blob store, durable before this returns.
pub fn copy_blob(source: &Path, blobs: Option<&BlobPaths>) -> std::io::Result<Copied> {
    let mut input = std::fs::File::open(source)?;
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    let mut buf = vec![0u8; 256 * 1024];
    let Some(blobs) = blobs else {
        loop {
            let n = input.read(&mut buf)?;
            if n == 0 {
                return Ok(Copied { sha256: hex::encode(hasher.finalize()), size, created: None });
            }
            hasher.update(&buf[..n]);
            size += n as u64;
        }
    };
    std::fs::create_dir_all(blobs.tmp_dir())?;
    let temp = blobs.tmp_dir().join(format!("import-{}.part", uuid::Uuid::new_v4().simple()));
    let result = (|| {
        let mut out = std::fs::File::create(&temp)?;
        loop {
            let n = input.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n])?;
            size += n as u64;
        }
        out.sync_all()?;
        let sha256 = hex::encode(hasher.finalize_reset());
        let dest = blobs.blob(&sha256);
        if dest.exists() {
            std::fs::remove_file(&temp)?;
            return Ok(Copied { sha256, size, created: None });
        }
        let dir = dest.parent().map(Path::to_path_buf).unwrap_or_default();
        std::fs::create_dir_all(&dir)?;
        std::fs::rename(&temp, &dest)?;
        std::fs::File::open(&dir)?.sync_all()?;
        Ok(Copied { sha256, size, created: Some(dest) })
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scans_copies_and_removes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let source = dir.path().join("src");
        std::fs::create_dir_all(source.join("sub")).expect("mkdir");
        std::fs::write(source.join("a.jpg"), b"alpha").expect("write");
        std::fs::write(source.join("sub").join("b.bin"), b"beta").expect("write");
        let (files, warnings) = SourceFiles::scan(&source).expect("scan");
        assert!(warnings.is_empty());
        assert_eq!(files.sizes.len(), 2);
        assert_eq!(files.total_bytes(), 9);
        let b = files.path_of("sub/b.bin").expect("known");
        assert!(files.path_of("c").is_none());

        let blobs = BlobPaths::new(&dir.path().join("store"));
        let dry = copy_blob(&b, None).expect("hash");
        assert!(dry.created.is_none());
        let copied = copy_blob(&b, Some(&blobs)).expect("copy");
        assert_eq!(copied.sha256, dry.sha256);
        let created = copied.created.expect("new blob");
        assert_eq!(std::fs::read(&created).expect("read"), b"beta");
        assert!(copy_blob(&b, Some(&blobs)).expect("again").created.is_none(), "same content, no new file");
        let mut written = Written::default();
        written.add(created.clone());
        assert!(written.remove_all().is_empty());
        assert!(!created.exists());
    }
}
