//! Backup and restore (docs/api.md §18.4, docs/operations.md): the built binary's `backup`,
//! `backup --verify` and `restore` against servers of the test kit, their databases and folders.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::{
    binary, cluster, connect, fresh_database, small_bundle, test_env, Api, ChildServer, TestApp,
};

struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// Runs the binary with the configuration of a server on `db_conn` and `data_root`.
async fn synkronus(args: &[&str], db_conn: &str, data_root: &Path) -> Run {
    std::fs::create_dir_all(data_root).expect("data root");
    let mut cmd = binary(args, data_root);
    cmd.envs(test_env(db_conn, data_root, &[]));
    let out = tokio::time::timeout(Duration::from_secs(180), cmd.output())
        .await
        .expect("the binary finishes within 180 s")
        .expect("run the binary");
    Run {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn assert_ok(run: &Run) {
    assert!(run.ok, "stdout: {}\nstderr: {}", run.stdout, run.stderr);
}

/// Fails with exactly one line on stderr that mentions `mentions`.
fn assert_refused(run: &Run, mentions: &str) {
    assert!(!run.ok, "expected a refusal: {}", run.stdout);
    assert_eq!(run.stderr.trim().lines().count(), 1, "one line: {}", run.stderr);
    assert!(run.stderr.contains(mentions), "stderr lacks '{mentions}': {}", run.stderr);
}

/// A fresh database and an empty data root to restore into.
async fn new_target() -> (String, tempfile::TempDir) {
    let conn = cluster().connection_string(&fresh_database().await);
    (conn, tempfile::tempdir().expect("target root"))
}

/// Every table of the app's schema (but refinery's) as its sorted rows in text.
async fn dump(conn: &str) -> BTreeMap<String, String> {
    let db = connect(conn).await;
    let tables = db
        .query(
            "SELECT relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = current_schema() AND c.relkind = 'r' AND relname <> 'refinery_schema_history'",
            &[],
        )
        .await
        .expect("tables");
    let mut out = BTreeMap::new();
    for row in tables {
        let name: String = row.get(0);
        let sql = format!("SELECT coalesce(string_agg(x, E'\\n' ORDER BY x), '') FROM (SELECT t::text AS x FROM \"{name}\" t) s");
        out.insert(name, db.query_one(&sql, &[]).await.expect("rows").get(0));
    }
    out
}

/// How many tables the target's schema holds: 0 when a refused restore wrote nothing.
async fn table_count(conn: &str) -> i64 {
    let tables = "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                  WHERE n.nspname = current_schema() AND c.relkind = 'r'";
    scalar(conn, tables).await
}

/// Pushes one record `id` in a transmission of its own, and checks it was accepted.
async fn push_one(api: &Api, token: &str, id: &str) {
    let body = json!({"transmission_id": format!("t-{id}"), "client_id": "c", "records": [
        {"observation_id": id, "form_type": "f", "data": {"a": 1}}]});
    let (status, answer) = api.push(token, body).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
}

/// `synkronus backup --output path` of the app's database and data root.
async fn backup_to(app: &TestApp, path: &Path) -> Run {
    synkronus(&["backup", "--output", path.to_str().expect("utf-8")], &app.db_conn, app.data_root.path())
        .await
}

async fn scalar(conn: &str, sql: &str) -> i64 {
    connect(conn).await.query_one(sql, &[]).await.expect(sql).get(0)
}

/// Drops what may change with every request (presence, last sign-in, computation times).
fn stable(mut value: Value) -> Value {
    fn strip(v: &mut Value) {
        match v {
            Value::Object(map) => {
                for key in ["presence", "last_login", "lastLogin", "computedAt", "repository_generation"] {
                    map.remove(key);
                }
                map.values_mut().for_each(strip);
            }
            Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut value);
    value
}

const COMPARED: [&str; 6] = [
    "/users",
    "/observations",
    "/observations/o1/history",
    "/app-bundle/versions",
    "/app-bundle/manifest",
    "/formspecs",
];
const DOWNLOADS: [&str; 4] = [
    "/attachments/photo-1.png",
    "/attachments/photo-1.png?quality=small",
    "/attachments/dir/notes.bin",
    "/app-bundle/download/app/index.html",
];

/// What a client sees of everything the round trip compares.
async fn observe(api: &Api, admin: &str) -> (Vec<Value>, Vec<Vec<u8>>) {
    let mut answers = Vec::new();
    for path in COMPARED {
        let (status, body) = api.call(Method::GET, path, Some(admin), None).await;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
        answers.push(stable(body));
    }
    let mut files = Vec::new();
    for path in DOWNLOADS {
        let (status, _, bytes) = api.get_bytes(admin, path).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        files.push(bytes);
    }
    (answers, files)
}

fn png(width: u32, height: u32) -> Vec<u8> {
    let img =
        image::RgbImage::from_fn(width, height, |x, y| image::Rgb([(x % 256) as u8, (y % 256) as u8, 7]));
    let mut out = std::io::Cursor::new(Vec::new());
    image::DynamicImage::ImageRgb8(img).write_to(&mut out, image::ImageFormat::Png).expect("encode");
    out.into_inner()
}

/// Users, records with history, a transmission, attachments (one with a variant), two bundle
/// versions (the older active), a form spec and a device's presence.
async fn populate(app: &TestApp, admin: &str) -> (String, Value, Value) {
    app.user_token(admin, "reader", "read-only").await;
    let writer = app.user_token(admin, "writer", "read-write").await;
    let first = json!({"transmission_id": "tx-1", "client_id": "dev-1", "records": [
        {"observation_id": "o1", "form_type": "household", "data": {"n": 1}, "tags": ["a"], "author": "w"},
        {"observation_id": "o2", "form_type": "household", "data": {"n": 2}}]});
    let (status, answer) = app.push(&writer, first.clone()).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let second = json!({"transmission_id": "tx-2", "client_id": "dev-1", "records": [
        {"observation_id": "o1", "form_type": "household", "data": {"n": 10}},
        {"observation_id": "o2", "form_type": "household", "data": {"n": 2}, "deleted": true}]});
    let (status, answer_2) = app.push(&writer, second).await;
    assert_eq!(status, StatusCode::OK, "{answer_2}");
    let (status, body) =
        app.put_bytes(&writer, "/attachments/photo-1.png", &png(600, 400), Some("image/png")).await;
    assert!(status.is_success(), "{body}");
    let notes: Vec<u8> = (0..70_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let (status, body) = app.put_bytes(&writer, "/attachments/dir/notes.bin", &notes, None).await;
    assert!(status.is_success(), "{body}");
    app.push_bundle(admin, small_bundle("1.0.0", "first"), true).await;
    app.push_bundle(admin, small_bundle("2.0.0", "second"), false).await;
    let spec = json!({"formType": "visit", "version": "1", "schema": {"type": "object"},
        "uischema": {"type": "VerticalLayout", "elements": []}});
    let (status, body) = app.call(Method::POST, "/formspecs", Some(admin), Some(spec)).await;
    assert!(status.is_success(), "{body}");
    let cursor = answer_2["current_version"].clone();
    wait_for_presence(app, admin, |d| d["client_id"] == "dev-1" && d["last_data_version"] == cursor).await;
    (writer, first, answer)
}

/// Polls `/devices` until a row satisfies `written`: presence is written in batches about once a
/// second, and a dump taken before the last batch lands differs from one taken after.
async fn wait_for_presence(app: &TestApp, admin: &str, written: impl Fn(&Value) -> bool) {
    for _ in 0..100 {
        let (_, devices) = app.call(Method::GET, "/devices", Some(admin), None).await;
        if devices.as_array().is_some_and(|d| d.iter().any(&written)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the presence row was not written");
}

#[actix_web::test]
async fn a_round_trip_restores_everything_and_raises_the_generation() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let (writer, first_push, first_answer) = populate(&app, &admin).await;
    let seen = observe(&app, &admin).await;
    // The last sighting that is written at once (not throttled): the manifest `observe` read,
    // which tells presence the bundle version the admin's (header-less) device was shown.
    let shown = seen.0[COMPARED.iter().position(|p| *p == "/app-bundle/manifest").expect("manifest")]
        ["version"]
        .clone();
    wait_for_presence(&app, &admin, |d| {
        d["username"] == "admin" && d["client_id"] == "" && d["app_bundle_version"] == shown
    })
    .await;

    let archive = app.data_root.path().join("backup.zip");
    let archive_arg = archive.to_str().expect("utf-8 path");
    let run = backup_to(&app, &archive).await;
    assert_ok(&run);
    assert!(run.stdout.contains("backup written"), "{}", run.stdout);
    assert_ok(&synkronus(&["backup", "--verify", archive_arg], &app.db_conn, app.data_root.path()).await);

    let (target, root) = new_target().await;
    let run = synkronus(&["restore", "--input", archive_arg], &target, root.path()).await;
    assert_ok(&run);
    assert!(run.stdout.contains("generation raised to 2"), "{}", run.stdout);

    // The database is the source's, row for row, but for the raised generation.
    let (mut before, mut after) = (dump(&app.db_conn).await, dump(&target).await);
    let (head_before, head_after) = (before.remove("change_head"), after.remove("change_head"));
    assert_eq!(before, after);
    assert_eq!(head_before.map(|h| h.replace(",1)", ",2)")), head_after);

    let restored =
        TestApp::spawn_on(target.clone(), &[("DATA_ROOT", root.path().to_str().expect("utf-8"))]).await;
    // The source's tokens still work: same users, same token generations, same secret.
    assert_eq!(observe(&restored, &admin).await, seen);
    assert_eq!(restored.login("reader", "password-123").await["user"]["role"], "read-only");

    // A retried push is still a replay: same answer, nothing stored again.
    let head = scalar(&target, "SELECT head FROM change_head").await;
    let (status, replay) = restored.push(&writer, first_push).await;
    assert_eq!(status, StatusCode::OK, "{replay}");
    assert_eq!(stable(replay), stable(first_answer));
    assert_eq!(scalar(&target, "SELECT head FROM change_head").await, head);

    // A device still on the old generation is told to reset.
    let res = restored
        .client
        .post(restored.url("/sync/push"))
        .bearer_auth(&writer)
        .header("x-repository-generation", "1")
        .json(&json!({"transmission_id": "late", "client_id": "dev-1", "records": []}))
        .send()
        .await
        .expect("push");
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert_eq!(res.headers()["x-repository-generation"], "2");
}

/// One push of `RECORDS` records sharing a batch tag.
const RECORDS: usize = 20;

async fn storm(api: Api, token: String, task: usize, acked: Arc<Mutex<Vec<String>>>, stop: Arc<AtomicBool>) {
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        let batch = format!("p{task}-{n}");
        let records: Vec<Value> = (0..RECORDS)
            .map(|i| json!({"observation_id": format!("{batch}-{i}"), "form_type": "storm", "data": {"batch": batch}}))
            .collect();
        let body = json!({"transmission_id": batch, "client_id": format!("dev-{task}"), "records": records});
        if api.push(&token, body).await.0 == StatusCode::OK {
            acked.lock().expect("lock").push(batch);
        }
        n += 1;
    }
}

#[actix_web::test]
async fn a_backup_during_a_push_storm_restores_one_moment() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let token = app.user_token(&admin, "stormer", "read-write").await;
    let acked = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let pushers: Vec<_> = (0..4)
        .map(|task| tokio::spawn(storm(app.api.clone(), token.clone(), task, acked.clone(), stop.clone())))
        .collect();
    while acked.lock().expect("lock").len() < 12 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before: Vec<String> = acked.lock().expect("lock").clone();
    let archive = app.data_root.path().join("storm.zip");
    assert_ok(&backup_to(&app, &archive).await);
    stop.store(true, Ordering::Relaxed);
    for pusher in pushers {
        pusher.await.expect("pusher");
    }
    assert!(acked.lock().expect("lock").len() > before.len(), "the storm went on during the backup");

    let (target, root) = new_target().await;
    let archive_arg = archive.to_str().expect("utf-8 path");
    assert_ok(&synkronus(&["restore", "--input", archive_arg], &target, root.path()).await);
    let db = connect(&target).await;
    let rows = db
        .query("SELECT data::json->>'batch', count(*) FROM records GROUP BY 1", &[])
        .await
        .expect("batches");
    let batches: BTreeMap<String, i64> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    for (batch, count) in &batches {
        assert_eq!(*count, RECORDS as i64, "push {batch} is half there");
    }
    for batch in &before {
        assert!(batches.contains_key(batch), "push {batch}, acknowledged before the backup, is missing");
    }
    // The change head, the statistics and the rows belong to the same moment.
    let max: i64 =
        db.query_one("SELECT coalesce(max(change_id), 0) FROM records", &[]).await.expect("max").get(0);
    assert_eq!(scalar(&target, "SELECT head FROM change_head").await, max);
    let counted: i64 = db
        .query_one("SELECT coalesce(sum(n), 0)::bigint FROM observation_counts", &[])
        .await
        .expect("sum")
        .get(0);
    assert_eq!(counted, batches.len() as i64 * RECORDS as i64);
}

/// The files under a folder, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    walkdir::WalkDir::new(dir)
        .into_iter()
        .flatten()
        .filter(|e| e.file_type().is_file())
        .map(|e| e.into_path())
        .collect()
}

#[actix_web::test]
async fn damaged_archives_are_refused_and_nothing_is_written() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    push_one(&app, &admin, "x1").await;
    let (status, _) = app.put_bytes(&admin, "/attachments/blob.bin", &[9u8; 5000], None).await;
    assert!(status.is_success());
    let dir = tempfile::tempdir().expect("archives");
    let good = dir.path().join("good.zip");
    assert_ok(&backup_to(&app, &good).await);
    let bytes = std::fs::read(&good).expect("archive");
    let mut flipped = bytes.clone();
    flipped[bytes.len() / 2] ^= 0x20;
    let truncated = &bytes[..bytes.len() * 2 / 3];

    for (name, damaged) in [("flipped.zip", flipped.as_slice()), ("truncated.zip", truncated)] {
        let path = dir.path().join(name);
        std::fs::write(&path, damaged).expect("write");
        let arg = path.to_str().expect("utf-8");
        let (target, root) = new_target().await;
        assert_refused(&synkronus(&["backup", "--verify", arg], &target, root.path()).await, "is unusable");
        assert_refused(&synkronus(&["restore", "--input", arg], &target, root.path()).await, "is unusable");
        assert_eq!(table_count(&target).await, 0, "{name}: the target database was written");
        assert!(files_under(root.path()).is_empty(), "{name}: files were written");
    }
    assert_ok(
        &synkronus(
            &["backup", "--verify", good.to_str().expect("utf-8")],
            &app.db_conn,
            app.data_root.path(),
        )
        .await,
    );
}

#[actix_web::test]
async fn a_non_empty_target_is_refused_unless_forced() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    push_one(&app, &admin, "kept").await;
    let archive = app.data_root.path().join("b.zip");
    let arg = archive.to_str().expect("utf-8");
    assert_ok(&backup_to(&app, &archive).await);

    // A target that served a while: a record and an attachment of its own.
    let (target, scratch) = new_target().await;
    let root = scratch.path().join("data");
    std::fs::create_dir_all(&root).expect("root");
    let mut other = ChildServer::start(&target, &root, scratch.path().join("log"), &[]).await;
    let other_admin = other.admin_token().await;
    let reset = json!({"confirm": "RESET_REPOSITORY"});
    let (status, body) =
        other.call(Method::POST, "/admin/repository/reset", Some(&other_admin), Some(reset)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    push_one(&other, &other_admin, "theirs").await;
    let (status, _) = other.put_bytes(&other_admin, "/attachments/theirs.bin", &[1u8; 100], None).await;
    assert!(status.is_success());
    // Not while that server runs.
    assert_refused(
        &synkronus(&["restore", "--input", arg, "--force"], &target, &root).await,
        "stop the server",
    );
    other.terminate(Duration::from_secs(30)).await;

    let run = synkronus(&["restore", "--input", arg], &target, &root).await;
    assert_refused(&run, "--force");
    assert!(run.stderr.contains("not empty"), "{}", run.stderr);
    assert_eq!(scalar(&target, "SELECT count(*) FROM records WHERE id = 'theirs'").await, 1);

    assert_ok(&synkronus(&["restore", "--input", arg, "--force"], &target, &root).await);
    assert_eq!(scalar(&target, "SELECT count(*) FROM records WHERE id = 'theirs'").await, 0);
    assert_eq!(scalar(&target, "SELECT count(*) FROM records WHERE id = 'kept'").await, 1);
    assert_eq!(scalar(&target, "SELECT count(*) FROM attachments").await, 0);
    // Above the archive's generation (1) and the replaced repository's (2, after its reset).
    assert_eq!(scalar(&target, "SELECT repository_generation FROM change_head").await, 3);
    assert!(
        files_under(&root.join("attachments").join("blobs")).is_empty(),
        "the replaced repository's files are gone"
    );
}

/// Copies the archive at `src` to `dst` with its manifest edited, sealed again as `backup` does.
fn with_edited_manifest(src: &Path, dst: &Path, edit: impl FnOnce(&mut Value)) {
    use sha2::Digest;
    use std::io::{Read, Write};
    let mut archive = zip::ZipArchive::new(std::fs::File::open(src).expect("open")).expect("zip");
    let mut out = zip::ZipWriter::new(std::fs::File::create(dst).expect("create"));
    let mut edit = Some(edit);
    for i in 0..archive.len() {
        let mut entry = archive.by_index(i).expect("entry");
        let name = entry.name().expect("name").into_owned();
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes).expect("read");
        if name == "manifest.json" {
            let mut manifest: Value = serde_json::from_slice(&bytes).expect("manifest");
            (edit.take().expect("one manifest"))(&mut manifest);
            bytes = serde_json::to_vec(&manifest).expect("json");
        }
        out.start_file(name, zip::write::SimpleFileOptions::default()).expect("start");
        out.write_all(&bytes).expect("write");
    }
    out.set_comment(format!("synkronus-backup sha256={}", "0".repeat(64))).expect("comment");
    out.finish().expect("finish");
    let mut bytes = std::fs::read(dst).expect("read");
    let covered = bytes.len() - 64;
    let digest = hex::encode(sha2::Sha256::digest(&bytes[..covered]));
    bytes[covered..].copy_from_slice(digest.as_bytes());
    std::fs::write(dst, bytes).expect("seal");
}

#[actix_web::test]
async fn an_archive_of_a_newer_schema_is_refused_and_nothing_is_written() {
    let app = TestApp::spawn().await;
    let dir = tempfile::tempdir().expect("archives");
    let good = dir.path().join("good.zip");
    assert_ok(&backup_to(&app, &good).await);
    let newer = dir.path().join("newer.zip");
    with_edited_manifest(&good, &newer, |manifest| {
        manifest["schema_version"] = json!(9999);
        manifest["migrations"]
            .as_array_mut()
            .expect("migrations")
            .push(json!({"version": 9999, "name": "future"}));
    });
    let arg = newer.to_str().expect("utf-8");
    // Intact as an archive, but from a release this binary does not know.
    assert_ok(&synkronus(&["backup", "--verify", arg], &app.db_conn, app.data_root.path()).await);
    let (target, root) = new_target().await;
    assert_refused(&synkronus(&["restore", "--input", arg], &target, root.path()).await, "V9999__future");
    assert_eq!(table_count(&target).await, 0, "the target database was written");
}

/// docs/operations.md, "Going back to an older binary": a database migrated further than the
/// binary knows stops it at start with the migration's name.
#[actix_web::test]
async fn an_older_binary_refuses_a_database_with_an_unknown_migration() {
    let (target, root) = new_target().await;
    assert_ok(&synkronus(&["migrate"], &target, root.path()).await);
    connect(&target)
        .await
        .batch_execute(
            "INSERT INTO refinery_schema_history (version, name, applied_on, checksum)
             VALUES (9999, 'future', '2030-01-01T00:00:00Z', '0')",
        )
        .await
        .expect("a newer release's migration");
    for command in ["migrate", "serve"] {
        let run = synkronus(&[command], &target, root.path()).await;
        assert!(!run.ok, "{command} started on an unknown schema");
        assert!(
            run.stderr.contains("migrations failed: migration V9999__future is missing from the filesystem"),
            "{}",
            run.stderr
        );
    }
}
