//! Export encoding (docs/api.md §13 and 17.8): column inference, Parquet, CSV,
//! NDJSON and the streaming ZIP container.
//!
//! Everything here is synchronous and pure: the caller feeds rows it reads from
//! the database cursor and hands over any `std::io::Write` (usually a channel
//! into the HTTP body). Memory depends on the column set and one batch of rows,
//! never on the number of rows exported.

mod archive;
mod csv_writer;
mod inference;
mod json;
mod names;
mod parquet_writer;
mod projection;
mod request;

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod tests;

use std::borrow::Cow;

use chrono::{DateTime, Utc};
use serde_json::Value;

pub use self::archive::ExportZip;
pub use self::csv_writer::CsvFormWriter;
pub use self::inference::{ColumnInference, ColumnType, DataColumn, MAX_DATA_COLUMNS};
pub use self::json::{observation_json, write_ndjson_line};
pub use self::names::{entry_name_for_form_type, raw_json_entry_name, MAX_ENTRY_NAME_BYTES};
pub use self::parquet_writer::{ParquetFormWriter, MAX_ROW_GROUP_ROWS};
pub use self::request::{ExportFilter, ExportFormat, ExportRequest, JobState, JobStatus, JobView};

/// One observation as it leaves the database for an export.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportRow {
    pub observation_id: String,
    pub form_type: String,
    pub form_version: String,
    pub created_at: Option<DateTime<Utc>>,
    pub updated_at: Option<DateTime<Utc>>,
    pub deleted: bool,
    /// The change_id of the latest change.
    pub version: i64,
    /// The stored JSON text.
    pub data: String,
    pub synced_at: DateTime<Utc>,
    /// The stored JSON text (a JSON `null` is no geolocation).
    pub geolocation: Option<String>,
    pub author: Option<String>,
    pub device_id: Option<String>,
    /// The stored JSON text (anything but an array is no tags).
    pub tags: Option<String>,
}

impl ExportRow {
    /// The geolocation as compact JSON, or `None` for none (SQL or JSON null): the stored text
    /// when it is already what serialising its value writes, as pushes store it.
    pub fn geolocation_json(&self) -> Result<Option<Cow<'_, str>>, serde_json::Error> {
        let Some(text) = self.geolocation.as_deref() else { return Ok(None) };
        if projection::is_canonical(text) {
            return Ok((text != "null").then_some(Cow::Borrowed(text)));
        }
        let value: Value = serde_json::from_str(text)?;
        Ok((!value.is_null()).then(|| Cow::Owned(value.to_string())))
    }

    /// The geolocation's value (JSON null for none).
    pub fn geolocation_value(&self) -> Result<Value, serde_json::Error> {
        match self.geolocation.as_deref() {
            Some(text) => serde_json::from_str(text),
            None => Ok(Value::Null),
        }
    }

    /// The tags as exports list them: each element's string, or the JSON text of an element
    /// that is not one; `None` when the stored value is not an array.
    pub fn tag_list(&self) -> Result<Option<Vec<String>>, serde_json::Error> {
        let Some(text) = self.tags.as_deref() else { return Ok(None) };
        Ok(match serde_json::from_str(text)? {
            Value::Array(items) => Some(
                items
                    .into_iter()
                    .map(|v| match v {
                        Value::String(s) => s,
                        other => other.to_string(),
                    })
                    .collect(),
            ),
            _ => None,
        })
    }

    /// [`tag_list`](Self::tag_list) as compact JSON: the stored text when it already is that.
    pub fn tags_json(&self) -> Result<Option<Cow<'_, str>>, serde_json::Error> {
        match self.tags.as_deref() {
            Some(text) if projection::is_canonical_string_array(text) => Ok(Some(Cow::Borrowed(text))),
            _ => Ok(self.tag_list()?.map(|tags| Cow::Owned(Value::from(tags).to_string()))),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("export I/O failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("export ZIP encoding failed: {0}")]
    Zip(#[from] zip::result::ZipError),
    #[error("export Parquet encoding failed: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    #[error("export Arrow encoding failed: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    #[error("export JSON encoding failed: {0}")]
    Json(#[from] serde_json::Error),
}

/// RFC 3339 in UTC with `Z`, microseconds with trailing zeros trimmed and no
/// fraction at all when it is zero (docs/api.md §1.4), so client timestamps such as
/// `2025-06-27T10:55:58.123Z` come back byte for byte.
pub fn format_timestamp(ts: DateTime<Utc>) -> String {
    let base = ts.format("%Y-%m-%dT%H:%M:%S");
    // chrono encodes a leap second as a sub-second part >= 1s; clamping keeps the
    // fraction at six digits instead of printing a seventh.
    let micros = ts.timestamp_subsec_micros().min(999_999);
    if micros == 0 {
        format!("{base}Z")
    } else {
        let fraction = format!("{micros:06}");
        format!("{base}.{}Z", fraction.trim_end_matches('0'))
    }
}
