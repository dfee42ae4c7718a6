//! Insecure defaults are loud (issue 9): while `admin` still has the password `admin`, every start
//! of the binary says so in its log, once (not at every sign-in), and `GET /auth/me` tells that
//! admin (docs/api.md §6.5, §18.4); once it is changed, no start does and `/auth/me` stops saying so.

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::helpers::{cluster, fresh_database, ChildServer};

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
    // admin/admin works while the warning is shown, and `/auth/me` tells that admin.
    let token = server.login("admin", "admin").await["token"].as_str().expect("token").to_string();
    let default_password = |token: String| {
        let api = server.api.clone();
        async move {
            let (status, me) = api.call(Method::GET, "/auth/me", Some(&token), None).await;
            assert_eq!(status, StatusCode::OK, "{me}");
            me["data"]["default_password"].clone()
        }
    };
    assert_eq!(default_password(token.clone()).await, true);
    // Signing in again and again adds nothing to the log: the warning is once per start.
    for _ in 0..3 {
        server.login("admin", "admin").await;
    }
    assert_eq!(default_password(token.clone()).await, true, "the answer is remembered");
    let log = server.log_text();
    assert_eq!(log.matches("default password").count(), 1, "one warning per start: {log}");
    // Another user is never told about the admin's password.
    let clerk = server.user_token(&token, "clerk", "admin").await;
    assert_eq!(default_password(clerk).await, false);

    let change = json!({"current_password": "admin", "new_password": "a-much-better-password-42"});
    let (status, _) = server.call(Method::POST, "/users/change-password", Some(&token), Some(change)).await;
    assert_eq!(status, StatusCode::OK);
    // The same process, without a restart, knows the password changed.
    let token = server.login("admin", "a-much-better-password-42").await["token"]
        .as_str()
        .expect("token")
        .to_string();
    assert_eq!(default_password(token).await, false);
    server.kill().await;

    let mut server = ChildServer::start(&db_conn, data_root.path(), logs.path().join("4.log"), &unset).await;
    let log = server.log_text();
    assert!(!log.contains(WARNING), "no warning once the password is changed: {log}");
    server.kill().await;
}
