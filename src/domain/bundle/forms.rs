//! Step 4: form folders (`<root>/<type>/schema.json` + `ui.json`), `ext.json`
//! and renderer references (docs/api.md §9.2).

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;

use serde_json::Value;
use zip::ZipArchive;

use super::layout::{EXT_FILE, SCHEMA_FILE, UI_FILE};
use super::structure::SafeEntry;
use super::validate::{read_small_file, SmallFile};
use super::{codes, BundleForm, Limits, Problem};

/// Renderer names every client ships, so schemas may use them without bundling.
pub const BUILT_IN_RENDERERS: &[&str] = &[
    "text",
    "number",
    "integer",
    "boolean",
    "date",
    "time",
    "datetime",
    "range",
    "select",
    "combo",
    "radio",
    "checkbox",
    "toggle",
    "group",
    "categorization",
    "category",
    "multiselect",
    "textarea",
    "slider",
    "rating",
    "builtin-text",
    "image",
    "signature",
    "audio",
    "video",
    "file",
    "qrcode",
];

/// Schema keys whose string values name a renderer.
const RENDERER_KEYS: &[&str] = &["x-renderer", "rendererType", "x-question-type"];

pub(super) fn check_forms(
    archive: &mut ZipArchive<File>,
    files: &BTreeMap<&str, &SafeEntry>,
    forms_root: &str,
    form_folders: &BTreeSet<String>,
    renderers: &BTreeSet<String>,
    limits: &Limits,
) -> Result<BTreeMap<String, BundleForm>, Vec<Problem>> {
    let mut problems = Vec::new();
    let mut forms = BTreeMap::new();

    for folder in form_folders {
        let folder_path = format!("{forms_root}/{folder}/");
        let name_chars = folder.chars().count();
        if name_chars == 0 || name_chars > limits.max_form_name_chars || folder.starts_with('.') {
            problems.push(Problem::new(
                &folder_path,
                codes::FORM_NAME_INVALID,
                format!(
                    "a form folder name must be 1 to {} characters and must not start with '.'",
                    limits.max_form_name_chars
                ),
            ));
        }
        let schema = read_form_json(archive, files, &folder_path, SCHEMA_FILE, limits, &mut problems);
        let ui = read_form_json(archive, files, &folder_path, UI_FILE, limits, &mut problems);

        if let Some(schema) = &schema {
            let schema_path = format!("{folder_path}{SCHEMA_FILE}");
            if let Err(error) = jsonschema::draft7::new(schema) {
                problems.push(Problem::new(
                    &schema_path,
                    codes::FORM_SCHEMA_INVALID,
                    format!("schema.json is not a valid JSON Schema draft-07: {error}"),
                ));
            }
            let mut pointer = String::new();
            check_renderer_references(schema, &mut pointer, &schema_path, renderers, &mut problems);
        }
        if let Some(ui) = &ui {
            if !matches!(ui.get("type"), Some(Value::String(_))) {
                problems.push(Problem::new(
                    format!("{folder_path}{UI_FILE}"),
                    codes::FORM_UI_INVALID,
                    "ui.json must have a string type",
                ));
            }
        }
        if let (Some(schema), Some(ui)) = (schema, ui) {
            forms.insert(folder.clone(), BundleForm { schema, ui });
        }
    }

    let ext_path = format!("{forms_root}/{EXT_FILE}");
    if let Some(entry) = files.get(ext_path.as_str()) {
        let ext_problem = |message: String| Problem::new(&ext_path, codes::FORM_FILE_INVALID_JSON, message);
        match read_small_file(archive, entry, limits.max_form_file_bytes) {
            Ok(SmallFile::Bytes(bytes)) => match serde_json::from_slice::<Value>(&bytes) {
                Ok(Value::Object(_)) => {}
                Ok(_) => problems.push(ext_problem("ext.json must be a JSON object".to_owned())),
                Err(error) => problems.push(ext_problem(format!("ext.json is not valid JSON: {error}"))),
            },
            Ok(SmallFile::TooLarge) => problems
                .push(ext_problem(format!("ext.json is larger than {} bytes", limits.max_form_file_bytes))),
            Err(error) => problems.push(ext_problem(format!("ext.json cannot be read: {error}"))),
        }
    }

    if problems.is_empty() {
        Ok(forms)
    } else {
        Err(problems)
    }
}

/// Reads one form file as a JSON object, recording why when it cannot.
fn read_form_json(
    archive: &mut ZipArchive<File>,
    files: &BTreeMap<&str, &SafeEntry>,
    folder_path: &str,
    file_name: &str,
    limits: &Limits,
    problems: &mut Vec<Problem>,
) -> Option<Value> {
    let path = format!("{folder_path}{file_name}");
    let Some(entry) = files.get(path.as_str()) else {
        problems.push(Problem::new(
            &path,
            codes::FORM_FILE_MISSING,
            format!("every form folder needs {SCHEMA_FILE} and {UI_FILE}"),
        ));
        return None;
    };
    let bytes = match read_small_file(archive, entry, limits.max_form_file_bytes) {
        Ok(SmallFile::Bytes(bytes)) => bytes,
        Ok(SmallFile::TooLarge) => {
            problems.push(Problem::new(
                &path,
                codes::FORM_FILE_TOO_LARGE,
                format!("{file_name} is larger than {} bytes", limits.max_form_file_bytes),
            ));
            return None;
        }
        Err(error) => {
            problems.push(Problem::new(
                &path,
                codes::FORM_FILE_INVALID_JSON,
                format!("{file_name} cannot be read: {error}"),
            ));
            return None;
        }
    };
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(value @ Value::Object(_)) => Some(value),
        Ok(_) => {
            problems.push(Problem::new(
                &path,
                codes::FORM_FILE_INVALID_JSON,
                format!("{file_name} must be a JSON object"),
            ));
            None
        }
        Err(error) => {
            problems.push(Problem::new(
                &path,
                codes::FORM_FILE_INVALID_JSON,
                format!("{file_name} is not valid JSON: {error}"),
            ));
            None
        }
    }
}

/// Walks the whole schema; `pointer` is the JSON pointer of `value`.
fn check_renderer_references(
    value: &Value,
    pointer: &mut String,
    schema_path: &str,
    renderers: &BTreeSet<String>,
    problems: &mut Vec<Problem>,
) {
    match value {
        Value::Object(object) => {
            for (key, child) in object {
                let parent_len = pointer.len();
                pointer.push('/');
                pointer.push_str(&key.replace('~', "~0").replace('/', "~1"));
                if let Value::String(renderer) = child {
                    let is_reference = RENDERER_KEYS.contains(&key.as_str());
                    if is_reference
                        && !renderers.contains(renderer)
                        && !BUILT_IN_RENDERERS.contains(&renderer.as_str())
                    {
                        problems.push(Problem::new(
                            format!("{schema_path}#{pointer}"),
                            codes::RENDERER_REFERENCE_MISSING,
                            format!("renderer {renderer:?} is neither bundled under renderers/ nor built in"),
                        ));
                    }
                }
                check_renderer_references(child, pointer, schema_path, renderers, problems);
                pointer.truncate(parent_len);
            }
        }
        Value::Array(items) => {
            for (index, item) in items.iter().enumerate() {
                let parent_len = pointer.len();
                pointer.push('/');
                pointer.push_str(&index.to_string());
                check_renderer_references(item, pointer, schema_path, renderers, problems);
                pointer.truncate(parent_len);
            }
        }
        _ => {}
    }
}
