//! Users (docs/api.md §7): every route and alias, field rules, role enforcement, the last admin and the
//! initial admin.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::{assert_error, TestApp, ADMIN_PASSWORD};

async fn create(app: &TestApp, token: &str, path: &str, body: Value) -> (StatusCode, Value) {
    app.call(Method::POST, path, Some(token), Some(body)).await
}

fn assert_user_object(u: &Value, username: &str, role: &str) {
    let keys: Vec<&str> = u.as_object().expect("user object").keys().map(String::as_str).collect();
    let mut sorted = keys.clone();
    sorted.sort_unstable();
    // `GET /users` items also carry `presence` (docs/api.md §17.4).
    sorted.retain(|k| *k != "presence");
    assert_eq!(
        sorted,
        ["attributes", "createdAt", "created_at", "email", "id", "last_login", "role", "roles", "username"]
    );
    uuid::Uuid::parse_str(u["id"].as_str().expect("id")).expect("UUID id");
    assert_eq!(u["username"], username);
    assert_eq!(u["role"], role);
    assert_eq!(u["roles"], json!([role]));
    assert_eq!(u["created_at"], u["createdAt"]);
    chrono::DateTime::parse_from_rfc3339(u["created_at"].as_str().expect("created_at")).expect("RFC 3339");
    assert!(u["created_at"].as_str().is_some_and(|t| t.ends_with('Z')));
}

#[actix_web::test]
async fn create_through_both_paths_with_role_aliases_and_field_rules() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let cases = [
        ("/users", "u-readonly", "read-only", "read-only"),
        ("/users/create", "u-readwrite", "read-write", "read-write"),
        ("/api/users", "u-admin", "admin", "admin"),
        ("/api/v1/users/create", "u-r1-user", "user", "read-write"),
        ("/users", "u-upper", "Read-Only", "read-only"),
        ("/users", "u-upper-admin", "ADMIN", "admin"),
    ];
    for (path, username, role_in, role_out) in cases {
        let (status, body) = create(
            &app,
            &admin,
            path,
            json!({"username": username, "password": "password-123", "role": role_in}),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{path} {username}: {body}");
        assert_user_object(&body, username, role_out);
        assert_eq!(body["email"], Value::Null);
        assert_eq!(body["last_login"], Value::Null);
    }
    // Email, and the password limits: 8 characters is enough; 72 bytes is the most.
    let (status, body) = create(
        &app,
        &admin,
        "/users",
        json!({"username": "with-mail", "password": "12345678", "role": "read-only", "email": "a@b.example"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["email"], "a@b.example");
    let (status, body) = create(
        &app,
        &admin,
        "/users",
        json!({"username": "long-pass", "password": "p".repeat(72), "role": "read-only", "email": null}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, _) = app
        .call(
            Method::POST,
            "/auth/login",
            None,
            Some(json!({"username": "long-pass", "password": "p".repeat(72)})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);

    for password in ["1234567".to_string(), "p".repeat(73), "é".repeat(37), "short".into()] {
        let (status, body) = create(
            &app,
            &admin,
            "/users/create",
            json!({"username": "weak", "password": password, "role": "read-only"}),
        )
        .await;
        assert_error(status, &body, 400, "WEAK_PASSWORD");
    }
    // Missing, wrongly typed or invalid fields, and unknown roles.
    let bad = [
        (json!({"password": "password-123", "role": "read-only"}), "/username"),
        (json!({"username": "x", "role": "read-only"}), "/password"),
        (json!({"username": "x", "password": "password-123"}), "/role"),
        (json!({"username": "x", "password": "password-123", "role": "root"}), "/role"),
        (json!({"username": "x", "password": "password-123", "role": 3}), "/role"),
        (json!({"username": 7, "password": "password-123", "role": "admin"}), "/username"),
        (json!({"username": "a/b", "password": "password-123", "role": "admin"}), "/username"),
        (json!({"username": " lead", "password": "password-123", "role": "admin"}), "/username"),
        (json!({"username": "trail ", "password": "password-123", "role": "admin"}), "/username"),
        (json!({"username": "tab\tname", "password": "password-123", "role": "admin"}), "/username"),
        (json!({"username": "x".repeat(256), "password": "password-123", "role": "admin"}), "/username"),
        (json!({"username": "x", "password": "password-123", "role": "admin", "email": "no-at"}), "/email"),
        (json!({"username": "x", "password": "password-123", "role": "admin", "email": 5}), "/email"),
        (
            json!({"username": "x", "password": "password-123", "role": "admin",
                   "email": format!("{}@x", "a".repeat(254))}),
            "/email",
        ),
    ];
    for (body, path) in bad {
        let (status, res) = create(&app, &admin, "/users", body.clone()).await;
        assert_error(status, &res, 400, "BAD_REQUEST");
        assert_eq!(res["errors"][0]["path"], path, "{body}: {res}");
    }
    let (status, body) = create(&app, &admin, "/users", json!([])).await;
    assert_error(status, &body, 400, "BAD_REQUEST");
    // 255 characters is allowed; usernames are case-sensitive and unique.
    let (status, body) = create(
        &app,
        &admin,
        "/users",
        json!({"username": "y".repeat(255), "password": "password-123", "role": "read-only"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    for path in ["/users", "/users/create"] {
        let (status, body) = create(
            &app,
            &admin,
            path,
            json!({"username": "u-readonly", "password": "password-123", "role": "read-only"}),
        )
        .await;
        assert_error(status, &body, 409, "CONFLICT");
    }
    let (status, body) = create(
        &app,
        &admin,
        "/users",
        json!({"username": "U-READONLY", "password": "password-123", "role": "read-only"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

#[actix_web::test]
async fn list_and_get() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let reader = app.user_token(&admin, "zed", "read-only").await;
    let writer = app.user_token(&admin, "Bob", "read-write").await;
    app.user_token(&admin, "alice", "admin").await;

    for prefix in ["", "/api", "/api/v1"] {
        let (status, body) = app.call(Method::GET, &format!("{prefix}/users"), Some(&admin), None).await;
        assert_eq!(status, StatusCode::OK);
        let users = body.as_array().expect("a bare array");
        let names: Vec<&str> = users.iter().map(|u| u["username"].as_str().expect("username")).collect();
        // Ordered by username (byte order).
        assert_eq!(names, ["Bob", "admin", "alice", "zed"]);
        for u in users {
            assert_user_object(
                u,
                u["username"].as_str().expect("username"),
                u["role"].as_str().expect("role"),
            );
        }
        // last_login is set for users who logged in.
        assert!(users.iter().all(|u| u["last_login"].is_string()));
    }

    let (status, body) = app.call(Method::GET, "/users/zed", Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_user_object(&body, "zed", "read-only");
    // A user may read themself, and nobody else.
    let (status, body) = app.call(Method::GET, "/api/v1/users/zed", Some(&reader), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["username"], "zed");
    let (status, body) = app.call(Method::GET, "/users/Bob", Some(&reader), None).await;
    assert_error(status, &body, 403, "FORBIDDEN");
    let (status, body) = app.call(Method::GET, "/users/bob", Some(&writer), None).await;
    assert_error(status, &body, 403, "FORBIDDEN");
    let (status, body) = app.call(Method::GET, "/users/nobody", Some(&admin), None).await;
    assert_error(status, &body, 404, "NOT_FOUND");
    // A non-admin asking for an unknown user learns nothing: 403.
    let (status, body) = app.call(Method::GET, "/users/nobody", Some(&writer), None).await;
    assert_error(status, &body, 403, "FORBIDDEN");
}

#[actix_web::test]
async fn every_admin_route_enforces_authentication_then_role() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let reader = app.user_token(&admin, "reader", "read-only").await;
    let writer = app.user_token(&admin, "writer", "read-write").await;
    let reader_id = {
        let (_, body) = app.call(Method::GET, "/users/reader", Some(&admin), None).await;
        body["id"].as_str().expect("id").to_string()
    };
    let routes: Vec<(Method, String, Option<Value>)> = vec![
        (Method::GET, "/users".into(), None),
        (
            Method::POST,
            "/users".into(),
            Some(json!({"username": "n1", "password": "password-123", "role": "admin"})),
        ),
        (
            Method::POST,
            "/users/create".into(),
            Some(json!({"username": "n2", "password": "password-123", "role": "admin"})),
        ),
        (Method::GET, "/users/admin".into(), None),
        (Method::PUT, "/users/reader".into(), Some(json!({"role": "admin"}))),
        (Method::DELETE, "/users/reader".into(), None),
        (Method::DELETE, "/users/delete/reader".into(), None),
        (Method::DELETE, format!("/users/{reader_id}"), None),
        (
            Method::POST,
            "/users/reset-password".into(),
            Some(json!({"username": "reader", "new_password": "password-999"})),
        ),
    ];
    for prefix in ["", "/api", "/api/v1"] {
        for (method, path, body) in &routes {
            let path = format!("{prefix}{path}");
            for token in [&reader, &writer] {
                let (status, res) = app.call(method.clone(), &path, Some(token), body.clone()).await;
                assert_error(status, &res, 403, "FORBIDDEN");
            }
            let (status, res) = app.call(method.clone(), &path, None, body.clone()).await;
            assert_error(status, &res, 401, "MISSING_TOKEN");
            let (status, res) = app.call(method.clone(), &path, Some("garbage"), body.clone()).await;
            assert_error(status, &res, 401, "INVALID_TOKEN");
        }
    }
    // change-password needs only authentication.
    let (status, res) = app
        .call(
            Method::POST,
            "/users/change-password",
            None,
            Some(json!({"current_password": "x", "new_password": "password-999"})),
        )
        .await;
    assert_error(status, &res, 401, "MISSING_TOKEN");
    // Nothing above took effect.
    let (status, body) = app.call(Method::GET, "/users", Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body.as_array().map(Vec::len), Some(3));
    let (status, _) = app
        .call(
            Method::POST,
            "/auth/login",
            None,
            Some(json!({"username": "reader", "password": "password-123"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
}

#[actix_web::test]
async fn update_role_email_and_password() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let (status, created) = create(
        &app,
        &admin,
        "/users",
        json!({"username": "ed", "password": "password-123", "role": "read-only", "email": "ed@x.example"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);

    // An empty object changes nothing.
    let (status, body) = app.call(Method::PUT, "/users/ed", Some(&admin), Some(json!({}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, created);
    let (status, body) =
        app.call(Method::PUT, "/api/users/ed", Some(&admin), Some(json!({"role": "user"}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_user_object(&body, "ed", "read-write");
    assert_eq!(body["email"], "ed@x.example");
    let (status, body) =
        app.call(Method::PUT, "/users/ed", Some(&admin), Some(json!({"email": "new@x.example"}))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["email"], "new@x.example");
    assert_eq!(body["role"], "read-write");
    let (status, body) = app.call(Method::PUT, "/users/ed", Some(&admin), Some(json!({"email": null}))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["email"], Value::Null);
    let (status, body) = app
        .call(
            Method::PUT,
            "/api/v1/users/ed",
            Some(&admin),
            Some(json!({"password": "password-456", "role": "admin"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["role"], "admin");
    let (status, _) = app
        .call(Method::POST, "/auth/login", None, Some(json!({"username": "ed", "password": "password-456"})))
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = app.call(Method::GET, "/users/ed", Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["role"], "admin");
    assert_eq!(body["id"], created["id"]);

    for (body, code) in [
        (json!({"password": "short"}), "WEAK_PASSWORD"),
        (json!({"role": "superuser"}), "BAD_REQUEST"),
        (json!({"role": 1}), "BAD_REQUEST"),
        (json!({"email": "nope"}), "BAD_REQUEST"),
        (json!({"email": 1}), "BAD_REQUEST"),
        (json!("role"), "BAD_REQUEST"),
    ] {
        let (status, res) = app.call(Method::PUT, "/users/ed", Some(&admin), Some(body.clone())).await;
        assert_error(status, &res, 400, code);
    }
    let (status, body) =
        app.call(Method::PUT, "/users/nobody", Some(&admin), Some(json!({"role": "admin"}))).await;
    assert_error(status, &body, 404, "NOT_FOUND");
    // A failed update changed nothing.
    let (_, body) = app.call(Method::GET, "/users/ed", Some(&admin), None).await;
    assert_eq!(body["role"], "admin");
    assert_eq!(body["email"], Value::Null);
}

#[actix_web::test]
async fn delete_by_username_by_alias_and_by_id() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let mut ids = Vec::new();
    for name in ["d1", "d2", "d3", "d4"] {
        let (status, body) = create(
            &app,
            &admin,
            "/users",
            json!({"username": name, "password": "password-123", "role": "read-only"}),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED);
        ids.push(body["id"].as_str().expect("id").to_string());
    }
    for path in
        ["/users/d1".to_string(), "/api/users/delete/d2".to_string(), format!("/api/v1/users/{}", ids[2])]
    {
        let (status, body) = app.call(Method::DELETE, &path, Some(&admin), None).await;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
        assert_eq!(body, json!({"message": "User deleted successfully"}));
        let (status, body) = app.call(Method::DELETE, &path, Some(&admin), None).await;
        assert_error(status, &body, 404, "NOT_FOUND");
    }
    // /users/delete/{x} takes a username; an id works through /users/{id} only.
    // The /users/delete/ alias falls back to the id the same way.
    let (status, body) =
        app.call(Method::DELETE, &format!("/users/delete/{}", ids[3]), Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    for path in ["/users/nobody", "/users/delete/nobody", &format!("/users/{}", uuid::Uuid::new_v4())] {
        let (status, body) = app.call(Method::DELETE, path, Some(&admin), None).await;
        assert_error(status, &body, 404, "NOT_FOUND");
    }
    // A username that looks like a UUID is found by name first.
    let other_id = uuid::Uuid::new_v4().to_string();
    let (status, _) = create(
        &app,
        &admin,
        "/users",
        json!({"username": other_id, "password": "password-123", "role": "read-only"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, _) = app.call(Method::DELETE, &format!("/users/{other_id}"), Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = app.call(Method::GET, "/users", Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK);
    let names: Vec<&str> =
        body.as_array().expect("array").iter().filter_map(|u| u["username"].as_str()).collect();
    assert!(!names.contains(&other_id.as_str()));
    assert!(!names.iter().any(|n| ["d1", "d2", "d3", "d4"].contains(n)), "{names:?}");
}

#[actix_web::test]
async fn the_last_admin_can_be_neither_deleted_nor_demoted() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let admin_id = {
        let (_, body) = app.call(Method::GET, "/users/admin", Some(&admin), None).await;
        body["id"].as_str().expect("id").to_string()
    };
    for (method, path, body) in [
        (Method::DELETE, "/users/admin".to_string(), None),
        (Method::DELETE, "/users/delete/admin".to_string(), None),
        (Method::DELETE, format!("/users/{admin_id}"), None),
        (Method::PUT, "/users/admin".to_string(), Some(json!({"role": "read-write"}))),
        (Method::PUT, "/users/admin".to_string(), Some(json!({"role": "read-only", "email": "a@b.c"}))),
    ] {
        let (status, res) = app.call(method, &path, Some(&admin), body).await;
        assert_error(status, &res, 409, "LAST_ADMIN");
    }
    // Nothing changed: the token still works and the email was not set.
    let (status, body) = app.call(Method::GET, "/users/admin", Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["role"], "admin");
    assert_eq!(body["email"], Value::Null);
    // "Demoting" to admin is no demotion.
    let (status, _) =
        app.call(Method::PUT, "/users/admin", Some(&admin), Some(json!({"role": "admin"}))).await;
    assert_eq!(status, StatusCode::OK);

    // With a second admin, the first may go (even by their own hand), and then the second is last.
    let second = app.user_token(&admin, "second", "admin").await;
    let (status, body) =
        app.call(Method::PUT, "/users/admin", Some(&second), Some(json!({"role": "read-only"}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) =
        app.call(Method::PUT, "/users/admin", Some(&second), Some(json!({"role": "admin"}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = app.call(Method::DELETE, "/users/second", Some(&second), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let admin = app.admin_token().await;
    let (status, body) = app.call(Method::DELETE, "/users/admin", Some(&admin), None).await;
    assert_error(status, &body, 409, "LAST_ADMIN");
    // Two admins demoting each other at once cannot leave none: exactly one succeeds (the other is
    // refused as LAST_ADMIN, or as INVALID_TOKEN when its caller was demoted first).
    let third = app.user_token(&admin, "third", "admin").await;
    let (a, b) = tokio::join!(
        app.call(Method::PUT, "/users/third", Some(&admin), Some(json!({"role": "read-only"}))),
        app.call(Method::PUT, "/users/admin", Some(&third), Some(json!({"role": "read-only"}))),
    );
    let ok = [&a, &b].iter().filter(|r| r.0 == StatusCode::OK).count();
    assert_eq!(ok, 1, "{} / {}", a.1, b.1);
    for (status, body) in [&a, &b] {
        if *status != StatusCode::OK {
            assert!(body["code"] == "LAST_ADMIN" || body["code"] == "INVALID_TOKEN", "{body}");
        }
    }
    // The winner's caller was not changed, so their token still works.
    let survivor = if a.0 == StatusCode::OK { &admin } else { &third };
    let (_, users) = app.call(Method::GET, "/users", Some(survivor), None).await;
    let admins = users.as_array().expect("array").iter().filter(|u| u["role"] == "admin").count();
    assert_eq!(admins, 1);
}

#[actix_web::test]
async fn reset_password_with_either_field_spelling() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    app.user_token(&admin, "forgetful", "read-write").await;
    for (i, field) in ["new_password", "newPassword"].iter().enumerate() {
        let password = format!("reset-pass-{i}");
        let path = if i == 0 { "/users/reset-password" } else { "/api/v1/users/reset-password" };
        let (status, body) = app
            .call(Method::POST, path, Some(&admin), Some(json!({"username": "forgetful", *field: password})))
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body, json!({"message": "Password reset successfully"}));
        let (status, _) = app
            .call(
                Method::POST,
                "/auth/login",
                None,
                Some(json!({"username": "forgetful", "password": password})),
            )
            .await;
        assert_eq!(status, StatusCode::OK);
    }
    let (status, body) = app
        .call(
            Method::POST,
            "/auth/login",
            None,
            Some(json!({"username": "forgetful", "password": "password-123"})),
        )
        .await;
    assert_error(status, &body, 401, "INVALID_CREDENTIALS");
    for (body, status_code, code) in [
        (json!({"username": "forgetful", "new_password": "short"}), 400, "WEAK_PASSWORD"),
        (json!({"username": "forgetful"}), 400, "BAD_REQUEST"),
        (json!({"new_password": "password-123"}), 400, "BAD_REQUEST"),
        (json!({"username": "nobody", "new_password": "password-123"}), 404, "NOT_FOUND"),
    ] {
        let (status, res) = app.call(Method::POST, "/users/reset-password", Some(&admin), Some(body)).await;
        assert_error(status, &res, status_code, code);
    }
}

#[actix_web::test]
async fn change_password_with_every_field_spelling() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let mut token = app.user_token(&admin, "self", "read-only").await;
    let mut current = "password-123".to_string();
    let spellings = [
        ("current_password", "new_password"),
        ("currentPassword", "newPassword"),
        ("oldPassword", "new_password"),
        ("current_password", "newPassword"),
    ];
    for (i, (cur_field, new_field)) in spellings.iter().enumerate() {
        let next = format!("changed-pass-{i}");
        let (status, body) = app
            .call(
                Method::POST,
                "/api/users/change-password",
                Some(&token),
                Some(json!({*cur_field: current, *new_field: next})),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{cur_field}/{new_field}: {body}");
        assert_eq!(body, json!({"message": "Password changed successfully"}));
        current = next;
        token = app.login("self", &current).await["token"].as_str().expect("token").to_string();
    }
    for (body, status_code, code) in [
        (
            json!({"current_password": "wrong-password", "new_password": "password-999"}),
            401,
            "INVALID_PASSWORD",
        ),
        (json!({"current_password": current, "new_password": "short"}), 400, "WEAK_PASSWORD"),
        (json!({"current_password": current}), 400, "BAD_REQUEST"),
        (json!({"new_password": "password-999"}), 400, "BAD_REQUEST"),
        (json!({"current_password": current, "new_password": 12345678}), 400, "BAD_REQUEST"),
    ] {
        let (status, res) = app.call(Method::POST, "/users/change-password", Some(&token), Some(body)).await;
        assert_error(status, &res, status_code, code);
    }
    // None of the failures changed the password or revoked the token.
    let (status, _) = app.call(Method::GET, "/auth/me", Some(&token), None).await;
    assert_eq!(status, StatusCode::OK);
    app.login("self", &current).await;
}

#[actix_web::test]
async fn the_initial_admin_comes_from_the_environment_once() {
    let app = TestApp::spawn_with(&[("ADMIN_USERNAME", "boss"), ("ADMIN_PASSWORD", "pw")]).await;
    // The password rule does not apply to the bootstrap.
    let body = app.login("boss", "pw").await;
    assert_eq!(body["user"]["role"], "admin");
    let token = body["token"].as_str().expect("token").to_string();
    let (status, body) = app
        .call(
            Method::POST,
            "/auth/login",
            None,
            Some(json!({"username": "admin", "password": ADMIN_PASSWORD})),
        )
        .await;
    assert_error(status, &body, 401, "INVALID_CREDENTIALS");
    let (_, users) = app.call(Method::GET, "/users", Some(&token), None).await;
    assert_eq!(users.as_array().map(Vec::len), Some(1));

    // A restart with other settings does not bootstrap again or change the password.
    let again =
        TestApp::spawn_on(app.db_conn.clone(), &[("ADMIN_USERNAME", "other"), ("ADMIN_PASSWORD", "pw2")])
            .await;
    again.login("boss", "pw").await;
    let (status, _) = again
        .call(Method::POST, "/auth/login", None, Some(json!({"username": "other", "password": "pw2"})))
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (_, users) = again.call(Method::GET, "/users", Some(&token), None).await;
    assert_eq!(users.as_array().map(Vec::len), Some(1));
}
