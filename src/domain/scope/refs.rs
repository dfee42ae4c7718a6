//! Which attachments a record names (docs/api.md §20.4): a user may download an attachment that a
//! record they may see holds as a string.
//!
//! Every string of every record cannot be kept; the strings kept are those that can be
//! attachment ids and look like what clients store there: a file name with an extension
//! (Formulus stores a photo answer's `filename`, the attachment id, `<uuid>.jpg`) or a UUID.

use std::collections::BTreeSet;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::domain::attachment::validate_id;
use crate::domain::scope::extract::KeySeed;

/// The key under which serde_json (with `arbitrary_precision`) hands a number's text to a map
/// visitor: a number, not a string the record holds.
const NUMBER_TOKEN: &str = "$serde_json::private::Number";

/// The strings of `data` that may name an attachment, sorted and distinct.
pub fn attachment_refs(data: &str) -> Result<Vec<String>, serde_json::Error> {
    let mut found = BTreeSet::new();
    let mut deserializer = serde_json::Deserializer::from_str(data);
    Strings { found: &mut found }.deserialize(&mut deserializer)?;
    deserializer.end()?;
    Ok(found.into_iter().collect())
}

/// True for a valid attachment id that is a UUID or ends in `.ext` (1-10 letters or digits).
pub fn may_name_attachment(text: &str) -> bool {
    if validate_id(text).is_err() {
        return false;
    }
    is_uuid(text.split('.').next().unwrap_or(text)) || has_extension(text)
}

fn has_extension(text: &str) -> bool {
    match text.rsplit_once('.') {
        Some((stem, ext)) => {
            !stem.is_empty()
                && (1..=10).contains(&ext.len())
                && ext.bytes().all(|b| b.is_ascii_alphanumeric())
        }
        None => false,
    }
}

fn is_uuid(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.len() == 36
        && bytes.iter().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => *b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
}

struct Strings<'a> {
    found: &'a mut BTreeSet<String>,
}

impl<'de> DeserializeSeed<'de> for Strings<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strings<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, text: &str) -> Result<(), E> {
        if may_name_attachment(text) && !self.found.contains(text) {
            self.found.insert(text.to_owned());
        }
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Strings { found: self.found })?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        // Keys are names, not values: only values can hold an attachment id. (A number's text
        // arrives as a one-entry map under serde_json's arbitrary_precision and is skipped the
        // same way.)
        while let Some(key) = map.next_key_seed(KeySeed)? {
            if key.as_str() == NUMBER_TOKEN {
                map.next_value::<serde::de::IgnoredAny>()?;
            } else {
                map.next_value_seed(Strings { found: self.found })?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_formulus_photo_answer_and_uuids_anywhere() {
        let data = r#"{"name":"Amina","members":4,"photo":{"type":"image","id":"3f2a9c1e-7d1b-4c55-9e0f-1a2b3c4d5e6f",
            "filename":"3f2a9c1e-7d1b-4c55-9e0f-1a2b3c4d5e6f.jpg"},"list":[{"f":"scan 2.pdf"}],"n":1.5,
            "sep.arate.key":"plain words","x":"a/../b.jpg"}"#;
        assert_eq!(
            attachment_refs(data).unwrap(),
            vec![
                "3f2a9c1e-7d1b-4c55-9e0f-1a2b3c4d5e6f".to_string(),
                "3f2a9c1e-7d1b-4c55-9e0f-1a2b3c4d5e6f.jpg".to_string(),
                "scan 2.pdf".to_string()
            ]
        );
    }

    #[test]
    fn what_is_not_an_attachment_name() {
        for text in ["north", "2025-06-25", "", ".jpg", "x.", "a.b c", "manifest", "x.toolongextension"] {
            assert!(!may_name_attachment(text), "{text}");
        }
        for text in ["photo 1.jpg", "IMG_0001.JPEG", "3F2A9C1E-7D1B-4C55-9E0F-1A2B3C4D5E6F"] {
            assert!(may_name_attachment(text), "{text}");
        }
        assert!(attachment_refs("[1").is_err());
    }
}
