//! Form specifications (docs/api.md §11): the routes, registration from bundle activation, and the
//! record-validation lookup of 8.4.

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::helpers::{assert_error, zip_bytes, TestApp};

fn household(version: &str, field: &str) -> serde_json::Value {
    json!({
        "formType": "household",
        "version": version,
        "schema": {"type": "object", "properties": {field: {"type": "string"}}, "required": [field]},
        "uischema": {"type": "VerticalLayout", "elements": [{"type": "Control", "scope": format!("#/properties/{field}")}]},
    })
}

#[actix_web::test]
async fn formspec_routes() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let reader = app.user_token(&admin, "reader", "read-only").await;

    let (status, body) =
        app.call(Method::POST, "/formspecs", Some(&admin), Some(household("1.0", "head_name"))).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["formType"], "household");
    assert_eq!(body["source"], "api");
    assert_eq!(body["schema"]["required"], json!(["head_name"]));
    assert!(body["created_at"].as_str().is_some_and(|t| t.ends_with('Z')));

    // Identical content (key order differs, aliases used) is 200 with the stored spec.
    let same = json!({
        "form_type": "household", "version": "1.0",
        "ui_schema": {"elements": [{"scope": "#/properties/head_name", "type": "Control"}], "type": "VerticalLayout"},
        "schema": {"required": ["head_name"], "properties": {"head_name": {"type": "string"}}, "type": "object"},
    });
    let (status, again) = app.call(Method::POST, "/formspecs", Some(&admin), Some(same)).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["created_at"], body["created_at"]);
    let (status, body) =
        app.call(Method::POST, "/formspecs", Some(&admin), Some(household("1.0", "other"))).await;
    assert_error(status, &body, 409, "CONFLICT");
    let (status, _) =
        app.call(Method::POST, "/formspecs", Some(&admin), Some(household("2.0", "other"))).await;
    assert_eq!(status, StatusCode::CREATED);

    // 400s for request-level fields, 422s for content.
    let mut bad = household("3.0", "x");
    bad["formType"] = json!("a/b");
    for body in [
        json!({"version": "1", "schema": {}, "uischema": {}}),
        bad,
        json!({"formType": "x", "version": 1, "schema": {}, "uischema": {}}),
        json!({"formType": "x", "version": "1", "uischema": {}}),
        json!([1]),
    ] {
        let (status, answer) = app.call(Method::POST, "/formspecs", Some(&admin), Some(body.clone())).await;
        assert_error(status, &answer, 400, "BAD_REQUEST");
    }
    for (schema, uischema) in
        [(json!([]), json!({})), (json!({"type": 5}), json!({})), (json!({}), json!("ui"))]
    {
        let body = json!({"formType": "x", "version": "1", "schema": schema, "uischema": uischema});
        let (status, answer) = app.call(Method::POST, "/formspecs", Some(&admin), Some(body)).await;
        assert_error(status, &answer, 422, "VALIDATION_FAILED");
    }
    let (status, body) = app.call(Method::POST, "/formspecs", Some(&reader), Some(household("9", "x"))).await;
    assert_error(status, &body, 403, "FORBIDDEN");
    let (status, body) = app.call(Method::GET, "/formspecs", None, None).await;
    assert_error(status, &body, 401, "MISSING_TOKEN");

    let (_, body) = app
        .call(
            Method::POST,
            "/formspecs",
            Some(&admin),
            Some(json!({
        "formType": "alpha", "version": "1", "schema": {"type": "object"}, "uischema": {"type": "Group"}})),
        )
        .await;
    assert_eq!(body["formType"], "alpha");
    let (status, body) = app.call(Method::GET, "/formspecs", Some(&reader), None).await;
    assert_eq!(status, StatusCode::OK);
    let listed: Vec<(String, String)> = body["formspecs"]
        .as_array()
        .expect("list")
        .iter()
        .map(|s| (s["formType"].as_str().unwrap_or("").into(), s["version"].as_str().unwrap_or("").into()))
        .collect();
    let expected = [("alpha", "1"), ("household", "2.0"), ("household", "1.0")];
    assert_eq!(listed, expected.map(|(a, b)| (a.to_string(), b.to_string())));

    let (status, body) = app.call(Method::GET, "/formspecs/household", Some(&reader), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["formType"], "household");
    assert_eq!(body["versions"][0]["version"], "2.0");
    assert_eq!(body["versions"][1]["source"], "api");
    let (status, body) = app.call(Method::GET, "/formspecs/household/1.0", Some(&reader), None).await;
    assert_eq!((status, body["schema"]["required"].clone()), (StatusCode::OK, json!(["head_name"])));
    for missing in ["/formspecs/nothing", "/formspecs/household/7.0"] {
        let (status, body) = app.call(Method::GET, missing, Some(&reader), None).await;
        assert_error(status, &body, 404, "NOT_FOUND");
    }
}

#[actix_web::test]
async fn bundle_activation_registers_forms_with_conflict_warnings() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    // The bundle's household form declares version 1.0, which already exists with other content.
    let (status, _) =
        app.call(Method::POST, "/formspecs", Some(&admin), Some(household("1.0", "head_name"))).await;
    assert_eq!(status, StatusCode::CREATED);
    let household_schema =
        json!({"version": "1.0", "type": "object", "properties": {"size": {"type": "integer"}}});
    let visit_schema =
        json!({"type": "object", "properties": {"date": {"type": "string"}}, "required": ["date"]});
    let manifest = json!({"version": "20250101-000000", "name": "Survey", "entryPoint": "app/index.html"});
    let bundle = |index: &str| {
        zip_bytes(&[
            ("manifest.json", manifest.to_string().as_bytes()),
            ("app/index.html", index.as_bytes()),
            ("forms/household/schema.json", household_schema.to_string().as_bytes()),
            ("forms/household/ui.json", br#"{"type": "VerticalLayout"}"#),
            ("forms/visit/schema.json", visit_schema.to_string().as_bytes()),
            ("forms/visit/ui.json", br#"{"type": "VerticalLayout"}"#),
        ])
    };
    let pushed = app.push_bundle(&admin, bundle("<html>1</html>"), true).await;
    assert_eq!(pushed["version"], "20250101-000000");
    let warnings = pushed["warnings"].as_array().expect("warnings");
    assert_eq!(warnings.len(), 1, "{pushed}");
    assert_eq!(warnings[0]["code"], "FORMSPEC_CONFLICT");
    assert_eq!(warnings[0]["form"], "household");
    assert_eq!(warnings[0]["version"], "1.0");
    assert!(warnings[0]["message"].as_str().is_some_and(|m| !m.is_empty()));

    let (status, body) = app.call(Method::GET, "/formspecs/household/1.0", Some(&admin), None).await;
    assert_eq!((status, body["source"].clone()), (StatusCode::OK, json!("api")), "the existing spec is kept");
    let (status, body) = app.call(Method::GET, "/formspecs/visit/20250101-000000", Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["source"], "bundle:20250101-000000");
    assert_eq!(body["schema"], visit_schema);

    // A switch also registers (identical content: no warning for visit, the conflict again).
    let second = app.push_bundle(&admin, bundle("<html>2</html>"), false).await;
    assert_eq!(second["version"], "20250101-000000-2");
    assert_eq!(second["warnings"], json!([]));
    let (status, body) =
        app.call(Method::POST, "/app-bundle/switch/20250101-000000-2", Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["warnings"].as_array().map(Vec::len), Some(1));
    let (_, body) = app.call(Method::GET, "/formspecs/visit", Some(&admin), None).await;
    let versions: Vec<&str> =
        body["versions"].as_array().expect("versions").iter().filter_map(|v| v["version"].as_str()).collect();
    assert_eq!(versions, ["20250101-000000-2", "20250101-000000"]);

    // Record validation lookup (8.4): exact pair first, then the active bundle's form.
    let db = app.state.pool.get().await.expect("db");
    let exact = synkronus::db::formspecs::spec_for(&db, "household", "1.0").await.expect("lookup");
    assert_eq!(exact.map(|s| s["required"].clone()), Some(json!(["head_name"])));
    let fallback = synkronus::db::formspecs::spec_for(&db, "household", "unknown").await.expect("lookup");
    assert_eq!(fallback, Some(household_schema));
    let none = synkronus::db::formspecs::spec_for(&db, "nothing", "1").await.expect("lookup");
    assert_eq!(none, None);
}
