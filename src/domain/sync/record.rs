//! A pushed record as the commit needs it, in as little memory as it fits: its texts in one
//! allocation (docs/api.md §18.4).
//!
//! A big push waits for the change log as its decoded records, and until it is committed they are
//! most of what it holds: with a field per text, a record of 78 bytes on the wire weighed some
//! 260 (a struct of twelve fields and three small allocations), so a 23 MB push held 80 MB, and
//! the pushes the body budget lets wait together held over three times the budget. Here a record
//! is its fixed-size values and one boxed string of its texts, one after the other, with where
//! each ends: 88 bytes and one allocation of about its texts' length.

use std::fmt;

use chrono::{DateTime, Utc};

/// The texts of a record, borrowed: what [`IncomingRecord::new`] takes and
/// [`IncomingRecord::texts`] gives back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecordTexts<'a> {
    pub id: &'a str,
    pub form_type: &'a str,
    pub form_version: &'a str,
    /// `None` only on deletions that send no data: the previous data is kept. Canonical JSON text
    /// (keys sorted, as serde_json writes it), written once at decode: the commit copies it to the
    /// database as it is.
    pub data: Option<&'a str>,
    /// Canonical JSON text, like `data`.
    pub geolocation: Option<&'a str>,
    pub author: Option<&'a str>,
    pub device_id: Option<&'a str>,
    /// A canonical JSON array of strings.
    pub tags: Option<&'a str>,
}

/// The fields kept in the text, in order.
const FIELDS: usize = 8;
/// Which of the optional texts are present, by their index in the text.
const DATA: usize = 3;
const GEOLOCATION: usize = 4;
const AUTHOR: usize = 5;
const DEVICE_ID: usize = 6;
const TAGS: usize = 7;

/// A record as pushed, after decoding and validation; its canonical JSON (fields in alphabetical
/// order, see `write_canonical_record`) is what the idempotency fingerprint hashes.
#[derive(Clone, PartialEq)]
pub struct IncomingRecord {
    /// id, form type, form version, data, geolocation, author, device id, tags.
    text: Box<str>,
    /// Where each text but the last ends.
    ends: [u32; FIELDS - 1],
    /// Bit `i` set: the optional text `i` is present.
    present: u8,
    pub deleted: bool,
    pub created_at: Option<DateTime<Utc>>,
    pub updated_at: Option<DateTime<Utc>>,
    /// The version the client's change is based on, when it names one.
    pub base_version: Option<i64>,
}

/// A record whose texts add up to 4 GiB or more: no body the server reads comes near.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the record's texts are larger than 4 GiB")]
pub struct RecordTooLarge;

impl IncomingRecord {
    /// A record of these texts, not deleted, without timestamps or base version.
    pub fn new(texts: RecordTexts<'_>) -> Result<Self, RecordTooLarge> {
        let parts = [
            Some(texts.id),
            Some(texts.form_type),
            Some(texts.form_version),
            texts.data,
            texts.geolocation,
            texts.author,
            texts.device_id,
            texts.tags,
        ];
        let len: usize = parts.iter().flatten().map(|t| t.len()).sum();
        u32::try_from(len).map_err(|_| RecordTooLarge)?;
        let mut text = String::with_capacity(len);
        let mut ends = [0u32; FIELDS - 1];
        let mut present = 0u8;
        for (i, part) in parts.iter().enumerate() {
            if let Some(part) = part {
                text.push_str(part);
                present |= 1 << i;
            }
            if let Some(end) = ends.get_mut(i) {
                // Within the total, checked above.
                *end = text.len() as u32;
            }
        }
        Ok(IncomingRecord {
            text: text.into_boxed_str(),
            ends,
            present,
            deleted: false,
            created_at: None,
            updated_at: None,
            base_version: None,
        })
    }

    fn text(&self, field: usize) -> &str {
        let start = if field == 0 { 0 } else { self.ends[field - 1] as usize };
        let end = if field == FIELDS - 1 { self.text.len() } else { self.ends[field] as usize };
        &self.text[start..end]
    }

    fn optional(&self, field: usize) -> Option<&str> {
        (self.present & (1 << field) != 0).then(|| self.text(field))
    }

    pub fn id(&self) -> &str {
        self.text(0)
    }

    pub fn form_type(&self) -> &str {
        self.text(1)
    }

    pub fn form_version(&self) -> &str {
        self.text(2)
    }

    /// Canonical JSON text; `None` only on deletions that send no data.
    pub fn data(&self) -> Option<&str> {
        self.optional(DATA)
    }

    /// Canonical JSON text.
    pub fn geolocation(&self) -> Option<&str> {
        self.optional(GEOLOCATION)
    }

    pub fn author(&self) -> Option<&str> {
        self.optional(AUTHOR)
    }

    pub fn device_id(&self) -> Option<&str> {
        self.optional(DEVICE_ID)
    }

    /// A canonical JSON array of strings.
    pub fn tags(&self) -> Option<&str> {
        self.optional(TAGS)
    }

    pub fn texts(&self) -> RecordTexts<'_> {
        RecordTexts {
            id: self.id(),
            form_type: self.form_type(),
            form_version: self.form_version(),
            data: self.data(),
            geolocation: self.geolocation(),
            author: self.author(),
            device_id: self.device_id(),
            tags: self.tags(),
        }
    }

    /// The same record with other texts (its other fields kept).
    pub fn with_texts(&self, change: impl FnOnce(&mut RecordTexts)) -> Result<Self, RecordTooLarge> {
        let mut texts = self.texts();
        change(&mut texts);
        Ok(IncomingRecord {
            deleted: self.deleted,
            created_at: self.created_at,
            updated_at: self.updated_at,
            base_version: self.base_version,
            ..IncomingRecord::new(texts)?
        })
    }
}

impl fmt::Debug for IncomingRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = self.texts();
        f.debug_struct("IncomingRecord")
            .field("id", &t.id)
            .field("form_type", &t.form_type)
            .field("form_version", &t.form_version)
            .field("data", &t.data)
            .field("deleted", &self.deleted)
            .field("created_at", &self.created_at)
            .field("updated_at", &self.updated_at)
            .field("geolocation", &t.geolocation)
            .field("base_version", &self.base_version)
            .field("author", &t.author)
            .field("device_id", &t.device_id)
            .field("tags", &t.tags)
            .finish()
    }
}

/// Serialised only by the tests: through a sorted map, it is the form earlier releases hashed.
#[cfg(test)]
impl serde::Serialize for IncomingRecord {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::Error;
        use serde_json::value::RawValue;

        #[derive(serde::Serialize)]
        struct Former<'a> {
            id: &'a str,
            form_type: &'a str,
            form_version: &'a str,
            data: Option<&'a RawValue>,
            deleted: bool,
            created_at: Option<DateTime<Utc>>,
            updated_at: Option<DateTime<Utc>>,
            geolocation: Option<&'a RawValue>,
            base_version: Option<i64>,
            author: Option<&'a str>,
            device_id: Option<&'a str>,
            tags: Option<&'a RawValue>,
        }
        fn raw(text: Option<&str>) -> serde_json::Result<Option<&RawValue>> {
            text.map(serde_json::from_str).transpose()
        }
        let t = self.texts();
        Former {
            id: t.id,
            form_type: t.form_type,
            form_version: t.form_version,
            data: raw(t.data).map_err(S::Error::custom)?,
            deleted: self.deleted,
            created_at: self.created_at,
            updated_at: self.updated_at,
            geolocation: raw(t.geolocation).map_err(S::Error::custom)?,
            base_version: self.base_version,
            author: t.author,
            device_id: t.device_id,
            tags: raw(t.tags).map_err(S::Error::custom)?,
        }
        .serialize(serializer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_come_back_as_given() {
        let texts = RecordTexts {
            id: "r1",
            form_type: "",
            form_version: "2",
            data: Some(r#"{"a":1}"#),
            geolocation: None,
            author: Some(""),
            device_id: None,
            tags: Some(r#"["x"]"#),
        };
        let mut record = IncomingRecord::new(texts).unwrap();
        assert_eq!(record.texts(), texts);
        record.deleted = true;
        let changed = record.with_texts(|t| t.data = None).unwrap();
        assert_eq!(changed.texts(), RecordTexts { data: None, ..texts });
        assert!(changed.deleted);
        let empty = IncomingRecord::new(RecordTexts::default()).unwrap();
        assert_eq!(empty.texts(), RecordTexts::default());
        assert_eq!(std::mem::size_of::<IncomingRecord>(), 88);
    }
}
