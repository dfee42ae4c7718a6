use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::helpers::{assert_error, TestApp};

#[actix_web::test]
async fn health_and_descriptor() {
    let app = TestApp::spawn().await;
    let (status, body) = app.call(Method::GET, "/health", None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["database"], "up");
    let (status, body) = app.call(Method::GET, "/", None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["service"], "synkronus");
    for path in ["/api/health", "/api/v1/health", "//health", "/health/"] {
        let (status, _) = app.call(Method::GET, path, None, None).await;
        assert_eq!(status, StatusCode::OK, "{path}");
    }
}

#[actix_web::test]
async fn login_and_me() {
    let app = TestApp::spawn().await;
    let token = app.admin_token().await;
    let (status, body) = app.call(Method::GET, "/auth/me", Some(&token), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["data"]["username"], "admin");
    let (status, body) = app.call(Method::GET, "/auth/me", None, None).await;
    assert_error(status, &body, 401, "MISSING_TOKEN");
    let (status, body) = app
        .call(Method::POST, "/auth/login", None, Some(json!({"username": "admin", "password": "nope"})))
        .await;
    assert_error(status, &body, 401, "INVALID_CREDENTIALS");
}
