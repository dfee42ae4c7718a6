//! The `synkronus` binary: operator commands against a test database, and configuration errors
//! that stop it with one line naming the variable.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::helpers::{assert_error, binary, cluster, fresh_database, TestApp, JWT_SECRET};

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs the built binary with a clean environment (plus `env`) in an empty directory.
async fn run(args: &[&str], env: &[(&str, &str)]) -> Run {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cmd = binary(args, dir.path());
    cmd.env("DATA_ROOT", dir.path().join("data")).env("LOG_LEVEL", "warn");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("the binary finishes within 60 s")
        .expect("run the binary");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn assert_ok(r: &Run) {
    assert_eq!(r.code, Some(0), "stdout: {}\nstderr: {}", r.stdout, r.stderr);
}

fn assert_failed(r: &Run, mentions: &str) {
    assert!(r.code.is_some_and(|c| c != 0), "expected failure: {} {}", r.stdout, r.stderr);
    assert!(r.stderr.contains(mentions), "stderr lacks '{mentions}': {}", r.stderr);
}

#[actix_web::test]
async fn user_create_and_reset_password_work_on_the_database() {
    let app = TestApp::spawn().await;
    let db: &str = &app.db_conn;
    let env = [("DB_CONNECTION", db), ("JWT_SECRET", JWT_SECRET)];

    let r = run(
        &["user", "create", "--username", "cli-reader", "--password", "password-123", "--role", "read-only"],
        &env,
    )
    .await;
    assert_ok(&r);
    assert!(r.stdout.contains("cli-reader"), "{}", r.stdout);
    let body = app.login("cli-reader", "password-123").await;
    assert_eq!(body["user"]["role"], "read-only");
    let token = body["token"].as_str().expect("token").to_string();

    // The default role is read-write, R1 names are accepted, the password may come from the environment.
    let mut env_pw = env.to_vec();
    env_pw.push(("SYNKRONUS_NEW_PASSWORD", "from-the-env-1"));
    let r = run(&["user", "create", "--username", "cli-env", "--email", "e@x.example"], &env_pw).await;
    assert_ok(&r);
    let body = app.login("cli-env", "from-the-env-1").await;
    assert_eq!(body["user"]["role"], "read-write");
    assert_eq!(body["user"]["email"], "e@x.example");
    let r = run(
        &["user", "create", "--username", "cli-r1", "--password", "password-123", "--role", "user"],
        &env,
    )
    .await;
    assert_ok(&r);
    assert_eq!(app.login("cli-r1", "password-123").await["user"]["role"], "read-write");

    for (args, mentions) in [
        (vec!["user", "create", "--username", "cli-reader", "--password", "password-123"], "cli-reader"),
        (vec!["user", "create", "--username", "weak", "--password", "short"], "password"),
        (vec!["user", "create", "--username", "x", "--password", "password-123", "--role", "root"], "root"),
        (vec!["user", "create", "--username", "a/b", "--password", "password-123"], "username"),
        (vec!["user", "reset-password", "--username", "nobody", "--password", "password-123"], "nobody"),
        (vec!["user", "reset-password", "--username", "cli-reader", "--password", "short"], "password"),
        (vec!["user", "create", "--username", "no-password"], "password"),
    ] {
        let r = run(&args, &env).await;
        assert_failed(&r, mentions);
    }

    let r = run(&["user", "reset-password", "--username", "cli-reader", "--password", "password-456"], &env)
        .await;
    assert_ok(&r);
    app.login("cli-reader", "password-456").await;
    let (status, body) = app
        .call(
            Method::POST,
            "/auth/login",
            None,
            Some(json!({"username": "cli-reader", "password": "password-123"})),
        )
        .await;
    assert_error(status, &body, 401, "INVALID_CREDENTIALS");
    // The reset revoked the user's tokens; the server notices within its cache TTL.
    let started = std::time::Instant::now();
    loop {
        let (status, body) = app.call(Method::GET, "/auth/me", Some(&token), None).await;
        if status == StatusCode::UNAUTHORIZED {
            assert_eq!(body["code"], "INVALID_TOKEN");
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "token survived the reset");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The reset of the admin through the CLI is the operator's way back in.
    let r = run(&["user", "reset-password", "--username", "admin", "--password", "recovered-1"], &env).await;
    assert_ok(&r);
    app.login("admin", "recovered-1").await;
}

#[actix_web::test]
async fn migrate_and_user_create_on_a_fresh_database() {
    let db = fresh_database().await;
    let conn = cluster().connection_string(&db);
    let env = [("DB_CONNECTION", conn.as_str()), ("JWT_SECRET", JWT_SECRET)];
    let r = run(&["migrate"], &env).await;
    assert_ok(&r);
    let r = run(&["migrate"], &env).await;
    assert_ok(&r);
    let r = run(
        &["user", "create", "--username", "first", "--password", "password-123", "--role", "admin"],
        &env,
    )
    .await;
    assert_ok(&r);
    // A user exists, so the server does not bootstrap its own admin.
    let app = TestApp::spawn_on(conn, &[]).await;
    let token = app.login("first", "password-123").await["token"].as_str().expect("token").to_string();
    let (status, users) = app.call(Method::GET, "/users", Some(&token), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(users.as_array().map(Vec::len), Some(1));
}

#[actix_web::test]
async fn invalid_configuration_stops_the_binary_with_one_line_naming_the_variable() {
    let db = "host=/nonexistent user=x dbname=y";
    let long = JWT_SECRET;
    let short = "x".repeat(31);
    let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
        (vec![("DB_CONNECTION", db)], "JWT_SECRET"),
        (vec![("DB_CONNECTION", db), ("JWT_SECRET", short.as_str())], "JWT_SECRET"),
        (vec![("DB_CONNECTION", db), ("JWT_SECRET", long), ("PORT", "0")], "PORT"),
        (vec![("DB_CONNECTION", db), ("JWT_SECRET", long), ("PORT", "http")], "PORT"),
        (vec![("DB_CONNECTION", "postgres://u@h:notaport/db"), ("JWT_SECRET", long)], "DB_CONNECTION"),
        (vec![("DB_CONNECTION", db), ("JWT_SECRET", long), ("JWT_TTL_SECONDS", "-5")], "JWT_TTL_SECONDS"),
        (vec![("DB_CONNECTION", db), ("JWT_SECRET", long), ("LOG_LEVEL", "loud")], "LOG_LEVEL"),
        (vec![("DB_CONNECTION", db), ("JWT_SECRET", long), ("MAX_VERSIONS_KEPT", "0")], "MAX_VERSIONS_KEPT"),
    ];
    for (env, var) in cases {
        for args in [
            &[][..],
            &["serve"][..],
            &["migrate"][..],
            &["user", "create", "--username", "a", "--password", "password-123"][..],
        ] {
            let r = run(args, &env).await;
            assert_failed(&r, var);
            let lines: Vec<&str> = r.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
            assert_eq!(lines.len(), 1, "one line: {}", r.stderr);
            assert!(r.stdout.is_empty(), "{}", r.stdout);
        }
    }
}

#[actix_web::test]
async fn version_names_the_release_and_the_commit() {
    let r = run(&["--version"], &[]).await;
    assert_ok(&r);
    let prefix = format!("synkronus {} (commit ", env!("CARGO_PKG_VERSION"));
    let commit = r.stdout.trim().strip_prefix(&prefix).and_then(|rest| rest.strip_suffix(')'));
    let commit = commit.unwrap_or_else(|| panic!("unexpected --version output: {}", r.stdout));
    assert!(commit.len() >= 7 && commit.bytes().all(|b| b.is_ascii_hexdigit()), "{commit}");
}
