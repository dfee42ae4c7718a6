//! Exports (docs/api.md §13) and observation statistics (17.8). Records are inserted straight into
//! `records` (and `change_head` bumped) so these tests do not depend on the sync engine.

use std::io::{Cursor, Read};
use std::time::{Duration, Instant};

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Float64Type, Int64Type, TimeUnit, TimestampMicrosecondType};
use bytes::Bytes;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::{assert_error, header, wait_for_job, TestApp};

/// A direct connection to the test app's database.
async fn db(app: &TestApp) -> tokio_postgres::Client {
    let (client, conn) =
        tokio_postgres::connect(&app.db_conn, tokio_postgres::NoTls).await.expect("connect to test db");
    tokio::spawn(conn);
    client
}

/// One observation to insert; `Obs::new(id, form_type, data)` then adjust fields.
#[derive(Clone)]
struct Obs {
    id: String,
    form_type: String,
    data: Value,
    deleted: bool,
    created_at: Option<&'static str>,
    geolocation: Option<Value>,
    author: Option<&'static str>,
    device_id: Option<&'static str>,
    tags: Option<Value>,
}

impl Obs {
    fn new(id: &str, form_type: &str, data: Value) -> Obs {
        Obs {
            id: id.into(),
            form_type: form_type.into(),
            data,
            deleted: false,
            created_at: Some("2025-06-25T12:00:00Z"),
            geolocation: None,
            author: None,
            device_id: None,
            tags: None,
        }
    }
}

/// Inserts (or replaces) one record as the next change and returns its change_id.
async fn insert(db: &tokio_postgres::Client, o: &Obs) -> i64 {
    let created: Option<chrono::DateTime<chrono::Utc>> =
        o.created_at.map(|t| chrono::DateTime::parse_from_rfc3339(t).unwrap().into());
    let row = db
        .query_one(
            "WITH h AS (UPDATE change_head SET head = head + 1 RETURNING head)
             INSERT INTO records (id, form_type, form_version, data, deleted, created_at, updated_at,
                                  synced_at, geolocation, author, device_id, tags, change_id, created_by)
             SELECT $1, $2, '1.0', $3::json, $4, $5, $5, now(), $6, $7, $8, $9, h.head, 'admin' FROM h
             ON CONFLICT (id) DO UPDATE SET form_type = EXCLUDED.form_type, data = EXCLUDED.data,
                deleted = EXCLUDED.deleted, change_id = EXCLUDED.change_id, synced_at = now()
             RETURNING change_id",
            &[
                &o.id,
                &o.form_type,
                &o.data,
                &o.deleted,
                &created,
                &o.geolocation,
                &o.author,
                &o.device_id,
                &o.tags,
            ],
        )
        .await
        .expect("insert record");
    row.get(0)
}

/// `n` records of form type `bulk` with `data = {n, half, label, pad}`, as changes head+1..head+n.
pub(crate) async fn insert_bulk(db: &tokio_postgres::Client, n: i64, pad: usize) {
    db.batch_execute(&format!(
        "BEGIN;
         INSERT INTO records (id, form_type, form_version, data, deleted, created_at, updated_at,
                              synced_at, change_id, created_by)
         SELECT 'bulk_' || g, 'bulk', '1', jsonb_build_object('n', g, 'half', g / 2.0,
                    'label', 'row ' || g, 'pad', repeat('x', {pad})),
                false, now(), now(), now(), h.head + g, 'admin'
         FROM (SELECT head FROM change_head) h, generate_series(1, {n}) g;
         UPDATE change_head SET head = head + {n};
         COMMIT;"
    ))
    .await
    .expect("bulk insert");
}

async fn get(app: &TestApp, path: &str, token: &str) -> reqwest::Response {
    app.send(Method::GET, path, Some(token), None).await
}

/// The entries of a ZIP body as (name, compression, bytes), in archive order.
fn unzip(bytes: &[u8]) -> Vec<(String, zip::CompressionMethod, Vec<u8>)> {
    let mut archive = zip::ZipArchive::new(Cursor::new(bytes)).expect("a valid ZIP");
    (0..archive.len())
        .map(|i| {
            let mut entry = archive.by_index(i).expect("entry");
            let mut buf = Vec::new();
            entry.read_to_end(&mut buf).expect("entry bytes");
            (entry.name().expect("entry name").to_string(), entry.compression(), buf)
        })
        .collect()
}

/// A Parquet file as one record batch, plus its row-group count.
fn read_parquet(bytes: Vec<u8>) -> (RecordBatch, usize) {
    let builder = ParquetRecordBatchReaderBuilder::try_new(Bytes::from(bytes)).expect("parquet");
    let groups = builder.metadata().num_row_groups();
    let schema = builder.schema().clone();
    let batches: Vec<RecordBatch> = builder.build().expect("reader").map(|b| b.expect("batch")).collect();
    (arrow::compute::concat_batches(&schema, &batches).expect("concat"), groups)
}

fn strings(batch: &RecordBatch, name: &str) -> Vec<Option<String>> {
    let col = batch.column_by_name(name).unwrap_or_else(|| panic!("column {name}"));
    col.as_string::<i32>().iter().map(|v| v.map(str::to_owned)).collect()
}

fn ints(batch: &RecordBatch, name: &str) -> Vec<Option<i64>> {
    batch.column_by_name(name).unwrap().as_primitive::<Int64Type>().iter().collect()
}

fn bools(batch: &RecordBatch, name: &str) -> Vec<Option<bool>> {
    batch.column_by_name(name).unwrap().as_boolean().iter().collect()
}

fn data_type(batch: &RecordBatch, name: &str) -> DataType {
    batch.schema().field_with_name(name).unwrap().data_type().clone()
}

fn ndjson(text: &str) -> Vec<Value> {
    text.lines().map(|l| serde_json::from_str(l).expect("one JSON object per line")).collect()
}

/// The household fixture of several tests: typed, nested, mixed, null and deleted values.
async fn household_fixture(app: &TestApp) -> Vec<i64> {
    let db = db(app).await;
    let mut h1 = Obs::new(
        "h1",
        "household",
        json!({"name": "Amina", "members": 4, "score": 1.5, "ok": true,
               "address": {"city": "Nairobi", "geo": {"zone": 3}}, "kids": ["a", "b"], "mixed": 1}),
    );
    h1.created_at = Some("2025-06-25T12:00:00.123Z");
    h1.geolocation = Some(json!({"latitude": -1.5, "longitude": 36.8}));
    h1.author = Some("enum1");
    h1.device_id = Some("dev-1");
    h1.tags = Some(json!(["x", "y"]));
    let mut h2 = Obs::new("h2", "household", json!({"name": "Juma", "members": 2, "score": 2, "ok": false}));
    h2.created_at = None;
    let mut h3 = Obs::new("h3", "household", json!({"name": "Gone", "mixed": "text", "members": null}));
    h3.deleted = true;
    let p1 = Obs::new("p1", "person", json!({"age": 30}));
    let u1 = Obs::new("u1", "", json!({}));
    let mut ids = Vec::new();
    for o in [&h1, &h2, &h3, &p1, &u1] {
        ids.push(insert(&db, o).await);
    }
    ids
}

#[actix_web::test]
async fn parquet_export_matches_inserted_data_column_by_column() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let versions = household_fixture(&app).await;

    let res = get(&app, "/dataexport/parquet", &admin).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, "content-type"), "application/zip");
    assert!(header(&res, "content-disposition").contains("filename=\"observations_export.zip\""));
    assert_eq!(header(&res, "x-export-change-id"), versions[4].to_string());
    let entries = unzip(&res.bytes().await.unwrap());
    let names: Vec<&str> = entries.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(names, ["_untyped.parquet", "household.parquet", "person.parquet"]);
    assert!(entries.iter().all(|e| e.1 == zip::CompressionMethod::Stored));

    let (b, _) = read_parquet(entries[1].2.clone());
    let columns: Vec<String> = b.schema().fields().iter().map(|f| f.name().clone()).collect();
    assert_eq!(
        columns,
        [
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
            "data_address.city",
            "data_address.geo.zone",
            "data_kids",
            "data_members",
            "data_mixed",
            "data_name",
            "data_ok",
            "data_score",
        ]
    );
    assert_eq!(b.num_rows(), 3);
    assert_eq!(strings(&b, "observation_id"), [Some("h1".into()), Some("h2".into()), Some("h3".into())]);
    assert_eq!(ints(&b, "version"), versions[..3].iter().map(|v| Some(*v)).collect::<Vec<_>>());
    assert_eq!(bools(&b, "deleted"), [Some(false), Some(false), Some(true)]);
    let ts = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
    assert_eq!(data_type(&b, "created_at"), ts);
    let created: Vec<Option<i64>> =
        b.column_by_name("created_at").unwrap().as_primitive::<TimestampMicrosecondType>().iter().collect();
    let h1_created =
        chrono::DateTime::parse_from_rfc3339("2025-06-25T12:00:00.123Z").unwrap().timestamp_micros();
    assert_eq!(created[0], Some(h1_created));
    assert_eq!(created[1], None, "a null created_at stays null");
    assert_eq!(
        strings(&b, "geolocation"),
        [Some(json!({"latitude": -1.5, "longitude": 36.8}).to_string()), None, None]
    );
    assert_eq!(strings(&b, "author"), [Some("enum1".into()), None, None]);
    assert_eq!(strings(&b, "device_id"), [Some("dev-1".into()), None, None]);
    assert_eq!(strings(&b, "tags"), [Some(r#"["x","y"]"#.into()), None, None]);
    let data0: Value = serde_json::from_str(strings(&b, "data")[0].as_deref().unwrap()).unwrap();
    assert_eq!(data0["address"]["geo"]["zone"], 3);

    assert_eq!(data_type(&b, "data_members"), DataType::Int64);
    assert_eq!(ints(&b, "data_members"), [Some(4), Some(2), None]);
    assert_eq!(data_type(&b, "data_score"), DataType::Float64);
    let score: Vec<Option<f64>> =
        b.column_by_name("data_score").unwrap().as_primitive::<Float64Type>().iter().collect();
    assert_eq!(score, [Some(1.5), Some(2.0), None]);
    assert_eq!(data_type(&b, "data_ok"), DataType::Boolean);
    assert_eq!(bools(&b, "data_ok"), [Some(true), Some(false), None]);
    assert_eq!(strings(&b, "data_address.city"), [Some("Nairobi".into()), None, None]);
    assert_eq!(data_type(&b, "data_address.geo.zone"), DataType::Int64);
    assert_eq!(strings(&b, "data_kids"), [Some(r#"["a","b"]"#.into()), None, None]);
    assert_eq!(data_type(&b, "data_mixed"), DataType::Utf8, "integer and string mixed -> UTF8");
    assert_eq!(strings(&b, "data_mixed"), [Some("1".into()), None, Some("text".into())]);
    assert_eq!(strings(&b, "data_name")[2].as_deref(), Some("Gone"), "deleted rows are exported");

    let (person, _) = read_parquet(entries[2].2.clone());
    assert_eq!(ints(&person, "data_age"), [Some(30)]);
    let (untyped, _) = read_parquet(entries[0].2.clone());
    assert_eq!(strings(&untyped, "form_type"), [Some(String::new())]);
    assert_eq!(untyped.num_columns(), 13, "no data columns for empty data");

    if let Some(dir) = std::env::var_os("EXPORT_SAMPLE_DIR") {
        // For tests/export_check.py: ZIPs produced by the server, kept on request.
        for (path, file) in
            [("/dataexport/parquet", "mixed_parquet.zip"), ("/data/export?format=csv", "mixed_csv.zip")]
        {
            let bytes = get(&app, path, &admin).await.bytes().await.unwrap();
            std::fs::write(std::path::Path::new(&dir).join(file), bytes).unwrap();
        }
    }

    // The same export under /api and /api/v1, and as GET /data/export (default parquet).
    for path in ["/api/dataexport/parquet", "/api/v1/data/export", "/data/export?format=parquet"] {
        let res = get(&app, path, &admin).await;
        assert_eq!(res.status(), StatusCode::OK, "{path}");
        let names: Vec<String> = unzip(&res.bytes().await.unwrap()).into_iter().map(|e| e.0).collect();
        assert_eq!(names, ["_untyped.parquet", "household.parquet", "person.parquet"], "{path}");
    }
}

#[actix_web::test]
async fn csv_and_ndjson_formats() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let versions = household_fixture(&app).await;

    let res = get(&app, "/data/export?format=csv", &admin).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, "content-type"), "application/zip");
    assert!(header(&res, "content-disposition").contains("filename=\"observations_export_csv.zip\""));
    assert_eq!(header(&res, "x-export-change-id"), versions[4].to_string());
    let entries = unzip(&res.bytes().await.unwrap());
    let names: Vec<&str> = entries.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(names, ["_untyped.csv", "household.csv", "person.csv"]);
    assert!(entries.iter().all(|e| e.1 == zip::CompressionMethod::Deflated));
    let household = String::from_utf8(entries[1].2.clone()).unwrap();
    let lines: Vec<&str> = household.split("\r\n").filter(|l| !l.is_empty()).collect();
    assert_eq!(lines.len(), 4, "header + 3 rows: {household}");
    assert!(
        lines[0].starts_with("observation_id,form_type,form_version,created_at,updated_at,deleted,version,")
    );
    assert!(lines[0].ends_with(",data_mixed,data_name,data_ok,data_score"));
    assert!(lines[1].starts_with(&format!(
        "h1,household,1.0,2025-06-25T12:00:00.123Z,2025-06-25T12:00:00.123Z,false,{},",
        versions[0]
    )));
    assert!(lines[3].starts_with("h3,household,1.0,"));
    assert!(lines[3].contains(",true,"));

    let res = get(&app, "/data/export?format=json", &admin).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, "content-type"), "application/x-ndjson");
    assert!(header(&res, "content-disposition").contains("filename=\"observations_export.ndjson\""));
    let records = ndjson(&res.text().await.unwrap());
    let ids: Vec<&str> = records.iter().map(|r| r["observation_id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["h1", "h2", "h3", "p1", "u1"], "ordered by change_id across form types");
    let h1 = &records[0];
    assert_eq!(h1["form_type"], "household");
    assert_eq!(h1["version"], versions[0]);
    assert_eq!(h1["created_at"], "2025-06-25T12:00:00.123Z");
    assert_eq!(h1["data"]["address"]["city"], "Nairobi");
    assert_eq!(h1["author"], "enum1");
    assert_eq!(h1["device_id"], "dev-1");
    assert_eq!(h1["tags"], json!(["x", "y"]));
    assert_eq!(records[1]["created_at"], Value::Null);
    assert_eq!(records[2]["deleted"], true);

    for bad in ["xml", "", "raw-json"] {
        let (status, body) =
            app.call(Method::GET, &format!("/data/export?format={bad}"), Some(&admin), None).await;
        assert_error(status, &body, 400, "BAD_REQUEST");
    }
}

#[actix_web::test]
async fn filters_select_form_types_changes_and_tombstones() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let versions = household_fixture(&app).await;
    let ids = |path: String| {
        let app = &app;
        let admin = &admin;
        async move {
            let res = get(app, &path, admin).await;
            assert_eq!(res.status(), StatusCode::OK, "{path}");
            ndjson(&res.text().await.unwrap())
                .iter()
                .map(|r| r["observation_id"].as_str().unwrap().to_string())
                .collect::<Vec<_>>()
        }
    };
    let base = "/data/export?format=json";
    assert_eq!(ids(format!("{base}&form_type=person,household")).await, ["h1", "h2", "h3", "p1"]);
    assert_eq!(ids(format!("{base}&form_type=person&form_type=household")).await, ["h1", "h2", "h3", "p1"]);
    assert_eq!(ids(format!("{base}&form_type=person")).await, ["p1"]);
    assert!(ids(format!("{base}&form_type=nothing")).await.is_empty());
    assert_eq!(ids(format!("{base}&since_change_id={}", versions[2])).await, ["p1", "u1"]);
    assert_eq!(ids(format!("{base}&include_deleted=false")).await, ["h1", "h2", "p1", "u1"]);
    assert_eq!(ids(format!("{base}&include_deleted=true&since_change_id=0")).await.len(), 5);
    assert_eq!(
        ids(format!("{base}&form_type=household&include_deleted=false&since_change_id={}", versions[0]))
            .await,
        ["h2"]
    );

    // Filters apply per file in the ZIP formats too.
    let res = get(&app, "/dataexport/parquet?form_type=household&include_deleted=false", &admin).await;
    let entries = unzip(&res.bytes().await.unwrap());
    assert_eq!(entries.len(), 1);
    let (b, _) = read_parquet(entries[0].2.clone());
    assert_eq!(strings(&b, "observation_id"), [Some("h1".into()), Some("h2".into())]);
    assert!(
        b.column_by_name("data_mixed").is_some_and(|c| c.data_type() == &DataType::Int64),
        "inference sees only the selected rows"
    );

    for bad in [
        "since_change_id=-1",
        "since_change_id=abc",
        "since_change_id=1.5",
        "include_deleted=maybe",
        "include_deleted=1",
    ] {
        for path in ["/data/export", "/dataexport/parquet"] {
            let (status, body) = app.call(Method::GET, &format!("{path}?{bad}"), Some(&admin), None).await;
            assert_error(status, &body, 400, "BAD_REQUEST");
        }
    }
}

#[actix_web::test]
async fn empty_exports_are_valid_empty_archives() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    for (path, ct) in [
        ("/dataexport/parquet", "application/zip"),
        ("/data/export?format=csv", "application/zip"),
        ("/dataexport/raw-json", "application/zip"),
    ] {
        let res = get(&app, path, &admin).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(header(&res, "content-type"), ct);
        assert_eq!(header(&res, "x-export-change-id"), "0");
        assert!(unzip(&res.bytes().await.unwrap()).is_empty(), "{path}");
    }
    let res = get(&app, "/data/export?format=json", &admin).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.text().await.unwrap(), "");

    // HEAD: the same headers, no body, no export slot needed.
    let res = app.send(Method::HEAD, "/dataexport/parquet", Some(&admin), None).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, "x-export-change-id"), "0");
    assert!(res.bytes().await.unwrap().is_empty());
}

#[actix_web::test]
async fn export_routes_require_a_token_and_read_only_suffices() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let reader = app.user_token(&admin, "reader", "read-only").await;
    for (method, path) in [
        (Method::GET, "/dataexport/parquet"),
        (Method::GET, "/data/export?format=json"),
        (Method::GET, "/dataexport/raw-json"),
        (Method::GET, "/stats/observations"),
        (Method::POST, "/dataexport/jobs"),
        (Method::GET, "/dataexport/jobs/abc"),
        (Method::GET, "/dataexport/jobs/abc/download"),
    ] {
        let (status, body) = app.call(method.clone(), path, None, None).await;
        assert_error(status, &body, 401, "MISSING_TOKEN");
        let (status, body) = app.call(method.clone(), path, Some("not-a-token"), None).await;
        assert_error(status, &body, 401, "INVALID_TOKEN");
    }
    for path in
        ["/dataexport/parquet", "/data/export?format=csv", "/dataexport/raw-json", "/stats/observations"]
    {
        let res = get(&app, path, &reader).await;
        assert_eq!(res.status(), StatusCode::OK, "{path}");
        let _ = res.bytes().await;
    }
    let (status, body) = app.call(Method::POST, "/dataexport/parquet", Some(&reader), None).await;
    assert_error(status, &body, 405, "METHOD_NOT_ALLOWED");
}

#[actix_web::test]
async fn raw_json_has_one_file_per_live_observation() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    household_fixture(&app).await;
    let db = db(&app).await;
    insert(&db, &Obs::new("a/b c", "house hold", json!({"k": 1}))).await;

    let res = get(&app, "/dataexport/raw-json", &admin).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, "content-type"), "application/zip");
    let entries = unzip(&res.bytes().await.unwrap());
    let mut names: Vec<&str> = entries.iter().map(|e| e.0.as_str()).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "_untyped/u1.json",
            "house_hold/a_b_c.json",
            "household/h1.json",
            "household/h2.json",
            "person/p1.json"
        ],
        "no deleted observation (h3), names sanitised"
    );
    let h1 = entries.iter().find(|e| e.0 == "household/h1.json").unwrap();
    let h1: Value = serde_json::from_slice(&h1.2).unwrap();
    assert_eq!(h1["observation_id"], "h1");
    assert_eq!(h1["data"]["members"], 4);
    assert_eq!(h1["author"], "enum1");
    assert_eq!(h1["device_id"], "dev-1");
    assert_eq!(h1["tags"], json!(["x", "y"]));
    assert_eq!(h1["geolocation"]["latitude"], -1.5);
    assert_eq!(h1["deleted"], false);
}

#[actix_web::test]
async fn export_job_runs_from_start_to_download() {
    export_job_runs_from_start_to_download_on(TestApp::spawn().await).await;
}

/// Also run against the S3 backend (tests/api/storage.rs).
pub(crate) async fn export_job_runs_from_start_to_download_on(app: TestApp) {
    let admin = app.admin_token().await;
    let reader = app.user_token(&admin, "reader", "read-only").await;
    let other = app.user_token(&admin, "other", "read-write").await;
    let versions = household_fixture(&app).await;

    let (status, body) = app
        .call(
            Method::POST,
            "/dataexport/jobs?include_deleted=false",
            Some(&reader),
            Some(json!({"format": "csv", "form_type": ["household", "person"]})),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let id = body["job_id"].as_str().unwrap().to_string();
    assert!(["queued", "running", "done"].contains(&body["state"].as_str().unwrap()));
    assert_eq!(body["format"], "csv");

    let done = wait_for_job(&app, &reader, &id).await;
    assert_eq!(done["state"], "done", "{done}");
    assert_eq!(done["rows_total"], 3);
    assert_eq!(done["rows_done"], 3);
    assert_eq!(done["change_id"], versions[4]);
    assert!(done["expires_at"].is_string());
    assert_eq!(done["download_url"], format!("/dataexport/jobs/{id}/download"));

    let res = get(&app, &format!("/dataexport/jobs/{id}/download"), &reader).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, "content-type"), "application/zip");
    assert_eq!(header(&res, "x-export-change-id"), versions[4].to_string());
    let entries = unzip(&res.bytes().await.unwrap());
    let names: Vec<&str> = entries.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(names, ["household.csv", "person.csv"]);
    let household = String::from_utf8(entries[0].2.clone()).unwrap();
    assert_eq!(household.split("\r\n").filter(|l| !l.is_empty()).count(), 3, "header + h1 + h2");

    // The owner and admins may read it; anybody else sees 404, like an unknown id.
    let (status, _) = app.call(Method::GET, &format!("/dataexport/jobs/{id}"), Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK);
    for path in [format!("/dataexport/jobs/{id}"), format!("/dataexport/jobs/{id}/download")] {
        let (status, body) = app.call(Method::GET, &path, Some(&other), None).await;
        assert_error(status, &body, 404, "NOT_FOUND");
    }
    let (status, body) = app.call(Method::GET, "/dataexport/jobs/nope", Some(&admin), None).await;
    assert_error(status, &body, 404, "NOT_FOUND");

    // Parquet and NDJSON jobs, parameters in the query only.
    let (status, body) =
        app.call(Method::POST, "/dataexport/jobs?format=json&form_type=person", Some(&admin), None).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let id = body["job_id"].as_str().unwrap().to_string();
    assert_eq!(wait_for_job(&app, &admin, &id).await["state"], "done");
    let res = get(&app, &format!("/dataexport/jobs/{id}/download"), &admin).await;
    assert_eq!(header(&res, "content-type"), "application/x-ndjson");
    let lines = ndjson(&res.text().await.unwrap());
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["observation_id"], "p1");

    for bad in [json!({"format": "xml"}), json!({"since_change_id": -3}), json!({"form_type": 5}), json!([1])]
    {
        let (status, body) = app.call(Method::POST, "/dataexport/jobs", Some(&admin), Some(bad)).await;
        assert_error(status, &body, 400, "BAD_REQUEST");
    }
}

#[actix_web::test]
async fn finished_job_files_expire_after_the_ttl() {
    // A TTL far longer than a loaded machine takes to notice the job is done; the clock moves past it.
    let app = TestApp::spawn_with(&[("EXPORT_JOB_TTL_SECONDS", "60")]).await;
    let admin = app.admin_token().await;
    household_fixture(&app).await;
    let (status, body) = app.call(Method::POST, "/dataexport/jobs", Some(&admin), Some(json!({}))).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let id = body["job_id"].as_str().unwrap().to_string();
    assert_eq!(wait_for_job(&app, &admin, &id).await["state"], "done");
    let file = app.data_root.path().join("exports").join(format!("{id}.zip"));
    assert!(file.is_file());
    app.advance_clock(Duration::from_secs(61));
    let (status, body) =
        app.call(Method::GET, &format!("/dataexport/jobs/{id}/download"), Some(&admin), None).await;
    assert_error(status, &body, 404, "NOT_FOUND");
    assert!(!file.exists(), "the expired file is removed");
}

#[actix_web::test]
async fn a_job_started_on_one_node_is_polled_and_downloaded_on_another() {
    let a = TestApp::spawn_with(&[("NODE_ID", "node-a")]).await;
    let data_root = a.data_root.path().display().to_string();
    let b = TestApp::spawn_on(a.db_conn.clone(), &[("NODE_ID", "node-b"), ("DATA_ROOT", &data_root)]).await;
    let admin = a.admin_token().await;
    let reader = a.user_token(&admin, "reader", "read-only").await;
    let versions = household_fixture(&a).await;

    let (status, body) =
        a.call(Method::POST, "/dataexport/jobs?format=json&include_deleted=false", Some(&reader), None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let id = body["job_id"].as_str().unwrap().to_string();
    // The other node knows the job at once, whatever its state.
    let (status, seen) = b.call(Method::GET, &format!("/dataexport/jobs/{id}"), Some(&reader), None).await;
    assert_eq!(status, StatusCode::OK, "{seen}");
    assert_eq!(seen["owner"], "reader");
    let done = wait_for_job(&b, &reader, &id).await;
    assert_eq!(done["state"], "done", "{done}");
    assert_eq!(done["change_id"], versions[4]);
    assert_eq!(done["rows_done"], done["rows_total"]);
    let res = get(&b, &format!("/dataexport/jobs/{id}/download"), &reader).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, "x-export-change-id"), versions[4].to_string());
    let from_b = res.bytes().await.unwrap();
    let from_a = get(&a, &format!("/dataexport/jobs/{id}/download"), &reader).await.bytes().await.unwrap();
    assert_eq!(from_a, from_b);
    assert!(!ndjson(std::str::from_utf8(&from_b).unwrap()).is_empty());
    // Other users still get 404 on either node.
    let other = a.user_token(&admin, "other", "read-write").await;
    for app in [&a, &b] {
        let (status, body) =
            app.call(Method::GET, &format!("/dataexport/jobs/{id}"), Some(&other), None).await;
        assert_error(status, &body, 404, "NOT_FOUND");
    }
}

#[actix_web::test]
async fn a_job_whose_node_died_becomes_failed_with_a_message() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    // What a node killed mid-export leaves: its job running, its lease run out (it renews no more).
    db(&app)
        .await
        .batch_execute(
            "INSERT INTO export_jobs (id, owner, format, filters, state, rows_done, node, lease_expires_at,
                                      file_name, created_at, started_at)
             VALUES ('ghost', 'admin', 'csv', '{}', 'running', 5, 'dead-node:8080', now() - interval '1 second',
                     'ghost.zip', now() - interval '1 minute', now() - interval '1 minute')",
        )
        .await
        .expect("insert an abandoned job");
    let started = Instant::now();
    let failed = wait_for_job(&app, &admin, "ghost").await;
    assert!(started.elapsed() < Duration::from_secs(60), "failed within 60 s");
    assert_eq!(failed["state"], "failed", "{failed}");
    let error = failed["error"].as_str().expect("a message");
    assert!(error.contains("dead-node:8080") && error.contains("again"), "{error}");
    assert!(failed["finished_at"].is_string() && failed["expires_at"].is_string(), "{failed}");
    let (status, body) = app.call(Method::GET, "/dataexport/jobs/ghost/download", Some(&admin), None).await;
    assert_error(status, &body, 404, "NOT_FOUND");
}

#[actix_web::test]
async fn twenty_thousand_rows_stream_in_several_row_groups_from_one_snapshot() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let db = db(&app).await;
    insert_bulk(&db, 20_000, 16).await;

    let res = get(&app, "/dataexport/parquet", &admin).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, "x-export-change-id"), "20000");
    // The snapshot was taken before the headers went out: a later change is not in this export.
    insert(&db, &Obs::new("late", "bulk", json!({"n": 0}))).await;
    let entries = unzip(&res.bytes().await.unwrap());
    assert_eq!(entries.len(), 1);
    let (b, groups) = read_parquet(entries[0].2.clone());
    assert_eq!(b.num_rows(), 20_000);
    assert_eq!(groups, 2, "row groups of at most 10,000 rows");
    let versions = ints(&b, "version");
    assert!(versions.windows(2).all(|w| w[0] < w[1]), "ordered by change_id");
    assert_eq!(versions[0], Some(1));
    assert_eq!(versions[19_999], Some(20_000));
    assert_eq!(ints(&b, "data_n")[12_345], Some(12_346));
    assert_eq!(data_type(&b, "data_half"), DataType::Float64);
    assert_eq!(strings(&b, "data_label")[19_999].as_deref(), Some("row 20000"));

    // One type's rows are read in keyset pages of 1,000: a start inside a page still yields every
    // later row once, in order.
    let res = get(&app, "/dataexport/parquet?since_change_id=12345", &admin).await;
    let entries = unzip(&res.bytes().await.unwrap());
    let (b, _) = read_parquet(entries[0].2.clone());
    let versions = ints(&b, "version");
    assert_eq!(versions.len(), 20_001 - 12_345, "12,346 to 20,001: the late row is in this snapshot");
    assert!(versions.windows(2).all(|w| w[0] < w[1]), "ordered by change_id");
    assert_eq!(versions[0], Some(12_346));

    if let Some(dir) = std::env::var_os("EXPORT_SAMPLE_DIR") {
        // For tests/export_check.py: a ZIP produced by the server, kept on request.
        let res = get(&app, "/dataexport/parquet", &admin).await;
        std::fs::write(std::path::Path::new(&dir).join("parquet.zip"), res.bytes().await.unwrap()).unwrap();
        let res = get(&app, "/data/export?format=csv", &admin).await;
        std::fs::write(std::path::Path::new(&dir).join("csv.zip"), res.bytes().await.unwrap()).unwrap();
    }
}

/// Polls until an export with the single slot succeeds again.
async fn wait_for_free_slot(app: &TestApp, token: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let res = get(app, "/data/export?format=json&form_type=none", token).await;
        if res.status() == StatusCode::OK {
            assert_eq!(res.text().await.unwrap(), "");
            return;
        }
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(Instant::now() < deadline, "the export slot was never freed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[actix_web::test]
async fn slots_are_limited_and_a_dropped_download_frees_its_slot() {
    let app = TestApp::spawn_with(&[("EXPORT_MAX_CONCURRENT", "1")]).await;
    let admin = app.admin_token().await;
    let db = db(&app).await;
    // ~12 MB of NDJSON: far more than the body channel and the socket buffers hold.
    insert_bulk(&db, 20_000, 600).await;

    // An export whose body is not read holds the only slot.
    let held = get(&app, "/data/export?format=json", &admin).await;
    assert_eq!(held.status(), StatusCode::OK);
    for path in ["/dataexport/parquet", "/data/export?format=csv", "/dataexport/raw-json"] {
        let res = get(&app, path, &admin).await;
        assert_eq!(res.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("5"));
        let status = res.status();
        let body: Value = res.json().await.unwrap();
        assert_error(status, &body, 429, "RATE_LIMITED");
    }
    // Jobs queue instead of failing.
    let (status, job) =
        app.call(Method::POST, "/dataexport/jobs?format=json&form_type=none", Some(&admin), None).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let (_, view) = app
        .call(
            Method::GET,
            &format!("/dataexport/jobs/{}", job["job_id"].as_str().unwrap()),
            Some(&admin),
            None,
        )
        .await;
    assert_eq!(view["state"], "queued");

    // The client reads a little, then goes away: the export stops and the slot comes back.
    let mut held = held;
    let first = held.chunk().await.unwrap().expect("a first chunk");
    assert!(first.starts_with(b"{"));
    drop(held);
    let id = job["job_id"].as_str().unwrap().to_string();
    assert_eq!(wait_for_job(&app, &admin, &id).await["state"], "done", "the queued job ran");
    wait_for_free_slot(&app, &admin).await;

    // And a full export succeeds afterwards.
    let res = get(&app, "/dataexport/parquet", &admin).await;
    assert_eq!(res.status(), StatusCode::OK);
    let entries = unzip(&res.bytes().await.unwrap());
    assert_eq!(read_parquet(entries[0].2.clone()).0.num_rows(), 20_000);
}

#[actix_web::test]
async fn a_failure_mid_stream_aborts_the_response() {
    let app = TestApp::spawn_with(&[("EXPORT_MAX_CONCURRENT", "1")]).await;
    let admin = app.admin_token().await;
    let db = db(&app).await;
    insert_bulk(&db, 20_000, 600).await;

    // Headers are out and the export is parked on a full body channel, inside its transaction.
    let res = get(&app, "/data/export?format=json", &admin).await;
    assert_eq!(res.status(), StatusCode::OK);
    let killed = db
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .get::<_, i64>(0);
    assert_eq!(killed, 1, "exactly the export's connection is in a transaction");
    // The export fails at its next fetch: the client gets a broken body, never a complete one.
    assert!(res.bytes().await.is_err(), "a failed export must not end like a complete one");
    wait_for_free_slot(&app, &admin).await;
}

/// One CSV record (RFC 4180) split into fields.
fn csv_fields(record: &str) -> Vec<String> {
    let (mut fields, mut field, mut quoted, mut chars) =
        (Vec::new(), String::new(), false, record.chars().peekable());
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            ('"', _) => quoted = !quoted,
            (',', false) => fields.push(std::mem::take(&mut field)),
            (c, _) => field.push(c),
        }
    }
    fields.push(field);
    fields
}

/// The leaves of `data` by column name, first non-null in key order (docs/api.md §13.2).
fn leaves(data: &Value) -> Vec<(String, Value)> {
    fn walk(map: &serde_json::Map<String, Value>, name: &str, out: &mut Vec<(String, Value)>) {
        for (key, value) in map {
            let path = if name.is_empty() { key.clone() } else { format!("{name}.{key}") };
            match value {
                Value::Object(inner) => walk(inner, &path, out),
                Value::Null => {}
                leaf if !out.iter().any(|(n, _)| *n == format!("data_{path}")) => {
                    out.push((format!("data_{path}"), leaf.clone()))
                }
                _ => {}
            }
        }
    }
    let mut out = Vec::new();
    if let Value::Object(map) = data {
        walk(map, "", &mut out);
    }
    out
}

/// The writers take the stored `data` text as it is when it is already what serialising its value
/// gives, and go through the value otherwise: every exported row must hold what the stored text
/// means, whichever way it went.
#[actix_web::test]
async fn every_exported_row_holds_its_stored_data_whatever_its_text() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let db = db(&app).await;
    let texts = [
        r#"{"a":1,"b":{"c":[1,{"d":2}],"e":null},"f":"x","g":true}"#,
        r#"{"a": 2, "b": {"c": []}, "f": "spaced", "g": false}"#,
        r#"{"g":true,"f":"unsorted","a":3}"#,
        r#"{"a":4,"a":5,"f":"repeated"}"#,
        r#"{"a":6,"h":1E+5,"i":1e5,"j":-0,"k":0.50,"l":123456789012345678901234567890,"m":1e+5}"#,
        r#"{"a":7,"f":"tab\there \"q\" back\\slash \u001f é 😀","n":"\/"}"#,
        r#"{"a":8,"f":"\u0041\u00e9\ud83d\ude00"}"#,
        r#"{"\n":1,"a":9,"a\"b":{"x":true},"é":false}"#,
        r#"{"a":10,"b":{"c":"deep","d":{"e":{"f":1}}},"b.c":"collides"}"#,
        "[1,2]",
        r#""text""#,
        "{}",
    ];
    for (i, text) in texts.iter().enumerate() {
        db.execute(
            "WITH h AS (UPDATE change_head SET head = head + 1 RETURNING head)
             INSERT INTO records (id, form_type, form_version, data, deleted, created_at, updated_at,
                                  synced_at, change_id, created_by)
             SELECT $1, 'texts', '1', $2::text::json, false, now(), now(), now(), h.head, 'admin' FROM h",
            &[&format!("t{i:02}"), text],
        )
        .await
        .expect("insert record");
    }
    let values: Vec<Value> = texts.iter().map(|t| serde_json::from_str(t).unwrap()).collect();

    let res = get(&app, "/data/export?format=parquet", &admin).await;
    let (batch, _) = read_parquet(unzip(&res.bytes().await.unwrap())[0].2.clone());
    assert_eq!(batch.num_rows(), texts.len());
    let data = strings(&batch, "data");
    for (i, value) in values.iter().enumerate() {
        assert_eq!(data[i].as_deref(), Some(value.to_string().as_str()), "data of {}", texts[i]);
        let leaves = leaves(value);
        for field in batch.schema().fields().iter().filter(|f| f.name().starts_with("data_")) {
            let expected = leaves.iter().find(|(n, _)| n == field.name()).map(|(_, v)| v);
            let column = batch.column_by_name(field.name()).unwrap();
            let got = match field.data_type() {
                DataType::Int64 => column
                    .as_primitive::<Int64Type>()
                    .is_valid(i)
                    .then(|| json!(ints(&batch, field.name())[i])),
                DataType::Float64 => column
                    .as_primitive::<Float64Type>()
                    .is_valid(i)
                    .then(|| json!(column.as_primitive::<Float64Type>().value(i))),
                DataType::Boolean => bools(&batch, field.name())[i].map(Value::Bool),
                _ => strings(&batch, field.name())[i].clone().map(Value::String),
            };
            let want = expected.map(|v| match field.data_type() {
                DataType::Int64 => json!(v.as_i64()),
                DataType::Float64 => json!(v.as_f64()),
                DataType::Boolean => v.clone(),
                _ => Value::String(v.as_str().map_or_else(|| v.to_string(), str::to_owned)),
            });
            assert_eq!(got, want, "{} of {}", field.name(), texts[i]);
        }
    }

    let res = get(&app, "/data/export?format=csv", &admin).await;
    let csv = String::from_utf8(unzip(&res.bytes().await.unwrap())[0].2.clone()).unwrap();
    // Records end with CRLF; a bare LF can only be inside a quoted field.
    let records: Vec<Vec<String>> = csv.split("\r\n").filter(|r| !r.is_empty()).map(csv_fields).collect();
    let data_at = records[0].iter().position(|n| n == "data").unwrap();
    for (i, value) in values.iter().enumerate() {
        assert_eq!(records[i + 1][data_at], value.to_string(), "csv data of {}", texts[i]);
    }
}
