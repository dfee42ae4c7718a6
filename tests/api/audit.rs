//! The audit log (docs/api.md §18.4): every audited action leaves exactly one entry naming who,
//! from which IP and in which request; the table is append-only at the database; the listing's
//! filters, page tokens and role rule.

use reqwest::multipart::{Form, Part};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::{assert_error, small_bundle, wait_for_job, TestApp, ADMIN_PASSWORD, JWT_SECRET};

/// Sends a JSON request carrying `x-request-id: rid`; returns status and body.
async fn call_as(
    app: &TestApp,
    rid: &str,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut req = app.client.request(method, app.url(path)).header("x-request-id", rid);
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    if let Some(body) = body {
        req = req.json(&body);
    }
    let res = req.send().await.expect("request");
    let status = res.status();
    let text = res.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// `POST /app-bundle/push` of `bytes` in request `rid`.
async fn push_bundle_as(app: &TestApp, rid: &str, token: &str, bytes: Vec<u8>, activate: bool) -> Value {
    let part = Part::bytes(bytes).file_name("bundle.zip").mime_str("application/zip").expect("mime");
    let form = Form::new().part("bundle", part).text("activate", activate.to_string());
    let res = app
        .client
        .post(app.url("/app-bundle/push"))
        .header("x-request-id", rid)
        .bearer_auth(token)
        .multipart(form)
        .send()
        .await
        .expect("push");
    assert_eq!(res.status(), StatusCode::OK);
    res.json().await.expect("push body")
}

/// Every entry of the audit log (following the page tokens), newest first.
async fn all_entries(app: &TestApp, admin: &str, query: &str) -> Vec<Value> {
    let mut items = Vec::new();
    let mut path = format!("/admin/audit?limit=500&{query}");
    loop {
        let (status, body) = app.call(Method::GET, &path, Some(admin), None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        items.extend(body["items"].as_array().expect("items").iter().cloned());
        match body["next_page_token"].as_str() {
            Some(token) => path = format!("/admin/audit?page_token={token}"),
            None => return items,
        }
    }
}

/// The one entry of request `rid` with `action`: its actor, IP and request id are asserted.
fn the_entry<'a>(
    entries: &'a [Value],
    rid: &str,
    action: &str,
    actor: &str,
    target: Option<&str>,
) -> &'a Value {
    let found: Vec<&Value> =
        entries.iter().filter(|e| e["request_id"] == rid && e["action"] == action).collect();
    assert_eq!(found.len(), 1, "{action} in request {rid}: {found:?}");
    let entry = found[0];
    assert_eq!(entry["actor"], actor, "{entry}");
    assert_eq!(entry["client_ip"], "127.0.0.1", "{entry}");
    assert_eq!(entry["target"], target.map_or(Value::Null, Value::from), "{entry}");
    assert!(entry["node"].as_str().is_some_and(|n| !n.is_empty()), "{entry}");
    assert!(entry["at"].as_str().is_some_and(|t| t.ends_with('Z')), "{entry}");
    entry
}

#[actix_web::test]
async fn every_audited_action_leaves_one_entry_with_actor_ip_and_request_id() {
    let app = TestApp::spawn_with(&[("MAX_VERSIONS_KEPT", "2")]).await;
    let login = |rid: &'static str, username: &'static str, password: &'static str| {
        let body = json!({"username": username, "password": password});
        call_as(&app, rid, Method::POST, "/auth/login", None, Some(body))
    };

    // Sign-ins: a success, a wrong password, an unknown user.
    let (status, body) = login("r-sign-in", "admin", ADMIN_PASSWORD).await;
    assert_eq!(status, StatusCode::OK);
    let admin = body["token"].as_str().unwrap().to_string();
    assert_eq!(login("r-bad-password", "admin", "wrong-password").await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(login("r-no-user", "nobody", "wrong-password").await.0, StatusCode::UNAUTHORIZED);

    // Users: create, role change, reset, own change, refresh-token reuse, delete.
    let admin_ = Some(admin.as_str());
    let new_user = json!({"username": "ann", "password": "password-123", "role": "read-only"});
    assert_eq!(
        call_as(&app, "r-create", Method::POST, "/users", admin_, Some(new_user)).await.0,
        StatusCode::CREATED
    );
    let role = json!({"role": "read-write"});
    assert_eq!(
        call_as(&app, "r-role", Method::PUT, "/users/ann", admin_, Some(role)).await.0,
        StatusCode::OK
    );
    let reset = json!({"username": "ann", "newPassword": "password-456"});
    let (status, _) =
        call_as(&app, "r-reset", Method::POST, "/users/reset-password", admin_, Some(reset)).await;
    assert_eq!(status, StatusCode::OK);
    let ann = app.login("ann", "password-456").await;
    let change = json!({"currentPassword": "password-456", "newPassword": "password-789"});
    let ann_token = ann["token"].as_str();
    let (status, body) =
        call_as(&app, "r-change", Method::POST, "/users/change-password", ann_token, Some(change)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let ann = app.login("ann", "password-789").await;
    let refresh = json!({"refresh_token": ann["refresh_token"]});
    let (status, _) =
        call_as(&app, "r-refresh", Method::POST, "/auth/refresh", None, Some(refresh.clone())).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = call_as(&app, "r-reuse", Method::POST, "/auth/refresh", None, Some(refresh)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(call_as(&app, "r-delete", Method::DELETE, "/users/ann", admin_, None).await.0, StatusCode::OK);

    // Bundles: push and activate, push, switch forward, roll back, retention by a third push.
    push_bundle_as(&app, "r-push-1", &admin, small_bundle("20240101-000001", "a"), true).await;
    push_bundle_as(&app, "r-push-2", &admin, small_bundle("20240101-000002", "b"), false).await;
    let (status, _) =
        call_as(&app, "r-switch", Method::POST, "/app-bundle/switch/20240101-000002", admin_, None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) =
        call_as(&app, "r-back", Method::POST, "/app-bundle/switch/20240101-000001", admin_, None).await;
    assert_eq!(status, StatusCode::OK);
    push_bundle_as(&app, "r-push-3", &admin, small_bundle("20240101-000003", "c"), false).await;

    // A form spec (sent twice: the identical second one changes nothing), a reset, exports.
    let spec = json!({"formType": "visit", "version": "1", "schema": {"type": "object"},
        "uischema": {"type": "VerticalLayout", "elements": []}});
    let (status, _) = call_as(&app, "r-spec", Method::POST, "/formspecs", admin_, Some(spec.clone())).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(
        call_as(&app, "r-spec-again", Method::POST, "/formspecs", admin_, Some(spec)).await.0,
        StatusCode::OK
    );
    let confirm = json!({"confirm": "RESET_REPOSITORY"});
    let (status, _) =
        call_as(&app, "r-reset-repo", Method::POST, "/admin/repository/reset", admin_, Some(confirm)).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) =
        call_as(&app, "r-stream", Method::GET, "/data/export?format=csv&form_type=visit", admin_, None).await;
    assert_eq!(status, StatusCode::OK);
    let job = json!({"format": "json", "include_deleted": false});
    let (status, body) = call_as(&app, "r-job", Method::POST, "/dataexport/jobs", admin_, Some(job)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let job_id = body["job_id"].as_str().unwrap().to_string();
    let job = wait_for_job(&app, &admin, &job_id).await;
    assert_eq!(job["state"], "done", "{job}");
    let download = format!("/dataexport/jobs/{job_id}/download");
    assert_eq!(call_as(&app, "r-download", Method::GET, &download, admin_, None).await.0, StatusCode::OK);

    let entries = all_entries(&app, &admin, "").await;
    let ids: Vec<i64> = entries.iter().map(|e| e["id"].as_i64().unwrap()).collect();
    assert!(ids.windows(2).all(|w| w[0] > w[1]), "newest first: {ids:?}");

    the_entry(&entries, "r-sign-in", "auth.sign_in", "admin", Some("admin"));
    let failed = the_entry(&entries, "r-bad-password", "auth.sign_in_failed", "admin", Some("admin"));
    assert_eq!(failed["details"]["reason"], "wrong password");
    let failed = the_entry(&entries, "r-no-user", "auth.sign_in_failed", "nobody", Some("nobody"));
    assert_eq!(failed["details"]["reason"], "unknown user");
    let created = the_entry(&entries, "r-create", "user.create", "admin", Some("ann"));
    assert_eq!(created["details"]["role"], "read-only");
    let changed = the_entry(&entries, "r-role", "user.role_change", "admin", Some("ann"));
    assert_eq!(changed["details"], json!({"from": "read-only", "to": "read-write"}));
    the_entry(&entries, "r-reset", "user.password_reset", "admin", Some("ann"));
    the_entry(&entries, "r-change", "user.password_change", "ann", Some("ann"));
    the_entry(&entries, "r-reuse", "auth.refresh_token_reused", "ann", Some("ann"));
    the_entry(&entries, "r-delete", "user.delete", "admin", Some("ann"));
    let pushed = the_entry(&entries, "r-push-1", "bundle.push", "admin", Some("20240101-000001"));
    assert_eq!(pushed["details"]["activate"], true);
    the_entry(&entries, "r-push-1", "bundle.activate", "admin", Some("20240101-000001"));
    the_entry(&entries, "r-push-2", "bundle.push", "admin", Some("20240101-000002"));
    let switched = the_entry(&entries, "r-switch", "bundle.activate", "admin", Some("20240101-000002"));
    assert_eq!(switched["details"]["previous_version"], "20240101-000001");
    the_entry(&entries, "r-back", "bundle.rollback", "admin", Some("20240101-000001"));
    the_entry(&entries, "r-push-3", "bundle.push", "admin", Some("20240101-000003"));
    the_entry(&entries, "r-push-3", "bundle.retention_delete", "admin", Some("20240101-000002"));
    let spec = the_entry(&entries, "r-spec", "formspec.change", "admin", Some("visit"));
    assert_eq!(spec["details"]["version"], "1");
    let reset = the_entry(&entries, "r-reset-repo", "repository.reset", "admin", None);
    assert!(reset["details"]["repository_generation"].is_i64());
    let streamed = the_entry(&entries, "r-stream", "export.download", "admin", None);
    assert_eq!(streamed["details"]["format"], "csv");
    assert_eq!(streamed["details"]["form_types"], json!(["visit"]));
    assert_eq!(streamed["details"]["streamed"], true);
    let started = the_entry(&entries, "r-job", "export.start", "admin", Some(&job_id));
    assert_eq!(started["details"]["format"], "json");
    assert_eq!(started["details"]["include_deleted"], false);
    the_entry(&entries, "r-download", "export.download", "admin", Some(&job_id));

    // Each request left only the entries above: nothing twice, nothing for a no-op.
    let per_request = |rid: &str| entries.iter().filter(|e| e["request_id"] == rid).count();
    assert_eq!(per_request("r-push-1"), 2);
    assert_eq!(per_request("r-push-3"), 2);
    assert_eq!(per_request("r-spec-again"), 0);
    for rid in ["r-sign-in", "r-role", "r-reuse", "r-switch", "r-back", "r-job", "r-download"] {
        assert_eq!(per_request(rid), 1, "{rid}");
    }

    // Server start: version, node and the configuration, without secrets.
    let starts: Vec<&Value> = entries.iter().filter(|e| e["action"] == "server.start").collect();
    assert_eq!(starts.len(), 1);
    let start = starts[0];
    assert_eq!(start["actor"], Value::Null);
    assert_eq!(start["details"]["version"], env!("CARGO_PKG_VERSION"));
    // Every variable by name, as given or defaulted; secrets only as "(redacted)".
    assert_eq!(start["details"]["config"]["MAX_VERSIONS_KEPT"], "2");
    assert_eq!(start["details"]["config"]["JWT_SECRET"], "(redacted)");
    assert_eq!(start["node"], entries[0]["node"]);
    let text = start.to_string();
    assert!(!text.contains(JWT_SECRET) && !text.contains(ADMIN_PASSWORD), "{text}");
}

#[actix_web::test]
async fn the_database_refuses_to_update_or_delete_entries_except_in_the_sweep() {
    let app = TestApp::spawn().await;
    app.admin_token().await;
    let (client, conn) = tokio_postgres::connect(&app.db_conn, tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(conn);
    let count = |sql: &'static str| {
        let client = &client;
        async move { client.query_one(sql, &[]).await.expect("count").get::<_, i64>(0) }
    };
    let before = count("SELECT count(*) FROM audit_log").await;
    assert!(before >= 2, "server start and the sign-in");

    for sql in [
        "UPDATE audit_log SET actor = 'mallory'",
        "DELETE FROM audit_log",
        "DELETE FROM audit_log WHERE action = 'auth.sign_in'",
        "TRUNCATE audit_log",
    ] {
        let err = client.batch_execute(sql).await.expect_err(sql);
        assert!(err.as_db_error().is_some_and(|e| e.message().contains("append-only")), "{sql}: {err}");
    }
    assert_eq!(count("SELECT count(*) FROM audit_log").await, before);
    assert_eq!(count("SELECT count(*) FROM audit_log WHERE actor = 'mallory'").await, 0);

    // Even the sweep's setting does not allow an UPDATE.
    let err = client
        .batch_execute(
            "BEGIN; SET LOCAL synkronus.audit_sweep = 'on'; UPDATE audit_log SET actor = 'm'; COMMIT",
        )
        .await
        .expect_err("update in a sweep");
    assert!(err.as_db_error().is_some_and(|e| e.message().contains("append-only")), "{err}");
    client.batch_execute("ROLLBACK").await.expect("rollback");

    // The sweep removes what is past retention and nothing else.
    client
        .batch_execute(
            "INSERT INTO audit_log (at, actor, action, node) VALUES (now() - interval '400 days', 'old', 'auth.sign_in', 'n')",
        )
        .await
        .expect("insert an old entry");
    let mut db = app.state.pool.get().await.expect("pool");
    let removed = synkronus::db::audit::sweep(&mut db, 365).await.expect("sweep");
    assert_eq!(removed, 1);
    assert_eq!(count("SELECT count(*) FROM audit_log").await, before);
}

#[actix_web::test]
async fn filters_page_tokens_and_roles() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let reader = app.user_token(&admin, "reader", "read-only").await;
    for i in 0..5 {
        let body = json!({"username": "ghost", "password": format!("wrong-{i}")});
        assert_eq!(app.call(Method::POST, "/auth/login", None, Some(body)).await.0, StatusCode::UNAUTHORIZED);
    }

    // Paging by 2 walks the same entries as one page, newest first, and the token keeps the filter.
    let everything = all_entries(&app, &admin, "").await;
    let mut paged = Vec::new();
    let mut path = "/admin/audit?limit=2".to_string();
    loop {
        let (status, body) = app.call(Method::GET, &path, Some(&admin), None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let items = body["items"].as_array().unwrap();
        assert!(items.len() <= 2);
        paged.extend(items.iter().cloned());
        match body["next_page_token"].as_str() {
            // An explicit filter next to the token is ignored: the token wins.
            Some(token) => path = format!("/admin/audit?limit=2&page_token={token}&action=user.delete"),
            None => break,
        }
    }
    assert_eq!(paged, everything);

    let ghost = all_entries(&app, &admin, "actor=ghost").await;
    assert_eq!(ghost.len(), 5);
    assert!(ghost.iter().all(|e| e["action"] == "auth.sign_in_failed"));
    let (_, page) = app.call(Method::GET, "/admin/audit?actor=ghost&limit=3", Some(&admin), None).await;
    assert_eq!(page["items"].as_array().unwrap().len(), 3);
    let token = page["next_page_token"].as_str().expect("a second page");
    let (_, rest) =
        app.call(Method::GET, &format!("/admin/audit?page_token={token}"), Some(&admin), None).await;
    assert_eq!(rest["items"].as_array().unwrap().len(), 2);
    assert_eq!(rest["next_page_token"], Value::Null);

    let created = all_entries(&app, &admin, "action=user.create").await;
    assert_eq!(created.iter().filter(|e| e["target"] == "reader").count(), 1);
    assert!(created.iter().all(|e| e["action"] == "user.create"));
    let first_at = everything.last().unwrap()["at"].as_str().unwrap().to_string();
    let since = all_entries(&app, &admin, &format!("since={}", first_at.replace('+', "%2B"))).await;
    assert_eq!(since.len(), everything.len());
    assert!(all_entries(&app, &admin, "since=2999-01-01T00:00:00Z").await.is_empty());
    assert!(all_entries(&app, &admin, "until=2000-01-01T00:00:00%2B02:00").await.is_empty());
    assert_eq!(all_entries(&app, &admin, "until=2999-01-01T00:00:00Z").await.len(), everything.len());

    // The other prefixes serve the same listing.
    for prefix in ["/api", "/api/v1"] {
        let (status, body) =
            app.call(Method::GET, &format!("{prefix}/admin/audit?actor=ghost"), Some(&admin), None).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["items"].as_array().unwrap().len(), 5);
    }

    // Bad filters are 400s with the standard body; a foreign or broken token is INVALID_PAGE_TOKEN.
    for query in [
        "since=yesterday",
        "until=2025-01-01T00:00:00",
        "action=user.explode",
        "limit=ten",
        "since=2025-02-01T00:00:00Z&until=2025-01-01T00:00:00Z",
    ] {
        let (status, body) =
            app.call(Method::GET, &format!("/admin/audit?{query}"), Some(&admin), None).await;
        assert_error(status, &body, 400, "BAD_REQUEST");
    }
    let (_, observations) = app.call(Method::GET, "/observations?limit=1", Some(&admin), None).await;
    let foreign = observations["next_page_token"].as_str().unwrap();
    for token in [foreign, "a1.!!!", "garbage"] {
        let (status, body) =
            app.call(Method::GET, &format!("/admin/audit?page_token={token}"), Some(&admin), None).await;
        assert_error(status, &body, 400, "INVALID_PAGE_TOKEN");
    }
    // Out-of-range limits follow the listing rules (docs/api.md §1.5).
    let (status, body) = app.call(Method::GET, "/admin/audit?limit=0", Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["items"].as_array().unwrap().len(), everything.len().min(100));

    // Admins only.
    let (status, body) = app.call(Method::GET, "/admin/audit", Some(&reader), None).await;
    assert_error(status, &body, 403, "FORBIDDEN");
    let (status, body) = app.call(Method::GET, "/admin/audit", None, None).await;
    assert_error(status, &body, 401, "MISSING_TOKEN");
}
