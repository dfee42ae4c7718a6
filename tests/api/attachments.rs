//! Attachments (docs/api.md §10, 16 G7, 17.7): uploads, immutability, races, interrupted uploads,
//! downloads with ranges and image variants, both manifests and the ZIP export.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::{assert_error, TestApp};

fn random_bytes(n: usize) -> Vec<u8> {
    use rand::RngCore;
    let mut buf = vec![0u8; n];
    rand::thread_rng().fill_bytes(&mut buf);
    buf
}

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

async fn send_multipart(
    app: &TestApp,
    method: Method,
    token: &str,
    path: &str,
    form: reqwest::multipart::Form,
) -> (StatusCode, Value) {
    let res = app
        .client
        .request(method, app.url(path))
        .bearer_auth(token)
        .multipart(form)
        .send()
        .await
        .expect("multipart");
    let status = res.status();
    (status, res.json().await.unwrap_or(Value::Null))
}

fn file_part(bytes: &[u8], filename: &str, mime: &str) -> reqwest::multipart::Part {
    reqwest::multipart::Part::bytes(bytes.to_vec())
        .file_name(filename.to_string())
        .mime_str(mime)
        .expect("mime")
}

async fn manifest(app: &TestApp, token: &str, query: &str) -> Value {
    let (status, body) =
        app.call(Method::GET, &format!("/attachments/manifest{query}"), Some(token), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body
}

async fn head_change_id(app: &TestApp, token: &str) -> i64 {
    let (status, body) = app.call(Method::GET, "/status", Some(token), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["current_change_id"].as_i64().expect("current_change_id")
}

fn tmp_files(app: &TestApp) -> usize {
    std::fs::read_dir(app.data_root.path().join("attachments").join("tmp")).map(|d| d.count()).unwrap_or(0)
}

/// Sends a request byte for byte (reqwest would normalise `..` and `%2e%2e` away) and returns the status.
async fn raw_status(app: &TestApp, method: &str, target: &str, token: &str) -> u16 {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", app.port)).await.expect("connect");
    let request = format!(
        "{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\
         Content-Length: 3\r\nConnection: close\r\n\r\nabc"
    );
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    stream.read_to_end(&mut out).await.expect("read");
    let text = String::from_utf8_lossy(&out);
    text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("no status in {text}"))
}

#[actix_web::test]
async fn raw_and_multipart_uploads_round_trip() {
    raw_and_multipart_uploads_round_trip_on(TestApp::spawn().await).await;
}

/// Also run against the S3 backend (tests/api/storage.rs).
pub(crate) async fn raw_and_multipart_uploads_round_trip_on(app: TestApp) {
    let admin = app.admin_token().await;

    let raw = random_bytes(300_000);
    let (status, body) =
        app.put_bytes(&admin, "/attachments/photo-1.jpg", &raw, Some("application/octet-stream")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "success");
    assert_eq!(body["attachment_id"], "photo-1.jpg");
    assert_eq!(body["size"], raw.len());
    assert_eq!(body["content_type"], "image/jpeg", "octet-stream is guessed from the extension");
    assert_eq!(body["sha256"], sha(&raw));
    assert_eq!(body["created"], true);
    assert!(body["change_id"].as_i64().is_some_and(|c| c >= 1));
    let (status, headers, got) = app.get_bytes(&admin, "/attachments/photo-1.jpg").await;
    assert_eq!(status, StatusCode::OK);
    assert!(got == raw, "downloaded bytes differ");
    assert_eq!(headers["content-type"], "image/jpeg");
    assert_eq!(headers["content-length"], raw.len().to_string().as_str());
    assert_eq!(headers["etag"], format!("\"{}\"", sha(&raw)).as_str());
    assert_eq!(headers["accept-ranges"], "bytes");
    assert_eq!(headers["cache-control"], "private, max-age=31536000, immutable");
    assert_eq!(headers["content-disposition"], "attachment; filename=\"photo-1.jpg\"");

    // Multipart PUT: the part named `file` wins over other parts; its own type is kept.
    let png = random_bytes(5_000);
    let form = reqwest::multipart::Form::new()
        .text("note", "ignored")
        .part("other", file_part(b"decoy", "decoy.txt", "text/plain"))
        .part("file", file_part(&png, "whatever.bin", "image/png"));
    let (status, body) = send_multipart(&app, Method::PUT, &admin, "/attachments/pic", form).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["content_type"], "image/png");
    let (_, headers, got) = app.get_bytes(&admin, "/attachments/pic").await;
    assert!(got == png);
    assert_eq!(headers["content-type"], "image/png");

    // The only file part counts even under another name.
    let only = random_bytes(100);
    let form =
        reqwest::multipart::Form::new().part("upload", file_part(&only, "x", "application/octet-stream"));
    let (status, body) = send_multipart(&app, Method::PUT, &admin, "/attachments/doc.pdf", form).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["content_type"], "application/pdf");

    // No file part, or two unnamed ones: 400.
    let form = reqwest::multipart::Form::new().text("file_missing", "x");
    let (status, body) = send_multipart(&app, Method::PUT, &admin, "/attachments/none", form).await;
    assert_error(status, &body, 400, "BAD_REQUEST");
    let form = reqwest::multipart::Form::new()
        .part("a", file_part(b"1", "a.txt", "text/plain"))
        .part("b", file_part(b"2", "b.txt", "text/plain"));
    let (status, body) = send_multipart(&app, Method::PUT, &admin, "/attachments/two", form).await;
    assert_error(status, &body, 400, "BAD_REQUEST");

    // POST with attachment_id (after the file part), and without it (the filename's base name).
    let a = random_bytes(1_000);
    let form = reqwest::multipart::Form::new()
        .part("file", file_part(&a, "ignored.bin", "application/octet-stream"))
        .text("attachment_id", "posted.png");
    let (status, body) = send_multipart(&app, Method::POST, &admin, "/attachments", form).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["attachment_id"], "posted.png");
    assert_eq!(body["content_type"], "image/png");
    assert!(app.get_bytes(&admin, "/attachments/posted.png").await.2 == a);
    let b = random_bytes(10);
    let form = reqwest::multipart::Form::new().part("file", file_part(&b, "dir/base-name.txt", "text/plain"));
    let (status, body) = send_multipart(&app, Method::POST, &admin, "/api/attachments", form).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["attachment_id"], "base-name.txt");
    let form = reqwest::multipart::Form::new().part("file", reqwest::multipart::Part::bytes(b.clone()));
    let (status, body) = send_multipart(&app, Method::POST, &admin, "/attachments", form).await;
    assert_error(status, &body, 400, "BAD_REQUEST");

    // Zero bytes are a valid attachment.
    let (status, body) = app.put_bytes(&admin, "/attachments/empty.txt", b"", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["size"], 0);
    let (status, headers, got) = app.get_bytes(&admin, "/attachments/empty.txt").await;
    assert_eq!(status, StatusCode::OK);
    assert!(got.is_empty());
    assert_eq!(headers["content-length"], "0");

    let (status, body) = app.call(Method::GET, "/attachments/nope.jpg", Some(&admin), None).await;
    assert_error(status, &body, 404, "NOT_FOUND");
    assert_eq!(tmp_files(&app), 0);
}

#[actix_web::test]
async fn reuploads_are_idempotent_and_conflicts_keep_the_stored_bytes() {
    reuploads_are_idempotent_and_conflicts_keep_the_stored_bytes_on(TestApp::spawn().await).await;
}

/// Also run against the S3 backend (tests/api/storage.rs).
pub(crate) async fn reuploads_are_idempotent_and_conflicts_keep_the_stored_bytes_on(app: TestApp) {
    let admin = app.admin_token().await;
    let bytes = random_bytes(20_000);
    let (status, first) = app.put_bytes(&admin, "/attachments/a.bin", &bytes, None).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let head = head_change_id(&app, &admin).await;
    assert_eq!(head, first["change_id"].as_i64().expect("change_id"));

    let (status, again) = app.put_bytes(&admin, "/attachments/a.bin", &bytes, None).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["created"], false);
    assert_eq!(again["change_id"], first["change_id"]);
    assert_eq!(again["sha256"], first["sha256"]);
    assert_eq!(head_change_id(&app, &admin).await, head, "no new change for the same bytes");
    let m = manifest(&app, &admin, "").await;
    assert_eq!(m["operations"].as_array().expect("ops").len(), 1);
    assert_eq!(m["change_cutoff"], head);

    let other = random_bytes(20_000);
    let (status, body) = app.put_bytes(&admin, "/attachments/a.bin", &other, None).await;
    assert_error(status, &body, 409, "ATTACHMENT_EXISTS");
    assert_eq!(body["message"], "Attachment already exists");
    let form = reqwest::multipart::Form::new().part("file", file_part(&other, "a.bin", "image/png"));
    let (status, body) = send_multipart(&app, Method::PUT, &admin, "/attachments/a.bin", form).await;
    assert_error(status, &body, 409, "ATTACHMENT_EXISTS");
    assert!(app.get_bytes(&admin, "/attachments/a.bin").await.2 == bytes, "stored bytes unchanged");
    assert_eq!(head_change_id(&app, &admin).await, head);
    assert_eq!(tmp_files(&app), 0);
}

/// A blob the store lost comes back when a device sends the same bytes again.
#[actix_web::test]
async fn an_identical_reupload_restores_a_lost_file() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let bytes = random_bytes(5_000);
    let (status, first) = app.put_bytes(&admin, "/attachments/lost.bin", &bytes, None).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let hash = sha(&bytes);
    let blob = app.data_root.path().join("attachments").join("blobs").join(&hash[..2]).join(&hash);
    std::fs::remove_file(&blob).expect("lose the blob");
    assert_eq!(app.get_bytes(&admin, "/attachments/lost.bin").await.0, StatusCode::NOT_FOUND);

    let (status, again) = app.put_bytes(&admin, "/attachments/lost.bin", &bytes, None).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["created"], false);
    assert_eq!(again["change_id"], first["change_id"], "no new change: the record was never lost");
    assert!(app.get_bytes(&admin, "/attachments/lost.bin").await.2 == bytes, "the file is back");
}

#[actix_web::test]
async fn racing_uploads_of_one_id_store_exactly_one() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let a = random_bytes(50_000);
    let b = random_bytes(50_000);
    let tasks = (0..16).map(|i| {
        let bytes = if i % 2 == 0 { a.clone() } else { b.clone() };
        let (client, url, token) = (app.client.clone(), app.url("/attachments/race.bin"), admin.clone());
        async move {
            let res = client.put(url).bearer_auth(token).body(bytes.clone()).send().await.expect("upload");
            let status = res.status();
            (bytes, status, res.json::<Value>().await.expect("json"))
        }
    });
    let results = futures_util::future::join_all(tasks).await;
    let (_, _, stored) = app.get_bytes(&admin, "/attachments/race.bin").await;
    assert!(stored == a || stored == b);
    let mut created = 0;
    for (bytes, status, body) in &results {
        if *bytes == stored {
            assert_eq!(*status, StatusCode::OK, "{body}");
            assert_eq!(body["sha256"], sha(&stored));
            created += usize::from(body["created"] == true);
        } else {
            assert_error(*status, body, 409, "ATTACHMENT_EXISTS");
        }
    }
    assert_eq!(created, 1, "exactly one upload created the attachment");
    let ops = manifest(&app, &admin, "").await["operations"].as_array().expect("ops").clone();
    assert_eq!(ops.len(), 1);
    assert_eq!(ops[0]["attachment_id"], "race.bin");
    assert_eq!(ops[0]["change_id"], head_change_id(&app, &admin).await);
}

#[actix_web::test]
async fn an_interrupted_upload_leaves_nothing_and_can_be_retried() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let before = manifest(&app, &admin, "").await;

    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", app.port)).await.expect("connect");
    let head = format!(
        "PUT /attachments/cut.bin HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {admin}\r\n\
         Content-Type: application/octet-stream\r\nContent-Length: 1000000\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.expect("headers");
    stream.write_all(&random_bytes(200_000)).await.expect("part of the body");
    stream.flush().await.expect("flush");
    let mut waited = 0;
    while tmp_files(&app) == 0 && waited < 50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        waited += 1;
    }
    assert_eq!(tmp_files(&app), 1, "the upload is in flight in a temp file");
    let (status, body) = app.call(Method::GET, "/attachments/cut.bin", Some(&admin), None).await;
    assert_error(status, &body, 404, "NOT_FOUND");
    drop(stream);

    let mut waited = 0;
    while tmp_files(&app) > 0 && waited < 50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        waited += 1;
    }
    assert_eq!(tmp_files(&app), 0, "the temp file of the cut upload is gone");
    let (status, body) = app.call(Method::GET, "/attachments/cut.bin", Some(&admin), None).await;
    assert_error(status, &body, 404, "NOT_FOUND");
    let res = app.send(Method::HEAD, "/attachments/cut.bin", Some(&admin), None).await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    assert_eq!(manifest(&app, &admin, "").await, before);

    let full = random_bytes(1_000_000);
    let (status, body) = app.put_bytes(&admin, "/attachments/cut.bin", &full, None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["created"], true);
    assert!(app.get_bytes(&admin, "/attachments/cut.bin").await.2 == full);
}

#[actix_web::test]
async fn manifests_list_every_users_uploads_with_absolute_urls() {
    // The test client connects from loopback: a proxy we trust.
    let app = TestApp::spawn_with(&[("TRUSTED_PROXIES", "127.0.0.1/32")]).await;
    let admin = app.admin_token().await;
    let writer = app.user_token(&admin, "writer", "read-write").await;
    let reader = app.user_token(&admin, "reader", "read-only").await;
    let one = random_bytes(1_000);
    let two = random_bytes(2_000);
    let (_, first) = app.put_bytes(&admin, "/attachments/photo%201.jpg", &one, None).await;
    let (status, second) = app.put_bytes(&writer, "/attachments/dir/b.png", &two, Some("image/png")).await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_eq!(first["attachment_id"], "photo 1.jpg");

    let m = manifest(&app, &reader, "").await;
    let ops = m["operations"].as_array().expect("ops");
    assert_eq!(ops.len(), 2);
    assert_eq!(
        ops[0],
        json!({"attachment_id": "photo 1.jpg", "operation": "upload", "change_id": first["change_id"],
               "size": 1000, "content_type": "image/jpeg"})
    );
    assert_eq!(ops[1]["attachment_id"], "dir/b.png");
    let cutoff = m["change_cutoff"].as_i64().expect("cutoff");
    assert_eq!(cutoff, second["change_id"].as_i64().expect("change_id"));
    let after_first = manifest(&app, &reader, &format!("?after_change_id={}", first["change_id"])).await;
    assert_eq!(after_first["operations"].as_array().expect("ops").len(), 1);
    assert!(manifest(&app, &reader, &format!("?after_change_id={cutoff}")).await["operations"]
        .as_array()
        .is_some_and(|o| o.is_empty()));
    let since = manifest(&app, &reader, "?since=2000-01-01T00:00:00Z").await;
    assert_eq!(since["operations"].as_array().expect("ops").len(), 2);
    let future = manifest(&app, &reader, "?since=2999-01-01T00:00:00%2B02:00").await;
    assert!(future["operations"].as_array().is_some_and(|o| o.is_empty()));
    for bad in [
        "?after_change_id=1&since=2000-01-01T00:00:00Z",
        "?after_change_id=-1",
        "?after_change_id=x",
        "?since=yesterday",
    ] {
        let (status, body) =
            app.call(Method::GET, &format!("/attachments/manifest{bad}"), Some(&reader), None).await;
        assert_error(status, &body, 400, "BAD_REQUEST");
    }

    // The Synkronus 1.0 shape, fetched at the root and under /api/v1; URLs work as given.
    for prefix in ["", "/api/v1"] {
        let (status, body) = app
            .call(
                Method::POST,
                &format!("{prefix}/attachments/manifest"),
                Some(&reader),
                Some(json!({"client_id": "dev-1", "since_version": 0})),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["current_version"], cutoff);
        assert_eq!(body["total_download_size"], 3000);
        assert_eq!(body["operation_count"], json!({"download": 2, "delete": 0}));
        let ops = body["operations"].as_array().expect("ops");
        assert_eq!(ops[0]["operation"], "download");
        assert_eq!(ops[0]["version"], first["change_id"]);
        assert_eq!(ops[0]["download_url"], format!("{}{prefix}/attachments/photo%201.jpg", app.base));
        assert_eq!(ops[1]["download_url"], format!("{}{prefix}/attachments/dir%2Fb.png", app.base));
        for (op, bytes) in ops.iter().zip([&one, &two]) {
            let res = app
                .client
                .get(op["download_url"].as_str().expect("url"))
                .bearer_auth(&reader)
                .send()
                .await
                .expect("get");
            assert_eq!(res.status(), StatusCode::OK);
            assert!(res.bytes().await.expect("bytes").to_vec() == *bytes);
        }
    }
    let (status, body) = app
        .call(
            Method::POST,
            "/attachments/manifest",
            Some(&reader),
            Some(json!({"client_id": "d", "since_version": cutoff})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["operations"], json!([]));
    assert_eq!(body["total_download_size"], 0);
    for bad in [
        json!({"since_version": 0}),
        json!({"client_id": "d", "since_version": -1}),
        json!({"client_id": "d", "since_version": 1.5}),
        json!({"client_id": "d", "since_version": "1"}),
    ] {
        let (status, body) = app.call(Method::POST, "/attachments/manifest", Some(&reader), Some(bad)).await;
        assert_error(status, &body, 400, "BAD_REQUEST");
    }

    // Forwarded headers name the public address.
    let res = app
        .client
        .post(app.url("/api/attachments/manifest"))
        .bearer_auth(&reader)
        .header("x-forwarded-proto", "http")
        .header("x-forwarded-host", format!("127.0.0.1:{}", app.port))
        .json(&json!({"client_id": "d"}))
        .send()
        .await
        .expect("manifest");
    let body: Value = res.json().await.expect("json");
    let url = body["operations"][0]["download_url"].as_str().expect("url").to_string();
    assert_eq!(url, format!("http://127.0.0.1:{}/api/attachments/photo%201.jpg", app.port));
    let res = app.client.get(&url).bearer_auth(&reader).send().await.expect("get");
    assert!(res.bytes().await.expect("bytes").to_vec() == one);
    let res = app
        .client
        .post(app.url("/attachments/manifest"))
        .bearer_auth(&reader)
        .header("x-forwarded-proto", "https")
        .header("x-forwarded-host", "sync.example.org")
        .header("x-forwarded-prefix", "/synk/")
        .json(&json!({"client_id": "d"}))
        .send()
        .await
        .expect("manifest");
    let body: Value = res.json().await.expect("json");
    assert_eq!(
        body["operations"][1]["download_url"],
        "https://sync.example.org/synk/attachments/dir%2Fb.png"
    );
}

#[actix_web::test]
async fn forwarding_headers_from_an_untrusted_peer_are_ignored() {
    let app = TestApp::spawn_with(&[("TRUSTED_PROXIES", "10.0.0.0/8")]).await;
    let admin = app.admin_token().await;
    app.put_bytes(&admin, "/attachments/photo%201.jpg", b"abc", None).await;
    let res = app
        .client
        .post(app.url("/attachments/manifest"))
        .bearer_auth(&admin)
        .header("x-forwarded-proto", "https")
        .header("x-forwarded-host", "evil.example.com")
        .header("x-forwarded-prefix", "/phish")
        .json(&json!({"client_id": "d"}))
        .send()
        .await
        .expect("manifest");
    let body: Value = res.json().await.expect("json");
    assert_eq!(
        body["operations"][0]["download_url"],
        format!("http://127.0.0.1:{}/attachments/photo%201.jpg", app.port)
    );
}

#[actix_web::test]
async fn public_url_wins_for_download_urls() {
    let app = TestApp::spawn_with(&[("PUBLIC_URL", "https://sync.example.org/synk/")]).await;
    let admin = app.admin_token().await;
    app.put_bytes(&admin, "/attachments/photo%201.jpg", b"abc", None).await;
    let res = app
        .client
        .post(app.url("/api/v1/attachments/manifest"))
        .bearer_auth(&admin)
        .header("x-forwarded-host", "elsewhere.example.com")
        .json(&json!({"client_id": "d"}))
        .send()
        .await
        .expect("manifest");
    let body: Value = res.json().await.expect("json");
    assert_eq!(
        body["operations"][0]["download_url"],
        "https://sync.example.org/synk/api/v1/attachments/photo%201.jpg"
    );
    // The same URL with our own base in front still serves the bytes.
    let path = body["operations"][0]["download_url"]
        .as_str()
        .expect("url")
        .replace("https://sync.example.org/synk", "");
    assert_eq!(app.get_bytes(&admin, &path).await.2, b"abc");
}

#[actix_web::test]
async fn ranges_conditionals_and_head() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let bytes = random_bytes(1_000);
    app.put_bytes(&admin, "/attachments/r.bin", &bytes, None).await;
    let etag = format!("\"{}\"", sha(&bytes));
    let get = |range: Option<&str>, extra: Option<(&str, &str)>| {
        let mut req = app.client.get(app.url("/attachments/r.bin")).bearer_auth(&admin);
        if let Some(r) = range {
            req = req.header("range", r);
        }
        if let Some((k, v)) = extra {
            req = req.header(k, v);
        }
        req.send()
    };
    let cases: [(&str, u16, Span); 6] = [
        ("bytes=0-9", 206, Some((0, 9))),
        ("bytes=990-", 206, Some((990, 999))),
        ("bytes=-10", 206, Some((990, 999))),
        ("bytes=100-5000", 206, Some((100, 999))),
        ("bytes=0-1,5-6", 200, None),
        ("bytes=9-2", 200, None),
    ];
    for (range, status, span) in cases {
        let res = get(Some(range), None).await.expect("get");
        assert_eq!(res.status().as_u16(), status, "{range}");
        let headers = res.headers().clone();
        let body = res.bytes().await.expect("body");
        match span {
            Some((a, b)) => {
                assert_eq!(headers["content-range"], format!("bytes {a}-{b}/1000").as_str());
                assert_eq!(headers["content-length"], (b - a + 1).to_string().as_str());
                assert!(body[..] == bytes[a..=b], "{range}");
            }
            None => assert!(body[..] == bytes[..]),
        }
    }
    for range in ["bytes=1000-", "bytes=-0"] {
        let res = get(Some(range), None).await.expect("get");
        assert_eq!(res.headers()["content-range"], "bytes */1000");
        let status = res.status();
        let body: Value = res.json().await.expect("json");
        assert_error(status, &body, 416, "RANGE_NOT_SATISFIABLE");
    }
    let res = get(Some("bytes=0-9"), Some(("if-range", &etag))).await.expect("get");
    assert_eq!(res.status(), StatusCode::PARTIAL_CONTENT);
    let res = get(Some("bytes=0-9"), Some(("if-range", "\"stale\""))).await.expect("get");
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.bytes().await.expect("body").len(), 1000);
    let res = get(None, Some(("if-none-match", &format!("\"x\", W/{etag}")))).await.expect("get");
    assert_eq!(res.status(), StatusCode::NOT_MODIFIED);
    assert_eq!(res.headers()["etag"], etag.as_str());
    let res = get(None, Some(("if-none-match", "\"other\""))).await.expect("get");
    assert_eq!(res.status(), StatusCode::OK);

    let res = app.send(Method::HEAD, "/attachments/r.bin", Some(&admin), None).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["content-length"], "1000");
    assert_eq!(res.headers()["etag"], etag.as_str());
    assert!(res.bytes().await.expect("body").is_empty());
    let res = app.send(Method::HEAD, "/attachments/missing", Some(&admin), None).await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    assert!(res.bytes().await.expect("body").is_empty());
    let (status, body) = app.call(Method::DELETE, "/attachments/r.bin", Some(&admin), None).await;
    assert_error(status, &body, 405, "METHOD_NOT_ALLOWED");
    let (status, body) = app.call(Method::PUT, "/attachments/manifest", Some(&admin), None).await;
    assert_error(status, &body, 405, "METHOD_NOT_ALLOWED");
}

/// The inclusive byte span a 206 must carry, or None for the full body.
type Span = Option<(usize, usize)>;

fn encoded_image(width: u32, height: u32, format: image::ImageFormat) -> Vec<u8> {
    let img =
        image::RgbImage::from_fn(width, height, |x, y| image::Rgb([(x % 256) as u8, (y % 256) as u8, 90]));
    let mut out = std::io::Cursor::new(Vec::new());
    image::DynamicImage::ImageRgb8(img).write_to(&mut out, format).expect("encode");
    out.into_inner()
}

#[actix_web::test]
async fn quality_variants_are_smaller_images_of_the_same_shape() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let png = encoded_image(1200, 800, image::ImageFormat::Png);
    let jpeg = encoded_image(600, 900, image::ImageFormat::Jpeg);
    app.put_bytes(&admin, "/attachments/big.png", &png, None).await;
    app.put_bytes(&admin, "/attachments/tall.jpg", &jpeg, None).await;
    app.put_bytes(&admin, "/attachments/broken.png", b"not really a png", None).await;
    app.put_bytes(&admin, "/attachments/notes.txt", b"plain text", None).await;

    let cases = [
        ("big.png", "small", image::ImageFormat::Png, (256, 171)),
        ("big.png", "medium", image::ImageFormat::Png, (1024, 683)),
        ("tall.jpg", "small", image::ImageFormat::Jpeg, (171, 256)),
    ];
    for (id, quality, format, (w, h)) in cases {
        for _ in 0..2 {
            let (status, headers, body) =
                app.get_bytes(&admin, &format!("/attachments/{id}?quality={quality}")).await;
            assert_eq!(status, StatusCode::OK);
            let original = if id == "big.png" { &png } else { &jpeg };
            assert_eq!(headers["etag"], format!("\"{}-{quality}\"", sha(original)).as_str());
            assert!(body.len() < original.len(), "{id} {quality}: the variant is smaller");
            assert_eq!(image::guess_format(&body).expect("format"), format);
            let img = image::load_from_memory(&body).expect("decodable");
            assert_eq!((img.width(), img.height()), (w, h), "{id} {quality}");
        }
    }
    // Never upscaled; `original` wins; unknown values, non-images and undecodable images get the original.
    for path in [
        "/attachments/big.png?quality=large",
        "/attachments/big.png?quality=small&original=TRUE",
        "/attachments/big.png?quality=original",
        "/attachments/big.png?quality=tiny",
    ] {
        let (status, headers, body) = app.get_bytes(&admin, path).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert!(body == png, "{path}");
        assert_eq!(headers["etag"], format!("\"{}\"", sha(&png)).as_str());
    }
    assert_eq!(app.get_bytes(&admin, "/attachments/broken.png?quality=small").await.2, b"not really a png");
    assert_eq!(app.get_bytes(&admin, "/attachments/notes.txt?quality=small").await.2, b"plain text");
    let res = app
        .client
        .get(app.url("/attachments/big.png?quality=small"))
        .bearer_auth(&admin)
        .header("if-none-match", format!("\"{}-small\"", sha(&png)))
        .send()
        .await
        .expect("get");
    assert_eq!(res.status(), StatusCode::NOT_MODIFIED);
}

#[actix_web::test]
async fn roles_are_checked_after_authentication() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let reader = app.user_token(&admin, "reader", "read-only").await;
    let (status, body) = app.put_bytes(&reader, "/attachments/x.bin", b"abc", None).await;
    assert_error(status, &body, 403, "FORBIDDEN");
    let form = reqwest::multipart::Form::new().part("file", file_part(b"abc", "x.bin", "text/plain"));
    let (status, body) = send_multipart(&app, Method::POST, &reader, "/attachments", form).await;
    assert_error(status, &body, 403, "FORBIDDEN");
    let res = app.client.put(app.url("/attachments/x.bin")).body("abc").send().await.expect("put");
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let (status, body) = app.call(Method::GET, "/attachments/manifest", None, None).await;
    assert_error(status, &body, 401, "MISSING_TOKEN");
    let (status, body) = app.call(Method::GET, "/attachments/export-zip", None, None).await;
    assert_error(status, &body, 401, "MISSING_TOKEN");
    let (status, _) = app.put_bytes(&admin, "/attachments/x.bin", b"abc", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(app.get_bytes(&reader, "/attachments/x.bin").await.2, b"abc");
    let (status, _) =
        app.call(Method::POST, "/attachments/manifest", Some(&reader), Some(json!({"client_id": "r"}))).await;
    assert_eq!(status, StatusCode::OK);
}

#[actix_web::test]
async fn unsafe_ids_are_refused() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let long = "a".repeat(513);
    let targets = [
        "/attachments/..",
        "/attachments/%2e%2e",
        "/attachments/a/../b",
        "/attachments/a/%2E%2E/b",
        "/attachments/a%2F..%2Fb",
        "/attachments/a/./b",
        "/attachments/a%5Cb",
        "/attachments/..%5C..%5Cetc",
        "/attachments/a%00b",
        "/attachments/a%0Ab",
        "/attachments/%25",
        &format!("/attachments/{long}"),
    ];
    for target in targets {
        // `%25` alone decodes to `%`, which is a fine id: it must simply not exist.
        let expect_put = if target == "/attachments/%25" { 200 } else { 400 };
        assert_eq!(raw_status(&app, "PUT", target, &admin).await, expect_put, "PUT {target}");
        let expect_get = if target == "/attachments/%25" { 200 } else { 400 };
        assert_eq!(raw_status(&app, "GET", target, &admin).await, expect_get, "GET {target}");
    }
    let form = reqwest::multipart::Form::new()
        .part("file", file_part(b"x", "x", "text/plain"))
        .text("attachment_id", "../escape");
    let (status, body) = send_multipart(&app, Method::POST, &admin, "/attachments", form).await;
    assert_error(status, &body, 400, "BAD_REQUEST");
    let form = reqwest::multipart::Form::new().part("file", file_part(b"x", "manifest", "text/plain"));
    let (status, body) = send_multipart(&app, Method::POST, &admin, "/attachments", form).await;
    assert_error(status, &body, 400, "BAD_REQUEST");
    let ops = manifest(&app, &admin, "").await["operations"].as_array().expect("ops").clone();
    assert_eq!(ops.len(), 1, "only the `%` id was stored: {ops:?}");
    assert_eq!(ops[0]["attachment_id"], "%");
    let blobs = app.data_root.path().join("attachments").join("blobs");
    let files = walkdir::WalkDir::new(&blobs)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
        .count();
    assert_eq!(files, 1, "nothing was written outside the blob store");
}

#[actix_web::test]
async fn ids_with_slashes_work_everywhere() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let bytes = random_bytes(4_000);
    let (status, body) =
        app.put_bytes(&admin, "/api/v1/attachments/forms/site 1/photo.jpg", &bytes, None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["attachment_id"], "forms/site 1/photo.jpg");
    assert_eq!(body["content_type"], "image/jpeg");
    let (status, headers, got) = app.get_bytes(&admin, "/attachments/forms/site%201/photo.jpg").await;
    assert_eq!(status, StatusCode::OK);
    assert!(got == bytes);
    assert_eq!(headers["content-disposition"], "attachment; filename=\"photo.jpg\"");
    let (_, _, encoded) = app.get_bytes(&admin, "/attachments/forms%2Fsite%201%2Fphoto.jpg").await;
    assert!(encoded == bytes, "a percent-encoded slash names the same id");
    let res = app.send(Method::HEAD, "/api/attachments/forms/site%201/photo.jpg", Some(&admin), None).await;
    assert_eq!(res.status(), StatusCode::OK);
    let (status, again) =
        app.put_bytes(&admin, "/attachments/forms%2Fsite%201%2Fphoto.jpg", &bytes, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(again["created"], false);
    let ops = manifest(&app, &admin, "").await["operations"].as_array().expect("ops").clone();
    assert_eq!(ops.len(), 1);
    assert_eq!(ops[0]["attachment_id"], "forms/site 1/photo.jpg");
    let max = format!("{}/{}", "d".repeat(255), "f".repeat(256));
    assert_eq!(max.len(), 512);
    let (status, body) = app.put_bytes(&admin, &format!("/attachments/{max}"), b"m", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(app.get_bytes(&admin, &format!("/attachments/{max}")).await.2, b"m");
    let (status, body) = app.call(Method::GET, "/attachments/forms/site%201", Some(&admin), None).await;
    assert_error(status, &body, 404, "NOT_FOUND");
    let non_ascii = "fotos/ñandú ü.jpg";
    let path = format!("/attachments/{}", percent_encode(non_ascii));
    app.put_bytes(&admin, &path, b"n", None).await;
    let (_, headers, _) = app.get_bytes(&admin, &path).await;
    assert_eq!(
        headers["content-disposition"],
        "attachment; filename=\"_and_ _.jpg\"; filename*=UTF-8''%C3%B1and%C3%BA%20%C3%BC.jpg"
    );
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[actix_web::test]
async fn oversized_uploads_get_413_and_leave_nothing() {
    let app = TestApp::spawn_with(&[("MAX_ATTACHMENT_BYTES", "1000")]).await;
    let admin = app.admin_token().await;
    let (status, body) = app.put_bytes(&admin, "/attachments/big.bin", &random_bytes(5_000), None).await;
    assert_error(status, &body, 413, "PAYLOAD_TOO_LARGE");
    // Without Content-Length the limit is enforced while streaming.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = (0..5).map(|_| Ok(random_bytes(400))).collect();
    let res = app
        .client
        .put(app.url("/attachments/big.bin"))
        .bearer_auth(&admin)
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(chunks)))
        .send()
        .await
        .expect("chunked upload");
    let status = res.status();
    let body: Value = res.json().await.expect("json");
    assert_error(status, &body, 413, "PAYLOAD_TOO_LARGE");
    let form = reqwest::multipart::Form::new()
        .part("file", file_part(&random_bytes(1_500), "big.bin", "text/plain"));
    let (status, body) = send_multipart(&app, Method::PUT, &admin, "/attachments/big.bin", form).await;
    assert_error(status, &body, 413, "PAYLOAD_TOO_LARGE");
    let (status, body) = app.put_bytes(&admin, "/attachments/fits.bin", &random_bytes(1_000), None).await;
    assert_eq!(status, StatusCode::OK, "exactly the limit fits: {body}");
    let (status, body) = app.call(Method::GET, "/attachments/big.bin", Some(&admin), None).await;
    assert_error(status, &body, 404, "NOT_FOUND");
    assert_eq!(tmp_files(&app), 0);
}

#[actix_web::test]
async fn export_zip_holds_every_attachment() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let reader = app.user_token(&admin, "reader", "read-only").await;
    let files = [("a.jpg", random_bytes(70_000)), ("dir/b.png", random_bytes(10)), ("empty", Vec::new())];
    for (id, bytes) in &files {
        let (status, body) = app.put_bytes(&admin, &format!("/attachments/{id}"), bytes, None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let (status, headers, zip_bytes) = app.get_bytes(&reader, "/api/attachments/export-zip").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-type"], "application/zip");
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(zip_bytes)).expect("valid zip");
    assert_eq!(archive.len(), files.len());
    for (id, bytes) in &files {
        let mut entry = archive.by_name(id).unwrap_or_else(|_| panic!("entry {id}"));
        let mut got = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut got).expect("read entry");
        assert!(got == *bytes, "{id}");
    }
}

/// A repository reset and an upload that commits around it: the upload's row and its file live
/// or go together (docs/api.md §17.3). The test stalls the reset's commit inside the database (a lock
/// on a table only the reset writes), starts an upload while it waits, and lets the reset go only
/// once the upload has stored its file or has been held back. A store that deletes files after
/// the reset without ordering it with uploads fails this every time: the upload's file is gone
/// while its row, committed after the reset, stays.
#[actix_web::test]
async fn an_upload_racing_a_repository_reset_keeps_its_file() {
    let app = TestApp::spawn().await;
    upload_racing_reset(&app, &app).await;
}

/// The same with the reset on one node and the upload on another sharing the database and the
/// attachment folder (docs/api.md §18.2): the order comes from the database, not from one process.
#[actix_web::test]
async fn an_upload_on_another_node_racing_a_repository_reset_keeps_its_file() {
    let a = TestApp::spawn_with(&[("NODE_ID", "node-a")]).await;
    let data_root = a.data_root.path().display().to_string();
    let b = TestApp::spawn_on(a.db_conn.clone(), &[("NODE_ID", "node-b"), ("DATA_ROOT", &data_root)]).await;
    upload_racing_reset(&a, &b).await;
}

/// Resets through `app`, uploads through `uploader` (which shares its database and folder).
async fn upload_racing_reset(app: &TestApp, uploader: &TestApp) {
    let admin = app.admin_token().await;
    let (db, connection) = tokio_postgres::connect(&app.db_conn, tokio_postgres::NoTls)
        .await
        .expect("connect to the test database");
    actix_web::rt::spawn(connection);
    db.batch_execute("BEGIN; LOCK TABLE record_revisions IN ACCESS EXCLUSIVE MODE").await.expect("lock");

    let reset = {
        let (client, url, token) = (app.client.clone(), app.url("/admin/repository/reset"), admin.clone());
        actix_web::rt::spawn(async move {
            let res =
                client.post(url).bearer_auth(token).json(&json!({"confirm": "RESET_REPOSITORY"})).send();
            res.await.expect("reset").status()
        })
    };
    let waiting =
        "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'record_revisions'::regclass";
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while db.query_one(waiting, &[]).await.expect("pg_locks").get::<_, i64>(0) == 0 {
        assert!(std::time::Instant::now() < deadline, "the reset never reached the database");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let bytes = random_bytes(10_000);
    let upload = {
        let (client, url, token, body) =
            (app.client.clone(), uploader.url("/attachments/during-reset.bin"), admin.clone(), bytes.clone());
        actix_web::rt::spawn(async move {
            let res = client.put(url).bearer_auth(token).body(body).send().await.expect("upload");
            let status = res.status();
            (status, res.json::<Value>().await.unwrap_or(Value::Null))
        })
    };
    // Unordered, the upload stores its file at once and queues its row behind the reset; ordered,
    // it waits for the reset and no file appears. Either way it has got there within 2 s.
    let hash = sha(&bytes);
    let blob = app.data_root.path().join("attachments").join("blobs").join(&hash[..2]).join(&hash);
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while !blob.exists() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    db.batch_execute("COMMIT").await.expect("unlock");

    assert_eq!(reset.await.expect("reset task"), StatusCode::OK);
    let (status, body) = upload.await.expect("upload task");
    assert_eq!(status, StatusCode::OK, "{body}");
    let ids: Vec<Value> = manifest(app, &admin, "").await["operations"]
        .as_array()
        .expect("ops")
        .iter()
        .map(|o| o["attachment_id"].clone())
        .collect();
    assert_eq!(ids, vec![json!("during-reset.bin")], "the upload committed after the reset");
    for node in [app, uploader] {
        let (status, _, stored) = node.get_bytes(&admin, "/attachments/during-reset.bin").await;
        assert_eq!(status, StatusCode::OK, "a listed attachment has its file");
        assert!(stored == bytes, "the stored file is the uploaded one");
    }
}
