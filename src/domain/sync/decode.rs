//! Wire -> internal model for push and pull, with the validation order of docs/api.md §8.3.

use chrono::{DateTime, Utc};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::canonical::{Field, Kind, NodeId, Tape};
use super::push_body::{self, PushBody, Received};
use super::{clamp_limit, Dialect, IncomingRecord, PullCursor, PullRequest, PushRequest, Warning};
use crate::domain::page_token::{self, TokenKind};
use crate::domain::problem::ItemProblem;
use crate::domain::time::parse_rfc3339;

const MAX_ID_CHARS: usize = 255;

/// Why a push or pull request was refused. The HTTP layer gives each kind its status and code.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct DecodeError {
    pub kind: DecodeErrorKind,
    pub message: String,
    /// Where the request went wrong; for `ValidationFailed`, every record problem found.
    pub problems: Vec<ItemProblem>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeErrorKind {
    /// The request as a whole is malformed.
    BadRequest,
    /// The request is well-formed but some of its records are not; nothing is stored.
    ValidationFailed,
    /// The page token is not one this server issued for this listing.
    InvalidPageToken,
}

type DecodeResult<T> = Result<T, DecodeError>;

impl DecodeError {
    fn bad_request(message: impl Into<String>) -> Self {
        DecodeError { kind: DecodeErrorKind::BadRequest, message: message.into(), problems: Vec::new() }
    }

    /// Names the one place that is wrong, as a problem with the request's own message.
    fn with_path(mut self, path: &str) -> Self {
        self.problems = vec![ItemProblem::new(path, "BAD_REQUEST", self.message.clone())];
        self
    }

    fn invalid_page_token() -> Self {
        DecodeError {
            kind: DecodeErrorKind::InvalidPageToken,
            message: "Invalid page token".into(),
            problems: Vec::new(),
        }
    }
}

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

fn object(body: &Value) -> DecodeResult<&Map<String, Value>> {
    body.as_object().ok_or_else(|| DecodeError::bad_request("Request body must be a JSON object"))
}

/// A required identifier-like string field of the request: 1–255 characters, no NUL.
fn request_id_field(obj: &Map<String, Value>, key: &str) -> DecodeResult<String> {
    match obj.get(key) {
        Some(Value::String(s)) if valid_free_form_id(s) => Ok(s.clone()),
        Some(Value::String(_)) => {
            Err(DecodeError::bad_request(format!("'{key}' must be 1 to 255 characters"))
                .with_path(&format!("/{key}")))
        }
        None | Some(Value::Null) => {
            Err(DecodeError::bad_request(format!("'{key}' is required")).with_path(&format!("/{key}")))
        }
        Some(_) => {
            Err(DecodeError::bad_request(format!("'{key}' must be a string")).with_path(&format!("/{key}")))
        }
    }
}

/// Free-form ids: 1–255 characters; NUL cannot be stored in PostgreSQL text.
pub fn valid_free_form_id(s: &str) -> bool {
    !s.is_empty() && s.chars().count() <= MAX_ID_CHARS && !s.contains('\0')
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
                if record.form_type.is_empty() {
                    warnings.push((index, Warning::missing_form_type(&record.id, keys.form_type)));
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
fn short_string(rec: &Fields, key: &str, problems: &mut RecordProblems) -> String {
    match rec.get(key) {
        None | Some(Field::Null) => String::new(),
        Some(Field::Text(s)) if s.chars().count() > MAX_ID_CHARS => {
            problems.add(key, "TOO_LONG", format!("{key} is longer than 255 characters"));
            String::new()
        }
        Some(Field::Text(s)) if s.contains('\0') => {
            problems.add(key, "TYPE_ERROR", format!("{key} must not contain NUL characters"));
            String::new()
        }
        Some(Field::Text(s)) => s.to_string(),
        Some(_) => {
            problems.add(key, "TYPE_ERROR", format!("{key} must be a string"));
            String::new()
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

/// Reads records: one tape for all the records of a push.
#[derive(Default)]
struct RecordReader {
    tape: Tape,
}

/// A JSON object field (data, geolocation) that must be storable, as its canonical text.
fn json_object(
    tape: &mut Tape,
    record: &str,
    node: Option<NodeId>,
    key: &str,
    problems: &mut RecordProblems,
) -> serde_json::Result<Option<Box<RawValue>>> {
    let Some(node) = node else { return Ok(None) };
    match tape.kind(node) {
        Kind::Null => Ok(None),
        Kind::Object => {
            // Room for the text as sent: the canonical text is rarely longer (an exponent gains
            // its sign), so the box is made without another copy.
            let mut text = String::with_capacity(tape.span(node).len() + 8);
            if let Err(why) = tape.write(record, node, &mut text) {
                problems.add(key, "TYPE_ERROR", format!("{key} cannot be stored: {why}"));
                return Ok(None);
            }
            RawValue::from_string(text).map(Some)
        }
        Kind::Other => {
            let what = if key == "data" { "a JSON object" } else { "an object or null" };
            problems.add(key, "TYPE_ERROR", format!("{key} must be {what}"));
            Ok(None)
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
    let tape = &mut reader.tape;
    let root = tape.read(text)?;
    if tape.kind(root) != Kind::Object {
        let path = format!("{}/{index}", keys.list_path);
        problem_list.push(ItemProblem::new(path, "TYPE_ERROR", "record must be a JSON object"));
        return Ok(None);
    }
    let mut fields = Fields(Vec::with_capacity(12));
    let (mut data_node, mut geolocation_node) = (None, None);
    for (key, node) in tape.entries(text, root) {
        match key {
            "data" => data_node = Some(node),
            "geolocation" => geolocation_node = Some(node),
            _ => {
                if let Some(name) = keys.parsed().find(|name| *name == key) {
                    fields.set(name, tape.field(text, node)?);
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
    problems.record_id = id.as_deref();
    let form_type = short_string(rec, keys.form_type, &mut problems);
    let form_version = short_string(rec, keys.form_version, &mut problems);
    let deleted = deleted_flag(rec, &mut problems);
    let data = json_object(tape, text, data_node, "data", &mut problems)?;
    if !deleted && data_node.is_none_or(|node| tape.kind(node) == Kind::Null) {
        problems.add("data", "REQUIRED", "data is required unless the record is deleted".into());
    }
    let created_at = timestamp(rec, keys.created_at, &mut problems);
    let updated_at = timestamp(rec, keys.updated_at, &mut problems);
    let geolocation = json_object(tape, text, geolocation_node, "geolocation", &mut problems)?;
    let base_version = base_version(rec, &mut problems);

    // 2026 fields (docs/api.md §17.5): optional, and a wrong type is dropped rather than failing the sync.
    let author = optional_text(rec, "author");
    let device_id = optional_text(rec, keys.device_id);
    let tags = optional_tags(rec);

    if problems.found {
        return Ok(None);
    }
    Ok(id.map(|id| IncomingRecord {
        id,
        form_type,
        form_version,
        data,
        deleted,
        created_at,
        updated_at,
        geolocation,
        base_version,
        author,
        device_id,
        tags,
    }))
}

/// The record's id: the first present alias, a non-empty string of at most 255 characters.
fn record_id(rec: &Fields, keys: &RecordKeys, problems: &mut RecordProblems) -> Option<String> {
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
        Field::Text(s) if !s.is_empty() => Some(s.to_string()),
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

fn optional_text(rec: &Fields, key: &str) -> Option<String> {
    match rec.get(key) {
        Some(Field::Text(s)) if !s.contains('\0') => Some(s.to_string()),
        _ => None,
    }
}

/// Tags: an array of strings, or nothing at all when any item is not one.
fn optional_tags(rec: &Fields) -> Option<Vec<String>> {
    rec.parsed("tags").as_ref().and_then(Value::as_array).and_then(|items| {
        items
            .iter()
            .map(|t| t.as_str().filter(|s| !s.contains('\0')).map(str::to_string))
            .collect::<Option<Vec<_>>>()
    })
}

/// Query-string parts of a pull request (the query wins over the body).
#[derive(Debug, Default, Clone)]
pub struct PullQuery {
    pub limit: Option<String>,
    pub page_token: Option<String>,
    pub schema_types: Vec<String>,
}

fn parse_limit_text(raw: &str) -> DecodeResult<i64> {
    raw.trim()
        .parse::<i64>()
        .map_err(|_| DecodeError::bad_request("'limit' must be an integer").with_path("?limit"))
}

fn body_limit(obj: &Map<String, Value>) -> DecodeResult<Option<i64>> {
    match obj.get("limit") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_i64() {
            Some(v) => Ok(Some(v)),
            // Huge integers still mean "as many as allowed".
            None if n.as_u64().is_some() => Ok(Some(i64::MAX)),
            None => Err(DecodeError::bad_request("'limit' must be an integer").with_path("/limit")),
        },
        Some(_) => Err(DecodeError::bad_request("'limit' must be an integer").with_path("/limit")),
    }
}

fn string_array(obj: &Map<String, Value>, key: &str) -> DecodeResult<Vec<String>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => {
            items.iter().map(|v| v.as_str().map(str::to_string)).collect::<Option<Vec<_>>>().ok_or_else(
                || {
                    DecodeError::bad_request(format!("'{key}' must be an array of strings"))
                        .with_path(&format!("/{key}"))
                },
            )
        }
        Some(_) => Err(DecodeError::bad_request(format!("'{key}' must be an array of strings"))
            .with_path(&format!("/{key}"))),
    }
}

fn cursor_value(v: &Value, key: &str) -> DecodeResult<i64> {
    let bad = || {
        DecodeError::bad_request(format!("'{key}' must be a non-negative integer"))
            .with_path(&format!("/{key}"))
    };
    match v {
        Value::Null => Ok(0),
        Value::Number(n) => {
            n.as_i64().filter(|v| *v >= 0).or_else(|| n.as_u64().map(|_| i64::MAX)).ok_or_else(bad)
        }
        _ => Err(bad()),
    }
}

/// Decodes a POST pull body (+ query). A page token wins over an explicit cursor or filter.
pub fn decode_pull(body: &Value, query: &PullQuery) -> DecodeResult<PullRequest> {
    let dialect = Dialect::detect(body);
    let obj = object(body)?;
    let client_key = if dialect == Dialect::Camel { "clientId" } else { "client_id" };
    let client_id = request_id_field(obj, client_key)?;

    let mut after = match dialect {
        Dialect::Synkronus => match obj.get("since") {
            None | Some(Value::Null) => 0,
            Some(Value::Object(since)) => {
                cursor_value(since.get("version").unwrap_or(&Value::Null), "since")?
            }
            Some(v @ Value::Number(_)) => cursor_value(v, "since")?,
            Some(_) => {
                return Err(
                    DecodeError::bad_request("'since' must be an object with a version").with_path("/since")
                )
            }
        },
        Dialect::Spec => cursor_value(obj.get("since_change_id").unwrap_or(&Value::Null), "since_change_id")?,
        Dialect::Camel => cursor_value(obj.get("currentVersion").unwrap_or(&Value::Null), "currentVersion")?,
    };
    let mut types = match dialect {
        Dialect::Camel => string_array(obj, "schemaTypes")?,
        _ => string_array(obj, "schema_types")?,
    };
    types.extend(query.schema_types.iter().cloned());

    let limit = match &query.limit {
        Some(raw) => Some(parse_limit_text(raw)?),
        None => body_limit(obj)?,
    };
    let token = query.page_token.clone().or_else(|| {
        let keys: &[&str] =
            if dialect == Dialect::Camel { &["pageToken", "page_token"] } else { &["page_token"] };
        keys.iter().find_map(|k| obj.get(*k).and_then(Value::as_str).map(str::to_string))
    });
    if let Some(token) = token.filter(|t| !t.is_empty()) {
        let cursor = decode_pull_token(&token)?;
        after = cursor.a;
        types = cursor.t;
    }
    Ok(PullRequest { dialect, client_id, after, types: normalize_types(types), limit: clamp_limit(limit) })
}

/// Decodes `GET /sync/pull?client_id=&since=&schema_types=a,b&limit=&page_token=`.
pub fn decode_pull_query(pairs: &[(String, String)], dialect: Dialect) -> DecodeResult<PullRequest> {
    let get = |k: &str| pairs.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str());
    let client_id = match get("client_id") {
        Some(c) if valid_free_form_id(c) => c.to_string(),
        Some(_) => {
            return Err(
                DecodeError::bad_request("'client_id' must be 1 to 255 characters").with_path("?client_id")
            )
        }
        None => return Err(DecodeError::bad_request("'client_id' is required").with_path("?client_id")),
    };
    let mut after = match get("since").or_else(|| get("since_change_id")) {
        None | Some("") => 0,
        Some(raw) => raw.trim().parse::<i64>().ok().filter(|v| *v >= 0).ok_or_else(|| {
            DecodeError::bad_request("'since' must be a non-negative integer").with_path("?since")
        })?,
    };
    let mut types: Vec<String> = pairs
        .iter()
        .filter(|(k, _)| k == "schema_types" || k == "schemaType")
        .flat_map(|(_, v)| v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string))
        .collect();
    let limit = get("limit").map(parse_limit_text).transpose()?;
    if let Some(token) = get("page_token").filter(|t| !t.is_empty()) {
        let cursor = decode_pull_token(token)?;
        after = cursor.a;
        types = cursor.t;
    }
    Ok(PullRequest { dialect, client_id, after, types: normalize_types(types), limit: clamp_limit(limit) })
}

fn decode_pull_token(token: &str) -> DecodeResult<PullCursor> {
    page_token::decode::<PullCursor>(TokenKind::Pull, token)
        .filter(|c| c.a >= 0)
        .ok_or_else(DecodeError::invalid_page_token)
}

/// A set without duplicates, in a stable order (tokens and SQL see the same list).
fn normalize_types(mut types: Vec<String>) -> Vec<String> {
    types.sort();
    types.dedup();
    types
}

#[cfg(test)]
pub(super) mod tests;
