//! Wire types: the request and response bodies of the API as Rust types. Serde reads and writes
//! them; utoipa generates the OpenAPI document's schemas from the same definitions
//! (`http::openapi`), so the document cannot drift from what the handlers send.
//!
//! Responses keep the byte layout earlier releases sent: their fields are declared in the
//! alphabetical order a `serde_json` object map writes (tests in each module check it).
//! Requests decode leniently: a field of the wrong type becomes `Text::NotString` instead of failing
//! the whole body, so each handler checks its fields in its own order and its 400 names the field
//! (docs/api.md §4). Where dialects spell a field two ways, each spelling is its own field and an
//! accessor states which one wins: serde's `alias` would refuse a body that carries both.

pub mod admin;
pub mod attachments;
pub mod auth;
pub mod bundles;
pub mod export;
pub mod formspecs;
pub mod info;
pub mod observations;
pub mod scopes;
pub mod users;

use serde::de::{Deserialize, DeserializeOwned, Deserializer};
use serde::Serialize;
use serde_json::Value;
use utoipa::openapi::{ObjectBuilder, RefOr, Schema, SchemaFormat, SchemaType};
use utoipa::ToSchema;

use crate::error::{ApiError, ApiResult};

/// A string field of a request body as the client sent it.
#[derive(Debug, Default, Clone, PartialEq)]
pub enum Text {
    #[default]
    Absent,
    Null,
    Given(String),
    NotString,
}

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(match Value::deserialize(deserializer)? {
            Value::Null => Text::Null,
            Value::String(s) => Text::Given(s),
            _ => Text::NotString,
        })
    }
}

fn named(message: String, key: &str) -> ApiError {
    ApiError::bad_request(message).with_path(&format!("/{key}"))
}

impl Text {
    /// The string if one was sent (null counts as not sent); another type is a 400 naming `key`.
    pub fn optional(&self, key: &str) -> ApiResult<Option<&str>> {
        first_of(&[(self, key)])
    }

    /// A non-empty string, or a 400 naming `key`.
    pub fn required(&self, key: &str) -> ApiResult<&str> {
        required_of(&[(self, key)])
    }

    pub fn is_present(&self) -> bool {
        *self != Text::Absent
    }
}

/// The first spelling the client sent, in the order given; a spelling of the wrong type is a 400
/// naming it.
pub fn first_of<'a>(spellings: &[(&'a Text, &str)]) -> ApiResult<Option<&'a str>> {
    for (value, key) in spellings {
        match value {
            Text::Absent | Text::Null => continue,
            Text::Given(s) => return Ok(Some(s.as_str())),
            Text::NotString => return Err(named(format!("'{key}' must be a string"), key)),
        }
    }
    Ok(None)
}

/// Like `first_of`, but a missing or empty value is a 400 naming the first spelling.
pub fn required_of<'a>(spellings: &[(&'a Text, &str)]) -> ApiResult<&'a str> {
    match first_of(spellings)? {
        Some(s) if !s.is_empty() => Ok(s),
        _ => {
            let key = spellings.first().map(|(_, key)| *key).unwrap_or("field");
            Err(named(format!("'{key}' is required"), key))
        }
    }
}

/// For `#[serde(default, deserialize_with = "present")]` on an `Option<Value>`: a key sent as
/// `null` is `Some(Value::Null)`, told apart from a key not sent (`None`).
pub fn present<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(deserializer).map(Some)
}

/// Decodes a JSON object body (already parsed by `JsonBody`) into its wire type.
pub fn object<T: DeserializeOwned>(body: &Value) -> ApiResult<T> {
    if !body.is_object() {
        return Err(ApiError::bad_request("Request body must be a JSON object"));
    }
    T::deserialize(body).map_err(|e| ApiError::bad_request(format!("Malformed request body: {e}")))
}

/// `{"message": ...}`, the answer of operations that only confirm.
#[derive(Serialize, ToSchema)]
pub struct Message {
    pub message: &'static str,
}

/// Bytes of a file (a ZIP, an attachment, an export), in a body or a multipart part.
pub struct Binary;

impl<'s> ToSchema<'s> for Binary {
    fn schema() -> (&'s str, RefOr<Schema>) {
        let binary = ObjectBuilder::new()
            .schema_type(SchemaType::String)
            .format(Some(SchemaFormat::KnownFormat(utoipa::openapi::KnownFormat::Binary)));
        ("Binary", binary.into())
    }
}

/// The error body every failure carries (docs/api.md §4), built by `error::ApiError`: RFC 7807
/// problem details plus the flat keys real clients read. Some errors add keys of their own
/// (`retry_after`, `current_repository_generation`, ...).
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct Problem {
    #[schema(rename = "type")]
    kind: String,
    title: String,
    status: u16,
    detail: String,
    code: String,
    error: String,
    message: String,
    request_id: String,
    errors: Option<Vec<ItemProblem>>,
    retry_after: Option<u64>,
}

/// One problem with one item of a request, inside `Problem.errors`.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct ItemProblem {
    #[schema(rename = "recordId")]
    record_id: Option<String>,
    path: String,
    code: String,
    message: String,
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde::Serialize;

    /// The struct writes its keys in the order a `serde_json` map would: the layout clients saw
    /// when these bodies were built as maps.
    pub fn assert_map_order<T: Serialize>(value: &T) {
        let direct = serde_json::to_string(value).expect("serialises");
        let through_map = serde_json::to_value(value).expect("to value").to_string();
        assert_eq!(direct, through_map, "fields out of alphabetical order");
    }

    #[derive(serde::Deserialize, Default)]
    #[serde(default)]
    struct Sample {
        a: Text,
        #[serde(rename = "aCamel")]
        a_camel: Text,
    }

    #[test]
    fn text_fields_keep_what_was_sent() {
        let s: Sample = object(&serde_json::json!({"a": 5, "aCamel": "x"})).expect("decodes");
        assert_eq!(s.a, Text::NotString);
        assert_eq!(first_of(&[(&s.a_camel, "aCamel"), (&s.a, "a")]).expect("string"), Some("x"));
        let err = first_of(&[(&s.a, "a"), (&s.a_camel, "aCamel")]).expect_err("wrong type");
        assert_eq!(err.message, "'a' must be a string");
        assert_eq!(err.errors()[0].path, "/a");

        let s: Sample = object(&serde_json::json!({"a": null, "aCamel": ""})).expect("decodes");
        assert_eq!(s.a, Text::Null);
        assert!(s.a.is_present() && !Sample::default().a.is_present());
        let err = required_of(&[(&s.a, "a"), (&s.a_camel, "aCamel")]).expect_err("empty");
        assert_eq!(err.message, "'a' is required");
        assert!(object::<Sample>(&serde_json::json!(["x", "y"])).is_err());
        assert!(object::<Sample>(&Value::Null).is_err());
    }
}
