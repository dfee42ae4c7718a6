//! The decoder against the one it replaced: the same answer, 400 and 422 messages included.

use proptest::prelude::*;

use super::*;
use crate::domain::sync::push_body::Received;
use crate::testing::config;

/// The record decoding of the releases before the tape, kept only as the reference: every record
/// parsed into a `Value` tree, `data` written back from it.
mod former {
    use serde_json::{Map, Value};

    use super::super::*;
    use crate::domain::sync::canonical::tests::{compact_json, storable_json};

    /// Decodes and validates a push body, parsing one record at a time. 400 for request-level
    /// problems; 422 listing every record problem.
    pub(super) fn decode_push_body(body: &PushBody) -> DecodeResult<PushRequest> {
        let dialect = body.dialect();
        let obj =
            body.fields().ok_or_else(|| DecodeError::bad_request("Request body must be a JSON object"))?;
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
        for (index, raw) in list.iter().enumerate() {
            // One record's tree at a time: it is dropped once the record is decoded.
            let item: Value = push_body::parse(raw.get()).map_err(malformed)?;
            match decode_record(&item, index, &keys, &mut problems) {
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

    /// Collects one record's problems under its JSON pointer.
    struct RecordProblems<'a> {
        base: String,
        record_id: Option<String>,
        list: &'a mut Vec<ItemProblem>,
        found: bool,
    }

    impl RecordProblems<'_> {
        fn add(&mut self, key: &str, code: &str, message: String) {
            let mut p = ItemProblem::new(format!("{}/{key}", self.base), code, message);
            p.record_id = self.record_id.clone();
            self.list.push(p);
            self.found = true;
        }
    }

    /// Form type and version: optional strings of at most 255 characters.
    fn short_string(rec: &Map<String, Value>, key: &str, problems: &mut RecordProblems) -> String {
        match rec.get(key) {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) if s.chars().count() > MAX_ID_CHARS => {
                problems.add(key, "TOO_LONG", format!("{key} is longer than 255 characters"));
                String::new()
            }
            Some(Value::String(s)) if s.contains('\0') => {
                problems.add(key, "TYPE_ERROR", format!("{key} must not contain NUL characters"));
                String::new()
            }
            Some(Value::String(s)) => s.clone(),
            Some(_) => {
                problems.add(key, "TYPE_ERROR", format!("{key} must be a string"));
                String::new()
            }
        }
    }

    fn timestamp(
        rec: &Map<String, Value>,
        key: &str,
        problems: &mut RecordProblems,
    ) -> Option<DateTime<Utc>> {
        match rec.get(key) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => {
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

    /// A JSON object field (data, geolocation) that must be storable.
    fn json_object<'a>(
        rec: &'a Map<String, Value>,
        key: &str,
        problems: &mut RecordProblems,
    ) -> Option<&'a Value> {
        match rec.get(key) {
            None | Some(Value::Null) => None,
            Some(v @ Value::Object(_)) => {
                if let Err(why) = storable_json(v) {
                    problems.add(key, "TYPE_ERROR", format!("{key} cannot be stored: {why}"));
                }
                Some(v)
            }
            Some(_) => {
                let what = if key == "data" { "a JSON object" } else { "an object or null" };
                problems.add(key, "TYPE_ERROR", format!("{key} must be {what}"));
                None
            }
        }
    }

    fn decode_record(
        item: &Value,
        index: usize,
        keys: &RecordKeys,
        problem_list: &mut Vec<ItemProblem>,
    ) -> Option<IncomingRecord> {
        let base = format!("{}/{index}", keys.list_path);
        let Some(rec) = item.as_object() else {
            problem_list.push(ItemProblem::new(base, "TYPE_ERROR", "record must be a JSON object"));
            return None;
        };
        let mut problems = RecordProblems { base, record_id: None, list: problem_list, found: false };

        let id = record_id(rec, keys, &mut problems);
        problems.record_id = id.clone();
        let form_type = short_string(rec, keys.form_type, &mut problems);
        let form_version = short_string(rec, keys.form_version, &mut problems);
        let deleted = deleted_flag(rec, &mut problems);
        let data = json_object(rec, "data", &mut problems);
        if data.is_none() && !deleted && rec.get("data").is_none_or(Value::is_null) {
            problems.add("data", "REQUIRED", "data is required unless the record is deleted".into());
        }
        let created_at = timestamp(rec, keys.created_at, &mut problems);
        let updated_at = timestamp(rec, keys.updated_at, &mut problems);
        let geolocation = json_object(rec, "geolocation", &mut problems);
        let base_version = base_version(rec, &mut problems);

        // 2026 fields (docs/api.md §17.5): optional, and a wrong type is dropped rather than failing the sync.
        let author = optional_text(rec, "author");
        let device_id = optional_text(rec, keys.device_id);
        let tags = optional_tags(rec);

        if problems.found {
            return None;
        }
        // Stored and hashed as serde_json wrote the tree: its compact text.
        let data = data.map(|d| compact_json(d).get().to_string());
        let geolocation = geolocation.map(|g| compact_json(g).get().to_string());
        let tags = tags.map(|t| Value::from(t).to_string());
        let mut record = IncomingRecord::new(RecordTexts {
            id: id.as_deref()?,
            form_type: &form_type,
            form_version: &form_version,
            data: data.as_deref(),
            geolocation: geolocation.as_deref(),
            author: author.as_deref(),
            device_id: device_id.as_deref(),
            tags: tags.as_deref(),
        })
        .ok()?;
        record.deleted = deleted;
        record.created_at = created_at;
        record.updated_at = updated_at;
        record.base_version = base_version;
        Some(record)
    }

    /// The record's id: the first present alias, a non-empty string of at most 255 characters.
    fn record_id(
        rec: &Map<String, Value>,
        keys: &RecordKeys,
        problems: &mut RecordProblems,
    ) -> Option<String> {
        let (id_key, id_value) = keys
            .id
            .iter()
            .find_map(|k| rec.get(*k).filter(|v| !v.is_null()).map(|v| (*k, v)))
            .unwrap_or((keys.id[0], &Value::Null));
        match id_value {
            Value::String(s) if !s.is_empty() && s.chars().count() > MAX_ID_CHARS => {
                problems.add(id_key, "TOO_LONG", format!("{id_key} is longer than 255 characters"));
                None
            }
            Value::String(s) if s.contains('\0') => {
                problems.add(id_key, "TYPE_ERROR", format!("{id_key} must not contain NUL characters"));
                None
            }
            Value::String(s) if !s.is_empty() => Some(s.clone()),
            Value::Null | Value::String(_) => {
                problems.add(id_key, "REQUIRED", format!("{id_key} is required"));
                None
            }
            _ => {
                problems.add(id_key, "TYPE_ERROR", format!("{id_key} must be a string"));
                None
            }
        }
    }

    fn deleted_flag(rec: &Map<String, Value>, problems: &mut RecordProblems) -> bool {
        match rec.get("deleted") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                problems.add("deleted", "TYPE_ERROR", "deleted must be a boolean".into());
                false
            }
        }
    }

    /// The version the client's change is based on, when it names one.
    fn base_version(rec: &Map<String, Value>, problems: &mut RecordProblems) -> Option<i64> {
        match rec.get("version") {
            None | Some(Value::Null) => None,
            Some(v) => {
                let parsed = v.as_i64().filter(|n| *n >= 0);
                if parsed.is_none() {
                    problems.add("version", "TYPE_ERROR", "version must be an integer >= 0".into());
                }
                parsed
            }
        }
    }

    fn optional_text(rec: &Map<String, Value>, key: &str) -> Option<String> {
        rec.get(key).and_then(Value::as_str).filter(|s| !s.contains('\0')).map(str::to_string)
    }

    /// Tags: an array of strings, or nothing at all when any item is not one.
    fn optional_tags(rec: &Map<String, Value>) -> Option<Vec<String>> {
        rec.get("tags").and_then(Value::as_array).and_then(|items| {
            items
                .iter()
                .map(|t| t.as_str().filter(|s| !s.contains('\0')).map(str::to_string))
                .collect::<Option<Vec<_>>>()
        })
    }
}

/// Record texts with the freedom clients have: any of the fields decoding reads, in any order,
/// repeated, mistyped, escaped, with NUL and broken surrogates.
fn key() -> impl Strategy<Value = &'static str> {
    proptest::sample::select(vec![
        "\"observation_id\"",
        "\"id\"",
        "\"observationId\"",
        "\"form_type\"",
        "\"schema_type\"",
        "\"formType\"",
        "\"form_version\"",
        "\"schema_version\"",
        "\"data\"",
        "\"d\\u0061ta\"",
        "\"geolocation\"",
        "\"deleted\"",
        "\"version\"",
        "\"created_at\"",
        "\"updated_at\"",
        "\"createdAt\"",
        "\"tags\"",
        "\"author\"",
        "\"device_id\"",
        "\"deviceId\"",
        "\"synced_at\"",
        "\"x\"",
    ])
}

fn value() -> BoxedStrategy<String> {
    let strings = proptest::sample::select(vec![
        r#""o-1""#,
        r#""""#,
        r#""a\u0000b""#,
        r#""\ud800""#,
        r#""tab\there""#,
        r#""\u00e9t\u00E9""#,
        r#""2025-06-25T12:00:00Z""#,
        r#""2025-06-25T12:00:00.120+02:00""#,
        r#""2025-06-25""#,
    ]);
    let others = proptest::sample::select(vec![
        "null",
        "true",
        "false",
        "0",
        "-1",
        "3",
        "1e2",
        "1.5",
        "99999999999999999999",
        "[]",
        r#"["a","b"]"#,
        r#"["a",1]"#,
        r#"["a\u0000"]"#,
        "{}",
        r#"{"b":1,"a":[1,{"y":null,"x":"\n"}],"b":2.50E+3}"#,
        r#"{ "k\u0000" : 1 }"#,
        r#"{"k":"v\u0000"}"#,
        r#"{"a":"\ud83d\ude00","a":"\udc00"}"#,
        r#"{"lat": -1.25, "lon": 36.8E1, "acc": null}"#,
    ]);
    let leaf = prop_oneof![
        4 => strings.prop_map(str::to_string),
        4 => others.prop_map(str::to_string),
        1 => "[a-z0-9\\-]{0,8}".prop_map(|s| format!("\"{s}\"")),
        1 => Just(format!("\"{}\"", "x".repeat(300))),
    ];
    leaf.prop_recursive(2, 12, 4, |inner| {
        proptest::collection::vec(
            (proptest::sample::select(vec![r#""a""#, r#""b""#, r#""\u0061""#]), inner),
            0..4,
        )
        .prop_map(|entries| {
            let entries: Vec<String> = entries.into_iter().map(|(k, v)| format!("{k}:{v}")).collect();
            format!("{{{}}}", entries.join(" , "))
        })
    })
    .boxed()
}

/// Mostly valid records of every dialect, with fields added after (the last of a key counts).
fn record() -> impl Strategy<Value = String> {
    const VALID: &str =
        r#""observation_id":"o-1","id":"o-1","observationId":"o-1","data":{"b":[1.0,"\"x\""],"a":null}"#;
    prop_oneof![
        8 => (any::<bool>(), proptest::collection::vec((key(), value()), 0..4)).prop_map(|(valid, entries)| {
            let mut entries: Vec<String> = entries.into_iter().map(|(k, v)| format!("{k}: {v}")).collect();
            if valid {
                entries.insert(0, VALID.to_string());
            }
            format!("{{{}}}", entries.join(","))
        }),
        1 => value(),
    ]
}

fn body(dialect: usize, records: &[String]) -> String {
    let records = records.join(", ");
    match dialect {
        0 => format!(r#"{{"client_id":"c","transmission_id":"t","records":[{records}]}}"#),
        1 => {
            format!(r#"{{"client_id":"c","since_change_id":0,"transmission_id":"t","records":[{records}]}}"#)
        }
        _ => format!(r#"{{"clientId":"c","changes":{{"observations":[{records}]}}}}"#),
    }
}

fn decoded(text: &str) -> Result<(String, String), TestCaseError> {
    let body = Received::parse(text.as_bytes()).and_then(Received::split);
    let body = body.map_err(|e| TestCaseError::fail(format!("{text}: {e}")))?;
    Ok((format!("{:?}", decode_push_body(&body)), format!("{:?}", former::decode_push_body(&body))))
}

proptest! {
    #![proptest_config(config(8192))]

    /// The whole push, then each record alone (so one bad record does not hide the others).
    #[test]
    fn decoding_answers_as_the_value_tree_did(dialect in 0..3usize, records in proptest::collection::vec(record(), 0..4)) {
        let text = body(dialect, &records);
        let (now, then) = decoded(&text)?;
        prop_assert_eq!(now, then, "{}", text);
        for record in &records {
            let text = body(dialect, std::slice::from_ref(record));
            let (now, then) = decoded(&text)?;
            prop_assert_eq!(now, then, "{}", text);
        }
    }
}
