//! One form type's Parquet file (docs/api.md §13.2), written batch by batch.

use std::io::Write;
use std::sync::Arc;

use super::projection::{ColumnProjector, Leaf};
use super::{ColumnType, DataColumn, ExportError, ExportRow};
use arrow::array::{
    ArrayRef, BooleanBuilder, Float64Builder, Int64Builder, StringBuilder, TimestampMicrosecondBuilder,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use arrow::record_batch::RecordBatch;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;

/// Row groups hold at most this many rows; the writer keeps at most one row
/// group's encoded pages in memory.
pub const MAX_ROW_GROUP_ROWS: usize = 10_000;

const UTC: &str = "UTC";

fn timestamp_type() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some(UTC.into()))
}

/// The Arrow schema: the fixed columns in their documented order, then the data
/// columns in the order given (already sorted by [`super::ColumnInference`]).
pub(crate) fn schema_for(columns: &[DataColumn]) -> Schema {
    let mut fields = vec![
        Field::new("observation_id", DataType::Utf8, false),
        Field::new("form_type", DataType::Utf8, false),
        Field::new("form_version", DataType::Utf8, false),
        Field::new("created_at", timestamp_type(), true),
        Field::new("updated_at", timestamp_type(), true),
        Field::new("deleted", DataType::Boolean, false),
        Field::new("version", DataType::Int64, false),
        Field::new("data", DataType::Utf8, false),
        Field::new("synced_at", timestamp_type(), false),
        Field::new("geolocation", DataType::Utf8, true),
        Field::new("author", DataType::Utf8, true),
        Field::new("device_id", DataType::Utf8, true),
        Field::new("tags", DataType::Utf8, true),
    ];
    fields.extend(columns.iter().map(|c| {
        let data_type = match c.column_type {
            ColumnType::Boolean => DataType::Boolean,
            ColumnType::Int64 => DataType::Int64,
            ColumnType::Float64 => DataType::Float64,
            ColumnType::Utf8 => DataType::Utf8,
        };
        Field::new(c.name.clone(), data_type, true)
    }));
    Schema::new(fields)
}

enum DataBuilder {
    Boolean(BooleanBuilder),
    Int64(Int64Builder),
    Float64(Float64Builder),
    Utf8(StringBuilder),
}

impl DataBuilder {
    /// `bytes`: the text a UTF8 column is expected to hold.
    fn new(column_type: ColumnType, rows: usize, bytes: usize) -> Self {
        match column_type {
            ColumnType::Boolean => Self::Boolean(BooleanBuilder::with_capacity(rows)),
            ColumnType::Int64 => Self::Int64(Int64Builder::with_capacity(rows)),
            ColumnType::Float64 => Self::Float64(Float64Builder::with_capacity(rows)),
            ColumnType::Utf8 => Self::Utf8(StringBuilder::with_capacity(rows, bytes)),
        }
    }

    /// The text bytes held so far (0 for the other types).
    fn text_bytes(&self) -> usize {
        match self {
            Self::Utf8(b) => b.values_slice().len(),
            _ => 0,
        }
    }

    // A value of an unexpected kind becomes null rather than failing the export:
    // inference ran over the same snapshot, so this only guards against misuse.
    fn append(&mut self, value: Option<&Leaf>) {
        match self {
            Self::Boolean(b) => b.append_option(value.and_then(Leaf::as_bool)),
            Self::Int64(b) => b.append_option(value.and_then(Leaf::as_i64)),
            Self::Float64(b) => b.append_option(value.and_then(Leaf::as_f64)),
            Self::Utf8(b) => match value {
                Some(v) => b.append_value(v.text()),
                None => b.append_null(),
            },
        }
    }

    fn finish(&mut self) -> ArrayRef {
        match self {
            Self::Boolean(b) => Arc::new(b.finish()),
            Self::Int64(b) => Arc::new(b.finish()),
            Self::Float64(b) => Arc::new(b.finish()),
            Self::Utf8(b) => Arc::new(b.finish()),
        }
    }
}

/// Writes one form type's rows as a Parquet file into `W`, which may be a
/// non-seekable stream such as a ZIP entry: Parquet only appends, with the
/// footer last.
pub struct ParquetFormWriter<W: Write + Send> {
    writer: ArrowWriter<W>,
    schema: SchemaRef,
    columns: Vec<DataColumn>,
    projector: ColumnProjector,
    /// Text bytes per row of each data column in the batch before: the next batch's builders
    /// start that size instead of doubling their way up (a free-text column can hold a
    /// kilobyte a row, and each doubling copies all of it).
    bytes_per_row: Vec<usize>,
}

impl<W: Write + Send> ParquetFormWriter<W> {
    /// Starts the file (writes the magic bytes) for the given data columns.
    pub fn new(w: W, columns: &[DataColumn]) -> Result<Self, ExportError> {
        let schema: SchemaRef = Arc::new(schema_for(columns));
        let props = WriterProperties::builder()
            .set_max_row_group_size(MAX_ROW_GROUP_ROWS)
            .set_compression(Compression::SNAPPY)
            .set_created_by(format!("synkronus {}", env!("CARGO_PKG_VERSION")))
            .set_column_dictionary_enabled(ColumnPath::from("observation_id"), false)
            .set_column_dictionary_enabled(ColumnPath::from("geolocation"), false)
            .set_column_statistics_enabled(ColumnPath::from("data"), EnabledStatistics::None)
            .set_column_statistics_enabled(ColumnPath::from("geolocation"), EnabledStatistics::None)
            .build();
        let writer = ArrowWriter::try_new(w, Arc::clone(&schema), Some(props))?;
        Ok(Self {
            writer,
            schema,
            columns: columns.to_vec(),
            projector: ColumnProjector::new(columns),
            bytes_per_row: vec![8; columns.len()],
        })
    }

    /// Appends rows in the given order. A row group is flushed to `W` each time
    /// 10,000 rows are buffered, whatever the batch sizes.
    pub fn write_batch(&mut self, rows: &[ExportRow]) -> Result<(), ExportError> {
        if rows.is_empty() {
            return Ok(());
        }
        let batch = self.record_batch(rows)?;
        self.writer.write(&batch)?;
        Ok(())
    }

    /// Flushes the last row group, writes the footer and gives `W` back.
    pub fn finish(self) -> Result<W, ExportError> {
        Ok(self.writer.into_inner()?)
    }

    /// Bytes held for the row group in progress (for tests and diagnostics).
    pub fn buffered_bytes(&self) -> usize {
        self.writer.memory_size()
    }

    /// Rows buffered in the row group in progress.
    pub fn buffered_rows(&self) -> usize {
        self.writer.in_progress_rows()
    }

    fn record_batch(&mut self, rows: &[ExportRow]) -> Result<RecordBatch, ExportError> {
        let n = rows.len();
        let bytes = |text: fn(&ExportRow) -> usize| rows.iter().map(text).sum::<usize>();
        let mut observation_id = StringBuilder::with_capacity(n, bytes(|r| r.observation_id.len()));
        let mut form_type = StringBuilder::with_capacity(n, bytes(|r| r.form_type.len()));
        let mut form_version = StringBuilder::with_capacity(n, bytes(|r| r.form_version.len()));
        let mut created_at = TimestampMicrosecondBuilder::with_capacity(n).with_timezone(UTC);
        let mut updated_at = TimestampMicrosecondBuilder::with_capacity(n).with_timezone(UTC);
        let mut deleted = BooleanBuilder::with_capacity(n);
        let mut version = Int64Builder::with_capacity(n);
        // Canonical text, as nearly every row's is, is the column's value as it is.
        let mut data = StringBuilder::with_capacity(n, bytes(|r| r.data.len()));
        let mut synced_at = TimestampMicrosecondBuilder::with_capacity(n).with_timezone(UTC);
        let mut geolocation =
            StringBuilder::with_capacity(n, bytes(|r| r.geolocation.as_ref().map_or(0, String::len)));
        let mut author = StringBuilder::with_capacity(n, bytes(|r| r.author.as_ref().map_or(0, String::len)));
        let mut device_id =
            StringBuilder::with_capacity(n, bytes(|r| r.device_id.as_ref().map_or(0, String::len)));
        let mut tags = StringBuilder::with_capacity(n, bytes(|r| r.tags.as_ref().map_or(0, String::len)));
        let mut data_builders: Vec<DataBuilder> = (self.columns.iter().zip(&self.bytes_per_row))
            .map(|(c, per_row)| DataBuilder::new(c.column_type, n, n * per_row))
            .collect();

        let mut slots = Vec::with_capacity(self.columns.len());
        for row in rows {
            observation_id.append_value(&row.observation_id);
            form_type.append_value(&row.form_type);
            form_version.append_value(&row.form_version);
            created_at.append_option(row.created_at.map(|t| t.timestamp_micros()));
            updated_at.append_option(row.updated_at.map(|t| t.timestamp_micros()));
            deleted.append_value(row.deleted);
            version.append_value(row.version);
            // The stored text when it is already what serialising the parsed value would give.
            let data_text = self.projector.project(&row.data, &mut slots)?;
            data.append_value(&data_text);
            synced_at.append_value(row.synced_at.timestamp_micros());
            // A JSON null geolocation is "no geolocation": null, not the text "null".
            geolocation.append_option(row.geolocation_json()?);
            author.append_option(row.author.as_deref());
            device_id.append_option(row.device_id.as_deref());
            tags.append_option(row.tags_json()?);
            for (builder, slot) in data_builders.iter_mut().zip(slots.iter()) {
                builder.append(slot.as_ref());
            }
        }

        let mut arrays: Vec<ArrayRef> = vec![
            Arc::new(observation_id.finish()),
            Arc::new(form_type.finish()),
            Arc::new(form_version.finish()),
            Arc::new(created_at.finish()),
            Arc::new(updated_at.finish()),
            Arc::new(deleted.finish()),
            Arc::new(version.finish()),
            Arc::new(data.finish()),
            Arc::new(synced_at.finish()),
            Arc::new(geolocation.finish()),
            Arc::new(author.finish()),
            Arc::new(device_id.finish()),
            Arc::new(tags.finish()),
        ];
        for (per_row, builder) in self.bytes_per_row.iter_mut().zip(&data_builders) {
            *per_row = builder.text_bytes().div_ceil(n);
        }
        arrays.extend(data_builders.iter_mut().map(DataBuilder::finish));
        Ok(RecordBatch::try_new(Arc::clone(&self.schema), arrays)?)
    }
}
