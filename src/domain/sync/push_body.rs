//! A push body as received: the few top-level fields decoding reads, parsed, and the record list
//! left as each record's JSON text, borrowed from the body. Decoding parses one record at a time
//! and keeps only its decoded form, so a push of n records never holds n parsed trees at once
//! (docs/api.md §18.4: the tree of a 23 MB push of 300,000 small records weighed some 27 times
//! the body).

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::Dialect;

/// The top-level fields decoding and the handler read; any other field is never parsed.
const READ_FIELDS: &[&str] = &[
    "client_id",
    "transmission_id",
    "clientId",
    "transmissionId",
    "since_change_id",
    "repository_generation",
];

/// A push body whose records are still JSON text.
#[derive(Debug, Default)]
pub struct PushBody<'a> {
    /// `None` when the body is not a JSON object.
    fields: Option<Map<String, Value>>,
    /// `records`, when it is an array (the synkronus and spec shapes).
    records: Option<Vec<&'a RawValue>>,
    /// `changes.observations`, when it is an array (the camel shape).
    observations: Option<Vec<&'a RawValue>>,
}

impl<'a> PushBody<'a> {
    /// Splits a whole body, already checked to be JSON by the parser that produced `raw` (its
    /// nesting bounded, so parsing its parts again cannot recurse deeper).
    pub fn from_raw(raw: &'a RawValue) -> serde_json::Result<Self> {
        let text = raw.get().trim_start();
        if !text.starts_with('{') {
            return Ok(PushBody::default());
        }
        let top: BTreeMap<String, &'a RawValue> = parse(text)?;
        let mut fields = Map::new();
        for key in READ_FIELDS {
            if let Some(value) = top.get(*key) {
                fields.insert((*key).to_string(), parse(value.get())?);
            }
        }
        let observations = top
            .get("changes")
            .and_then(|changes| parse::<BTreeMap<String, &'a RawValue>>(changes.get()).ok())
            .and_then(|changes| changes.get("observations").and_then(array));
        Ok(PushBody { fields: Some(fields), records: top.get("records").and_then(array), observations })
    }

    /// The top-level fields decoding reads, or `None` when the body is not an object.
    pub fn fields(&self) -> Option<&Map<String, Value>> {
        self.fields.as_ref()
    }

    /// One top-level field decoding reads (`repository_generation`, the ids).
    pub fn field(&self, key: &str) -> Option<&Value> {
        self.fields.as_ref().and_then(|f| f.get(key))
    }

    /// The dialect, detected as [`Dialect::detect`] would on the parsed body.
    pub fn dialect(&self) -> Dialect {
        let Some(fields) = &self.fields else {
            return Dialect::Synkronus;
        };
        let first =
            self.records.as_ref().and_then(|r| r.first()).and_then(|raw| parse::<Value>(raw.get()).ok());
        Dialect::detect_parts(fields, first.as_ref())
    }

    /// The record list of `dialect`'s shape, as JSON text, when it is an array.
    pub fn records(&self, dialect: Dialect) -> Option<&[&'a RawValue]> {
        match dialect {
            Dialect::Camel => self.observations.as_deref(),
            _ => self.records.as_deref(),
        }
    }
}

fn array<'a>(list: &&'a RawValue) -> Option<Vec<&'a RawValue>> {
    parse(list.get()).ok()
}

/// Parses a part of a body whose nesting its first parser bounded: serde_json's own limit would
/// stop one level short of the one docs/api.md §1.3 accepts.
pub fn parse<'a, T: Deserialize<'a>>(text: &'a str) -> serde_json::Result<T> {
    let mut de = serde_json::Deserializer::from_str(text);
    de.disable_recursion_limit();
    let value = T::deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(value: &Value) -> String {
        value.to_string()
    }

    #[test]
    fn only_the_read_fields_and_record_lists_are_kept() {
        let text = body(
            &json!({"client_id": "c", "other": [1, 2], "records": [{"a": 1}, 2], "repository_generation": 3}),
        );
        let raw: &RawValue = serde_json::from_str(&text).unwrap();
        let push = PushBody::from_raw(raw).unwrap();
        assert_eq!(push.fields().unwrap().len(), 2);
        assert_eq!(push.field("repository_generation"), Some(&json!(3)));
        let records = push.records(Dialect::Synkronus).unwrap();
        assert_eq!(records.iter().map(|r| r.get()).collect::<Vec<_>>(), [r#"{"a":1}"#, "2"]);
        assert!(push.records(Dialect::Camel).is_none());
    }

    #[test]
    fn detection_matches_the_parsed_body() {
        for value in [
            json!({"client_id": "c", "records": [{"id": "x", "schema_type": null}]}),
            json!({"client_id": "c", "since_change_id": null, "records": []}),
            json!({"clientId": "c", "changes": {"observations": [{}]}}),
            json!({"client_id": "c", "records": [{"id": "x"}]}),
            json!({"records": "not a list"}),
            json!([{"client_id": "c"}]),
            json!(null),
        ] {
            let text = body(&value);
            let raw: &RawValue = serde_json::from_str(&text).unwrap();
            let push = PushBody::from_raw(raw).unwrap();
            assert_eq!(push.dialect(), Dialect::detect(&value), "{value}");
            assert_eq!(push.fields().is_some(), value.is_object());
        }
    }

    #[test]
    fn duplicated_keys_keep_the_last_as_a_parsed_body_does() {
        let raw: &RawValue =
            serde_json::from_str(r#"{"client_id":"a","client_id":"b","records":[1],"records":[]}"#).unwrap();
        let push = PushBody::from_raw(raw).unwrap();
        assert_eq!(push.field("client_id"), Some(&json!("b")));
        assert_eq!(push.records(Dialect::Synkronus).unwrap().len(), 0);
    }
}
