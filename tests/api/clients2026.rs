//! The 2026 clients' additions (API.md 17): version gate, repository generation, reset, presence.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::{assert_error, TestApp};

fn header(res: &reqwest::Response, name: &str) -> Option<String> {
    res.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string)
}

/// Presence is written off the request path (about once a second): poll for the device.
async fn wait_for_device(app: &TestApp, admin: &str, client_id: &str) -> Value {
    for _ in 0..50 {
        let (status, body) = app.call(Method::GET, "/api/devices", Some(admin), None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        if let Some(d) = body.as_array().and_then(|l| l.iter().find(|d| d["client_id"] == client_id)) {
            return d.clone();
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("presence rows did not appear");
}

#[actix_web::test]
async fn generation_reset_and_presence() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let device = app.user_token(&admin, "enum1", "read-write").await;
    let ode = |req: reqwest::RequestBuilder| {
        req.bearer_auth(&device).header("x-ode-version", "1.4.2").header("x-ode-client-id", "phone-1")
    };

    // An empty probe push teaches the device the generation.
    let res = ode(app.client.post(app.url("/api/sync/push")))
        .json(&json!({"transmission_id": "probe", "client_id": "phone-1", "records": []}))
        .send()
        .await
        .expect("probe");
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, "x-repository-generation").as_deref(), Some("1"));
    assert!(header(&res, "x-synkronus-version").is_some_and(|v| v.starts_with("1.")));
    let body: Value = res.json().await.expect("json");
    assert_eq!(body["repository_generation"], 1);

    let res = ode(app.client.post(app.url("/api/sync/push")))
        .header("x-repository-generation", "1")
        .json(&json!({"transmission_id": "t1", "client_id": "phone-1", "records": [
            {"observation_id": "o1", "form_type": "f", "data": {"x": 1}, "author": "enum1", "tags": ["t"]}]}))
        .send()
        .await
        .expect("push");
    assert_eq!(res.status(), StatusCode::OK);

    let res = ode(app.client.post(app.url("/api/sync/pull?limit=500")))
        .header("x-repository-generation", "1")
        .json(&json!({"client_id": "phone-1", "since": {"version": 0}}))
        .send()
        .await
        .expect("pull");
    assert_eq!(res.status(), StatusCode::OK);
    let body: Value = res.json().await.expect("json");
    assert_eq!(body["records"][0]["author"], "enum1");
    assert_eq!(body["repository_generation"], 1);

    let phone = wait_for_device(&app, &admin, "phone-1").await;
    assert_eq!(phone["username"], "enum1");
    assert_eq!(phone["client_version"], "1.4.2");

    // Reset: wrong confirmation, then the real one.
    let (status, err) = app
        .call(Method::POST, "/api/admin/repository/reset", Some(&admin), Some(json!({"confirm": "yes"})))
        .await;
    assert_error(status, &err, 400, "BAD_REQUEST");
    let (status, err) = app
        .call(
            Method::POST,
            "/api/admin/repository/reset",
            Some(&device),
            Some(json!({"confirm": "RESET_REPOSITORY"})),
        )
        .await;
    assert_error(status, &err, 403, "FORBIDDEN");
    let res = app
        .send(
            Method::POST,
            "/api/admin/repository/reset",
            Some(&admin),
            Some(json!({"confirm": "RESET_REPOSITORY"})),
        )
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, "x-repository-generation").as_deref(), Some("2"));
    let body: Value = res.json().await.expect("json");
    assert_eq!(body["repository_generation"], 2);
    assert_eq!(body["current_version"], 1, "change_ids are not reused");

    // The device still holding generation 1 is told to start over; nothing is stored.
    let res = ode(app.client.post(app.url("/api/sync/push")))
        .header("x-repository-generation", "1")
        .json(&json!({"transmission_id": "t2", "client_id": "phone-1", "records": [
            {"observation_id": "o2", "form_type": "f", "data": {}}]}))
        .send()
        .await
        .expect("push");
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert_eq!(header(&res, "x-repository-generation").as_deref(), Some("2"));
    let err: Value = res.json().await.expect("json");
    assert_eq!(err["code"], "repository_reset_required");
    assert_eq!(err["error"], "repository_reset_required");
    let res = ode(app.client.post(app.url("/api/sync/pull")))
        .json(&json!({"client_id": "phone-1", "repository_generation": 1}))
        .send()
        .await
        .expect("pull");
    assert_eq!(res.status(), StatusCode::CONFLICT);
    // A garbage header counts as not sent (and then the body is ignored).
    let res = ode(app.client.post(app.url("/api/sync/pull")))
        .header("x-repository-generation", "zero")
        .json(&json!({"client_id": "phone-1", "repository_generation": 1}))
        .send()
        .await
        .expect("pull");
    assert_eq!(res.status(), StatusCode::OK);
    // Dropping the generation adopts the server's; the old data is gone and ids continue.
    let res = ode(app.client.post(app.url("/api/sync/push")))
        .json(&json!({"transmission_id": "t3", "client_id": "phone-1", "records": [
            {"observation_id": "o3", "form_type": "f", "data": {}}]}))
        .send()
        .await
        .expect("push");
    assert_eq!(res.status(), StatusCode::OK);
    let body: Value = res.json().await.expect("json");
    assert_eq!(body["current_version"], 2);
    assert_eq!(body["repository_generation"], 2);
    let (_, status_body) = app.call(Method::GET, "/api/status", Some(&admin), None).await;
    assert_eq!(status_body["observation_count"], 1);

    // Lag and staleness filters.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let (_, list) = app.call(Method::GET, "/api/devices?username=enum1", Some(&admin), None).await;
    let phone =
        list.as_array().and_then(|l| l.iter().find(|d| d["client_id"] == "phone-1")).cloned().expect("phone");
    assert_eq!(phone["last_data_version"], 2);
    assert_eq!(phone["lag"], 0);
    let (_, stale) = app.call(Method::GET, "/api/devices?stale_after=3600", Some(&admin), None).await;
    assert_eq!(stale, json!([]));
    let (status, err) = app.call(Method::GET, "/api/devices?stale_after=soon", Some(&admin), None).await;
    assert_error(status, &err, 400, "BAD_REQUEST");
    let (status, err) = app.call(Method::GET, "/api/devices", Some(&device), None).await;
    assert_error(status, &err, 403, "FORBIDDEN");
}

#[actix_web::test]
async fn ode_version_gate_runs_before_auth() {
    let app = TestApp::spawn().await;
    for bad in ["2.0.0", "garbage", "0.9"] {
        let res =
            app.client.get(app.url("/api/auth/me")).header("x-ode-version", bad).send().await.expect("req");
        assert_eq!(res.status().as_u16(), 426, "{bad}");
        let body: Value = res.json().await.expect("json");
        assert_eq!(body["code"], "CLIENT_VERSION_UNSUPPORTED");
        assert!(body["synkronus_version"].as_str().is_some_and(|v| v.starts_with("1.")));
    }
    let res = app
        .client
        .get(app.url("/api/auth/me"))
        .header("x-ode-version", "v1.9.0-beta")
        .send()
        .await
        .expect("req");
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
}
