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
    pub geolocation: Option<Value>,
    pub author: Option<String>,
    pub device_id: Option<String>,
    pub tags: Option<Vec<String>>,
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
