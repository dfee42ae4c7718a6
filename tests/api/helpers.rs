//! The test kit: one embedded PostgreSQL cluster per test run (shared by every test of this
//! binary) and a fresh database per test; the real server, in process ([`TestApp`]) or as the
//! built binary in a child process ([`ChildServer`]); and [`Api`], the HTTP client both share
//! (login, push, pull, uploads).
//!
//! Every server it starts hashes passwords at bcrypt cost 4 (`SYNKRONUS_TEST_BCRYPT_COST`, which
//! only a debug build accepts), and an in-process server's clock can be moved forward
//! ([`TestApp::advance_clock`]) instead of sleeping through a lifetime.

use std::collections::{BTreeMap, HashMap};
use std::io::{Cursor, Write};
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use reqwest::multipart::{Form, Part};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use synkronus::config::Config;
use synkronus::db::embedded::EmbeddedPostgres;
use synkronus::startup::Application;

mod s3;
pub use s3::S3Server;

pub const JWT_SECRET: &str = "test-secret-test-secret-test-secret-0123456789";
pub const ADMIN_PASSWORD: &str = "admin-password-1";
/// bcrypt's lowest cost: a test server's hashes take microseconds instead of a quarter second.
const TEST_BCRYPT_COST: &str = "4";

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

/// The server's HTTP API as a client sees it.
#[derive(Clone)]
pub struct Api {
    pub base: String,
    pub client: reqwest::Client,
}

impl Api {
    pub fn new(base: String, client: reqwest::Client) -> Self {
        Api { base, client }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// Logs in and returns the login body; anything but 200 fails the test.
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

    /// `POST /sync/push` with `body`.
    pub async fn push(&self, token: &str, body: Value) -> (StatusCode, Value) {
        self.call(Method::POST, "/sync/push", Some(token), Some(body)).await
    }

    /// Pulls everything after `after` (synkronus dialect), following has_more; returns all records
    /// and the final cursor, asserting the pagination invariants on every page.
    pub async fn pull_all(&self, token: &str, client: &str, mut after: i64, limit: i64) -> (Vec<Value>, i64) {
        let mut out = Vec::new();
        loop {
            let body = json!({"client_id": client, "since": {"version": after}});
            let (status, body) =
                self.call(Method::POST, &format!("/sync/pull?limit={limit}"), Some(token), Some(body)).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            let records = body["records"].as_array().expect("records array").clone();
            let cutoff = body["change_cutoff"].as_i64().expect("cutoff");
            let current = body["current_version"].as_i64().expect("current_version");
            let has_more = body["has_more"].as_bool().expect("has_more");
            let mut last = after;
            for r in &records {
                let v = r["version"].as_i64().expect("version");
                assert!(v > last, "P2: change_ids strictly increasing ({v} after {last})");
                last = v;
            }
            assert!(cutoff <= current, "P4");
            if has_more {
                assert!(cutoff > after && cutoff >= 1, "P3");
                assert!(body["next_page_token"].is_string());
            } else {
                assert!(body.get("next_page_token").is_none(), "synkronus omits the token at the end");
            }
            out.extend(records);
            if !has_more {
                return (out, current);
            }
            after = cutoff;
        }
    }

    /// `PUT path` with `bytes` as the raw body (an attachment upload).
    pub async fn put_bytes(
        &self,
        token: &str,
        path: &str,
        bytes: &[u8],
        content_type: Option<&str>,
    ) -> (StatusCode, Value) {
        let mut req = self.client.put(self.url(path)).bearer_auth(token).body(bytes.to_vec());
        if let Some(t) = content_type {
            req = req.header("content-type", t);
        }
        let res = req.send().await.expect("upload");
        let status = res.status();
        (status, res.json().await.unwrap_or(Value::Null))
    }

    /// `GET path` as bytes, with its status and headers.
    pub async fn get_bytes(
        &self,
        token: &str,
        path: &str,
    ) -> (StatusCode, reqwest::header::HeaderMap, Vec<u8>) {
        let res = self.client.get(self.url(path)).bearer_auth(token).send().await.expect("download");
        let (status, headers) = (res.status(), res.headers().clone());
        (status, headers, res.bytes().await.expect("body").to_vec())
    }

    /// Sends `bytes` as the multipart part `field` to `path` (`POST /app-bundle/push` or
    /// `PUT /app-bundle`), with `activate` as a form field when given.
    pub async fn upload_bundle(
        &self,
        token: Option<&str>,
        method: Method,
        path: &str,
        field: &str,
        bytes: Vec<u8>,
        activate: Option<&str>,
    ) -> (StatusCode, Value) {
        let part = Part::bytes(bytes).file_name("bundle.zip").mime_str("application/zip").expect("mime");
        let mut form = Form::new().part(field.to_string(), part);
        if let Some(activate) = activate {
            form = form.text("activate", activate.to_string());
        }
        let mut request = self.client.request(method, self.url(path)).multipart(form);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.expect("upload request");
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// `POST /app-bundle/push`, which must succeed; returns its body.
    pub async fn push_bundle(&self, token: &str, bytes: Vec<u8>, activate: bool) -> Value {
        let (status, body) = self
            .upload_bundle(
                Some(token),
                Method::POST,
                "/app-bundle/push",
                "bundle",
                bytes,
                activate.then_some("true"),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body
    }
}

/// The server in this process, on a fresh database and a temporary data root.
pub struct TestApp {
    pub api: Api,
    pub port: u16,
    pub db_conn: String,
    /// Must live as long as the server.
    pub data_root: tempfile::TempDir,
    pub handle: actix_web::dev::ServerHandle,
    pub state: synkronus::state::AppState,
    /// The object store of a server started by [`TestApp::with_s3`].
    pub s3: Option<S3Server>,
}

impl Deref for TestApp {
    type Target = Api;

    fn deref(&self) -> &Api {
        &self.api
    }
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
        (synkronus::config::test_only::BCRYPT_COST_VAR, TEST_BCRYPT_COST.to_string()),
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
        let client =
            reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client");
        TestApp {
            api: Api::new(format!("http://127.0.0.1:{port}"), client),
            port,
            db_conn,
            data_root,
            handle,
            state,
            s3: None,
        }
    }

    /// A server whose files live in a fresh bucket of its own S3-compatible server.
    pub async fn with_s3(overrides: &[(&str, &str)]) -> TestApp {
        let s3 = S3Server::start().await;
        let bucket = s3.bucket().await;
        let mut env = s3.env(&bucket);
        env.extend(overrides.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let mut app = Self::spawn_with(&pairs).await;
        app.s3 = Some(s3);
        app
    }

    /// Moves this server's clock forward: tokens, export files and rate buckets age at once.
    pub fn advance_clock(&self, by: Duration) {
        self.state.clock.advance(by);
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("local addr").port()
}

/// The built server binary, with a clean environment (only `PATH` and the test bcrypt cost) in
/// `dir`, so no `.env` file and no variable of the test process leaks in.
pub fn binary(args: &[&str], dir: &Path) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_synkronus"));
    cmd.args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env(synkronus::config::test_only::BCRYPT_COST_VAR, TEST_BCRYPT_COST)
        .current_dir(dir)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

/// A plain connection to `conn`, driven by a task of the test's runtime.
pub async fn connect(conn: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(conn, tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(connection);
    client
}

/// The server binary as a child process, so that it can die the way a real process does.
pub struct ChildServer {
    child: tokio::process::Child,
    pub api: Api,
    pub db_conn: String,
    /// Its stdout and stderr.
    pub log: PathBuf,
    /// The data root and log of a server started by [`ChildServer::spawn`].
    _scratch: Option<tempfile::TempDir>,
}

impl Deref for ChildServer {
    type Target = Api;

    fn deref(&self) -> &Api {
        &self.api
    }
}

impl ChildServer {
    /// `synkronus serve` on a fresh database, with a data root and log of its own.
    pub async fn spawn(overrides: &[(&str, &str)]) -> Self {
        let db = fresh_database().await;
        let scratch = tempfile::tempdir().expect("scratch dir");
        let data_root = scratch.path().join("data");
        std::fs::create_dir_all(&data_root).expect("data root");
        let log = scratch.path().join("server.log");
        let mut server = Self::start(&cluster().connection_string(&db), &data_root, log, overrides).await;
        server._scratch = Some(scratch);
        server
    }

    /// Starts `synkronus serve` and waits until it is ready. An empty value removes a variable.
    pub async fn start(db_conn: &str, data_root: &Path, log: PathBuf, overrides: &[(&str, &str)]) -> Self {
        let port = free_port();
        let mut env: BTreeMap<String, String> = test_env(db_conn, data_root, overrides).into_iter().collect();
        env.insert("PORT".into(), port.to_string());
        env.retain(|_, v| !v.is_empty());
        let out = std::fs::File::create(&log).expect("log file");
        let err = out.try_clone().expect("log file");
        let child = binary(&["serve"], data_root)
            .envs(env)
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("spawn the server");
        let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().expect("client");
        let mut server = ChildServer {
            child,
            api: Api::new(format!("http://127.0.0.1:{port}"), client),
            db_conn: db_conn.to_string(),
            log,
            _scratch: None,
        };
        for _ in 0..600 {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("the server exited ({status}): {}", server.log_text());
            }
            if let Ok(res) = server.client.get(server.url("/ready")).send().await {
                if res.status() == StatusCode::OK {
                    return server;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the server did not become ready in 60 s: {}", server.log_text());
    }

    /// The server's process id (its `/proc` entry: resident memory, open files).
    pub fn pid(&self) -> u32 {
        self.child.id().expect("running child")
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = self.pid() as i32;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal).expect("signal the server");
    }

    /// Whether the process is still the one started (it did not exit meanwhile).
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILL: no drain, no cleanup, exactly like a power cut for this process.
    pub async fn kill(&mut self) {
        self.signal(nix::sys::signal::Signal::SIGKILL);
        self.child.wait().await.expect("reap the child");
    }

    /// SIGTERM, then the exit status, which must come `within`.
    pub async fn terminate(&mut self, within: Duration) -> std::process::ExitStatus {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        self.exit_status(within).await
    }

    /// The exit status, which must come `within`.
    pub async fn exit_status(&mut self, within: Duration) -> std::process::ExitStatus {
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(status) => status.expect("reap the child"),
            Err(_) => panic!("the server did not exit within {within:?}"),
        }
    }
}

/// A ZIP of `entries`, stored as given.
pub fn zip_bytes(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut writer = zip::ZipWriter::new(Cursor::new(Vec::new()));
    for (name, bytes) in entries {
        writer.start_file(*name, zip::write::SimpleFileOptions::default()).expect("start entry");
        writer.write_all(bytes).expect("write entry");
    }
    writer.finish().expect("finish zip").into_inner()
}

/// A small valid bundle declaring `version`, with one form whose schema carries `marker`.
pub fn small_bundle(version: &str, marker: &str) -> Vec<u8> {
    let manifest = json!({"version": version, "name": "Survey", "entryPoint": "app/index.html"}).to_string();
    let schema = json!({"type": "object", "properties": {"marker": {"type": "string", "const": marker}}});
    let schema = schema.to_string();
    zip_bytes(&[
        ("manifest.json", manifest.as_bytes()),
        ("app/index.html", format!("<html>{marker}</html>").as_bytes()),
        ("app/assets/app.js", b"console.log(1)"),
        ("forms/household/schema.json", schema.as_bytes()),
        ("forms/household/ui.json", br#"{"type": "VerticalLayout", "elements": []}"#),
    ])
}

/// Asserts the standard error body (docs/api.md §4) with `status` and `code`.
pub fn assert_error(status: StatusCode, body: &Value, expected_status: u16, code: &str) {
    assert_eq!(status.as_u16(), expected_status, "body: {body}");
    assert_eq!(body["code"], code, "body: {body}");
    assert_eq!(body["error"], code);
    assert_eq!(body["status"], expected_status);
    assert_eq!(body["type"], format!("urn:synkronus:error:{code}"));
    assert_eq!(body["message"], body["detail"]);
    assert!(body["request_id"].as_str().is_some_and(|s| !s.is_empty()));
}

/// A response header as text, "" when it is absent or not text.
pub fn header(res: &reqwest::Response, name: impl reqwest::header::AsHeaderName) -> &str {
    res.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

pub fn gunzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes).read_to_end(&mut out).expect("a valid gzip stream");
    out
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(bytes))
}

/// Polls an export job until it leaves queued/running (60 s at most); answers its last state.
pub async fn wait_for_job(app: &TestApp, token: &str, id: &str) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (status, body) =
            app.call(Method::GET, &format!("/dataexport/jobs/{id}"), Some(token), None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        if body["state"] == "done" || body["state"] == "failed" {
            return body;
        }
        assert!(std::time::Instant::now() < deadline, "job did not finish: {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
