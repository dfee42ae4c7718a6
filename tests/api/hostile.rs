//! Hostile HTTP input (issue 9): every answer is a 4xx with the error body, never a 5xx or a hang.
//! Requests go over raw TCP where reqwest would repair or refuse them (`..`, NUL, broken framing).

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::{small_bundle, TestApp};

struct RawResponse {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl RawResponse {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// A 4xx with the standard error body (docs/api.md §4).
    fn assert_problem(&self, what: &str) {
        let body = self.json();
        assert!((400..500).contains(&self.status), "{what}: {} {body}", self.status);
        assert_eq!(self.header("content-type"), Some("application/problem+json"), "{what}: {body}");
        assert!(body["code"].is_string() && body["status"] == self.status, "{what}: {body}");
    }
}

fn parse_response(raw: &[u8]) -> RawResponse {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a response head");
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let mut lines = head.split("\r\n");
    let status = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|s| s.parse().ok()).expect("status");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked"));
    if chunked {
        let mut out = Vec::new();
        let mut rest = &body[..];
        while let Some(end) = rest.windows(2).position(|w| w == b"\r\n") {
            let size = usize::from_str_radix(String::from_utf8_lossy(&rest[..end]).trim(), 16).unwrap_or(0);
            if size == 0 || rest.len() < end + 2 + size {
                break;
            }
            out.extend_from_slice(&rest[end + 2..end + 2 + size]);
            rest = &rest[(end + 4 + size).min(rest.len())..];
        }
        body = out;
    }
    RawResponse { status, headers, body }
}

/// Sends `head` (without the blank line) and `body` byte for byte and reads the whole answer.
async fn raw(app: &TestApp, head: &str, body: &[u8]) -> RawResponse {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", app.port)).await.expect("connect");
    let mut request = format!("{head}\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").into_bytes();
    request.extend_from_slice(body);
    stream.write_all(&request).await.expect("write");
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut out))
        .await
        .unwrap_or_else(|_| panic!("no answer within 20 s to {head}"))
        .expect("read");
    parse_response(&out)
}

async fn raw_request(app: &TestApp, method: &str, target: &str, token: &str, body: &[u8]) -> RawResponse {
    let head = format!(
        "{method} {target} HTTP/1.1\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\n\
         Content-Length: {}",
        body.len()
    );
    raw(app, &head, body).await
}

/// Every route with a path parameter (`{}`), and the body it needs to get past JSON parsing.
const PARAM_ROUTES: &[(&str, &str, &str)] = &[
    ("GET", "/users/{}", ""),
    ("PUT", "/users/{}", r#"{"role":"read-only"}"#),
    ("DELETE", "/users/{}", ""),
    ("DELETE", "/users/delete/{}", ""),
    ("GET", "/observations/{}", ""),
    ("GET", "/observations/{}/history", ""),
    ("GET", "/formspecs/{}", ""),
    ("GET", "/formspecs/{}/1", ""),
    ("GET", "/formspecs/household/{}", ""),
    ("POST", "/app-bundle/switch/{}", ""),
    ("GET", "/app-bundle/download/{}", ""),
    ("GET", "/app-bundle/download/{}/index.html", ""),
    ("GET", "/app-bundle/download/app%2Findex.html?version={}", ""),
    ("GET", "/app-bundle/download-zip?version={}", ""),
    ("GET", "/app-bundle/changes?current={}&target={}", ""),
    ("GET", "/attachments/{}", ""),
    ("HEAD", "/attachments/{}", ""),
    ("PUT", "/attachments/{}", "abc"),
    ("GET", "/dataexport/jobs/{}", ""),
    ("GET", "/dataexport/jobs/{}/download", ""),
];

/// Traversal, NUL, encoded separators and invalid UTF-8, raw and percent-encoded.
const HOSTILE_PARAMS: &[&str] = &[
    "..",
    "%2e%2e",
    "%2E%2E%2F%2E%2E%2Fetc%2Fpasswd",
    "..%2F..%2F..%2Fetc%2Fpasswd",
    "..%5C..%5Cwindows",
    "%00",
    "a%00b",
    "%2500",
    "%2F",
    "%2Fetc%2Fpasswd",
    "%FF%FE",
    "%C0%AE%C0%AE",
    ".",
];

#[actix_web::test]
async fn traversal_and_nul_in_every_path_parameter_are_4xx() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    // A bundle and an attachment exist, so the routes get past "nothing there yet".
    app.push_bundle(&admin, small_bundle("20250101-000000", "x"), true).await;
    let res = app.client.put(app.url("/attachments/known.bin")).bearer_auth(&admin).body("abc").send().await;
    assert_eq!(res.expect("upload").status(), StatusCode::OK);
    for &(method, route, body) in PARAM_ROUTES {
        for param in HOSTILE_PARAMS {
            let target = route.replace("{}", param);
            let res = raw_request(&app, method, &target, &admin, body.as_bytes()).await;
            let what = format!("{method} {target}");
            if *param == "%2500" && res.status < 300 {
                // Decoded exactly once, this is the harmless literal id "%00" (docs/api.md §1.4).
                assert_eq!(res.json()["attachment_id"], "%00", "{what}");
                continue;
            }
            if method == "HEAD" {
                assert!((400..500).contains(&res.status), "{what}: {}", res.status);
            } else {
                res.assert_problem(&what);
            }
        }
    }
    // The server's own files and the bundle store are untouched and still served.
    let (status, body) = app.call(Method::GET, "/attachments/manifest", Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let ids: Vec<&str> = body["operations"]
        .as_array()
        .expect("operations")
        .iter()
        .filter_map(|o| o["attachment_id"].as_str())
        .collect();
    assert_eq!(ids, ["known.bin", "%00"]);
    let (status, _) = app.call(Method::GET, "/app-bundle/manifest", Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK);
}

#[actix_web::test]
async fn integers_out_of_range_are_400() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let bad_numbers =
        ["-1", "1.5", "1e400", "99999999999999999999999999", "-99999999999999999999", "\"12\"", "true"];
    for n in bad_numbers {
        let bodies = [
            format!(r#"{{"client_id":"c","since":{{"version":{n}}}}}"#),
            format!(r#"{{"client_id":"c","since":{n}}}"#),
            format!(r#"{{"client_id":"c","since_change_id":{n}}}"#),
            format!(r#"{{"clientId":"c","currentVersion":{n}}}"#),
        ];
        for body in bodies {
            let res = raw_request(&app, "POST", "/sync/pull", &admin, body.as_bytes()).await;
            res.assert_problem(&body);
            assert_eq!(res.status, 400, "{body}");
        }
        let body = format!(r#"{{"client_id":"c","since_version":{n}}}"#);
        let res = raw_request(&app, "POST", "/attachments/manifest", &admin, body.as_bytes()).await;
        res.assert_problem(&body);
        assert_eq!(res.status, 400, "{body}");
        // A record's base version is checked per record: 422 listing the problem.
        let body = format!(
            r#"{{"client_id":"c","transmission_id":"t-{}","records":[{{"observation_id":"o","form_type":"f","data":{{}},"version":{n}}}]}}"#,
            n.len()
        );
        let res = raw_request(&app, "POST", "/sync/push", &admin, body.as_bytes()).await;
        res.assert_problem(&body);
        assert_eq!(res.status, 422, "{body}");
    }
    // Limits are clamped (docs/api.md §1.5) in bodies, but text that is no integer at all is a 400.
    for n in ["abc", "1.5", "99999999999999999999999999", "-99999999999999999999", "%00", "1e3"] {
        for target in [
            format!("/sync/pull?client_id=c&limit={n}"),
            format!("/sync/pull?client_id=c&since={n}"),
            format!("/observations?limit={n}"),
            format!("/observations/x/history?limit={n}"),
            format!("/attachments/manifest?after_change_id={n}"),
            format!("/users?limit={n}"),
        ] {
            let res = raw_request(&app, "GET", &target, &admin, b"").await;
            if target.starts_with("/users") && res.status == 200 {
                continue;
            }
            res.assert_problem(&target);
        }
    }
}

#[actix_web::test]
async fn invalid_utf8_and_nul_bytes_in_bodies_are_4xx() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let bodies: [&[u8]; 5] = [
        b"{\"client_id\":\"\xff\xfe\",\"transmission_id\":\"t\",\"records\":[]}",
        b"{\"client_id\":\"c\",\"transmission_id\":\"t\",\"records\":[{\"observation_id\":\"\xc0\xae\"}]}",
        b"\xef\xbb\xbf{\"client_id\":\"c\"}",
        b"{\"client_id\":\"c\0\",\"transmission_id\":\"t\",\"records\":[]}",
        b"\x00\x00\x00\x00",
    ];
    for route in ["/sync/push", "/sync/pull", "/auth/login", "/users", "/attachments/manifest", "/formspecs"]
    {
        for body in bodies {
            let res = raw_request(&app, "POST", route, &admin, body).await;
            res.assert_problem(&format!("{route} {}", String::from_utf8_lossy(body)));
        }
    }
    // Nesting far beyond the 128 levels docs/api.md §1.3 allows, in every JSON route.
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let deep_in_data = format!(
        r#"{{"client_id":"c","transmission_id":"deep","records":[{{"observation_id":"o","data":{{"x":{deep}}}}}]}}"#
    );
    for route in ["/sync/push", "/sync/pull", "/auth/login", "/users", "/attachments/manifest", "/formspecs"]
    {
        for body in [deep.as_bytes(), deep_in_data.as_bytes()] {
            let res = raw_request(&app, "POST", route, &admin, body).await;
            res.assert_problem(route);
            assert_eq!(res.status, 400, "{route}");
        }
    }
    // NUL escaped inside JSON strings, in every id the sync engine stores.
    let cases = [
        json!({"client_id": "c\u{0}", "transmission_id": "t", "records": []}),
        json!({"client_id": "c", "transmission_id": "t\u{0}", "records": []}),
        json!({"client_id": "c", "transmission_id": "t", "records": [{"observation_id": "o\u{0}", "data": {}}]}),
        json!({"client_id": "c", "transmission_id": "t", "records": [{"observation_id": "o", "form_type": "f\u{0}", "data": {}}]}),
        json!({"client_id": "c", "transmission_id": "t", "records": [{"observation_id": "o", "data": {"k\u{0}": 1}}]}),
        json!({"client_id": "c", "transmission_id": "t", "records": [{"observation_id": "o", "data": {"k": "v\u{0}"}}]}),
    ];
    for body in cases {
        let (status, res) = app.call(Method::POST, "/sync/push", Some(&admin), Some(body.clone())).await;
        assert!(status.is_client_error(), "{body}: {status} {res}");
        assert!(res["code"].is_string(), "{res}");
    }
    let body = json!({"username": "nul\u{0}user", "password": "password-123", "role": "read-only"});
    let (status, res) = app.call(Method::POST, "/users", Some(&admin), Some(body.clone())).await;
    assert!(status.is_client_error(), "{body}: {status} {res}");
}

#[actix_web::test]
async fn huge_arrays_are_served_or_refused_with_413() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let records: Vec<Value> = (0..100_000)
        .map(|i| json!({"observation_id": format!("h{i}"), "form_type": "f", "data": {"i": i}}))
        .collect();
    let body = json!({"client_id": "c", "transmission_id": "huge", "records": records});
    let started = Instant::now();
    // A fresh connection: building the body takes longer than the server's keep-alive, and a
    // pooled connection closed meanwhile would fail the write on the client side.
    let res = reqwest::Client::new().post(app.url("/sync/push")).bearer_auth(&admin).json(&body).send().await;
    let res = res.expect("push");
    let status = res.status();
    let res: Value = res.json().await.unwrap_or(Value::Null);
    assert!(status == StatusCode::OK || status == StatusCode::PAYLOAD_TOO_LARGE, "{status} {res}");
    assert!(started.elapsed() < Duration::from_secs(120));
    let types: Vec<String> = (0..100_000).map(|i| format!("type-{i}")).collect();
    let body = json!({"client_id": "c", "schema_types": types});
    let res = reqwest::Client::new().post(app.url("/sync/pull")).bearer_auth(&admin).json(&body).send().await;
    let res = res.expect("pull");
    let status = res.status();
    let res: Value = res.json().await.unwrap_or(Value::Null);
    assert!(status == StatusCode::OK || status.is_client_error(), "{status} {res}");
    // A small server limit turns the same push into a 413 with the error body.
    let small = TestApp::spawn_with(&[("MAX_JSON_BODY_BYTES", "65536")]).await;
    let admin = small.admin_token().await;
    let records: Vec<Value> = (0..100_000).map(|i| json!({"observation_id": format!("h{i}")})).collect();
    let body = json!({"client_id": "c", "transmission_id": "huge", "records": records}).to_string();
    let res = raw_request(&small, "POST", "/sync/push", &admin, body.as_bytes()).await;
    res.assert_problem("huge push");
    assert_eq!(res.status, 413);
}

#[actix_web::test]
async fn oversized_headers_are_refused_and_the_server_goes_on() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let big = "a".repeat(64 * 1024);
    for head in [
        format!("GET /health HTTP/1.1\r\nX-Big: {big}"),
        format!("GET /health HTTP/1.1\r\nX-Big: {big}{big}{big}"),
        format!("GET /auth/me HTTP/1.1\r\nAuthorization: Bearer {big}"),
        format!("GET /{big} HTTP/1.1"),
        format!("GET /health HTTP/1.1{}", (0..200).map(|i| format!("\r\nX-H{i}: v")).collect::<String>()),
    ] {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", app.port)).await.expect("connect");
        let request = format!("{head}\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
        // The server may answer and close before it has read everything: ignore write errors.
        let _ = stream.write_all(request.as_bytes()).await;
        let mut out = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut out)).await;
        assert!(read.is_ok(), "the server hung on an oversized head");
        if out.is_empty() {
            continue;
        }
        let res = parse_response(&out);
        // Heads actix's parser itself refuses (a request line or head beyond its limits) get its
        // bare 400/431 before any middleware runs; everything else gets the error body.
        if res.header("content-type").is_some() {
            res.assert_problem(&format!("{} {}", res.status, &head[..40]));
        } else {
            assert!(res.body.is_empty() && [400, 431].contains(&res.status), "{}", &head[..40]);
        }
        assert!(
            [400, 404, 414, 431].contains(&res.status),
            "{}: {}",
            &head[..40],
            String::from_utf8_lossy(&out[..out.len().min(300)])
        );
    }
    let (status, _) = app.call(Method::GET, "/auth/me", Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK);
}

#[actix_web::test]
async fn truncated_multipart_and_chunked_bodies_are_400() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let zip = small_bundle("20250101-000000", "x");
    let mut multipart = b"--XyZ\r\nContent-Disposition: form-data; name=\"bundle\"; filename=\"b.zip\"\r\n\
        Content-Type: application/zip\r\n\r\n"
        .to_vec();
    multipart.extend_from_slice(&zip[..zip.len() / 2]);
    let cases: [(&str, &str, Vec<u8>); 6] = [
        ("POST", "/app-bundle/push", multipart.clone()),
        ("PUT", "/app-bundle", multipart.clone()),
        ("POST", "/attachments", multipart.clone()),
        ("POST", "/app-bundle/push", b"--XyZ\r\nContent-Disposition: form-da".to_vec()),
        ("POST", "/app-bundle/push", b"--XyZ--\r\n".to_vec()),
        ("POST", "/attachments", b"garbage without boundaries".to_vec()),
    ];
    for (method, route, body) in cases {
        let head = format!(
            "{method} {route} HTTP/1.1\r\nAuthorization: Bearer {admin}\r\n\
             Content-Type: multipart/form-data; boundary=XyZ\r\nContent-Length: {}",
            body.len()
        );
        let res = raw(&app, &head, &body).await;
        res.assert_problem(&format!("{method} {route}"));
        assert_eq!(res.status, 400, "{method} {route}: {}", res.json());
    }
    // A chunked JSON body whose framing breaks off mid-way.
    let head = format!(
        "POST /sync/push HTTP/1.1\r\nAuthorization: Bearer {admin}\r\nTransfer-Encoding: chunked\r\n\
         Content-Type: application/json"
    );
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", app.port)).await.expect("connect");
    let request = format!(
        "{head}\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n10\r\n{{\"client_id\":\"c\"\r\nZZ\r\n"
    );
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut out)).await;
    assert!(read.is_ok(), "a broken chunked body hangs the request");
    if !out.is_empty() {
        let res = parse_response(&out);
        assert!((400..500).contains(&res.status), "{}", String::from_utf8_lossy(&out));
    }
    let (status, body) = app.call(Method::GET, "/app-bundle/versions", Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["versions"], json!([]), "nothing half-pushed is listed");
}

#[actix_web::test]
async fn a_stalled_body_times_out_without_holding_up_other_requests() {
    let app = TestApp::spawn_with(&[("REQUEST_BODY_TIMEOUT_SECONDS", "2")]).await;
    let admin = app.admin_token().await;
    let mut stalled = Vec::new();
    for (route, content_type) in [
        ("/sync/push", "application/json"),
        ("/attachments/slow.bin", "application/octet-stream"),
        ("/app-bundle/push", "multipart/form-data; boundary=XyZ"),
    ] {
        let method = if route.starts_with("/attachments") { "PUT" } else { "POST" };
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", app.port)).await.expect("connect");
        let head = format!(
            "{method} {route} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {admin}\r\n\
             Content-Type: {content_type}\r\nContent-Length: 100000\r\nConnection: close\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).await.expect("head");
        stream
            .write_all(b"--XyZ\r\nContent-Disposition: form-data; name=\"bundle\"\r\n\r\n{\"cl")
            .await
            .expect("some");
        stalled.push((route, stream, Instant::now()));
    }
    // Other requests are served meanwhile.
    for _ in 0..5 {
        let started = Instant::now();
        let (status, _) = app.call(Method::GET, "/auth/me", Some(&admin), None).await;
        assert_eq!(status, StatusCode::OK);
        assert!(started.elapsed() < Duration::from_secs(2));
    }
    for (route, mut stream, started) in stalled {
        let mut out = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(15), stream.read_to_end(&mut out)).await;
        assert!(read.is_ok(), "{route}: the stalled request was never ended");
        let elapsed = started.elapsed();
        assert!(elapsed >= Duration::from_secs(2), "{route}: ended after {elapsed:?}");
        let res = parse_response(&out);
        res.assert_problem(route);
        assert_eq!(res.status, 400, "{route}: {}", res.json());
    }
    // The stalled upload left nothing behind.
    let (status, body) = app.call(Method::GET, "/attachments/slow.bin", Some(&admin), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let tmp = app.data_root.path().join("attachments").join("tmp");
    assert_eq!(std::fs::read_dir(tmp).map(|d| d.count()).unwrap_or(0), 0);
}
