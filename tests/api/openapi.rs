//! The OpenAPI document (docs/api.md §5): served as JSON and YAML, valid OpenAPI 3.0, and describing
//! every route the routers register (read from the `routes()` functions' source).

use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::helpers::TestApp;

/// `(path, methods)` for every `resource("PATH", "ALLOW")` in src/http/*.rs, with regex
/// parameters (`{id:.+}`) written as plain ones (`{id}`).
fn registered_routes() -> Vec<(String, Vec<String>)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/http");
    let mut routes = Vec::new();
    for entry in std::fs::read_dir(dir).expect("src/http") {
        let path = entry.expect("entry").path();
        // The portal's pages are not part of the API the document describes.
        if path.extension().is_none_or(|e| e != "rs") || path.file_stem().is_some_and(|s| s == "portal") {
            continue;
        }
        let source = std::fs::read_to_string(&path).expect("source");
        let mut rest = source.as_str();
        while let Some(at) = rest.find("resource(\"") {
            rest = &rest[at + "resource(\"".len()..];
            let Some(end) = rest.find('"') else { break };
            let route = rest[..end].to_string();
            let after = &rest[end + 1..];
            let Some(allow) = after.strip_prefix(", \"").and_then(|a| a.split_once('"')).map(|(a, _)| a)
            else {
                continue;
            };
            let methods = allow.split(',').map(|m| m.trim().to_lowercase()).filter(|m| m != "head").collect();
            routes.push((plain_params(&route), methods));
        }
    }
    routes
}

fn plain_params(route: &str) -> String {
    let mut out = String::new();
    let mut in_param = false;
    let mut skipping = false;
    for c in route.chars() {
        match c {
            '{' => {
                in_param = true;
                out.push(c);
            }
            ':' if in_param => skipping = true,
            '}' if in_param => {
                in_param = false;
                skipping = false;
                out.push(c);
            }
            _ if skipping => {}
            _ => out.push(c),
        }
    }
    out
}

#[actix_web::test]
async fn document_is_openapi_3_0_and_covers_every_route() {
    let app = TestApp::spawn().await;
    let res = app.send(Method::GET, "/openapi/synkronus.json", Some("stale-token"), None).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.headers()["content-type"].to_str().expect("ascii").starts_with("application/json"));
    let doc: Value = res.json().await.expect("the document is JSON");
    let version = doc["openapi"].as_str().expect("openapi version");
    assert!(version.starts_with("3.0."), "{version}");
    assert!(doc["info"]["title"].is_string() && doc["info"]["version"].is_string());
    let servers: Vec<&str> =
        doc["servers"].as_array().expect("servers").iter().filter_map(|s| s["url"].as_str()).collect();
    assert_eq!(servers, ["/", "/api", "/api/v1"]);

    let paths = doc["paths"].as_object().expect("paths");
    let routes = registered_routes();
    assert!(routes.len() >= 45, "found only {} routes in src/http", routes.len());
    for (route, methods) in &routes {
        for method in methods {
            assert!(
                paths.get(route).and_then(|p| p.get(method)).is_some(),
                "{method} {route} is not documented"
            );
        }
    }
    // And nothing is documented that is not served.
    for (path, item) in paths {
        for method in item.as_object().expect("path item").keys() {
            assert!(
                routes.iter().any(|(r, m)| r == path && m.contains(method)),
                "{method} {path} is documented but not registered"
            );
        }
    }

    // Every operation describes its errors with the one Problem schema.
    let mut error_responses = 0;
    for (path, item) in paths {
        for (method, op) in item.as_object().expect("item") {
            let responses = op["responses"].as_object().expect("responses");
            assert!(responses.keys().any(|s| s.starts_with('2') || s == "404"), "{method} {path}");
            assert!(responses.contains_key("503"), "{method} {path} lacks 503");
            for (status, res) in responses.iter().filter(|(s, _)| s.as_str() >= "400") {
                let schema = &res["content"]["application/problem+json"]["schema"]["$ref"];
                assert_eq!(schema, "#/components/schemas/Problem", "{method} {path} {status}");
                error_responses += 1;
            }
            if op["security"].as_array().is_some_and(|s| !s.is_empty()) {
                assert!(responses.contains_key("401") && responses.contains_key("403"), "{method} {path}");
            }
        }
    }
    assert!(error_responses > 200);
    let problem = &doc["components"]["schemas"]["Problem"];
    for key in ["type", "title", "status", "detail", "code", "error", "message", "request_id"] {
        assert!(problem["required"].as_array().expect("required").iter().any(|k| k == key), "{key}");
    }
    // Dialects as oneOf.
    for name in ["PullRequest", "PullResponse", "PushRequest", "PushResponse"] {
        assert_eq!(doc["components"]["schemas"][name]["oneOf"].as_array().map(Vec::len), Some(3), "{name}");
    }
    // Every reference resolves.
    let text = doc.to_string();
    for piece in text.split("\"#/components/schemas/").skip(1) {
        let name = piece.split('"').next().unwrap_or("");
        assert!(doc["components"]["schemas"].get(name).is_some(), "dangling $ref {name}");
    }
}

#[actix_web::test]
async fn yaml_and_browser_page_are_served_under_every_prefix() {
    let app = TestApp::spawn().await;
    for prefix in ["", "/api", "/api/v1"] {
        let res = app.send(Method::GET, &format!("{prefix}/openapi/synkronus.yaml"), None, None).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()["content-type"], "application/yaml");
        let yaml = res.text().await.expect("yaml");
        assert!(yaml.starts_with("openapi: 3.0.3"), "{}", &yaml[..80.min(yaml.len())]);
        assert!(yaml.contains("/sync/push:"));

        let res = app.send(Method::GET, &format!("{prefix}/openapi/swagger"), None, None).await;
        assert_eq!(res.status(), StatusCode::OK, "no redirect");
        assert!(res.headers()["content-type"].to_str().expect("ascii").starts_with("text/html"));
        let html = res.text().await.expect("html");
        assert!(html.contains("synkronus.json"));
        assert!(
            !html.contains("http://") && !html.contains("https://"),
            "the page loads nothing from elsewhere"
        );
    }
}

/// Found by the schemathesis run: NUL characters, which PostgreSQL cannot store, gave 500s.
#[actix_web::test]
async fn nul_characters_are_bad_requests_not_server_errors() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let spec = serde_json::json!({"form_type": "nul", "version": "1", "schema": {"type": "object",
        "properties": {"a\u{0}b": {"type": "string"}}}, "uischema": {}});
    let (status, body) = app.call(Method::POST, "/formspecs", Some(&admin), Some(spec)).await;
    crate::helpers::assert_error(status, &body, 400, "BAD_REQUEST");
    for path in [
        "/dataexport/parquet?form_type=a%00b",
        "/data/export?format=csv&form_type=x,a%00b",
        "/dataexport/raw-json?form_type=%00",
    ] {
        let (status, body) = app.call(Method::GET, path, Some(&admin), None).await;
        crate::helpers::assert_error(status, &body, 400, "BAD_REQUEST");
    }
    for path in ["/users/a%00b", "/observations/a%00b", "/observations/a%00b/history", "/formspecs/a%00b"] {
        let (status, body) = app.call(Method::GET, path, Some(&admin), None).await;
        assert!(status.is_client_error(), "{path}: {status} {body}");
    }
}
