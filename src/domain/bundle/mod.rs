//! App bundles (docs/api.md §9): validation of an uploaded ZIP, safe
//! extraction, version ids, the per-version manifest and the comparison of
//! two versions. Everything here works on local files only; the HTTP layer
//! streams the upload to a temporary file and the storage layer decides where
//! versions live.

mod changes;
mod extract;
mod forms;
mod layout;
mod manifest;
mod paths;
mod structure;
mod validate;
mod version;
mod zip_directory;

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod test_support;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;

pub use changes::{
    diff_versions, form_file_paths, BundleChanges, ChangedPath, FieldChange, FormFilePaths, FormName,
    FormView, ModifiedForm, VersionView,
};
pub use extract::extract;
pub use forms::BUILT_IN_RENDERERS;
pub use manifest::{
    build_manifest, bundle_hash, format_timestamp, version_manifest, BundleManifest, ManifestFile,
};
pub use paths::{BundleFilePath, InvalidFilePath};
pub use validate::validate_zip;
pub use version::{declared_version_id, strip_active_marker, version_id_candidates, version_id_from_time};

/// Problem codes of docs/api.md §9.2; the `code` of every [`Problem`] is one of these.
pub mod codes {
    pub const ZIP_CORRUPT: &str = "ZIP_CORRUPT";
    pub const ZIP_UNSAFE_PATH: &str = "ZIP_UNSAFE_PATH";
    pub const ZIP_SYMLINK: &str = "ZIP_SYMLINK";
    pub const ZIP_DUPLICATE_ENTRY: &str = "ZIP_DUPLICATE_ENTRY";
    pub const ZIP_BOMB: &str = "ZIP_BOMB";
    pub const FILE_TOO_LARGE: &str = "FILE_TOO_LARGE";
    pub const UNEXPECTED_ENTRY: &str = "UNEXPECTED_ENTRY";
    pub const MISSING_APP_INDEX: &str = "MISSING_APP_INDEX";
    pub const MIXED_FORM_LAYOUTS: &str = "MIXED_FORM_LAYOUTS";
    pub const RENDERER_INVALID: &str = "RENDERER_INVALID";
    pub const MANIFEST_INVALID: &str = "MANIFEST_INVALID";
    pub const MANIFEST_FIELD_MISSING: &str = "MANIFEST_FIELD_MISSING";
    pub const ENTRY_POINT_MISSING: &str = "ENTRY_POINT_MISSING";
    pub const FORM_NAME_INVALID: &str = "FORM_NAME_INVALID";
    pub const FORM_FILE_MISSING: &str = "FORM_FILE_MISSING";
    pub const FORM_FILE_TOO_LARGE: &str = "FORM_FILE_TOO_LARGE";
    pub const FORM_FILE_INVALID_JSON: &str = "FORM_FILE_INVALID_JSON";
    pub const FORM_SCHEMA_INVALID: &str = "FORM_SCHEMA_INVALID";
    pub const FORM_UI_INVALID: &str = "FORM_UI_INVALID";
    pub const RENDERER_REFERENCE_MISSING: &str = "RENDERER_REFERENCE_MISSING";
}

/// Names of the validation steps of docs/api.md §9.2, in the order they run. The
/// HTTP layer puts the failing one into the error `detail`.
pub mod steps {
    pub const STRUCTURE: &str = "structure";
    pub const MANIFEST: &str = "manifest";
    pub const ENTRY_POINT: &str = "entry point";
    pub const FORMS: &str = "forms";
}

/// Numeric limits of docs/api.md §9.2. `Default` gives the contract's values; tests
/// and operators may tighten them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Upload size limit, enforced by the HTTP layer while streaming (413).
    pub max_zip_bytes: u64,
    pub max_entries: usize,
    pub max_entry_bytes: u64,
    pub max_total_uncompressed_bytes: u64,
    /// Entries larger than this are subject to the compression-ratio check.
    pub ratio_check_min_bytes: u64,
    pub max_compression_ratio: u64,
    pub max_manifest_bytes: u64,
    pub max_form_file_bytes: u64,
    pub max_form_name_chars: usize,
}

impl Default for Limits {
    fn default() -> Self {
        const MIB: u64 = 1024 * 1024;
        Limits {
            max_zip_bytes: 100 * MIB,
            max_entries: 10_000,
            max_entry_bytes: 50 * MIB,
            max_total_uncompressed_bytes: 512 * MIB,
            ratio_check_min_bytes: MIB,
            max_compression_ratio: 200,
            max_manifest_bytes: MIB,
            max_form_file_bytes: MIB,
            max_form_name_chars: 255,
        }
    }
}

/// One validation problem; serialises as an `errors[]` item `{path, code, message}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// Archive path the problem concerns (possibly with a `#/json/pointer`
    /// suffix); empty when it concerns the archive as a whole.
    pub path: String,
    pub code: &'static str,
    pub message: String,
}

impl Problem {
    pub(crate) fn new(path: impl Into<String>, code: &'static str, message: impl Into<String>) -> Self {
        Problem { path: path.into(), code, message: message.into() }
    }
}

/// Why a bundle was refused: the first step with problems, and all of its problems.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleRejection {
    pub step: &'static str,
    pub problems: Vec<Problem>,
}

impl fmt::Display for BundleRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "app bundle rejected at the {} step with {} problem(s)", self.step, self.problems.len())
    }
}

impl std::error::Error for BundleRejection {}

/// The archive layouts of docs/api.md §9.1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Layout {
    /// `app/index.html`, forms under `forms/`.
    Default,
    /// `app/index.html`, forms under `app/forms/`.
    AppForms,
    /// Synkronus 1.0 web layout: `index.html` (and `assets/`) at the root, forms under `forms/`.
    Legacy,
}

impl Layout {
    pub fn as_str(self) -> &'static str {
        match self {
            Layout::Default => "default",
            Layout::AppForms => "app-forms",
            Layout::Legacy => "legacy",
        }
    }

    /// Folder (without trailing slash) holding `<formType>/schema.json` and `ui.json`.
    pub fn forms_root(self) -> &'static str {
        match self {
            Layout::Default | Layout::Legacy => "forms",
            Layout::AppForms => "app/forms",
        }
    }

    /// The entry point synthesised for bundles without `manifest.json`.
    pub fn default_entry_point(self) -> &'static str {
        match self {
            Layout::Default | Layout::AppForms => "app/index.html",
            Layout::Legacy => "index.html",
        }
    }
}

/// The contents of a valid `manifest.json` (docs/api.md §9.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeclaredManifest {
    pub version: String,
    pub name: String,
    pub entry_point: String,
    pub description: Option<String>,
    pub created_at: Option<DateTime<Utc>>,
}

/// A regular file of a validated archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleFile {
    /// Relative, `/`-separated, checked safe.
    pub path: String,
    /// Uncompressed size, verified by inflating the entry.
    pub size: u64,
    /// Position of the entry in the archive, used by [`extract`].
    pub zip_index: usize,
}

/// One form folder of a validated bundle, ready to register as a form spec (docs/api.md §11.2).
#[derive(Debug, Clone, PartialEq)]
pub struct BundleForm {
    pub schema: Value,
    pub ui: Value,
}

/// A bundle that passed all four validation steps.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidatedBundle {
    pub layout: Layout,
    /// The declared manifest, or `None` for Synkronus 1.0 bundles; the caller
    /// then synthesises `{version: id, name: id, entryPoint}` (docs/api.md §9.1).
    pub manifest: Option<DeclaredManifest>,
    /// Declared `entryPoint`, or the layout's default when there is no manifest.
    pub entry_point: String,
    /// Every regular file, sorted by path in byte order.
    pub files: Vec<BundleFile>,
    /// Form type (folder name) to its schema and UI schema.
    pub forms: BTreeMap<String, BundleForm>,
}

impl ValidatedBundle {
    /// Name to show for this bundle: the declared name, else the version id.
    pub fn display_name<'a>(&'a self, version_id: &'a str) -> &'a str {
        self.manifest.as_ref().map_or(version_id, |manifest| manifest.name.as_str())
    }
}
