//! The 2026 clients' additions (docs/api.md §17): version gate, repository generation, reset, presence.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::{assert_error, sha256_hex, TestApp};

fn header(res: &reqwest::Response, name: &str) -> Option<String> {
    res.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string)
}

/// Presence is written off the request path (about once a second): poll for the device.
async fn wait_for_device(app: &TestApp, admin: &str, client_id: &str) -> Value {
    wait_for_device_where(app, admin, client_id, |_| true).await
}

/// Polls until the device's presence row satisfies `ready`.
async fn wait_for_device_where(
    app: &TestApp,
    admin: &str,
    client_id: &str,
    ready: impl Fn(&Value) -> bool,
) -> Value {
    for _ in 0..50 {
        let (status, body) = app.call(Method::GET, "/api/devices", Some(admin), None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let found = body.as_array().and_then(|l| l.iter().find(|d| d["client_id"] == client_id));
        if let Some(d) = found.filter(|d| ready(d)) {
            return d.clone();
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("the presence row of {client_id} did not appear as expected");
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

    // Lag and staleness filters, once presence has written the new data version.
    wait_for_device_where(&app, &admin, "phone-1", |d| d["last_data_version"] == 2).await;
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

    // An hour later on the server's clock (tokens expired with it), the device is stale.
    app.advance_clock(std::time::Duration::from_secs(3601));
    let admin = app.admin_token().await;
    let (_, stale) = app.call(Method::GET, "/api/devices?stale_after=3600", Some(&admin), None).await;
    let stale_ids: Vec<&str> =
        stale.as_array().expect("list").iter().filter_map(|d| d["client_id"].as_str()).collect();
    assert!(stale_ids.contains(&"phone-1"), "{stale}");
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

fn unzip(bytes: &[u8]) -> std::collections::BTreeMap<String, Vec<u8>> {
    use std::io::Read;
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(bytes.to_vec())).expect("zip");
    let mut out = std::collections::BTreeMap::new();
    for i in 0..archive.len() {
        let mut entry = archive.by_index(i).expect("entry");
        if entry.is_dir() {
            continue;
        }
        let mut data = Vec::new();
        entry.read_to_end(&mut data).expect("read entry");
        out.insert(entry.name().expect("entry name").to_string(), data);
    }
    out
}

/// A scripted "2026 device" (issue 10): everything the newest Formulus does, in order, with the
/// presence rows checked along the way.
#[actix_web::test]
async fn scripted_2026_device() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let bundle =
        std::fs::read(format!("{}/tests/fixtures/upstream/valid_bundle01.zip", env!("CARGO_MANIFEST_DIR")))
            .expect("fixture bundle");
    let (status, body) =
        app.upload_bundle(Some(&admin), Method::PUT, "/api/app-bundle", "bundle", bundle, None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = app
        .call(
            Method::POST,
            "/api/users",
            Some(&admin),
            Some(json!({"username": "enum2026", "password": "password-123", "role": "read-write"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    // Login with the client version header.
    let res = app
        .client
        .post(app.url("/api/auth/login"))
        .header("x-ode-version", "1.4.2")
        .json(&json!({"username": "enum2026", "password": "password-123"}))
        .send()
        .await
        .expect("login");
    assert_eq!(res.status(), StatusCode::OK);
    let token = res.json::<Value>().await.expect("json")["token"].as_str().expect("token").to_string();
    let device = |req: reqwest::RequestBuilder| {
        req.bearer_auth(&token).header("x-ode-version", "1.4.2").header("x-ode-client-id", "tablet-26")
    };

    // Empty probe push to learn the generation.
    let probe: Value = device(app.client.post(app.url("/api/sync/push")))
        .json(&json!({"transmission_id": "probe-1", "client_id": "tablet-26", "records": []}))
        .send()
        .await
        .expect("probe")
        .json()
        .await
        .expect("json");
    let generation = probe["repository_generation"].as_i64().expect("generation");

    // Push three records, one of them tagged, then pull until has_more is false.
    let records: Vec<Value> = (0..3)
        .map(|i| json!({"observation_id": format!("o26-{i}"), "form_type": if i == 2 { "visit" } else { "household" },
                        "data": {"i": i}, "author": "enum2026", "device_id": "tablet-26", "tags": ["t"]}))
        .collect();
    let res = device(app.client.post(app.url("/api/sync/push")))
        .header("x-repository-generation", generation.to_string())
        .json(&json!({"transmission_id": "p-1", "client_id": "tablet-26", "records": records}))
        .send()
        .await
        .expect("push");
    assert_eq!(res.status(), StatusCode::OK);
    let mut cursor = 0;
    let mut pulled = 0;
    loop {
        let body: Value = device(app.client.post(app.url("/api/sync/pull?limit=500")))
            .header("x-repository-generation", generation.to_string())
            .json(&json!({"client_id": "tablet-26", "since": {"version": cursor}}))
            .send()
            .await
            .expect("pull")
            .json()
            .await
            .expect("json");
        pulled += body["records"].as_array().map(Vec::len).unwrap_or(0);
        if body["has_more"] == true {
            cursor = body["change_cutoff"].as_i64().expect("cutoff");
        } else {
            cursor = body["current_version"].as_i64().expect("current");
            break;
        }
    }
    assert_eq!(pulled, 3);
    // One more pull from the stored cursor: the presence cursor is now the head.
    let res = device(app.client.post(app.url("/api/sync/pull?limit=500")))
        .json(&json!({"client_id": "tablet-26", "since": {"version": cursor}}))
        .send()
        .await
        .expect("pull");
    assert_eq!(res.status(), StatusCode::OK);

    // Attachment with a `/` in its id: HEAD (absent), PUT, HEAD (present), manifest, download.
    let photo = b"\x89PNG-not-really-an-image-but-bytes".to_vec();
    let url = app.url("/api/attachments/photos/2026/p1.jpg");
    let res = device(app.client.head(&url)).send().await.expect("head");
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    let res = device(app.client.put(&url)).body(photo.clone()).send().await.expect("put");
    assert_eq!(res.status(), StatusCode::OK);
    let res = device(app.client.head(&url)).send().await.expect("head");
    assert_eq!(res.status(), StatusCode::OK);
    let manifest: Value = device(app.client.post(app.url("/api/attachments/manifest")))
        .json(&json!({"client_id": "tablet-26", "since_version": 0}))
        .send()
        .await
        .expect("manifest")
        .json()
        .await
        .expect("json");
    assert_eq!(manifest["operation_count"]["download"], 1);
    assert_eq!(manifest["repository_generation"], generation);
    let download_url = manifest["operations"][0]["download_url"].as_str().expect("url");
    let bytes =
        device(app.client.get(download_url)).send().await.expect("download").bytes().await.expect("bytes");
    assert_eq!(bytes.to_vec(), photo);

    // The bundle as one ZIP, compared file by file with the manifest.
    let bundle_manifest: Value = device(app.client.get(app.url("/api/app-bundle/manifest")))
        .send()
        .await
        .expect("m")
        .json()
        .await
        .expect("json");
    let res = device(app.client.get(app.url("/api/app-bundle/download-zip"))).send().await.expect("zip");
    assert_eq!(res.status(), StatusCode::OK);
    let etag = res.headers().get("etag").and_then(|v| v.to_str().ok()).map(str::to_string).expect("etag");
    assert_eq!(etag, format!("\"{}\"", bundle_manifest["hash"].as_str().expect("hash")));
    let entries = unzip(&res.bytes().await.expect("bytes"));
    for file in bundle_manifest["files"].as_array().expect("files") {
        let path = file["path"].as_str().expect("path");
        let data = entries.get(path).unwrap_or_else(|| panic!("{path} missing from download-zip"));
        assert_eq!(sha256_hex(data), file["hash"].as_str().expect("hash"), "{path}");
    }
    let res = device(app.client.get(app.url("/api/app-bundle/download-zip")))
        .header("if-none-match", &etag)
        .send()
        .await
        .expect("304");
    assert_eq!(res.status(), StatusCode::NOT_MODIFIED);

    // Presence: the device with its cursor, lag 0, bundle version and client version.
    let mut seen = Value::Null;
    for _ in 0..50 {
        let (_, list) = app.call(Method::GET, "/api/devices?username=enum2026", Some(&admin), None).await;
        if let Some(d) = list.as_array().and_then(|l| l.iter().find(|d| d["client_id"] == "tablet-26")) {
            if d["app_bundle_version"].is_string() && d["last_data_version"] == cursor {
                seen = d.clone();
                break;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(seen["lag"], 1, "one attachment landed after the device's last pull: {seen}");
    assert_eq!(seen["client_version"], "1.4.2");
    assert_eq!(seen["app_bundle_version"], bundle_manifest["version"]);
    let (_, users) = app.call(Method::GET, "/api/users", Some(&admin), None).await;
    let user = users.as_array().and_then(|u| u.iter().find(|u| u["username"] == "enum2026")).expect("user");
    assert_eq!(user["presence"]["clients"][0]["clientId"], "tablet-26");
    assert_eq!(user["presence"]["clientCount"], 1);
    let admin_user =
        users.as_array().and_then(|u| u.iter().find(|u| u["username"] == "admin")).expect("admin");
    assert!(admin_user["presence"].is_object(), "the admin was seen too (client id \"\")");

    // Exports of the 2026 surface: raw-json entries, attachments ZIP, stats.
    let res = app.send(Method::GET, "/api/dataexport/raw-json", Some(&admin), None).await;
    assert_eq!(res.status(), StatusCode::OK);
    let raw = unzip(&res.bytes().await.expect("bytes"));
    assert_eq!(
        raw.keys().cloned().collect::<Vec<_>>(),
        vec!["household/o26-0.json", "household/o26-1.json", "visit/o26-2.json"]
    );
    let rec: Value = serde_json::from_slice(&raw["visit/o26-2.json"]).expect("record json");
    assert_eq!(rec["author"], "enum2026");
    assert_eq!(rec["device_id"], "tablet-26");
    assert_eq!(rec["tags"], json!(["t"]));
    let res = app.send(Method::GET, "/api/attachments/export-zip", Some(&admin), None).await;
    let files = unzip(&res.bytes().await.expect("bytes"));
    assert_eq!(files.get("photos/2026/p1.jpg"), Some(&photo));
    let (_, stats) = app.call(Method::GET, "/api/stats/observations", Some(&admin), None).await;
    assert_eq!(stats["totalCount"], 3);
    let by_type: Vec<(String, i64)> = stats["byFormType"]
        .as_array()
        .expect("byFormType")
        .iter()
        .map(|t| (t["formType"].as_str().unwrap_or("").to_string(), t["count"].as_i64().unwrap_or(0)))
        .collect();
    assert!(
        by_type.contains(&("household".to_string(), 2)) && by_type.contains(&("visit".to_string(), 1)),
        "{stats}"
    );

    // Reset: the device gets 409 until it drops its generation.
    let (status, _) = app
        .call(
            Method::POST,
            "/api/admin/repository/reset",
            Some(&admin),
            Some(json!({"confirm": "RESET_REPOSITORY"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let res = device(app.client.post(app.url("/api/attachments/manifest")))
        .header("x-repository-generation", generation.to_string())
        .json(&json!({"client_id": "tablet-26"}))
        .send()
        .await
        .expect("manifest");
    assert_eq!(res.status(), StatusCode::CONFLICT);
    let res = device(app.client.head(&url)).send().await.expect("head");
    assert_eq!(res.status(), StatusCode::NOT_FOUND, "attachments are gone after a reset");
    let res = device(app.client.post(app.url("/api/sync/pull")))
        .json(&json!({"client_id": "tablet-26"}))
        .send()
        .await
        .expect("pull");
    let body: Value = res.json().await.expect("json");
    assert_eq!(body["records"], json!([]));
    assert_eq!(body["repository_generation"], generation + 1);
}
