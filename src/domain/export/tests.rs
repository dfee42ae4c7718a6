use std::collections::HashSet;
use std::io::{Cursor, Read, Write};

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Float64Type, Int64Type, TimeUnit, TimestampMicrosecondType};
use bytes::Bytes;
use chrono::{DateTime, Utc};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::Compression;
use serde_json::{json, Value};

use super::projection::{ColumnProjector, Leaf};
use super::*;

mod text_formats;

fn ts(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
}

pub(super) fn row(id: &str, form_type: &str, version: i64, data: Value) -> ExportRow {
    ExportRow {
        observation_id: id.to_owned(),
        form_type: form_type.to_owned(),
        form_version: "1.0".to_owned(),
        created_at: Some(ts("2025-06-25T12:00:00.123Z")),
        updated_at: None,
        deleted: false,
        version,
        data: data.to_string(),
        synced_at: ts("2025-06-25T12:06:00Z"),
        geolocation: None,
        author: None,
        device_id: None,
        tags: None,
    }
}

/// Parses JSON text the way request bodies are parsed (arbitrary_precision keeps number text).
fn j(text: &str) -> Value {
    serde_json::from_str(text).unwrap()
}

fn infer(datas: &[Value]) -> Vec<DataColumn> {
    let mut inf = ColumnInference::new();
    for d in datas {
        inf.observe(d);
    }
    inf.finish()
}

fn col(name: &str, column_type: ColumnType) -> DataColumn {
    DataColumn { name: name.to_owned(), column_type }
}

// ---------------------------------------------------------------- timestamps

#[test]
fn timestamps_trim_fraction() {
    assert_eq!(format_timestamp(ts("2025-06-27T10:55:58Z")), "2025-06-27T10:55:58Z");
    assert_eq!(format_timestamp(ts("2025-06-27T10:55:58.123Z")), "2025-06-27T10:55:58.123Z");
    assert_eq!(format_timestamp(ts("2025-06-27T10:55:58.100000Z")), "2025-06-27T10:55:58.1Z");
    assert_eq!(format_timestamp(ts("2025-06-27T10:55:58.000001Z")), "2025-06-27T10:55:58.000001Z");
    // Nanoseconds are cut to microseconds; an offset is normalised to UTC.
    assert_eq!(format_timestamp(ts("2025-06-27T12:55:58.1234569+02:00")), "2025-06-27T10:55:58.123456Z");
    assert_eq!(format_timestamp(ts("2025-06-27T10:55:58.0000009Z")), "2025-06-27T10:55:58Z");
}

// ---------------------------------------------------------------- inference

#[test]
fn infers_scalar_types() {
    let cols = infer(&[
        j(r#"{"b": true, "i": 1, "f": 1, "s": "x", "n": null}"#),
        j(r#"{"b": false, "i": -9223372036854775808, "f": 2.5, "s": "y", "n": null}"#),
        j(r#"{"i": 9223372036854775807, "f": null}"#),
    ]);
    assert_eq!(
        cols,
        vec![
            col("data_b", ColumnType::Boolean),
            col("data_f", ColumnType::Float64),
            col("data_i", ColumnType::Int64),
            col("data_n", ColumnType::Utf8),
            col("data_s", ColumnType::Utf8),
        ]
    );
    assert_eq!(cols[0].path(), "b");
}

#[test]
fn large_integers_follow_the_rule() {
    // Integers that do not all fit i64 and no real number: exact text.
    let only_big = infer(&[j(r#"{"a": 9223372036854775808}"#), j(r#"{"a": 1}"#)]);
    assert_eq!(only_big, vec![col("data_a", ColumnType::Utf8)]);
    let huge = infer(&[j(r#"{"a": 123456789012345678901234567890}"#)]);
    assert_eq!(huge, vec![col("data_a", ColumnType::Utf8)]);
    // With one non-integer, every number becomes a double.
    let with_float = infer(&[j(r#"{"a": 18446744073709551616}"#), j(r#"{"a": 0.5}"#), j(r#"{"a": 3}"#)]);
    assert_eq!(with_float, vec![col("data_a", ColumnType::Float64)]);
    // A fraction or exponent in the source text means a real number.
    assert_eq!(infer(&[j(r#"{"a": 1.0}"#)]), vec![col("data_a", ColumnType::Float64)]);
    assert_eq!(infer(&[j(r#"{"a": 1e3}"#), j(r#"{"a": 2}"#)]), vec![col("data_a", ColumnType::Float64)]);
    // Beyond f64: kept as text.
    assert_eq!(infer(&[j(r#"{"a": 1e400}"#), j(r#"{"a": 2.5}"#)]), vec![col("data_a", ColumnType::Utf8)]);
}

#[test]
fn mixed_arrays_and_nulls_are_text() {
    let cols = infer(&[
        j(r#"{"m": 1, "bs": true, "arr": [1, 2], "nul": null, "sn": "1"}"#),
        j(r#"{"m": "one", "bs": 1, "arr": [], "sn": 1}"#),
    ]);
    assert_eq!(
        cols,
        vec![
            col("data_arr", ColumnType::Utf8),
            col("data_bs", ColumnType::Utf8),
            col("data_m", ColumnType::Utf8),
            col("data_nul", ColumnType::Utf8),
            col("data_sn", ColumnType::Utf8),
        ]
    );
}

#[test]
fn nested_objects_flatten_and_collisions_merge() {
    let cols = infer(&[
        j(r#"{"address": {"city": "Nairobi", "geo": {"lat": 1.5}}, "empty": {}}"#),
        j(r#"{"address.city": 7, "head_name": "Amina"}"#),
        j(r#"{"a": {"b": 1}, "a.b": 2}"#),
        j(r#"{"x": {"": 1}, "": {"y": true}}"#),
    ]);
    assert_eq!(
        cols,
        vec![
            col("data_.y", ColumnType::Boolean),
            col("data_a.b", ColumnType::Int64),
            col("data_address.city", ColumnType::Utf8),
            col("data_address.geo.lat", ColumnType::Float64),
            col("data_head_name", ColumnType::Utf8),
            col("data_x.", ColumnType::Int64),
        ]
    );
}

#[test]
fn projection_takes_first_non_null_of_colliding_paths() {
    let cols = infer(&[j(r#"{"a": {"b": 1}, "a.b": 2, "c": null}"#)]);
    let projector = ColumnProjector::new(&cols);
    let number = |t: &'static str| Some(Leaf::Number(t.into()));
    let mut out = Vec::new();
    // Key order: "a" < "a.b", so the nested path comes first, from canonical text or not.
    for text in [r#"{"a":{"b":1},"a.b":2}"#, r#"{"a.b": 2, "a": {"b": 1}}"#] {
        projector.project(text, &mut out).unwrap();
        assert_eq!(out, vec![number("1"), None], "{text}");
    }
    for text in [r#"{"a":{"b":null},"a.b":2}"#, r#"{"a.b": 2, "a": {"b": null}}"#] {
        projector.project(text, &mut out).unwrap();
        assert_eq!(out, vec![number("2"), None], "{text}");
    }
}

#[test]
fn at_most_1000_columns_first_by_name_with_bounded_memory() {
    let mut inf = ColumnInference::new();
    // Descending order forces evictions: each new key sorts first.
    for i in (0..1500).rev() {
        let mut m = serde_json::Map::new();
        m.insert(format!("k{i:04}"), json!(i));
        inf.observe(&Value::Object(m));
        assert!(inf.len() <= MAX_DATA_COLUMNS);
    }
    // A late key that sorts last never enters; one that sorts first does.
    inf.observe(&json!({"zzz": 1, "a": "x"}));
    let cols = inf.finish();
    assert_eq!(cols.len(), MAX_DATA_COLUMNS);
    assert_eq!(cols[0], col("data_a", ColumnType::Utf8));
    assert_eq!(cols[1].name, "data_k0000");
    assert_eq!(cols[999].name, "data_k0998");
    assert!(cols.windows(2).all(|w| w[0].name < w[1].name));
}

#[test]
fn non_object_data_has_no_columns() {
    assert!(infer(&[json!([1, 2]), json!("x"), json!(null), json!({})]).is_empty());
}

// ---------------------------------------------------------------- names

#[test]
fn entry_names_are_sanitised_and_unique() {
    let mut used = HashSet::new();
    assert_eq!(entry_name_for_form_type("household", &mut used), "household");
    assert_eq!(entry_name_for_form_type("house hold/é", &mut used), "house_hold__");
    assert_eq!(entry_name_for_form_type("house?hold/x", &mut used), "house_hold_x");
    assert_eq!(entry_name_for_form_type("house_hold_x", &mut used), "house_hold_x-2");
    assert_eq!(entry_name_for_form_type("house hold_x", &mut used), "house_hold_x-3");
    assert_eq!(entry_name_for_form_type("", &mut used), "_untyped");
    assert_eq!(entry_name_for_form_type("_untyped", &mut used), "_untyped-2");
    assert_eq!(entry_name_for_form_type("a.b-c_D9", &mut used), "a.b-c_D9");
    let long = "ü".repeat(80) + &"x".repeat(80);
    let name = entry_name_for_form_type(&long, &mut used);
    assert_eq!(name.len(), MAX_ENTRY_NAME_BYTES);
    assert_eq!(name, "_".repeat(80) + &"x".repeat(20));
    let again = entry_name_for_form_type(&(long + "y"), &mut used);
    assert_eq!(again, "_".repeat(80) + &"x".repeat(20) + "-2");
}

#[test]
fn raw_json_names_are_sanitised_and_safe() {
    let mut used = HashSet::new();
    assert_eq!(raw_json_entry_name("household", "obs_1", &mut used), "household/obs_1.json");
    assert_eq!(raw_json_entry_name("household", "obs/1", &mut used), "household/obs_1-2.json");
    assert_eq!(raw_json_entry_name("", "a b", &mut used), "_untyped/a_b.json");
    assert_eq!(raw_json_entry_name("..", "x", &mut used), "__/x.json");
    assert_eq!(raw_json_entry_name(".", "..", &mut used), "_/...json");
    assert_eq!(raw_json_entry_name("f", "", &mut used), "f/_.json");
}

// ---------------------------------------------------------------- ZIP + Parquet

fn read_zip(bytes: Vec<u8>) -> zip::ZipArchive<Cursor<Vec<u8>>> {
    zip::ZipArchive::new(Cursor::new(bytes)).unwrap()
}

fn entry_bytes(archive: &mut zip::ZipArchive<Cursor<Vec<u8>>>, name: &str) -> Vec<u8> {
    let mut file = archive.by_name(name).unwrap();
    let mut out = Vec::new();
    file.read_to_end(&mut out).unwrap();
    out
}

fn read_parquet(bytes: Vec<u8>) -> (Vec<RecordBatch>, parquet::file::metadata::ParquetMetaData) {
    let builder = ParquetRecordBatchReaderBuilder::try_new(Bytes::from(bytes)).unwrap();
    let metadata = builder.metadata().as_ref().clone();
    let batches = builder.build().unwrap().collect::<Result<Vec<_>, _>>().unwrap();
    (batches, metadata)
}

fn household_rows() -> Vec<ExportRow> {
    let mut full = row(
        "obs_1",
        "household",
        41,
        j(r#"{"head_name": "Amina", "members": 4, "score": 1.5, "ok": true,
              "address": {"city": "Nairobi"}, "tags": ["a", 1], "big": 18446744073709551616}"#),
    );
    full.created_at = Some(ts("2025-06-25T12:00:00.123456Z"));
    full.updated_at = Some(ts("2025-06-25T12:05:10.456Z"));
    full.synced_at = ts("2025-06-25T12:06:00.001Z");
    full.geolocation = Some(r#"{"latitude": -1.2921, "longitude": 36.8219, "altitude": null}"#.to_owned());
    full.author = Some("alice".to_owned());
    full.device_id = Some("dev-1".to_owned());
    full.tags = Some(r#"["x","y, \"z\""]"#.to_owned());

    let mut sparse = row("obs_2", "household", 44, j(r#"{"members": 2, "score": 3, "big": "n/a"}"#));
    sparse.deleted = true;
    sparse.created_at = None;
    sparse.geolocation = Some("null".to_owned());
    vec![full, sparse]
}

fn write_parquet_zip(groups: &[(&str, Vec<ExportRow>)]) -> Vec<u8> {
    let mut zip = ExportZip::new(Vec::new()).with_modified_time(ts("2025-06-25T12:00:00Z"));
    let mut used = HashSet::new();
    for (form_type, rows) in groups {
        let mut inf = ColumnInference::new();
        rows.iter().for_each(|r| inf.observe_json_text(&r.data));
        let columns = inf.finish();
        let name = entry_name_for_form_type(form_type, &mut used);
        zip.start_parquet_entry(&format!("{name}.parquet")).unwrap();
        let mut writer = ParquetFormWriter::new(&mut zip, &columns).unwrap();
        for chunk in rows.chunks(1) {
            writer.write_batch(chunk).unwrap();
        }
        writer.finish().unwrap();
    }
    zip.finish().unwrap()
}

#[test]
fn parquet_zip_round_trip() {
    let other = vec![
        row("p1", "person/v2", 50, j(r#"{"age": 30}"#)),
        row("p2", "person/v2", 51, j(r#"{"age": 31, "nick": "Bo"}"#)),
    ];
    let bytes = write_parquet_zip(&[("household", household_rows()), ("person/v2", other)]);
    let mut archive = read_zip(bytes);
    let names: Vec<_> = archive.file_names().map(|n| n.unwrap().into_owned()).collect();
    assert_eq!(names.len(), 2);
    assert!(names.contains(&"household.parquet".to_owned()));
    assert!(names.contains(&"person_v2.parquet".to_owned()));
    {
        let entry = archive.by_name("household.parquet").unwrap();
        assert_eq!(entry.compression(), zip::CompressionMethod::Stored);
    }

    let (batches, metadata) = read_parquet(entry_bytes(&mut archive, "household.parquet"));
    assert_eq!(metadata.num_row_groups(), 1);
    assert_eq!(metadata.row_group(0).column(0).compression(), Compression::SNAPPY);
    let batch = arrow::compute::concat_batches(&batches[0].schema(), &batches).unwrap();
    assert_eq!(batch.num_rows(), 2);

    let schema = batch.schema();
    let fields: Vec<(String, DataType, bool)> =
        schema.fields().iter().map(|f| (f.name().clone(), f.data_type().clone(), f.is_nullable())).collect();
    let tsu = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
    let expected: Vec<(String, DataType, bool)> = [
        ("observation_id", DataType::Utf8, false),
        ("form_type", DataType::Utf8, false),
        ("form_version", DataType::Utf8, false),
        ("created_at", tsu.clone(), true),
        ("updated_at", tsu.clone(), true),
        ("deleted", DataType::Boolean, false),
        ("version", DataType::Int64, false),
        ("data", DataType::Utf8, false),
        ("synced_at", tsu.clone(), false),
        ("geolocation", DataType::Utf8, true),
        ("author", DataType::Utf8, true),
        ("device_id", DataType::Utf8, true),
        ("tags", DataType::Utf8, true),
        ("data_address.city", DataType::Utf8, true),
        ("data_big", DataType::Utf8, true),
        ("data_head_name", DataType::Utf8, true),
        ("data_members", DataType::Int64, true),
        ("data_ok", DataType::Boolean, true),
        ("data_score", DataType::Float64, true),
        ("data_tags", DataType::Utf8, true),
    ]
    .into_iter()
    .map(|(n, t, nullable)| (n.to_owned(), t, nullable))
    .collect();
    assert_eq!(fields, expected);

    let s = |name: &str| batch.column_by_name(name).unwrap().as_string::<i32>().clone();
    let tsc =
        |name: &str| batch.column_by_name(name).unwrap().as_primitive::<TimestampMicrosecondType>().clone();
    assert_eq!(s("observation_id").value(0), "obs_1");
    assert_eq!(s("observation_id").value(1), "obs_2");
    assert_eq!(s("form_type").value(1), "household");
    assert_eq!(s("form_version").value(0), "1.0");
    let created = tsc("created_at");
    assert_eq!(created.value(0), ts("2025-06-25T12:00:00.123456Z").timestamp_micros());
    assert!(created.is_null(1));
    let updated = tsc("updated_at");
    assert_eq!(updated.value(0), ts("2025-06-25T12:05:10.456Z").timestamp_micros());
    assert!(updated.is_null(1));
    let deleted = batch.column_by_name("deleted").unwrap().as_boolean().clone();
    assert!(!deleted.value(0));
    assert!(deleted.value(1));
    let version = batch.column_by_name("version").unwrap().as_primitive::<Int64Type>().clone();
    assert_eq!((version.value(0), version.value(1)), (41, 44));
    assert_eq!(s("data").value(0), household_rows()[0].data, "data holds the whole object");
    assert!(s("data").value(0).contains("18446744073709551616"), "numbers keep their text");
    assert_eq!(s("data").value(1), r#"{"big":"n/a","members":2,"score":3}"#);
    assert_eq!(tsc("synced_at").value(0), ts("2025-06-25T12:06:00.001Z").timestamp_micros());
    assert_eq!(s("geolocation").value(0), r#"{"altitude":null,"latitude":-1.2921,"longitude":36.8219}"#);
    assert!(s("geolocation").is_null(1), "JSON null geolocation is a null cell");
    assert_eq!(s("author").value(0), "alice");
    assert!(s("author").is_null(1));
    assert_eq!(s("device_id").value(0), "dev-1");
    assert!(s("device_id").is_null(1));
    assert_eq!(s("tags").value(0), r#"["x","y, \"z\""]"#);
    assert!(s("tags").is_null(1));

    assert_eq!(s("data_address.city").value(0), "Nairobi");
    assert!(s("data_address.city").is_null(1));
    assert_eq!(s("data_big").value(0), "18446744073709551616");
    assert_eq!(s("data_big").value(1), "n/a");
    assert_eq!(s("data_head_name").value(0), "Amina");
    let members = batch.column_by_name("data_members").unwrap().as_primitive::<Int64Type>().clone();
    assert_eq!((members.value(0), members.value(1)), (4, 2));
    let ok = batch.column_by_name("data_ok").unwrap().as_boolean().clone();
    assert!(ok.value(0));
    assert!(ok.is_null(1));
    let score = batch.column_by_name("data_score").unwrap().as_primitive::<Float64Type>().clone();
    assert_eq!((score.value(0), score.value(1)), (1.5, 3.0));
    assert_eq!(s("data_tags").value(0), r#"["a",1]"#);
    assert!(s("data_tags").is_null(1));

    let (batches, _) = read_parquet(entry_bytes(&mut archive, "person_v2.parquet"));
    let batch = arrow::compute::concat_batches(&batches[0].schema(), &batches).unwrap();
    let names: Vec<_> = batch.schema().fields().iter().skip(13).map(|f| f.name().clone()).collect();
    assert_eq!(names, ["data_age", "data_nick"]);
    let nick = batch.column_by_name("data_nick").unwrap().as_string::<i32>().clone();
    assert!(nick.is_null(0));
    assert_eq!(nick.value(1), "Bo");
    let version = batch.column_by_name("version").unwrap().as_primitive::<Int64Type>().clone();
    assert_eq!(version.values().to_vec(), vec![50, 51]);
}

#[test]
fn row_groups_hold_at_most_10000_rows_in_order() {
    let rows: Vec<ExportRow> =
        (0..25_000).map(|i| row(&format!("o{i}"), "f", i + 1, json!({ "n": i }))).collect();
    let mut zip = ExportZip::new(Vec::new());
    zip.start_parquet_entry("f.parquet").unwrap();
    let columns = vec![col("data_n", ColumnType::Int64)];
    let mut writer = ParquetFormWriter::new(&mut zip, &columns).unwrap();
    for chunk in rows.chunks(3_000) {
        writer.write_batch(chunk).unwrap();
    }
    writer.finish().unwrap();
    let mut archive = read_zip(zip.finish().unwrap());
    let (batches, metadata) = read_parquet(entry_bytes(&mut archive, "f.parquet"));
    let sizes: Vec<i64> = metadata.row_groups().iter().map(|g| g.num_rows()).collect();
    assert_eq!(sizes, vec![10_000, 10_000, 5_000]);
    let mut expected = 1;
    for batch in &batches {
        let version = batch.column_by_name("version").unwrap().as_primitive::<Int64Type>();
        let n = batch.column_by_name("data_n").unwrap().as_primitive::<Int64Type>();
        for i in 0..batch.num_rows() {
            assert_eq!(version.value(i), expected);
            assert_eq!(n.value(i), expected - 1);
            expected += 1;
        }
    }
    assert_eq!(expected, 25_001);
}

#[test]
fn empty_selection_is_a_valid_empty_zip() {
    let bytes = ExportZip::new(Vec::new()).finish().unwrap();
    assert_eq!(read_zip(bytes).len(), 0);
}

#[test]
fn form_without_rows_or_columns_is_a_valid_parquet() {
    let mut zip = ExportZip::new(Vec::new());
    zip.start_parquet_entry("_untyped.parquet").unwrap();
    ParquetFormWriter::new(&mut zip, &[]).unwrap().finish().unwrap();
    let mut archive = read_zip(zip.finish().unwrap());
    let (batches, metadata) = read_parquet(entry_bytes(&mut archive, "_untyped.parquet"));
    assert!(batches.iter().all(|b| b.num_rows() == 0));
    assert_eq!(metadata.file_metadata().schema_descr().num_columns(), 13);
}

/// Counts bytes and never keeps them, like the channel into the HTTP body.
struct CountingSink {
    bytes: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Write for CountingSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.bytes.fetch_add(buf.len(), std::sync::atomic::Ordering::Relaxed);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn memory_is_bounded_by_a_row_group_not_the_row_count() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let counter = std::sync::Arc::new(AtomicUsize::new(0));
    let mut zip = ExportZip::new(CountingSink { bytes: counter.clone() });
    zip.start_parquet_entry("big.parquet").unwrap();
    let template = json!({"name": "someone with a name", "n": 1, "x": 0.25, "flag": true});
    let mut inf = ColumnInference::new();
    inf.observe(&template);
    let columns = inf.finish();
    let mut writer = ParquetFormWriter::new(&mut zip, &columns).unwrap();
    let mut max_buffered = 0;
    let mut seen_at_group_ends = Vec::new();
    for b in 0..50 {
        let rows: Vec<ExportRow> = (0..1_000)
            .map(|i| {
                let n = b * 1_000 + i;
                let mut data = template.clone();
                data["n"] = json!(n);
                row(&format!("obs_{n:08}"), "big", n + 1, data)
            })
            .collect();
        writer.write_batch(&rows).unwrap();
        assert!(writer.buffered_rows() < MAX_ROW_GROUP_ROWS);
        max_buffered = max_buffered.max(writer.buffered_bytes());
        if (b + 1) % 10 == 0 {
            seen_at_group_ends.push(counter.load(Ordering::Relaxed));
        }
    }
    writer.finish().unwrap();
    zip.finish().unwrap();
    // Each full row group reached the sink as soon as it was complete.
    assert!(seen_at_group_ends.windows(2).all(|w| w[1] > w[0]), "{seen_at_group_ends:?}");
    assert!(seen_at_group_ends[0] > 10_000);
    // One row group's worth of encoded pages, far below 50,000 rows of data.
    assert!(max_buffered < 4 * 1024 * 1024, "buffered {max_buffered} bytes");
    assert!(counter.load(Ordering::Relaxed) > *seen_at_group_ends.last().unwrap_or(&0));
}

/// Writes a sample Parquet ZIP and CSV ZIP for external readers (tests/export_check.py):
/// `EXPORT_SAMPLE_DIR=/tmp/x cargo test --lib domain::export::tests::write_sample_zips -- --ignored`
#[test]
#[ignore = "writes files for the optional pyarrow/duckdb check"]
fn write_sample_zips() {
    let dir = std::path::PathBuf::from(std::env::var("EXPORT_SAMPLE_DIR").unwrap());
    std::fs::create_dir_all(&dir).unwrap();
    let mut many: Vec<ExportRow> = (0..12_345)
        .map(|i| row(&format!("p{i}"), "person/v2", i + 100, json!({ "age": i % 90, "w": 0.5 })))
        .collect();
    many[7].data = j(r#"{"age": 3, "w": 1, "nick": "Bo"}"#).to_string();
    let groups = [("household", household_rows()), ("person/v2", many)];
    std::fs::write(dir.join("parquet.zip"), write_parquet_zip(&groups)).unwrap();

    let mut zip = ExportZip::new(Vec::new());
    let mut used = HashSet::new();
    for (form_type, rows) in &groups {
        let mut inf = ColumnInference::new();
        rows.iter().for_each(|r| inf.observe_json_text(&r.data));
        let name = entry_name_for_form_type(form_type, &mut used);
        zip.start_csv_entry(&format!("{name}.csv")).unwrap();
        let mut writer = CsvFormWriter::new(&mut zip, &inf.finish()).unwrap();
        writer.write_batch(rows).unwrap();
        writer.finish().unwrap();
    }
    std::fs::write(dir.join("csv.zip"), zip.finish().unwrap()).unwrap();
    std::fs::write(dir.join("empty.zip"), ExportZip::new(Vec::new()).finish().unwrap()).unwrap();
}
