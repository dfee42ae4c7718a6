//! Authentication (docs/api.md §6): login, refresh with rotation and reuse detection, logout, me, verify,
//! the JWT itself, the 401 codes, revocation and the login rate limit.

use std::time::{Duration, Instant};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::{assert_error, TestApp, ADMIN_PASSWORD, JWT_SECRET};

/// The claims of a JWT, read without verifying it (as real clients do).
fn claims(token: &str) -> Value {
    let payload = token.split('.').nth(1).expect("JWT payload");
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).expect("base64url")).expect("claims JSON")
}

fn jwt_header(token: &str) -> Value {
    let header = token.split('.').next().expect("JWT header");
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(header).expect("base64url")).expect("header JSON")
}

fn sign(alg: jsonwebtoken::Algorithm, key: &[u8], claims: &Value) -> String {
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(alg),
        claims,
        &jsonwebtoken::EncodingKey::from_secret(key),
    )
    .expect("sign")
}

async fn login_body(app: &TestApp, username: &str, password: &str) -> (StatusCode, Value) {
    app.call(Method::POST, "/auth/login", None, Some(json!({"username": username, "password": password})))
        .await
}

async fn refresh(app: &TestApp, token: &str) -> (StatusCode, Value) {
    app.call(Method::POST, "/auth/refresh", None, Some(json!({"refresh_token": token}))).await
}

async fn me(app: &TestApp, token: &str) -> (StatusCode, Value) {
    app.call(Method::GET, "/auth/me", Some(token), None).await
}

/// Polls `/auth/me` on `app` until `token` is refused, for at most `limit`.
async fn refused_within(app: &TestApp, token: &str, limit: Duration) -> Value {
    let started = Instant::now();
    loop {
        let (status, body) = me(app, token).await;
        if status == StatusCode::UNAUTHORIZED {
            return body;
        }
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(started.elapsed() < limit, "token still accepted after {limit:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Checks the login/refresh response shape of docs/api.md §6.2 and returns it.
fn assert_token_response(body: &Value, username: &str, role: &str, ttl: i64) {
    let token = body["token"].as_str().expect("token");
    assert_eq!(body["expires_in"], ttl);
    assert_eq!(body["expiresIn"], ttl);
    let refresh = body["refresh_token"].as_str().expect("refresh_token");
    assert_eq!(body["refreshToken"], refresh);
    // >= 256 bits, URL-safe.
    assert!(refresh.len() >= 43, "{refresh}");
    assert!(refresh.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
    let user = &body["user"];
    assert_eq!(user["username"], username);
    assert_eq!(user["role"], role);
    assert_eq!(user["roles"], json!([role]));
    assert!(user["created_at"].as_str().is_some_and(|t| t.ends_with('Z')));
    assert!(user.get("email").is_some());
    assert!(user.get("password").is_none() && user.get("password_hash").is_none());
    uuid::Uuid::parse_str(user["id"].as_str().expect("user id")).expect("user id is a UUID");

    assert_eq!(jwt_header(token), json!({"alg": "HS256", "typ": "JWT"}));
    let c = claims(token);
    assert_eq!(c["sub"], user["id"]);
    assert_eq!(c["username"], username);
    assert_eq!(c["email"], user["email"]);
    assert_eq!(c["role"], role);
    assert_eq!(c["roles"], json!([role]));
    let iat = c["iat"].as_i64().expect("iat is an integer");
    let exp = c["exp"].as_i64().expect("exp is an integer");
    assert_eq!(exp, iat + ttl);
    assert!((iat - chrono::Utc::now().timestamp()).abs() <= 5);
    assert_eq!(body["expiresAt"], exp);
    assert!(c["jti"].as_str().is_some_and(|j| !j.is_empty()));
}

#[actix_web::test]
async fn login_returns_every_alias_and_a_token_with_the_listed_claims() {
    let app = TestApp::spawn_with(&[("JWT_TTL_SECONDS", "7200")]).await;
    for prefix in ["", "/api", "/api/v1"] {
        let (status, body) = app
            .call(
                Method::POST,
                &format!("{prefix}/auth/login"),
                None,
                Some(json!({"username": "admin", "password": ADMIN_PASSWORD})),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_token_response(&body, "admin", "admin", 7200);
    }
    // Two logins give two distinct tokens.
    let a = app.admin_token().await;
    let b = app.admin_token().await;
    assert_ne!(claims(&a)["jti"], claims(&b)["jti"]);
    // A successful login sets last_login.
    let (status, body) = me(&app, &a).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body["data"]["last_login"].as_str().is_some_and(|t| t.ends_with('Z')), "{body}");
}

#[actix_web::test]
async fn login_errors() {
    let app = TestApp::spawn().await;
    for (body, path) in [
        (json!({"password": "x"}), "/username"),
        (json!({"username": "", "password": "x"}), "/username"),
        (json!({"username": null, "password": "x"}), "/username"),
        (json!({"username": "admin"}), "/password"),
        (json!({"username": "admin", "password": ""}), "/password"),
        (json!({"username": "admin", "password": 12345678}), "/password"),
    ] {
        let (status, res) = app.call(Method::POST, "/auth/login", None, Some(body.clone())).await;
        assert_error(status, &res, 400, "BAD_REQUEST");
        assert_eq!(res["errors"][0]["path"], path, "{body}: {res}");
    }
    // Unknown user and wrong password look the same.
    for (user, password) in
        [("admin", "wrong-password"), ("nobody", ADMIN_PASSWORD), ("ADMIN", ADMIN_PASSWORD)]
    {
        let (status, body) = login_body(&app, user, password).await;
        assert_error(status, &body, 401, "INVALID_CREDENTIALS");
        assert_eq!(body["message"], "Invalid credentials");
    }
    let res = app
        .send(Method::POST, "/auth/login", None, Some(json!({"username": "admin", "password": "nope-nope"})))
        .await;
    assert_eq!(res.headers().get("www-authenticate").and_then(|v| v.to_str().ok()), Some("Bearer"));
}

#[actix_web::test]
async fn login_is_rate_limited_per_ip_and_username() {
    let app =
        TestApp::spawn_with(&[("RATE_LIMIT_LOGIN_PER_MIN", "3"), ("TRUSTED_PROXIES", "127.0.0.1/32")]).await;
    let attempt = |user: &str, password: &str, forwarded: Option<&str>| {
        let mut req =
            app.client.post(app.url("/auth/login")).json(&json!({"username": user, "password": password}));
        if let Some(ip) = forwarded {
            req = req.header("x-forwarded-for", ip);
        }
        req.send()
    };
    // Successful and failed attempts both count.
    assert_eq!(attempt("admin", ADMIN_PASSWORD, None).await.expect("login").status(), StatusCode::OK);
    for _ in 0..2 {
        let res = attempt("admin", "wrong-password", None).await.expect("login");
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    }
    for password in ["wrong-password", ADMIN_PASSWORD] {
        let res = attempt("admin", password, None).await.expect("login");
        let retry: u64 = res
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .expect("Retry-After in whole seconds");
        assert!((1..=60).contains(&retry), "{retry}");
        let status = res.status();
        let body: Value = res.json().await.expect("body");
        assert_error(status, &body, 429, "RATE_LIMITED");
        assert_eq!(body["retry_after"], retry);
    }
    // Another username from the same IP, and the same username from another (proxied) IP, are separate.
    let res = attempt("someone-else", "wrong-password", None).await.expect("login");
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let res = attempt("admin", ADMIN_PASSWORD, Some("203.0.113.9")).await.expect("login");
    assert_eq!(res.status(), StatusCode::OK);
}

#[actix_web::test]
async fn the_login_limit_holds_across_servers_sharing_a_database() {
    let a = TestApp::spawn_with(&[("RATE_LIMIT_LOGIN_PER_MIN", "3"), ("NODE_ID", "node-a")]).await;
    let b = TestApp::spawn_on(a.db_conn.clone(), &[("RATE_LIMIT_LOGIN_PER_MIN", "3"), ("NODE_ID", "node-b")])
        .await;
    let body = json!({"username": "admin", "password": "wrong-password"});
    // Three attempts spread over both nodes fill the one window.
    for app in [&a, &b, &a] {
        let res = app.client.post(app.url("/auth/login")).json(&body).send().await.expect("login");
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    }
    for app in [&b, &a] {
        let res = app.client.post(app.url("/auth/login")).json(&body).send().await.expect("login");
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS, "on {}", app.state.config.node_id);
        assert!(res.headers().contains_key("retry-after"));
    }
    // Concurrent attempts on both nodes for a fresh username: exactly three are counted.
    let body = json!({"username": "someone", "password": "wrong-password"});
    let attempts = (0..10).map(|i| {
        let app = if i % 2 == 0 { &a } else { &b };
        app.client.post(app.url("/auth/login")).json(&body).send()
    });
    let statuses: Vec<StatusCode> = futures_util::future::join_all(attempts)
        .await
        .into_iter()
        .map(|r| r.expect("login").status())
        .collect();
    assert_eq!(statuses.iter().filter(|s| **s == StatusCode::UNAUTHORIZED).count(), 3, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|s| **s == StatusCode::TOO_MANY_REQUESTS).count(), 7, "{statuses:?}");
}

#[actix_web::test]
async fn forwarded_for_is_ignored_from_untrusted_peers() {
    let app = TestApp::spawn_with(&[("RATE_LIMIT_LOGIN_PER_MIN", "1")]).await;
    let body = json!({"username": "admin", "password": "wrong-password"});
    let res = app.client.post(app.url("/auth/login")).json(&body).send().await.expect("login");
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let res = app
        .client
        .post(app.url("/auth/login"))
        .header("x-forwarded-for", "198.51.100.7")
        .json(&body)
        .send()
        .await
        .expect("login");
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[actix_web::test]
async fn refresh_rotates_and_a_reused_token_revokes_its_family() {
    let app = TestApp::spawn().await;
    let (_, first) = login_body(&app, "admin", ADMIN_PASSWORD).await;
    let (_, other_session) = login_body(&app, "admin", ADMIN_PASSWORD).await;
    let r1 = first["refresh_token"].as_str().expect("refresh").to_string();

    let (status, second) = refresh(&app, &r1).await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_token_response(&second, "admin", "admin", 3600);
    let r2 = second["refreshToken"].as_str().expect("refresh").to_string();
    assert_ne!(r1, r2);
    assert_ne!(second["token"], first["token"]);
    let (status, _) = me(&app, second["token"].as_str().expect("token")).await;
    assert_eq!(status, StatusCode::OK);

    // The camelCase alias, under a prefix.
    let (status, third) =
        app.call(Method::POST, "/api/v1/auth/refresh", None, Some(json!({"refreshToken": r2}))).await;
    assert_eq!(status, StatusCode::OK, "{third}");
    let r3 = third["refresh_token"].as_str().expect("refresh").to_string();

    // Presenting r1 again is a reuse: 401, and the whole family (r3 included) is revoked.
    let (status, body) = refresh(&app, &r1).await;
    assert_error(status, &body, 401, "INVALID_TOKEN");
    let (status, body) = refresh(&app, &r3).await;
    assert_error(status, &body, 401, "INVALID_TOKEN");
    // Another login's family is untouched.
    let other = other_session["refresh_token"].as_str().expect("refresh");
    let (status, body) = refresh(&app, other).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[actix_web::test]
async fn refresh_errors() {
    let app = TestApp::spawn().await;
    let (_, login) = login_body(&app, "admin", ADMIN_PASSWORD).await;
    for body in [json!({}), json!({"refresh_token": ""}), json!({"refresh_token": 5}), json!([])] {
        let (status, res) = app.call(Method::POST, "/auth/refresh", None, Some(body)).await;
        assert_error(status, &res, 400, "BAD_REQUEST");
    }
    let access = login["token"].as_str().expect("token");
    for bad in ["unknown-token", access, "a.b.c"] {
        let (status, body) = refresh(&app, bad).await;
        assert_error(status, &body, 401, "INVALID_TOKEN");
    }
    // snake_case wins over camelCase when both are sent.
    let good = login["refresh_token"].as_str().expect("refresh");
    let (status, body) = app
        .call(
            Method::POST,
            "/auth/refresh",
            None,
            Some(json!({"refresh_token": good, "refreshToken": "junk"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[actix_web::test]
async fn an_expired_refresh_token_gives_token_expired() {
    let app = TestApp::spawn_with(&[("REFRESH_TTL_SECONDS", "1")]).await;
    let (_, login) = login_body(&app, "admin", ADMIN_PASSWORD).await;
    let r = login["refresh_token"].as_str().expect("refresh");
    app.advance_clock(Duration::from_secs(2));
    let (status, body) = refresh(&app, r).await;
    assert_error(status, &body, 401, "TOKEN_EXPIRED");
}

#[actix_web::test]
async fn an_expired_access_token_gives_token_expired() {
    let app = TestApp::spawn_with(&[("JWT_TTL_SECONDS", "1")]).await;
    let (_, login) = login_body(&app, "admin", ADMIN_PASSWORD).await;
    assert_eq!(login["expires_in"], 1);
    let token = login["token"].as_str().expect("token");
    let (status, _) = me(&app, token).await;
    assert_eq!(status, StatusCode::OK);
    app.advance_clock(Duration::from_secs(2));
    for (method, path) in [(Method::GET, "/auth/me"), (Method::POST, "/auth/logout"), (Method::GET, "/users")]
    {
        let (status, body) = app.call(method, path, Some(token), None).await;
        assert_error(status, &body, 401, "TOKEN_EXPIRED");
    }
    let (status, body) = app.call(Method::GET, "/auth/verify", Some(token), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!({"valid": false, "error": "TOKEN_EXPIRED"}));
    // The refresh token outlives it and yields a working access token.
    let (status, body) = refresh(&app, login["refresh_token"].as_str().expect("refresh")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _) = me(&app, body["token"].as_str().expect("token")).await;
    assert_eq!(status, StatusCode::OK);
}

#[actix_web::test]
async fn logout_revokes_the_access_token_and_the_given_refresh_token() {
    let app = TestApp::spawn().await;
    let (_, a) = login_body(&app, "admin", ADMIN_PASSWORD).await;
    let (_, b) = login_body(&app, "admin", ADMIN_PASSWORD).await;
    let (_, c) = login_body(&app, "admin", ADMIN_PASSWORD).await;
    let token_a = a["token"].as_str().expect("token");
    let refresh_a = a["refresh_token"].as_str().expect("refresh");

    let (status, body) = app
        .call(Method::POST, "/auth/logout", Some(token_a), Some(json!({"refresh_token": refresh_a})))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, json!({"message": "Logged out"}));
    let (status, body) = me(&app, token_a).await;
    assert_error(status, &body, 401, "INVALID_TOKEN");
    let (status, body) = app.call(Method::GET, "/auth/verify", Some(token_a), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!({"valid": false, "error": "INVALID_TOKEN"}));
    let (status, body) = refresh(&app, refresh_a).await;
    assert_error(status, &body, 401, "INVALID_TOKEN");

    // Without a body only the access token goes; the session's refresh token still works.
    let token_b = b["token"].as_str().expect("token");
    let (status, _) = app.call(Method::POST, "/auth/logout", Some(token_b), None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = me(&app, token_b).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, body) = refresh(&app, b["refresh_token"].as_str().expect("refresh")).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // The camelCase alias; other sessions are unaffected until they log out.
    let token_c = c["token"].as_str().expect("token");
    let (status, _) = me(&app, token_c).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = app
        .call(
            Method::POST,
            "/api/auth/logout",
            Some(token_c),
            Some(json!({"refreshToken": c["refresh_token"].clone()})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = refresh(&app, c["refresh_token"].as_str().expect("refresh")).await;
    assert_error(status, &body, 401, "INVALID_TOKEN");

    let (status, body) = app.call(Method::POST, "/auth/logout", None, None).await;
    assert_error(status, &body, 401, "MISSING_TOKEN");
    // The logout is effective on every process within seconds.
    let (_, d) = login_body(&app, "admin", ADMIN_PASSWORD).await;
    let token_d = d["token"].as_str().expect("token");
    let other = TestApp::spawn_on(app.db_conn.clone(), &[]).await;
    let (status, _) = me(&other, token_d).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = app.call(Method::POST, "/auth/logout", Some(token_d), None).await;
    assert_eq!(status, StatusCode::OK);
    let body = refused_within(&other, token_d, Duration::from_secs(5)).await;
    assert_eq!(body["code"], "INVALID_TOKEN");
}

#[actix_web::test]
async fn me_and_verify() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let (status, created) = app
        .call(
            Method::POST,
            "/users",
            Some(&admin),
            Some(json!({"username": "enum1", "password": "password-123", "role": "read-write",
                        "email": "enum1@example.org"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let (_, login) = login_body(&app, "enum1", "password-123").await;
    let token = login["token"].as_str().expect("token");
    assert_eq!(claims(token)["email"], "enum1@example.org");

    for prefix in ["", "/api", "/api/v1"] {
        let (status, body) = app.call(Method::GET, &format!("{prefix}/auth/me"), Some(token), None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let data = &body["data"];
        assert_eq!(body.as_object().map(|o| o.len()), Some(1), "only `data`: {body}");
        assert_eq!(data["id"], created["id"]);
        assert_eq!(data["username"], "enum1");
        assert_eq!(data["email"], "enum1@example.org");
        assert_eq!(data["role"], "read-write");
        assert_eq!(data["roles"], json!(["read-write"]));
        assert_eq!(data["created_at"], created["created_at"]);
        assert!(data["last_login"].is_string());
    }

    let (status, body) = app.call(Method::GET, "/auth/verify", Some(token), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["valid"], true);
    assert_eq!(body["username"], "enum1");
    assert_eq!(body["role"], "read-write");
    let expires = chrono::DateTime::parse_from_rfc3339(body["expires_at"].as_str().expect("expires_at"))
        .expect("RFC 3339");
    assert_eq!(expires.timestamp(), claims(token)["exp"].as_i64().expect("exp"));
    assert!(body["expires_at"].as_str().is_some_and(|t| t.ends_with('Z')));

    for (auth, error) in [
        (None, "MISSING_TOKEN"),
        (Some("Basic abc"), "MISSING_TOKEN"),
        (Some("Bearer "), "MISSING_TOKEN"),
        (Some("Bearer not-a-jwt"), "INVALID_TOKEN"),
    ] {
        let mut req = app.client.get(app.url("/api/auth/verify"));
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let res = req.send().await.expect("verify");
        assert_eq!(res.status(), StatusCode::OK);
        let body: Value = res.json().await.expect("body");
        assert_eq!(body, json!({"valid": false, "error": error}), "{auth:?}");
    }
}

#[actix_web::test]
async fn missing_malformed_and_forged_tokens_are_refused() {
    let app = TestApp::spawn().await;
    let token = app.admin_token().await;
    // The scheme is case-insensitive.
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let res = app
            .client
            .get(app.url("/auth/me"))
            .header("authorization", format!("{scheme} {token}"))
            .send()
            .await
            .expect("me");
        assert_eq!(res.status(), StatusCode::OK, "{scheme}");
    }
    for auth in [
        None,
        Some("".to_string()),
        Some("Basic Zm9vOmJhcg==".into()),
        Some("Bearer".into()),
        Some("Bearer    ".into()),
        Some(token.clone()),
    ] {
        let mut req = app.client.get(app.url("/auth/me"));
        if let Some(a) = &auth {
            req = req.header("authorization", a);
        }
        let res = req.send().await.expect("me");
        let status = res.status();
        assert_eq!(res.headers().get("www-authenticate").and_then(|v| v.to_str().ok()), Some("Bearer"));
        let body: Value = res.json().await.expect("body");
        assert_error(status, &body, 401, "MISSING_TOKEN");
    }

    let valid = claims(&token);
    let mut tampered = valid.clone();
    tampered["role"] = json!("admin");
    tampered["username"] = json!("someone");
    let parts: Vec<&str> = token.split('.').collect();
    let tampered_token =
        format!("{}.{}.{}", parts[0], URL_SAFE_NO_PAD.encode(tampered.to_string()), parts[2]);
    let none_token = format!(
        "{}.{}.",
        URL_SAFE_NO_PAD.encode(r#"{"alg":"none","typ":"JWT"}"#),
        URL_SAFE_NO_PAD.encode(valid.to_string())
    );
    let mut wrong_generation = valid.clone();
    let jti = valid["jti"].as_str().expect("jti");
    let (stem, generation) = jti.rsplit_once('.').expect("generation in jti");
    let generation: i64 = generation.parse().expect("generation");
    wrong_generation["jti"] = json!(format!("{stem}.{}", generation + 1));
    let mut unknown_user = valid.clone();
    unknown_user["sub"] = json!(uuid::Uuid::new_v4().to_string());
    let mut no_jti = valid.clone();
    no_jti.as_object_mut().expect("claims").remove("jti");
    let mut bad_role = valid.clone();
    bad_role["role"] = json!("root");
    let forged = [
        ("alg none", none_token),
        ("HS512", sign(jsonwebtoken::Algorithm::HS512, JWT_SECRET.as_bytes(), &valid)),
        ("HS384", sign(jsonwebtoken::Algorithm::HS384, JWT_SECRET.as_bytes(), &valid)),
        (
            "other key",
            sign(jsonwebtoken::Algorithm::HS256, b"another-secret-another-secret-0123456789", &valid),
        ),
        ("tampered", tampered_token),
        ("truncated", token[..token.len() - 4].to_string()),
        ("garbage", "not.a.jwt".to_string()),
        ("stale generation", sign(jsonwebtoken::Algorithm::HS256, JWT_SECRET.as_bytes(), &wrong_generation)),
        ("unknown user", sign(jsonwebtoken::Algorithm::HS256, JWT_SECRET.as_bytes(), &unknown_user)),
        ("no jti", sign(jsonwebtoken::Algorithm::HS256, JWT_SECRET.as_bytes(), &no_jti)),
        ("unknown role", sign(jsonwebtoken::Algorithm::HS256, JWT_SECRET.as_bytes(), &bad_role)),
    ];
    for (what, t) in &forged {
        let (status, body) = me(&app, t).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{what}");
        assert_error(status, &body, 401, "INVALID_TOKEN");
        let (status, body) = app.call(Method::GET, "/auth/verify", Some(t), None).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body, json!({"valid": false, "error": "INVALID_TOKEN"}), "{what}");
    }
    // A well-signed token past its exp (no leeway) is TOKEN_EXPIRED, not INVALID_TOKEN.
    let mut expired = valid.clone();
    expired["exp"] = json!(chrono::Utc::now().timestamp() - 1);
    let expired = sign(jsonwebtoken::Algorithm::HS256, JWT_SECRET.as_bytes(), &expired);
    let (status, body) = me(&app, &expired).await;
    assert_error(status, &body, 401, "TOKEN_EXPIRED");
    // The original token is unharmed by all this.
    let (status, _) = me(&app, &token).await;
    assert_eq!(status, StatusCode::OK);
}

#[actix_web::test]
async fn a_deleted_users_tokens_are_refused_on_every_process() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let token = app.user_token(&admin, "leaver", "read-write").await;
    let (_, login) = login_body(&app, "leaver", "password-123").await;
    let other = TestApp::spawn_on(app.db_conn.clone(), &[]).await;
    // The other process has checked (and cached) the token.
    let (status, _) = me(&other, &token).await;
    assert_eq!(status, StatusCode::OK);

    let (status, _) = app.call(Method::DELETE, "/users/leaver", Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = me(&app, &token).await;
    assert_error(status, &body, 401, "INVALID_TOKEN");
    let body = refused_within(&other, &token, Duration::from_secs(5)).await;
    assert_eq!(body["code"], "INVALID_TOKEN");
    let (status, body) = refresh(&app, login["refresh_token"].as_str().expect("refresh")).await;
    assert_error(status, &body, 401, "INVALID_TOKEN");
    let (status, body) = login_body(&app, "leaver", "password-123").await;
    assert_error(status, &body, 401, "INVALID_CREDENTIALS");
}

#[actix_web::test]
async fn a_role_change_invalidates_tokens_but_refresh_issues_the_new_role() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    app.user_token(&admin, "mover", "read-only").await;
    let (_, login) = login_body(&app, "mover", "password-123").await;
    let token = login["token"].as_str().expect("token");
    let other = TestApp::spawn_on(app.db_conn.clone(), &[]).await;
    let (status, _) = me(&other, token).await;
    assert_eq!(status, StatusCode::OK);

    let (status, body) =
        app.call(Method::PUT, "/users/mover", Some(&admin), Some(json!({"role": "read-write"}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = me(&app, token).await;
    assert_error(status, &body, 401, "INVALID_TOKEN");
    refused_within(&other, token, Duration::from_secs(5)).await;

    let (status, body) = refresh(&other, login["refresh_token"].as_str().expect("refresh")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_token_response(&body, "mover", "read-write", 3600);
    let (status, me_body) = me(&app, body["token"].as_str().expect("token")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(me_body["data"]["role"], "read-write");

    // Setting the same role again changes nothing, so tokens survive.
    let new_token = body["token"].as_str().expect("token");
    let (status, _) =
        app.call(Method::PUT, "/users/mover", Some(&admin), Some(json!({"role": "READ-WRITE"}))).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = me(&app, new_token).await;
    assert_eq!(status, StatusCode::OK);
}

#[actix_web::test]
async fn a_password_change_invalidates_access_and_refresh_tokens() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    app.user_token(&admin, "changer", "read-only").await;
    let (_, own) = login_body(&app, "changer", "password-123").await;
    let (_, second) = login_body(&app, "changer", "password-123").await;
    let other = TestApp::spawn_on(app.db_conn.clone(), &[]).await;
    let token = own["token"].as_str().expect("token");
    let (status, _) = me(&other, second["token"].as_str().expect("token")).await;
    assert_eq!(status, StatusCode::OK);

    // change-password: even the token used for it stops working.
    let (status, body) = app
        .call(
            Method::POST,
            "/users/change-password",
            Some(token),
            Some(json!({"current_password": "password-123", "new_password": "password-456"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = me(&app, token).await;
    assert_error(status, &body, 401, "INVALID_TOKEN");
    refused_within(&other, second["token"].as_str().expect("token"), Duration::from_secs(5)).await;
    for session in [&own, &second] {
        let (status, body) = refresh(&app, session["refresh_token"].as_str().expect("refresh")).await;
        assert_error(status, &body, 401, "INVALID_TOKEN");
    }

    // reset-password by an admin: the same.
    let (_, third) = login_body(&app, "changer", "password-456").await;
    let (status, _) = app
        .call(
            Method::POST,
            "/users/reset-password",
            Some(&admin),
            Some(json!({"username": "changer", "newPassword": "password-789"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = me(&app, third["token"].as_str().expect("token")).await;
    assert_error(status, &body, 401, "INVALID_TOKEN");
    let (status, body) = refresh(&app, third["refresh_token"].as_str().expect("refresh")).await;
    assert_error(status, &body, 401, "INVALID_TOKEN");

    // PUT with a password: the same.
    let (_, fourth) = login_body(&app, "changer", "password-789").await;
    let (status, _) = app
        .call(Method::PUT, "/users/changer", Some(&admin), Some(json!({"password": "password-000"})))
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = me(&app, fourth["token"].as_str().expect("token")).await;
    assert_error(status, &body, 401, "INVALID_TOKEN");
    let (status, body) = refresh(&app, fourth["refresh_token"].as_str().expect("refresh")).await;
    assert_error(status, &body, 401, "INVALID_TOKEN");
    let (status, _) = login_body(&app, "changer", "password-000").await;
    assert_eq!(status, StatusCode::OK);
    // Other users' tokens are untouched.
    let (status, _) = me(&app, &admin).await;
    assert_eq!(status, StatusCode::OK);
}
