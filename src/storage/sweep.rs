//! The orphan sweep (docs/api.md §18.1): files no database row refers to, left by a crash
//! between storing a file and committing its row, or by a deletion that failed. Only files older
//! than [`ORPHAN_AGE`] go, so an upload between its store and its commit is never touched; the
//! final check of the rows runs under the same lock as uploads (the attachment store's file lock,
//! the bundle lock), so a row committed meanwhile keeps its file.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use deadpool_postgres::Pool;

use super::{Area, Entry};
use crate::db;

pub const ORPHAN_AGE: Duration = Duration::from_secs(3600);

/// The content hash an attachments key belongs to: `blobs/<aa>/<sha256>`, `variants/<sha256>-<q>`.
pub fn attachment_owner(key: &str) -> Option<&str> {
    if let Some(rest) = key.strip_prefix("blobs/") {
        return rest.split_once('/').map(|(_, sha)| sha);
    }
    key.strip_prefix("variants/").and_then(|rest| rest.rsplit_once('-')).map(|(sha, _)| sha)
}

/// The version a bundles key belongs to: `versions/<id>/…` or `versions/<id>.zip`.
pub fn bundle_owner(key: &str) -> Option<&str> {
    let rest = key.strip_prefix("versions/")?;
    match rest.split_once('/') {
        Some((version, _)) => Some(version),
        None => rest.strip_suffix(".zip"),
    }
}

/// Keys whose owner no row names and that are older than [`ORPHAN_AGE`]; keys of an unknown
/// shape are left alone.
pub fn orphans(
    entries: &[Entry],
    referenced: &HashSet<String>,
    owner: fn(&str) -> Option<&str>,
    now: SystemTime,
) -> Vec<String> {
    entries
        .iter()
        .filter(|e| now.duration_since(e.modified).is_ok_and(|age| age >= ORPHAN_AGE))
        .filter(|e| owner(&e.key).is_some_and(|o| !referenced.contains(o)))
        .map(|e| e.key.clone())
        .collect()
}

async fn delete_all(area: &Area, keys: &[String]) -> usize {
    let mut removed = 0;
    for key in keys {
        match area.delete(key).await {
            Ok(()) => removed += 1,
            Err(error) => tracing::warn!(%error, key, "cannot remove an orphaned file"),
        }
    }
    removed
}

/// Candidates, found without any lock (a listing may take long).
pub async fn attachment_candidates(area: &Area, pool: &Pool) -> anyhow::Result<Vec<String>> {
    let mut entries = area.list("blobs/").await?;
    entries.extend(area.list("variants/").await?);
    let referenced: HashSet<String> =
        db::backup::attachment_hashes(&pool.get().await?).await?.into_iter().collect();
    Ok(orphans(&entries, &referenced, attachment_owner, SystemTime::now()))
}

/// Removes the candidates that still have no row; run it holding the attachment store's lock.
pub async fn remove_attachment_orphans(
    area: &Area,
    pool: &Pool,
    candidates: Vec<String>,
) -> anyhow::Result<usize> {
    if candidates.is_empty() {
        return Ok(0);
    }
    let referenced: HashSet<String> =
        db::backup::attachment_hashes(&pool.get().await?).await?.into_iter().collect();
    let victims: Vec<String> = candidates
        .into_iter()
        .filter(|k| attachment_owner(k).is_some_and(|o| !referenced.contains(o)))
        .collect();
    Ok(delete_all(area, &victims).await)
}

/// Bundle files of no stored version, under the bundle lock (pushes store and commit under it).
pub async fn sweep_bundles(area: &Area, pool: &Pool) -> anyhow::Result<usize> {
    let entries = area.list("versions/").await?;
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    db::bundles::lock(&tx).await?;
    let referenced: HashSet<String> = db::backup::stored_bundle_versions(&tx).await?.into_iter().collect();
    let victims = orphans(&entries, &referenced, bundle_owner, SystemTime::now());
    let removed = delete_all(area, &victims).await;
    tx.commit().await?;
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: &str, age: u64) -> Entry {
        Entry { key: key.into(), size: 1, modified: SystemTime::now() - Duration::from_secs(age) }
    }

    #[test]
    fn only_old_unreferenced_files_of_a_known_shape_are_orphans() {
        let referenced: HashSet<String> = ["kept".to_string(), "v1".to_string()].into();
        let attachments = [
            entry("blobs/ke/kept", 7200),
            entry("blobs/go/gone", 7200),
            entry("variants/gone-thumbnail", 7200),
            entry("blobs/ne/new", 60),
            entry("odd", 7200),
        ];
        let found = orphans(&attachments, &referenced, attachment_owner, SystemTime::now());
        assert_eq!(found, ["blobs/go/gone", "variants/gone-thumbnail"]);
        let bundles = [
            entry("versions/v1/app/x.js", 7200),
            entry("versions/v2/a", 7200),
            entry("versions/v2.zip", 7200),
        ];
        let found = orphans(&bundles, &referenced, bundle_owner, SystemTime::now());
        assert_eq!(found, ["versions/v2/a", "versions/v2.zip"]);
    }
}
