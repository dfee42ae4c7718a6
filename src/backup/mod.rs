//! Backup and restore (docs/api.md §18.4, docs/operations.md). One archive is a ZIP file:
//!
//! - `db/<table>.copy`: each table in PostgreSQL's COPY text format, all taken in one snapshot;
//! - `attachments/...` and `bundles/...`: the files that snapshot refers to, at their paths under
//!   `ATTACHMENTS_PATH` and `APP_BUNDLE_PATH` (content-addressed blobs and their variants, bundle
//!   version folders and ZIPs);
//! - `manifest.json`, last: versions, counts and the sha256 and size of every other part;
//! - the ZIP comment, last of all: the sha256 of every byte before it, so any flipped byte or a
//!   truncation anywhere is caught before a single entry is believed.
//!
//! Everything is streamed: memory does not grow with the size of tables or files.

pub mod create;
pub mod restore;
pub mod verify;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub const MANIFEST: &str = "manifest.json";
pub const FORMAT: &str = "synkronus-backup";
pub const FORMAT_VERSION: u32 = 1;
/// Archive folder of the table dumps.
pub const DB_DIR: &str = "db/";
/// Archive folder mirroring ATTACHMENTS_PATH.
pub const ATTACHMENTS_DIR: &str = "attachments/";
/// Archive folder mirroring APP_BUNDLE_PATH.
pub const BUNDLES_DIR: &str = "bundles/";
/// The ZIP comment: this prefix, then the archive digest in hex.
const DIGEST_PREFIX: &str = "synkronus-backup sha256=";
const DIGEST_HEX_LEN: u64 = 64;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub format_version: u32,
    /// The `synkronus` release that wrote it.
    pub server_version: String,
    /// The last migration applied to the database when it was taken.
    pub schema_version: i64,
    pub migrations: Vec<MigrationEntry>,
    /// The snapshot's time.
    pub created_at: DateTime<Utc>,
    pub change_head: i64,
    pub repository_generation: i64,
    pub tables: Vec<TableEntry>,
    pub sequences: Vec<SequenceEntry>,
    pub counts: Counts,
    /// Every entry of the archive but the manifest itself.
    pub parts: Vec<PartEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct MigrationEntry {
    pub version: i64,
    pub name: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TableEntry {
    pub name: String,
    pub columns: Vec<String>,
    pub rows: u64,
    pub part: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SequenceEntry {
    pub name: String,
    pub last_value: Option<i64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Counts {
    pub rows: u64,
    pub attachment_blobs: u64,
    pub attachment_variants: u64,
    pub bundle_versions: u64,
    pub files: u64,
    pub file_bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PartEntry {
    pub name: String,
    pub size: u64,
    pub sha256: String,
}

/// The archive name of a table's dump.
pub fn table_part(table: &str) -> String {
    format!("{DB_DIR}{table}.copy")
}

/// A relative path from an archive name: `/`-separated, no empty, `.` or `..` segment, no `\` or
/// NUL, so a crafted archive can never write outside the folder it is restored into.
pub fn safe_relative(name: &str) -> Option<PathBuf> {
    let safe = !name.is_empty()
        && !name.contains(['\\', '\0'])
        && name.split('/').all(|s| !s.is_empty() && s != "." && s != "..");
    safe.then(|| name.split('/').collect())
}

/// Tables in an order COPY can fill them with every foreign key checked as it goes: referenced
/// tables before the tables referring to them. Cycles (none today) keep their name order.
pub fn load_order(tables: &[String], foreign_keys: &[(String, String)]) -> Vec<String> {
    let wanted: BTreeSet<&str> = tables.iter().map(String::as_str).collect();
    let mut parents: BTreeMap<&str, BTreeSet<&str>> = wanted.iter().map(|t| (*t, BTreeSet::new())).collect();
    for (child, parent) in foreign_keys {
        if child != parent && wanted.contains(child.as_str()) && wanted.contains(parent.as_str()) {
            parents.entry(child.as_str()).or_default().insert(parent.as_str());
        }
    }
    let mut order: Vec<String> = Vec::with_capacity(tables.len());
    while !parents.is_empty() {
        let ready: Vec<&str> =
            parents.iter().filter(|(_, p)| p.is_empty()).map(|(t, _)| *t).collect::<Vec<_>>();
        let next = if ready.is_empty() { parents.keys().take(1).copied().collect() } else { ready };
        for table in next {
            parents.remove(table);
            for p in parents.values_mut() {
                p.remove(table);
            }
            order.push(table.to_string());
        }
    }
    order
}

/// A writer that hashes and counts what passes through it.
pub struct Hashing<W> {
    inner: W,
    hasher: Sha256,
    pub bytes: u64,
}

impl<W> Hashing<W> {
    pub fn new(inner: W) -> Self {
        Hashing { inner, hasher: Sha256::new(), bytes: 0 }
    }

    pub fn finish(self) -> (W, String, u64) {
        (self.inner, hex::encode(self.hasher.finalize()), self.bytes)
    }
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(data)?;
        self.hasher.update(&data[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The placeholder comment the writer sets; [`seal`] fills in the digest.
pub fn comment_placeholder() -> String {
    format!("{DIGEST_PREFIX}{}", "0".repeat(DIGEST_HEX_LEN as usize))
}

/// Writes the digest of every byte before it into the comment that ends the file.
pub fn seal(path: &Path) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new().read(true).write(true).open(path)?;
    let digest = digest_before_comment(&mut file)?;
    file.seek(SeekFrom::End(-(DIGEST_HEX_LEN as i64)))?;
    file.write_all(digest.as_bytes())?;
    file.sync_all()
}

/// Checks the digest in the archive's comment against its bytes: one streamed pass.
pub fn check_seal(path: &Path) -> Result<(), String> {
    let mut file = std::fs::File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let computed =
        digest_before_comment(&mut file).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let tail_len = DIGEST_PREFIX.len() as u64 + DIGEST_HEX_LEN;
    let mut tail = Vec::new();
    file.seek(SeekFrom::End(-(tail_len as i64)))
        .and_then(|_| file.read_to_end(&mut tail))
        .map_err(|_| "it is truncated or not a backup archive".to_string())?;
    let tail = String::from_utf8_lossy(&tail);
    let Some(stored) = tail.strip_prefix(DIGEST_PREFIX) else {
        return Err("it is truncated or not a backup archive (no archive checksum at its end)".into());
    };
    if stored != computed {
        return Err("its checksum does not match its contents (corrupted or truncated)".into());
    }
    Ok(())
}

fn digest_before_comment(file: &mut std::fs::File) -> std::io::Result<String> {
    let len = file.metadata()?.len();
    let covered = len
        .checked_sub(DIGEST_HEX_LEN)
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "file too short"))?;
    file.seek(SeekFrom::Start(0))?;
    let mut hashing = Hashing::new(std::io::sink());
    std::io::copy(&mut (&mut *file).take(covered), &mut hashing)?;
    Ok(hashing.finish().1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn referenced_tables_load_first() {
        let fks = vec![
            ("device_presence".to_string(), "users".to_string()),
            ("refresh_tokens".to_string(), "users".to_string()),
            ("bundle_active".to_string(), "bundle_versions".to_string()),
            ("bundle_forms".to_string(), "bundle_versions".to_string()),
            ("users".to_string(), "users".to_string()),
        ];
        let order = load_order(
            &names(&[
                "bundle_active",
                "bundle_forms",
                "bundle_versions",
                "device_presence",
                "refresh_tokens",
                "users",
            ]),
            &fks,
        );
        let pos = |t: &str| order.iter().position(|o| o == t).expect("listed");
        assert_eq!(order.len(), 6);
        assert!(pos("users") < pos("device_presence") && pos("users") < pos("refresh_tokens"));
        assert!(
            pos("bundle_versions") < pos("bundle_active") && pos("bundle_versions") < pos("bundle_forms")
        );
        let cyclic = vec![("a".to_string(), "b".to_string()), ("b".to_string(), "a".to_string())];
        assert_eq!(load_order(&names(&["a", "b", "c"]), &cyclic).len(), 3);
    }

    #[test]
    fn archive_names_cannot_escape() {
        assert_eq!(safe_relative("blobs/ab/abc"), Some(PathBuf::from("blobs/ab/abc")));
        for bad in ["", "../x", "a/../b", "/abs", "a//b", "a/./b", "a\\b", "a\0b", "a/"] {
            assert_eq!(safe_relative(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_seal_catches_any_flipped_byte_and_truncation() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("a.zip");
        std::fs::write(&path, format!("some archive bytes{}", comment_placeholder())).expect("write");
        seal(&path).expect("seal");
        check_seal(&path).expect("sealed");
        let good = std::fs::read(&path).expect("read");
        for i in [0, 5, good.len() - 70, good.len() - 1] {
            let mut bad = good.clone();
            bad[i] ^= 1;
            std::fs::write(&path, &bad).expect("write");
            assert!(check_seal(&path).is_err(), "flip at {i}");
        }
        std::fs::write(&path, &good[..good.len() - 10]).expect("write");
        assert!(check_seal(&path).is_err());
    }
}
