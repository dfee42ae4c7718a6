//! The sync model (docs/api.md §8): one internal record model, three wire dialects.

pub mod canonical;
pub mod decode;
pub mod encode;
pub mod page;
pub mod plan;
pub mod push_body;
pub mod record;

#[cfg(test)]
mod fuzz;

use std::fmt::Write as _;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::domain::json_text;

pub use self::record::{IncomingRecord, RecordTexts};

/// The three wire shapes of push and pull (docs/api.md §1.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Synkronus,
    Spec,
    Camel,
}

impl Dialect {
    /// Detection from a push or pull body, first match wins (docs/api.md §8.1).
    pub fn detect(body: &Value) -> Dialect {
        let Some(obj) = body.as_object() else {
            return Dialect::Synkronus;
        };
        let first_is_spec = obj
            .get("records")
            .and_then(Value::as_array)
            .and_then(|r| r.first())
            .and_then(Value::as_object)
            .is_some_and(|r| r.contains_key("id") && r.contains_key("schema_type"));
        Self::detect_parts(obj, first_is_spec)
    }

    /// Detection from a body's top-level fields and whether the first element of its `records`
    /// array is an object with both `id` and `schema_type`.
    pub fn detect_parts(obj: &Map<String, Value>, first_is_spec: bool) -> Dialect {
        if obj.contains_key("since_change_id") {
            return Dialect::Spec;
        }
        if first_is_spec {
            return Dialect::Spec;
        }
        if obj.contains_key("clientId") {
            return Dialect::Camel;
        }
        Dialect::Synkronus
    }

    /// The value of `x-api-version-used` for responses in this dialect.
    pub fn api_version_used(self) -> &'static str {
        match self {
            Dialect::Synkronus => "1.0.0",
            Dialect::Spec | Dialect::Camel => "1.1.0",
        }
    }
}

/// A decoded push request.
#[derive(Debug, Clone)]
pub struct PushRequest {
    pub dialect: Dialect,
    pub client_id: String,
    /// Optional only in the camel dialect; without it the push is not deduplicated.
    pub transmission_id: Option<String>,
    pub records: Vec<IncomingRecord>,
    /// Warnings found while decoding (MISSING_FORM_TYPE), by record index.
    pub warnings: Vec<(usize, Warning)>,
}

impl PushRequest {
    /// SHA-256 of the canonical JSON of the decoded records: the same content in another dialect,
    /// key order or spacing is the same payload (docs/api.md §8.6).
    pub fn fingerprint(&self) -> Vec<u8> {
        // The JSON array of the canonical records, each written to a buffer and hashed in one
        // piece.
        let mut hasher = Sha256::new();
        let mut record = String::new();
        hasher.update(b"[");
        for (i, r) in self.records.iter().enumerate() {
            if i > 0 {
                hasher.update(b",");
            }
            record.clear();
            write_canonical_record(&mut record, r);
            hasher.update(record.as_bytes());
        }
        hasher.update(b"]");
        hasher.finalize().to_vec()
    }
}

/// The canonical JSON of a record: its fields in alphabetical order, byte for byte as the first
/// releases hashed them through serde_json's sorted map (so stored fingerprints stay valid),
/// written by hand: serde's calls and chrono's formatter cost more than the hashing.
fn write_canonical_record(out: &mut String, r: &IncomingRecord) {
    fn text(out: &mut String, value: Option<&str>) {
        match value {
            Some(s) => json_text::write_string(out, s),
            None => out.push_str("null"),
        }
    }
    fn time(out: &mut String, value: Option<DateTime<Utc>>) {
        match value {
            Some(t) => {
                out.push('"');
                crate::domain::time::write_serde_form(out, t);
                out.push('"');
            }
            None => out.push_str("null"),
        }
    }
    /// Canonical JSON text as it is.
    fn json(out: &mut String, value: Option<&str>) {
        out.push_str(value.unwrap_or("null"));
    }
    out.push_str("{\"author\":");
    text(out, r.author());
    out.push_str(",\"base_version\":");
    match r.base_version {
        // Writing into a String cannot fail.
        Some(v) => {
            let _ = write!(out, "{v}");
        }
        None => out.push_str("null"),
    }
    out.push_str(",\"created_at\":");
    time(out, r.created_at);
    out.push_str(",\"data\":");
    json(out, r.data());
    out.push_str(if r.deleted { ",\"deleted\":true" } else { ",\"deleted\":false" });
    out.push_str(",\"device_id\":");
    text(out, r.device_id());
    out.push_str(",\"form_type\":");
    json_text::write_string(out, r.form_type());
    out.push_str(",\"form_version\":");
    json_text::write_string(out, r.form_version());
    out.push_str(",\"geolocation\":");
    json(out, r.geolocation());
    out.push_str(",\"id\":");
    json_text::write_string(out, r.id());
    out.push_str(",\"tags\":");
    json(out, r.tags());
    out.push_str(",\"updated_at\":");
    time(out, r.updated_at);
    out.push('}');
}

/// A non-blocking remark about one record (docs/api.md §8.4).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Warning {
    pub id: String,
    pub code: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_version: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_version: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub errors: Option<Value>,
}

impl Warning {
    /// A refused record, told as a warning where the dialect has no per-record failures.
    pub fn from_refused(refused: &Refused) -> Self {
        Warning {
            id: refused.id.clone(),
            code: refused.code.clone(),
            message: refused.message.clone(),
            base_version: None,
            server_version: None,
            errors: None,
        }
    }

    pub fn missing_form_type(id: &str, form_type_key: &str) -> Self {
        Warning {
            id: id.to_string(),
            code: "MISSING_FORM_TYPE".into(),
            message: format!("{form_type_key} is empty but record was processed"),
            base_version: None,
            server_version: None,
            errors: None,
        }
    }

    pub fn conflict_overwritten(id: &str, base: i64, server: i64) -> Self {
        Warning {
            id: id.to_string(),
            code: "CONFLICT_OVERWRITTEN".into(),
            message: format!("record changed on the server since version {base}; this push overwrote it"),
            base_version: Some(base),
            server_version: Some(server),
            errors: None,
        }
    }

    pub fn schema_mismatch(id: &str, errors: Value) -> Self {
        Warning {
            id: id.to_string(),
            code: "SCHEMA_MISMATCH".into(),
            message: "data does not match the form's JSON Schema".into(),
            base_version: None,
            server_version: None,
            errors: Some(errors),
        }
    }
}

/// The result of a committed push, stored for idempotent replay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PushResult {
    /// The highest committed change_id right after the commit that contained the push.
    pub head: i64,
    /// The repository generation the push was committed in (docs/api.md §17.2).
    #[serde(default = "first_generation")]
    pub repository_generation: i64,
    /// (record id, change_id) in request order.
    pub items: Vec<(String, i64)>,
    pub warnings: Vec<Warning>,
    /// Records refused one by one while the rest landed (docs/api.md §20.4: `OUT_OF_SCOPE`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<Refused>,
}

/// A record of a push that was not stored while the others were.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Refused {
    /// Its position in the push's record list.
    pub index: usize,
    pub id: String,
    pub code: String,
    pub message: String,
}

impl Refused {
    pub fn out_of_scope(index: usize, id: &str) -> Self {
        Refused {
            index,
            id: id.to_owned(),
            code: "OUT_OF_SCOPE".into(),
            message: "this record is outside the records you may change; it was not stored".into(),
        }
    }
}

fn first_generation() -> i64 {
    1
}

/// A decoded pull request.
#[derive(Debug, Clone)]
pub struct PullRequest {
    pub dialect: Dialect,
    pub client_id: String,
    pub after: i64,
    pub types: Vec<String>,
    pub limit: i64,
}

/// One record as stored (the current state, or one revision of it). The JSON columns stay raw
/// text: pulls copy them into responses without parsing, the hot path's biggest saving.
#[derive(Debug, Clone)]
pub struct StoredRecord {
    pub id: String,
    pub form_type: String,
    pub form_version: String,
    pub data: Box<RawValue>,
    pub deleted: bool,
    pub created_at: Option<DateTime<Utc>>,
    pub updated_at: Option<DateTime<Utc>>,
    pub synced_at: DateTime<Utc>,
    pub geolocation: Option<Box<RawValue>>,
    pub author: Option<String>,
    pub device_id: Option<String>,
    pub tags: Option<Box<RawValue>>,
    pub change_id: i64,
}

/// Page size rules shared by every listing (docs/api.md §1.5).
pub const DEFAULT_LIMIT: i64 = 50;
pub const MAX_LIMIT: i64 = 500;

pub fn clamp_limit(requested: Option<i64>) -> i64 {
    match requested {
        None => DEFAULT_LIMIT,
        Some(n) if n <= 0 => DEFAULT_LIMIT,
        Some(n) => n.min(MAX_LIMIT),
    }
}

/// Cursor state carried by pull page tokens.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PullCursor {
    pub a: i64,
    pub t: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::decode::decode_push;
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// The fingerprint as the first releases computed it: the records through a sorted map.
    fn fingerprint_through_sorted_map(push: &PushRequest) -> Vec<u8> {
        let canonical = serde_json::to_value(&push.records).expect("records serialise").to_string();
        Sha256::digest(canonical.as_bytes()).to_vec()
    }

    #[test]
    fn fingerprints_match_the_sorted_map_form_stored_by_earlier_releases() {
        let mut bodies: Vec<Value> =
            ["test_observations.json", "test_update_observations.json", "test_delete_observations.json"]
                .iter()
                .map(|name| {
                    let path = format!("{}/tests/fixtures/upstream/{name}", env!("CARGO_MANIFEST_DIR"));
                    serde_json::from_str(&std::fs::read_to_string(path).expect("fixture"))
                        .expect("fixture JSON")
                })
                .collect();
        bodies.push(json!({
            "client_id": "c", "transmission_id": "t",
            "records": [
                {"observation_id": "a", "form_type": "f", "form_version": "1", "created_at": "2025-01-01T00:00:00+02:00",
                 "data": {"z": 1e300, "big": 123456789012345678901234567890_u128, "é": "\u{1F600}\n\"", "a": [null, {"y": 1, "x": 2}]},
                 "geolocation": {"lon": 2.5, "lat": -1}, "author": "me", "tags": ["x", "y"], "version": 3},
                {"observation_id": "b", "deleted": true},
            ]
        }));
        for body in bodies {
            let push = decode_push(&body).expect("valid push");
            assert_eq!(push.fingerprint(), fingerprint_through_sorted_map(&push), "{body}");
        }
    }

    fn arb_text() -> impl Strategy<Value = String> {
        prop_oneof![any::<String>(), "[a-z0-9\\-]{0,12}", "[\\x00-\\x1f\"\\\\/]{0,6}"]
    }

    fn arb_time() -> impl Strategy<Value = Option<DateTime<Utc>>> {
        proptest::option::of((-70_000_000_000i64..260_000_000_000, 0u32..2_000_000_000).prop_filter_map(
            "a valid time",
            |(secs, nanos)| {
                chrono::TimeZone::timestamp_opt(&Utc, secs, nanos % 1_000_000_000 / 1000 * 1000).single()
            },
        ))
    }

    /// Canonical JSON text, as decoding writes it.
    fn arb_json() -> impl Strategy<Value = Option<String>> {
        proptest::option::of(crate::testing::json_value().prop_map(|v| v.to_string()))
    }

    fn arb_record() -> impl Strategy<Value = IncomingRecord> {
        (
            (arb_text(), arb_text(), arb_text(), arb_json(), any::<bool>(), arb_time()),
            (arb_time(), arb_json(), proptest::option::of(any::<i64>())),
            (proptest::option::of(arb_text()), proptest::option::of(arb_text())),
            proptest::option::of(proptest::collection::vec(arb_text(), 0..4)),
        )
            .prop_map(
                |(
                    (id, form_type, form_version, data, deleted, created_at),
                    (updated_at, geolocation, base_version),
                    (author, device_id),
                    tags,
                )| {
                    let tags = tags.map(|t| Value::from(t).to_string());
                    let mut record = IncomingRecord::new(RecordTexts {
                        id: &id,
                        form_type: &form_type,
                        form_version: &form_version,
                        data: data.as_deref(),
                        geolocation: geolocation.as_deref(),
                        author: author.as_deref(),
                        device_id: device_id.as_deref(),
                        tags: tags.as_deref(),
                    })
                    .unwrap();
                    record.deleted = deleted;
                    record.created_at = created_at;
                    record.updated_at = updated_at;
                    record.base_version = base_version;
                    record
                },
            )
    }

    proptest! {
        #![proptest_config(crate::testing::config(512))]

        /// The hand-written canonical record is serde_json's sorted-map form, byte for byte.
        #[test]
        fn canonical_records_are_written_as_serde_json_writes_them(r in arb_record()) {
            let mut out = String::new();
            write_canonical_record(&mut out, &r);
            let sorted_map = serde_json::to_value(&r).map(|v| v.to_string()).unwrap_or_default();
            prop_assert_eq!(out, sorted_map);
        }
    }
}
