//! Crash safety (issue 9): a push storm against a server killed with SIGKILL, and against a
//! PostgreSQL that crashes. Afterwards every acknowledged push is present exactly once, every retry
//! of an unacknowledged push (same transmission id) is applied exactly once, pullers resume without
//! gaps, and no half-written attachment or app bundle is visible through the API.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use synkronus::db::embedded::EmbeddedPostgres;
use tokio::io::AsyncWriteExt;
use tokio::task::JoinHandle;

use crate::helpers::{cluster, fresh_database, small_bundle, Api, ChildServer, TestApp};

const RECORDS_PER_PUSH: usize = 3;
const PUSHERS: usize = 6;
/// No request of a storm may hang: a server or database that died must show as a failed request.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// What the crashed servers run with: retention would remove acknowledged bundle versions the
/// test wants to see again.
const SERVER_ENV: &[(&str, &str)] = &[("DB_POOL_SIZE", "8"), ("MAX_VERSIONS_KEPT", "1000")];

fn record_id(task: usize, n: usize, k: usize) -> String {
    format!("r-{task}-{n}-{k}")
}

fn push_body(task: usize, n: usize) -> Value {
    let records: Vec<Value> = (0..RECORDS_PER_PUSH)
        .map(|k| json!({"observation_id": record_id(task, n, k), "form_type": "crash", "data": {"t": task, "n": n, "k": k}}))
        .collect();
    json!({"transmission_id": format!("crash-{task}-{n}"), "client_id": format!("dev-{task}"), "records": records})
}

/// What happened to one push: the status, or None when no answer came (connection lost).
pub(crate) type Outcome = Option<u16>;
/// (pusher, push number, outcome).
pub(crate) type Push = (usize, usize, Outcome);

async fn send_push(api: &Api, token: &str, task: usize, n: usize) -> Outcome {
    let res = api
        .client
        .post(api.url("/sync/push"))
        .bearer_auth(token)
        .timeout(REQUEST_TIMEOUT)
        .json(&push_body(task, n))
        .send()
        .await;
    match res {
        Ok(res) => {
            let status = res.status().as_u16();
            // An acknowledgement counts only once its body has fully arrived.
            res.bytes().await.ok().map(|_| status)
        }
        Err(_) => None,
    }
}

pub(crate) struct Storm {
    stop: Arc<AtomicBool>,
    pub(crate) acked: Arc<AtomicUsize>,
    /// Pushes answered with anything but 200, or not answered.
    pub(crate) not_acked: Arc<AtomicUsize>,
    pushers: Vec<tokio::task::JoinHandle<Vec<(usize, Outcome)>>>,
    puller: tokio::task::JoinHandle<(BTreeMap<String, i64>, i64)>,
}

/// Pushers with unique transmission ids and one puller. With `stop_on_lost`, a pusher stops at
/// the first push that got no answer (the server is gone); otherwise it goes on until `stop`.
pub(crate) fn start_storm(api: &Api, token: &str, stop_on_lost: bool) -> Storm {
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicUsize::new(0));
    let not_acked = Arc::new(AtomicUsize::new(0));
    let mut pushers = Vec::new();
    for task in 0..PUSHERS {
        let (api, token, stop) = (api.clone(), token.to_string(), stop.clone());
        let (acked, not_acked) = (acked.clone(), not_acked.clone());
        pushers.push(tokio::spawn(async move {
            let mut outcomes = Vec::new();
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                let outcome = send_push(&api, &token, task, n).await;
                outcomes.push((n, outcome));
                if outcome != Some(200) {
                    not_acked.fetch_add(1, Ordering::SeqCst);
                }
                match outcome {
                    Some(200) => {
                        acked.fetch_add(1, Ordering::SeqCst);
                        n += 1;
                    }
                    None if stop_on_lost => break,
                    // As a device does: the same push again, same transmission id, a bit later.
                    _ => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
            outcomes
        }));
    }
    let (api, token, stop_p) = (api.clone(), token.to_string(), stop.clone());
    let puller = tokio::spawn(async move {
        let mut seen = BTreeMap::new();
        let mut cursor = 0i64;
        while !stop_p.load(Ordering::SeqCst) {
            let res = api
                .client
                .post(api.url("/sync/pull?limit=7"))
                .bearer_auth(&token)
                .timeout(REQUEST_TIMEOUT)
                .json(&json!({"client_id": "crash-puller", "since": {"version": cursor}}))
                .send()
                .await;
            let body = match res {
                Ok(r) if r.status() == StatusCode::OK => r.json::<Value>().await.ok(),
                Ok(_) => None,
                Err(_) if stop_on_lost => break,
                Err(_) => None,
            };
            let Some(body) = body else {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            };
            cursor = absorb_page(&body, cursor, &mut seen);
        }
        (seen, cursor)
    });
    Storm { stop, acked, not_acked, pushers, puller }
}

/// Adds a pull page to `seen`, checking the change_ids rise strictly; returns the next cursor.
pub(crate) fn absorb_page(body: &Value, cursor: i64, seen: &mut BTreeMap<String, i64>) -> i64 {
    let mut last = cursor;
    for r in body["records"].as_array().expect("records") {
        let v = r["version"].as_i64().expect("version");
        assert!(v > last, "change_ids strictly increasing ({v} after {last})");
        last = v;
        let id = r["observation_id"].as_str().expect("id").to_string();
        assert!(seen.insert(id.clone(), v).is_none(), "{id} pulled twice");
    }
    if body["has_more"] == true {
        body["change_cutoff"].as_i64().expect("change_cutoff")
    } else {
        body["current_version"].as_i64().expect("current_version")
    }
}

/// Stops the storm; returns every pusher's outcomes and what the puller had seen.
pub(crate) async fn finish_storm(storm: Storm) -> (Vec<Push>, (BTreeMap<String, i64>, i64)) {
    storm.stop.store(true, Ordering::SeqCst);
    let mut outcomes = Vec::new();
    for (task, p) in storm.pushers.into_iter().enumerate() {
        outcomes.extend(p.await.expect("pusher").into_iter().map(|(n, o)| (task, n, o)));
    }
    (outcomes, storm.puller.await.expect("puller"))
}

pub(crate) async fn wait_for_acks(acked: &AtomicUsize, at_least: usize) {
    for _ in 0..600 {
        if acked.load(Ordering::SeqCst) >= at_least {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the storm made no progress");
}

/// Everything after `cursor`, following has_more, into `seen`; returns the final cursor.
async fn pull_rest(api: &Api, token: &str, mut cursor: i64, seen: &mut BTreeMap<String, i64>) -> i64 {
    loop {
        let res = api
            .client
            .post(api.url("/sync/pull?limit=100"))
            .bearer_auth(token)
            .timeout(REQUEST_TIMEOUT)
            .json(&json!({"client_id": "crash-puller", "since": {"version": cursor}}))
            .send()
            .await
            .expect("pull");
        assert_eq!(res.status(), StatusCode::OK);
        let body: Value = res.json().await.expect("pull body");
        cursor = absorb_page(&body, cursor, seen);
        if body["has_more"] != true {
            return cursor;
        }
    }
}

/// Retries every unacknowledged push with its transmission id, then checks the whole log.
pub(crate) async fn retry_and_verify(
    api: &Api,
    token: &str,
    (mut pulled, cursor): (BTreeMap<String, i64>, i64),
    outcomes: Vec<Push>,
) {
    // Per push, whether it was acknowledged and whether some attempt was not.
    let mut pushes: BTreeMap<(usize, usize), (bool, bool)> = BTreeMap::new();
    for &(task, n, outcome) in &outcomes {
        if let Some(status) = outcome {
            assert!(
                status == 200 || status == 503,
                "push {task}-{n} answered {status}: only 200 or 503 are acceptable"
            );
        }
        let entry = pushes.entry((task, n)).or_default();
        entry.0 |= outcome == Some(200);
        entry.1 |= outcome != Some(200);
    }
    let mut expected = BTreeSet::new();
    let mut retried = Vec::new();
    for (&(task, n), &(acked, failed_once)) in &pushes {
        expected.extend((0..RECORDS_PER_PUSH).map(|k| record_id(task, n, k)));
        if !acked {
            let status = send_push(api, token, task, n).await;
            assert_eq!(status, Some(200), "retry of {task}-{n}");
        }
        if failed_once {
            retried.push((task, n));
        }
    }
    assert!(!retried.is_empty(), "some push needed a retry");

    // The puller resumes from its last cursor and ends with every record exactly once.
    let head = pull_rest(api, token, cursor, &mut pulled).await;
    let got: BTreeSet<String> = pulled.keys().cloned().collect();
    assert_eq!(got, expected, "the resumed puller has every pushed record");
    // Records and attachments share the change log: together they use every change_id up to the
    // head exactly once, so nothing was applied twice and no change_id was skipped.
    let (_, manifest) = api.call(reqwest::Method::GET, "/attachments/manifest", Some(token), None).await;
    let mut ids: Vec<i64> = pulled.values().copied().collect();
    ids.extend(
        manifest["operations"]
            .as_array()
            .expect("operations")
            .iter()
            .map(|o| o["change_id"].as_i64().expect("id")),
    );
    ids.sort_unstable();
    assert_eq!(ids, (1..=head).collect::<Vec<_>>(), "one change per record and attachment");
    let mut fresh = BTreeMap::new();
    assert_eq!(pull_rest(api, token, 0, &mut fresh).await, head);
    assert_eq!(fresh, pulled, "a full pull agrees with the resumed one");

    // Retried records have exactly one revision: the retry replayed or applied, never both.
    for (task, n) in &retried {
        for k in 0..RECORDS_PER_PUSH {
            let id = record_id(*task, *n, k);
            let (status, body) = api
                .call(reqwest::Method::GET, &format!("/observations/{id}/history"), Some(token), None)
                .await;
            assert_eq!(status, StatusCode::OK);
            assert_eq!(body["revisions"].as_array().map(Vec::len), Some(1), "{id}: {body}");
        }
    }
}

fn attachment_bytes(i: usize) -> Vec<u8> {
    (0..300_000usize).map(|j| ((i * 31 + j * 7) % 251) as u8).collect()
}

/// An upload whose body stops half-way; held open until the server dies.
async fn start_cut_upload(api: &Api, token: &str, id: &str) -> tokio::net::TcpStream {
    let addr = api.base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "PUT /attachments/{id} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/octet-stream\r\nContent-Length: 1000000\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.expect("headers");
    stream.write_all(&attachment_bytes(0)[..200_000]).await.expect("half a body");
    stream.flush().await.expect("flush");
    stream
}

/// Attachments written one at a time until the first failure (the server died) or `stop`; each
/// with whether it was acknowledged. `done` counts one once the first is stored.
fn upload_attachments(
    api: &Api,
    token: &str,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicUsize>,
) -> JoinHandle<Vec<(usize, bool)>> {
    let (api, token) = (api.clone(), token.to_string());
    tokio::spawn(async move {
        let mut outcomes = Vec::new();
        for i in 0.. {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            let res = api
                .client
                .put(api.url(&format!("/attachments/att-{i}")))
                .bearer_auth(&token)
                .timeout(REQUEST_TIMEOUT)
                .body(attachment_bytes(i))
                .send()
                .await;
            let ok = matches!(res, Ok(r) if r.status() == StatusCode::OK);
            if ok && i == 0 {
                done.fetch_add(1, Ordering::SeqCst);
            }
            outcomes.push((i, ok));
            if !ok {
                break;
            }
        }
        outcomes
    })
}

/// The same for app bundles, each activated, by version.
fn push_bundles(
    api: &Api,
    token: &str,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicUsize>,
) -> JoinHandle<Vec<(String, bool)>> {
    let (api, token) = (api.clone(), token.to_string());
    tokio::spawn(async move {
        let mut outcomes = Vec::new();
        for i in 0.. {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            let version = format!("20260101-{:06}", i);
            let part = reqwest::multipart::Part::bytes(small_bundle(&version, &format!("m{i}")))
                .file_name("bundle.zip")
                .mime_str("application/zip")
                .expect("mime");
            let form = reqwest::multipart::Form::new().part("bundle", part).text("activate", "true");
            let res = api
                .client
                .post(api.url("/app-bundle/push"))
                .bearer_auth(&token)
                .timeout(REQUEST_TIMEOUT)
                .multipart(form)
                .send()
                .await;
            // The server may die mid-request: that is an unacknowledged push, not a failure.
            let ok = matches!(res, Ok(r) if r.status() == StatusCode::OK);
            if ok && i == 0 {
                done.fetch_add(1, Ordering::SeqCst);
            }
            outcomes.push((version, ok));
            if !ok {
                break;
            }
        }
        outcomes
    })
}

#[actix_web::test]
async fn sigkill_mid_storm_loses_nothing_and_applies_retries_once() {
    let db = fresh_database().await;
    let db_conn = cluster().connection_string(&db);
    let data_root = tempfile::tempdir().expect("data root");
    let logs = tempfile::tempdir().expect("logs");
    let mut server =
        ChildServer::start(&db_conn, data_root.path(), logs.path().join("1.log"), SERVER_ENV).await;
    let token = server.admin_token().await;

    // Attachments and bundles are written while the storm runs, one at a time each.
    let stop_files = Arc::new(AtomicBool::new(false));
    let files_acked = Arc::new(AtomicUsize::new(0));
    let attachments = upload_attachments(&server, &token, stop_files.clone(), files_acked.clone());
    let bundles = push_bundles(&server, &token, stop_files.clone(), files_acked.clone());
    let cut = start_cut_upload(&server, &token, "cut-upload").await;

    let storm = start_storm(&server, &token, true);
    wait_for_acks(&storm.acked, 40).await;
    // At least one attachment and one bundle are stored before the kill.
    wait_for_acks(&files_acked, 2).await;
    server.kill().await;
    stop_files.store(true, Ordering::SeqCst);
    let (outcomes, pulled) = finish_storm(storm).await;
    drop(cut);
    let attachment_outcomes = attachments.await.expect("attachment task");
    let bundle_outcomes = bundles.await.expect("bundle task");
    assert!(outcomes.iter().any(|(_, _, o)| o.is_none()), "some push was in flight when the server died");

    // Tokens survive a restart: they are signed, and revocation lives in the database.
    let server = ChildServer::start(&db_conn, data_root.path(), logs.path().join("2.log"), SERVER_ENV).await;
    retry_and_verify(&server, &token, pulled, outcomes).await;
    verify_attachments(&server, &token, &attachment_outcomes).await;
    verify_bundles(&server, &token, &bundle_outcomes).await;
}

/// Acknowledged uploads are complete; unacknowledged ones are absent or complete, never partial,
/// and can be retried.
async fn verify_attachments(api: &Api, token: &str, outcomes: &[(usize, bool)]) {
    assert!(outcomes.iter().any(|(_, ok)| *ok), "some attachment was stored before the kill");
    let mut ids: Vec<(String, Vec<u8>, bool)> =
        outcomes.iter().map(|(i, ok)| (format!("att-{i}"), attachment_bytes(*i), *ok)).collect();
    ids.push(("cut-upload".into(), attachment_bytes(0)[..200_000].to_vec(), false));
    for (id, bytes, acked) in &ids {
        let path = format!("/attachments/{id}");
        let (status, _, body) = api.get_bytes(token, &path).await;
        match status {
            StatusCode::OK => assert!(body == bytes[..], "{id}: stored bytes differ from the upload"),
            StatusCode::NOT_FOUND => assert!(!acked, "{id} was acknowledged but is gone"),
            other => panic!("{id}: {other}"),
        }
        if status == StatusCode::NOT_FOUND {
            let (status, _) = api.put_bytes(token, &path, bytes, None).await;
            assert_eq!(status, StatusCode::OK, "retry of {id}");
            assert!(api.get_bytes(token, &path).await.2 == bytes[..]);
        }
    }
    // The manifest lists only complete attachments.
    let (_, manifest) = api.call(reqwest::Method::GET, "/attachments/manifest", Some(token), None).await;
    for op in manifest["operations"].as_array().expect("operations") {
        let id = op["attachment_id"].as_str().expect("id");
        let (status, _, body) = api.get_bytes(token, &format!("/attachments/{id}")).await;
        assert_eq!(status, StatusCode::OK, "{id} is listed");
        assert_eq!(Some(body.len() as i64), op["size"].as_i64(), "{id}");
    }
}

/// Every listed version downloads completely; every acknowledged one is listed; the active one
/// (if any) serves its manifest and files.
async fn verify_bundles(api: &Api, token: &str, outcomes: &[(String, bool)]) {
    let (status, body) = api.call(reqwest::Method::GET, "/app-bundle/versions", Some(token), None).await;
    assert_eq!(status, StatusCode::OK);
    let listed: Vec<String> = body["versions"]
        .as_array()
        .expect("versions")
        .iter()
        .map(|v| v["version"].as_str().expect("version").to_string())
        .collect();
    for (version, acked) in outcomes {
        if *acked {
            assert!(listed.contains(version), "acknowledged bundle {version} is listed: {listed:?}");
        }
    }
    for version in &listed {
        let (status, _, bytes) =
            api.get_bytes(token, &format!("/app-bundle/download-zip?version={version}")).await;
        assert_eq!(status, StatusCode::OK, "{version}");
        let archive = zip::ZipArchive::new(std::io::Cursor::new(bytes)).expect("a whole ZIP");
        assert!(archive.len() >= 5, "{version}");
        let path = format!("/app-bundle/download/app%2Findex.html?version={version}");
        assert_eq!(api.get_bytes(token, &path).await.0, StatusCode::OK, "{version}");
    }
    let (status, manifest) = api.call(reqwest::Method::GET, "/app-bundle/manifest", Some(token), None).await;
    if status == StatusCode::OK {
        // Every push activates: the active one is the last acknowledged or the one in flight.
        let last_acked = outcomes.iter().filter(|(_, ok)| *ok).map(|(v, _)| v.as_str()).next_back();
        let in_flight = outcomes.iter().find(|(_, ok)| !*ok).map(|(v, _)| v.as_str());
        let active = manifest["version"].as_str();
        assert!(active == last_acked || active == in_flight, "{manifest}");
        for file in manifest["files"].as_array().expect("files") {
            let path = file["path"].as_str().expect("path").replace('/', "%2F");
            let (status, _, bytes) = api.get_bytes(token, &format!("/app-bundle/download/{path}")).await;
            assert_eq!(status, StatusCode::OK, "{path}");
            assert_eq!(Some(bytes.len() as i64), file["size"].as_i64());
        }
    } else {
        assert_eq!(status, StatusCode::NOT_FOUND);
    }
}

/// A crash-test PostgreSQL cluster of its own (fsync on), under /tmp so that the cluster user
/// can reach it when the tests run as root; removed at the end.
struct CrashCluster {
    pg: EmbeddedPostgres,
    dir: PathBuf,
}

impl CrashCluster {
    fn start() -> Self {
        let dir = PathBuf::from(format!("/tmp/synkronus-crash-pg-{}", uuid::Uuid::new_v4().simple()));
        let pg = EmbeddedPostgres::new(dir.clone(), None, "postgres").expect("PostgreSQL binaries");
        pg.start().expect("start the crash cluster");
        CrashCluster { pg, dir }
    }
}

impl Drop for CrashCluster {
    fn drop(&mut self) {
        let _ = self.pg.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[actix_web::test]
async fn postgres_crash_mid_storm_gives_503s_and_loses_nothing() {
    let crash = CrashCluster::start();
    crash.pg.ensure_database("crash").await.expect("create the database");
    let app = TestApp::spawn_on(crash.pg.connection_string("crash"), &[]).await;
    let token = app.admin_token().await;

    let storm = start_storm(&app, &token, false);
    wait_for_acks(&storm.acked, 40).await;
    let pg = crash.pg.clone();
    tokio::task::spawn_blocking(move || pg.kill()).await.expect("join").expect("kill PostgreSQL");
    // While the database is down, pushes are refused with 503 (checked with every outcome below).
    let down_at = storm.acked.load(Ordering::SeqCst);
    let mut saw_503 = false;
    for _ in 0..50 {
        let res =
            app.client.post(app.url("/sync/push")).bearer_auth(&token).json(&push_body(999, 0)).send().await;
        let status = res.expect("the server answers while the database is down").status();
        assert_ne!(status, StatusCode::INTERNAL_SERVER_ERROR);
        if status == StatusCode::SERVICE_UNAVAILABLE {
            saw_503 = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(saw_503, "a push while PostgreSQL is down gets 503");
    // Every pusher has met the outage a few times over (each retries 100 ms after a refusal).
    let refused_before = storm.not_acked.load(Ordering::SeqCst);
    wait_for_acks(&storm.not_acked, refused_before + 3 * PUSHERS).await;
    assert!(storm.acked.load(Ordering::SeqCst) <= down_at + PUSHERS, "no push is acknowledged while down");

    let pg = crash.pg.clone();
    tokio::task::spawn_blocking(move || pg.start()).await.expect("join").expect("restart PostgreSQL");
    // The pool reconnects by itself; let the storm go on a little on the recovered database.
    let recovered = storm.acked.load(Ordering::SeqCst);
    wait_for_acks(&storm.acked, recovered + 20).await;
    let (mut outcomes, pulled) = finish_storm(storm).await;
    // The probe push above is one more unacknowledged push to retry.
    outcomes.push((999, 0, None));
    assert!(outcomes.iter().any(|(_, _, o)| *o == Some(503)), "the storm saw 503s");
    retry_and_verify(&app, &token, pulled, outcomes).await;
}

/// A data root for a server with its embedded cluster, under /tmp so that the cluster user can
/// reach it when the tests run as root. Declared before the server, so it is dropped after it:
/// whatever the test did, the cluster is stopped and the folder removed.
pub struct EmbeddedDataRoot {
    pub dir: PathBuf,
    pub pg: EmbeddedPostgres,
}

impl EmbeddedDataRoot {
    pub fn new(prefix: &str) -> Self {
        let dir =
            PathBuf::from(format!("/tmp/{prefix}-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]));
        std::fs::create_dir_all(&dir).expect("data root");
        let pg = EmbeddedPostgres::new(dir.join("postgres"), None, "postgres").expect("PostgreSQL binaries");
        EmbeddedDataRoot { dir, pg }
    }

    pub fn postmaster_pid(&self) -> i32 {
        self.pg.postmaster_pid().expect("a running postmaster")
    }
}

impl Drop for EmbeddedDataRoot {
    fn drop(&mut self) {
        if self.pg.postmaster_pid().is_some() {
            let _ = self.pg.kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Polls `/health` until it answers `expected`; returns its body. Panics after `within`.
async fn health_until(base: &str, expected: StatusCode, within: Duration) -> Value {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().expect("client");
    let started = std::time::Instant::now();
    loop {
        if let Ok(res) = http.get(format!("{base}/health")).send().await {
            if res.status() == expected {
                return res.json().await.expect("health body");
            }
        }
        assert!(started.elapsed() < within, "/health did not answer {expected} within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[actix_web::test]
async fn embedded_postmaster_killed_mid_storm_is_restarted_by_the_server() {
    let root = EmbeddedDataRoot::new("synk-supervise");
    let log = root.dir.join("synkronus.log");
    // No DB_CONNECTION: the server runs the embedded cluster under DATA_ROOT.
    let mut server = ChildServer::start("", &root.dir, log, SERVER_ENV).await;
    let token = server.admin_token().await;

    let storm = start_storm(&server, &token, false);
    wait_for_acks(&storm.acked, 40).await;
    let killed = root.postmaster_pid();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(killed), nix::sys::signal::Signal::SIGKILL)
        .expect("SIGKILL the postmaster");
    let killed_at = std::time::Instant::now();

    // The first restart waits 1 s: /health says the database is down meanwhile.
    let down = health_until(&server.base, StatusCode::SERVICE_UNAVAILABLE, Duration::from_secs(10)).await;
    assert_eq!(down["database"], "down", "{down}");
    assert_eq!(down["code"], "SERVICE_UNAVAILABLE", "{down}");
    let up = health_until(&server.base, StatusCode::OK, Duration::from_secs(30)).await;
    assert_eq!(up["database"], "up");
    let recovered_in = killed_at.elapsed();
    assert!(recovered_in < Duration::from_secs(30), "recovered in {recovered_in:?}");
    eprintln!("embedded postmaster killed: /health up again after {recovered_in:?}");
    assert!(server.is_running(), "the server itself was not restarted");
    let restarted = root.postmaster_pid();
    assert_ne!(restarted, killed, "a new postmaster runs");
    let log_text = server.log_text();
    assert!(log_text.contains("postmaster exited"), "the server logged the exit: {log_text}");

    // The storm goes on against the restarted database, then every push is checked.
    let recovered = storm.acked.load(Ordering::SeqCst);
    wait_for_acks(&storm.acked, recovered + 20).await;
    let (outcomes, pulled) = finish_storm(storm).await;
    assert!(
        outcomes.iter().any(|(_, _, o)| *o == Some(503)),
        "the storm saw 503s while the database was down"
    );
    retry_and_verify(&server, &token, pulled, outcomes).await;

    // A graceful stop also stops the cluster the server supervised.
    let status = server.terminate(Duration::from_secs(60)).await;
    assert!(status.success(), "the server exits cleanly: {status} {}", server.log_text());
    assert_eq!(root.pg.postmaster_pid(), None, "the server stopped its cluster");
}

#[actix_web::test]
async fn a_second_server_on_the_same_data_root_is_refused_and_the_first_keeps_its_database() {
    let root = EmbeddedDataRoot::new("synk-claim");
    let mut first = ChildServer::start("", &root.dir, root.dir.join("first.log"), SERVER_ENV).await;
    let token = first.admin_token().await;
    let postmaster = root.postmaster_pid();

    // A second server on the same data root, on a port of its own: it must not adopt the running
    // cluster (and stop it when it exits), but refuse to start, naming the data root.
    let mut env: BTreeMap<String, String> =
        crate::helpers::test_env("", &root.dir, SERVER_ENV).into_iter().collect();
    env.insert("PORT".into(), crate::helpers::free_port().to_string());
    env.retain(|_, v| !v.is_empty());
    let second = crate::helpers::binary(&["serve"], &root.dir).envs(env).output();
    let second =
        tokio::time::timeout(Duration::from_secs(60), second).await.expect("it exits").expect("it ran");
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "the second server started: {stderr}");
    assert!(stderr.contains("is in use by another synkronus server"), "{stderr}");
    assert!(stderr.contains(&root.dir.display().to_string()), "{stderr}");

    // The first server and its cluster go on untouched.
    assert_eq!(root.postmaster_pid(), postmaster, "the cluster was not restarted");
    let (records, _) = first.pull_all(&token, "claim-device", 0, 100).await;
    assert!(records.is_empty(), "{records:?}");
    assert!(first.is_running());

    // A server that dies frees the data root too: the lock goes with the process, and the
    // postmaster, which outlives it, never held it (had the postmaster inherited the lock file, the
    // next server would be refused here). The next server adopts the orphaned cluster as it runs.
    first.kill().await;
    assert_eq!(root.postmaster_pid(), postmaster, "the cluster outlives the killed server");
    let mut adopting = ChildServer::start("", &root.dir, root.dir.join("adopting.log"), SERVER_ENV).await;
    assert_eq!(root.postmaster_pid(), postmaster, "the next server adopted the running cluster");
    let token = adopting.admin_token().await;
    let (records, _) = adopting.pull_all(&token, "claim-device", 0, 100).await;
    assert!(records.is_empty(), "{records:?}");

    // And once a server has stopped, the data root is free again.
    let status = adopting.terminate(Duration::from_secs(60)).await;
    assert!(status.success(), "{}", adopting.log_text());
    let mut again = ChildServer::start("", &root.dir, root.dir.join("again.log"), SERVER_ENV).await;
    let token = again.admin_token().await;
    let (records, _) = again.pull_all(&token, "claim-device", 0, 100).await;
    assert!(records.is_empty(), "{records:?}");
    again.terminate(Duration::from_secs(60)).await;
}
