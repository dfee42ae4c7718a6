//! The `synkronus` binary: operator commands against a test database, and configuration errors
//! that stop it with one line naming the variable.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::crash::EmbeddedDataRoot;
use crate::helpers::{
    assert_error, binary, cluster, free_port, fresh_database, ChildServer, TestApp, JWT_SECRET,
};

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

/// docs/api.md §20.1: `user set-attributes` goes through the same change as `PUT /users/{username}`:
/// validated, audited with the old and new values, and followed by the user's next sync.
#[actix_web::test]
async fn user_set_attributes_changes_what_the_user_receives_and_is_audited() {
    use crate::scopes::{push, record, set_rules, Device};

    let app = TestApp::spawn().await;
    let db: &str = &app.db_conn;
    let env = [("DB_CONNECTION", db), ("JWT_SECRET", JWT_SECRET)];
    let admin = app.admin_token().await;
    let worker = app.user_token(&admin, "cli-worker", "read-write").await;
    push(
        &app,
        &admin,
        "admin-device",
        vec![
            record("h-north", "household", json!({"district": "north"})),
            record("h-east", "household", json!({"district": "east"})),
        ],
    )
    .await;
    set_rules(
        &app,
        &admin,
        json!([{"name": "districts", "applies_to": {"roles": ["read-write"]}, "form_types": ["household"],
                "where": {"field": "district", "in_attribute": "district"}}]),
    )
    .await;
    let mut phone = Device::new("phone");
    phone.sync(&app, &worker, 10).await;
    assert!(phone.ids().is_empty(), "{:?}", phone.ids());

    let r = run(
        &[
            "user",
            "set-attributes",
            "--username",
            "cli-worker",
            "--attributes",
            r#"{"district": ["north", "north"]}"#,
        ],
        &env,
    )
    .await;
    assert_ok(&r);
    assert!(r.stdout.contains(r#"{"district":["north"]}"#), "{}", r.stdout);
    let (_, user) = app.call(Method::GET, "/users/cli-worker", Some(&admin), None).await;
    assert_eq!(user["attributes"], json!({"district": ["north"]}));
    // The household already below the phone's cursor arrives on its next sync.
    phone.sync(&app, &worker, 10).await;
    assert_eq!(phone.ids(), ["h-north"]);

    let r = run(
        &["user", "set-attributes", "--username", "cli-worker", "--attributes", r#"{"district": ["east"]}"#],
        &env,
    )
    .await;
    assert_ok(&r);
    phone.sync(&app, &worker, 10).await;
    assert_eq!(phone.ids(), ["h-east"]);

    let (_, audit) =
        app.call(Method::GET, "/admin/audit?action=user.attributes_change", Some(&admin), None).await;
    let entries = audit["items"].as_array().expect("items");
    assert_eq!(entries.len(), 2, "{audit}");
    assert_eq!(entries[0]["target"], "cli-worker");
    assert_eq!(entries[0]["actor"], serde_json::Value::Null);
    assert_eq!(entries[0]["details"], json!({"from": {"district": ["north"]}, "to": {"district": ["east"]}}));

    // Bad input changes nothing, and says why: each problem on its own line, naming the attribute.
    for (attributes, mentions) in [
        ("{district: north}", "not valid JSON"),
        (r#"["north"]"#, "/attributes: attributes must be an object"),
        (r#"{"bad name": ["x"], "team": [7]}"#, "2 problem(s)"),
    ] {
        let r =
            run(&["user", "set-attributes", "--username", "cli-worker", "--attributes", attributes], &env)
                .await;
        assert_failed(&r, mentions);
    }
    let r = run(
        &[
            "user",
            "set-attributes",
            "--username",
            "cli-worker",
            "--attributes",
            r#"{"bad name": ["x"], "team": [7]}"#,
        ],
        &env,
    )
    .await;
    assert_failed(&r, "\n  /attributes/bad name: attribute name 'bad name'");
    assert!(
        r.stderr.contains("\n  /attributes/team/0: attribute 'team': each value must be a string"),
        "{}",
        r.stderr
    );
    let r = run(&["user", "set-attributes", "--username", "nobody", "--attributes", "{}"], &env).await;
    assert_failed(&r, "no user named 'nobody'");
    let (_, user) = app.call(Method::GET, "/users/cli-worker", Some(&admin), None).await;
    assert_eq!(user["attributes"], json!({"district": ["east"]}));
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
    let serving = [&[][..], &["serve"][..]];
    let all = [
        &[][..],
        &["serve"][..],
        &["migrate"][..],
        &["user", "create", "--username", "a", "--password", "password-123"][..],
    ];
    type Case<'a> = (Vec<(&'a str, &'a str)>, &'a str, &'a [&'a [&'a str]]);
    let cases: Vec<Case> = vec![
        // Only the server signs tokens: the one-off commands run without JWT_SECRET.
        (vec![("DB_CONNECTION", db)], "JWT_SECRET: is required with DB_CONNECTION", &serving),
        (vec![("DB_CONNECTION", db), ("JWT_SECRET", short.as_str())], "JWT_SECRET", &all),
        (vec![("DB_CONNECTION", db), ("JWT_SECRET", long), ("PORT", "0")], "PORT", &all),
        (vec![("DB_CONNECTION", db), ("JWT_SECRET", long), ("PORT", "http")], "PORT", &all),
        (vec![("DB_CONNECTION", "postgres://u@h:notaport/db"), ("JWT_SECRET", long)], "DB_CONNECTION", &all),
        (
            vec![("DB_CONNECTION", db), ("JWT_SECRET", long), ("JWT_TTL_SECONDS", "-5")],
            "JWT_TTL_SECONDS",
            &all,
        ),
        (vec![("DB_CONNECTION", db), ("JWT_SECRET", long), ("LOG_LEVEL", "loud")], "LOG_LEVEL", &all),
        (
            vec![("DB_CONNECTION", db), ("JWT_SECRET", long), ("MAX_VERSIONS_KEPT", "0")],
            "MAX_VERSIONS_KEPT",
            &all,
        ),
    ];
    for (env, mentions, commands) in cases {
        for args in commands {
            let r = run(args, &env).await;
            assert_failed(&r, mentions);
            assert_eq!(r.code, Some(2), "{args:?}: {}", r.stderr);
            assert!(r.stderr.starts_with("synkronus: invalid configuration: "), "{}", r.stderr);
            let lines: Vec<&str> = r.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
            assert_eq!(lines.len(), 1, "one line: {}", r.stderr);
            assert!(r.stdout.is_empty(), "{}", r.stdout);
        }
    }
}

/// Without `JWT_SECRET`, a server on its embedded database generates a key into the data root at
/// its first start and signs with the same key at every later one: tokens outlive a restart. The
/// cluster it created runs with the settings it was given (`max_wal_size`).
#[actix_web::test]
async fn the_embedded_server_generates_its_jwt_secret_once_and_keeps_it() {
    let root = EmbeddedDataRoot::new("synk-jwt");
    // No DB_CONNECTION (the embedded cluster) and no JWT_SECRET; info shows the start-up lines.
    let env = [("JWT_SECRET", ""), ("LOG_LEVEL", "info")];
    let mut first = ChildServer::start("", &root.dir, root.dir.join("first.log"), &env).await;
    let token = first.admin_token().await;
    assert!(first.terminate(Duration::from_secs(60)).await.success(), "{}", first.log_text());

    let file = root.dir.join("jwt-secret");
    let key = std::fs::read_to_string(&file).expect("the generated key");
    let key = key.trim_end();
    assert!(key.len() >= 32 && key.bytes().all(|b| b.is_ascii_hexdigit()), "{key}");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&file).expect("metadata").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the key is the owner's alone");
    let log = first.log_text();
    assert_eq!(log.matches("generated a secret").count(), 1, "{log}");
    assert!(!log.contains(key), "the key reached the log: {log}");

    let mut second = ChildServer::start("", &root.dir, root.dir.join("second.log"), &env).await;
    let (status, me) = second.call(Method::GET, "/auth/me", Some(&token), None).await;
    assert_eq!(status, StatusCode::OK, "a token of the first run: {me}");
    let log = second.log_text();
    assert_eq!(log.matches("read the secret from the data root").count(), 1, "{log}");
    assert!(!log.contains("generated a secret") && !log.contains(key), "{log}");
    assert_eq!(std::fs::read_to_string(&file).expect("key").trim_end(), key, "the key was kept");

    // The cluster the server created runs with the WAL allowance it was given at initdb.
    let socket = root.dir.join("postgres");
    let (db, connection) = tokio_postgres::Config::new()
        .host_path(&socket)
        .user("synkronus")
        .dbname("synkronus")
        .connect(tokio_postgres::NoTls)
        .await
        .expect("the embedded cluster's socket");
    tokio::spawn(connection);
    let row = db.query_one("SHOW max_wal_size", &[]).await.expect("SHOW");
    assert_eq!(row.get::<_, String>(0), "4GB");
    drop(db);
    assert!(second.terminate(Duration::from_secs(60)).await.success(), "{}", second.log_text());
}

/// Answers every connection with `status` (or, `None`, holds it without a word).
async fn fake_server(status: Option<&'static str>) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("address").port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut buf = [0u8; 4096];
            let _ = socket.read(&mut buf).await;
            if let Some(status) = status {
                let answer = format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
                let _ = socket.write_all(answer.as_bytes()).await;
            }
            held.push(socket);
        }
    });
    port
}

#[actix_web::test]
async fn healthcheck_exits_0_only_when_the_local_server_answers_200() {
    let app = TestApp::spawn().await;
    let port = app.port.to_string();
    // The probe reads where the server listens and nothing else: no JWT_SECRET, no database, a
    // variable only the server reads broken; the unspecified address means this machine.
    for bind in ["127.0.0.1", "0.0.0.0"] {
        let r =
            run(&["healthcheck"], &[("PORT", &port), ("BIND_ADDRESS", bind), ("LOG_LEVEL", "loud")]).await;
        assert_ok(&r);
        assert!(r.stdout.is_empty() && r.stderr.is_empty(), "{} {}", r.stdout, r.stderr);
    }

    let unhealthy = fake_server(Some("503 Service Unavailable")).await.to_string();
    let silent = fake_server(None).await.to_string();
    let closed = free_port().to_string();
    for (port, mentions) in [(&unhealthy, "503"), (&closed, "/health"), (&silent, "/health")] {
        let started = std::time::Instant::now();
        let r = run(&["healthcheck"], &[("PORT", port), ("BIND_ADDRESS", "127.0.0.1")]).await;
        assert_eq!(r.code, Some(1), "{}", r.stderr);
        assert!(r.stderr.contains(mentions), "{}", r.stderr);
        assert!(started.elapsed() < Duration::from_secs(15), "a short timeout: {:?}", started.elapsed());
    }
    let r = run(&["healthcheck"], &[("PORT", "http")]).await;
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    assert!(r.stderr.contains("PORT"), "{}", r.stderr);
}

/// docs/operations.md has operators verify the copy kept elsewhere, where the server's
/// environment is not set: `--verify` reads no configuration at all.
#[actix_web::test]
async fn backup_verify_runs_without_the_servers_configuration() {
    let db = fresh_database().await;
    let conn = cluster().connection_string(&db);
    let env = [("DB_CONNECTION", conn.as_str()), ("JWT_SECRET", JWT_SECRET)];
    assert_ok(&run(&["migrate"], &env).await);
    let dir = tempfile::tempdir().expect("temp dir");
    let archive = dir.path().join("copy.zip");
    let archive = archive.to_str().expect("utf-8 path");
    assert_ok(&run(&["backup", "--output", archive], &env).await);
    for env in [&[][..], &[("JWT_SECRET", "short"), ("PORT", "http"), ("DB_CONNECTION", "nonsense")][..]] {
        let r = run(&["backup", "--verify", archive], env).await;
        assert_ok(&r);
        assert!(r.stdout.contains("is intact"), "{}", r.stdout);
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
    // Neither reads the configuration: a broken one does not stop them.
    for args in [&["--version"][..], &["--help"][..], &["backup", "--help"][..]] {
        let r = run(args, &[("PORT", "http"), ("JWT_SECRET", "short")]).await;
        assert_ok(&r);
        assert!(!r.stdout.is_empty(), "{args:?}");
    }
}

/// docs/operations.md, "Going back to an older binary", on the embedded database: a one-off
/// command whose migration fails (the database knows a newer migration) stops the cluster it
/// started, as it does when it succeeds.
#[actix_web::test]
async fn a_one_off_command_stops_the_embedded_cluster_it_started_when_it_fails() {
    let root = EmbeddedDataRoot::new("synk-oneoff");
    let data_root = root.dir.display().to_string();
    // No DB_CONNECTION: the embedded cluster under DATA_ROOT.
    let env = [("DATA_ROOT", data_root.as_str())];
    let r = run(&["migrate"], &env).await;
    assert_ok(&r);
    assert_eq!(root.pg.postmaster_pid(), None, "a successful migrate stops its cluster");

    assert!(root.pg.start().expect("start the cluster"), "it was stopped");
    crate::helpers::connect(&root.pg.connection_string("synkronus"))
        .await
        .batch_execute(
            "INSERT INTO refinery_schema_history (version, name, applied_on, checksum)
             VALUES (9999, 'future', '2030-01-01T00:00:00Z', '0')",
        )
        .await
        .expect("a newer release's migration");
    root.pg.stop().expect("stop the cluster");

    for args in [
        &["migrate"][..],
        &["user", "create", "--username", "late", "--password", "password-123"][..],
        &["stats", "recount"][..],
        &["storage", "gc"][..],
        &["serve"][..],
    ] {
        let r = run(args, &env).await;
        assert_failed(&r, "migration V9999__future is missing");
        assert_eq!(
            root.pg.postmaster_pid(),
            None,
            "{args:?} left the embedded cluster running: {}",
            r.stderr
        );
    }
}
