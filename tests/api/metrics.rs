//! `/metrics` (docs/api.md §14) and the per-user request rate (docs/api.md §15).

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use synkronus::config::Config;
use synkronus::db::scope::prepare::{self, ChunkWrite};
use synkronus::startup::Application;

use crate::helpers::{assert_error, small_bundle, test_env, TestApp};
use crate::scope_prepare::HeldPreparation;
use crate::scopes::{create_user, push, record, wait_in_force, Device};

/// The value of the first sample of `name` whose labels include every `labels` pair (0 if none).
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(series, _)| {
            let (metric, rest) = series.split_once('{').unwrap_or((series, ""));
            metric == name && labels.iter().all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|(_, value)| value.parse::<f64>().ok())
        .next()
        .unwrap_or(0.0)
}

fn has_series(text: &str, name: &str) -> bool {
    text.lines().any(|l| !l.starts_with('#') && l.starts_with(name))
}

async fn scrape(app: &TestApp, token: &str) -> String {
    let res = app.send(Method::GET, "/metrics", Some(token), None).await;
    assert_eq!(res.status(), StatusCode::OK);
    let ctype = res.headers()["content-type"].to_str().expect("ascii").to_string();
    assert_eq!(ctype, "text/plain; version=0.0.4");
    res.text().await.expect("metrics text")
}

fn push_body(tid: &str, ids: &[&str]) -> Value {
    let records: Vec<Value> = ids
        .iter()
        .map(|id| json!({"observation_id": id, "form_type": "survey", "form_version": "1", "data": {"n": 1}}))
        .collect();
    json!({"transmission_id": tid, "client_id": "metrics-device", "records": records})
}

#[actix_web::test]
async fn metrics_need_admin_and_move_with_requests() {
    let app = TestApp::spawn_with(&[("NODE_ID", "metrics-node-1")]).await;
    let admin = app.admin_token().await;
    let reader = app.user_token(&admin, "reader", "read-only").await;

    let (status, body) = app.call(Method::GET, "/metrics", None, None).await;
    assert_error(status, &body, 401, "MISSING_TOKEN");
    let (status, body) = app.call(Method::GET, "/api/v1/metrics", Some(&reader), None).await;
    assert_error(status, &body, 403, "FORBIDDEN");

    let before = scrape(&app, &admin).await;
    let health = [("method", "GET"), ("route", "/health"), ("status", "200")];
    for path in ["/health", "/api/health", "/api/v1/health"] {
        assert_eq!(app.send(Method::GET, path, None, None).await.status(), StatusCode::OK);
    }
    let (status, _) =
        app.call(Method::POST, "/sync/push", Some(&admin), Some(push_body("t1", &["a", "b", "c"]))).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) =
        app.call(Method::POST, "/sync/push", Some(&admin), Some(push_body("t1", &["a", "b", "c"]))).await;
    assert_eq!(status, StatusCode::OK, "the replay");
    let (status, _) = app
        .call(Method::POST, "/sync/pull", Some(&admin), Some(json!({"client_id": "metrics-device"})))
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = app.call(Method::GET, "/users/nobody-here", Some(&admin), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let after = scrape(&app, &admin).await;

    // Other tests run in this process and share the recorder: counters move by at least our share.
    let moved =
        |name: &str, labels: &[(&str, &str)]| sample(&after, name, labels) - sample(&before, name, labels);
    assert!(moved("synkronus_http_requests_total", &health) >= 3.0, "{after}");
    let not_found = [("method", "GET"), ("route", "/users/{username}"), ("status", "404")];
    assert!(moved("synkronus_http_requests_total", &not_found) >= 1.0, "route templates, not paths");
    assert!(!after.contains("nobody-here"), "no path values in labels");
    assert!(moved("synkronus_sync_pushed_records_total", &[("dialect", "synkronus")]) >= 3.0);
    assert!(moved("synkronus_sync_pulled_records_total", &[("dialect", "synkronus")]) >= 3.0);
    assert!(moved("synkronus_sync_push_replays_total", &[]) >= 1.0);
    assert!(moved("synkronus_changelog_group_commit_size_count", &[]) >= 1.0);
    let latency = [("method", "GET"), ("route", "/health"), ("le", "+Inf")];
    assert!(moved("synkronus_http_request_duration_seconds_bucket", &latency) >= 3.0);
    for name in [
        "synkronus_changelog_head",
        "synkronus_exports_running",
        "synkronus_attachment_bytes_uploaded_total",
        "synkronus_rate_limited_total",
        "synkronus_db_pool_connections",
    ] {
        assert!(has_series(&after, name), "{name} missing:\n{after}");
    }
    assert!(sample(&after, "synkronus_changelog_head", &[]) >= 1.0);
    // Every series names the node that answered the scrape (docs/api.md §18.2).
    let unlabelled: Vec<&str> = after
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.contains("{node=\"metrics-node-1\","))
        .filter(|l| !l.contains("{node=\"metrics-node-1\"} "))
        .collect();
    assert!(unlabelled.is_empty(), "series without the node label: {unlabelled:?}");
    let (_, health) = app.call(Method::GET, "/health", None, None).await;
    assert_eq!(health["node"], "metrics-node-1");

    // The active bundle is read at scrape time. Other tests' servers share the recorder and may
    // scrape in between, so a few scrapes are allowed for ours to show.
    let pushed = app.push_bundle(&admin, small_bundle("1.0.0", "m"), true).await;
    let version = pushed["version"].as_str().unwrap_or_else(|| panic!("version in {pushed}")).to_string();
    let mut shown = false;
    for _ in 0..10 {
        let text = scrape(&app, &admin).await;
        if sample(&text, "synkronus_bundle_active_info", &[("version", &version)]) == 1.0 {
            shown = true;
            break;
        }
    }
    assert!(shown, "synkronus_bundle_active_info{{version=\"{version}\"}} 1 never appeared");
    assert!(sample(&after, "synkronus_db_pool_connections", &[("state", "idle")]) >= 0.0);
}

/// Scrapes until `check` holds (other tests' servers share the recorder and may set the gauges
/// read at scrape time in between); the last scrape if it never does.
async fn scrape_until(app: &TestApp, token: &str, check: impl Fn(&str) -> bool) -> (bool, String) {
    let mut text = String::new();
    for _ in 0..20 {
        text = scrape(app, token).await;
        if check(&text) {
            return (true, text);
        }
    }
    (false, text)
}

/// What an operator of a scoped deployment watches (docs/api.md §14, §20): the set in force, the
/// one being prepared and its scan's progress, the pages read scoped, the records refused.
#[actix_web::test]
async fn scope_metrics_show_the_sets_the_preparation_scoped_pages_and_refusals() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let north = create_user(&app, &admin, "north", "read-write", json!({"district": ["north"]})).await;
    let households: Vec<Value> = (0..5)
        .map(|i| {
            record(&format!("h{i}"), "household", json!({"district": if i == 0 { "east" } else { "north" }}))
        })
        .collect();
    push(&app, &admin, "admin-device", households).await;

    // Staged as in tests/api/scope_prepare.rs: the server's preparer waits while the test holds the
    // preparation lock, and the test scans the first chunk itself.
    let HeldPreparation { holder, version, plan } = HeldPreparation::begin(&app, &admin).await;
    let mut db = app.state.pool.get().await.expect("connection");
    let batch = prepare::read_batch(&db, &plan).await.expect("read").expect("records to scan");
    let (after, chunk) = batch.chunks().next().expect("a chunk");
    let tx = db.transaction().await.expect("transaction");
    assert_eq!(
        prepare::write_chunk(&tx, &plan, &chunk[..2], after).await.expect("write"),
        ChunkWrite::Written(2)
    );
    tx.commit().await.expect("commit");

    let v = version as f64;
    let (shown, text) = scrape_until(&app, &admin, |text| {
        sample(text, "synkronus_scope_set_version", &[("state", "preparing")]) == v
            && sample(text, "synkronus_scope_set_version", &[("state", "active")]) == 0.0
            && sample(text, "synkronus_scope_preparation_records", &[("progress", "scanned")]) == 2.0
            && sample(text, "synkronus_scope_preparation_records", &[("progress", "to_scan")]) == 5.0
    })
    .await;
    assert!(shown, "version {version} preparing, 2 of 5 records scanned:\n{text}");

    HeldPreparation::release(&holder).await;
    wait_in_force(&app, &admin, version).await;
    let (shown, text) = scrape_until(&app, &admin, |text| {
        sample(text, "synkronus_scope_set_version", &[("state", "active")]) == v
            && sample(text, "synkronus_scope_set_version", &[("state", "preparing")]) == 0.0
            && sample(text, "synkronus_scope_preparation_records", &[("progress", "to_scan")]) == 0.0
    })
    .await;
    assert!(shown, "version {version} in force, nothing preparing:\n{text}");

    // Counters move by at least this test's share (other tests run in this process).
    let before = scrape(&app, &admin).await;
    let mut phone = Device::new("north-phone");
    phone.sync(&app, &north, 2).await;
    assert_eq!(phone.ids(), ["h1", "h2", "h3", "h4"]);
    let body = json!({"transmission_id": "t-north", "client_id": "north-phone", "records": [
        record("h0", "household", json!({"district": "north"})),
        record("h1", "household", json!({"district": "north", "visited": true})),
    ]});
    let (status, answer) = app.push(&north, body).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["failed_records"][0]["error"], "OUT_OF_SCOPE", "{answer}");
    let after = scrape(&app, &admin).await;
    let moved =
        |name: &str, labels: &[(&str, &str)]| sample(&after, name, labels) - sample(&before, name, labels);
    assert!(moved("synkronus_sync_pull_pages_total", &[("read", "scoped")]) >= 2.0, "{after}");
    assert!(moved("synkronus_sync_out_of_scope_records_total", &[]) >= 1.0, "{after}");
    assert!(has_series(&after, "synkronus_sync_pull_pages_total"));
}

#[actix_web::test]
async fn metrics_port_serves_without_auth_and_nothing_else() {
    let db = crate::helpers::fresh_database().await;
    let data_root = tempfile::tempdir().expect("temp data root");
    let env = test_env(&crate::helpers::cluster().connection_string(&db), data_root.path(), &[]);
    let mut config = Config::from_lookup(|k| env.get(k).cloned()).expect("config");
    config.port = 0;
    config.metrics_port = Some(0);
    let app = Application::build(config).await.expect("build");
    let metrics_port = app.metrics_port().expect("metrics listener");
    let handle = app.handle();
    actix_web::rt::spawn(app.run_until_stopped());

    let client = reqwest::Client::new();
    let res = client.get(format!("http://127.0.0.1:{metrics_port}/metrics")).send().await.expect("scrape");
    assert_eq!(res.status(), StatusCode::OK);
    let text = res.text().await.expect("text");
    assert!(text.contains("synkronus_db_pool_connections"), "{text}");
    let res = client.get(format!("http://127.0.0.1:{metrics_port}/health")).send().await.expect("other");
    assert_eq!(res.status(), StatusCode::NOT_FOUND, "only /metrics on the metrics port");
    handle.stop(true).await;
}

#[actix_web::test]
async fn per_user_rate_limit_is_a_token_bucket() {
    let app = TestApp::spawn_with(&[("RATE_LIMIT_PER_USER_PER_SEC", "2")]).await;
    let admin = app.admin_token().await;
    let reader = app.user_token(&admin, "limited", "read-only").await;

    // Capacity 2R = 4: of a quick burst of 12, the first 4 pass, then only what refills meanwhile.
    let mut statuses = Vec::new();
    let mut limited_body = None;
    for _ in 0..12 {
        let res = app.send(Method::GET, "/auth/me", Some(&reader), None).await;
        statuses.push(res.status());
        if res.status() == StatusCode::TOO_MANY_REQUESTS {
            assert_eq!(res.headers()["retry-after"], "1");
            limited_body = Some(res.json::<Value>().await.expect("problem"));
        }
    }
    let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    assert!((4..=7).contains(&ok), "{statuses:?}");
    assert_eq!(statuses[..4], [StatusCode::OK; 4], "the first 2R pass");
    let body = limited_body.expect("some requests were limited");
    assert_error(StatusCode::TOO_MANY_REQUESTS, &body, 429, "RATE_LIMITED");

    // Exempt while the bucket is empty: public endpoints, HEAD, preflights and /metrics.
    assert_eq!(app.send(Method::GET, "/health", Some(&reader), None).await.status(), StatusCode::OK);
    assert_eq!(app.send(Method::HEAD, "/auth/me", Some(&reader), None).await.status(), StatusCode::OK);
    let preflight = app
        .client
        .request(Method::OPTIONS, app.url("/auth/me"))
        .header("origin", "https://example.org")
        .header("access-control-request-method", "GET")
        .send()
        .await
        .expect("preflight");
    assert!(preflight.status().is_success(), "{}", preflight.status());

    // Buckets are per user: the admin still has a full one, and /metrics costs nothing.
    for _ in 0..6 {
        assert_eq!(app.send(Method::GET, "/metrics", Some(&admin), None).await.status(), StatusCode::OK);
    }
    assert_eq!(app.send(Method::GET, "/auth/me", Some(&admin), None).await.status(), StatusCode::OK);
    let text = scrape(&app, &admin).await;
    let limited = (12 - ok) as f64;
    assert!(sample(&text, "synkronus_rate_limited_total", &[("limit", "user")]) >= limited);

    // Refill at R per second.
    app.advance_clock(std::time::Duration::from_millis(1100));
    assert_eq!(app.send(Method::GET, "/auth/me", Some(&reader), None).await.status(), StatusCode::OK);
}

#[actix_web::test]
async fn per_user_rate_limit_is_off_by_default() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    for _ in 0..30 {
        assert_eq!(app.send(Method::GET, "/auth/me", Some(&admin), None).await.status(), StatusCode::OK);
    }
}
