//! Graceful degradation and shutdown (docs/api.md §2 and 16): the database server stopped and started
//! under a running server, SIGTERM during a push storm, and logs without secrets.

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use synkronus::db::embedded::EmbeddedPostgres;

use crate::helpers::{ChildServer, TestApp, ADMIN_PASSWORD, JWT_SECRET};

/// Sends requests built by `make` until one answers `expected` (each within 8 s, all within 30 s).
async fn until(
    expected: StatusCode,
    what: &str,
    make: impl Fn() -> reqwest::RequestBuilder,
) -> reqwest::Response {
    let started = Instant::now();
    loop {
        let res = make().timeout(Duration::from_secs(8)).send().await;
        match res {
            Ok(res) if res.status() == expected => return res,
            Ok(res) => {
                let status = res.status();
                assert!(status.as_u16() != 500, "{what}: 500 {}", res.text().await.unwrap_or_default());
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "{what} never answered {expected}: {status}"
                );
            }
            Err(e) => panic!("{what} hung or failed: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn record_push(tid: &str, id: &str) -> Value {
    json!({"transmission_id": tid, "client_id": "resilience", "records": [
        {"observation_id": id, "form_type": "survey", "form_version": "1", "data": {"id": id}}]})
}

#[actix_web::test]
async fn database_server_stopped_and_restarted_under_a_running_server() {
    let dir = std::path::PathBuf::from(format!(
        "/tmp/synk-stop-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    ));
    let pg = EmbeddedPostgres::new(dir.clone(), None, "postgres")
        .expect("PostgreSQL binaries")
        .with_setting("fsync=off")
        .with_setting("synchronous_commit=off");
    let starter = pg.clone();
    tokio::task::spawn_blocking(move || starter.start()).await.expect("join").expect("start cluster");
    pg.ensure_database("synk").await.expect("database");
    let app = TestApp::spawn_on(pg.connection_string("synk"), &[]).await;
    let admin = app.admin_token().await;
    let (status, _) =
        app.call(Method::POST, "/sync/push", Some(&admin), Some(record_push("t1", "before"))).await;
    assert_eq!(status, StatusCode::OK);

    let stopper = pg.clone();
    tokio::task::spawn_blocking(move || stopper.stop()).await.expect("join").expect("stop cluster");

    let health = || app.client.get(app.url("/health"));
    let res = until(StatusCode::SERVICE_UNAVAILABLE, "/health", health).await;
    assert!(res.headers().contains_key("retry-after"));
    for (method, path, body) in [
        (Method::GET, "/auth/me", None),
        (Method::GET, "/status", None),
        (Method::POST, "/sync/push", Some(record_push("t2", "during"))),
        (Method::POST, "/sync/pull", Some(json!({"client_id": "resilience"}))),
    ] {
        let make = || {
            let mut req = app.client.request(method.clone(), app.url(path)).bearer_auth(&admin);
            if let Some(b) = &body {
                req = req.json(b);
            }
            req
        };
        let started = Instant::now();
        let res = until(StatusCode::SERVICE_UNAVAILABLE, path, make).await;
        assert!(started.elapsed() < Duration::from_secs(15), "{path} took {:?}", started.elapsed());
        let retry: u64 = res.headers()["retry-after"].to_str().expect("ascii").parse().expect("seconds");
        assert!(retry >= 1, "{path}");
        let body: Value = res.json().await.expect("problem");
        assert_eq!(body["code"], "SERVICE_UNAVAILABLE", "{path}: {body}");
    }

    let starter = pg.clone();
    tokio::task::spawn_blocking(move || starter.start()).await.expect("join").expect("restart cluster");
    until(StatusCode::OK, "/health after restart", health).await;
    until(StatusCode::OK, "/auth/me after restart", || {
        app.client.get(app.url("/auth/me")).bearer_auth(&admin)
    })
    .await;
    let push =
        || app.client.post(app.url("/sync/push")).bearer_auth(&admin).json(&record_push("t3", "after"));
    until(StatusCode::OK, "push after restart", push).await;
    let (status, body) =
        app.call(Method::POST, "/sync/pull", Some(&admin), Some(json!({"client_id": "resilience"}))).await;
    assert_eq!(status, StatusCode::OK);
    let ids: Vec<&str> = body["records"]
        .as_array()
        .expect("records")
        .iter()
        .filter_map(|r| r["observation_id"].as_str())
        .collect();
    assert!(ids.contains(&"before") && ids.contains(&"after"), "{ids:?}");
    assert!(!ids.contains(&"during"), "a push answered 503 stored nothing");

    app.handle.stop(true).await;
    let stopper = pg.clone();
    let _ = tokio::task::spawn_blocking(move || stopper.stop()).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[actix_web::test]
async fn sigterm_during_a_push_storm_loses_no_acknowledged_push() {
    let mut server = ChildServer::spawn(&[]).await;
    let client = server.client.clone();
    let token = server.admin_token().await;

    let acked_pushes = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut pushers = Vec::new();
    for worker in 0..8 {
        let (client, base, token) = (client.clone(), server.base.clone(), token.clone());
        let acked_pushes = acked_pushes.clone();
        pushers.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            for n in 0.. {
                let ids: Vec<String> = (0..5).map(|i| format!("w{worker}-{n}-{i}")).collect();
                let records: Vec<Value> = ids
                    .iter()
                    .map(|id| json!({"observation_id": id, "form_type": "storm", "form_version": "1", "data": {"n": n}}))
                    .collect();
                let body = json!({"transmission_id": format!("w{worker}-{n}"), "client_id": format!("w{worker}"),
                    "records": records});
                let sent = client.post(format!("{base}/sync/push")).bearer_auth(&token).json(&body).send().await;
                match sent {
                    Ok(res) if res.status() == StatusCode::OK => {
                        acked.extend(ids);
                        acked_pushes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    // Refused or cut off by the shutdown: not acknowledged, so not promised.
                    Ok(res) if res.status().is_server_error() => {
                        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE, "no 500 while stopping")
                    }
                    Ok(res) => panic!("unexpected {}", res.status()),
                    Err(_) => break,
                }
            }
            acked
        }));
    }
    // The storm is under way (every pusher about to send again) before the signal.
    let started = std::time::Instant::now();
    while acked_pushes.load(std::sync::atomic::Ordering::SeqCst) < 16 {
        assert!(started.elapsed() < Duration::from_secs(30), "the storm does not get going");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let status = server.terminate(Duration::from_secs(40)).await;
    assert!(status.success(), "exit status after SIGTERM: {status:?}");

    let mut acked = Vec::new();
    for p in pushers {
        acked.extend(p.await.expect("pusher"));
    }
    assert!(acked.len() >= 40, "the storm pushed too little to mean anything: {}", acked.len());
    let (db, conn) = tokio_postgres::connect(&server.db_conn, tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(conn);
    let rows = db.query("SELECT id FROM records WHERE form_type = 'storm'", &[]).await.expect("records");
    let stored: std::collections::HashSet<String> = rows.iter().map(|r| r.get(0)).collect();
    let lost: Vec<&String> = acked.iter().filter(|id| !stored.contains(*id)).collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged records lost, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
}

#[actix_web::test]
async fn debug_json_logs_hold_no_secrets() {
    let mut server = ChildServer::spawn(&[("LOG_LEVEL", "debug"), ("LOG_FORMAT", "json")]).await;
    let client = server.client.clone();
    let url = |p: &str| server.url(p);

    let session = server.login("admin", ADMIN_PASSWORD).await;
    let access = session["token"].as_str().expect("token").to_string();
    let refresh = session["refresh_token"].as_str().expect("refresh").to_string();
    let user_password = "user-secret-Password-42";
    let res = client
        .post(url("/users"))
        .bearer_auth(&access)
        .json(&json!({"username": "logged", "password": user_password, "role": "read-write"}))
        .send()
        .await
        .expect("create user");
    assert_eq!(res.status(), StatusCode::CREATED);
    let user = server.login("admin", ADMIN_PASSWORD).await;
    let res = client
        .post(url("/auth/login"))
        .json(&json!({"username": "logged", "password": user_password}))
        .send()
        .await
        .expect("user login");
    assert_eq!(res.status(), StatusCode::OK);
    let user_session: Value = res.json().await.expect("json");
    let user_access = user_session["token"].as_str().expect("token").to_string();
    let res = client
        .post(url("/sync/push"))
        .bearer_auth(&user_access)
        .json(&record_push("log-1", "log-rec"))
        .send()
        .await;
    assert_eq!(res.expect("push").status(), StatusCode::OK);
    // Refresh (rotating), then reuse the old refresh token, which revokes the family.
    let res = client
        .post(url("/auth/refresh"))
        .json(&json!({"refresh_token": refresh}))
        .send()
        .await
        .expect("refresh");
    assert_eq!(res.status(), StatusCode::OK);
    let rotated: Value = res.json().await.expect("json");
    let res = client
        .post(url("/auth/refresh"))
        .json(&json!({"refresh_token": refresh}))
        .send()
        .await
        .expect("reuse");
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    // Errors: a wrong password, a malformed token, bad JSON, a wrong current password, a revoked token.
    let wrong = "wrong-Password-secret-99";
    let res =
        client.post(url("/auth/login")).json(&json!({"username": "admin", "password": wrong})).send().await;
    assert_eq!(res.expect("bad login").status(), StatusCode::UNAUTHORIZED);
    let forged = format!("{access}x");
    let res = client.get(url("/auth/me")).bearer_auth(&forged).send().await.expect("forged");
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let res = client
        .post(url("/sync/push"))
        .bearer_auth(&user_access)
        .body("{not json")
        .send()
        .await
        .expect("bad json");
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    let res = client
        .post(url("/users/change-password"))
        .bearer_auth(&user_access)
        .json(&json!({"current_password": wrong, "new_password": "another-Secret-77"}))
        .send()
        .await
        .expect("change password");
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let res = client.post(url("/auth/logout")).bearer_auth(&user_access).send().await.expect("logout");
    assert_eq!(res.status(), StatusCode::OK);
    let res = client.get(url("/auth/me")).bearer_auth(&user_access).send().await.expect("revoked");
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);

    assert!(server.terminate(Duration::from_secs(40)).await.success());

    let text = server.log_text();
    assert!(text.lines().count() >= 3, "debug logging wrote almost nothing:\n{text}");
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let parsed: Result<Value, _> = serde_json::from_str(line);
        assert!(parsed.is_ok_and(|v| v.is_object()), "not a JSON object: {line}");
    }
    let secrets = [
        ("admin password", ADMIN_PASSWORD.to_string()),
        ("user password", user_password.to_string()),
        ("wrong password", wrong.to_string()),
        ("JWT secret", JWT_SECRET.to_string()),
        ("access token", access.clone()),
        ("second access token", user["token"].as_str().unwrap_or_default().to_string()),
        ("user access token", user_access.clone()),
        ("refresh token", refresh.clone()),
        ("rotated refresh token", rotated["refresh_token"].as_str().unwrap_or_default().to_string()),
        ("rotated access token", rotated["token"].as_str().unwrap_or_default().to_string()),
    ];
    for (what, secret) in secrets {
        assert!(!secret.is_empty(), "{what}");
        assert!(!text.contains(&secret), "the {what} appears in the logs");
        // A token's signature alone is secret too.
        if let Some(sig) = secret.rsplit('.').next().filter(|s| s.len() >= 20) {
            assert!(!text.contains(sig), "part of the {what} appears in the logs");
        }
    }
}
