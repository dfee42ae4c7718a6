//! Pull pages streamed as their rows arrive (docs/api.md §8.2): a page larger than one chunk is
//! sent chunked, in every dialect and with gzip, holding the same records as small sized pages;
//! a database failure before the first bytes is an error answer, after them a broken body.

use std::time::{Duration, Instant};

use rand::distributions::Alphanumeric;
use rand::Rng;
use reqwest::header::HeaderMap;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::{gunzip, TestApp};

/// A pull page larger than this is streamed (`CHUNK` in src/http/pull_body.rs).
const CHUNK: usize = 128 * 1024;

async fn push(app: &TestApp, token: &str, tid: &str, records: Vec<Value>) {
    let (status, body) =
        app.push(token, json!({"transmission_id": tid, "client_id": "seeder", "records": records})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// A record of about `bytes` bytes of data, with text that needs escaping in its fields.
fn record(i: usize, bytes: usize) -> Value {
    json!({"observation_id": format!("obs-{i} \"quoted\" é"), "form_type": "household", "form_version": "2",
           "created_at": "2025-06-25T12:00:00.5Z", "geolocation": {"lat": -1.25, "lon": 36.8},
           "author": "enumerator \\ 1", "tags": ["a", "b"],
           "data": {"members": i, "notes": "x".repeat(bytes), "nested": {"deep": [1, 2.5, null, "\u{1F600}"]}}})
}

/// A form that needs nothing escaped and packs poorly, so PostgreSQL stores its `data` out of line.
fn toasted_record(id: &str) -> Value {
    let noise: String = rand::thread_rng().sample_iter(&Alphanumeric).take(40_000).map(char::from).collect();
    json!({"observation_id": id, "form_type": "household", "data": {"noise": noise}})
}

/// Sends a pull: `(method, path, body, extra header)`; returns status, headers and raw bytes.
async fn fetch(
    app: &TestApp,
    token: &str,
    (method, path, body, header): &(Method, String, Option<Value>, Option<(&str, &str)>),
    gzip: bool,
) -> (StatusCode, HeaderMap, Vec<u8>) {
    let mut req = app.client.request(method.clone(), app.url(path)).bearer_auth(token);
    if let Some(b) = body {
        req = req.json(b);
    }
    if let Some((name, value)) = header {
        req = req.header(*name, *value);
    }
    if gzip {
        req = req.header("accept-encoding", "gzip");
    }
    let res = req.send().await.expect("request");
    let (status, headers) = (res.status(), res.headers().clone());
    (status, headers, res.bytes().await.expect("a complete body").to_vec())
}

/// The records of a page in any dialect.
fn records(page: &Value) -> Vec<Value> {
    page.get("records").unwrap_or(&page["changes"]["observations"]).as_array().expect("a record list").clone()
}

#[actix_web::test]
async fn pages_larger_than_a_chunk_are_streamed_in_every_dialect_and_hold_what_small_pages_hold() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    push(&app, &admin, "t1", (0..300).map(|i| record(i, 900)).collect()).await;
    push(&app, &admin, "t2", (300..420).map(|i| record(i, 40 + i % 7 * 300)).collect()).await;
    let (small_pages, head) = app.pull_all(&admin, "dev-small", 0, 7).await;
    assert_eq!(small_pages.len(), 420);
    // The listing builds each Observation through serde from a fully decoded record: the pulled
    // ones, written from the rows' bytes, hold the same fields and values.
    let (status, listed) = app.call(Method::GET, "/api/v1/observations?limit=500", Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK);
    let listed = listed["observations"].as_array().unwrap();
    assert_eq!(listed.len(), 420);
    for (pulled, listed) in small_pages.iter().zip(listed) {
        for (key, value) in pulled.as_object().unwrap() {
            assert_eq!(&listed[key], value, "{key} of {}", pulled["observation_id"]);
        }
    }

    let pulls = [
        (
            Method::POST,
            "/sync/pull?limit=400".to_string(),
            Some(json!({"client_id": "d", "since": {"version": 0}})),
            None,
        ),
        (
            Method::POST,
            "/sync/pull".to_string(),
            Some(json!({"client_id": "d", "since_change_id": 0, "limit": 400})),
            None,
        ),
        (
            Method::POST,
            "/sync/pull".to_string(),
            Some(json!({"clientId": "d", "currentVersion": 0, "limit": 400})),
            None,
        ),
        (Method::GET, "/sync/pull?client_id=d&since=0&limit=400".to_string(), None, None),
        (
            Method::GET,
            "/sync/pull?client_id=d&since=0&limit=400".to_string(),
            None,
            Some(("x-api-version", "1.0.0")),
        ),
    ];
    for pull in &pulls {
        let what = format!("{} {}", pull.0, pull.1);
        let (status, headers, plain) = fetch(&app, &admin, pull, false).await;
        assert_eq!(status, StatusCode::OK, "{what}: {}", String::from_utf8_lossy(&plain));
        assert!(plain.len() > 3 * CHUNK, "{what}: {} bytes", plain.len());
        assert!(headers.get("content-length").is_none(), "{what}: streamed, not sized");
        assert_eq!(headers["transfer-encoding"], "chunked", "{what}");
        assert_eq!(headers["x-repository-generation"], "1", "{what}");
        assert_eq!(headers["x-served-by"], "primary", "{what}");
        assert!(
            headers.get("vary").is_none_or(|v| !v.to_str().unwrap().contains("accept-encoding")),
            "{what}"
        );
        let page: Value = serde_json::from_slice(&plain).expect("a complete JSON page");
        let got = records(&page);
        assert_eq!(got.len(), 400, "{what}");
        let cutoff = page.get("change_cutoff").or(page.get("changeCutoff")).and_then(Value::as_i64);
        assert_eq!(cutoff, Some(400), "{what}");
        assert_eq!(page.get("has_more").or(page.get("hasMore")), Some(&json!(true)), "{what}");
        let ids = |list: &[Value]| -> Vec<Value> {
            list.iter()
                .map(|r| r.get("observation_id").or(r.get("observationId")).or(r.get("id")).cloned().unwrap())
                .collect()
        };
        assert_eq!(ids(&got), ids(&small_pages[..400]), "{what}");
        if page.get("current_version").is_some() && got[0].get("observation_id").is_some() {
            // The synkronus dialect: the same Observations, field for field, as the sized pages.
            assert_eq!(got, small_pages[..400], "{what}");
            assert_eq!(page["current_version"], head, "{what}");
        }

        let (status, headers, packed) = fetch(&app, &admin, pull, true).await;
        assert_eq!(status, StatusCode::OK, "{what}");
        assert_eq!(headers["content-encoding"], "gzip", "{what}");
        assert!(headers.get("content-length").is_none(), "{what}: streamed, not sized");
        assert!(headers["vary"].to_str().unwrap().contains("accept-encoding"), "{what}");
        assert!(packed.len() * 4 < plain.len(), "{what}: {} of {} bytes", packed.len(), plain.len());
        assert_eq!(gunzip(&packed), plain, "{what}: the decoded body is the plain one, byte for byte");
    }

    // The last page: the rest, without more, resuming after the head.
    let last = (
        Method::POST,
        "/sync/pull?limit=400".to_string(),
        Some(json!({"client_id": "d", "since": 400})),
        None,
    );
    let (_, headers, plain) = fetch(&app, &admin, &last, false).await;
    let page: Value = serde_json::from_slice(&plain).unwrap();
    assert_eq!(records(&page), small_pages[400..], "{}", String::from_utf8_lossy(&plain));
    assert_eq!((page["has_more"].clone(), page["change_cutoff"].clone()), (json!(false), json!(420)));
    assert!(page.get("next_page_token").is_none());
    assert_eq!(
        headers["content-length"],
        plain.len().to_string().as_str(),
        "a page within one chunk is sized"
    );
}

/// A client of the test database, as the server's own.
async fn db(app: &TestApp) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(&app.db_conn, tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(conn);
    client
}

/// Holds the lock that every read of out-of-line `data` waits for (the index of the records'
/// TOAST table), until the returned transaction ends: a pull then stops at the first such record.
async fn block_toast_reads(holder: &mut tokio_postgres::Client) -> tokio_postgres::Transaction<'_> {
    let tx = holder.transaction().await.unwrap();
    let index: String = tx
        .query_one(
            "SELECT indexrelid::regclass::text FROM pg_index
             WHERE indrelid = (SELECT reltoastrelid FROM pg_class WHERE oid = 'records'::regclass)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    tx.batch_execute(&format!("REINDEX INDEX {index}")).await.unwrap();
    tx
}

/// Waits until the pull statement waits for that lock, then cancels it: a failure in the middle of
/// the statement, as a replica's recovery conflict or a statement timeout would cause.
async fn cancel_the_waiting_pull(db: &tokio_postgres::Client) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let cancelled: i64 = db
            .query_one(
                "SELECT count(pg_cancel_backend(pid)) FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event_type = 'Lock'
                   AND query LIKE '%FROM change_head%LEFT JOIN LATERAL%'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if cancelled == 1 {
            return;
        }
        assert!(Instant::now() < deadline, "the pull never waited for the TOAST lock");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[actix_web::test]
async fn a_database_failure_after_the_first_chunk_breaks_the_body_and_before_it_is_an_error() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    push(&app, &admin, "t1", vec![toasted_record("big-first")]).await;
    push(&app, &admin, "t2", (0..200).map(|i| record(i, 900)).collect()).await;
    push(&app, &admin, "t3", vec![toasted_record("big-later")]).await;
    let mut holder = db(&app).await;
    let db = db(&app).await;
    let pull = |after: i64| {
        app.client
            .post(app.url("/sync/pull?limit=500"))
            .bearer_auth(&admin)
            .json(&json!({"client_id": "d", "since": {"version": after}}))
            .send()
    };

    // From the start, the page stops at its very first record: nothing has been sent yet, so the
    // client gets the error answer it always got.
    let tx = block_toast_reads(&mut holder).await;
    let (res, ()) = tokio::join!(pull(0), cancel_the_waiting_pull(&db));
    let res = res.expect("an answer");
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    assert!(res.json::<Value>().await.expect("an error body")["code"].is_string());
    tx.rollback().await.unwrap();

    // After the first record, two hundred records fill the first chunk and the answer starts; the
    // failure at the big record then breaks the body, which never ends like a complete page.
    let tx = block_toast_reads(&mut holder).await;
    let res = pull(1).await.expect("the answer starts");
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["transfer-encoding"], "chunked");
    cancel_the_waiting_pull(&db).await;
    assert!(res.bytes().await.is_err(), "a page cut short must not end like a complete one");
    tx.rollback().await.unwrap();

    // The server is fine, and the page is whole when asked again.
    let (records, _) = app.pull_all(&admin, "d", 0, 500).await;
    assert_eq!(records.len(), 202);
    assert_eq!(records[201]["observation_id"], "big-later");
    assert_eq!(records[201]["data"]["noise"].as_str().map(str::len), Some(40_000));
}

/// The reads of a device sync (pull pages, attachment manifests) are planned once per connection,
/// on connections of their own (`db::create_sync_pool`); every other request keeps PostgreSQL's
/// choice of plan, since many of their statements are only fast planned for their parameters.
#[actix_web::test]
async fn sync_connections_plan_generically_and_no_other_connection_does() {
    let conn = crate::helpers::cluster().connection_string(&crate::helpers::fresh_database().await);
    let plan_mode = |pool: deadpool_postgres::Pool| async move {
        let db = pool.get().await.expect("a connection");
        db.query_one("SHOW plan_cache_mode", &[]).await.expect("the setting").get::<_, String>(0)
    };
    let sync = synkronus::db::create_sync_pool(&conn, 1).expect("the sync pool");
    assert_eq!(plan_mode(sync).await, "force_generic_plan");
    let others = synkronus::db::create_pool(&conn, 1).expect("the request pool");
    assert_eq!(plan_mode(others).await, "auto");
}
