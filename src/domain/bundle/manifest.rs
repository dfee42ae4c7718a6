//! The per-version manifest of docs/api.md §9.4 and its stable bundle hash.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use chrono::{DateTime, SecondsFormat, Timelike, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use walkdir::WalkDir;

use super::ValidatedBundle;
use crate::domain::mime::mime_for_path;

/// `GET /app-bundle/manifest` body; key names and order as in docs/api.md §9.4.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BundleManifest {
    pub version: String,
    pub name: String,
    pub entry_point: String,
    pub hash: String,
    pub generated_at: String,
    pub files: Vec<ManifestFile>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManifestFile {
    pub path: String,
    pub hash: String,
    pub size: u64,
    pub mime_type: String,
    pub mod_time: String,
}

/// Builds the manifest of an extracted version folder. Every timestamp is
/// `created_at`, so the body depends only on the version and stays stable
/// across restarts.
pub fn build_manifest(
    version_id: &str,
    name: &str,
    entry_point: &str,
    created_at: DateTime<Utc>,
    dir: &Path,
) -> io::Result<BundleManifest> {
    let timestamp = format_timestamp(created_at);
    let mut files = Vec::new();
    for item in WalkDir::new(dir).follow_links(false).min_depth(1) {
        let item = item.map_err(io::Error::other)?;
        let file_type = item.file_type();
        if file_type.is_dir() {
            continue;
        }
        if !file_type.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} is not a regular file", item.path().display()),
            ));
        }
        let path = relative_slash_path(dir, item.path())?;
        let (hash, size) = sha256_file(item.path())?;
        files.push(ManifestFile {
            mime_type: mime_for_path(&path).to_owned(),
            path,
            hash,
            size,
            mod_time: timestamp.clone(),
        });
    }
    // `str` ordering is byte order, as docs/api.md §9.4 requires.
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(BundleManifest {
        version: version_id.to_owned(),
        name: name.to_owned(),
        entry_point: entry_point.to_owned(),
        hash: bundle_hash(version_id, &files),
        generated_at: timestamp,
        files,
    })
}

/// The manifest of an uploaded version, from the files hashed when it was unpacked (before its
/// id was known) and the id assigned under the bundle lock: the same manifest
/// [`build_manifest`] gives for the version folder, without reading it again.
pub fn version_manifest(
    bundle: &ValidatedBundle,
    version_id: &str,
    files: Vec<ManifestFile>,
    created_at: DateTime<Utc>,
) -> BundleManifest {
    BundleManifest {
        version: version_id.to_owned(),
        name: bundle.display_name(version_id).to_owned(),
        entry_point: bundle.entry_point.clone(),
        hash: bundle_hash(version_id, &files),
        generated_at: format_timestamp(created_at),
        files,
    }
}

/// SHA-256 hex of `version_id \n` then `path \t hash \t size \n` per file, in
/// the given (sorted) order. Including the id makes versions with identical
/// content still differ.
pub fn bundle_hash(version_id: &str, files: &[ManifestFile]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(version_id.as_bytes());
    hasher.update(b"\n");
    for file in files {
        hasher.update(format!("{}\t{}\t{}\n", file.path, file.hash, file.size).as_bytes());
    }
    hex::encode(hasher.finalize())
}

/// RFC 3339 in UTC with `Z`; microseconds with trailing zeros trimmed, and no
/// fraction at all when it is zero (docs/api.md §1.4).
pub fn format_timestamp(time: DateTime<Utc>) -> String {
    let micros = time.nanosecond() / 1_000;
    if micros == 0 {
        return time.to_rfc3339_opts(SecondsFormat::Secs, true);
    }
    let fraction = format!("{micros:06}");
    format!("{}.{}Z", time.format("%Y-%m-%dT%H:%M:%S"), fraction.trim_end_matches('0'))
}

fn relative_slash_path(root: &Path, path: &Path) -> io::Result<String> {
    let relative = path.strip_prefix(root).map_err(io::Error::other)?;
    let mut segments = Vec::new();
    for component in relative.components() {
        let segment = component.as_os_str().to_str().ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidData, format!("{} is not a UTF-8 path", path.display()))
        })?;
        segments.push(segment);
    }
    Ok(segments.join("/"))
}

/// Streams the file through SHA-256; returns the hex digest and the size.
pub(crate) fn sha256_file(path: &Path) -> io::Result<(String, u64)> {
    let mut file = File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 64 * 1024];
    let mut size: u64 = 0;
    loop {
        let read = match file.read(&mut buffer) {
            Ok(0) => break,
            Ok(read) => read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        };
        hasher.update(&buffer[..read]);
        size += read as u64;
    }
    Ok((hex::encode(hasher.finalize()), size))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn timestamps_trim_fractions() {
        let base = Utc.with_ymd_and_hms(2025, 6, 27, 10, 55, 58).single();
        let Some(base) = base else {
            panic!("valid date");
        };
        assert_eq!(format_timestamp(base), "2025-06-27T10:55:58Z");
        let with_millis = base + chrono::Duration::milliseconds(123);
        assert_eq!(format_timestamp(with_millis), "2025-06-27T10:55:58.123Z");
        let with_nanos = base + chrono::Duration::nanoseconds(1_500);
        assert_eq!(format_timestamp(with_nanos), "2025-06-27T10:55:58.000001Z");
        let sub_micro = base + chrono::Duration::nanoseconds(999);
        assert_eq!(format_timestamp(sub_micro), "2025-06-27T10:55:58Z");
    }

    #[test]
    fn bundle_hash_follows_the_contract() {
        let files = vec![ManifestFile {
            path: "app/index.html".to_owned(),
            hash: "ab".to_owned(),
            size: 3,
            mime_type: "text/html; charset=utf-8".to_owned(),
            mod_time: "2025-06-27T10:55:58Z".to_owned(),
        }];
        let expected = hex::encode(Sha256::digest(b"v1\napp/index.html\tab\t3\n"));
        assert_eq!(bundle_hash("v1", &files), expected);
        assert_ne!(bundle_hash("v2", &files), expected);
    }
}
