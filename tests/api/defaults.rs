//! Insecure defaults are loud (issue 9): while `admin` still has the password `admin`, every start
//! of the binary says so in its log, once (not at every sign-in), and `GET /auth/me` tells that
//! admin (docs/api.md §6.5, §18.4); once it is changed, no start does and `/auth/me` stops saying so.

use reqwest::StatusCode;
use serde_json::json;

use crate::crash::ChildServer;
use crate::helpers::{cluster, fresh_database};

const WARNING: &str = "still has the default password";

#[actix_web::test]
async fn the_default_admin_password_is_reported_at_every_start_until_changed() {
    let db = fresh_database().await;
    let db_conn = cluster().connection_string(&db);
    let data_root = tempfile::tempdir().expect("data root");
    let logs = tempfile::tempdir().expect("logs");
    // No ADMIN_PASSWORD: the initial admin gets the default one.
    let unset = [("ADMIN_PASSWORD", "")];

    for start in 1..=2 {
        let mut server =
            ChildServer::start(&db_conn, data_root.path(), logs.path().join(format!("{start}.log")), &unset)
                .await;
        let log = server.log_text();
        assert!(log.contains(WARNING), "start {start} does not warn: {log}");
        assert_eq!(log.matches(WARNING).count(), 1, "{log}");
        server.kill().await;
    }

    let mut server = ChildServer::start(&db_conn, data_root.path(), logs.path().join("3.log"), &unset).await;
    let http = reqwest::Client::new();
    let res = http
        .post(format!("{}/auth/login", server.base))
        .json(&json!({"username": "admin", "password": "admin"}))
        .send()
        .await
        .expect("login");
    assert_eq!(res.status(), StatusCode::OK, "admin/admin works while the warning is shown");
    let token =
        res.json::<serde_json::Value>().await.expect("body")["token"].as_str().expect("token").to_string();
    let me = |token: String| {
        let http = http.clone();
        let url = format!("{}/auth/me", server.base);
        async move {
            let res = http.get(url).bearer_auth(token).send().await.expect("me");
            assert_eq!(res.status(), StatusCode::OK);
            res.json::<serde_json::Value>().await.expect("me body")
        }
    };
    assert_eq!(me(token.clone()).await["data"]["default_password"], true);
    // Signing in again and again adds nothing to the log: the warning is once per start.
    for _ in 0..3 {
        let res = http
            .post(format!("{}/auth/login", server.base))
            .json(&json!({"username": "admin", "password": "admin"}))
            .send()
            .await
            .expect("login");
        assert_eq!(res.status(), StatusCode::OK);
    }
    assert_eq!(me(token.clone()).await["data"]["default_password"], true, "the answer is remembered");
    let log = server.log_text();
    assert_eq!(log.matches("default password").count(), 1, "one warning per start: {log}");
    // Another user is never told about the admin's password.
    let res = http
        .post(format!("{}/users", server.base))
        .bearer_auth(&token)
        .json(&json!({"username": "clerk", "password": "clerk-password-1", "role": "admin"}))
        .send()
        .await
        .expect("create");
    assert_eq!(res.status(), StatusCode::CREATED);
    let res = http
        .post(format!("{}/auth/login", server.base))
        .json(&json!({"username": "clerk", "password": "clerk-password-1"}))
        .send()
        .await
        .expect("login clerk");
    let clerk =
        res.json::<serde_json::Value>().await.expect("body")["token"].as_str().expect("token").to_string();
    assert_eq!(me(clerk).await["data"]["default_password"], false);
    let res = http
        .post(format!("{}/users/change-password", server.base))
        .bearer_auth(&token)
        .json(&json!({"current_password": "admin", "new_password": "a-much-better-password-42"}))
        .send()
        .await
        .expect("change password");
    assert_eq!(res.status(), StatusCode::OK);
    // The same process, without a restart, knows the password changed.
    let res = http
        .post(format!("{}/auth/login", server.base))
        .json(&json!({"username": "admin", "password": "a-much-better-password-42"}))
        .send()
        .await
        .expect("login");
    let token =
        res.json::<serde_json::Value>().await.expect("body")["token"].as_str().expect("token").to_string();
    assert_eq!(me(token).await["data"]["default_password"], false);
    server.kill().await;

    let mut server = ChildServer::start(&db_conn, data_root.path(), logs.path().join("4.log"), &unset).await;
    let log = server.log_text();
    assert!(!log.contains(WARNING), "no warning once the password is changed: {log}");
    server.kill().await;
}
