//! A push body -> the records to commit: request fields (400), then every record (422 with all
//! their problems).

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::super::canonical::{Doc, Field, Kind, NodeId, Tape};
use super::super::push_body::{self, PushBody, Received};
use super::super::{Dialect, IncomingRecord, PushRequest, RecordTexts, Warning};
use super::{request_id_field, DecodeError, DecodeErrorKind, DecodeResult, MAX_ID_CHARS};
use crate::domain::json_text;
use crate::domain::problem::ItemProblem;
use crate::domain::time::parse_rfc3339;

/// Per-dialect field names of a record.
struct RecordKeys {
    list_path: &'static str,
    id: &'static [&'static str],
    form_type: &'static str,
    form_version: &'static str,
    created_at: &'static str,
    updated_at: &'static str,
    device_id: &'static str,
}

impl RecordKeys {
    /// The fields of a record read as parsed values (`data` and `geolocation` are read as text).
    fn parsed(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.id.iter().copied().chain([
            self.form_type,
            self.form_version,
            self.created_at,
            self.updated_at,
            self.device_id,
            "deleted",
            "version",
            "author",
            "tags",
        ])
    }
}

fn record_keys(dialect: Dialect) -> RecordKeys {
    match dialect {
        Dialect::Synkronus => RecordKeys {
            list_path: "/records",
            id: &["observation_id"],
            form_type: "form_type",
            form_version: "form_version",
            created_at: "created_at",
            updated_at: "updated_at",
            device_id: "device_id",
        },
        Dialect::Spec => RecordKeys {
            list_path: "/records",
            id: &["id"],
            form_type: "schema_type",
            form_version: "schema_version",
            created_at: "created_at",
            updated_at: "updated_at",
            device_id: "device_id",
        },
        Dialect::Camel => RecordKeys {
            list_path: "/changes/observations",
            id: &["observationId", "id"],
            form_type: "formType",
            form_version: "formVersion",
            created_at: "createdAt",
            updated_at: "updatedAt",
            device_id: "deviceId",
        },
    }
}

/// Decodes and validates a parsed push body: the same as [`decode_push_body`] on its text.
pub fn decode_push(body: &Value) -> DecodeResult<PushRequest> {
    let text = body.to_string();
    decode_push_body(&Received::parse(text.as_bytes()).and_then(Received::split).map_err(malformed)?)
}

fn malformed(e: serde_json::Error) -> DecodeError {
    DecodeError::bad_request(format!("Malformed JSON: {e}"))
}

/// Decodes and validates a push body, parsing one record at a time. 400 for request-level
/// problems; 422 listing every record problem.
pub fn decode_push_body(body: &PushBody) -> DecodeResult<PushRequest> {
    let dialect = body.dialect();
    let obj = body.fields().ok_or_else(|| DecodeError::bad_request("Request body must be a JSON object"))?;
    let (client_key, tid_key) = match dialect {
        Dialect::Camel => ("clientId", "transmissionId"),
        _ => ("client_id", "transmission_id"),
    };
    let client_id = request_id_field(obj, client_key)?;
    let transmission_id = match (dialect, obj.get(tid_key)) {
        (Dialect::Camel, None | Some(Value::Null)) => None,
        _ => Some(request_id_field(obj, tid_key)?),
    };
    let keys = record_keys(dialect);
    let Some(list) = body.records(dialect) else {
        return Err(DecodeError::bad_request(format!("'{}' must be an array", keys.list_path))
            .with_path(keys.list_path));
    };

    let mut problems = Vec::new();
    let mut records = Vec::with_capacity(list.len());
    let mut warnings = Vec::new();
    let mut reader = RecordReader::default();
    for (index, raw) in list.iter().enumerate() {
        // One record at a time: its tape is reused by the next.
        let decoded = decode_record(&mut reader, raw.get(), index, &keys, &mut problems)
            // The error a record refused here always had: parsing it into a `Value` fails alike.
            .map_err(|e| malformed(push_body::parse::<Value>(raw.get()).err().unwrap_or(e)))?;
        match decoded {
            Some(record) => {
                if record.form_type().is_empty() {
                    warnings.push((index, Warning::missing_form_type(record.id(), keys.form_type)));
                }
                records.push(record);
            }
            None => continue,
        }
    }
    if !problems.is_empty() {
        let total = problems.len();
        let bad_records = count_bad_records(&problems, keys.list_path);
        let message = format!(
            "{bad_records} of {} records failed validation ({total} problems); nothing was stored",
            list.len()
        );
        return Err(DecodeError { kind: DecodeErrorKind::ValidationFailed, message, problems });
    }
    Ok(PushRequest { dialect, client_id, transmission_id, records, warnings })
}

fn count_bad_records(problems: &[ItemProblem], list_path: &str) -> usize {
    let mut indexes: Vec<&str> = problems
        .iter()
        .filter_map(|p| p.path.strip_prefix(list_path))
        .filter_map(|rest| rest.trim_start_matches('/').split('/').next())
        .collect();
    indexes.sort_unstable();
    indexes.dedup();
    indexes.len()
}

/// Collects one record's problems under its JSON pointer.
struct RecordProblems<'a> {
    list_path: &'a str,
    index: usize,
    record_id: Option<&'a str>,
    list: &'a mut Vec<ItemProblem>,
    found: bool,
}

impl RecordProblems<'_> {
    fn add(&mut self, key: &str, code: &str, message: String) {
        let mut p = ItemProblem::new(format!("{}/{}/{key}", self.list_path, self.index), code, message);
        p.record_id = self.record_id.map(str::to_string);
        self.list.push(p);
        self.found = true;
    }
}

/// Form type and version: optional strings of at most 255 characters.
fn short_string<'r>(rec: &'r Fields, key: &str, problems: &mut RecordProblems) -> &'r str {
    match rec.get(key) {
        None | Some(Field::Null) => "",
        Some(Field::Text(s)) if s.chars().count() > MAX_ID_CHARS => {
            problems.add(key, "TOO_LONG", format!("{key} is longer than 255 characters"));
            ""
        }
        Some(Field::Text(s)) if s.contains('\0') => {
            problems.add(key, "TYPE_ERROR", format!("{key} must not contain NUL characters"));
            ""
        }
        Some(Field::Text(s)) => s,
        Some(_) => {
            problems.add(key, "TYPE_ERROR", format!("{key} must be a string"));
            ""
        }
    }
}

fn timestamp(rec: &Fields, key: &str, problems: &mut RecordProblems) -> Option<DateTime<Utc>> {
    match rec.get(key) {
        None | Some(Field::Null) => None,
        Some(Field::Text(s)) => {
            let parsed = parse_rfc3339(s);
            if parsed.is_none() {
                problems.add(
                    key,
                    "INVALID_TIMESTAMP",
                    format!("{key} must be an RFC 3339 timestamp with an offset"),
                );
            }
            parsed
        }
        Some(_) => {
            problems.add(key, "INVALID_TIMESTAMP", format!("{key} must be an RFC 3339 timestamp string"));
            None
        }
    }
}

/// The fields of a record decoding reads, strings borrowed from its text where they can be; of a
/// repeated key the last counts.
struct Fields<'t>(Vec<(&'static str, Field<'t>)>);

impl<'t> Fields<'t> {
    fn get(&self, key: &str) -> Option<&Field<'t>> {
        self.0.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    fn set(&mut self, key: &'static str, value: Field<'t>) {
        match self.0.iter_mut().find(|(k, _)| *k == key) {
            Some(field) => field.1 = value,
            None => self.0.push((key, value)),
        }
    }

    /// A number, array or object field as its parsed value.
    fn parsed(&self, key: &str) -> Option<Value> {
        match self.get(key) {
            Some(Field::Other(text)) => push_body::parse(text).ok(),
            _ => None,
        }
    }
}

/// Reads records: one tape, and one buffer for each text written, for all the records of a push.
#[derive(Default)]
struct RecordReader {
    tape: Tape,
    data: String,
    geolocation: String,
    tags: String,
}

/// A JSON object field (data, geolocation) that must be storable: true when its canonical text
/// was written to `out`.
fn json_object<'t>(
    doc: &mut Doc<'t>,
    node: Option<NodeId<'t>>,
    key: &str,
    problems: &mut RecordProblems,
    out: &mut String,
) -> bool {
    let Some(node) = node else { return false };
    match doc.kind(node) {
        Kind::Null => false,
        Kind::Object => match doc.write(node, out) {
            Ok(()) => true,
            Err(why) => {
                problems.add(key, "TYPE_ERROR", format!("{key} cannot be stored: {why}"));
                false
            }
        },
        Kind::Other => {
            let what = if key == "data" { "a JSON object" } else { "an object or null" };
            problems.add(key, "TYPE_ERROR", format!("{key} must be {what}"));
            false
        }
    }
}

/// Decodes one record from its text. Fails exactly where parsing the text into a `Value` fails.
fn decode_record(
    reader: &mut RecordReader,
    text: &str,
    index: usize,
    keys: &RecordKeys,
    problem_list: &mut Vec<ItemProblem>,
) -> serde_json::Result<Option<IncomingRecord>> {
    let RecordReader { tape, data: data_text, geolocation: geolocation_text, tags: tags_text } = reader;
    let mut doc = tape.read(text)?;
    let root = doc.root();
    if doc.kind(root) != Kind::Object {
        let path = format!("{}/{index}", keys.list_path);
        problem_list.push(ItemProblem::new(path, "TYPE_ERROR", "record must be a JSON object"));
        return Ok(None);
    }
    let mut fields = Fields(Vec::with_capacity(12));
    let (mut data_node, mut geolocation_node) = (None, None);
    for (key, node) in doc.entries(root) {
        match key {
            "data" => data_node = Some(node),
            "geolocation" => geolocation_node = Some(node),
            _ => {
                if let Some(name) = keys.parsed().find(|name| *name == key) {
                    fields.set(name, doc.field(node));
                }
            }
        }
    }
    let rec = &fields;
    let mut problems = RecordProblems {
        list_path: keys.list_path,
        index,
        record_id: None,
        list: problem_list,
        found: false,
    };

    let id = record_id(rec, keys, &mut problems);
    problems.record_id = id;
    let form_type = short_string(rec, keys.form_type, &mut problems);
    let form_version = short_string(rec, keys.form_version, &mut problems);
    let deleted = deleted_flag(rec, &mut problems);
    data_text.clear();
    let data = json_object(&mut doc, data_node, "data", &mut problems, data_text);
    if !deleted && data_node.is_none_or(|node| doc.kind(node) == Kind::Null) {
        problems.add("data", "REQUIRED", "data is required unless the record is deleted".into());
    }
    let created_at = timestamp(rec, keys.created_at, &mut problems);
    let updated_at = timestamp(rec, keys.updated_at, &mut problems);
    geolocation_text.clear();
    let geolocation = json_object(&mut doc, geolocation_node, "geolocation", &mut problems, geolocation_text);
    let base_version = base_version(rec, &mut problems);

    // 2026 fields (docs/api.md §17.5): optional, and a wrong type is dropped rather than failing the sync.
    let author = optional_text(rec, "author");
    let device_id = optional_text(rec, keys.device_id);
    tags_text.clear();
    let tags = optional_tags(rec, tags_text);

    let Some(id) = id.filter(|_| !problems.found) else { return Ok(None) };
    let texts = RecordTexts {
        id,
        form_type,
        form_version,
        data: data.then_some(data_text.as_str()),
        geolocation: geolocation.then_some(geolocation_text.as_str()),
        author,
        device_id,
        tags: tags.then_some(tags_text.as_str()),
    };
    let Ok(mut record) = IncomingRecord::new(texts) else {
        problems.add("data", "TOO_LARGE", "the record is larger than 4 GiB".into());
        return Ok(None);
    };
    record.deleted = deleted;
    record.created_at = created_at;
    record.updated_at = updated_at;
    record.base_version = base_version;
    Ok(Some(record))
}

/// The record's id: the first present alias, a non-empty string of at most 255 characters.
fn record_id<'r>(rec: &'r Fields, keys: &RecordKeys, problems: &mut RecordProblems) -> Option<&'r str> {
    let (id_key, id_value) = keys
        .id
        .iter()
        .find_map(|k| rec.get(k).filter(|v| **v != Field::Null).map(|v| (*k, v)))
        .unwrap_or((keys.id[0], &Field::Null));
    match id_value {
        Field::Text(s) if !s.is_empty() && s.chars().count() > MAX_ID_CHARS => {
            problems.add(id_key, "TOO_LONG", format!("{id_key} is longer than 255 characters"));
            None
        }
        Field::Text(s) if s.contains('\0') => {
            problems.add(id_key, "TYPE_ERROR", format!("{id_key} must not contain NUL characters"));
            None
        }
        Field::Text(s) if !s.is_empty() => Some(s),
        Field::Null | Field::Text(_) => {
            problems.add(id_key, "REQUIRED", format!("{id_key} is required"));
            None
        }
        _ => {
            problems.add(id_key, "TYPE_ERROR", format!("{id_key} must be a string"));
            None
        }
    }
}

fn deleted_flag(rec: &Fields, problems: &mut RecordProblems) -> bool {
    match rec.get("deleted") {
        None | Some(Field::Null) => false,
        Some(Field::Bool(b)) => *b,
        Some(_) => {
            problems.add("deleted", "TYPE_ERROR", "deleted must be a boolean".into());
            false
        }
    }
}

/// The version the client's change is based on, when it names one.
fn base_version(rec: &Fields, problems: &mut RecordProblems) -> Option<i64> {
    match rec.get("version") {
        None | Some(Field::Null) => None,
        Some(_) => {
            let parsed = rec.parsed("version").and_then(|v| v.as_i64()).filter(|n| *n >= 0);
            if parsed.is_none() {
                problems.add("version", "TYPE_ERROR", "version must be an integer >= 0".into());
            }
            parsed
        }
    }
}

fn optional_text<'r>(rec: &'r Fields, key: &str) -> Option<&'r str> {
    match rec.get(key) {
        Some(Field::Text(s)) if !s.contains('\0') => Some(s),
        _ => None,
    }
}

/// Tags: an array of strings, or nothing at all when any item is not one.
/// Tags: an array of strings, as canonical JSON text (into `out`), or nothing at all when any
/// item is not one.
fn optional_tags(rec: &Fields, out: &mut String) -> bool {
    let Some(Value::Array(items)) = rec.parsed("tags") else { return false };
    if !items.iter().all(|t| t.as_str().is_some_and(|s| !s.contains('\0'))) {
        return false;
    }
    out.push('[');
    for (i, tag) in items.iter().filter_map(Value::as_str).enumerate() {
        if i > 0 {
            out.push(',');
        }
        json_text::write_string(out, tag);
    }
    out.push(']');
    true
}

#[cfg(test)]
mod tests;
