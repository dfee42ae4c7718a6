//! Go app bundle versions (docs/api.md §19.1): every folder of the versions directory becomes a
//! version with the same id, its files byte for byte in `APP_BUNDLE_PATH/versions/<id>/` and the
//! archive it was pushed as (the folder without Go's `APP_INFO.json`) in `versions/<id>.zip`.
//! A version that fails validation is imported as it is and reported.

use std::io::Write;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::domain::bundle::{build_manifest, validate_zip, BundleManifest, Limits, VersionView};
use crate::domain::go_import::{bundle_version_id_ok, GO_APP_INFO, GO_CURRENT_VERSION};
use crate::import::files::Written;

/// The versions a Go deployment holds, oldest id first, and its active one.
#[derive(Debug, Default)]
pub struct GoBundles {
    pub dir: PathBuf,
    /// Folder names that can be kept as ids.
    pub versions: Vec<String>,
    /// Folders in the versions directory, importable or not.
    pub folders: i64,
    pub active: Option<String>,
}

/// Finds the versions folder (given itself, or the 2026 `<data>/app-bundle` above it) and the
/// active version: `CURRENT_VERSION`, else the 2026 `active` entry beside the versions folder
/// (a file naming it, a link to it, or a copy of it recognised by its `APP_INFO.json`).
pub fn discover(dir: &Path) -> anyhow::Result<(GoBundles, Vec<String>)> {
    if !dir.is_dir() {
        anyhow::bail!("--bundle-versions {}: not a folder", dir.display());
    }
    let nested = dir.join("versions");
    let versions_dir =
        if nested.is_dir() && !dir.join(GO_CURRENT_VERSION).exists() { nested } else { dir.to_path_buf() };
    let mut warnings = Vec::new();
    let mut versions = Vec::new();
    let mut folders = 0;
    for entry in std::fs::read_dir(&versions_dir)? {
        let entry = entry?;
        if !entry.file_type()?.is_dir() {
            continue;
        }
        folders += 1;
        match entry.file_name().into_string() {
            Ok(name) if bundle_version_id_ok(&name) => versions.push(name),
            Ok(name) => warnings.push(format!("version folder '{name}' cannot be kept as an id: skipped")),
            Err(name) => warnings.push(format!("version folder {name:?} has no UTF-8 name: skipped")),
        }
    }
    versions.sort();
    let active = active_version(&versions_dir, &versions)?;
    if let Some(name) = &active {
        if !versions.contains(name) {
            warnings.push(format!("the active version '{name}' has no folder: no version is active"));
        }
    }
    let active = active.filter(|name| versions.contains(name));
    Ok((GoBundles { dir: versions_dir, versions, folders, active }, warnings))
}

fn active_version(versions_dir: &Path, versions: &[String]) -> std::io::Result<Option<String>> {
    let current = versions_dir.join(GO_CURRENT_VERSION);
    if current.is_file() {
        return Ok(Some(std::fs::read_to_string(current)?.trim().to_string()).filter(|s| !s.is_empty()));
    }
    let Some(active) = versions_dir.parent().map(|p| p.join("active")) else { return Ok(None) };
    let Ok(meta) = std::fs::symlink_metadata(&active) else { return Ok(None) };
    if meta.file_type().is_symlink() {
        let target = std::fs::read_link(&active)?;
        return Ok(target.file_name().and_then(|n| n.to_str()).map(str::to_string));
    }
    if meta.is_file() {
        return Ok(Some(std::fs::read_to_string(active)?.trim().to_string()).filter(|s| !s.is_empty()));
    }
    let Ok(info) = std::fs::read(active.join(GO_APP_INFO)) else { return Ok(None) };
    Ok(versions
        .iter()
        .find(|v| std::fs::read(versions_dir.join(v).join(GO_APP_INFO)).ok().as_ref() == Some(&info))
        .cloned())
}

/// One version, ready to record.
pub struct Prepared {
    pub created_at: DateTime<Utc>,
    pub manifest: BundleManifest,
    /// Its forms (schema and UI objects), registered if it is the active one.
    pub forms: Vec<(String, Value, Value)>,
    /// Why it failed validation, when it did.
    pub problem: Option<String>,
}

/// Validates the version's archive and, unless `root` is `None` (a dry run), writes the folder
/// and the archive into `root/versions/`, recording them in `written`.
pub fn prepare(
    source: &Path,
    id: &str,
    root: Option<&Path>,
    written: &mut Written,
) -> anyhow::Result<Prepared> {
    let created_at = folder_time(source);
    let scratch = match root {
        Some(root) => root.join("tmp"),
        None => std::env::temp_dir(),
    };
    std::fs::create_dir_all(&scratch)?;
    let zip_path = scratch.join(format!("import-{}.zip", uuid::Uuid::new_v4().simple()));
    let result = (|| {
        write_zip(source, &zip_path)?;
        let validated = validate_zip(&zip_path, &Limits::default());
        let (name, entry_point, problem) = match &validated {
            Ok(bundle) => (bundle.display_name(id).to_string(), bundle.entry_point.clone(), None),
            Err(rejection) => {
                let first = rejection
                    .problems
                    .first()
                    .map(|p| format!(": {} {}", p.code, p.path))
                    .unwrap_or_default();
                let entry =
                    if source.join("app/index.html").is_file() { "app/index.html" } else { "index.html" };
                (id.to_string(), entry.to_string(), Some(format!("{rejection}{first}")))
            }
        };
        let dir = match root {
            Some(root) => place(source, &zip_path, root, id, written)?,
            None => source.to_path_buf(),
        };
        let manifest = build_manifest(id, &name, &entry_point, created_at, &dir)?;
        let forms = VersionView::load(&manifest, &dir)?
            .forms
            .into_iter()
            .filter(|(_, form)| form.schema.is_object() && form.ui.is_object())
            .map(|(name, form)| (name, form.schema, form.ui))
            .collect();
        anyhow::Ok(Prepared { created_at, manifest, forms, problem })
    })();
    let _ = std::fs::remove_file(&zip_path);
    result
}

/// Copies the folder to `versions/<id>/` and moves the archive to `versions/<id>.zip`.
fn place(source: &Path, zip: &Path, root: &Path, id: &str, written: &mut Written) -> anyhow::Result<PathBuf> {
    let versions = root.join("versions");
    std::fs::create_dir_all(&versions)?;
    let dir = versions.join(id);
    let zip_dest = versions.join(format!("{id}.zip"));
    // The target has no version rows, so anything here is an unrecorded leftover.
    for leftover in [&dir, &zip_dest] {
        if leftover.is_dir() {
            std::fs::remove_dir_all(leftover)?;
        } else if leftover.exists() {
            std::fs::remove_file(leftover)?;
        }
    }
    written.add(dir.clone());
    copy_tree(source, &dir)?;
    written.add(zip_dest.clone());
    std::fs::rename(zip, &zip_dest)?;
    Ok(dir)
}

fn copy_tree(source: &Path, dest: &Path) -> anyhow::Result<()> {
    for entry in walkdir::WalkDir::new(source).follow_links(false) {
        let entry = entry?;
        let target = dest.join(entry.path().strip_prefix(source)?);
        if entry.file_type().is_dir() {
            std::fs::create_dir_all(&target)?;
        } else if entry.file_type().is_file() {
            std::fs::copy(entry.path(), &target)?;
            std::fs::File::open(&target)?.sync_all()?;
        }
    }
    Ok(())
}

/// The folder as the ZIP it was pushed as: every regular file but Go's `APP_INFO.json`.
fn write_zip(source: &Path, dest: &Path) -> anyhow::Result<()> {
    let mut zip = zip::ZipWriter::new(std::io::BufWriter::new(std::fs::File::create(dest)?));
    let options =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
    let mut entries: Vec<(String, PathBuf)> = Vec::new();
    for entry in walkdir::WalkDir::new(source).follow_links(false).min_depth(1) {
        let entry = entry?;
        if !entry.file_type().is_file() {
            continue;
        }
        let relative = entry.path().strip_prefix(source)?;
        let name =
            relative.components().map(|c| c.as_os_str().to_string_lossy()).collect::<Vec<_>>().join("/");
        if name != GO_APP_INFO {
            entries.push((name, entry.path().to_path_buf()));
        }
    }
    entries.sort();
    for (name, path) in entries {
        zip.start_file(name, options)?;
        std::io::copy(&mut std::fs::File::open(path)?, &mut zip)?;
    }
    let mut out = zip.finish()?;
    out.flush()?;
    out.get_ref().sync_all()?;
    Ok(())
}

/// The folder's modification time, to the second (a version's creation time).
fn folder_time(dir: &Path) -> DateTime<Utc> {
    let modified = std::fs::metadata(dir).and_then(|m| m.modified()).ok();
    let time: DateTime<Utc> = modified.map(Into::into).unwrap_or_else(Utc::now);
    DateTime::from_timestamp(time.timestamp(), 0).unwrap_or(time)
}
