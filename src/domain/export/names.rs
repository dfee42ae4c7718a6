//! ZIP entry names (docs/api.md §13.1 and 17.8).

use std::collections::HashSet;

/// Sanitised names are cut to this many bytes (before any `-N` suffix).
pub const MAX_ENTRY_NAME_BYTES: usize = 100;

const UNTYPED: &str = "_untyped";

/// Every character outside `[A-Za-z0-9._-]` becomes `_` (one per character,
/// not per UTF-8 byte), then the result is cut to 100 bytes; being ASCII by
/// then, any cut is on a character boundary.
fn sanitize(raw: &str) -> String {
    let mut out: String = raw
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' })
        .collect();
    out.truncate(MAX_ENTRY_NAME_BYTES);
    out
}

/// Appends `-2`, `-3`, ... until `stem + ext` is not in `used`, then records it.
/// Returns the unique stem (without `ext`).
fn claim(stem: String, ext: &str, used: &mut HashSet<String>) -> String {
    if used.insert(format!("{stem}{ext}")) {
        return stem;
    }
    let mut n: u64 = 2;
    loop {
        let candidate = format!("{stem}-{n}");
        if used.insert(format!("{candidate}{ext}")) {
            return candidate;
        }
        n += 1;
    }
}

/// The stem of a per-form-type entry (`<stem>.parquet`, `<stem>.csv`): the form
/// type sanitised, `_untyped` when empty, made unique within `used_names`.
///
/// `used_names` belongs to one archive; the stems are recorded in it as given
/// back, so both extensions of one export may share a set or use their own.
pub fn entry_name_for_form_type(form_type: &str, used_names: &mut HashSet<String>) -> String {
    let stem = if form_type.is_empty() { UNTYPED.to_owned() } else { sanitize(form_type) };
    claim(stem, "", used_names)
}

/// The full entry name of one observation in the raw-json ZIP:
/// `<form_type>/<observation_id>.json`, both parts sanitised like form types.
///
/// The folder part is the only place where a sanitised name could be `.` or
/// `..`; those become `_` / `__` so no entry can escape the extraction folder.
/// Duplicates (ids that differ only in replaced characters) get `-2`, `-3`, ...
/// `used_names` grows with the entries, as the ZIP central directory does anyway.
pub fn raw_json_entry_name(
    form_type: &str,
    observation_id: &str,
    used_names: &mut HashSet<String>,
) -> String {
    let folder = if form_type.is_empty() {
        UNTYPED.to_owned()
    } else {
        let s = sanitize(form_type);
        if s.bytes().all(|b| b == b'.') {
            "_".repeat(s.len())
        } else {
            s
        }
    };
    let file = if observation_id.is_empty() { "_".to_owned() } else { sanitize(observation_id) };
    let stem = claim(format!("{folder}/{file}"), ".json", used_names);
    format!("{stem}.json")
}
