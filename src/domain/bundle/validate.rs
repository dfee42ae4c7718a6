//! The validation pipeline of docs/api.md §9.2: structure, manifest, entry point,
//! forms, in that order, stopping after the first step with problems.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};
use zip::ZipArchive;

use super::forms::check_forms;
use super::layout::{analyse_layout, MANIFEST_FILE};
use super::paths::entry_point_is_acceptable;
use super::structure::{scan_archive, SafeEntry};
use super::{codes, steps, BundleFile, BundleRejection, DeclaredManifest, Limits, Problem, ValidatedBundle};

/// Validates the ZIP at `zip_path` (docs/api.md §9.2 steps 1 to 4).
pub fn validate_zip(zip_path: &Path, limits: &Limits) -> Result<ValidatedBundle, BundleRejection> {
    let reject = |step, problems| BundleRejection { step, problems };

    let (scanned, mut problems) =
        scan_archive(zip_path, limits).map_err(|problems| reject(steps::STRUCTURE, problems))?;
    let analysis = analyse_layout(&scanned.entries);
    problems.extend(analysis.problems);
    if !problems.is_empty() {
        return Err(reject(steps::STRUCTURE, problems));
    }
    let mut archive = scanned.archive;
    let files: BTreeMap<&str, &SafeEntry> = scanned
        .entries
        .iter()
        .filter(|entry| !entry.is_dir)
        .map(|entry| (entry.path.as_str(), entry))
        .collect();

    let manifest = match files.get(MANIFEST_FILE) {
        Some(entry) => Some(
            read_manifest(&mut archive, entry, limits)
                .map_err(|problems| reject(steps::MANIFEST, problems))?,
        ),
        None => None,
    };

    let entry_point = manifest.as_ref().map_or_else(
        || analysis.layout.default_entry_point().to_owned(),
        |manifest| manifest.entry_point.clone(),
    );
    if !files.contains_key(entry_point.as_str()) {
        return Err(reject(
            steps::ENTRY_POINT,
            vec![Problem::new(
                &entry_point,
                codes::ENTRY_POINT_MISSING,
                format!("the entry point {entry_point} is not a file in the bundle"),
            )],
        ));
    }

    let forms = check_forms(
        &mut archive,
        &files,
        analysis.layout.forms_root(),
        &analysis.form_folders,
        &analysis.renderers,
        limits,
    )
    .map_err(|problems| reject(steps::FORMS, problems))?;

    // BTreeMap iteration is byte order of the paths, as docs/api.md §9.4 requires.
    let bundle_files = files
        .values()
        .map(|entry| BundleFile { path: entry.path.clone(), size: entry.size, zip_index: entry.index })
        .collect();
    Ok(ValidatedBundle { layout: analysis.layout, manifest, entry_point, files: bundle_files, forms })
}

/// What reading a small archive file into memory gave.
pub(super) enum SmallFile {
    Bytes(Vec<u8>),
    TooLarge,
}

/// Reads an entry of at most `max_bytes`; the cap is enforced while inflating.
pub(super) fn read_small_file(
    archive: &mut ZipArchive<File>,
    entry: &SafeEntry,
    max_bytes: u64,
) -> io::Result<SmallFile> {
    if entry.size > max_bytes {
        return Ok(SmallFile::TooLarge);
    }
    let reader = archive.by_index(entry.index).map_err(io::Error::other)?;
    let mut bytes = Vec::new();
    reader.take(max_bytes.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max_bytes {
        return Ok(SmallFile::TooLarge);
    }
    Ok(SmallFile::Bytes(bytes))
}

/// Step 2: `manifest.json` must be a JSON object of at most 1 MiB with the
/// required string fields.
fn read_manifest(
    archive: &mut ZipArchive<File>,
    entry: &SafeEntry,
    limits: &Limits,
) -> Result<DeclaredManifest, Vec<Problem>> {
    let invalid = |message: String| vec![Problem::new(MANIFEST_FILE, codes::MANIFEST_INVALID, message)];
    let bytes = match read_small_file(archive, entry, limits.max_manifest_bytes) {
        Ok(SmallFile::Bytes(bytes)) => bytes,
        Ok(SmallFile::TooLarge) => {
            return Err(invalid(format!("manifest.json is larger than {} bytes", limits.max_manifest_bytes)))
        }
        Err(error) => return Err(invalid(format!("manifest.json cannot be read: {error}"))),
    };
    let object = match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(object)) => object,
        Ok(_) => return Err(invalid("manifest.json must be a JSON object".to_owned())),
        Err(error) => return Err(invalid(format!("manifest.json is not valid JSON: {error}"))),
    };

    let mut problems = Vec::new();
    let mut required = |field: &str| -> Option<String> {
        match object.get(field) {
            Some(Value::String(text)) if !text.is_empty() => Some(text.clone()),
            _ => {
                problems.push(Problem::new(
                    format!("{MANIFEST_FILE}#/{field}"),
                    codes::MANIFEST_FIELD_MISSING,
                    format!("manifest.json must have a non-empty string {field}"),
                ));
                None
            }
        }
    };
    let version = required("version");
    let name = required("name");
    let entry_point = required("entryPoint");

    if let Some(entry_point) = &entry_point {
        if !entry_point_is_acceptable(entry_point) {
            problems.push(Problem::new(
                format!("{MANIFEST_FILE}#/entryPoint"),
                codes::MANIFEST_INVALID,
                "entryPoint must be a relative path without '..'",
            ));
        }
    }
    let description = optional_string(&object, "description", &mut problems);
    let created_at = optional_string(&object, "createdAt", &mut problems).and_then(|text| {
        match DateTime::parse_from_rfc3339(&text) {
            Ok(time) => Some(time.with_timezone(&Utc)),
            Err(_) => {
                problems.push(Problem::new(
                    format!("{MANIFEST_FILE}#/createdAt"),
                    codes::MANIFEST_INVALID,
                    "createdAt must be an RFC 3339 timestamp with an offset",
                ));
                None
            }
        }
    });

    match (version, name, entry_point) {
        (Some(version), Some(name), Some(entry_point)) if problems.is_empty() => {
            Ok(DeclaredManifest { version, name, entry_point, description, created_at })
        }
        _ => Err(problems),
    }
}

fn optional_string(object: &Map<String, Value>, field: &str, problems: &mut Vec<Problem>) -> Option<String> {
    match object.get(field) {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => Some(text.clone()),
        Some(_) => {
            problems.push(Problem::new(
                format!("{MANIFEST_FILE}#/{field}"),
                codes::MANIFEST_INVALID,
                format!("{field} must be a string"),
            ));
            None
        }
    }
}
