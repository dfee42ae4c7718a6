//! `Content-Encoding: gzip` (docs/api.md §1.7): pull pages and listings are gzipped for a client
//! that accepts it and decode to the plain body; a client that names no encoding gets the same
//! bytes as ever; downloads are never encoded.

use reqwest::header::HeaderMap;
use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::helpers::{gunzip, small_bundle, TestApp};

/// Pushes `n` records with enough data that a page is well over the compression threshold.
async fn seed(app: &TestApp, token: &str, n: usize) {
    let records: Vec<_> = (0..n)
        .map(|i| {
            json!({"observation_id": format!("obs-{i}"), "form_type": "household",
                   "data": {"members": i, "village": "Kisumu north", "notes": "water point near the school"}})
        })
        .collect();
    let (status, body) = app
        .push(token, json!({"transmission_id": "t-seed", "client_id": "seeder", "records": records}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// Sends `method path` with `accept_encoding` (if any) and returns status, headers and raw bytes.
async fn fetch(
    app: &TestApp,
    token: &str,
    method: Method,
    path: &str,
    body: Option<serde_json::Value>,
    accept_encoding: Option<&str>,
) -> (StatusCode, HeaderMap, Vec<u8>) {
    let mut req = app.client.request(method, app.url(path)).bearer_auth(token);
    if let Some(b) = body {
        req = req.json(&b);
    }
    if let Some(ae) = accept_encoding {
        req = req.header("accept-encoding", ae);
    }
    let res = req.send().await.expect("request");
    let (status, headers) = (res.status(), res.headers().clone());
    (status, headers, res.bytes().await.expect("body").to_vec())
}

fn encoding(headers: &HeaderMap) -> Option<&str> {
    headers.get("content-encoding").map(|v| v.to_str().expect("ascii"))
}

#[actix_web::test]
async fn pull_pages_are_gzipped_when_asked_and_decode_to_the_plain_page() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    seed(&app, &admin, 200).await;
    let pull = json!({"client_id": "dev-1", "since": {"version": 0}});
    let cases = [
        (Method::POST, "/sync/pull?limit=150", Some(pull.clone())),
        (Method::GET, "/sync/pull?client_id=dev-1&limit=150", None),
        (Method::GET, "/api/v1/observations?limit=150", None),
        (Method::GET, "/admin/audit", None),
    ];
    for (method, path, body) in cases {
        let (s0, h0, plain) = fetch(&app, &admin, method.clone(), path, body.clone(), None).await;
        assert_eq!(s0, StatusCode::OK, "{path}");
        assert_eq!(encoding(&h0), None, "{path}: not asked, not encoded");
        assert!(h0.get("vary").is_none_or(|v| !v.to_str().unwrap().contains("accept-encoding")), "{path}");
        let (s1, h1, packed) = fetch(&app, &admin, method, path, body, Some("gzip, deflate, br")).await;
        assert_eq!(s1, StatusCode::OK, "{path}");
        if plain.len() < 1024 {
            // A small body is not worth encoding.
            assert_eq!(encoding(&h1), None, "{path}");
            continue;
        }
        assert_eq!(encoding(&h1), Some("gzip"), "{path}");
        assert!(h1.get_all("vary").iter().any(|v| v.to_str().unwrap().contains("accept-encoding")), "{path}");
        match h1.get("content-length") {
            Some(length) => {
                assert_eq!(length.to_str().unwrap(), packed.len().to_string(), "{path}: a sized body")
            }
            // A pull page larger than one chunk is gzipped as it is streamed (docs/api.md §8.2).
            None => assert!(
                path.contains("/sync/pull") && plain.len() > 128 * 1024,
                "{path}: {} bytes",
                plain.len()
            ),
        }
        // Pages of records shrink several times; a short audit page only somewhat.
        let factor = if plain.len() > 10_000 { 3 } else { 1 };
        assert!(packed.len() * factor < plain.len(), "{path}: {} of {} bytes", packed.len(), plain.len());
        let decoded = gunzip(&packed);
        if path.contains("audit") {
            // The audit log lists the requests of this test as they happen; compare its shape.
            assert!(serde_json::from_slice::<serde_json::Value>(&decoded).expect("json")["items"].is_array());
        } else {
            assert_eq!(decoded, plain, "{path}: the decoded body is the plain one, byte for byte");
        }
    }
}

#[actix_web::test]
async fn no_gzip_unless_named_with_a_nonzero_quality() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    seed(&app, &admin, 100).await;
    let pull = || Some(json!({"client_id": "dev-1", "since": {"version": 0}}));
    let (_, _, reference) = fetch(&app, &admin, Method::POST, "/sync/pull?limit=100", pull(), None).await;
    for ae in ["identity", "gzip;q=0", "*", "br", "identity, gzip;q=0.5", ""] {
        let (status, headers, body) =
            fetch(&app, &admin, Method::POST, "/sync/pull?limit=100", pull(), Some(ae)).await;
        assert_eq!(status, StatusCode::OK, "{ae:?}");
        assert_eq!(encoding(&headers), None, "{ae:?}");
        assert_eq!(body, reference, "{ae:?}");
    }
    for ae in ["GZIP", "deflate, gzip;q=0.8", "x-foo, gzip"] {
        let (_, headers, body) =
            fetch(&app, &admin, Method::POST, "/sync/pull?limit=100", pull(), Some(ae)).await;
        assert_eq!(encoding(&headers), Some("gzip"), "{ae:?}");
        assert_eq!(gunzip(&body), reference, "{ae:?}");
    }
    // Errors stay plain problem+json.
    let (status, headers, _) =
        fetch(&app, &admin, Method::POST, "/sync/pull", Some(json!({"since": 0})), Some("gzip")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(encoding(&headers), None);
}

#[actix_web::test]
async fn downloads_are_never_encoded() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    seed(&app, &admin, 100).await;
    // A highly compressible attachment, and a bundle whose files are text.
    let attachment = "{\"reading\": 1}\n".repeat(4000).into_bytes();
    let (status, body) = app.put_bytes(&admin, "/attachments/readings.json", &attachment, None).await;
    assert!(status.is_success(), "{body}");
    app.push_bundle(&admin, small_bundle("1.0.0", "m1"), true).await;
    let paths = [
        "/attachments/readings.json",
        "/app-bundle/download/forms%2Fhousehold%2Fschema.json",
        "/app-bundle/manifest",
        "/data/export?format=json",
        "/dataexport/parquet",
    ];
    for path in paths {
        let (s0, h0, plain) = fetch(&app, &admin, Method::GET, path, None, None).await;
        let (s1, h1, asked) = fetch(&app, &admin, Method::GET, path, None, Some("gzip")).await;
        assert_eq!((s0, s1), (StatusCode::OK, StatusCode::OK), "{path}");
        assert_eq!(encoding(&h1), None, "{path}");
        assert_eq!(h0.get("etag"), h1.get("etag"), "{path}");
        if !path.contains("export") {
            // Exports name a fresh snapshot and time on each run; the rest are the same bytes.
            assert_eq!(plain, asked, "{path}");
        }
    }
    assert_eq!(
        fetch(&app, &admin, Method::GET, "/attachments/readings.json", None, None).await.2,
        attachment
    );
    // A range stays a range of the stored bytes.
    let res = app
        .client
        .get(app.url("/attachments/readings.json"))
        .bearer_auth(&admin)
        .header("accept-encoding", "gzip")
        .header("range", "bytes=0-14")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::PARTIAL_CONTENT);
    assert!(res.headers().get("content-encoding").is_none());
    assert_eq!(&res.bytes().await.unwrap()[..], &attachment[..15]);
}
