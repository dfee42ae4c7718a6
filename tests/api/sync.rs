//! Sync engine: push, pull, dialects, idempotency and the no-skip guarantee (docs/api.md §8, 16).

use std::collections::{BTreeMap, HashSet};

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::{assert_error, connect, TestApp};

fn fixture(name: &str) -> Value {
    let path = format!("{}/tests/fixtures/upstream/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("fixture json")
}

#[actix_web::test]
async fn upstream_fixtures_insert_update_delete_last_arrival_wins() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let (status, body) = app.push(&admin, fixture("test_observations.json")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["success_count"], 10);
    assert_eq!(body["current_version"], 10);
    assert_eq!(body["failed_records"], json!([]));

    let (status, body) = app.push(&admin, fixture("test_update_observations.json")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["current_version"], 11);

    let (status, body) = app.push(&admin, fixture("test_delete_observations.json")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["current_version"], 21);

    let (records, cursor) = app.pull_all(&admin, "reader", 0, 3).await;
    assert_eq!(cursor, 21);
    assert_eq!(records.len(), 10, "a record appears once, at its latest change");
    for r in &records {
        assert_eq!(r["deleted"], true, "deletions with older updated_at still win: {r}");
        assert_eq!(r["data"], json!({}), "a deletion that sends data stores it");
    }
    let obs1 = records.iter().find(|r| r["observation_id"] == "obs_001").expect("obs_001");
    assert_eq!(obs1["updated_at"], "2024-06-15T10:30:00Z", "client time kept as sent");

    // History keeps the overwritten revisions, newest first.
    let (status, hist) = app.call(Method::GET, "/observations/obs_001/history", Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK, "{hist}");
    let revisions = hist["revisions"].as_array().expect("revisions");
    assert_eq!(revisions.len(), 3);
    assert_eq!(revisions[0]["deleted"], true);
    assert_eq!(revisions[1]["data"]["first_name"], "Johnny");
    assert_eq!(revisions[2]["data"]["first_name"], "John");
    assert_eq!(revisions[2]["overwrote_version"], Value::Null);
    assert_eq!(revisions[1]["overwrote_version"], revisions[2]["version"]);
    assert_eq!(revisions[0]["pushed_by"], "admin");
    assert_eq!(revisions[0]["client_id"], "test-client-001");
}

/// A stored push result this server cannot read (damaged, or stored in a shape it does not know)
/// fails that push's retry with a 500 (the log names the transmission) and stores nothing: the
/// retry is neither replayed nor applied again, and other pushes still land.
#[actix_web::test]
async fn a_stored_result_that_cannot_be_read_fails_its_retry_and_stores_nothing() {
    use crate::commit_ahead::{ids, push_body};
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let body = push_body("t1", &ids("r", 3));
    let (status, first) = app.push(&admin, body.clone()).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let db = connect(&app.db_conn).await;
    db.execute("UPDATE transmissions SET result = '{\"unexpected\": true}'", &[]).await.expect("damage");

    let (status, retry) = app.push(&admin, body).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{retry}");
    let (_, status_body) = app.call(Method::GET, "/status", Some(&admin), None).await;
    assert_eq!(status_body["current_change_id"], 3, "nothing stored for the retry");
    let (status, other) = app.push(&admin, push_body("t2", &ids("s", 2))).await;
    assert_eq!(status, StatusCode::OK, "{other}");
    assert_eq!(other["current_version"], 5);
}

#[actix_web::test]
async fn replay_mismatch_and_validation_store_nothing_twice() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let body = fixture("test_observations.json");
    let first = app.send(Method::POST, "/sync/push", Some(&admin), Some(body.clone())).await;
    assert_eq!(first.status(), StatusCode::OK);
    assert!(first.headers().get("x-idempotent-replay").is_none());
    let first: Value = first.json().await.expect("json");

    // Same content, different key order and spacing: a replay, nothing written.
    let text = serde_json::to_string_pretty(&body).expect("text");
    let retry = app
        .client
        .post(app.url("/sync/push"))
        .bearer_auth(&admin)
        .header("content-type", "text/plain")
        .body(text)
        .send()
        .await
        .expect("retry");
    assert_eq!(retry.status(), StatusCode::OK);
    assert_eq!(retry.headers().get("x-idempotent-replay").and_then(|v| v.to_str().ok()), Some("true"));
    let retry: Value = retry.json().await.expect("json");
    assert_eq!(retry, first);

    // Same key, different payload: 409 and nothing stored.
    let mut changed = body.clone();
    changed["records"][0]["data"]["first_name"] = json!("Mallory");
    let (status, err) = app.push(&admin, changed).await;
    assert_error(status, &err, 409, "TRANSMISSION_MISMATCH");

    // One invalid record among valid ones: 422 listing it, nothing stored.
    let bad = json!({"transmission_id": "t-bad", "client_id": "c1", "records": [
        {"observation_id": "ok-1", "form_type": "f", "data": {"a": 1}},
        {"observation_id": "ok-2", "form_type": "f", "data": "not an object"},
        {"observation_id": "", "form_type": "f", "data": {}},
        {"observation_id": "ok-4", "form_type": "f", "data": {}, "updated_at": "yesterday"},
    ]});
    let (status, err) = app.push(&admin, bad).await;
    assert_error(status, &err, 422, "VALIDATION_FAILED");
    let paths: Vec<&str> =
        err["errors"].as_array().expect("errors").iter().filter_map(|e| e["path"].as_str()).collect();
    assert_eq!(paths, vec!["/records/1/data", "/records/2/observation_id", "/records/3/updated_at"]);
    let codes: Vec<&str> =
        err["errors"].as_array().expect("errors").iter().filter_map(|e| e["code"].as_str()).collect();
    assert_eq!(codes, vec!["TYPE_ERROR", "REQUIRED", "INVALID_TIMESTAMP"]);

    let (_, status_body) = app.call(Method::GET, "/status", Some(&admin), None).await;
    assert_eq!(status_body["current_change_id"], 10, "failed pushes assign no change_ids");
    assert_eq!(status_body["observation_count"], 10);
    let (status, _) = app.call(Method::GET, "/observations/ok-1", Some(&admin), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // The failed transmission id may be retried once fixed.
    let fixed = json!({"transmission_id": "t-bad", "client_id": "c1", "records": [
        {"observation_id": "ok-1", "form_type": "f", "data": {"a": 1}}]});
    let (status, ok) = app.push(&admin, fixed).await;
    assert_eq!(status, StatusCode::OK, "{ok}");
    assert_eq!(ok["current_version"], 11);
}

#[actix_web::test]
async fn request_level_errors_are_400_and_roles_apply() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let reader = app.user_token(&admin, "reader", "read-only").await;
    for body in [
        json!([1, 2]),
        json!({"transmission_id": "t", "records": []}),
        json!({"transmission_id": "t", "client_id": "", "records": []}),
        json!({"transmission_id": "t", "client_id": "x".repeat(256), "records": []}),
        json!({"client_id": "c", "records": []}),
        json!({"transmission_id": "t", "client_id": "c"}),
        json!({"transmission_id": "t", "client_id": "c", "records": {}}),
    ] {
        let (status, err) = app.push(&admin, body.clone()).await;
        assert_error(status, &err, 400, "BAD_REQUEST");
    }
    let (status, err) = app
        .call(
            Method::POST,
            "/sync/push",
            None,
            Some(json!({"transmission_id": "t", "client_id": "c", "records": []})),
        )
        .await;
    assert_error(status, &err, 401, "MISSING_TOKEN");
    let (status, err) =
        app.push(&reader, json!({"transmission_id": "t", "client_id": "c", "records": []})).await;
    assert_error(status, &err, 403, "FORBIDDEN");
    // Readers may pull.
    let (status, body) =
        app.call(Method::POST, "/sync/pull", Some(&reader), Some(json!({"client_id": "r"}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["records"], json!([]));
    // Empty push: valid, no change.
    let (status, body) =
        app.push(&admin, json!({"transmission_id": "e", "client_id": "c", "records": []})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["success_count"], 0);
    assert_eq!(body["current_version"], 0);
    // Pull errors.
    for (path, body) in [
        ("/sync/pull", json!({"since": 0})),
        ("/sync/pull", json!({"client_id": "c", "since": -1})),
        ("/sync/pull", json!({"client_id": "c", "since": "x"})),
        ("/sync/pull", json!({"client_id": "c", "schema_types": "household"})),
        ("/sync/pull", json!({"client_id": "c", "limit": "ten"})),
        ("/sync/pull?limit=abc", json!({"client_id": "c"})),
    ] {
        let (status, err) = app.call(Method::POST, path, Some(&reader), Some(body)).await;
        assert_error(status, &err, 400, "BAD_REQUEST");
    }
    let (status, err) = app
        .call(Method::POST, "/sync/pull?page_token=garbage", Some(&reader), Some(json!({"client_id": "c"})))
        .await;
    assert_error(status, &err, 400, "INVALID_PAGE_TOKEN");
}

#[actix_web::test]
async fn dialects_round_trip_data_exactly() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let data = json!({
        "name": "Ñandú 🐦 测试 \"quoted\" \\ back",
        "nested": {"list": [1, [2, [3, {"deep": true}]], null, -0.5], "empty": {}, "arr": []},
        "big": 12345678901234567890123456789_u128,
        "small": 1.0000000000000000001,
        "neg": -9223372036854775808_i64,
        "exp": 1e300
    });
    let big_text = r#"{"big":12345678901234567890123456789,"exact":0.1000000000000000055511151231257827}"#;
    let raw_data: Value = serde_json::from_str(big_text).expect("raw");
    let geo = json!({"latitude": -1.2921, "longitude": 36.8219, "accuracy": 8.5, "altitude": null});

    // synkronus push
    let (status, body) = app
        .push(
            &admin,
            json!({"transmission_id": "t1", "client_id": "c", "records": [
        {"observation_id": "s-1", "form_type": "ft", "form_version": "1", "data": data, "geolocation": geo,
         "created_at": "2025-06-27T12:55:58.123+02:00", "updated_at": "2025-06-27T10:55:58Z",
         "author": "enum1", "device_id": "dev-9", "tags": ["a", "b"]},
        {"observation_id": "s-2", "form_type": "ft", "data": raw_data}]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // spec push
    let (status, body) = app
        .push(
            &admin,
            json!({"transmission_id": "t2", "client_id": "c", "records": [
        {"id": "p-1", "schema_type": "ft", "schema_version": "2", "data": data}]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["successes"], json!([{"id": "p-1", "change_id": 3}]));
    assert_eq!(body["change_cutoff"], 3);
    // camel push without transmissionId
    let (status, body) = app
        .push(
            &admin,
            json!({"clientId": "web", "changes": {"observations": [
        {"observationId": "c-1", "formType": "ft", "formVersion": "3", "data": data, "deviceId": "d"}]}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["timestamp"], 4);
    assert_eq!(body["conflicts"], json!([]));

    // synkronus pull
    let (status, body) = app
        .call(Method::POST, "/sync/pull", Some(&admin), Some(json!({"client_id": "x", "since": null})))
        .await;
    assert_eq!(status, StatusCode::OK);
    let recs = body["records"].as_array().expect("records");
    assert_eq!(recs.len(), 4);
    assert_eq!(recs[0]["data"], data);
    assert_eq!(recs[0]["geolocation"], geo);
    assert_eq!(recs[0]["created_at"], "2025-06-27T10:55:58.123Z");
    assert_eq!(recs[0]["updated_at"], "2025-06-27T10:55:58Z");
    assert_eq!(recs[0]["author"], "enum1");
    assert_eq!(recs[0]["device_id"], "dev-9");
    assert_eq!(recs[0]["tags"], json!(["a", "b"]));
    assert_eq!(recs[1]["data"], raw_data, "large numbers survive exactly");
    assert_eq!(recs[1]["data"].to_string(), big_text);
    assert_eq!(body["sync_format_version"], "1.0");
    // spec pull
    let res = app
        .send(
            Method::POST,
            "/sync/pull",
            Some(&admin),
            Some(json!({"client_id": "x", "since_change_id": 0, "limit": 2})),
        )
        .await;
    assert_eq!(res.headers().get("x-api-version-used").and_then(|v| v.to_str().ok()), Some("1.1.0"));
    let body: Value = res.json().await.expect("json");
    assert_eq!(body["records"][0]["id"], "s-1");
    assert_eq!(body["records"][0]["data"], data);
    assert_eq!(body["has_more"], true);
    assert_eq!(body["change_cutoff"], 2);
    let token = body["next_page_token"].as_str().expect("token").to_string();
    let (_, body) = app
        .call(
            Method::POST,
            "/sync/pull",
            Some(&admin),
            Some(json!({"client_id": "x", "since_change_id": 0, "page_token": token})),
        )
        .await;
    assert_eq!(body["records"][0]["id"], "p-1");
    assert_eq!(body["records"][0]["schema_version"], "2");
    assert_eq!(body["has_more"], false);
    assert!(body["next_page_token"].is_string(), "spec always returns a token");
    // camel pull
    let (_, body) = app
        .call(Method::POST, "/sync/pull", Some(&admin), Some(json!({"clientId": "x", "currentVersion": 3})))
        .await;
    let obs = body["changes"]["observations"].as_array().expect("observations");
    assert_eq!(obs.len(), 1);
    assert_eq!(obs[0]["observationId"], "c-1");
    assert_eq!(obs[0]["data"], data);
    assert_eq!(obs[0]["deviceId"], "d");
    assert_eq!(body["timestamp"], 4);
    assert_eq!(body["hasMore"], false);
    // GET pull: spec by default, synkronus for 1.0.
    let (_, body) = app
        .call(Method::GET, "/sync/pull?client_id=x&since=3&schema_types=ft,other", Some(&admin), None)
        .await;
    assert_eq!(body["records"][0]["id"], "c-1");
    let res = app
        .client
        .get(app.url("/sync/pull?client_id=x&since=3"))
        .bearer_auth(&admin)
        .header("x-api-version", "1.0.0")
        .send()
        .await
        .expect("get pull");
    assert_eq!(res.headers().get("x-api-version-used").and_then(|v| v.to_str().ok()), Some("1.0.0"));
    let body: Value = res.json().await.expect("json");
    assert_eq!(body["records"][0]["observation_id"], "c-1");
    assert_eq!(body["current_version"], 4);
}

#[actix_web::test]
async fn filters_limits_conflicts_and_cursor_beyond_head() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let records: Vec<Value> = (0..6)
        .map(|i| {
            json!({"observation_id": format!("r{i}"), "form_type": if i % 2 == 0 { "even" } else { "odd" },
                        "data": {"i": i}})
        })
        .collect();
    let (status, _) =
        app.push(&admin, json!({"transmission_id": "t", "client_id": "c", "records": records})).await;
    assert_eq!(status, StatusCode::OK);
    // Type filter from body and query merged.
    let (_, body) = app
        .call(
            Method::POST,
            "/sync/pull?schemaType=odd",
            Some(&admin),
            Some(json!({"client_id": "x", "schema_types": ["even"]})),
        )
        .await;
    assert_eq!(body["records"].as_array().map(Vec::len), Some(6));
    let (_, body) = app
        .call(
            Method::POST,
            "/sync/pull",
            Some(&admin),
            Some(json!({"client_id": "x", "schema_types": ["odd"], "limit": 2})),
        )
        .await;
    let ids: Vec<&str> =
        body["records"].as_array().expect("r").iter().filter_map(|r| r["observation_id"].as_str()).collect();
    assert_eq!(ids, vec!["r1", "r3"]);
    assert_eq!(body["has_more"], true);
    // limit <= 0 means the default; a huge one is clamped.
    for limit in [0, -5, 100000] {
        let (status, body) = app
            .call(
                Method::POST,
                &format!("/sync/pull?limit={limit}"),
                Some(&admin),
                Some(json!({"client_id": "x"})),
            )
            .await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["records"].as_array().map(Vec::len), Some(6));
    }
    // P6: a cursor above S gives an empty page at S.
    let (_, body) = app
        .call(
            Method::POST,
            "/sync/pull",
            Some(&admin),
            Some(json!({"client_id": "x", "since": {"version": 999}})),
        )
        .await;
    assert_eq!(body["records"], json!([]));
    assert_eq!(body["change_cutoff"], 6);
    assert_eq!(body["current_version"], 6);
    // A stale base version still wins, with a warning.
    let (status, body) = app
        .push(
            &admin,
            json!({"transmission_id": "t2", "client_id": "c", "records": [
        {"observation_id": "r1", "form_type": "odd", "data": {"i": 100}, "version": 1},
        {"observation_id": "r3", "form_type": "", "data": {"i": 300}, "version": 4}]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let warnings = body["warnings"].as_array().expect("warnings");
    assert_eq!(warnings.len(), 2, "{body}");
    assert_eq!(warnings[0]["code"], "CONFLICT_OVERWRITTEN");
    assert_eq!(warnings[0]["base_version"], 1);
    assert_eq!(warnings[0]["server_version"], 2);
    assert_eq!(warnings[1]["code"], "MISSING_FORM_TYPE");
    let (_, hist) = app.call(Method::GET, "/observations/r1/history", Some(&admin), None).await;
    assert_eq!(hist["revisions"][0]["conflict"], true);
    assert_eq!(hist["revisions"][0]["data"]["i"], 100);
}

/// The record row's column list (`db::record_row`) is the tables' columns, with their types.
#[actix_web::test]
async fn the_record_row_lists_every_column_of_both_tables_with_its_type() {
    use synkronus::db::record_row::{Col, Table};
    let app = TestApp::spawn().await;
    let db = connect(&app.db_conn).await;
    for (name, table) in [("records", Table::Records), ("record_revisions", Table::Revisions)] {
        let rows = db
            .query(
                "SELECT column_name::text, udt_name::text FROM information_schema.columns
                 WHERE table_schema = current_schema() AND table_name = $1",
                &[&name],
            )
            .await
            .expect("columns");
        let mut actual: Vec<(String, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        let mut declared: Vec<(String, String)> = Col::ALL
            .iter()
            .filter_map(|c| c.name_in(table).map(|n| (n.to_string(), c.pg_type().name().to_string())))
            .collect();
        actual.sort();
        declared.sort();
        assert_eq!(actual, declared, "{name}");
    }
}

/// Every column of a record row, each with a value no other column has, written by each writer
/// (a new record's COPY, a revision superseded in its own batch, the archive of a stored state and
/// the update of it) and read back by each reader (pull, the record, the listing, the history):
/// two columns swapped anywhere fail here.
#[actix_web::test]
async fn every_column_of_a_record_row_round_trips_through_every_writer_and_reader() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let writer = app.user_token(&admin, "writer", "read-write").await;
    let revision = |n: u32, base: Option<i64>| {
        let mut r = json!({
            "observation_id": "x", "form_type": format!("ft-{n}"), "form_version": format!("fv-{n}"),
            "data": {"n": n}, "created_at": format!("2024-0{n}-01T00:00:00Z"),
            "updated_at": format!("2024-0{n}-02T00:00:00Z"), "geolocation": {"latitude": n},
            "author": format!("author-{n}"), "device_id": format!("device-{n}"), "tags": [format!("tag-{n}")]});
        if let Some(base) = base {
            r["version"] = json!(base);
        }
        r
    };
    let (status, body) = app
        .push(
            &admin,
            json!({"transmission_id": "t-1", "client_id": "client-1",
            "records": [revision(1, None), revision(2, None)]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // Based on revision 1, overwriting 2: a conflict.
    let (status, body) = app
        .push(
            &writer,
            json!({"transmission_id": "t-2", "client_id": "client-2", "records": [revision(3, Some(1))]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let check = |r: &Value, n: u32, version: i64| {
        assert_eq!(r["form_type"], format!("ft-{n}"), "{r}");
        assert_eq!(r["form_version"], format!("fv-{n}"), "{r}");
        assert_eq!(r["data"], json!({"n": n}), "{r}");
        assert_eq!(r["deleted"], false, "{r}");
        assert_eq!(r["created_at"], format!("2024-0{n}-01T00:00:00Z"), "{r}");
        assert_eq!(r["updated_at"], format!("2024-0{n}-02T00:00:00Z"), "{r}");
        assert!(r["synced_at"].is_string(), "{r}");
        assert_eq!(r["geolocation"], json!({"latitude": n}), "{r}");
        assert_eq!(r["author"], format!("author-{n}"), "{r}");
        assert_eq!(r["device_id"], format!("device-{n}"), "{r}");
        assert_eq!(r["tags"], json!([format!("tag-{n}")]), "{r}");
        assert_eq!(r["version"], version, "{r}");
    };
    let (pulled, _) = app.pull_all(&admin, "reader", 0, 10).await;
    assert_eq!(pulled.len(), 1);
    check(&pulled[0], 3, 3);
    let (_, one) = app.call(Method::GET, "/observations/x", Some(&admin), None).await;
    check(&one, 3, 3);
    assert_eq!(one["created_by"], "admin", "the owner is the first revision's pusher");
    let (_, listed) = app.call(Method::GET, "/observations", Some(&admin), None).await;
    check(&listed["observations"][0], 3, 3);
    assert_eq!(listed["observations"][0]["created_by"], "admin");
    let (_, history) = app.call(Method::GET, "/observations/x/history", Some(&admin), None).await;
    let revisions = history["revisions"].as_array().expect("revisions");
    assert_eq!(revisions.len(), 3);
    let provenance = [
        ("client-2", "t-2", "writer", json!(2), true),
        ("client-1", "t-1", "admin", json!(1), false),
        ("client-1", "t-1", "admin", Value::Null, false),
    ];
    for (i, (r, (client, tid, by, overwrote, conflict))) in revisions.iter().zip(provenance).enumerate() {
        let n = 3 - i as u32;
        check(r, n, i64::from(n));
        assert_eq!(
            (
                &r["client_id"],
                &r["transmission_id"],
                &r["pushed_by"],
                &r["overwrote_version"],
                &r["conflict"]
            ),
            (&json!(client), &json!(tid), &json!(by), &overwrote, &json!(conflict)),
            "{r}"
        );
    }
}

/// A typed pull reads each type from (form_type, change_id) at any size: from a cursor it gets
/// only that type's later records up to the head, and a type with no records (or whose records
/// are all at or below the cursor) gets an empty page at the head (docs/api.md §8.2).
#[actix_web::test]
async fn typed_pull_from_a_cursor_and_of_an_empty_type() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    // change_ids 1..=9: a, b, c, a, b, c, a, b, c
    let records: Vec<Value> = (0..9)
        .map(|i| {
            let form_type = ["a", "b", "c"][i % 3];
            json!({"observation_id": format!("r{i}"), "form_type": form_type, "data": {"i": i}})
        })
        .collect();
    let (status, _) =
        app.push(&admin, json!({"transmission_id": "t", "client_id": "c", "records": records})).await;
    assert_eq!(status, StatusCode::OK);
    let pull = |types: Value, since: i64, limit: i64| {
        let app = &app;
        let admin = admin.clone();
        async move {
            let body =
                json!({"client_id": "x", "schema_types": types, "since": {"version": since}, "limit": limit});
            let (status, body) = app.call(Method::POST, "/sync/pull", Some(&admin), Some(body)).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            let ids: Vec<String> = body["records"]
                .as_array()
                .expect("records")
                .iter()
                .filter_map(|r| r["observation_id"].as_str().map(String::from))
                .collect();
            (ids, body)
        }
    };
    let (ids, body) = pull(json!(["b"]), 2, 10).await;
    assert_eq!(ids, vec!["r4", "r7"]);
    assert_eq!((body["has_more"].clone(), body["change_cutoff"].clone()), (json!(false), json!(8)));
    let (ids, body) = pull(json!(["c", "a"]), 3, 2).await;
    assert_eq!(ids, vec!["r3", "r5"]);
    assert_eq!((body["has_more"].clone(), body["change_cutoff"].clone()), (json!(true), json!(6)));
    for (types, since) in [(json!(["nobody_filled_this_in"]), 0), (json!(["c"]), 9), (json!(["a"]), 7)] {
        let (ids, body) = pull(types, since, 10).await;
        assert!(ids.is_empty(), "{body}");
        assert_eq!(body["has_more"], false);
        assert_eq!(body["current_version"], 9);
    }
}

#[actix_web::test]
async fn observations_listing_ownership_and_pagination() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let writer = app.user_token(&admin, "enum1", "read-write").await;
    let recs: Vec<Value> =
        (0..5).map(|i| json!({"observation_id": format!("w{i}"), "form_type": "f", "data": {}})).collect();
    app.push(&writer, json!({"transmission_id": "a", "client_id": "c", "records": recs})).await;
    app.push(
        &admin,
        json!({"transmission_id": "b", "client_id": "c", "records": [
        {"observation_id": "a0", "form_type": "f", "data": {}},
        {"observation_id": "w0", "form_type": "f", "deleted": true}]}),
    )
    .await;
    let (_, body) = app.call(Method::GET, "/observations?limit=2", Some(&writer), None).await;
    assert_eq!(body["observations"].as_array().map(Vec::len), Some(2));
    assert_eq!(body["observations"][0]["observation_id"], "w1", "w0 is deleted: hidden by default");
    assert_eq!(body["observations"][0]["created_by"], "enum1");
    assert_eq!(body["has_more"], true);
    let token = body["next_page_token"].as_str().expect("token").to_string();
    let (_, body) =
        app.call(Method::GET, &format!("/observations?page_token={token}"), Some(&writer), None).await;
    assert_eq!(body["observations"].as_array().map(Vec::len), Some(2));
    assert_eq!(body["has_more"], false);
    let (_, body) = app.call(Method::GET, "/observations?include_deleted=true", Some(&writer), None).await;
    assert_eq!(body["observations"].as_array().map(Vec::len), Some(5), "w0 is still owned by enum1");
    let (status, err) = app.call(Method::GET, "/observations?all=true", Some(&writer), None).await;
    assert_error(status, &err, 403, "FORBIDDEN");
    let (_, body) = app.call(Method::GET, "/observations?all=true", Some(&admin), None).await;
    assert_eq!(body["observations"].as_array().map(Vec::len), Some(5));
    let (_, body) =
        app.call(Method::GET, "/observations?user=enum1&include_deleted=true", Some(&admin), None).await;
    assert_eq!(body["observations"].as_array().map(Vec::len), Some(5));
    let (status, body) = app.call(Method::GET, "/observations/w0", Some(&writer), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["deleted"], true);
    assert_eq!(body["data"], json!({}), "a deletion without data keeps the previous data");
    let (status, err) = app.call(Method::GET, "/observations/nope/history", Some(&writer), None).await;
    assert_error(status, &err, 404, "NOT_FOUND");
    let (status, _) = app.call(Method::GET, "/observations/a%2Fb", Some(&writer), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// Each filter of `/observations` (none, owner, form types, both) pages through exactly its records.
#[actix_web::test]
async fn observations_filters_by_owner_and_form_type_page_through_their_records() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let writer = app.user_token(&admin, "filter1", "read-write").await;
    let records = |prefix: &str| -> Vec<Value> {
        (0..6)
            .map(|i| {
                let form = ["a", "b", "c"][i % 3];
                json!({"observation_id": format!("{prefix}{i}"), "form_type": form, "data": {"i": i}})
            })
            .collect()
    };
    app.push(&writer, json!({"transmission_id": "w", "client_id": "c", "records": records("w")})).await;
    app.push(&admin, json!({"transmission_id": "x", "client_id": "c", "records": records("x")})).await;
    let ids = |query: &str, token: String| {
        let app = &app;
        let query = query.to_string();
        async move {
            let mut ids = Vec::new();
            let mut page_token: Option<String> = None;
            loop {
                let mut target = format!("/observations?limit=2&{query}");
                if let Some(t) = &page_token {
                    target.push_str(&format!("&page_token={t}"));
                }
                let (status, body) = app.call(Method::GET, &target, Some(&token), None).await;
                assert_eq!(status, StatusCode::OK, "{target}: {body}");
                for o in body["observations"].as_array().expect("observations") {
                    ids.push(o["observation_id"].as_str().expect("id").to_string());
                }
                match body["next_page_token"].as_str() {
                    Some(t) if body["has_more"] == true => page_token = Some(t.to_string()),
                    _ => return ids,
                }
            }
        }
    };
    assert_eq!(ids("all=true", admin.clone()).await.len(), 12);
    assert_eq!(ids("", writer.clone()).await, ["w0", "w1", "w2", "w3", "w4", "w5"]);
    assert_eq!(ids("user=filter1", admin.clone()).await, ["w0", "w1", "w2", "w3", "w4", "w5"]);
    assert_eq!(ids("form_type=a,c", writer.clone()).await, ["w0", "w2", "w3", "w5"]);
    assert_eq!(ids("all=true&form_type=b", admin.clone()).await, ["w1", "w4", "x1", "x4"]);
    assert_eq!(ids("user=filter1&form_type=b", admin.clone()).await, ["w1", "w4"]);
    assert!(ids("all=true&form_type=nobody", admin.clone()).await.is_empty());
    assert!(ids("user=nobody", admin.clone()).await.is_empty());
}

#[actix_web::test]
async fn concurrent_duplicates_apply_once() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let body = fixture("test_observations.json");
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let client = app.client.clone();
        let url = app.url("/sync/push");
        let token = admin.clone();
        let body = body.clone();
        tasks.push(tokio::spawn(async move {
            let res = client.post(url).bearer_auth(token).json(&body).send().await.expect("push");
            let replay = res.headers().contains_key("x-idempotent-replay");
            (res.status(), replay, res.json::<Value>().await.expect("json"))
        }));
    }
    let mut bodies = Vec::new();
    let mut applied = 0;
    for t in tasks {
        let (status, replay, body) = t.await.expect("task");
        assert_eq!(status, StatusCode::OK);
        if !replay {
            applied += 1;
        }
        bodies.push(body);
    }
    assert_eq!(applied, 1, "exactly one duplicate is applied");
    assert!(bodies.iter().all(|b| *b == bodies[0]), "identical responses");
    let (_, status_body) = app.call(Method::GET, "/status", Some(&admin), None).await;
    assert_eq!(status_body["current_change_id"], 10, "one change per record");
}

/// Waits until a commit waits for the change-log lock on `db_conn`'s database (a bigint advisory
/// key is split into classid and objid).
async fn wait_for_a_commit_waiting_for_the_lock(db_conn: &str) {
    let db = connect(db_conn).await;
    for _ in 0..3000 {
        let waiting: i64 = db
            .query_one(
                "SELECT count(*) FROM pg_locks
                 WHERE locktype = 'advisory' AND NOT granted AND classid::int8 = $1::int8 >> 32
                   AND objid::int8 = $1::int8 & 4294967295
                   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                &[&synkronus::db::records::CHANGELOG_LOCK],
            )
            .await
            .expect("pg_locks")
            .get(0);
        if waiting > 0 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("no commit waits for the change-log lock");
}

/// G1, staged: a commit that took its change_ids first and later ones that would finish before
/// it if they could. Push A is held right after its plan (the lock and ids 1–30 are its, nothing is
/// written); push B, on the same server, is written ahead of it (ids 31–50, its rows in the table,
/// uncommitted) and waits only for A's COMMIT; with two servers, push C on the other one waits
/// for the lock A holds. While A is held every pull, on either server, sees nothing; once it is
/// let go, every pull sees A's ids first and every staged record once, in order. Returns the
/// staged record ids.
async fn no_skip_when_commits_would_finish_in_reverse_order(
    app: &TestApp,
    second: Option<&TestApp>,
    admin: &str,
) -> Vec<String> {
    use crate::commit_ahead::{ids, push_body, spawn_push};
    use synkronus::actors::change_log::pauses::Point;

    let pauses = app.state.actors.change_log.pauses();
    let (a_ids, b_ids, c_ids) = (ids("a", 30), ids("b", 20), ids("c", 20));
    let a_planned = pauses.arm(Point::Planned);
    let a = spawn_push(app, admin, push_body("a", &a_ids));
    let a_held = a_planned.reached().await.expect("push A planned");
    let b_written = pauses.arm(Point::WroteAhead);
    let b = spawn_push(app, admin, push_body("b", &b_ids));
    b_written.reached().await.expect("push B written ahead of A").release();
    let mut pushes = vec![a, b];
    let mut staged: Vec<String> = a_ids.iter().chain(&b_ids).cloned().collect();
    if let Some(second) = second {
        pushes.push(spawn_push(second, admin, push_body("c", &c_ids)));
        wait_for_a_commit_waiting_for_the_lock(&app.db_conn).await;
        staged.extend(c_ids);
    }
    let servers: Vec<&TestApp> = std::iter::once(app).chain(second).collect();
    for server in &servers {
        let (records, head) = server.pull_all(admin, "early", 0, 500).await;
        assert!(records.is_empty() && head == 0, "visible before A commits: {records:?} (head {head})");
    }
    a_held.release();
    for push in pushes {
        let (status, body) = push.await.expect("push");
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    for server in &servers {
        let (records, head) = server.pull_all(admin, "after", 0, 7).await;
        assert_eq!(head, staged.len() as i64);
        let versions: Vec<i64> = records.iter().map(|r| r["version"].as_i64().expect("version")).collect();
        assert_eq!(versions, (1..=staged.len() as i64).collect::<Vec<_>>(), "dense and in order");
        let pulled: Vec<&str> = records.iter().map(|r| r["observation_id"].as_str().expect("id")).collect();
        assert_eq!(pulled[..30], a_ids.iter().map(String::as_str).collect::<Vec<_>>()[..], "A's ids first");
        let mut sorted = pulled.clone();
        sorted.sort_unstable();
        let mut expected: Vec<&str> = staged.iter().map(String::as_str).collect();
        expected.sort_unstable();
        assert_eq!(sorted, expected, "every staged record once");
    }
    staged
}

/// G1: a later commit never becomes visible before an earlier one: staged first (above), then
/// many pushers and pullers at once; every puller ends with every record, change_ids strictly
/// increasing, on one server or on two server processes sharing the database.
async fn no_skip_under_concurrency(two_servers: bool) {
    let app = TestApp::spawn().await;
    let second = if two_servers { Some(TestApp::spawn_on(app.db_conn.clone(), &[]).await) } else { None };
    let admin = app.admin_token().await;
    let staged = no_skip_when_commits_would_finish_in_reverse_order(&app, second.as_ref(), &admin).await;
    let bases: Vec<String> =
        std::iter::once(app.base.clone()).chain(second.iter().map(|s| s.base.clone())).collect();
    const PUSHERS: usize = 32;
    const PUSHES_EACH: usize = 5;
    const RECORDS_EACH: usize = 4;

    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut pullers = Vec::new();
    for p in 0..4 {
        let client = app.client.clone();
        let base = bases[p % bases.len()].clone();
        let token = admin.clone();
        let done = done.clone();
        pullers.push(tokio::spawn(async move {
            let mut cursor = 0i64;
            let mut seen: BTreeMap<String, i64> = BTreeMap::new();
            let limit = [1, 7, 50, 500][p];
            loop {
                let finished = done.load(std::sync::atomic::Ordering::SeqCst);
                loop {
                    let body: Value = client
                        .post(format!("{base}/sync/pull?limit={limit}"))
                        .bearer_auth(&token)
                        .json(&json!({"client_id": format!("puller-{p}"), "since": {"version": cursor}}))
                        .send()
                        .await
                        .expect("pull")
                        .json()
                        .await
                        .expect("json");
                    let mut last = cursor;
                    for r in body["records"].as_array().expect("records") {
                        let v = r["version"].as_i64().expect("version");
                        assert!(v > last, "strictly increasing");
                        last = v;
                        seen.insert(r["observation_id"].as_str().expect("id").to_string(), v);
                    }
                    if body["has_more"] == true {
                        cursor = body["change_cutoff"].as_i64().expect("cutoff");
                    } else {
                        cursor = body["current_version"].as_i64().expect("current");
                        break;
                    }
                }
                if finished {
                    return (seen, cursor);
                }
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        }));
    }
    let mut pushers = Vec::new();
    for d in 0..PUSHERS {
        let client = app.client.clone();
        let base = bases[d % bases.len()].clone();
        let token = admin.clone();
        pushers.push(tokio::spawn(async move {
            for n in 0..PUSHES_EACH {
                let records: Vec<Value> = (0..RECORDS_EACH)
                    .map(|k| json!({"observation_id": format!("d{d}-{n}-{k}"), "form_type": "f", "data": {"d": d}}))
                    .collect();
                let res = client
                    .post(format!("{base}/sync/push"))
                    .bearer_auth(&token)
                    .json(&json!({"transmission_id": format!("{d}-{n}"), "client_id": format!("dev-{d}"), "records": records}))
                    .send()
                    .await
                    .expect("push");
                assert_eq!(res.status(), StatusCode::OK);
            }
        }));
    }
    for p in pushers {
        p.await.expect("pusher");
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let expected: HashSet<String> = (0..PUSHERS)
        .flat_map(|d| {
            (0..PUSHES_EACH).flat_map(move |n| (0..RECORDS_EACH).map(move |k| format!("d{d}-{n}-{k}")))
        })
        .chain(staged)
        .collect();
    for p in pullers {
        let (seen, cursor) = p.await.expect("puller");
        let got: HashSet<String> = seen.keys().cloned().collect();
        assert_eq!(got, expected, "a puller missed changes");
        assert_eq!(cursor, expected.len() as i64);
        let mut ids: Vec<i64> = seen.values().copied().collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), expected.len(), "change_ids are unique");
    }
}

#[actix_web::test]
async fn no_skipped_change_one_server() {
    no_skip_under_concurrency(false).await;
}

#[actix_web::test]
async fn no_skipped_change_two_servers_one_database() {
    no_skip_under_concurrency(true).await;
}

async fn register_household_spec(app: &TestApp, admin: &str) {
    let (status, body) = app
        .call(Method::POST, "/formspecs", Some(admin), Some(json!({
            "formType": "household", "version": "1.0",
            "schema": {"type": "object", "properties": {"head_name": {"type": "string"}, "members": {"type": "integer"}},
                       "required": ["head_name"]},
            "uischema": {"type": "VerticalLayout", "elements": []}})))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

fn household_push(tid: &str) -> Value {
    json!({"transmission_id": tid, "client_id": "c", "records": [
        {"observation_id": "good", "form_type": "household", "form_version": "1.0", "data": {"head_name": "Amina", "members": 4}},
        {"observation_id": "bad", "form_type": "household", "form_version": "1.0", "data": {"members": "four"}},
        {"observation_id": "gone", "form_type": "household", "form_version": "1.0", "deleted": true, "data": {"members": "x"}},
        {"observation_id": "other", "form_type": "unknown", "data": {"anything": true}}]})
}

#[actix_web::test]
async fn record_validation_warn_is_the_default() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    register_household_spec(&app, &admin).await;
    let (status, body) = app.push(&admin, household_push("w")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let warnings = body["warnings"].as_array().expect("warnings");
    assert_eq!(warnings.len(), 1, "only the non-deleted record of a known form is checked: {body}");
    assert_eq!(warnings[0]["code"], "SCHEMA_MISMATCH");
    assert_eq!(warnings[0]["id"], "bad");
    let paths: Vec<&str> =
        warnings[0]["errors"].as_array().expect("errors").iter().filter_map(|e| e["path"].as_str()).collect();
    assert!(paths.contains(&"/members"), "{paths:?}");
    assert_eq!(body["success_count"], 4);
}

#[actix_web::test]
async fn record_validation_reject_stores_nothing() {
    let app = TestApp::spawn_with(&[("RECORD_VALIDATION", "reject")]).await;
    let admin = app.admin_token().await;
    register_household_spec(&app, &admin).await;
    let (status, err) = app.push(&admin, household_push("r")).await;
    assert_error(status, &err, 422, "VALIDATION_FAILED");
    let items = err["errors"].as_array().expect("errors");
    assert!(items.iter().all(|e| e["code"] == "SCHEMA_MISMATCH" && e["recordId"] == "bad"), "{err}");
    assert!(items.iter().any(|e| e["path"].as_str().is_some_and(|p| p.starts_with("/records/1/data"))));
    let (_, status_body) = app.call(Method::GET, "/status", Some(&admin), None).await;
    assert_eq!(status_body["current_change_id"], 0);
}

#[actix_web::test]
async fn record_validation_off_checks_nothing() {
    let app = TestApp::spawn_with(&[("RECORD_VALIDATION", "off")]).await;
    let admin = app.admin_token().await;
    register_household_spec(&app, &admin).await;
    let (status, body) = app.push(&admin, household_push("o")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["warnings"], json!([]));
}

/// One push that touches a record several times, and deletions without data: every revision is
/// kept in order, the deletion keeps the latest data, and the record keeps its first owner.
#[actix_web::test]
async fn repeated_ids_in_a_push_keep_every_revision_and_the_owner() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let bob = app.user_token(&admin, "bob", "read-write").await;
    let (status, body) = app
        .push(
            &admin,
            json!({"transmission_id": "t1", "client_id": "c1", "records": [
            {"observation_id": "y", "form_type": "f", "data": {"v": 1}}]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = app
        .push(
            &bob,
            json!({"transmission_id": "t2", "client_id": "c2", "records": [
            {"observation_id": "x", "form_type": "f", "data": {"v": 1}},
            {"observation_id": "y", "form_type": "f", "data": {"v": 2}},
            {"observation_id": "x", "form_type": "f", "data": {"v": 2}},
            {"observation_id": "x", "form_type": "f", "deleted": true},
            {"observation_id": "y", "form_type": "f", "deleted": true}]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["current_version"], 6);

    for (id, first_owner, versions) in [("x", "bob", [5, 4, 2]), ("y", "admin", [6, 3, 1])] {
        let (status, current) =
            app.call(Method::GET, &format!("/observations/{id}"), Some(&admin), None).await;
        assert_eq!(status, StatusCode::OK, "{current}");
        assert_eq!(current["deleted"], true, "{current}");
        assert_eq!(current["data"]["v"], 2, "a deletion without data keeps the latest data: {current}");
        assert_eq!(current["created_by"], first_owner, "{current}");
        let (_, hist) =
            app.call(Method::GET, &format!("/observations/{id}/history"), Some(&admin), None).await;
        let revisions = hist["revisions"].as_array().expect("revisions");
        let found: Vec<i64> = revisions.iter().map(|r| r["version"].as_i64().expect("version")).collect();
        assert_eq!(found, versions, "{hist}");
        assert_eq!(revisions[0]["overwrote_version"], versions[1]);
        assert_eq!(revisions[1]["overwrote_version"], versions[2]);
        assert_eq!(revisions[2]["overwrote_version"], Value::Null);
        assert_eq!(revisions[1]["data"]["v"], 2);
        assert_eq!(revisions[2]["data"]["v"], 1);
    }
}

/// Pushes racing on one record, committed in whatever groups the change log forms: the history
/// is one unbroken chain and the current state is its newest link.
#[actix_web::test]
async fn racing_updates_of_one_record_form_one_unbroken_history() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let pushes = (0..24).map(|i| {
        let app = &app;
        let admin = &admin;
        async move {
            let body = json!({"transmission_id": format!("t{i}"), "client_id": format!("c{i}"), "records": [
                {"observation_id": "shared", "form_type": "f", "data": {"writer": i}},
                {"observation_id": format!("own-{i}"), "form_type": "f", "data": {"writer": i}}]});
            let (status, body) = app.push(admin, body).await;
            assert_eq!(status, StatusCode::OK, "{body}");
        }
    });
    futures_util::future::join_all(pushes).await;

    let (_, hist) = app.call(Method::GET, "/observations/shared/history?limit=100", Some(&admin), None).await;
    let revisions = hist["revisions"].as_array().expect("revisions");
    assert_eq!(revisions.len(), 24, "{hist}");
    for pair in revisions.windows(2) {
        assert!(pair[0]["version"].as_i64() > pair[1]["version"].as_i64(), "newest first");
        assert_eq!(
            pair[0]["overwrote_version"], pair[1]["version"],
            "each revision overwrote the one before"
        );
    }
    let writers: HashSet<i64> =
        revisions.iter().map(|r| r["data"]["writer"].as_i64().expect("writer")).collect();
    assert_eq!(writers.len(), 24, "no revision lost");
    let (_, current) = app.call(Method::GET, "/observations/shared", Some(&admin), None).await;
    assert_eq!(current["version"], revisions[0]["version"]);
    assert_eq!(current["data"], revisions[0]["data"]);
}

/// A connection keeps its plan of each commit statement, and makes it while the tables may still
/// be empty; the group commit's lookups must probe an index per key however large the tables grow.
#[actix_web::test]
async fn the_commits_lookups_are_planned_as_index_probes_on_empty_tables() {
    use synkronus::db::commit::{keyed_statements, INDEX_PROBES_ONLY_SQL};
    let app = TestApp::spawn().await;
    let db = connect(&app.db_conn).await;
    // The worst case: statistics that say every table is empty.
    db.batch_execute("ANALYZE records, record_revisions, transmissions").await.expect("analyze");
    let generic_plans = |probes_only: bool| {
        let db = &db;
        async move {
            db.batch_execute("BEGIN; SET LOCAL plan_cache_mode = force_generic_plan").await.expect("begin");
            if probes_only {
                db.execute(INDEX_PROBES_ONLY_SQL, &[]).await.expect("planner settings");
            }
            let mut plans = Vec::new();
            for (i, sql) in keyed_statements().iter().enumerate() {
                db.batch_execute(&format!("PREPARE lookup{i} AS {sql}")).await.expect("prepare");
                let params: i32 = db
                    .query_one(
                        "SELECT cardinality(parameter_types) FROM pg_prepared_statements WHERE name = $1",
                        &[&format!("lookup{i}")],
                    )
                    .await
                    .expect("parameters")
                    .get(0);
                let nulls = vec!["NULL"; params as usize].join(", ");
                let lines =
                    db.query(&format!("EXPLAIN EXECUTE lookup{i}({nulls})"), &[]).await.expect("explain");
                plans.push((sql.to_string(), lines.iter().map(|l| l.get(0)).collect::<Vec<String>>()));
            }
            db.batch_execute("ROLLBACK; DEALLOCATE ALL").await.expect("rollback");
            plans
        }
    };
    // Each read of a table must be an index or TID scan with a condition on its key.
    let probes_by_key = |plan: &[String]| {
        plan.iter().enumerate().all(|(i, line)| {
            let reads_a_table = ["records", "record_revisions", "transmissions"]
                .iter()
                .any(|t| line.contains(&format!(" on {t} ")) && line.contains("Scan"));
            let next = plan.get(i + 1).map(String::as_str).unwrap_or("");
            !reads_a_table
                || line.contains("Bitmap Heap Scan")
                || ((line.contains("Index Scan") || line.contains("Tid Scan"))
                    && (next.contains("Index Cond") || next.contains("TID Cond")))
        })
    };
    // Without the settings the planner does read whole tables here, so the check can fail.
    let unguarded = generic_plans(false).await;
    assert!(!unguarded.iter().all(|(_, plan)| probes_by_key(plan)), "{unguarded:#?}");
    for (sql, plan) in generic_plans(true).await {
        assert!(probes_by_key(&plan), "{sql}\n{}", plan.join("\n"));
    }
}
