//! `GET /app-bundle/changes` (docs/api.md §9.4): a file-level and a form-level
//! comparison of two versions in one object.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::path::Path;

use serde::Serialize;
use serde_json::{Map, Value};

use super::extract::contained_path;
use super::layout::{SCHEMA_FILE, UI_FILE};
use super::BundleManifest;

/// What the comparison needs to know about one version.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct VersionView {
    pub version: String,
    /// File path to its SHA-256 hex.
    pub files: BTreeMap<String, String>,
    /// Form type to its schema and UI schema.
    pub forms: BTreeMap<String, FormView>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct FormView {
    pub schema: Value,
    pub ui: Value,
}

impl VersionView {
    /// A view from a stored manifest and already loaded forms.
    pub fn from_manifest(manifest: &BundleManifest, forms: BTreeMap<String, FormView>) -> Self {
        VersionView {
            version: manifest.version.clone(),
            files: manifest.files.iter().map(|file| (file.path.clone(), file.hash.clone())).collect(),
            forms,
        }
    }

    /// A view from a stored manifest, reading each form's `schema.json` and
    /// `ui.json` from the version's extracted folder.
    pub fn load(manifest: &BundleManifest, version_dir: &Path) -> io::Result<Self> {
        let paths = form_file_paths(manifest.files.iter().map(|file| file.path.as_str()));
        let mut forms = BTreeMap::new();
        for (form, form_paths) in paths {
            let schema = read_json_or_null(version_dir, form_paths.schema.as_deref())?;
            let ui = read_json_or_null(version_dir, form_paths.ui.as_deref())?;
            forms.insert(form, FormView { schema, ui });
        }
        Ok(Self::from_manifest(manifest, forms))
    }
}

/// Where a form's files are inside a version.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FormFilePaths {
    pub schema: Option<String>,
    pub ui: Option<String>,
}

/// Groups the form files of a version's file list by form type. The forms
/// root is `app/forms/` when any `app/forms/<type>/` holds a form file (the
/// app-forms layout), else `forms/` (docs/api.md §9.1).
pub fn form_file_paths<'a>(paths: impl IntoIterator<Item = &'a str>) -> BTreeMap<String, FormFilePaths> {
    let mut by_root: BTreeMap<&str, BTreeMap<String, FormFilePaths>> = BTreeMap::new();
    for path in paths {
        let segments: Vec<&str> = path.split('/').collect();
        let (root, form, file) = match segments.as_slice() {
            ["forms", form, file] => ("forms", *form, *file),
            ["app", "forms", form, file] => ("app/forms", *form, *file),
            _ => continue,
        };
        let slot = by_root.entry(root).or_default().entry(form.to_owned()).or_default();
        match file {
            SCHEMA_FILE => slot.schema = Some(path.to_owned()),
            UI_FILE => slot.ui = Some(path.to_owned()),
            _ => {}
        }
    }
    by_root.remove("app/forms").or_else(|| by_root.remove("forms")).unwrap_or_default()
}

fn read_json_or_null(version_dir: &Path, path: Option<&str>) -> io::Result<Value> {
    let Some(path) = path else {
        return Ok(Value::Null);
    };
    let bytes = fs::read(contained_path(version_dir, path)?)?;
    serde_json::from_slice(&bytes).map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))
}

/// The `GET /app-bundle/changes` body, keys as in docs/api.md §9.4.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BundleChanges {
    pub current_version: String,
    pub target_version: String,
    pub added: Vec<ChangedPath>,
    pub modified: Vec<ChangedPath>,
    pub removed: Vec<ChangedPath>,
    pub compare_version_a: String,
    pub compare_version_b: String,
    pub form_changes: bool,
    pub ui_changes: bool,
    pub new_forms: Vec<FormName>,
    pub removed_forms: Vec<FormName>,
    pub modified_forms: Vec<ModifiedForm>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChangedPath {
    pub path: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FormName {
    pub form: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModifiedForm {
    pub form: String,
    pub schema_changed: bool,
    pub ui_changed: bool,
    pub core_changed: bool,
    pub added_fields: Vec<FieldChange>,
    pub removed_fields: Vec<FieldChange>,
}

/// A top-level schema property with its `type` (`null` when it has none).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FieldChange {
    pub field: String,
    #[serde(rename = "type")]
    pub field_type: Value,
}

/// Compares version `a` (current) with version `b` (target).
pub fn diff_versions(a: &VersionView, b: &VersionView) -> BundleChanges {
    let path_item = |path: &String| ChangedPath { path: path.clone() };
    // BTreeMap iteration keeps every list sorted by path or form.
    let added = b.files.keys().filter(|path| !a.files.contains_key(*path)).map(path_item).collect();
    let removed = a.files.keys().filter(|path| !b.files.contains_key(*path)).map(path_item).collect();
    let modified = b
        .files
        .iter()
        .filter(|(path, hash)| a.files.get(*path).is_some_and(|old| old != *hash))
        .map(|(path, _)| path_item(path))
        .collect();

    let form_item = |form: &String| FormName { form: form.clone() };
    let new_forms: Vec<FormName> =
        b.forms.keys().filter(|form| !a.forms.contains_key(*form)).map(form_item).collect();
    let removed_forms: Vec<FormName> =
        a.forms.keys().filter(|form| !b.forms.contains_key(*form)).map(form_item).collect();
    let modified_forms: Vec<ModifiedForm> = b
        .forms
        .iter()
        .filter_map(|(form, new)| {
            let old = a.forms.get(form)?;
            compare_form(form, old, new)
        })
        .collect();

    let form_changes = !new_forms.is_empty()
        || !removed_forms.is_empty()
        || modified_forms.iter().any(|form| form.schema_changed);
    let ui_changes = modified_forms.iter().any(|form| form.ui_changed);
    BundleChanges {
        current_version: a.version.clone(),
        target_version: b.version.clone(),
        added,
        modified,
        removed,
        compare_version_a: a.version.clone(),
        compare_version_b: b.version.clone(),
        form_changes,
        ui_changes,
        new_forms,
        removed_forms,
        modified_forms,
    }
}

/// `None` when schema and UI are equal as JSON (key order never matters).
fn compare_form(form: &str, old: &FormView, new: &FormView) -> Option<ModifiedForm> {
    let schema_changed = old.schema != new.schema;
    let ui_changed = old.ui != new.ui;
    if !schema_changed && !ui_changed {
        return None;
    }
    let old_fields = field_types(&old.schema);
    let new_fields = field_types(&new.schema);
    // Both lists come out sorted by field name: the maps are BTreeMaps.
    let added_fields: Vec<FieldChange> = new_fields
        .iter()
        .filter(|(name, field_type)| old_fields.get(*name) != Some(*field_type))
        .map(|(name, field_type)| field_change(name, field_type))
        .collect();
    let removed_fields: Vec<FieldChange> = old_fields
        .iter()
        .filter(|(name, field_type)| new_fields.get(*name) != Some(*field_type))
        .map(|(name, field_type)| field_change(name, field_type))
        .collect();

    let old_properties = top_level_properties(&old.schema);
    let new_properties = top_level_properties(&new.schema);
    let core_names: BTreeSet<&String> =
        core_property_names(old_properties).chain(core_property_names(new_properties)).collect();
    let core_changed = core_names.into_iter().any(|name| {
        old_properties.and_then(|properties| properties.get(name))
            != new_properties.and_then(|properties| properties.get(name))
    });

    Some(ModifiedForm {
        form: form.to_owned(),
        schema_changed,
        ui_changed,
        core_changed,
        added_fields,
        removed_fields,
    })
}

fn field_change(name: &str, field_type: &Value) -> FieldChange {
    FieldChange { field: name.to_owned(), field_type: field_type.clone() }
}

fn top_level_properties(schema: &Value) -> Option<&Map<String, Value>> {
    schema.get("properties").and_then(Value::as_object)
}

/// Top-level property name to its `type` value (`null` when absent).
fn field_types(schema: &Value) -> BTreeMap<&String, &Value> {
    top_level_properties(schema)
        .map(|properties| {
            properties
                .iter()
                .map(|(name, property)| (name, property.get("type").unwrap_or(&Value::Null)))
                .collect()
        })
        .unwrap_or_default()
}

/// Properties marked `"x-core": true` or named `core_*`.
fn core_property_names(properties: Option<&Map<String, Value>>) -> impl Iterator<Item = &String> {
    properties.into_iter().flat_map(|properties| {
        properties.iter().filter_map(|(name, property)| {
            let marked = property.get("x-core") == Some(&Value::Bool(true));
            (marked || name.starts_with("core_")).then_some(name)
        })
    })
}
