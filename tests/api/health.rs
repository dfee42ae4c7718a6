//! Health and information (docs/api.md §5), including the 503 while the database is unreachable and the
//! recovery afterwards.

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::{assert_error, cluster, TestApp};

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().expect("object").keys().cloned().collect();
    k.sort();
    k
}

fn assert_utc_timestamp(v: &Value) {
    let s = v.as_str().expect("timestamp string");
    assert!(s.ends_with('Z'), "{s}");
    chrono::DateTime::parse_from_rfc3339(s).expect("RFC 3339");
}

#[actix_web::test]
async fn descriptor_health_ready_versions() {
    let app = TestApp::spawn().await;
    let res = app.send(Method::GET, "/", None, None).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers().get("content-type").and_then(|v| v.to_str().ok()), Some("application/json"));
    let body: Value = res.json().await.expect("json");
    assert_eq!(
        body,
        json!({"service": "synkronus", "version": VERSION, "api_version": "1.1.0",
               "health": "/health", "openapi": "/openapi/synkronus.yaml"})
    );
    assert_eq!(app.call(Method::GET, "/api/v1", None, None).await.0, StatusCode::NOT_FOUND);

    for prefix in ["", "/api", "/api/v1"] {
        let (status, body) = app.call(Method::GET, &format!("{prefix}/health"), None, None).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(keys(&body), ["database", "node", "status", "storage", "timestamp", "version"]);
        assert_eq!(body["node"], app.state.config.node_id.as_str());
        assert_eq!(body["status"], "OK");
        assert_eq!(body["database"], "up");
        assert_eq!(body["storage"], "up");
        assert_eq!(body["version"], VERSION);
        assert_utc_timestamp(&body["timestamp"]);

        let (status, body) = app.call(Method::GET, &format!("{prefix}/ready"), None, None).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body, json!({"status": "ready"}));

        let (status, body) = app.call(Method::GET, &format!("{prefix}/versions"), None, None).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            body,
            json!({"current": "1.1.0",
                   "versions": [{"version": "1.0", "status": "supported"}, {"version": "1.1", "status": "current"}]})
        );
    }
}

#[actix_web::test]
async fn ready_reflects_startup_and_the_server_stops_gracefully() {
    let app = TestApp::spawn().await;
    assert!(app.base.ends_with(&format!(":{}", app.port)));
    // Startup prepared the data root before the listener opened.
    for dir in ["app-bundles", "attachments"] {
        assert!(app.data_root.path().join(dir).is_dir(), "{dir}");
    }
    assert!(app.state.is_ready());
    app.state.ready.store(false, std::sync::atomic::Ordering::Release);
    let res = app.send(Method::GET, "/ready", None, None).await;
    assert_eq!(res.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("5"));
    let status = res.status();
    let body: Value = res.json().await.expect("json");
    assert_error(status, &body, 503, "SERVICE_UNAVAILABLE");
    // Liveness is not readiness.
    assert_eq!(app.call(Method::GET, "/health", None, None).await.0, StatusCode::OK);
    app.state.ready.store(true, std::sync::atomic::Ordering::Release);
    assert_eq!(app.call(Method::GET, "/ready", None, None).await.0, StatusCode::OK);

    app.handle.stop(true).await;
    let refused = app.client.get(app.url("/health")).timeout(Duration::from_secs(3)).send().await;
    assert!(refused.is_err(), "still serving after stop");
}

#[actix_web::test]
async fn version_at_every_prefix_ignores_tokens() {
    let app = TestApp::spawn().await;
    let db_name = app.db_conn.split_whitespace().find_map(|kv| kv.strip_prefix("dbname=")).expect("dbname");
    for path in ["/version", "/api/version", "/api/v1/version"] {
        for token in [None, Some("stale-or-garbage")] {
            let (status, body) = app.call(Method::GET, path, token, None).await;
            assert_eq!(status, StatusCode::OK, "{path}");
            assert_eq!(
                keys(&body),
                [
                    "build",
                    "build_time",
                    "database",
                    "git_commit",
                    "go_version",
                    "server",
                    "system",
                    "version"
                ]
            );
            assert_eq!(body["version"], VERSION);
            assert_eq!(body["server"], json!({"version": VERSION}));
            assert_eq!(body["database"]["type"], "postgresql");
            assert!(
                body["database"]["version"].as_str().is_some_and(|v| v.starts_with("PostgreSQL ")),
                "{body}"
            );
            assert_eq!(body["database"]["database_name"], db_name);
            assert_eq!(body["system"]["os"], "linux");
            assert!(body["system"]["architecture"].as_str().is_some_and(|a| !a.is_empty()));
            assert!(body["system"]["cpus"].as_u64().is_some_and(|n| n >= 1));
            assert_eq!(body["build"]["commit"], body["git_commit"]);
            assert_eq!(body["build"]["build_time"], body["build_time"]);
            assert_eq!(body["build"]["go_version"], body["go_version"]);
            assert!(body["go_version"].as_str().is_some_and(|v| !v.is_empty()));
        }
    }
}

#[actix_web::test]
async fn status_needs_read_only() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let reader = app.user_token(&admin, "reader", "read-only").await;
    for token in [&reader, &admin] {
        for path in ["/status", "/api/status", "/api/v1/status"] {
            let (status, body) = app.call(Method::GET, path, Some(token), None).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            assert_eq!(
                keys(&body),
                [
                    "active_bundle_version",
                    "attachment_count",
                    "current_change_id",
                    "database",
                    "observation_count",
                    "status",
                    "uptime_seconds",
                    "version"
                ]
            );
            assert_eq!(body["status"], "OK");
            assert_eq!(body["version"], VERSION);
            assert_eq!(body["database"], "up");
            assert_eq!(body["active_bundle_version"], Value::Null);
            assert_eq!(body["observation_count"], 0);
            assert!(body["uptime_seconds"].is_u64());
            assert!(body["attachment_count"].is_u64());
            assert!(body["current_change_id"].is_i64());
        }
    }
    let (status, body) = app.call(Method::GET, "/api/v1/status", None, None).await;
    assert_error(status, &body, 401, "MISSING_TOKEN");
    let (status, body) = app.call(Method::GET, "/status", Some("x.y.z"), None).await;
    assert_error(status, &body, 401, "INVALID_TOKEN");
}

/// A connection to the cluster's `postgres` database, for taking a test database away.
async fn superuser() -> tokio_postgres::Client {
    let (client, conn) =
        tokio_postgres::connect(&cluster().connection_string("postgres"), tokio_postgres::NoTls)
            .await
            .expect("connect to postgres");
    tokio::spawn(conn);
    client
}

/// GETs `path` until it answers `expected`, each request within 3 s, for at most 10 s.
async fn until_status(
    app: &TestApp,
    path: &str,
    token: Option<&str>,
    expected: StatusCode,
) -> reqwest::Response {
    let started = Instant::now();
    loop {
        let mut req = app.client.get(app.url(path)).timeout(Duration::from_secs(3));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let res = req.send().await.unwrap_or_else(|e| panic!("{path} hung or failed: {e}"));
        if res.status() == expected {
            return res;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{path} never answered {expected}: {}",
            res.status()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[actix_web::test]
async fn health_is_503_while_the_database_is_unreachable_and_recovers_by_itself() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let db_name = app.db_conn.split_whitespace().find_map(|kv| kv.strip_prefix("dbname=")).expect("dbname");
    let pg = superuser().await;
    pg.batch_execute(&format!("ALTER DATABASE {db_name} ALLOW_CONNECTIONS false")).await.expect("block");
    pg.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", &[&db_name])
        .await
        .expect("terminate");

    let res = until_status(&app, "/health", None, StatusCode::SERVICE_UNAVAILABLE).await;
    let retry = res.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_string);
    assert_eq!(retry.as_deref(), Some("5"));
    assert_eq!(
        res.headers().get("content-type").and_then(|v| v.to_str().ok()),
        Some("application/problem+json")
    );
    let body: Value = res.json().await.expect("json");
    assert_error(StatusCode::SERVICE_UNAVAILABLE, &body, 503, "SERVICE_UNAVAILABLE");
    assert_eq!(body["database"], "down");
    assert_eq!(body["node"], app.state.config.node_id.as_str());
    assert_eq!(body["version"], VERSION);
    assert_utc_timestamp(&body["timestamp"]);
    // No internals in the message.
    assert!(!body["message"].as_str().unwrap_or("").contains(db_name), "{body}");

    // Every other route answers promptly too: 503 where the database is needed, never 500 or a hang.
    for path in ["/api/health", "/ready", "/auth/me", "/users", "/status"] {
        let res = until_status(&app, path, Some(&admin), StatusCode::SERVICE_UNAVAILABLE).await;
        assert_eq!(res.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("5"), "{path}");
        let body: Value = res.json().await.expect("json");
        assert_error(StatusCode::SERVICE_UNAVAILABLE, &body, 503, "SERVICE_UNAVAILABLE");
    }
    let res = app
        .client
        .post(app.url("/auth/login"))
        .timeout(Duration::from_secs(3))
        .json(&json!({"username": "admin", "password": crate::helpers::ADMIN_PASSWORD}))
        .send()
        .await
        .expect("login answers");
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    let res = until_status(&app, "/version", None, StatusCode::OK).await;
    let body: Value = res.json().await.expect("json");
    assert_eq!(body["database"]["version"], "unknown");
    assert_eq!(body["database"]["database_name"], "unknown");
    // verify cannot tell a valid token from a revoked one without the database.
    let res = until_status(&app, "/auth/verify", Some(&admin), StatusCode::SERVICE_UNAVAILABLE).await;
    let body: Value = res.json().await.expect("json");
    assert_error(StatusCode::SERVICE_UNAVAILABLE, &body, 503, "SERVICE_UNAVAILABLE");

    pg.batch_execute(&format!("ALTER DATABASE {db_name} ALLOW_CONNECTIONS true")).await.expect("unblock");
    let res = until_status(&app, "/health", None, StatusCode::OK).await;
    let body: Value = res.json().await.expect("json");
    assert_eq!(body["database"], "up");
    until_status(&app, "/ready", None, StatusCode::OK).await;
    until_status(&app, "/auth/me", Some(&admin), StatusCode::OK).await;
    app.admin_token().await;
}
