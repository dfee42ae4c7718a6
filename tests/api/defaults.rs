//! Insecure defaults are loud (issue 9): while `admin` still has the password `admin`, every start
//! of the binary says so in its log; once it is changed, no start does.

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
    // admin/admin works while the warning is shown.
    let token = server.login("admin", "admin").await["token"].as_str().expect("token").to_string();
    let change = json!({"current_password": "admin", "new_password": "a-much-better-password-42"});
    let (status, _) = server.call(Method::POST, "/users/change-password", Some(&token), Some(change)).await;
    assert_eq!(status, StatusCode::OK);
    server.kill().await;

    let mut server = ChildServer::start(&db_conn, data_root.path(), logs.path().join("4.log"), &unset).await;
    let log = server.log_text();
    assert!(!log.contains(WARNING), "no warning once the password is changed: {log}");
    server.kill().await;
}
