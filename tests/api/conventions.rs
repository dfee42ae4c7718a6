//! docs/api.md §1 and 4: paths and prefixes, methods, bodies, common headers, CORS, version negotiation,
//! the client-version gate and the one error body.

use reqwest::header::{HeaderMap, CONTENT_TYPE};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::{assert_error, TestApp, ADMIN_PASSWORD};

const PREFIXES: [&str; 3] = ["", "/api", "/api/v1"];

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// Sends a raw request and returns status, headers and the body parsed as JSON (or Null).
async fn raw(app: &TestApp, req: reqwest::RequestBuilder) -> (StatusCode, HeaderMap, Value) {
    let _ = app;
    let res = req.send().await.expect("request");
    let status = res.status();
    let headers = res.headers().clone();
    let text = res.text().await.unwrap_or_default();
    (status, headers, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// An error response: the standard body, problem+json, and the headers every response carries.
fn assert_error_response(status: StatusCode, headers: &HeaderMap, body: &Value, expected: u16, code: &str) {
    assert_error(status, body, expected, code);
    assert_eq!(header(headers, "content-type"), Some("application/problem+json"), "{body}");
    assert_eq!(header(headers, "x-request-id"), body["request_id"].as_str());
    assert!(header(headers, "x-api-version-used").is_some());
    assert!(header(headers, "x-synkronus-version").is_some());
}

#[actix_web::test]
async fn every_route_is_served_at_every_prefix_and_with_doubled_slashes() {
    let app = TestApp::spawn().await;
    let token = app.admin_token().await;
    for prefix in PREFIXES {
        for path in
            ["/health", "/ready", "/version", "/versions", "/status", "/auth/me", "/users", "/users/admin"]
        {
            for variant in
                [format!("{prefix}{path}"), format!("{prefix}{path}/"), format!("/{prefix}/{path}")]
            {
                let (status, body) = app.call(Method::GET, &variant, Some(&token), None).await;
                assert_eq!(status, StatusCode::OK, "{variant}: {body}");
            }
        }
        // Doubled and trailing slashes are normalised, POSTs included, and never redirected.
        let login = json!({"username": "admin", "password": ADMIN_PASSWORD});
        for path in [format!("/{prefix}/auth/login"), format!("{prefix}//auth//login/")] {
            let (status, body) = app.call(Method::POST, &path, None, Some(login.clone())).await;
            assert_eq!(status, StatusCode::OK, "{path}: {body}");
            assert!(body["token"].is_string());
        }
    }
    // GET / exists only at the root.
    let (status, body) = app.call(Method::GET, "//", None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["service"], "synkronus");
    for path in ["/api", "/api/", "/api/v1", "/api/v1/"] {
        let (status, body) = app.call(Method::GET, path, None, None).await;
        assert_error(status, &body, 404, "NOT_FOUND");
    }
}

#[actix_web::test]
async fn unknown_routes_answer_404_with_the_error_body_under_every_prefix() {
    let app = TestApp::spawn().await;
    for prefix in PREFIXES {
        for (method, path) in [
            (Method::GET, "/nope"),
            (Method::POST, "/nope/deeper"),
            (Method::DELETE, "/auth"),
            (Method::PUT, "/users/a/b"),
            (Method::GET, "/v2/health"),
        ] {
            let url = app.url(&format!("{prefix}{path}"));
            let (status, headers, body) = raw(&app, app.client.request(method.clone(), url)).await;
            assert_error_response(status, &headers, &body, 404, "NOT_FOUND");
        }
    }
    // Similar-looking prefixes are not prefixes.
    let (status, body) = app.call(Method::GET, "/api/v1x/health", None, None).await;
    assert_error(status, &body, 404, "NOT_FOUND");
    let (status, body) = app.call(Method::GET, "/apiv1/health", None, None).await;
    assert_error(status, &body, 404, "NOT_FOUND");
}

#[actix_web::test]
async fn wrong_method_answers_405_with_allow_and_the_error_body() {
    let app = TestApp::spawn().await;
    let cases: [(Method, &str, &str); 10] = [
        (Method::POST, "/health", "GET, HEAD"),
        (Method::DELETE, "/version", "GET, HEAD"),
        (Method::PUT, "/versions", "GET, HEAD"),
        (Method::GET, "/auth/login", "POST"),
        (Method::PUT, "/auth/refresh", "POST"),
        (Method::GET, "/auth/logout", "POST"),
        (Method::POST, "/auth/me", "GET, HEAD"),
        (Method::DELETE, "/users", "GET, HEAD, POST"),
        (Method::POST, "/users/someone", "GET, HEAD, PUT, DELETE"),
        (Method::GET, "/users/delete/someone", "DELETE"),
    ];
    for prefix in PREFIXES {
        for (method, path, allow) in &cases {
            let url = app.url(&format!("{prefix}{path}"));
            let (status, headers, body) = raw(&app, app.client.request(method.clone(), url)).await;
            assert_error_response(status, &headers, &body, 405, "METHOD_NOT_ALLOWED");
            assert_eq!(header(&headers, "allow"), Some(*allow), "{method} {prefix}{path}");
        }
    }
    // Literal segments win over parameters: GET /users/create is not a lookup of user "create".
    for path in ["/users/create", "/users/reset-password", "/users/change-password"] {
        let (status, headers, body) = raw(&app, app.client.get(app.url(path))).await;
        assert_error_response(status, &headers, &body, 405, "METHOD_NOT_ALLOWED");
        assert_eq!(header(&headers, "allow"), Some("POST"));
    }
    // A HEAD on a POST-only route is a wrong method too, and carries no body.
    let res = app.client.head(app.url("/auth/login")).send().await.expect("head");
    assert_eq!(res.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(header(res.headers(), "allow"), Some("POST"));
    assert!(res.bytes().await.expect("body").is_empty());
}

#[actix_web::test]
async fn head_answers_every_get_route_with_the_same_status_and_no_body() {
    let app = TestApp::spawn().await;
    let token = app.admin_token().await;
    let reader = app.user_token(&token, "reader", "read-only").await;
    let cases: [(&str, Option<&str>, StatusCode); 12] = [
        ("/", None, StatusCode::OK),
        ("/health", None, StatusCode::OK),
        ("/api/v1/ready", None, StatusCode::OK),
        ("/version", None, StatusCode::OK),
        ("/api/versions", None, StatusCode::OK),
        ("/status", Some(&reader), StatusCode::OK),
        ("/auth/me", Some(&reader), StatusCode::OK),
        ("/auth/me", None, StatusCode::UNAUTHORIZED),
        ("/auth/verify", None, StatusCode::OK),
        ("/users", Some(&token), StatusCode::OK),
        ("/users", Some(&reader), StatusCode::FORBIDDEN),
        ("/users/nobody", Some(&token), StatusCode::NOT_FOUND),
    ];
    for (path, tok, expected) in cases {
        let mut req = app.client.get(app.url(path));
        let mut head = app.client.head(app.url(path));
        if let Some(t) = tok {
            req = req.bearer_auth(t);
            head = head.bearer_auth(t);
        }
        let get = req.send().await.expect("get");
        assert_eq!(get.status(), expected, "GET {path}");
        let get_type = header(get.headers(), "content-type").map(str::to_string);
        let res = head.send().await.expect("head");
        assert_eq!(res.status(), expected, "HEAD {path}");
        assert_eq!(header(res.headers(), "content-type").map(str::to_string), get_type, "HEAD {path}");
        assert!(header(res.headers(), "x-request-id").is_some());
        assert!(res.bytes().await.expect("body").is_empty(), "HEAD {path} has a body");
    }
}

#[actix_web::test]
async fn bodies_are_json_whatever_the_content_type_and_bad_ones_get_the_error_body() {
    let app = TestApp::spawn().await;
    let login = json!({"username": "admin", "password": ADMIN_PASSWORD}).to_string();
    for content_type in
        [None, Some("text/plain"), Some("application/x-www-form-urlencoded"), Some("nonsense")]
    {
        let mut req = app.client.post(app.url("/auth/login")).body(login.clone());
        if let Some(ct) = content_type {
            req = req.header(CONTENT_TYPE, ct);
        }
        let (status, _, body) = raw(&app, req).await;
        assert_eq!(status, StatusCode::OK, "{content_type:?}: {body}");
    }
    // Duplicate keys: the last one wins; unknown fields are ignored.
    let dup = format!(r#"{{"username":"nobody","username":"admin","password":"{ADMIN_PASSWORD}","x":1}}"#);
    let (status, _, body) = raw(&app, app.client.post(app.url("/auth/login")).body(dup)).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    for bad in ["{", "{\"username\": }", "not json", "[1,2", "\u{feff}{}", "{\"a\":1}}"] {
        let req = app.client.post(app.url("/auth/login")).header(CONTENT_TYPE, "application/json").body(bad);
        let (status, headers, body) = raw(&app, req).await;
        assert_error_response(status, &headers, &body, 400, "BAD_REQUEST");
    }
    // A non-object, an empty body and a wrongly typed field are 400s too.
    for body in ["[]", "\"admin\"", "42", "null", "", "{\"username\": 1, \"password\": \"x\"}"] {
        let (status, headers, body) = raw(&app, app.client.post(app.url("/auth/login")).body(body)).await;
        assert_error_response(status, &headers, &body, 400, "BAD_REQUEST");
    }
}

#[actix_web::test]
async fn json_bodies_over_the_limit_get_413_and_deep_nesting_400() {
    let app = TestApp::spawn_with(&[("MAX_JSON_BODY_BYTES", "2048")]).await;
    let padding = "x".repeat(3000);
    let big = json!({"username": "admin", "password": ADMIN_PASSWORD, "pad": padding}).to_string();
    let (status, headers, body) = raw(&app, app.client.post(app.url("/auth/login")).body(big.clone())).await;
    assert_error_response(status, &headers, &body, 413, "PAYLOAD_TOO_LARGE");
    // Without a Content-Length (chunked), the limit is enforced while reading.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        big.as_bytes().chunks(500).map(|c| Ok(c.to_vec())).collect();
    let stream = futures_util::stream::iter(chunks);
    let req = app.client.post(app.url("/auth/login")).body(reqwest::Body::wrap_stream(stream));
    let (status, headers, body) = raw(&app, req).await;
    assert_error_response(status, &headers, &body, 413, "PAYLOAD_TOO_LARGE");
    // Just under the limit is fine.
    let ok = json!({"username": "admin", "password": ADMIN_PASSWORD, "pad": "y".repeat(1900)}).to_string();
    assert!(ok.len() < 2048);
    let (status, _, body) = raw(&app, app.client.post(app.url("/auth/login")).body(ok)).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // 128 levels of nesting (the outer object counts) are accepted, 129 are not.
    let nested = |levels: usize| {
        format!(
            r#"{{"username":"admin","password":"{ADMIN_PASSWORD}","deep":{}0{}}}"#,
            "[".repeat(levels - 1),
            "]".repeat(levels - 1)
        )
    };
    let (status, _, body) = raw(&app, app.client.post(app.url("/auth/login")).body(nested(128))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, headers, body) = raw(&app, app.client.post(app.url("/auth/login")).body(nested(129))).await;
    assert_error_response(status, &headers, &body, 400, "BAD_REQUEST");
    assert!(body["message"].as_str().unwrap_or("").contains("128"), "{body}");
}

#[actix_web::test]
async fn path_parameters_are_percent_decoded_exactly_once() {
    let app = TestApp::spawn().await;
    let token = app.admin_token().await;
    // %2F stays inside its segment: this is user "a/b", which cannot exist, not a routing error.
    for prefix in PREFIXES {
        let (status, body) =
            app.call(Method::GET, &format!("{prefix}/users/a%2Fb"), Some(&token), None).await;
        assert_error(status, &body, 404, "NOT_FOUND");
        assert!(body["message"].as_str().unwrap_or("").contains("'a/b'"), "{body}");
    }
    let (status, body) = app.call(Method::DELETE, "/users/delete/a%2Fb", Some(&token), None).await;
    assert_error(status, &body, 404, "NOT_FOUND");
    // A username containing a literal "%2F" is reached through %252F.
    let (status, body) = app
        .call(
            Method::POST,
            "/users",
            Some(&token),
            Some(json!({"username": "pct%2Fname", "password": "password-123", "role": "read-only"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = app.call(Method::GET, "/users/pct%252Fname", Some(&token), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["username"], "pct%2Fname");
    let (status, body) = app.call(Method::GET, "/users/pct%2Fname", Some(&token), None).await;
    assert_error(status, &body, 404, "NOT_FOUND");
    // Non-ASCII names are percent-encoded by clients and decoded once.
    let (status, body) = app
        .call(
            Method::POST,
            "/users/create",
            Some(&token),
            Some(json!({"username": "zoë ø", "password": "password-123", "role": "read-only"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = app.call(Method::GET, "/users/zo%C3%AB%20%C3%B8", Some(&token), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["username"], "zoë ø");
    // Invalid UTF-8 after decoding is a 400, not a 500.
    let (status, body) = app.call(Method::GET, "/users/%FF%FE", Some(&token), None).await;
    assert_error(status, &body, 400, "BAD_REQUEST");
}

#[actix_web::test]
async fn request_ids_are_echoed_when_well_formed_and_generated_otherwise() {
    let app = TestApp::spawn().await;
    let long_ok = "a".repeat(128);
    for good in ["abc-123", "A.b_c:d-9", long_ok.as_str(), "x"] {
        let (status, headers, _) =
            raw(&app, app.client.get(app.url("/health")).header("x-request-id", good)).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(header(&headers, "x-request-id"), Some(good));
        // Error bodies carry the same id.
        let req = app.client.get(app.url("/auth/me")).header("x-request-id", good);
        let (status, headers, body) = raw(&app, req).await;
        assert_error_response(status, &headers, &body, 401, "MISSING_TOKEN");
        assert_eq!(body["request_id"], good);
    }
    let too_long = "a".repeat(129);
    for bad in ["", "has space", "semi;colon", "slash/", "ünï", too_long.as_str()] {
        let req = app.client.get(app.url("/nope")).header("x-request-id", bad);
        let (status, headers, body) = raw(&app, req).await;
        assert_error_response(status, &headers, &body, 404, "NOT_FOUND");
        let id = header(&headers, "x-request-id").expect("generated id");
        assert_ne!(id, bad);
        assert!(!id.is_empty() && id.len() <= 128);
        assert!(id.bytes().all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b)));
    }
    // Without one, every response gets a fresh id.
    let (_, a, _) = raw(&app, app.client.get(app.url("/health"))).await;
    let (_, b, _) = raw(&app, app.client.get(app.url("/health"))).await;
    assert_ne!(header(&a, "x-request-id"), header(&b, "x-request-id"));
}

#[actix_web::test]
async fn api_version_is_negotiated_and_reported_on_every_response() {
    let app = TestApp::spawn().await;
    let token = app.admin_token().await;
    let accepted = [
        (None, "1.1.0"),
        (Some(""), "1.1.0"),
        (Some("   "), "1.1.0"),
        (Some("1"), "1.1.0"),
        (Some("1.1"), "1.1.0"),
        (Some("1.1.4"), "1.1.0"),
        (Some("v1.2.0"), "1.1.0"),
        (Some(" 1.3.0-rc.1+build5 "), "1.1.0"),
        (Some("1.0"), "1.0.0"),
        (Some("1.0.7"), "1.0.0"),
        (Some("v1.0.0-beta"), "1.0.0"),
    ];
    for (value, used) in accepted {
        for (method, path, tok, expected) in [
            (Method::GET, "/health", None, 200),
            (Method::GET, "/api/v1/auth/me", Some(&token), 200),
            (Method::GET, "/auth/me", None, 401),
            (Method::GET, "/nope", None, 404),
            (Method::POST, "/health", None, 405),
        ] {
            let mut req = app.client.request(method.clone(), app.url(path));
            if let Some(v) = value {
                req = req.header("x-api-version", v);
            }
            if let Some(t) = tok {
                req = req.bearer_auth(t);
            }
            let (status, headers, _) = raw(&app, req).await;
            assert_eq!(status.as_u16(), expected, "{value:?} {method} {path}");
            assert_eq!(header(&headers, "x-api-version-used"), Some(used), "{value:?} {path}");
        }
    }
    for bad in ["2.0.0", "0.9", "abc", "1.x", "2", "v", "1.0.0.0", "1..1", "-1"] {
        for (method, path) in
            [(Method::GET, "/health"), (Method::POST, "/auth/login"), (Method::GET, "/nope")]
        {
            let req = app.client.request(method.clone(), app.url(path)).header("x-api-version", bad);
            let (status, headers, body) = raw(&app, req).await;
            assert_error_response(status, &headers, &body, 406, "UNSUPPORTED_API_VERSION");
            assert_eq!(header(&headers, "x-api-version-used"), Some("1.1.0"), "{bad}");
        }
    }
}

#[actix_web::test]
async fn client_version_gate_answers_426_before_authentication() {
    let app = TestApp::spawn().await;
    let token = app.admin_token().await;
    let server_version = env!("CARGO_PKG_VERSION");
    for good in ["1.0.0", "1", "v1.9.3", "1.2.0-beta.1", " 1.4 "] {
        let req = app.client.get(app.url("/auth/me")).bearer_auth(&token).header("x-ode-version", good);
        let (status, headers, body) = raw(&app, req).await;
        assert_eq!(status, StatusCode::OK, "{good}: {body}");
        assert_eq!(header(&headers, "x-synkronus-version"), Some(server_version));
    }
    for bad in ["2.0.0", "0.9.1", "v3", "garbage", "1.x", "latest"] {
        for (method, path, tok) in [
            (Method::GET, "/auth/me", None),
            (Method::GET, "/api/users", Some(token.as_str())),
            (Method::GET, "/health", None),
            (Method::POST, "/api/v1/auth/login", None),
        ] {
            let mut req = app.client.request(method, app.url(path)).header("x-ode-version", bad);
            if let Some(t) = tok {
                req = req.bearer_auth(t);
            }
            let (status, headers, body) = raw(&app, req).await;
            assert_error_response(status, &headers, &body, 426, "CLIENT_VERSION_UNSUPPORTED");
            assert_eq!(body["synkronus_version"], server_version);
            assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()));
        }
    }
    // x-synkronus-version is on every response, whatever its status.
    for (method, path) in [(Method::GET, "/"), (Method::GET, "/nope"), (Method::PUT, "/health")] {
        let (_, headers, _) = raw(&app, app.client.request(method, app.url(path))).await;
        let v = header(&headers, "x-synkronus-version").expect("x-synkronus-version");
        assert!(v.starts_with("1."), "{v}");
    }
}

fn list(headers: &HeaderMap, name: &str) -> Vec<String> {
    header(headers, name)
        .unwrap_or("")
        .split(',')
        .map(|s| s.trim().to_ascii_lowercase())
        .filter(|s| !s.is_empty())
        .collect()
}

fn preflight(
    app: &TestApp,
    path: &str,
    origin: &str,
    method: &str,
    headers: &str,
) -> reqwest::RequestBuilder {
    let mut req = app
        .client
        .request(Method::OPTIONS, app.url(path))
        .header("origin", origin)
        .header("access-control-request-method", method);
    if !headers.is_empty() {
        req = req.header("access-control-request-headers", headers);
    }
    req
}

#[actix_web::test]
async fn cors_with_any_origin() {
    let app = TestApp::spawn().await;
    // A preflight is answered before authentication, at every prefix.
    for prefix in PREFIXES {
        let req =
            preflight(&app, &format!("{prefix}/auth/me"), "https://portal.example", "GET", "authorization");
        let (status, headers, _) = raw(&app, req).await;
        assert!(status.is_success(), "{status}");
        assert_eq!(header(&headers, "access-control-allow-origin"), Some("*"));
        assert!(header(&headers, "access-control-allow-credentials").is_none());
        let methods = list(&headers, "access-control-allow-methods");
        for m in ["get", "head", "post", "put", "delete", "options"] {
            assert!(methods.contains(&m.to_string()), "{methods:?}");
        }
        let allowed = list(&headers, "access-control-allow-headers");
        for h in [
            "authorization",
            "content-type",
            "if-none-match",
            "if-range",
            "range",
            "x-api-version",
            "x-request-id",
        ] {
            assert!(allowed.contains(&h.to_string()), "{allowed:?} lacks {h}");
        }
    }
    let req = preflight(&app, "/users", "https://portal.example", "POST", "content-type,x-api-version");
    let (status, _, _) = raw(&app, req).await;
    assert!(status.is_success(), "{status}");
    // An actual request gets the origin and exposed headers.
    let req = app.client.get(app.url("/health")).header("origin", "https://portal.example");
    let (status, headers, _) = raw(&app, req).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(header(&headers, "access-control-allow-origin"), Some("*"));
    let exposed = list(&headers, "access-control-expose-headers");
    for h in [
        "etag",
        "content-disposition",
        "content-range",
        "retry-after",
        "x-api-version-used",
        "x-request-id",
        "x-bundle-version",
        "x-is-preview",
        "x-export-change-id",
        "x-idempotent-replay",
    ] {
        assert!(exposed.contains(&h.to_string()), "{exposed:?} lacks {h}");
    }
    // Errors carry CORS headers too, so browsers can read them.
    let req = app.client.get(app.url("/auth/me")).header("origin", "https://portal.example");
    let (status, headers, body) = raw(&app, req).await;
    assert_error_response(status, &headers, &body, 401, "MISSING_TOKEN");
    assert_eq!(header(&headers, "access-control-allow-origin"), Some("*"));
    // A plain OPTIONS (not a preflight) is a wrong method.
    let (status, headers, body) = raw(&app, app.client.request(Method::OPTIONS, app.url("/health"))).await;
    assert_error_response(status, &headers, &body, 405, "METHOD_NOT_ALLOWED");
}

#[actix_web::test]
async fn cors_with_listed_origins() {
    let app = TestApp::spawn_with(&[("CORS_ALLOWED_ORIGINS", "https://a.example, https://b.example/")]).await;
    for origin in ["https://a.example", "https://b.example"] {
        let (status, headers, _) =
            raw(&app, preflight(&app, "/auth/login", origin, "POST", "content-type")).await;
        assert!(status.is_success(), "{origin}: {status}");
        assert_eq!(header(&headers, "access-control-allow-origin"), Some(origin));
        let req = app.client.get(app.url("/health")).header("origin", origin);
        let (status, headers, _) = raw(&app, req).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(header(&headers, "access-control-allow-origin"), Some(origin));
        assert!(list(&headers, "vary").contains(&"origin".to_string()));
    }
    // Another origin's actual request is still served (the browser enforces CORS) without the
    // CORS headers; its preflight is refused with the standard error body.
    let req = app.client.get(app.url("/health")).header("origin", "https://evil.example");
    let (status, headers, body) = raw(&app, req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(header(&headers, "access-control-allow-origin").is_none());
    let req = preflight(&app, "/auth/login", "https://evil.example", "POST", "content-type");
    let (status, headers, body) = raw(&app, req).await;
    assert!(header(&headers, "access-control-allow-origin").is_none());
    assert_error_response(status, &headers, &body, 400, "BAD_REQUEST");
    // A preflight asking for a method or header outside the list: the same.
    let req = preflight(&app, "/auth/login", "https://a.example", "PATCH", "");
    let (status, headers, body) = raw(&app, req).await;
    assert_error_response(status, &headers, &body, 400, "BAD_REQUEST");
    let req = preflight(&app, "/auth/login", "https://a.example", "POST", "x-unlisted");
    let (status, headers, body) = raw(&app, req).await;
    assert_error_response(status, &headers, &body, 400, "BAD_REQUEST");
}

#[actix_web::test]
async fn public_endpoints_ignore_the_authorization_header() {
    let app = TestApp::spawn().await;
    for auth in ["Bearer garbage", "Bearer a.b.c", "Basic Zm9vOmJhcg=="] {
        for path in ["/", "/health", "/ready", "/version", "/versions", "/api/versions", "/api/version"] {
            let req = app.client.get(app.url(path)).header("authorization", auth);
            let (status, _, body) = raw(&app, req).await;
            assert_eq!(status, StatusCode::OK, "{path} with {auth}: {body}");
        }
        let login = json!({"username": "admin", "password": ADMIN_PASSWORD});
        let req = app.client.post(app.url("/auth/login")).header("authorization", auth).json(&login);
        let (status, _, body) = raw(&app, req).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
}

/// The README's layout section names every file and folder under `src/` and nothing that is gone,
/// so a newcomer's map of the code stays true as modules come and go. Folder lines (ending in `/`)
/// start in the first column; each file line under one is indented and names the file first.
#[test]
fn readme_layout_lists_every_source_file() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let section = readme.split("## How the code is laid out").nth(1).expect("the layout section");
    let block = section.split("```").nth(1).expect("the layout section's code block");
    let mut listed_dirs = std::collections::BTreeSet::new();
    let mut listed_files = std::collections::BTreeSet::new();
    let mut folder = String::new();
    for line in block.lines() {
        let Some(name) = line.split_whitespace().next() else { continue };
        if !line.starts_with(' ') {
            folder = name.to_string();
            listed_dirs.insert(name.trim_end_matches('/').to_string());
        } else if name.ends_with(".rs") {
            assert!(folder.ends_with('/'), "README layout: {name} is not under a folder line");
            listed_files.insert(format!("{folder}{name}"));
        }
    }

    let mut files = std::collections::BTreeSet::new();
    let mut dirs = std::collections::BTreeSet::new();
    let mut pending = vec![root.join("src")];
    while let Some(dir) = pending.pop() {
        let rel = dir.strip_prefix(root).expect("inside the repository").to_string_lossy().replace('\\', "/");
        dirs.insert(rel.clone());
        for entry in std::fs::read_dir(&dir).expect("read src") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let name = path.file_name().expect("file name").to_string_lossy().into_owned();
                files.insert(format!("{rel}/{name}"));
            }
        }
    }

    let missing: Vec<_> = files.difference(&listed_files).collect();
    assert!(missing.is_empty(), "add these to the README's layout section: {missing:?}");
    let gone: Vec<_> = listed_files.difference(&files).collect();
    assert!(gone.is_empty(), "the README's layout section lists files that do not exist: {gone:?}");
    let missing_dirs: Vec<_> = dirs.difference(&listed_dirs).collect();
    assert!(missing_dirs.is_empty(), "add these folders to the README's layout section: {missing_dirs:?}");
    for top in ["migrations", "tests/api", "load-tests", "portal", "portal-tests", "scripts", "docs"] {
        assert!(listed_dirs.contains(top), "the README's layout section should describe {top}/");
        assert!(root.join(top).is_dir(), "the README's layout section describes {top}/, which is gone");
    }
}

/// Every benchmark pass cited by title (`docs/benchmarks-history.md, "Title"`, in code comments
/// and documents) and every history section named in BENCHMARKS.md's current table is a heading
/// of the file cited, so a moved or renamed pass cannot leave a citation pointing at nothing.
#[test]
fn cited_benchmark_sections_exist() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |path: &std::path::Path| std::fs::read_to_string(path).unwrap_or_default();
    let headings = |file: &str| -> Vec<String> {
        read(&root.join(file))
            .lines()
            .filter(|l| l.starts_with('#'))
            .map(|l| l.trim_start_matches('#').trim().to_string())
            .collect()
    };
    let cited_files = ["docs/benchmarks-history.md", "BENCHMARKS.md"];
    let known: std::collections::HashMap<&str, Vec<String>> =
        cited_files.iter().map(|f| (*f, headings(f))).collect();
    assert!(known["docs/benchmarks-history.md"].len() > 20, "the history's sections are gone");

    let mut sources = vec![root.join("README.md"), root.join("CONTRIBUTING.md"), root.join("BENCHMARKS.md")];
    let mut pending =
        vec![root.join("src"), root.join("docs"), root.join("load-tests"), root.join("scripts")];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("read a source folder").flatten() {
            let path = entry.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if path.is_dir() && !matches!(name, "target" | "node_modules" | "screenshots") {
                pending.push(path);
            } else if [".rs", ".md", ".sh", ".py"].iter().any(|ext| name.ends_with(ext)) {
                sources.push(path);
            }
        }
    }

    let mut checked = 0;
    let mut missing = Vec::new();
    for path in sources {
        // Comment markers and line breaks out, so a citation wrapped over two lines still reads.
        let text = read(&path)
            .lines()
            .map(|l| l.trim().trim_start_matches(['/', '!', '#', '*']).trim())
            .collect::<Vec<_>>()
            .join(" ");
        for file in cited_files {
            for (at, _) in text.match_indices(file) {
                let after = &text[at + file.len()..];
                // A Markdown link's target, `[BENCHMARKS.md](BENCHMARKS.md)`, comes first.
                let after = match after.strip_prefix("](") {
                    Some(rest) => rest.split_once(')').map_or("", |(_, r)| r),
                    None => after,
                };
                let before = &text[..at];
                let title = if let Some(quoted) = after.strip_prefix(", \"") {
                    quoted.split('"').next()
                } else if let Some(open) = before.strip_suffix("\" in ") {
                    open.rsplit('"').next()
                } else {
                    None
                };
                // CONTRIBUTING's example of the form.
                let Some(title) = title.filter(|t| *t != "Title") else { continue };
                checked += 1;
                if !known[file].iter().any(|h| h.starts_with(title)) {
                    missing.push(format!("{}: {file}, \"{title}\"", path.display()));
                }
            }
        }
    }
    // The current table names the history section of each row in its last cell.
    let table = read(&root.join("BENCHMARKS.md"));
    for row in table.lines().filter(|l| l.starts_with('|') && l.trim_end().ends_with("\" |")) {
        let cell = row.trim_end().trim_end_matches('|').rsplit('|').next().unwrap_or("").trim();
        let title = cell.trim_matches('"');
        checked += 1;
        if !known["docs/benchmarks-history.md"].iter().any(|h| h.starts_with(title)) {
            missing.push(format!("BENCHMARKS.md's table: \"{title}\""));
        }
    }
    assert!(checked >= 20, "only {checked} citations found: has the citation form changed?");
    assert!(missing.is_empty(), "cited benchmark sections that are not headings: {missing:#?}");
}

/// Handler modules (the files of `src/http/` that register routes) never import one another:
/// what two of them share lives in a shared module (`common`, `extract`, `wire`, …), so a handler
/// can change without reaching into its neighbours. The OpenAPI document is the one exception: it
/// lists every handler's route annotations.
#[test]
fn handler_modules_do_not_import_each_other() {
    let http = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/http");
    let mut handlers = Vec::new();
    for entry in std::fs::read_dir(&http).expect("src/http").flatten() {
        let path = entry.path();
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if text.contains("pub fn routes(") {
            let name = path.file_stem().and_then(|s| s.to_str()).expect("file name").to_string();
            handlers.push((name, text));
        }
    }
    assert!(handlers.len() >= 10, "handler modules not found: {}", handlers.len());
    let names: Vec<String> = handlers.iter().map(|(n, _)| n.clone()).collect();
    let mut found = Vec::new();
    for (name, text) in handlers.iter().filter(|(n, _)| n != "openapi") {
        for other in names.iter().filter(|o| *o != name) {
            for form in [
                format!("crate::http::{other}::"),
                format!("crate::http::{other};"),
                format!("super::{other}::"),
            ] {
                if text.contains(&form) {
                    found.push(format!("src/http/{name}.rs uses {form}"));
                }
            }
            let braced = text.split("crate::http::{").skip(1).filter_map(|rest| rest.split('}').next());
            if braced
                .flat_map(|list| list.split(','))
                .any(|item| item.trim().split("::").next() == Some(other))
            {
                found.push(format!("src/http/{name}.rs imports {other}"));
            }
        }
    }
    assert!(
        found.is_empty(),
        "handler modules importing each other (move the shared part to common.rs): {found:#?}"
    );
}

/// The layers a `synkronus-core` crate would hold (docs/architecture.md, "Crate boundary") use
/// only what the layer table there allows: `domain` nothing of the server, `db` the domain and
/// the metrics, `storage` its settings and `db`, and `monitoring` (a leaf the database calls
/// report to) only the domain. None of them reaches `http`, `actors`, `startup` or any layer
/// above, so they stay outside the application's import cycle and could become a crate of their
/// own without a change; this test is what the compiler would check then.
#[test]
fn core_layers_import_nothing_above_them() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let layers: [(&str, &[&str]); 4] = [
        ("domain", &["testing"]),
        ("db", &["domain", "monitoring"]),
        ("storage", &["config", "db"]),
        ("monitoring", &["domain"]),
    ];
    let mut found = Vec::new();
    let mut checked = 0;
    for (layer, may_use) in layers {
        let mut files = vec![src.join(format!("{layer}.rs"))];
        let mut pending = vec![src.join(layer)];
        while let Some(dir) = pending.pop() {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    pending.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    files.push(path);
                }
            }
        }
        for file in files.into_iter().filter(|f| f.is_file()) {
            checked += 1;
            let text = std::fs::read_to_string(&file).expect("source");
            let code: Vec<&str> = text.lines().filter(|l| !l.trim_start().starts_with("//")).collect();
            let code = code.join("\n");
            // `crate::x::…`, `crate::x;` and each item of `crate::{x::…, y}`.
            let mut used: Vec<String> = Vec::new();
            for (at, _) in code.match_indices("crate::") {
                let rest = &code[at + "crate::".len()..];
                match rest.strip_prefix('{') {
                    Some(list) => used.extend(
                        list.split('}')
                            .next()
                            .unwrap_or("")
                            .split(',')
                            .map(|item| item.trim().split("::").next().unwrap_or("").to_string()),
                    ),
                    None => used.push(
                        rest.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                            .next()
                            .unwrap_or("")
                            .to_string(),
                    ),
                }
            }
            for module in
                used.iter().filter(|m| !m.is_empty() && *m != layer && !may_use.contains(&m.as_str()))
            {
                let shown = file.strip_prefix(&src).unwrap_or(&file).display().to_string();
                found.push(format!("src/{shown} uses crate::{module}"));
            }
        }
    }
    assert!(checked >= 80, "only {checked} files of the core layers found");
    found.sort();
    found.dedup();
    assert!(
        found.is_empty(),
        "core layers reaching above themselves (docs/architecture.md, \"Layers and errors\"): {found:#?}"
    );
}
