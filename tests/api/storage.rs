//! File storage (docs/api.md §18.1): the storage interface's contract on both backends, the
//! attachment and bundle API on S3 (moto's server on loopback), and an object-store outage.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use reqwest::{Method, StatusCode};
use serde_json::json;
use synkronus::config::Config;
use synkronus::config::StorageUrl;
use synkronus::storage::{Area, Storage, StorageError};

use crate::helpers::{small_bundle, test_env, zip_bytes, S3Server, TestApp};

fn config(env: &[(String, String)]) -> Config {
    let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let vars = test_env("postgres://unused", std::path::Path::new("/tmp/unused"), &pairs);
    Config::from_lookup(|k| vars.get(k).cloned()).expect("config")
}

fn storage_at(env: &[(String, String)]) -> Storage {
    let config = config(env);
    Storage::open(&config.storage()).expect("storage")
}

async fn read(area: &Area, key: &str, range: Option<std::ops::Range<u64>>) -> Vec<u8> {
    use futures_util::TryStreamExt;
    let stream = area.get(key, range).await.expect("get");
    let chunks: Vec<Bytes> = stream.try_collect().await.expect("body");
    chunks.concat()
}

/// What every backend promises: create-only writes visible whole, ranges, listings, deletes.
async fn contract(area: &Area) {
    let scratch = tempfile::tempdir().expect("scratch");
    // Missing keys.
    assert_eq!(area.head("a/missing").await.expect("head"), None);
    assert!(matches!(area.get("a/missing", None).await.err(), Some(StorageError::NotFound(_))));
    area.delete("a/missing").await.expect("deleting nothing is fine");

    // Conditional create: the second write of a key is refused and the first bytes stay.
    area.put_bytes("a/one", Bytes::from_static(b"first")).await.expect("put");
    let again = area.put_bytes("a/one", Bytes::from_static(b"other")).await;
    assert!(matches!(again, Err(StorageError::AlreadyExists(_))), "{again:?}");
    assert_eq!(read(area, "a/one", None).await, b"first");

    // A big file goes up in parts and comes back whole; ranges give exact bytes.
    let big: Vec<u8> = (0..9 * 1024 * 1024 + 17).map(|i| (i * 7 % 251) as u8).collect();
    let src = scratch.path().join("big");
    std::fs::write(&src, &big).expect("write");
    area.put_file("b/big", &src).await.expect("put big");
    assert_eq!(area.head("b/big").await.expect("head"), Some(big.len() as u64));
    assert!(read(area, "b/big", None).await == big);
    assert!(read(area, "b/big", Some(1000..5000)).await == big[1000..5000]);
    let again = area.put_file("b/big", &src).await;
    assert!(matches!(again, Err(StorageError::AlreadyExists(_))), "{again:?}");

    // A folder goes up as one prefix; listings see whole files only.
    let dir = scratch.path().join("dir");
    std::fs::create_dir_all(dir.join("sub")).expect("dir");
    std::fs::write(dir.join("x.txt"), b"x").expect("x");
    std::fs::write(dir.join("sub").join("y.txt"), b"yy").expect("y");
    area.put_dir("v/1/", &dir).await.expect("put dir");
    let mut keys: Vec<(String, u64)> =
        area.list("v/").await.expect("list").into_iter().map(|e| (e.key, e.size)).collect();
    keys.sort();
    assert_eq!(keys, vec![("v/1/sub/y.txt".to_string(), 2), ("v/1/x.txt".to_string(), 1)]);
    assert_eq!(area.list("a/o").await.expect("list").len(), 1, "a name's beginning lists too");

    // Deletes.
    area.delete("a/one").await.expect("delete");
    assert_eq!(area.head("a/one").await.expect("head"), None);
    area.delete_prefix("v/").await.expect("delete prefix");
    assert!(area.list("v/").await.expect("list").is_empty());
    // A fetched copy appears whole.
    let copy = scratch.path().join("copy");
    area.fetch_to("b/big", &copy).await.expect("fetch");
    assert!(std::fs::read(&copy).expect("copy") == big);
    keys_round_trip_whatever_their_characters(area).await;
}

/// Names a bundle's ZIP entries may carry (docs/api.md §9.2 refuses only control characters,
/// backslashes and `.`/`..`/empty segments), some of which object_store percent-encodes: a
/// listing gives back exactly the keys written, so the sweep, gc and copy can use them.
async fn keys_round_trip_whatever_their_characters(area: &Area) {
    let names = [
        "odd/100% sure #1.txt",
        "odd/[draft] {v2}^~`|.json",
        "odd/what?*<\"quoted\">.html",
        "odd/a%2Fb%25c",
        "odd/sub dir/ünïcödé ✓.png",
        "odd/.hidden/..dots../x.y",
    ];
    for (i, name) in names.iter().enumerate() {
        area.put_bytes(name, Bytes::from(format!("file {i}"))).await.expect("put an odd name");
    }
    let again = area.put_bytes(names[0], Bytes::from_static(b"other")).await;
    assert!(matches!(again, Err(StorageError::AlreadyExists(_))), "{again:?}");
    let mut listed: Vec<String> = area.list("odd/").await.expect("list").into_iter().map(|e| e.key).collect();
    listed.sort();
    let mut expected: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    expected.sort();
    assert_eq!(listed, expected, "a listing gives back the keys as written");
    assert_eq!(area.list("odd/100% ").await.expect("list").len(), 1, "a beginning with odd characters");
    // Every listed key reads, sizes and deletes: it names the file it was listed for.
    for (i, name) in names.iter().enumerate() {
        assert_eq!(read(area, name, None).await, format!("file {i}").as_bytes(), "{name}");
        assert_eq!(area.head(name).await.expect("head"), Some(format!("file {i}").len() as u64));
    }
    for key in &listed {
        area.delete(key).await.expect("delete a listed key");
    }
    assert!(area.list("odd/").await.expect("list").is_empty(), "every listed key deleted its file");
}

#[actix_web::test]
async fn the_storage_contract_holds_on_local_folders() {
    let root = tempfile::tempdir().expect("root");
    let url = format!("file://{}", root.path().display());
    let storage = storage_at(&[("STORAGE_URL".into(), url)]);
    contract(&storage.attachments).await;
    // Today's layout: keys are relative paths under the area's folder.
    storage.attachments.put_bytes("blobs/ab/abc", Bytes::from_static(b"z")).await.expect("put");
    assert!(root.path().join("attachments/blobs/ab/abc").is_file());
}

#[actix_web::test]
async fn the_storage_contract_holds_on_s3_and_an_outage_is_an_error_within_10_s() {
    let mut s3 = S3Server::start().await;
    let bucket = s3.bucket().await;
    let mut env = s3.env(&bucket);
    env.retain(|(k, _)| k != "STORAGE_URL");
    env.push(("STORAGE_URL".into(), format!("s3://{bucket}/some/prefix")));
    let storage = storage_at(&env);
    storage.check().await.expect("the bucket answers");
    contract(&storage.bundles).await;

    // A bucket that does not exist is named.
    let mut missing = env.clone();
    missing.push(("STORAGE_URL".into(), "s3://no-such-bucket".into()));
    let err = storage_at(&missing).check_at_start().await.expect_err("missing bucket");
    assert!(err.to_string().starts_with("STORAGE_URL: "), "{err}");

    s3.stop();
    let started = Instant::now();
    let err = storage.bundles.head("x").await.expect_err("store stopped");
    assert!(err.is_unavailable(), "{err}");
    let err = storage.bundles.put_bytes("x", Bytes::from_static(b"x")).await.expect_err("store stopped");
    assert!(err.is_unavailable(), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
}

/// A TCP relay to `upstream` that spoils its first connection: the request reaches the store,
/// which acts on it, but its answer never comes back; the client's connection is reset instead
/// (what a loaded container network did to the compose cluster's first attachment once). Returns
/// the relay's port and how many connections it accepted.
async fn relay_losing_its_first_answer(upstream: u16) -> (u16, Arc<AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
    let port = listener.local_addr().expect("relay address").port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let first = counter.fetch_add(1, Ordering::SeqCst) == 0;
            tokio::spawn(async move {
                let Ok(mut server) = TcpStream::connect(("127.0.0.1", upstream)).await else { return };
                if !first {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    return;
                }
                let mut request = vec![0u8; 64 * 1024];
                let mut answer = [0u8; 1];
                loop {
                    tokio::select! {
                        read = client.read(&mut request) => match read {
                            Ok(0) | Err(_) => return,
                            Ok(n) => {
                                if server.write_all(&request[..n]).await.is_err() {
                                    return;
                                }
                            }
                        },
                        _ = server.read(&mut answer) => {
                            let _ = client.set_zero_linger();
                            return;
                        }
                    }
                }
            });
        }
    });
    (port, accepted)
}

#[actix_web::test]
async fn a_write_whose_answer_is_lost_is_tried_again_and_finds_its_own_object() {
    let s3 = S3Server::start().await;
    let bucket = s3.bucket().await;
    let (relay, accepted) = relay_losing_its_first_answer(s3.port).await;
    let mut env = s3.env(&bucket);
    env.retain(|(k, _)| k != "AWS_ENDPOINT_URL");
    env.push(("AWS_ENDPOINT_URL".into(), format!("http://127.0.0.1:{relay}")));
    let storage = storage_at(&env);

    // The first try wrote the object but its answer was lost: the second finds it, ours.
    storage.attachments.put_bytes("blobs/ab/photo", Bytes::from_static(b"pixels")).await.expect("put");
    assert!(accepted.load(Ordering::SeqCst) >= 2, "the write was not tried again");
    assert_eq!(read(&storage.attachments, "blobs/ab/photo", None).await, b"pixels");

    // A key that holds other bytes is still refused, and keeps them.
    let again = storage.attachments.put_bytes("blobs/ab/photo", Bytes::from_static(b"others")).await;
    assert!(matches!(again, Err(StorageError::AlreadyExists(_))), "{again:?}");
    assert_eq!(read(&storage.attachments, "blobs/ab/photo", None).await, b"pixels");
}

#[test]
fn bad_storage_urls_refuse_to_start_naming_the_variable() {
    for bad in ["ftp://x", "s3://", "file://relative/path"] {
        let vars = test_env("postgres://unused", std::path::Path::new("/tmp"), &[("STORAGE_URL", bad)]);
        let err = Config::from_lookup(|k| vars.get(k).cloned()).expect_err("refused");
        assert!(err.to_string().starts_with("STORAGE_URL: "), "{err}");
    }
    let vars = test_env("postgres://unused", std::path::Path::new("/tmp"), &[("STORAGE_URL", "s3://b-1/p")]);
    let config = Config::from_lookup(|k| vars.get(k).cloned()).expect("config");
    assert_eq!(config.storage_url, Some(StorageUrl::S3 { bucket: "b-1".into(), prefix: "p/".into() }));
}

#[actix_web::test]
async fn attachment_uploads_and_downloads_on_s3() {
    crate::attachments::raw_and_multipart_uploads_round_trip_on(TestApp::with_s3(&[]).await).await;
}

#[actix_web::test]
async fn attachment_reuploads_and_conflicts_on_s3() {
    crate::attachments::reuploads_are_idempotent_and_conflicts_keep_the_stored_bytes_on(
        TestApp::with_s3(&[]).await,
    )
    .await;
}

#[actix_web::test]
async fn bundle_push_switch_and_downloads_on_s3() {
    crate::bundles::upstream_bundles_push_switch_changes_and_downloads_on(TestApp::with_s3(&[]).await).await;
}

#[actix_web::test]
async fn export_jobs_on_s3() {
    crate::export::export_job_runs_from_start_to_download_on(TestApp::with_s3(&[]).await).await;
}

#[actix_web::test]
async fn bundle_retention_on_s3() {
    let app = TestApp::with_s3(&[("MAX_VERSIONS_KEPT", "2")]).await;
    crate::bundles::retention_keeps_the_active_and_newest_and_never_reuses_ids_on(app).await;
}

async fn status_within(app: &TestApp, method: Method, path: &str, token: &str, limit: Duration) -> u16 {
    let started = Instant::now();
    let status = app.send(method, path, Some(token), None).await.status().as_u16();
    assert!(started.elapsed() < limit, "{path} took {:?}", started.elapsed());
    status
}

#[actix_web::test]
async fn an_object_store_outage_gives_503s_keeps_sync_and_cached_bundles_and_recovers() {
    let mut app = TestApp::with_s3(&[]).await;
    let admin = app.admin_token().await;
    let (status, _) = app.put_bytes(&admin, "/attachments/a.bin", b"attached", None).await;
    assert_eq!(status, StatusCode::OK);
    app.push_bundle(&admin, small_bundle("20250101-000001", "cached"), true).await;
    let (_, body) = app.call(Method::GET, "/health", None, None).await;
    assert_eq!(body["storage"], "up", "{body}");

    let port = app.s3.as_ref().expect("s3").port;
    app.s3.as_mut().expect("s3").stop();

    // Routes that need the store: 503, quickly, never a 500 or a hang.
    let limit = Duration::from_secs(10);
    assert_eq!(status_within(&app, Method::GET, "/attachments/a.bin", &admin, limit).await, 503);
    let started = Instant::now();
    let (status, body) = app.put_bytes(&admin, "/attachments/b.bin", b"new", None).await;
    assert_eq!(status.as_u16(), 503, "{body}");
    assert_eq!(body["code"], "SERVICE_UNAVAILABLE");
    assert!(started.elapsed() < limit);
    let (_, body) = app.call(Method::GET, "/health", None, None).await;
    assert_eq!((body["status"].as_str(), body["storage"].as_str()), (Some("OK"), Some("down")), "{body}");

    // Sync does not need the store.
    let push = json!({"transmission_id": "t-1", "client_id": "c", "records": [
        {"observation_id": "o-1", "form_type": "ft", "form_version": "1", "data": {"k": 1}}]});
    let (status, body) = app.push(&admin, push).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (records, _) = app.pull_all(&admin, "c2", 0, 100).await;
    assert_eq!(records.len(), 1);

    // The active bundle version is served from this node's cache.
    let (_, body) = app.call(Method::GET, "/app-bundle/manifest", Some(&admin), None).await;
    assert_eq!(body["version"], "20250101-000001", "{body}");
    let (status, _, bytes) = app.get_bytes(&admin, "/app-bundle/download/app/index.html").await;
    assert_eq!((status, bytes), (StatusCode::OK, b"<html>cached</html>".to_vec()));
    let (status, _, zip) = app.get_bytes(&admin, "/app-bundle/download-zip").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(zip, small_bundle("20250101-000001", "cached"));

    // Back again (a new, empty store at the same address): uploads work at once.
    let restarted = S3Server::start_on(port).await;
    restarted.create_bucket(&bucket_of(&app)).await;
    let (status, body) = app.put_bytes(&admin, "/attachments/b.bin", b"new", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _, bytes) = app.get_bytes(&admin, "/attachments/b.bin").await;
    assert_eq!((status, bytes), (StatusCode::OK, b"new".to_vec()));
    app.s3 = Some(restarted);
}

fn bucket_of(app: &TestApp) -> String {
    match app.state.config.storage_url.as_ref() {
        Some(StorageUrl::S3 { bucket, .. }) => bucket.clone(),
        _ => panic!("not on S3"),
    }
}

#[actix_web::test]
async fn storage_copy_moves_a_deployment_to_s3_resumably() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let (status, _) = app.put_bytes(&admin, "/attachments/moved.bin", b"moved bytes", None).await;
    assert_eq!(status, StatusCode::OK);
    app.push_bundle(&admin, small_bundle("20250101-000009", "moved"), true).await;

    let s3 = S3Server::start().await;
    let bucket = s3.bucket().await;
    let env = s3.env(&bucket);
    let target = storage_at(&env);
    let scratch = tempfile::tempdir().expect("scratch");
    let first =
        synkronus::storage::ops::copy_all(&app.state.storage, &target, scratch.path()).await.expect("copy");
    assert!(first.copied >= 7 && first.skipped == 0, "{first:?}");
    // Again: nothing to do (an interrupted copy resumes the same way).
    let again =
        synkronus::storage::ops::copy_all(&app.state.storage, &target, scratch.path()).await.expect("copy");
    assert_eq!((again.copied, again.skipped), (0, first.copied), "{again:?}");

    // A server on the same database with the new STORAGE_URL serves everything.
    let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let moved = TestApp::spawn_on(app.db_conn.clone(), &pairs).await;
    let (status, _, bytes) = moved.get_bytes(&admin, "/attachments/moved.bin").await;
    assert_eq!((status, bytes), (StatusCode::OK, b"moved bytes".to_vec()));
    let (status, _, bytes) = moved.get_bytes(&admin, "/app-bundle/download/app/index.html").await;
    assert_eq!((status, bytes), (StatusCode::OK, b"<html>moved</html>".to_vec()));
}

/// A bundle whose files have names the S3 client escapes: served, copied to local folders under
/// the same names, and removed whole by retention (docs/storage.md, "Tests").
#[actix_web::test]
async fn bundle_files_with_escaped_names_are_served_copied_and_removed_on_s3() {
    let app = TestApp::with_s3(&[("MAX_VERSIONS_KEPT", "1")]).await;
    let admin = app.admin_token().await;
    let odd = "app/img/100% #1 [ünï].png";
    let manifest = json!({"version": "20250101-000020", "name": "S", "entryPoint": "app/index.html"});
    let bundle = zip_bytes(&[
        ("manifest.json", manifest.to_string().as_bytes()),
        ("app/index.html", b"<html>odd</html>"),
        (odd, b"odd bytes"),
        ("forms/household/schema.json", br#"{"type": "object"}"#),
        ("forms/household/ui.json", br#"{"type": "VerticalLayout", "elements": []}"#),
    ]);
    app.push_bundle(&admin, bundle, true).await;
    let url = "/app-bundle/download/app/img/100%25%20%231%20%5B%C3%BCn%C3%AF%5D.png";
    let (status, _, bytes) = app.get_bytes(&admin, url).await;
    assert_eq!((status, bytes), (StatusCode::OK, b"odd bytes".to_vec()));

    let root = tempfile::tempdir().expect("root");
    let target = storage_at(&[("STORAGE_URL".into(), format!("file://{}", root.path().display()))]);
    let scratch = tempfile::tempdir().expect("scratch");
    synkronus::storage::ops::copy_all(&app.state.storage, &target, scratch.path()).await.expect("copy");
    let copied = root.path().join("app-bundles/versions/20250101-000020").join(odd);
    assert_eq!(std::fs::read(&copied).expect("copied under its own name"), b"odd bytes");

    // Retention removes the version whole: no escaped name is left behind.
    app.push_bundle(&admin, small_bundle("20250101-000021", "next"), true).await;
    let left = app.state.storage.bundles.list("versions/20250101-000020").await.expect("list");
    assert!(left.is_empty(), "{:?}", left.iter().map(|e| &e.key).collect::<Vec<_>>());
}

#[actix_web::test]
async fn the_orphan_sweep_removes_old_files_without_a_row_only() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let (status, body) = app.put_bytes(&admin, "/attachments/kept.bin", b"kept", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    app.push_bundle(&admin, small_bundle("20250101-000010", "kept"), true).await;
    let area = &app.state.storage.attachments;
    let bundles = &app.state.storage.bundles;
    area.put_bytes("blobs/ff/ffff", Bytes::from_static(b"orphan")).await.expect("orphan");
    bundles.put_bytes("versions/ghost.zip", Bytes::from_static(b"zip")).await.expect("ghost");
    let old = std::time::SystemTime::now() - Duration::from_secs(7200);
    for path in
        [area.local_path("blobs/ff/ffff"), bundles.local_path("versions/ghost.zip")].into_iter().flatten()
    {
        std::fs::File::options().write(true).open(path).expect("open").set_modified(old).expect("mtime");
    }
    // Every file the rows name is old too: the rows keep them.
    for entry in walkdir::WalkDir::new(app.data_root.path()).into_iter().flatten() {
        if entry.file_type().is_file() && !entry.path().to_string_lossy().contains("postgres") {
            let _ = std::fs::File::options().write(true).open(entry.path()).and_then(|f| f.set_modified(old));
        }
    }
    area.put_bytes("blobs/ee/eeee", Bytes::from_static(b"young orphan")).await.expect("young");
    let pool = &app.state.pool;
    let candidates = synkronus::storage::sweep::attachment_candidates(area, pool).await.expect("candidates");
    let removed =
        synkronus::storage::sweep::remove_attachment_orphans(area, pool, candidates).await.expect("sweep");
    assert_eq!(removed, 1);
    assert_eq!(synkronus::storage::sweep::sweep_bundles(bundles, pool).await.expect("sweep"), 1);
    assert_eq!(area.head("blobs/ff/ffff").await.expect("head"), None);
    assert!(area.head("blobs/ee/eeee").await.expect("head").is_some(), "younger than an hour");
    let (status, _, bytes) = app.get_bytes(&admin, "/attachments/kept.bin").await;
    assert_eq!((status, bytes), (StatusCode::OK, b"kept".to_vec()));
    let (status, _, _) = app.get_bytes(&admin, "/app-bundle/download-zip").await;
    assert_eq!(status, StatusCode::OK);
}

#[actix_web::test]
async fn a_file_storage_url_keeps_todays_layout_under_its_folder() {
    let root = tempfile::tempdir().expect("root");
    let folder = root.path().join("not-yet-created");
    let url = format!("file://{}", folder.display());
    let app = TestApp::spawn_with(&[("STORAGE_URL", &url)]).await;
    let admin = app.admin_token().await;
    let (status, body) = app.put_bytes(&admin, "/attachments/f.bin", b"on a file url", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let sha = body["sha256"].as_str().map(str::to_string).unwrap_or_default();
    let blobs: Vec<_> = walkdir::WalkDir::new(folder.join("attachments/blobs"))
        .into_iter()
        .flatten()
        .filter(|e| e.file_type().is_file())
        .collect();
    assert_eq!(blobs.len(), 1, "{sha}");
    app.push_bundle(&admin, small_bundle("20250101-000011", "file"), true).await;
    assert!(folder.join("app-bundles/versions/20250101-000011/app/index.html").is_file());
    assert!(folder.join("app-bundles/versions/20250101-000011.zip").is_file());
    let (status, _, bytes) = app.get_bytes(&admin, "/app-bundle/download/app/index.html").await;
    assert_eq!((status, bytes), (StatusCode::OK, b"<html>file</html>".to_vec()));
    let (status, _, bytes) = app.get_bytes(&admin, "/attachments/f.bin").await;
    assert_eq!((status, bytes), (StatusCode::OK, b"on a file url".to_vec()));
}
