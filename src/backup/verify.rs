//! `synkronus backup --verify FILE`, also the first step of every restore: the archive's own
//! checksum, then the manifest, then every part read back against its size, sha256 and (for
//! tables) row count. Blocking file reads: call it off the async runtime.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use sha2::{Digest, Sha256};
use zip::ZipArchive;

use super::{check_seal, safe_relative, Manifest, DB_DIR, FORMAT, FORMAT_VERSION, MANIFEST};

/// The checked manifest, or one line saying what is wrong.
pub fn verify(path: &Path) -> Result<Manifest, String> {
    let refuse = |why: String| format!("backup archive {} is unusable: {why}", path.display());
    check_seal(path).map_err(refuse)?;
    let mut archive = open(path).map_err(refuse)?;
    let manifest = read_manifest(&mut archive).map_err(refuse)?;
    check_parts(&mut archive, &manifest).map_err(refuse)?;
    Ok(manifest)
}

/// Prints what `--verify` found.
pub async fn run(path: &Path) -> anyhow::Result<()> {
    let owned = path.to_path_buf();
    let manifest = tokio::task::spawn_blocking(move || verify(&owned)).await?.map_err(anyhow::Error::msg)?;
    println!(
        "backup archive {} is intact: synkronus {}, schema version {}, taken at {}, {} rows in {} tables, {} files",
        path.display(),
        manifest.server_version,
        manifest.schema_version,
        manifest.created_at.to_rfc3339(),
        manifest.counts.rows,
        manifest.tables.len(),
        manifest.counts.files,
    );
    Ok(())
}

pub fn open(path: &Path) -> Result<ZipArchive<BufReader<File>>, String> {
    let file = File::open(path).map_err(|e| format!("cannot open it: {e}"))?;
    ZipArchive::new(BufReader::new(file)).map_err(|e| format!("not a readable ZIP archive: {e}"))
}

fn read_manifest(archive: &mut ZipArchive<BufReader<File>>) -> Result<Manifest, String> {
    let entry = archive.by_name(MANIFEST).map_err(|_| format!("it has no {MANIFEST}"))?;
    let manifest: Manifest =
        serde_json::from_reader(entry).map_err(|e| format!("its {MANIFEST} is unreadable: {e}"))?;
    if manifest.format != FORMAT || manifest.format_version != FORMAT_VERSION {
        return Err(format!(
            "it is a '{}' archive of format version {}, this synkronus reads '{FORMAT}' version {FORMAT_VERSION}",
            manifest.format, manifest.format_version
        ));
    }
    Ok(manifest)
}

fn check_parts(archive: &mut ZipArchive<BufReader<File>>, manifest: &Manifest) -> Result<(), String> {
    let mut in_archive = BTreeSet::new();
    for name in archive.file_names() {
        let name = name.map_err(|e| format!("an entry name is unreadable: {e}"))?;
        if name != MANIFEST {
            in_archive.insert(name.into_owned());
        }
    }
    let listed: BTreeSet<String> = manifest.parts.iter().map(|p| p.name.clone()).collect();
    if listed.len() != manifest.parts.len() {
        return Err(format!("its {MANIFEST} lists a part twice"));
    }
    if let Some(extra) = in_archive.difference(&listed).next() {
        return Err(format!("entry {extra} is not listed in {MANIFEST}"));
    }
    if let Some(missing) = listed.difference(&in_archive).next() {
        return Err(format!("part {missing} listed in {MANIFEST} is missing"));
    }
    for table in &manifest.tables {
        if !listed.contains(&table.part) {
            return Err(format!("table {} has no part", table.name));
        }
    }
    for part in &manifest.parts {
        if safe_relative(&part.name).is_none() {
            return Err(format!("part name {:?} is not a safe relative path", part.name));
        }
        let entry = archive.by_name(&part.name).map_err(|e| format!("part {}: {e}", part.name))?;
        let (sha256, size, lines) =
            digest(entry).map_err(|e| format!("part {} cannot be read: {e}", part.name))?;
        if sha256 != part.sha256 || size != part.size {
            return Err(format!("part {} does not match its checksum in {MANIFEST}", part.name));
        }
        if part.name.starts_with(DB_DIR) {
            let rows = manifest.tables.iter().find(|t| t.part == part.name).map(|t| t.rows);
            if rows != Some(lines) {
                return Err(format!("part {} holds {lines} rows, {MANIFEST} says {rows:?}", part.name));
            }
        }
    }
    Ok(())
}

/// sha256, size and newline count of a stream.
pub fn digest(mut reader: impl Read) -> std::io::Result<(String, u64, u64)> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let (mut size, mut lines) = (0u64, 0u64);
    loop {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            break;
        }
        let chunk = &buf[..n];
        hasher.update(chunk);
        size += n as u64;
        lines += chunk.iter().filter(|&&b| b == b'\n').count() as u64;
    }
    Ok((hex::encode(hasher.finalize()), size, lines))
}
