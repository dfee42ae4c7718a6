//! Test harness: one embedded PostgreSQL cluster per test run (shared by every test of this
//! binary), a fresh database per test, and the real server on a random port.

use std::collections::HashMap;
use std::sync::OnceLock;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use synkronus::config::Config;
use synkronus::db::embedded::EmbeddedPostgres;
use synkronus::startup::Application;

pub const JWT_SECRET: &str = "test-secret-test-secret-test-secret-0123456789";
pub const ADMIN_PASSWORD: &str = "admin-password-1";

/// The cluster directory: short, under /tmp so the postgres user can reach it when we are root.
fn cluster_dir() -> std::path::PathBuf {
    std::env::var_os("SYNKRONUS_TEST_PG_DIR")
        .map(Into::into)
        .unwrap_or_else(|| std::path::PathBuf::from("/tmp/synkronus-test-pg"))
}

pub fn cluster() -> &'static EmbeddedPostgres {
    static CLUSTER: OnceLock<EmbeddedPostgres> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let pg = EmbeddedPostgres::new(cluster_dir(), None, "postgres")
            .expect("PostgreSQL binaries for tests")
            // Tests trade durability for speed; crash tests use their own cluster.
            .with_setting("fsync=off")
            .with_setting("synchronous_commit=off")
            .with_setting("full_page_writes=off")
            .with_setting("max_connections=500");
        let lock_path = cluster_dir().with_extension("lock");
        let lock = std::fs::File::create(&lock_path).expect("lock file");
        fs2::FileExt::lock_exclusive(&lock).expect("lock cluster");
        if pg.start().expect("start test cluster") {
            // Databases of earlier runs are dead weight (gigabytes after a few dozen runs); only
            // the process that starts the cluster may drop them, as nobody else can be using them.
            drop_leftover_databases(&pg.connection_string("postgres"));
        }
        drop(lock);
        pg
    })
}

fn drop_leftover_databases(conn: &str) {
    let conn = conn.to_string();
    // `cluster()` runs inside a test's runtime, which cannot block on another future itself.
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        runtime.block_on(async {
            let (client, connection) =
                tokio_postgres::connect(&conn, tokio_postgres::NoTls).await.expect("connect to test cluster");
            let driver = tokio::spawn(connection);
            let rows = client
                .query("SELECT datname FROM pg_database WHERE datname LIKE 't\\_%'", &[])
                .await
                .expect("list test databases");
            for row in rows {
                let name: String = row.get(0);
                let _ = client.batch_execute(&format!("DROP DATABASE IF EXISTS {name}")).await;
            }
            drop(client);
            let _ = driver.await;
        });
    })
    .join()
    .expect("dropping leftover test databases");
}

/// A fresh, empty database in the shared cluster; the server migrates it at start.
pub async fn fresh_database() -> String {
    let pg = cluster();
    let name = format!("t_{}", uuid::Uuid::new_v4().simple());
    let (client, conn) = tokio_postgres::connect(&pg.connection_string("postgres"), tokio_postgres::NoTls)
        .await
        .expect("connect to test cluster");
    let driver = tokio::spawn(conn);
    client.batch_execute(&format!("CREATE DATABASE {name}")).await.expect("create test database");
    drop(client);
    let _ = driver.await;
    name
}

/// Not every test module uses every field (the temp data root must live as long as the server).
#[allow(dead_code)]
pub struct TestApp {
    pub base: String,
    pub port: u16,
    pub client: reqwest::Client,
    pub db_conn: String,
    pub data_root: tempfile::TempDir,
    pub handle: actix_web::dev::ServerHandle,
    pub state: synkronus::state::AppState,
}

/// Environment for a test server; `overrides` replace or add variables.
pub fn test_env(
    db_conn: &str,
    data_root: &std::path::Path,
    overrides: &[(&str, &str)],
) -> HashMap<String, String> {
    let mut env: HashMap<String, String> = [
        ("PORT", "8080".to_string()),
        ("BIND_ADDRESS", "127.0.0.1".to_string()),
        ("DB_CONNECTION", db_conn.to_string()),
        ("DB_POOL_SIZE", "6".to_string()),
        ("JWT_SECRET", JWT_SECRET.to_string()),
        ("DATA_ROOT", data_root.display().to_string()),
        ("ADMIN_PASSWORD", ADMIN_PASSWORD.to_string()),
        ("RATE_LIMIT_LOGIN_PER_MIN", "10000".to_string()),
        ("LOG_LEVEL", "warn".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    for (k, v) in overrides {
        env.insert(k.to_string(), v.to_string());
    }
    env
}

impl TestApp {
    pub async fn spawn() -> TestApp {
        Self::spawn_with(&[]).await
    }

    pub async fn spawn_with(overrides: &[(&str, &str)]) -> TestApp {
        let db = fresh_database().await;
        let db_conn = cluster().connection_string(&db);
        Self::spawn_on(db_conn, overrides).await
    }

    /// Another server on an existing database (for multi-process and restart tests).
    pub async fn spawn_on(db_conn: String, overrides: &[(&str, &str)]) -> TestApp {
        let data_root = tempfile::tempdir().expect("temp data root");
        let env = test_env(&db_conn, data_root.path(), overrides);
        let mut config = Config::from_lookup(|k| env.get(k).cloned()).expect("test config");
        // Any free port: the contract's PORT range excludes 0, so tests set it after parsing.
        config.port = 0;
        let app = Application::build(config).await.expect("build app");
        let port = app.port();
        let handle = app.handle();
        let state = app.state().clone();
        actix_web::rt::spawn(app.run_until_stopped());
        TestApp {
            base: format!("http://127.0.0.1:{port}"),
            port,
            client: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .expect("client"),
            db_conn,
            data_root,
            handle,
            state,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub async fn login(&self, username: &str, password: &str) -> Value {
        let res = self
            .client
            .post(self.url("/auth/login"))
            .json(&json!({"username": username, "password": password}))
            .send()
            .await
            .expect("login request");
        assert_eq!(res.status(), StatusCode::OK, "login of {username} failed");
        res.json().await.expect("login body")
    }

    pub async fn admin_token(&self) -> String {
        self.login("admin", ADMIN_PASSWORD).await["token"].as_str().expect("token").to_string()
    }

    /// Creates a user with `role` and returns a token for it.
    pub async fn user_token(&self, admin: &str, username: &str, role: &str) -> String {
        let (status, body) = self
            .call(
                Method::POST,
                "/users",
                Some(admin),
                Some(json!({"username": username, "password": "password-123", "role": role})),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "create user: {body}");
        self.login(username, "password-123").await["token"].as_str().expect("token").to_string()
    }

    /// Sends a JSON request and returns (status, body as JSON or Null).
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let res = self.send(method, path, token, body).await;
        let status = res.status();
        let text = res.text().await.unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    pub async fn send(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> reqwest::Response {
        let mut req = self.client.request(method, self.url(path));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        req.send().await.expect("request")
    }
}

/// Asserts the standard error body (API.md 4) with `status` and `code`.
pub fn assert_error(status: StatusCode, body: &Value, expected_status: u16, code: &str) {
    assert_eq!(status.as_u16(), expected_status, "body: {body}");
    assert_eq!(body["code"], code, "body: {body}");
    assert_eq!(body["error"], code);
    assert_eq!(body["status"], expected_status);
    assert_eq!(body["type"], format!("urn:synkronus:error:{code}"));
    assert_eq!(body["message"], body["detail"]);
    assert!(body["request_id"].as_str().is_some_and(|s| !s.is_empty()));
}
