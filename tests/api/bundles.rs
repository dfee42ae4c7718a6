//! App bundles (docs/api.md §9, 17.6) through HTTP: uploads, validation, switches, downloads,
//! retention, ETags across restarts, several processes, and downloads during switches.

use std::collections::HashMap;
use std::io::{Cursor, Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::multipart::Form;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::{assert_error, sha256_hex, small_bundle, zip_bytes, TestApp};

const BUNDLE01: &[u8] = include_bytes!("../fixtures/upstream/valid_bundle01.zip");
const BUNDLE02: &[u8] = include_bytes!("../fixtures/upstream/valid_bundle02.zip");

fn zip_files(bytes: &[u8]) -> HashMap<String, Vec<u8>> {
    let mut archive = zip::ZipArchive::new(Cursor::new(bytes)).expect("fixture zip");
    let mut files = HashMap::new();
    for index in 0..archive.len() {
        let mut entry = archive.by_index(index).expect("entry");
        if entry.is_dir() {
            continue;
        }
        let mut content = Vec::new();
        entry.read_to_end(&mut content).expect("read entry");
        files.insert(entry.name().expect("entry name").to_string(), content);
    }
    files
}

async fn get_bytes(app: &TestApp, path: &str, token: &str) -> reqwest::Response {
    app.client.get(app.url(path)).bearer_auth(token).send().await.expect("GET")
}

async fn manifest_version(app: &TestApp, token: &str) -> Option<String> {
    let (status, body) = app.call(Method::GET, "/app-bundle/manifest", Some(token), None).await;
    (status == StatusCode::OK).then(|| body["version"].as_str().expect("version").to_string())
}

#[actix_web::test]
async fn upstream_bundles_push_switch_changes_and_downloads() {
    upstream_bundles_push_switch_changes_and_downloads_on(TestApp::spawn().await).await;
}

/// Also run against the S3 backend (tests/api/storage.rs).
pub(crate) async fn upstream_bundles_push_switch_changes_and_downloads_on(app: TestApp) {
    let admin = app.admin_token().await;

    let (status, body) = app.call(Method::GET, "/app-bundle/manifest", Some(&admin), None).await;
    assert_error(status, &body, 404, "NOT_FOUND");
    let (status, body) = app.call(Method::GET, "/app-bundle/versions", Some(&admin), None).await;
    assert_eq!((status, body), (StatusCode::OK, json!({"versions": []})));

    let first = app.push_bundle(&admin, BUNDLE01.to_vec(), false).await;
    assert_eq!(first["active"], false, "pushing does not activate unless asked");
    assert_eq!(first["message"], "App bundle successfully pushed");
    let v1 = first["version"].as_str().expect("v1").to_string();
    assert_eq!(first["manifest"]["name"], v1.as_str(), "synthesised manifest names the id");
    assert_eq!(first["manifest"]["entryPoint"], "app/index.html");
    assert_eq!(manifest_version(&app, &admin).await, None);

    let second = app.push_bundle(&admin, BUNDLE02.to_vec(), true).await;
    let v2 = second["version"].as_str().expect("v2").to_string();
    assert_eq!(second["active"], true);
    assert_ne!(v1, v2);
    assert_eq!(manifest_version(&app, &admin).await.as_deref(), Some(v2.as_str()));

    // Both list shapes, newest first.
    let (_, body) = app.call(Method::GET, "/app-bundle/versions", Some(&admin), None).await;
    assert_eq!(body["versions"][0]["version"], v2.as_str());
    assert_eq!(body["versions"][0]["active"], true);
    assert_eq!(body["versions"][1]["version"], v1.as_str());
    assert_eq!(body["versions"][1]["active"], false);
    let response = app
        .client
        .get(app.url("/app-bundle/versions"))
        .bearer_auth(&admin)
        .header("x-api-version", "1.0.0")
        .send()
        .await
        .expect("versions");
    let body: Value = response.json().await.expect("json");
    assert_eq!(body, json!({"versions": [format!("{v2} *"), v1.clone()]}));

    let (status, body) = app
        .call(Method::GET, &format!("/app-bundle/changes?current={v1}&target={v2}"), Some(&admin), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["added"], json!([{"path": "app/THIS_IS_VERSION_2.txt"}]));
    assert_eq!(body["modified"], json!([{"path": "forms/example/schema.json"}]));
    assert_eq!(body["removed"], json!([]));
    assert_eq!(body["compare_version_a"], v1.as_str());
    assert_eq!(body["form_changes"], true);
    assert_eq!(body["modified_forms"][0]["form"], "example");
    assert_eq!(body["modified_forms"][0]["added_fields"], json!([{"field": "lastname", "type": "string"}]));
    // Defaults: current = active (v2), target = newest (v2).
    let (status, body) = app.call(Method::GET, "/app-bundle/changes", Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!((body["added"].clone(), body["form_changes"].clone()), (json!([]), json!(false)));

    // Switch back with the 1.0 list's marker in the path.
    let (status, body) =
        app.call(Method::POST, &format!("/app-bundle/switch/{v1}%20*"), Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["version"], v1.as_str());
    assert_eq!(body["previous_version"], v2.as_str());
    assert_eq!(manifest_version(&app, &admin).await.as_deref(), Some(v1.as_str()));
    let (status, body) = app.call(Method::GET, "/status", Some(&admin), None).await;
    assert_eq!((status, body["active_bundle_version"].clone()), (StatusCode::OK, json!(v1)));

    // Every file of the active version (v1), percent-encoded as one segment and with slashes.
    let (_, manifest) = app.call(Method::GET, "/app-bundle/manifest", Some(&admin), None).await;
    let expected = zip_files(BUNDLE01);
    assert_eq!(manifest["files"].as_array().map(Vec::len), Some(expected.len()));
    for file in manifest["files"].as_array().expect("files") {
        let path = file["path"].as_str().expect("path");
        for url in [
            format!("/app-bundle/download/{}", path.replace('/', "%2F")),
            format!("/app-bundle/download/{path}"),
        ] {
            let response = get_bytes(&app, &url, &admin).await;
            assert_eq!(response.status(), StatusCode::OK, "{url}");
            let headers = response.headers().clone();
            assert_eq!(headers["x-bundle-version"], v1.as_str());
            assert_eq!(
                headers["etag"].to_str().ok(),
                Some(format!("\"{}\"", file["hash"].as_str().unwrap_or(""))).as_deref()
            );
            assert_eq!(headers["cache-control"], "no-cache");
            assert_eq!(headers["content-type"].to_str().ok(), file["mimeType"].as_str());
            let bytes = response.bytes().await.expect("body");
            assert_eq!(headers["content-length"].to_str().ok(), Some(bytes.len().to_string()).as_deref());
            assert_eq!(&bytes[..], &expected[path][..], "{path}");
        }
    }
    // HEAD: same status and headers, no body.
    let response = app
        .client
        .head(app.url("/app-bundle/download/app%2Findex.html"))
        .bearer_auth(&admin)
        .send()
        .await
        .expect("HEAD");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-length"], expected["app/index.html"].len().to_string().as_str());
    assert!(response.bytes().await.expect("HEAD body").is_empty());
    // Pinned and preview downloads.
    let response =
        get_bytes(&app, &format!("/app-bundle/download/app%2FTHIS_IS_VERSION_2.txt?version={v2}"), &admin)
            .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["cache-control"], "public, max-age=31536000, immutable");
    let response =
        get_bytes(&app, "/app-bundle/download/app/THIS_IS_VERSION_2.txt?preview=true", &admin).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["x-is-preview"], "true");
    assert_eq!(response.headers()["x-bundle-version"], v2.as_str());
    let (status, body) =
        app.call(Method::GET, "/app-bundle/download/app/THIS_IS_VERSION_2.txt", Some(&admin), None).await;
    assert_error(status, &body, 404, "NOT_FOUND");
    for bad in ["..%2Fsecret", "app%2F..%2F..%2Fx", "%2Fetc%2Fpasswd", "app%5Cindex.html", "app%00x", ""] {
        let (status, body) =
            app.call(Method::GET, &format!("/app-bundle/download/{bad}"), Some(&admin), None).await;
        assert_error(status, &body, 400, "BAD_REQUEST");
    }
    for missing in ["app", "nope.txt", "app%2Fnope"] {
        let (status, body) =
            app.call(Method::GET, &format!("/app-bundle/download/{missing}"), Some(&admin), None).await;
        assert_error(status, &body, 404, "NOT_FOUND");
    }
    let (status, body) = app
        .call(
            Method::GET,
            "/app-bundle/download/app%2Findex.html?version=20990101-000000",
            Some(&admin),
            None,
        )
        .await;
    assert_error(status, &body, 404, "NOT_FOUND");

    // The ZIP as pushed (17.6).
    let response = get_bytes(&app, "/app-bundle/download-zip", &admin).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "application/zip");
    assert_eq!(response.headers()["content-disposition"], "attachment; filename=\"bundle.zip\"");
    let etag = response.headers()["etag"].to_str().expect("etag").to_string();
    assert_eq!(etag, format!("\"{}\"", manifest["hash"].as_str().expect("hash")));
    assert_eq!(&response.bytes().await.expect("zip")[..], BUNDLE01);
    let response = app
        .client
        .get(app.url("/app-bundle/download-zip"))
        .bearer_auth(&admin)
        .header("if-none-match", etag.clone())
        .send()
        .await
        .expect("zip 304");
    assert_eq!(response.status(), StatusCode::NOT_MODIFIED);
    let response = get_bytes(&app, &format!("/app-bundle/download-zip?version={v2}"), &admin).await;
    assert_eq!(&response.bytes().await.expect("zip")[..], BUNDLE02);

    // Switch errors and the no-op switch.
    let (status, body) = app.call(Method::POST, "/app-bundle/switch", Some(&admin), Some(json!({}))).await;
    assert_error(status, &body, 400, "BAD_REQUEST");
    assert_eq!(body["message"], "Version is required");
    let (status, body) = app
        .call(Method::POST, "/app-bundle/switch", Some(&admin), Some(json!({"version": "20990101-000000"})))
        .await;
    assert_error(status, &body, 404, "NOT_FOUND");
    let (status, body) = app
        .call(Method::POST, "/app-bundle/switch", Some(&admin), Some(json!({"version": format!("{v1} *")})))
        .await;
    assert_eq!((status, body["previous_version"].clone()), (StatusCode::OK, json!(v1)));
}

#[actix_web::test]
async fn validation_failures_store_nothing_and_use_no_id() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let index: &[u8] = b"<html></html>";
    let cases: Vec<(&str, Vec<u8>, &str, &[&str])> = vec![
        ("structure", b"this is not a zip".to_vec(), "structure", &["ZIP_CORRUPT"]),
        (
            "unexpected entries and no index",
            zip_bytes(&[("__MACOSX/x", b"x"), ("README.md", b"x")]),
            "structure",
            &["UNEXPECTED_ENTRY", "UNEXPECTED_ENTRY", "MISSING_APP_INDEX"],
        ),
        (
            "traversal",
            zip_bytes(&[("app/index.html", index), ("../evil.txt", b"x")]),
            "structure",
            &["ZIP_UNSAFE_PATH"],
        ),
        (
            "absolute",
            zip_bytes(&[("app/index.html", index), ("/etc/x", b"x")]),
            "structure",
            &["ZIP_UNSAFE_PATH"],
        ),
        (
            "manifest",
            zip_bytes(&[("manifest.json", br#"{"version": "1"}"#), ("app/index.html", index)]),
            "manifest",
            &["MANIFEST_FIELD_MISSING", "MANIFEST_FIELD_MISSING"],
        ),
        (
            "entry point",
            zip_bytes(&[
                ("manifest.json", br#"{"version": "1", "name": "n", "entryPoint": "app/main.html"}"#),
                ("app/index.html", index),
            ]),
            "entry point",
            &["ENTRY_POINT_MISSING"],
        ),
        (
            "forms",
            zip_bytes(&[
                ("app/index.html", index),
                ("forms/a/schema.json", br#"{"type": "object", "x-renderer": "nope"}"#),
                ("forms/b/schema.json", b"[1]"),
                ("forms/b/ui.json", br#"{"type": "VerticalLayout"}"#),
            ]),
            "forms",
            &["FORM_FILE_MISSING", "RENDERER_REFERENCE_MISSING", "FORM_FILE_INVALID_JSON"],
        ),
    ];
    for (label, bytes, step, codes) in cases {
        let (status, body) = app
            .upload_bundle(Some(&admin), Method::POST, "/app-bundle/push", "bundle", bytes, Some("true"))
            .await;
        assert_error(status, &body, 400, "INVALID_BUNDLE");
        assert!(
            body["detail"].as_str().is_some_and(|d| d.contains(&format!("the {step} step"))),
            "{label}: {body}"
        );
        let mut got: Vec<&str> =
            body["errors"].as_array().expect("errors").iter().filter_map(|e| e["code"].as_str()).collect();
        let mut want = codes.to_vec();
        got.sort();
        want.sort();
        assert_eq!(got, want, "{label}: {body}");
    }

    // A symlink entry and a duplicate entry, written by hand.
    let mut writer = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default();
    writer.start_file("app/index.html", options).expect("entry");
    writer.write_all(index).expect("write");
    writer.add_symlink("app/link", "/etc/passwd", options).expect("symlink");
    let bytes = writer.finish().expect("zip").into_inner();
    let (status, body) =
        app.upload_bundle(Some(&admin), Method::POST, "/app-bundle/push", "file", bytes, None).await;
    assert_error(status, &body, 400, "INVALID_BUNDLE");
    assert_eq!(body["errors"][0]["code"], "ZIP_SYMLINK");

    // Nothing stored: no versions, no files, no leftovers; and the declared id is still free.
    let (_, body) = app.call(Method::GET, "/app-bundle/versions", Some(&admin), None).await;
    assert_eq!(body, json!({"versions": []}));
    let bundle_root = app.data_root.path().join("app-bundles");
    assert_eq!(std::fs::read_dir(bundle_root.join("versions")).expect("versions dir").count(), 0);
    assert_eq!(std::fs::read_dir(bundle_root.join("tmp")).expect("tmp dir").count(), 0);
    let failed = small_bundle("20240101-000000", "x");
    let mut broken = failed.clone();
    broken.truncate(failed.len() / 2);
    let (status, _) =
        app.upload_bundle(Some(&admin), Method::POST, "/app-bundle/push", "bundle", broken, None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let body = app.push_bundle(&admin, failed, false).await;
    assert_eq!(body["version"], "20240101-000000");
    assert_eq!(body["manifest"]["name"], "Survey");
}

#[actix_web::test]
async fn bad_uploads_and_roles() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let reader = app.user_token(&admin, "reader", "read-only").await;
    let writer = app.user_token(&admin, "writer", "read-write").await;

    // Not multipart, and multipart without the file part.
    let (status, body) =
        app.call(Method::POST, "/app-bundle/push", Some(&admin), Some(json!({"a": 1}))).await;
    assert_error(status, &body, 400, "BAD_REQUEST");
    let form = Form::new().text("activate", "true");
    let response = app
        .client
        .post(app.url("/app-bundle/push"))
        .bearer_auth(&admin)
        .multipart(form)
        .send()
        .await
        .expect("push");
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);

    // 401 before 403, and only admins change bundles.
    let bundle = small_bundle("20240101-000000", "x");
    let (status, body) =
        app.upload_bundle(None, Method::POST, "/app-bundle/push", "bundle", bundle.clone(), None).await;
    assert_error(status, &body, 401, "MISSING_TOKEN");
    for token in [&reader, &writer] {
        let (status, body) = app
            .upload_bundle(Some(token), Method::POST, "/app-bundle/push", "bundle", bundle.clone(), None)
            .await;
        assert_error(status, &body, 403, "FORBIDDEN");
        let (status, body) =
            app.upload_bundle(Some(token), Method::PUT, "/app-bundle", "bundle", bundle.clone(), None).await;
        assert_error(status, &body, 403, "FORBIDDEN");
    }
    let (status, body) =
        app.upload_bundle(Some(&admin), Method::PUT, "/app-bundle", "bundle", bundle, None).await;
    assert_eq!((status, body["active"].clone()), (StatusCode::OK, json!(true)), "{body}");
    for token in [&reader, &writer] {
        let (status, body) =
            app.call(Method::POST, "/app-bundle/switch/20240101-000000", Some(token), None).await;
        assert_error(status, &body, 403, "FORBIDDEN");
    }
    let (status, body) = app.call(Method::POST, "/app-bundle/switch/20240101-000000", None, None).await;
    assert_error(status, &body, 401, "MISSING_TOKEN");
    // Readers may read.
    assert_eq!(manifest_version(&app, &reader).await.as_deref(), Some("20240101-000000"));
    let (status, _) = app.call(Method::GET, "/app-bundle/manifest", None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // A Content-Length over 100 MiB is refused before the body is read.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", app.port)).await.expect("connect");
    let request = format!(
        "POST /app-bundle/push HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {admin}\r\n\
         Content-Type: multipart/form-data; boundary=x\r\nContent-Length: 209715200\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.expect("send headers");
    let mut response = vec![0u8; 4096];
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut response))
        .await
        .expect("answer in time")
        .expect("read");
    let head = String::from_utf8_lossy(&response[..read]).to_string();
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    assert!(head.contains("PAYLOAD_TOO_LARGE"), "{head}");
}

#[actix_web::test]
async fn retention_keeps_the_active_and_newest_and_never_reuses_ids() {
    retention_keeps_the_active_and_newest_and_never_reuses_ids_on(
        TestApp::spawn_with(&[("MAX_VERSIONS_KEPT", "2")]).await,
    )
    .await;
}

/// Also run against the S3 backend (tests/api/storage.rs).
pub(crate) async fn retention_keeps_the_active_and_newest_and_never_reuses_ids_on(app: TestApp) {
    let admin = app.admin_token().await;
    let ids = ["20240101-000001", "20240101-000002", "20240101-000003", "20240101-000004"];
    app.push_bundle(&admin, small_bundle(ids[0], "a"), true).await;
    for (i, id) in ids.iter().enumerate().skip(1) {
        let body = app.push_bundle(&admin, small_bundle(id, &format!("m{i}")), false).await;
        assert_eq!(body["version"], *id);
    }
    let (_, body) = app.call(Method::GET, "/app-bundle/versions", Some(&admin), None).await;
    let listed: Vec<&str> =
        body["versions"].as_array().expect("list").iter().filter_map(|v| v["version"].as_str()).collect();
    assert_eq!(listed, [ids[3], ids[0]], "newest first; the active one survives");
    // Checked in the storage area, whichever the backend.
    let stored = &app.state.storage.bundles;
    for removed in [ids[1], ids[2]] {
        assert!(stored.list(&format!("versions/{removed}/")).await.expect("list").is_empty());
        assert_eq!(stored.head(&format!("versions/{removed}.zip")).await.expect("head"), None);
        let (status, body) = app
            .call(
                Method::GET,
                &format!("/app-bundle/download/app%2Findex.html?version={removed}"),
                Some(&admin),
                None,
            )
            .await;
        assert_error(status, &body, 404, "NOT_FOUND");
        let (status, body) =
            app.call(Method::POST, &format!("/app-bundle/switch/{removed}"), Some(&admin), None).await;
        assert_error(status, &body, 404, "NOT_FOUND");
    }
    // The id of a removed version is never handed out again.
    let body = app.push_bundle(&admin, small_bundle(ids[1], "again"), false).await;
    assert_eq!(body["version"], format!("{}-2", ids[1]));
    assert!(!stored.list(&format!("versions/{}/", ids[0])).await.expect("list").is_empty());
}

#[actix_web::test]
async fn etag_is_stable_across_a_restart() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let pushed = app.push_bundle(&admin, BUNDLE02.to_vec(), true).await;
    let hash = pushed["manifest"]["hash"].as_str().expect("hash").to_string();
    let first = get_bytes(&app, "/app-bundle/manifest", &admin).await;
    assert_eq!(first.headers()["etag"].to_str().ok(), Some(format!("\"{hash}\"").as_str()));
    let first_body = first.bytes().await.expect("manifest");

    // A real restart: the first server stops, a new one starts on its database and bundle files.
    app.handle.stop(true).await;
    let bundle_path = app.data_root.path().join("app-bundles").display().to_string();
    let second = TestApp::spawn_on(app.db_conn.clone(), &[("APP_BUNDLE_PATH", bundle_path.as_str())]).await;
    let response = get_bytes(&second, "/app-bundle/manifest", &admin).await;
    assert_eq!(response.headers()["etag"].to_str().ok(), Some(format!("\"{hash}\"").as_str()));
    assert_eq!(response.bytes().await.expect("manifest"), first_body, "the body is stable too");
    for tag in [format!("\"{hash}\""), format!("\"other\", W/\"{hash}\""), "*".to_string()] {
        let response = second
            .client
            .get(second.url("/app-bundle/manifest"))
            .bearer_auth(&admin)
            .header("if-none-match", tag.clone())
            .send()
            .await
            .expect("conditional");
        assert_eq!(response.status(), StatusCode::NOT_MODIFIED, "{tag}");
        assert_eq!(response.headers()["etag"].to_str().ok(), Some(format!("\"{hash}\"").as_str()));
    }
    let response = second
        .client
        .get(second.url("/app-bundle/manifest"))
        .bearer_auth(&admin)
        .header("if-none-match", "\"other\"")
        .send()
        .await
        .expect("conditional");
    assert_eq!(response.status(), StatusCode::OK);
    let response = get_bytes(&second, "/app-bundle/download/app%2FTHIS_IS_VERSION_2.txt", &admin).await;
    assert_eq!(response.status(), StatusCode::OK);
    let file_tag = response.headers()["etag"].to_str().expect("etag").to_string();
    let response = second
        .client
        .get(second.url("/app-bundle/download/app%2FTHIS_IS_VERSION_2.txt"))
        .bearer_auth(&admin)
        .header("if-none-match", file_tag)
        .send()
        .await
        .expect("conditional");
    assert_eq!(response.status(), StatusCode::NOT_MODIFIED);
}

/// Polls `app` until its active version is `want`; returns how long that took.
async fn wait_for_active(app: &TestApp, token: &str, want: &str) -> Duration {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(5) {
        if manifest_version(app, token).await.as_deref() == Some(want) {
            return started.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{want} did not become active");
}

#[actix_web::test]
async fn two_processes_see_each_others_switch_within_a_second() {
    let one = TestApp::spawn().await;
    let bundle_path = one.data_root.path().join("app-bundles").display().to_string();
    let two = TestApp::spawn_on(one.db_conn.clone(), &[("APP_BUNDLE_PATH", bundle_path.as_str())]).await;
    let admin = one.admin_token().await;
    one.push_bundle(&admin, small_bundle("20240101-000001", "a"), true).await;
    one.push_bundle(&admin, small_bundle("20240101-000002", "b"), false).await;
    assert!(wait_for_active(&two, &admin, "20240101-000001").await < Duration::from_secs(1));

    let (status, _) = one.call(Method::POST, "/app-bundle/switch/20240101-000002", Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(wait_for_active(&two, &admin, "20240101-000002").await < Duration::from_secs(1));
    let (status, _) = two.call(Method::POST, "/app-bundle/switch/20240101-000001", Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(wait_for_active(&one, &admin, "20240101-000001").await < Duration::from_secs(1));
    // The other process serves a version it did not upload.
    let response =
        get_bytes(&two, "/app-bundle/download/app%2Findex.html?version=20240101-000002", &admin).await;
    assert_eq!(response.bytes().await.expect("body"), "<html>b</html>");
}

#[actix_web::test]
async fn downloads_never_mix_versions_while_switching() {
    let app = Arc::new(TestApp::spawn().await);
    let admin = app.admin_token().await;
    let v1 = app.push_bundle(&admin, BUNDLE01.to_vec(), true).await;
    let v2 = app.push_bundle(&admin, BUNDLE02.to_vec(), false).await;
    // version id -> path -> sha256, from the push answers.
    let mut manifests: HashMap<String, HashMap<String, String>> = HashMap::new();
    for pushed in [&v1, &v2] {
        let files = pushed["manifest"]["files"].as_array().expect("files").iter();
        let files = files.map(|f| {
            (f["path"].as_str().unwrap_or("").to_string(), f["hash"].as_str().unwrap_or("").to_string())
        });
        manifests.insert(pushed["version"].as_str().expect("id").to_string(), files.collect());
    }
    let manifests = Arc::new(manifests);
    let ids: Vec<String> =
        [&v1, &v2].iter().map(|v| v["version"].as_str().unwrap_or("").to_string()).collect();
    let switching = Arc::new(std::sync::atomic::AtomicBool::new(true));
    // Files checked by all tasks so far: each switch waits for downloads since the last one.
    let checked = Arc::new(std::sync::atomic::AtomicUsize::new(0));

    let mut tasks = Vec::new();
    for task in 0..16 {
        let (app, admin, manifests, switching, checked) =
            (app.clone(), admin.clone(), manifests.clone(), switching.clone(), checked.clone());
        tasks.push(actix_web::rt::spawn(async move {
            let mut files_checked = 0usize;
            let mut rounds = 0usize;
            while rounds == 0 || switching.load(std::sync::atomic::Ordering::SeqCst) {
                rounds += 1;
                // Odd tasks pin the version they started with, as devices do; even ones follow the active one.
                let response = get_bytes(&app, "/app-bundle/manifest", &admin).await;
                assert_eq!(response.status(), StatusCode::OK);
                let etag = response.headers()["etag"].to_str().expect("etag").to_string();
                let manifest: Value = response.json().await.expect("manifest");
                assert_eq!(
                    etag,
                    format!("\"{}\"", manifest["hash"].as_str().unwrap_or("")),
                    "ETag matches the body"
                );
                let version = manifest["version"].as_str().expect("version").to_string();
                for file in manifest["files"].as_array().expect("files") {
                    let path = file["path"].as_str().expect("path");
                    let url = if task % 2 == 1 {
                        format!("/app-bundle/download/{}?version={version}", path.replace('/', "%2F"))
                    } else {
                        format!("/app-bundle/download/{}", path.replace('/', "%2F"))
                    };
                    let response = get_bytes(&app, &url, &admin).await;
                    let status = response.status();
                    let served = response
                        .headers()
                        .get("x-bundle-version")
                        .and_then(|v| v.to_str().ok())
                        .map(String::from);
                    let bytes = response.bytes().await.expect("file body");
                    if task % 2 == 1 {
                        assert_eq!(status, StatusCode::OK, "{url}");
                        assert_eq!(served.as_deref(), Some(version.as_str()));
                    } else if status == StatusCode::NOT_FOUND && path == "app/THIS_IS_VERSION_2.txt" {
                        // The newly active version lacks this file (v2 added one): allowed.
                        continue;
                    }
                    assert_eq!(status, StatusCode::OK, "{url}");
                    let served = served.expect("x-bundle-version");
                    assert_eq!(
                        Some(&sha256_hex(&bytes)),
                        manifests[&served].get(path),
                        "{path} from {served}"
                    );
                    files_checked += 1;
                    checked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            }
            files_checked
        }));
    }
    for round in 0..10 {
        let since = checked.load(std::sync::atomic::Ordering::SeqCst);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while checked.load(std::sync::atomic::Ordering::SeqCst) < since + 16 {
            assert!(std::time::Instant::now() < deadline, "the downloads stalled");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let target = &ids[(round + 1) % 2];
        let (status, body) =
            app.call(Method::POST, &format!("/app-bundle/switch/{target}"), Some(&admin), None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    switching.store(false, std::sync::atomic::Ordering::SeqCst);
    let mut total = 0;
    for task in tasks {
        total += task.await.expect("download task");
    }
    assert!(total >= 16 * 3, "every task downloaded at least one whole bundle ({total} files)");
}
