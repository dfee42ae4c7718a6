//! A push body as received: the few top-level fields decoding reads, parsed, and the record list
//! left as each record's JSON text, borrowed from the body. Decoding parses one record at a time
//! and keeps only its decoded form, so a push of n records never holds n parsed trees at once
//! (docs/api.md §18.4: the tree of a 23 MB push of 300,000 small records weighed some 27 times
//! the body).
//!
//! The body is split in the same pass that checks it is JSON ([`Received::parse`]). Where that
//! pass refuses a body, the former steps (check it all, then split it after the caller's role
//! check) decide, so a body gets the answer and error message it always got.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer as _, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::canonical::{Kind, Tape};
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

/// A body known to be JSON, split or still whole.
#[derive(Debug)]
pub enum Received<'a> {
    Split(PushBody<'a>),
    /// A body the one pass refused although it is JSON (a part decoding reads does not decode,
    /// say a lone surrogate escape in a field). [`Received::split`] splits it as before.
    Whole(&'a RawValue),
}

impl<'a> Received<'a> {
    /// Checks that `bytes` is one JSON value, whose nesting the caller has bounded, and splits it
    /// when it can: one pass over the body instead of a check and a split that parse it again.
    pub fn parse(bytes: &'a [u8]) -> serde_json::Result<Self> {
        if let Some(body) = std::str::from_utf8(bytes).ok().and_then(|text| PushBody::read(text).ok()) {
            return Ok(Received::Split(body));
        }
        let mut de = serde_json::Deserializer::from_slice(bytes);
        de.disable_recursion_limit();
        let raw = <&RawValue>::deserialize(&mut de)?;
        de.end()?;
        Ok(Received::Whole(raw))
    }

    /// The body's parts, or why they cannot be read.
    pub fn split(self) -> serde_json::Result<PushBody<'a>> {
        match self {
            Received::Split(body) => Ok(body),
            Received::Whole(raw) => PushBody::from_raw(raw),
        }
    }
}

impl<'a> PushBody<'a> {
    /// Splits `text` in one pass. Every refusal of the former steps is a refusal here too (this
    /// pass is stricter: it decodes every occurrence of a field and every key), and what it
    /// accepts it splits as they did: for a repeated key the last value counts.
    fn read(text: &'a str) -> serde_json::Result<Self> {
        let mut de = serde_json::Deserializer::from_str(text);
        de.disable_recursion_limit();
        let body = if text.trim_start_matches([' ', '\t', '\n', '\r']).starts_with('{') {
            de.deserialize_map(BodyVisitor)?
        } else {
            IgnoredAny::deserialize(&mut de)?;
            PushBody::default()
        };
        de.end()?;
        Ok(body)
    }

    /// Splits a whole body, already checked to be JSON by the parser that produced `raw` (its
    /// nesting bounded, so parsing its parts again cannot recurse deeper).
    fn from_raw(raw: &'a RawValue) -> serde_json::Result<Self> {
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
        let first_is_spec = self.records.as_ref().and_then(|r| r.first()).is_some_and(|raw| {
            // A first record that does not parse counts as no record at all, as it always did.
            let mut tape = Tape::default();
            tape.read(raw.get()).is_ok_and(|doc| {
                let root = doc.root();
                let has = |name: &str| doc.entries(root).any(|(key, _)| key == name);
                doc.kind(root) == Kind::Object && has("id") && has("schema_type")
            })
        });
        Dialect::detect_parts(fields, first_is_spec)
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

/// The top-level keys the split tells apart.
enum BodyKey {
    Read(&'static str),
    Records,
    Changes,
    Other,
}

impl<'de> Deserialize<'de> for BodyKey {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = BodyKey;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E: de::Error>(self, key: &str) -> Result<BodyKey, E> {
                Ok(match key {
                    "records" => BodyKey::Records,
                    "changes" => BodyKey::Changes,
                    _ => READ_FIELDS.iter().find(|f| **f == key).map_or(BodyKey::Other, |f| BodyKey::Read(f)),
                })
            }
        }
        d.deserialize_identifier(KeyVisitor)
    }
}

struct BodyVisitor;

impl<'de> Visitor<'de> for BodyVisitor {
    type Value = PushBody<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<PushBody<'de>, A::Error> {
        let (mut fields, mut records, mut observations) = (Map::new(), None, None);
        while let Some(key) = map.next_key::<BodyKey>()? {
            match key {
                BodyKey::Read(name) => {
                    fields.insert(name.to_string(), map.next_value()?);
                }
                BodyKey::Records => records = map.next_value::<List>()?.0,
                BodyKey::Changes => observations = map.next_value::<Changes>()?.0,
                BodyKey::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(PushBody { fields: Some(fields), records, observations })
    }
}

/// A value that is kept only when it is an array: its items as JSON text.
struct List<'a>(Option<Vec<&'a RawValue>>);

impl<'de> Deserialize<'de> for List<'de> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ListVisitor)
    }
}

struct ListVisitor;

/// Every JSON value but an array is no list; `visit_map` also takes what serde_json hands an
/// `arbitrary_precision` number as.
impl<'de> Visitor<'de> for ListVisitor {
    type Value = List<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<List<'de>, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<&'de RawValue>()? {
            items.push(item);
        }
        Ok(List(Some(items)))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<List<'de>, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(List(None))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<List<'de>, E> {
        Ok(List(None))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<List<'de>, E> {
        Ok(List(None))
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<List<'de>, E> {
        Ok(List(None))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<List<'de>, E> {
        Ok(List(None))
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<List<'de>, E> {
        Ok(List(None))
    }

    fn visit_unit<E: de::Error>(self) -> Result<List<'de>, E> {
        Ok(List(None))
    }
}

/// `changes`: its `observations` list, when it is an object that has one.
struct Changes<'a>(Option<Vec<&'a RawValue>>);

impl<'de> Deserialize<'de> for Changes<'de> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ChangesVisitor)
    }
}

struct ChangesVisitor;

impl<'de> Visitor<'de> for ChangesVisitor {
    type Value = Changes<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Changes<'de>, A::Error> {
        let mut observations = None;
        while let Some(key) = map.next_key::<ChangesKey>()? {
            match key {
                ChangesKey::Observations => observations = map.next_value::<List>()?.0,
                ChangesKey::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Changes(observations))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Changes<'de>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Changes(None))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Changes<'de>, E> {
        Ok(Changes(None))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Changes<'de>, E> {
        Ok(Changes(None))
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Changes<'de>, E> {
        Ok(Changes(None))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Changes<'de>, E> {
        Ok(Changes(None))
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Changes<'de>, E> {
        Ok(Changes(None))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Changes<'de>, E> {
        Ok(Changes(None))
    }
}

enum ChangesKey {
    Observations,
    Other,
}

impl<'de> Deserialize<'de> for ChangesKey {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = ChangesKey;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E: de::Error>(self, key: &str) -> Result<ChangesKey, E> {
                Ok(if key == "observations" { ChangesKey::Observations } else { ChangesKey::Other })
            }
        }
        d.deserialize_identifier(KeyVisitor)
    }
}

#[cfg(test)]
mod tests;
