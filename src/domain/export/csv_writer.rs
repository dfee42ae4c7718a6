//! One form type's CSV file (docs/api.md §13.2): the Parquet columns as text.

use std::io::Write;

use super::projection::{ColumnProjector, Leaf};
use super::{format_timestamp, ColumnType, DataColumn, ExportError, ExportRow};
use chrono::{DateTime, Utc};

const FIXED_COLUMNS: [&str; 13] = [
    "observation_id",
    "form_type",
    "form_version",
    "created_at",
    "updated_at",
    "deleted",
    "version",
    "data",
    "synced_at",
    "geolocation",
    "author",
    "device_id",
    "tags",
];

/// RFC 4180 ends records with CRLF.
const RECORD_END: &str = "\r\n";

/// Writes a header row at creation, then one record per row: UTF-8 without
/// BOM, RFC 4180 quoting, RFC 3339 timestamps, `true`/`false`, empty for null.
pub struct CsvFormWriter<W: Write> {
    out: W,
    columns: Vec<DataColumn>,
    projector: ColumnProjector,
    line: String,
}

impl<W: Write> CsvFormWriter<W> {
    pub fn new(out: W, columns: &[DataColumn]) -> Result<Self, ExportError> {
        let mut writer = Self {
            out,
            columns: columns.to_vec(),
            projector: ColumnProjector::new(columns),
            line: String::with_capacity(1024),
        };
        let mut line = std::mem::take(&mut writer.line);
        let names = FIXED_COLUMNS.iter().copied().chain(columns.iter().map(|c| c.name.as_str()));
        for (i, name) in names.enumerate() {
            if i > 0 {
                line.push(',');
            }
            push_field(&mut line, name);
        }
        line.push_str(RECORD_END);
        writer.out.write_all(line.as_bytes())?;
        line.clear();
        writer.line = line;
        Ok(writer)
    }

    pub fn write_batch(&mut self, rows: &[ExportRow]) -> Result<(), ExportError> {
        rows.iter().try_for_each(|row| self.write_row(row))
    }

    pub fn write_row(&mut self, row: &ExportRow) -> Result<(), ExportError> {
        // The record is built in a reused buffer and written with one call, so a
        // deflating ZIP entry sees whole records instead of many tiny writes.
        let mut line = std::mem::take(&mut self.line);
        line.clear();
        push_field(&mut line, &row.observation_id);
        line.push(',');
        push_field(&mut line, &row.form_type);
        line.push(',');
        push_field(&mut line, &row.form_version);
        line.push(',');
        push_timestamp(&mut line, row.created_at);
        line.push(',');
        push_timestamp(&mut line, row.updated_at);
        line.push(',');
        line.push_str(bool_text(row.deleted));
        line.push(',');
        line.push_str(&row.version.to_string());
        line.push(',');
        let mut slots = Vec::with_capacity(self.columns.len());
        // The stored text when it is already what serialising the parsed value would give.
        push_field(&mut line, &self.projector.project(&row.data, &mut slots)?);
        line.push(',');
        push_timestamp(&mut line, Some(row.synced_at));
        line.push(',');
        if let Some(g) = row.geolocation_json()? {
            push_field(&mut line, &g);
        }
        line.push(',');
        if let Some(a) = &row.author {
            push_field(&mut line, a);
        }
        line.push(',');
        if let Some(d) = &row.device_id {
            push_field(&mut line, d);
        }
        line.push(',');
        if let Some(t) = row.tags_json()? {
            push_field(&mut line, &t);
        }
        for (column, slot) in self.columns.iter().zip(&slots) {
            line.push(',');
            if let Some(value) = slot {
                push_data_value(&mut line, column.column_type, value);
            }
        }
        line.push_str(RECORD_END);
        let written = self.out.write_all(line.as_bytes());
        self.line = line;
        written?;
        Ok(())
    }

    /// Flushes and gives the writer back.
    pub fn finish(mut self) -> Result<W, ExportError> {
        self.out.flush()?;
        Ok(self.out)
    }
}

fn bool_text(b: bool) -> &'static str {
    if b {
        "true"
    } else {
        "false"
    }
}

fn push_timestamp(line: &mut String, ts: Option<DateTime<Utc>>) {
    if let Some(ts) = ts {
        line.push_str(&format_timestamp(ts));
    }
}

// Numbers are written with their JSON source text (arbitrary_precision), so
// `1.50` or a 20-digit integer in a DOUBLE column reads back exactly as sent.
fn push_data_value(line: &mut String, column_type: ColumnType, value: &Leaf) {
    match (column_type, value) {
        (ColumnType::Boolean, Leaf::Bool(b)) => line.push_str(bool_text(*b)),
        (ColumnType::Int64 | ColumnType::Float64, Leaf::Number(n)) => line.push_str(n),
        (ColumnType::Utf8, v) => push_field(line, v.text()),
        // Inference ran over the same rows, so this is only a guard: empty, as null.
        _ => {}
    }
}

/// RFC 4180: a field with a comma, quote, CR or LF is quoted, quotes doubled.
pub(crate) fn push_field(line: &mut String, field: &str) {
    if field.contains([',', '"', '\r', '\n']) {
        line.push('"');
        for c in field.chars() {
            if c == '"' {
                line.push('"');
            }
            line.push(c);
        }
        line.push('"');
    } else {
        line.push_str(field);
    }
}
