//! The local-folder backend: keys are relative paths under a root, the layout deployments have
//! always had. Creates go through a hard link, which fails when the name exists, so a file is
//! never overwritten and appears whole.

use std::io::ErrorKind;
use std::ops::Range;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

use super::{temp_name, ByteStream, Entry, StorageError, StorageResult};

pub(super) fn path(root: &Path, key: &str) -> PathBuf {
    key.split('/').filter(|s| !s.is_empty()).fold(root.to_path_buf(), |dir, segment| dir.join(segment))
}

fn not_found(key: &str) -> impl Fn(std::io::Error) -> StorageError + '_ {
    move |e| match e.kind() {
        ErrorKind::NotFound => StorageError::NotFound(key.to_owned()),
        _ => StorageError::Io(e),
    }
}

async fn sync_dir(dir: Option<&Path>) -> std::io::Result<()> {
    if let Some(dir) = dir {
        tokio::fs::File::open(dir).await?.sync_all().await?;
    }
    Ok(())
}

/// Links `src` to `dest` (fails if `dest` exists); across file systems, copies to a temp
/// sibling of `dest` first.
async fn link_new(src: &Path, dest: &Path) -> StorageResult<()> {
    if let Some(dir) = dest.parent() {
        tokio::fs::create_dir_all(dir).await?;
    }
    let linked = match tokio::fs::hard_link(src, dest).await {
        Err(e) if e.kind() != ErrorKind::AlreadyExists && e.kind() != ErrorKind::NotFound => {
            let temp = dest.with_file_name(temp_name());
            tokio::fs::copy(src, &temp).await?;
            tokio::fs::File::open(&temp).await?.sync_all().await?;
            let linked = tokio::fs::hard_link(&temp, dest).await;
            let _ = tokio::fs::remove_file(&temp).await;
            linked
        }
        other => other,
    };
    match linked {
        Ok(()) => Ok(sync_dir(dest.parent()).await?),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {
            Err(StorageError::AlreadyExists(dest.display().to_string()))
        }
        Err(e) => Err(e.into()),
    }
}

pub(super) async fn put_file(root: &Path, key: &str, src: &Path) -> StorageResult<()> {
    link_new(src, &path(root, key)).await
}

pub(super) async fn put_bytes(root: &Path, key: &str, bytes: Bytes) -> StorageResult<()> {
    let dest = path(root, key);
    if let Some(dir) = dest.parent() {
        tokio::fs::create_dir_all(dir).await?;
    }
    let temp = dest.with_file_name(temp_name());
    let written = async {
        let mut file = tokio::fs::File::create(&temp).await?;
        file.write_all(&bytes).await?;
        file.sync_all().await?;
        StorageResult::Ok(())
    }
    .await;
    let result = match written {
        Ok(()) => link_new(&temp, &dest).await,
        Err(e) => Err(e),
    };
    let _ = tokio::fs::remove_file(&temp).await;
    result
}

/// Moves the folder `src` to `prefix` in one rename (the folder must not exist yet).
pub(super) async fn put_dir(root: &Path, prefix: &str, src: &Path) -> StorageResult<()> {
    let dest = path(root, prefix);
    if tokio::fs::symlink_metadata(&dest).await.is_ok() {
        return Err(StorageError::AlreadyExists(dest.display().to_string()));
    }
    if let Some(dir) = dest.parent() {
        tokio::fs::create_dir_all(dir).await?;
    }
    if tokio::fs::rename(src, &dest).await.is_err() {
        // Another file system (STORAGE_URL elsewhere than the staging folder): file by file.
        for entry in list(src, "").await? {
            link_new(&path(src, &entry.key), &path(&dest, &entry.key)).await?;
        }
    }
    Ok(sync_dir(dest.parent()).await?)
}

pub(super) async fn head(root: &Path, key: &str) -> StorageResult<Option<u64>> {
    match tokio::fs::metadata(path(root, key)).await {
        Ok(meta) if meta.is_file() => Ok(Some(meta.len())),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}

pub(super) async fn get(root: &Path, key: &str, range: Option<Range<u64>>) -> StorageResult<ByteStream> {
    let mut file = tokio::fs::File::open(path(root, key)).await.map_err(not_found(key))?;
    let (start, len) = match range {
        Some(r) => (r.start, r.end.saturating_sub(r.start)),
        None => (0, u64::MAX),
    };
    if start > 0 {
        file.seek(std::io::SeekFrom::Start(start)).await?;
    }
    Ok(tokio_util::io::ReaderStream::with_capacity(file.take(len), 64 * 1024).boxed())
}

/// Writes a stream to `dest` through a temp sibling and a rename.
pub(crate) async fn write_stream(dest: &Path, stream: &mut ByteStream) -> StorageResult<()> {
    if let Some(dir) = dest.parent() {
        tokio::fs::create_dir_all(dir).await?;
    }
    let temp = dest.with_file_name(temp_name());
    let written = async {
        let mut file = tokio::fs::File::create(&temp).await?;
        while let Some(chunk) = stream.try_next().await? {
            file.write_all(&chunk).await?;
        }
        file.sync_all().await?;
        tokio::fs::rename(&temp, dest).await
    }
    .await;
    if written.is_err() {
        let _ = tokio::fs::remove_file(&temp).await;
    }
    Ok(written?)
}

pub(super) async fn delete(root: &Path, key: &str) -> StorageResult<()> {
    match tokio::fs::remove_file(path(root, key)).await {
        Err(e) if e.kind() != ErrorKind::NotFound => Err(e.into()),
        _ => Ok(()),
    }
}

pub(super) async fn delete_dir(root: &Path, prefix: &str) -> StorageResult<()> {
    match tokio::fs::remove_dir_all(path(root, prefix)).await {
        Err(e) if e.kind() != ErrorKind::NotFound => Err(e.into()),
        _ => Ok(()),
    }
}

pub(super) async fn list(root: &Path, prefix: &str) -> StorageResult<Vec<Entry>> {
    let (root, prefix) = (root.to_path_buf(), prefix.to_owned());
    tokio::task::spawn_blocking(move || list_blocking(&root, &prefix))
        .await
        .map_err(|e| StorageError::Io(std::io::Error::other(e)))?
}

fn list_blocking(root: &Path, prefix: &str) -> StorageResult<Vec<Entry>> {
    // A prefix is a folder (ending in `/`) or a name's beginning within its folder.
    let (dir_key, name_start) = match prefix.rsplit_once('/') {
        Some((dir, start)) => (dir.to_owned(), start.to_owned()),
        None => (String::new(), prefix.to_owned()),
    };
    let mut out = Vec::new();
    let mut pending = vec![dir_key];
    let mut first = true;
    while let Some(dir_key) = pending.pop() {
        let entries = match std::fs::read_dir(path(root, &dir_key)) {
            Ok(entries) => entries,
            Err(e) if e.kind() == ErrorKind::NotFound => continue,
            Err(e) => return Err(e.into()),
        };
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if (first && !name.starts_with(&name_start)) || name.starts_with(".tmp-") {
                continue;
            }
            let key = if dir_key.is_empty() { name } else { format!("{dir_key}/{name}") };
            let meta = entry.metadata()?;
            if meta.is_dir() {
                pending.push(key);
            } else {
                out.push(Entry { key, size: meta.len(), modified: meta.modified()? });
            }
        }
        first = false;
    }
    Ok(out)
}
