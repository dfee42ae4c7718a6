//! The sync model (API.md 8): one internal record model, three wire dialects.

pub mod decode;
pub mod encode;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The three wire shapes of push and pull (API.md 1.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Synkronus,
    Spec,
    Camel,
}

impl Dialect {
    /// Detection from a push or pull body, first match wins (API.md 8.1).
    pub fn detect(body: &Value) -> Dialect {
        let Some(obj) = body.as_object() else {
            return Dialect::Synkronus;
        };
        if obj.contains_key("since_change_id") {
            return Dialect::Spec;
        }
        let first_is_spec = obj
            .get("records")
            .and_then(Value::as_array)
            .and_then(|r| r.first())
            .and_then(Value::as_object)
            .is_some_and(|r| r.contains_key("id") && r.contains_key("schema_type"));
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

/// A record as pushed, after decoding and validation. Serialised (keys sorted) it is also the
/// canonical form the idempotency fingerprint is computed from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IncomingRecord {
    pub id: String,
    pub form_type: String,
    pub form_version: String,
    /// `None` only on deletions that send no data: the previous data is kept.
    pub data: Option<Value>,
    pub deleted: bool,
    pub created_at: Option<DateTime<Utc>>,
    pub updated_at: Option<DateTime<Utc>>,
    pub geolocation: Option<Value>,
    pub base_version: Option<i64>,
    pub author: Option<String>,
    pub device_id: Option<String>,
    pub tags: Option<Vec<String>>,
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
    /// key order or spacing is the same payload (API.md 8.6).
    pub fn fingerprint(&self) -> Vec<u8> {
        let canonical = serde_json::to_value(&self.records).map(|v| v.to_string()).unwrap_or_default();
        Sha256::digest(canonical.as_bytes()).to_vec()
    }
}

/// A non-blocking remark about one record (API.md 8.4).
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
    /// The repository generation the push was committed in (API.md 17.2).
    #[serde(default = "first_generation")]
    pub repository_generation: i64,
    /// (record id, change_id) in request order.
    pub items: Vec<(String, i64)>,
    pub warnings: Vec<Warning>,
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

/// A pull page, before encoding.
#[derive(Debug, Clone)]
pub struct PullPage {
    pub records: Vec<StoredRecord>,
    /// S: the snapshot head.
    pub head: i64,
    pub repository_generation: i64,
    pub has_more: bool,
    pub types: Vec<String>,
}

impl PullPage {
    /// The page's last change_id, or S when the page is empty (API.md 8.2 rule 4).
    pub fn change_cutoff(&self) -> i64 {
        self.records.last().map(|r| r.change_id).unwrap_or(self.head)
    }

    /// Where the next pull resumes: the cutoff while more remain, else S (rule 6).
    pub fn resume_after(&self) -> i64 {
        if self.has_more {
            self.change_cutoff()
        } else {
            self.head
        }
    }
}

/// Page size rules shared by every listing (API.md 1.5).
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
