//! `synkronus import go-synkronus` (docs/api.md §19): a Go Synkronus deployment, built here from
//! the facts of §19.1 (its tables, `$2a$` bcrypt hashes, one global version counter, its folders)
//! in both schema generations, imported by the built binary into a fresh database, then served:
//! passwords, cursors, attachments, bundles, presence and the generation must all survive.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::{binary, cluster, connect, fresh_database, TestApp, JWT_SECRET};

#[derive(Clone, Copy, PartialEq)]
enum Gen {
    Dec2025,
    Y2026,
}

/// One observation as the source holds it.
#[derive(Clone)]
struct Obs {
    id: String,
    data: Value,
    version: i64,
    deleted: bool,
}

/// One attachment's operations, as (operation, version); its bytes when it has a file.
struct Att {
    id: String,
    ops: Vec<(&'static str, i64)>,
    bytes: Option<Vec<u8>>,
}

/// A Go deployment: its database and folders, and what it holds, for comparison.
struct GoSource {
    conn: String,
    dir: tempfile::TempDir,
    gen: Gen,
    users: Vec<(&'static str, &'static str, &'static str)>,
    observations: Vec<Obs>,
    attachments: Vec<Att>,
    counter: i64,
}

/// The tables of docs/api.md §19.1, as goose created them.
fn schema(gen: Gen) -> String {
    let mut sql = String::from(
        "CREATE TABLE goose_db_version (id serial PRIMARY KEY, version_id bigint NOT NULL,
             is_applied boolean NOT NULL, tstamp timestamp DEFAULT now());
         CREATE TABLE users (id uuid PRIMARY KEY, username varchar(255) UNIQUE NOT NULL,
             password_hash varchar(255) NOT NULL, role varchar(50) NOT NULL,
             created_at timestamp NOT NULL DEFAULT now(), updated_at timestamp NOT NULL DEFAULT now());
         CREATE TABLE observations (observation_id varchar(255) PRIMARY KEY, form_type varchar(255) NOT NULL,
             form_version varchar(50) NOT NULL, data jsonb NOT NULL, created_at timestamptz NOT NULL,
             updated_at timestamptz NOT NULL, synced_at timestamptz, deleted boolean NOT NULL DEFAULT false,
             version bigint NOT NULL, geolocation jsonb);
         CREATE INDEX observations_version ON observations (version);
         CREATE TABLE attachment_operations (id serial PRIMARY KEY, attachment_id varchar(255) NOT NULL,
             operation varchar(10) NOT NULL CHECK (operation IN ('create', 'update', 'delete')),
             client_id varchar(255), version bigint NOT NULL, size integer, content_type varchar(255),
             created_at timestamptz NOT NULL DEFAULT now());
         CREATE TABLE sync_version (id integer PRIMARY KEY, current_version bigint NOT NULL,
             updated_at timestamptz NOT NULL DEFAULT now());",
    );
    if gen == Gen::Y2026 {
        sql.push_str(
            "ALTER TABLE observations ADD COLUMN author text, ADD COLUMN device_id text, ADD COLUMN tags text[];
             ALTER TABLE sync_version ADD COLUMN repository_generation bigint DEFAULT 1,
                 ADD COLUMN last_reset_at timestamptz, ADD COLUMN last_reset_by text;
             CREATE TABLE user_client_presence (username varchar(255) REFERENCES users(username) ON DELETE CASCADE,
                 client_id text NOT NULL, last_seen_at timestamptz NOT NULL, last_data_version bigint,
                 app_bundle_version text, last_ode_version text, PRIMARY KEY (username, client_id));",
        );
    }
    sql
}

fn go_hash(password: &str) -> String {
    bcrypt::hash_with_result(password, 4).expect("bcrypt").format_for_version(bcrypt::Version::TwoA)
}

impl GoSource {
    /// The standard deployment: three users, 30 observations (some updated, one deleted),
    /// attachments created, updated and deleted, three bundle versions (one invalid), presence.
    async fn build(gen: Gen) -> GoSource {
        let conn = cluster().connection_string(&fresh_database().await);
        let db = connect(&conn).await;
        db.batch_execute(&schema(gen)).await.expect("Go schema");
        let mut source = GoSource {
            conn,
            dir: tempfile::tempdir().expect("dir"),
            gen,
            users: vec![
                ("goadmin", "go-admin-pass", "admin"),
                ("collector", "collector-pass", "read-write"),
                ("viewer", "viewer-pass", "read-only"),
            ],
            observations: Vec::new(),
            attachments: Vec::new(),
            counter: 0,
        };
        for (name, password, role) in &source.users {
            db.execute(
                "INSERT INTO users (id, username, password_hash, role) VALUES (gen_random_uuid(), $1, $2, $3)",
                &[name, &go_hash(password), role],
            )
            .await
            .expect("user");
        }
        // Every insert or update takes the next value of one counter, observations and
        // attachment operations alike.
        let mut attachments: BTreeMap<String, Att> = BTreeMap::new();
        for i in 0..30 {
            source.counter += 1;
            source.observations.push(Obs {
                id: format!("obs-{i:02}"),
                data: json!({"n": i, "name": format!("household {i}"), "nested": {"list": [1, 2.5, "x"]}}),
                version: source.counter,
                deleted: false,
            });
            if i % 7 == 3 {
                source.counter += 1;
                let id = format!("photo-{i}.jpg");
                let att = Att {
                    id: id.clone(),
                    ops: vec![("create", source.counter)],
                    bytes: Some(vec![i as u8; 1000 + i]),
                };
                attachments.insert(id, att);
            }
        }
        for (i, deleted) in [(3, false), (7, false), (5, true), (3, false)] {
            source.counter += 1;
            let obs = &mut source.observations[i];
            obs.version = source.counter;
            obs.deleted = deleted;
            obs.data = json!({"n": i, "updated": source.counter});
        }
        // photo-10: updated (new bytes); photo-17: deleted; note.txt: created late.
        source.counter += 1;
        let updated = attachments.get_mut("photo-10.jpg").expect("photo-10");
        updated.ops.push(("update", source.counter));
        updated.bytes = Some(b"new bytes of photo 10".to_vec());
        source.counter += 1;
        let deleted = attachments.get_mut("photo-17.jpg").expect("photo-17");
        deleted.ops.push(("delete", source.counter));
        deleted.bytes = None;
        source.counter += 1;
        let note = Att {
            id: "note.txt".into(),
            ops: vec![("create", source.counter)],
            bytes: Some(b"hello".to_vec()),
        };
        attachments.insert(note.id.clone(), note);
        source.attachments = attachments.into_values().collect();
        source.write_rows(&db).await;
        source.write_folders();
        source
    }

    async fn write_rows(&self, db: &tokio_postgres::Client) {
        for o in &self.observations {
            let n = o.data["n"].as_i64().expect("n");
            let data = o.data.to_string();
            let geo = (n % 2 == 0).then(|| json!({"latitude": 1.5, "longitude": n}).to_string());
            db.execute(
                "INSERT INTO observations (observation_id, form_type, form_version, data, created_at, updated_at,
                     synced_at, deleted, version, geolocation)
                 VALUES ($1, 'household', '1.0', $2::text::jsonb, now() - interval '2 days', now(), now(), $3, $4,
                     $5::text::jsonb)",
                &[&o.id, &data, &o.deleted, &o.version, &geo],
            )
            .await
            .expect("observation");
            if self.gen == Gen::Y2026 {
                db.execute(
                    "UPDATE observations SET author = 'collector', device_id = 'dev-1',
                         tags = ARRAY['a', $2::text] WHERE observation_id = $1",
                    &[&o.id, &format!("t{n}")],
                )
                .await
                .expect("2026 columns");
            }
        }
        for a in &self.attachments {
            for (op, version) in &a.ops {
                let size = a.bytes.as_ref().filter(|_| *op != "delete").map(|b| b.len() as i32);
                db.execute(
                    "INSERT INTO attachment_operations (attachment_id, operation, client_id, version, size, content_type)
                     VALUES ($1, $2::text, 'dev-1', $3, $4, CASE WHEN $2::text = 'delete' THEN NULL ELSE 'image/jpeg' END)",
                    &[&a.id, op, version, &size],
                )
                .await
                .expect("attachment operation");
            }
        }
        // The counter is ahead of the highest version (a rolled-back transaction took one).
        let counter = self.counter + 1;
        db.execute("INSERT INTO sync_version (id, current_version) VALUES (1, $1)", &[&counter])
            .await
            .expect("counter");
        if self.gen == Gen::Y2026 {
            db.batch_execute(
                "UPDATE sync_version SET repository_generation = 3;
                 INSERT INTO user_client_presence VALUES ('collector', 'dev-1', now(), 12, '0002', '1.4.0'),
                     ('viewer', 'tablet-9', now() - interval '3 days', NULL, NULL, '1.3.2');",
            )
            .await
            .expect("2026 rows");
        }
    }

    fn current_version(&self) -> i64 {
        self.counter + 1
    }

    fn attachments_dir(&self) -> PathBuf {
        match self.gen {
            Gen::Dec2025 => self.dir.path().join("attachments"),
            Gen::Y2026 => self.dir.path().join("data").join("attachments"),
        }
    }

    /// What `--bundle-versions` names: the versions folder (Dec 2025) or `<data>/app-bundle` (2026).
    fn bundles_arg(&self) -> PathBuf {
        match self.gen {
            Gen::Dec2025 => self.dir.path().join("app-bundle-versions"),
            Gen::Y2026 => self.dir.path().join("data").join("app-bundle"),
        }
    }

    fn versions_dir(&self) -> PathBuf {
        match self.gen {
            Gen::Dec2025 => self.bundles_arg(),
            Gen::Y2026 => self.bundles_arg().join("versions"),
        }
    }

    fn write_folders(&self) {
        let attachments = self.attachments_dir();
        std::fs::create_dir_all(&attachments).expect("attachments dir");
        for a in &self.attachments {
            if let Some(bytes) = &a.bytes {
                std::fs::write(attachments.join(&a.id), bytes).expect("attachment file");
            }
        }
        for version in ["0001", "0002", "0003"] {
            let dir = self.versions_dir().join(version);
            write_tree(&dir, &bundle_files(version));
        }
        match self.gen {
            Gen::Dec2025 => {
                std::fs::write(self.versions_dir().join("CURRENT_VERSION"), "0002").expect("CURRENT_VERSION");
                // The Go server's copy of the active version, which the import does not need.
                write_tree(&self.dir.path().join("app-bundles"), &bundle_files("0002"));
            }
            Gen::Y2026 => write_tree(&self.bundles_arg().join("active"), &bundle_files("0002")),
        }
    }

    /// Observations a device at cursor `v` must receive: id to (data, version).
    fn expected_after(&self, v: i64) -> BTreeMap<String, (Value, i64, bool)> {
        self.observations
            .iter()
            .filter(|o| o.version > v)
            .map(|o| (o.id.clone(), (o.data.clone(), o.version, o.deleted)))
            .collect()
    }

    /// The Go manifest after `v`: each attachment's latest operation, when it is after `v`.
    fn manifest_after(&self, v: i64) -> BTreeSet<(String, &'static str, i64)> {
        self.attachments
            .iter()
            .filter_map(|a| a.ops.last().map(|(op, version)| (a, *op, *version)))
            .filter(|(_, _, version)| *version > v)
            .map(|(a, op, version)| {
                (a.id.clone(), if op == "delete" { "delete" } else { "download" }, version)
            })
            .collect()
    }
}

/// A version folder as the Go server extracts it: the pushed archive plus its `APP_INFO.json`.
/// Version 0003 has no `app/index.html`, so it fails validation.
fn bundle_files(version: &str) -> Vec<(String, Vec<u8>)> {
    let mut files = vec![
        (
            "APP_INFO.json".to_string(),
            json!({"version": version.trim_start_matches('0')}).to_string().into_bytes(),
        ),
        (
            "forms/household/schema.json".to_string(),
            json!({"type": "object", "title": version}).to_string().into_bytes(),
        ),
        ("forms/household/ui.json".to_string(), br#"{"type": "VerticalLayout", "elements": []}"#.to_vec()),
    ];
    if version != "0003" {
        files.push(("app/index.html".to_string(), format!("<html>bundle {version}</html>").into_bytes()));
    }
    files
}

fn write_tree(dir: &Path, files: &[(String, Vec<u8>)]) {
    for (path, bytes) in files {
        let target = dir.join(path);
        std::fs::create_dir_all(target.parent().expect("parent")).expect("mkdir");
        std::fs::write(target, bytes).expect("write");
    }
}

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn assert_ok(&self) {
        assert_eq!(self.code, Some(0), "stdout: {}\nstderr: {}", self.stdout, self.stderr);
    }

    fn assert_failed(&self, mentions: &str) {
        assert!(self.code.is_some_and(|c| c != 0), "expected a failure: {}\n{}", self.stdout, self.stderr);
        let all = format!("{}{}", self.stdout, self.stderr);
        assert!(all.contains(mentions), "output lacks '{mentions}': {all}");
    }
}

/// A fresh target: its database and data root.
struct Target {
    conn: String,
    data_root: tempfile::TempDir,
    /// STORAGE_URL and AWS_* of a target whose files live in an S3-compatible store.
    storage_env: Vec<(String, String)>,
    _s3: Option<crate::helpers::S3Server>,
}

impl Target {
    async fn new() -> Target {
        Target {
            conn: cluster().connection_string(&fresh_database().await),
            data_root: tempfile::tempdir().expect("dir"),
            storage_env: Vec::new(),
            _s3: None,
        }
    }

    async fn with_s3() -> Target {
        let s3 = crate::helpers::S3Server::start().await;
        let bucket = s3.bucket().await;
        Target { storage_env: s3.env(&bucket), _s3: Some(s3), ..Target::new().await }
    }

    async fn import(&self, source: &GoSource, extra: &[&str]) -> Run {
        let attachments = source.attachments_dir();
        let bundles = source.bundles_arg();
        let mut args = vec!["import", "go-synkronus", "--source-db", &source.conn];
        let (a, b) = (attachments.to_str().expect("utf-8"), bundles.to_str().expect("utf-8"));
        args.extend(["--attachments", a, "--bundle-versions", b]);
        args.extend(extra);
        let mut cmd = binary(&args, self.data_root.path());
        cmd.env("DB_CONNECTION", &self.conn)
            .env("JWT_SECRET", JWT_SECRET)
            .env("DATA_ROOT", self.data_root.path())
            .env("LOG_LEVEL", "warn")
            .envs(self.storage_env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let out = tokio::time::timeout(Duration::from_secs(120), cmd.output())
            .await
            .expect("the import finishes within 120 s")
            .expect("run the import");
        Run {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    async fn serve(&self) -> TestApp {
        let root = self.data_root.path().to_str().expect("utf-8").to_string();
        let mut env: Vec<(&str, &str)> = vec![("DATA_ROOT", &root)];
        env.extend(self.storage_env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        TestApp::spawn_on(self.conn.clone(), &env).await
    }

    /// Rows in the tables an import writes (0 everywhere for an untouched target).
    async fn rows(&self) -> i64 {
        let db = connect(&self.conn).await;
        let exists: bool =
            db.query_one("SELECT to_regclass('records') IS NOT NULL", &[]).await.expect("regclass").get(0);
        if !exists {
            return 0;
        }
        db.query_one(
            "SELECT (SELECT count(*) FROM records) + (SELECT count(*) FROM users) + (SELECT count(*) FROM attachments)
                  + (SELECT count(*) FROM attachment_tombstones) + (SELECT count(*) FROM bundle_versions)
                  + (SELECT head FROM change_head)",
            &[],
        )
        .await
        .expect("count")
        .get(0)
    }

    /// Files under the data root (blobs and bundle versions), temp folders aside.
    fn files(&self) -> usize {
        walk(self.data_root.path())
            .into_iter()
            .filter(|p| !p.components().any(|c| c.as_os_str() == "tmp"))
            .count()
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return out };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

async fn manifest(app: &TestApp, token: &str, since: i64) -> (Value, BTreeSet<(String, &'static str, i64)>) {
    let body = json!({"client_id": "checker", "since_version": since});
    let (status, body) = app.call(Method::POST, "/attachments/manifest", Some(token), Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let ops = body["operations"]
        .as_array()
        .expect("operations")
        .iter()
        .map(|op| {
            let kind = if op["operation"] == "delete" { "delete" } else { "download" };
            (
                op["attachment_id"].as_str().expect("id").to_string(),
                kind,
                op["version"].as_i64().expect("version"),
            )
        })
        .collect();
    (body, ops)
}

async fn import_keeps_everything(gen: Gen, target: Target) {
    let source = GoSource::build(gen).await;
    let run = target.import(&source, &[]).await;
    run.assert_ok();
    assert!(
        run.stdout.contains("observations") && run.stdout.contains("deleted attachments"),
        "{}",
        run.stdout
    );
    assert!(run.stderr.contains("rows/s") && run.stderr.contains("ETA"), "a progress line: {}", run.stderr);
    assert!(run.stdout.contains("0003") && run.stdout.contains("fails validation"), "{}", run.stdout);
    let app = target.serve().await;

    // Passwords and roles survive; the bootstrap admin did not come back.
    let mut tokens = BTreeMap::new();
    for (name, password, role) in &source.users {
        let body = app.login(name, password).await;
        assert_eq!(body["user"]["role"], *role);
        tokens.insert(*name, body["token"].as_str().expect("token").to_string());
    }
    let (status, _) = app
        .call(
            Method::POST,
            "/auth/login",
            None,
            Some(json!({"username": "admin", "password": "admin-password-1"})),
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let admin = tokens["goadmin"].clone();
    let collector = tokens["collector"].clone();

    // Cursors survive: from any cursor V, exactly the records with a source version above V.
    let head = source.current_version();
    for v in [0, 5, 17, source.counter - 3, head] {
        let (records, cursor) = app.pull_all(&collector, &format!("cursor-{v}"), v, 7).await;
        assert_eq!(cursor, head, "the head is the source's counter");
        let got: BTreeMap<String, (Value, i64, bool)> = records
            .iter()
            .map(|r| {
                let id = r["observation_id"].as_str().expect("id").to_string();
                (id, (r["data"].clone(), r["version"].as_i64().expect("version"), r["deleted"] == true))
            })
            .collect();
        assert_eq!(got, source.expected_after(v), "pull after {v}");
        if gen == Gen::Y2026 {
            for r in &records {
                assert_eq!(r["author"], "collector", "{r}");
                assert_eq!(r["device_id"], "dev-1");
                assert_eq!(r["tags"][0], "a");
            }
        }
        assert!(records.iter().any(|r| r["geolocation"]["latitude"] == 1.5) || v > 20);
    }

    // A new push continues above the source's counter.
    let push = json!({"transmission_id": "after-import", "client_id": "cursor-0",
                      "records": [{"observation_id": "new-1", "form_type": "household", "data": {"x": 1}}]});
    let (status, body) = app.push(&collector, push).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["current_version"], head + 1, "{body}");

    // The attachment manifest from V lists the source's latest operations after V.
    for v in [0, 4, 20, source.counter - 2, head] {
        let (body, ops) = manifest(&app, &collector, v).await;
        assert_eq!(ops, source.manifest_after(v), "manifest after {v}");
        let deletes = ops.iter().filter(|(_, kind, _)| *kind == "delete").count();
        assert_eq!(body["operation_count"]["delete"], deletes);
    }
    let (status, spec) =
        app.call(Method::GET, "/attachments/manifest?after_change_id=0", Some(&collector), None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        spec["operations"].as_array().expect("ops").iter().any(|op| op["operation"] == "delete"),
        "{spec}"
    );
    for a in &source.attachments {
        let (status, _, bytes) = app.get_bytes(&collector, &format!("/attachments/{}", a.id)).await;
        match &a.bytes {
            Some(expected) => {
                assert_eq!(status, StatusCode::OK, "{}", a.id);
                assert_eq!(&bytes, expected, "{} byte-identical", a.id);
            }
            None => assert_eq!(status, StatusCode::NOT_FOUND, "{} was deleted", a.id),
        }
    }

    // Uploading a deleted id again brings it back: a download, no longer a delete.
    let (status, body) = app.put_bytes(&collector, "/attachments/photo-17.jpg", b"back again", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, ops) = manifest(&app, &collector, 0).await;
    let revived: Vec<_> = ops.iter().filter(|(id, _, _)| id == "photo-17.jpg").collect();
    assert_eq!(revived, [&("photo-17.jpg".to_string(), "download", head + 2)]);

    // Bundles: every version with its Go id, the active one served.
    let (status, versions) = app.call(Method::GET, "/app-bundle/versions", Some(&collector), None).await;
    assert_eq!(status, StatusCode::OK);
    let listed: BTreeMap<String, bool> = versions["versions"]
        .as_array()
        .expect("versions")
        .iter()
        .map(|v| (v["version"].as_str().expect("id").to_string(), v["active"] == true))
        .collect();
    let expected: BTreeMap<String, bool> = [("0001", false), ("0002", true), ("0003", false)]
        .into_iter()
        .map(|(v, a)| (v.to_string(), a))
        .collect();
    assert_eq!(listed, expected);
    let (status, manifest) = app.call(Method::GET, "/app-bundle/manifest", Some(&collector), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(manifest["version"], "0002");
    let (status, _, index) = app.get_bytes(&collector, "/app-bundle/download/app%2Findex.html").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(index, b"<html>bundle 0002</html>");
    let (status, _, info) =
        app.get_bytes(&collector, "/app-bundle/download/APP_INFO.json?version=0001").await;
    assert_eq!(status, StatusCode::OK, "Go's own file comes along byte for byte");
    assert_eq!(info, bundle_files("0001")[0].1);
    let (status, _, zip) = app.get_bytes(&collector, "/app-bundle/download-zip").await;
    assert_eq!(status, StatusCode::OK);
    assert!(zip.starts_with(b"PK"));

    // Presence and the generation.
    let (status, pull) = app
        .call(
            Method::POST,
            "/sync/pull",
            Some(&collector),
            Some(json!({"client_id": "gen", "since": {"version": 0}})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let generation = if gen == Gen::Y2026 { 3 } else { 1 };
    assert_eq!(pull["repository_generation"], generation);
    let (status, devices) = app.call(Method::GET, "/devices", Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK, "{devices}");
    let device = devices.as_array().expect("devices").iter().find(|d| d["client_id"] == "dev-1").cloned();
    if gen == Gen::Y2026 {
        let device = device.expect("dev-1 imported");
        assert_eq!(device["username"], "collector");
        assert_eq!(device["last_data_version"], 12);
        assert_eq!(device["app_bundle_version"], "0002");
        assert_eq!(device["client_version"], "1.4.0");
        assert!(devices.as_array().expect("devices").iter().any(|d| d["client_id"] == "tablet-9"));
    } else {
        assert!(device.is_none(), "the December 2025 schema has no presence");
    }

    // A repository reset removes the tombstones with the attachments.
    let (status, body) = app
        .call(
            Method::POST,
            "/admin/repository/reset",
            Some(&admin),
            Some(json!({"confirm": "RESET_REPOSITORY"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let generation = body["repository_generation"].as_i64().expect("generation");
    let (status, body) = app
        .call(
            Method::POST,
            "/attachments/manifest",
            Some(&collector),
            Some(
                json!({"client_id": "after-reset", "since_version": 0, "repository_generation": generation}),
            ),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["operations"], json!([]));
}

#[actix_web::test]
async fn import_of_a_december_2025_deployment_keeps_passwords_cursors_files_and_bundles() {
    import_keeps_everything(Gen::Dec2025, Target::new().await).await;
}

#[actix_web::test]
async fn import_into_an_s3_storage_url_keeps_files_and_bundles() {
    import_keeps_everything(Gen::Y2026, Target::with_s3().await).await;
}

#[actix_web::test]
async fn import_of_a_2026_deployment_keeps_presence_generation_and_record_fields_too() {
    import_keeps_everything(Gen::Y2026, Target::new().await).await;
}

#[actix_web::test]
async fn a_missing_file_and_a_file_without_row_are_reported_and_nothing_else_is_lost() {
    let source = GoSource::build(Gen::Y2026).await;
    // Some 2026 versions keep tags as jsonb rather than a text array.
    let db = connect(&source.conn).await;
    db.batch_execute("ALTER TABLE observations ALTER COLUMN tags TYPE jsonb USING to_jsonb(tags)")
        .await
        .expect("jsonb");
    let dir = source.attachments_dir();
    std::fs::remove_file(dir.join("photo-3.jpg")).expect("remove");
    std::fs::write(dir.join("orphan.bin"), b"nobody wrote me down").expect("orphan");
    let target = Target::new().await;
    let run = target.import(&source, &[]).await;
    run.assert_failed("counts differ for attachments");
    assert!(run.stdout.contains("photo-3.jpg") && run.stdout.contains("orphan.bin"), "{}", run.stdout);

    let app = target.serve().await;
    let token = app.login("collector", "collector-pass").await["token"].as_str().expect("token").to_string();
    let (records, head) = app.pull_all(&token, "check", 0, 50).await;
    assert_eq!(records.len(), source.observations.len());
    assert!(records.iter().all(|r| r["tags"][0] == "a" && r["tags"].as_array().map(Vec::len) == Some(2)));
    assert_eq!(head, source.current_version() + 1, "the file without row comes after the head");
    let (_, ops) = manifest(&app, &token, 0).await;
    let mut expected = source.manifest_after(0);
    expected.retain(|(id, _, _)| id != "photo-3.jpg");
    expected.insert(("orphan.bin".to_string(), "download", head));
    assert_eq!(ops, expected);
    let (status, _, bytes) = app.get_bytes(&token, "/attachments/orphan.bin").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(bytes, b"nobody wrote me down");
}

#[actix_web::test]
async fn dry_run_writes_nothing_and_a_non_empty_target_is_refused() {
    let source = GoSource::build(Gen::Dec2025).await;
    let target = Target::new().await;
    let run = target.import(&source, &["--dry-run"]).await;
    run.assert_ok();
    assert!(run.stdout.contains("dry run: nothing written"), "{}", run.stdout);
    assert_eq!(target.rows().await, 0);
    assert_eq!(target.files(), 0, "no blob, no bundle folder");

    // The bootstrap admin alone is allowed (and replaced); anything more is refused.
    let app = target.serve().await;
    app.admin_token().await;
    app.handle.stop(true).await;
    target.import(&source, &[]).await.assert_ok();
    target.import(&source, &[]).await.assert_failed("not empty");
    let other = Target::new().await;
    let app = other.serve().await;
    let admin = app.admin_token().await;
    let push = json!({"transmission_id": "t", "client_id": "c",
                      "records": [{"observation_id": "x", "form_type": "f", "data": {}}]});
    let (status, body) = app.push(&admin, push).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    other.import(&source, &[]).await.assert_failed("1 observations");
}

#[actix_web::test]
async fn a_source_that_dies_half_way_leaves_the_target_empty() {
    let source = GoSource::build(Gen::Dec2025).await;
    let db = connect(&source.conn).await;
    // 12,000 more observations, read in batches of 5,000: the source connection is terminated
    // while the stream reaches version 100,007, after the first batch was written to the target.
    // An ordered index scan makes the stream lazy; counting the rows does not trip the wire.
    db.batch_execute(
        "INSERT INTO observations (observation_id, form_type, form_version, data, created_at, updated_at, version)
             SELECT 'bulk-' || g, 'bulk', '1', jsonb_build_object('g', g), now(), now(), 100000 + g
             FROM generate_series(1, 12000) g;
         UPDATE sync_version SET current_version = 112000;
         ALTER TABLE observations RENAME TO observations_data;
         CREATE FUNCTION tripwire(v bigint) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
         BEGIN
             IF v = 107000 AND current_query() NOT LIKE '%count(%' THEN
                 PERFORM pg_terminate_backend(pg_backend_pid());
             END IF;
             RETURN true;
         END $$;
         CREATE VIEW observations AS SELECT * FROM observations_data WHERE tripwire(version);",
    )
    .await
    .expect("the tripwire");
    let name: String = db.query_one("SELECT current_database()::text", &[]).await.expect("name").get(0);
    db.batch_execute(&format!("ALTER DATABASE {name} SET enable_sort = off")).await.expect("lazy stream");
    let target = Target::new().await;
    let run = target.import(&source, &[]).await;
    run.assert_failed("reading observations from the source");
    assert!(run.stderr.contains("nothing was written"), "{}", run.stderr);
    assert_eq!(target.rows().await, 0, "the target is empty again");

    // A source whose versions collide is refused at the end, after the files were copied:
    // they are removed again.
    let source = GoSource::build(Gen::Dec2025).await;
    let db = connect(&source.conn).await;
    db.batch_execute("UPDATE attachment_operations SET version = 1 WHERE attachment_id = 'note.txt'")
        .await
        .expect("collide");
    let target = Target::new().await;
    let run = target.import(&source, &[]).await;
    run.assert_failed("more than once");
    assert_eq!(target.rows().await, 0);
    assert_eq!(
        target.files(),
        0,
        "copied blobs and bundle folders are removed: {:?}",
        walk(target.data_root.path())
    );
}

#[actix_web::test]
async fn an_unknown_role_is_refused_by_name_and_a_moving_source_is_warned_about() {
    let source = GoSource::build(Gen::Y2026).await;
    let db = connect(&source.conn).await;
    db.execute(
        "INSERT INTO users (id, username, password_hash, role) VALUES (gen_random_uuid(), 'root-ish', $1, 'superuser')",
        &[&go_hash("pw")],
    )
    .await
    .expect("user");
    let target = Target::new().await;
    let run = target.import(&source, &["--dry-run"]).await;
    run.assert_failed("'root-ish' (superuser)");
    let run = target.import(&source, &[]).await;
    run.assert_failed("'root-ish' (superuser)");
    assert_eq!(target.rows().await, 0, "refused before anything was written");
    assert_eq!(target.files(), 0);

    // A Go server still running while the import reads: its counter moves (here through another
    // connection, opened by the source itself while the import streams the observations).
    db.batch_execute(&format!(
        "DELETE FROM users WHERE username = 'root-ish';
         CREATE EXTENSION dblink;
         ALTER TABLE observations RENAME TO observations_data;
         CREATE FUNCTION still_running(v bigint) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
         BEGIN
             IF v = 1 AND current_query() NOT LIKE '%count(%' THEN
                 PERFORM dblink_exec('{}', 'UPDATE sync_version SET current_version = current_version + 1');
             END IF;
             RETURN true;
         END $$;
         CREATE VIEW observations AS SELECT * FROM observations_data WHERE still_running(version);",
        source.conn
    ))
    .await
    .expect("a moving counter");
    let target = Target::new().await;
    let run = target.import(&source, &[]).await;
    run.assert_ok();
    assert!(run.stdout.contains("source moved") && run.stdout.contains("still running"), "{}", run.stdout);
}
