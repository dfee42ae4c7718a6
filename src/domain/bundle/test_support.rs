//! Helpers for the bundle tests: build archives in memory, then corrupt them
//! byte-wise where the `zip` writer refuses to produce hostile input.

use std::io::{Cursor, Write};
use std::path::{Path, PathBuf};

use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipWriter};

use super::{validate_zip, BundleRejection, Limits, ValidatedBundle};

pub(super) const SCHEMA: &str = r#"{"type":"object","properties":{"name":{"type":"string"}}}"#;
pub(super) const UI: &str = r#"{"type":"VerticalLayout","elements":[]}"#;

pub(super) enum Item<'a> {
    File(&'a str, &'a [u8]),
    StoredFile(&'a str, &'a [u8]),
    Dir(&'a str),
}

pub(super) fn zip_bytes(items: &[Item<'_>]) -> Vec<u8> {
    let mut writer = ZipWriter::new(Cursor::new(Vec::new()));
    let deflated = SimpleFileOptions::default().compression_method(CompressionMethod::Deflated);
    let stored = SimpleFileOptions::default().compression_method(CompressionMethod::Stored);
    for item in items {
        match item {
            Item::File(name, content) | Item::StoredFile(name, content) => {
                let options = if matches!(item, Item::StoredFile(..)) { stored } else { deflated };
                writer.start_file(*name, options).expect("start file");
                writer.write_all(content).expect("write content");
            }
            Item::Dir(name) => writer.add_directory(*name, deflated).expect("add dir"),
        }
    }
    writer.finish().expect("finish zip").into_inner()
}

/// A minimal valid default-layout bundle plus `extra` items.
pub(super) fn default_bundle_with(extra: &[Item<'_>]) -> Vec<u8> {
    let mut items = vec![
        Item::File("app/index.html", b"<html></html>"),
        Item::File("forms/household/schema.json", SCHEMA.as_bytes()),
        Item::File("forms/household/ui.json", UI.as_bytes()),
    ];
    items.extend(extra.iter().map(|item| match item {
        Item::File(name, content) => Item::File(name, content),
        Item::StoredFile(name, content) => Item::StoredFile(name, content),
        Item::Dir(name) => Item::Dir(name),
    }));
    zip_bytes(&items)
}

/// Replaces every occurrence of `from` by `to` (same length), e.g. to rename
/// an entry in both its local and its central header.
pub(super) fn replace_bytes(bytes: &mut [u8], from: &[u8], to: &[u8]) {
    assert_eq!(from.len(), to.len());
    let mut found = false;
    let mut offset = 0;
    while offset + from.len() <= bytes.len() {
        if &bytes[offset..offset + from.len()] == from {
            bytes[offset..offset + to.len()].copy_from_slice(to);
            found = true;
            offset += from.len();
        } else {
            offset += 1;
        }
    }
    assert!(found, "pattern not found");
}

/// Calls `patch(header, header_kind)` on the local (`b"PK\x03\x04"`) and
/// central (`b"PK\x01\x02"`) headers of the entry called `name`.
fn patch_headers(bytes: &mut [u8], name: &str, mut patch: impl FnMut(&mut [u8], bool)) {
    let name = name.as_bytes();
    let mut patched = 0;
    for offset in 0..bytes.len().saturating_sub(46) {
        let (is_local, name_offset) = match &bytes[offset..offset + 4] {
            b"PK\x03\x04" => (true, 30),
            b"PK\x01\x02" => (false, 46),
            _ => continue,
        };
        let name_len_at = if is_local { 26 } else { 28 };
        let name_len =
            usize::from(u16::from_le_bytes([bytes[offset + name_len_at], bytes[offset + name_len_at + 1]]));
        let start = offset + name_offset;
        if name_len == name.len() && bytes.get(start..start + name_len) == Some(name) {
            patch(&mut bytes[offset..], is_local);
            patched += 1;
        }
    }
    assert_eq!(patched, 2, "expected a local and a central header for the entry");
}

/// Makes both headers declare `size` uncompressed bytes.
pub(super) fn set_declared_size(bytes: &mut [u8], name: &str, size: u32) {
    patch_headers(bytes, name, |header, is_local| {
        let at = if is_local { 22 } else { 24 };
        header[at..at + 4].copy_from_slice(&size.to_le_bytes());
    });
}

/// Sets general-purpose flag bits in both headers.
pub(super) fn set_flag_bits(bytes: &mut [u8], name: &str, bits: u16) {
    patch_headers(bytes, name, |header, is_local| {
        let at = if is_local { 6 } else { 8 };
        let flags = u16::from_le_bytes([header[at], header[at + 1]]) | bits;
        header[at..at + 2].copy_from_slice(&flags.to_le_bytes());
    });
}

/// Sets the central header's external attributes (Unix mode in the high half).
pub(super) fn set_unix_mode(bytes: &mut [u8], name: &str, mode: u32) {
    patch_headers(bytes, name, |header, is_local| {
        if !is_local {
            // "Version made by" high byte 3 = Unix, so readers honour the mode.
            header[5] = 3;
            header[38..42].copy_from_slice(&(mode << 16).to_le_bytes());
        }
    });
}

pub(super) struct TempZip {
    _dir: tempfile::TempDir,
    pub path: PathBuf,
}

pub(super) fn write_temp_zip(bytes: &[u8]) -> TempZip {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("bundle.zip");
    std::fs::write(&path, bytes).expect("write zip");
    TempZip { _dir: dir, path }
}

pub(super) fn validate_bytes(bytes: &[u8]) -> Result<ValidatedBundle, BundleRejection> {
    validate_bytes_with(bytes, &Limits::default())
}

pub(super) fn validate_bytes_with(bytes: &[u8], limits: &Limits) -> Result<ValidatedBundle, BundleRejection> {
    let zip = write_temp_zip(bytes);
    validate_zip(&zip.path, limits)
}

/// Asserts a rejection at `step` that includes `code` (at `path`, when given).
pub(super) fn assert_rejected(
    result: Result<ValidatedBundle, BundleRejection>,
    step: &str,
    code: &str,
    path: Option<&str>,
) -> BundleRejection {
    let rejection = match result {
        Ok(bundle) => panic!("expected {code}, but the bundle was accepted: {bundle:?}"),
        Err(rejection) => rejection,
    };
    assert_eq!(rejection.step, step, "{rejection:?}");
    assert!(
        rejection
            .problems
            .iter()
            .any(|problem| problem.code == code && path.is_none_or(|path| problem.path == path)),
        "expected {code} at {path:?}: {rejection:?}"
    );
    rejection
}

pub(super) fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/upstream").join(name)
}
