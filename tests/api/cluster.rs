//! Several nodes behind a real load balancer (docs/api.md §18.2): three `synkronus serve`
//! processes on one database and one bucket (moto's S3-compatible server, as in the storage
//! tests), each with a data root of its own, and nginx in front of them, round robin, without
//! stickiness. Through nginx the cluster must behave as one server: no skipped or repeated change
//! for cursor-following pullers while devices push, attachments and export jobs readable on
//! another node than the one that wrote them, a bundle switch served everywhere within 1 s, a
//! node killed with SIGKILL in a push storm losing no acknowledged push, an object store frozen
//! and then stopped giving 503s (never a 500 or a hang) while sync and the cached bundle keep
//! working, then recovery, and the export job of a node killed with SIGKILL failed by another
//! node within a minute.
//!
//! nginx comes from `make test-deps` (the Debian package), like moto; the test fails, saying so,
//! without it.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::crash::{
    absorb_page, finish_storm, retry_and_verify, start_storm, wait_for_acks, REQUEST_TIMEOUT,
};
use crate::helpers::{
    assert_error, cluster, connect, free_port, fresh_database, small_bundle, Api, ChildServer, S3Server,
};

const NODES: [&str; 3] = ["node-a", "node-b", "node-c"];

/// The nginx binary, or a failure that says how to get it.
fn nginx_binary() -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("nginx"));
    on_path.chain([PathBuf::from("/usr/sbin/nginx")]).find(|p| p.is_file()).unwrap_or_else(|| {
        panic!("nginx is not installed: the cluster test needs it as its load balancer; `make test-deps` installs it")
    })
}

/// nginx in the foreground with a configuration of its own, stopped when dropped.
struct Nginx {
    child: Child,
    api: Api,
    log: PathBuf,
}

impl Nginx {
    /// Round robin over `upstreams`, no stickiness, bodies streamed both ways (no buffering),
    /// connections to the nodes kept open: docs/deploy.md's configuration.
    fn config(prefix: &Path, port: u16, upstreams: &[u16]) -> String {
        let p = prefix.display();
        let servers: String = upstreams.iter().map(|u| format!("    server 127.0.0.1:{u};\n")).collect();
        format!(
            "daemon off;\nmaster_process on;\nworker_processes 1;\npid {p}/nginx.pid;\nerror_log {p}/error.log warn;\n\
             events {{ worker_connections 1024; }}\n\
             http {{\n  access_log off;\n  client_max_body_size 0;\n\
             client_body_temp_path {p}/client_body;\n  proxy_temp_path {p}/proxy;\n\
             fastcgi_temp_path {p}/fastcgi;\n  uwsgi_temp_path {p}/uwsgi;\n  scgi_temp_path {p}/scgi;\n\
             upstream synkronus {{\n{servers}    keepalive 64;\n  }}\n\
             server {{\n    listen 127.0.0.1:{port};\n    location / {{\n\
             proxy_pass http://synkronus;\n      proxy_http_version 1.1;\n\
             proxy_set_header Connection \"\";\n      proxy_set_header Host $http_host;\n\
             proxy_request_buffering off;\n      proxy_buffering off;\n      proxy_read_timeout 60s;\n\
             }}\n  }}\n}}\n"
        )
    }

    async fn start(prefix: &Path, upstreams: &[u16]) -> Nginx {
        let binary = nginx_binary();
        let port = free_port();
        let conf = prefix.join("nginx.conf");
        std::fs::write(&conf, Self::config(prefix, port, upstreams)).expect("nginx.conf");
        let log = prefix.join("error.log");
        let child = Command::new(binary)
            .arg("-c")
            .arg(&conf)
            .arg("-p")
            .arg(prefix)
            .arg("-e")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nginx");
        let client = reqwest::Client::builder().timeout(REQUEST_TIMEOUT).build().expect("client");
        let mut nginx = Nginx { child, api: Api::new(format!("http://127.0.0.1:{port}"), client), log };
        for _ in 0..100 {
            if let Ok(Some(status)) = nginx.child.try_wait() {
                panic!(
                    "nginx exited ({status}): {}",
                    std::fs::read_to_string(&nginx.log).unwrap_or_default()
                );
            }
            if let Ok(res) = nginx.api.client.get(nginx.api.url("/health")).send().await {
                if res.status() == StatusCode::OK {
                    return nginx;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("nginx did not answer in 10 s: {}", std::fs::read_to_string(&nginx.log).unwrap_or_default());
    }
}

impl Drop for Nginx {
    /// SIGQUIT lets the master stop its workers (a SIGKILL would orphan them), then the master is
    /// waited for; SIGKILL only if it does not go.
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGQUIT);
        for _ in 0..50 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Which nodes answer `/health` through nginx, over `n` requests.
async fn nodes_answering(api: &Api, n: usize) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for _ in 0..n {
        let (status, body) = api.call(Method::GET, "/health", None, None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        seen.insert(body["node"].as_str().expect("node").to_string());
    }
    seen
}

async fn manifest_version(api: &Api, token: &str) -> Option<String> {
    let (status, body) = api.call(Method::GET, "/app-bundle/manifest", Some(token), None).await;
    (status == StatusCode::OK).then(|| body["version"].as_str().unwrap_or_default().to_string())
}

/// An attachment written through `a` is read whole through `b` and through nginx.
async fn attachment_written_on_one_node_is_read_on_another(a: &Api, b: &Api, lb: &Api, token: &str) {
    let bytes: Vec<u8> = (0..700_000usize).map(|i| (i * 13 % 251) as u8).collect();
    let (status, body) = a.put_bytes(token, "/attachments/cluster-photo.jpg", &bytes, None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    for api in [b, lb] {
        let (status, headers, got) = api.get_bytes(token, "/attachments/cluster-photo.jpg").await;
        assert_eq!(status, StatusCode::OK);
        assert!(headers.contains_key("etag"));
        assert!(got == bytes, "the attachment read on another node differs");
    }
}

/// A bundle activated through `a` is what `others` serve within 1 s; returns its version.
async fn bundle_switch_reaches_every_node_within_a_second(a: &Api, others: &[&Api], token: &str) -> String {
    let pushed = a.push_bundle(token, small_bundle("3.1.0", "cluster"), true).await;
    let switched = Instant::now();
    let version = pushed["version"].as_str().expect("version").to_string();
    for api in others {
        loop {
            if manifest_version(api, token).await.as_deref() == Some(version.as_str()) {
                break;
            }
            assert!(switched.elapsed() < Duration::from_secs(1), "{} still serves the old bundle", api.base);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let elapsed = switched.elapsed();
    assert!(elapsed <= Duration::from_secs(1), "switch took {elapsed:?}");
    version
}

/// More cursor-following pullers through nginx, each on its own cursor; returns what each saw.
fn extra_pullers(
    api: &Api,
    token: &str,
    stop: Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<BTreeMap<String, i64>>> {
    (0..2)
        .map(|i| {
            let (api, token, stop) = (api.clone(), token.to_string(), stop.clone());
            tokio::spawn(async move {
                let (mut seen, mut cursor) = (BTreeMap::new(), 0i64);
                while !stop.load(Ordering::SeqCst) {
                    let body =
                        json!({"client_id": format!("cluster-puller-{i}"), "since": {"version": cursor}});
                    let res = api
                        .client
                        .post(api.url("/sync/pull?limit=11"))
                        .bearer_auth(&token)
                        .timeout(REQUEST_TIMEOUT)
                        .json(&body)
                        .send()
                        .await;
                    match res {
                        Ok(r) if r.status() == StatusCode::OK => {
                            let page: Value = r.json().await.expect("pull page");
                            cursor = absorb_page(&page, cursor, &mut seen);
                        }
                        // The node that nginx picked was just killed: a device tries again.
                        _ => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                }
                seen
            })
        })
        .collect()
}

/// An export job started through `a`, polled through nginx, downloaded through `b`; returns its id.
async fn export_job_started_on_one_node_is_downloaded_on_another(
    a: &Api,
    b: &Api,
    lb: &Api,
    token: &str,
    records: usize,
) -> String {
    let (status, job) = a.call(Method::POST, "/dataexport/jobs?format=json", Some(token), None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{job}");
    let id = job["job_id"].as_str().expect("job id").to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, job) = lb.call(Method::GET, &format!("/dataexport/jobs/{id}"), Some(token), None).await;
        assert_eq!(status, StatusCode::OK, "{job}");
        if job["state"] == "done" {
            break;
        }
        assert!(job["state"] != "failed" && Instant::now() < deadline, "{job}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, headers, body) = b.get_bytes(token, &format!("/dataexport/jobs/{id}/download")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers.contains_key("x-export-change-id"));
    let lines = std::str::from_utf8(&body).expect("NDJSON").lines().filter(|l| !l.is_empty()).count();
    assert_eq!(lines, records, "one line per pushed record");
    id
}

/// How long a request may take while the object store is down (docs/api.md §18.1: a 503 within
/// 10 s, never a hang): the client gives up after it, failing the test.
const STORE_DOWN_BOUND: Duration = Duration::from_secs(10);

/// `request` is answered 503 `SERVICE_UNAVAILABLE` with the error body and `Retry-After` within
/// [`STORE_DOWN_BOUND`]: not a 500, not a hang.
async fn answers_503(what: &str, request: reqwest::RequestBuilder) {
    let started = Instant::now();
    let res = request
        .timeout(STORE_DOWN_BOUND)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{what}: no answer within {STORE_DOWN_BOUND:?} ({e})"));
    let (status, retry_after) = (res.status(), res.headers().contains_key("retry-after"));
    let body: Value = res.json().await.unwrap_or(Value::Null);
    assert_error(status, &body, 503, "SERVICE_UNAVAILABLE");
    assert!(retry_after, "{what}: a 503 says when to retry");
    assert!(started.elapsed() < STORE_DOWN_BOUND, "{what} took {:?}", started.elapsed());
}

fn bundle_form(bytes: Vec<u8>) -> reqwest::multipart::Form {
    let part = reqwest::multipart::Part::bytes(bytes).file_name("bundle.zip");
    reqwest::multipart::Form::new().part("bundle", part)
}

/// What the nodes must keep serving from their caches while the store is down.
struct CachedBundle {
    version: String,
    zip: Vec<u8>,
}

/// What the outages are checked through: the two live nodes, nginx, an admin's token, a finished
/// export job (its file in the store) and the active bundle (in every node's cache).
struct Outage<'a> {
    nodes: [&'a Api; 2],
    lb: &'a Api,
    token: &'a str,
    export_job: &'a str,
    cached: CachedBundle,
}

/// `apis` with a client that gives up after [`STORE_DOWN_BOUND`].
fn bounded(apis: &[&Api]) -> Vec<Api> {
    let client = reqwest::Client::builder().timeout(STORE_DOWN_BOUND).build().expect("client");
    apis.iter().map(|api| Api::new(api.base.clone(), client.clone())).collect()
}

/// Waits until every node in `data_roots` holds `version` whole in its bundle cache (a version is
/// fetched there as soon as it becomes active, docs/storage.md), within 10 s.
async fn wait_until_cached(data_roots: &[&Path], version: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    for root in data_roots {
        // The ZIP is written last: with it, the version is complete.
        let zip = root.join("bundle-cache").join("versions").join(format!("{version}.zip"));
        while !zip.is_file() {
            assert!(Instant::now() < deadline, "{} never cached the active version", root.display());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The routes that need the store answer 503 through nginx and on each node, all at once;
/// `/health` says so.
async fn file_routes_answer_503(apis: &[Api], token: &str, export_job: &str) {
    futures_util::future::join_all(
        apis.iter().map(|api| file_routes_answer_503_through(api, token, export_job)),
    )
    .await;
}

async fn file_routes_answer_503_through(api: &Api, token: &str, export_job: &str) {
    let (c, at) = (&api.client, &api.base);
    let upload = c.put(api.url("/attachments/outage.bin")).bearer_auth(token).body(&b"new"[..]);
    answers_503(&format!("upload through {at}"), upload).await;
    let download = c.get(api.url("/attachments/cluster-photo.jpg")).bearer_auth(token);
    answers_503(&format!("download through {at}"), download).await;
    let export = c.get(api.url(&format!("/dataexport/jobs/{export_job}/download"))).bearer_auth(token);
    answers_503(&format!("export download through {at}"), export).await;
    let bundle = bundle_form(small_bundle("3.2.0", "outage"));
    let push = c.post(api.url("/app-bundle/push")).bearer_auth(token).multipart(bundle);
    answers_503(&format!("bundle push through {at}"), push).await;
    reports_storage(api, "down").await;
}

/// Sync does not touch the store: a push through nginx is applied and pulled through nginx.
async fn sync_works_without_the_store(lb: &Api, token: &str, outage: &str) {
    let id = format!("{outage}-obs");
    let push = json!({"transmission_id": outage, "client_id": "outage-device", "records": [
        {"observation_id": id, "form_type": "ft", "form_version": "1", "data": {"k": 1}}]});
    let (status, body) = lb.push(token, push).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (records, _) = lb.pull_all(token, "outage-puller", 0, 500).await;
    assert!(records.iter().any(|r| r["observation_id"] == id.as_str()), "the push is pulled");
}

async fn reports_storage(api: &Api, state: &str) {
    let (status, body) = api.call(Method::GET, "/health", None, None).await;
    assert_eq!(status, StatusCode::OK, "the database is up: {body}");
    assert_eq!((body["status"].as_str(), body["storage"].as_str()), (Some("OK"), Some(state)), "{body}");
}

/// A store that accepts connections and answers nothing (moto frozen with SIGSTOP) is what a
/// client timeout must never see: one request of each route that needs it, at once on different
/// nodes, answers 503 within 10 s, while sync and the cached bundle keep working. Resumed, the
/// store serves what it held: the attachment written before reads again.
async fn a_frozen_store_gives_503s_then_serves_again(s3: &S3Server, o: &Outage<'_>) {
    let (token, export_job) = (o.token, o.export_job);
    let [a, b, via_lb]: [Api; 3] = bounded(&[o.nodes[0], o.nodes[1], o.lb]).try_into().ok().expect("three");
    s3.freeze();
    let upload = a.client.put(a.url("/attachments/frozen.bin")).bearer_auth(token).body(&b"new"[..]);
    let download = b.client.get(b.url("/attachments/cluster-photo.jpg")).bearer_auth(token);
    let export = via_lb.client.get(via_lb.url(&format!("/dataexport/jobs/{export_job}/download")));
    let bundle = bundle_form(small_bundle("3.2.0", "frozen"));
    let push = via_lb.client.post(via_lb.url("/app-bundle/push")).bearer_auth(token).multipart(bundle);
    futures_util::join!(
        answers_503("upload to a frozen store", upload),
        answers_503("download from a frozen store", download),
        answers_503("export download from a frozen store", export.bearer_auth(token)),
        answers_503("bundle push to a frozen store", push),
        reports_storage(&via_lb, "down"),
        sync_works_without_the_store(&via_lb, token, "frozen"),
        cached_bundle_is_served(std::slice::from_ref(&via_lb), token, &o.cached),
    );
    s3.thaw();
    let deadline = Instant::now() + STORE_DOWN_BOUND;
    loop {
        let (status, _, bytes) = via_lb.get_bytes(token, "/attachments/cluster-photo.jpg").await;
        if status == StatusCode::OK {
            assert_eq!(bytes.len(), 700_000);
            break;
        }
        assert!(Instant::now() < deadline, "the resumed store is not read again: {status}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The active version's manifest, a file and its ZIP, from each node's cache.
async fn cached_bundle_is_served(apis: &[Api], token: &str, cached: &CachedBundle) {
    for api in apis {
        let (status, body) = api.call(Method::GET, "/app-bundle/manifest", Some(token), None).await;
        assert_eq!((status, body["version"].as_str()), (StatusCode::OK, Some(cached.version.as_str())));
        let (status, _, html) = api.get_bytes(token, "/app-bundle/download/app/index.html").await;
        assert_eq!((status, html), (StatusCode::OK, b"<html>cluster</html>".to_vec()), "{}", api.base);
        let (status, _, zip) = api.get_bytes(token, "/app-bundle/download-zip").await;
        assert_eq!(status, StatusCode::OK, "{}", api.base);
        assert!(zip == cached.zip, "the cached ZIP through {} differs", api.base);
    }
}

/// The store stopped while the cluster runs (docs/storage.md, "Outage behaviour"): connections
/// refused. Then it is started again on the same port. moto keeps objects in memory, so the
/// restarted store is empty: its bucket is created again and recovery is shown with new files,
/// written and read across nodes.
async fn an_object_store_outage_gives_503s_and_recovers(s3: &mut S3Server, bucket: &str, o: &Outage<'_>) {
    let (nodes, lb, token) = (o.nodes, o.lb, o.token);
    // nginx twice: with node C dead it alternates over A and B; then each node directly.
    let apis = bounded(&[lb, lb, nodes[0], nodes[1]]);
    let port = s3.port;
    s3.stop();
    file_routes_answer_503(&apis, token, o.export_job).await;
    sync_works_without_the_store(lb, token, "stopped").await;
    cached_bundle_is_served(&apis, token, &o.cached).await;

    *s3 = S3Server::start_on(port).await;
    s3.create_bucket(bucket).await;
    let deadline = Instant::now() + STORE_DOWN_BOUND;
    for api in &apis[2..] {
        while api.call(Method::GET, "/health", None, None).await.1["storage"] != "up" {
            assert!(Instant::now() < deadline, "{} still reports the store down", api.base);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let bytes: Vec<u8> = (0..300_000usize).map(|i| (i * 7 % 253) as u8).collect();
    let (status, body) = nodes[0].put_bytes(token, "/attachments/after-outage.bin", &bytes, None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    for api in [nodes[1], lb] {
        let (status, _, got) = api.get_bytes(token, "/attachments/after-outage.bin").await;
        assert!(
            status == StatusCode::OK && got == bytes,
            "read after recovery through {}: {status}",
            api.base
        );
    }
    let pushed = lb.push_bundle(token, small_bundle("3.2.0", "recovered"), false).await;
    assert_eq!(pushed["active"], false, "{pushed}");
}

/// An export job queued on `node`, named `name` (its only export slot held by a streamed export nobody reads)
/// when the node is killed with SIGKILL: another node marks it failed within 60 s.
async fn a_job_whose_node_is_killed_becomes_failed(
    node: &mut ChildServer,
    name: &str,
    lb: &Api,
    token: &str,
) {
    let (db, connection) =
        tokio_postgres::connect(&node.db_conn, tokio_postgres::NoTls).await.expect("connect to the database");
    tokio::spawn(connection);
    // Far more NDJSON than the body channel and the socket buffers hold.
    crate::export::insert_bulk(&db, 20_000, 600).await;
    let held = node
        .client
        .get(node.url("/data/export?format=json"))
        .bearer_auth(token)
        .send()
        .await
        .expect("streamed export");
    assert_eq!(held.status(), StatusCode::OK);
    let (status, job) = node.call(Method::POST, "/dataexport/jobs?format=csv", Some(token), None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{job}");
    let id = job["job_id"].as_str().expect("job id").to_string();
    let (_, job) = node.call(Method::GET, &format!("/dataexport/jobs/{id}"), Some(token), None).await;
    assert_eq!(job["state"], "queued", "{job}");
    node.kill().await;
    drop(held);
    let killed = Instant::now();
    loop {
        let (status, job) = lb.call(Method::GET, &format!("/dataexport/jobs/{id}"), Some(token), None).await;
        assert_eq!(status, StatusCode::OK, "{job}");
        if job["state"] == "failed" {
            let error = job["error"].as_str().unwrap_or_default();
            assert!(error.contains(name), "the message names the dead node: {error}");
            break;
        }
        assert_eq!(job["state"], "queued", "{job}");
        assert!(killed.elapsed() < Duration::from_secs(60), "still {job} a minute after its node died");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Waits until a session of `node` waits for an advisory lock (a group commit at the change-log
/// lock).
async fn wait_for_a_commit_waiting_on(db_conn: &str, node: &str) {
    let db = connect(db_conn).await;
    for _ in 0..600 {
        let waiting: i64 = db
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE application_name = $1 AND wait_event_type = 'Lock' AND wait_event = 'advisory'",
                &[&node],
            )
            .await
            .expect("pg_stat_activity")
            .get(0);
        if waiting > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{node} never had a commit waiting for the change-log lock");
}

#[actix_web::test]
async fn three_nodes_behind_nginx_behave_as_one_server() {
    let db = fresh_database().await;
    let db_conn = cluster().connection_string(&db);
    let mut s3 = S3Server::start().await;
    let bucket = s3.bucket().await;
    let s3_env = s3.env(&bucket);
    let scratch = tempfile::tempdir().expect("scratch");
    // nginx's workers run as another user when the test runs as root.
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod scratch");
    let mut nodes = Vec::new();
    let mut data_roots = Vec::new();
    for name in NODES {
        // A disk of its own per node: the database and the bucket are all they share.
        let data_root = scratch.path().join(name);
        std::fs::create_dir_all(&data_root).expect("data root");
        let log = scratch.path().join(format!("{name}.log"));
        // node-b has one export slot, for the job that its death must fail.
        let slots = if name == "node-b" { "1" } else { "2" };
        let mut env = vec![("NODE_ID", name), ("DB_POOL_SIZE", "8"), ("EXPORT_MAX_CONCURRENT", slots)];
        env.extend(s3_env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        // Named, so that the test can see which node's sessions wait for what.
        let node_conn = format!("{db_conn} application_name={name}");
        nodes.push(ChildServer::start(&node_conn, &data_root, log, &env).await);
        data_roots.push(data_root);
    }
    let ports: Vec<u16> = nodes
        .iter()
        .map(|n| n.api.base.rsplit(':').next().and_then(|p| p.parse().ok()).expect("port"))
        .collect();
    let nginx_dir = scratch.path().join("nginx");
    std::fs::create_dir_all(&nginx_dir).expect("nginx dir");
    let nginx = Nginx::start(&nginx_dir, &ports).await;
    let lb = nginx.api.clone();

    // Round robin without stickiness: every node answers, and says which it is.
    let answering = nodes_answering(&lb, 6).await;
    assert_eq!(answering, NODES.iter().map(|n| n.to_string()).collect::<BTreeSet<_>>());
    let token = lb.admin_token().await;

    attachment_written_on_one_node_is_read_on_another(&nodes[0], &nodes[1], &lb, &token).await;
    let version =
        bundle_switch_reaches_every_node_within_a_second(&nodes[0], &[&nodes[1], &nodes[2]], &token).await;

    // A push storm and cursor-following pullers through nginx; node C dies with SIGKILL mid-storm.
    let storm = start_storm(&lb, &token, false);
    let stop_pullers = Arc::new(AtomicBool::new(false));
    let pullers = extra_pullers(&lb, &token, stop_pullers.clone());
    wait_for_acks(&storm.acked, 40).await;
    let before_kill = storm.acked.load(Ordering::SeqCst);
    // The kill must cut a push off, however fast commits are: the change-log lock is held here
    // until node C has a group commit waiting for it, so C dies with pushes in flight.
    let mut holder = connect(&db_conn).await;
    let held = holder.transaction().await.expect("begin");
    held.execute("SELECT pg_advisory_xact_lock($1)", &[&synkronus::db::records::CHANGELOG_LOCK])
        .await
        .expect("take the change-log lock");
    wait_for_a_commit_waiting_on(&db_conn, NODES[2]).await;
    nodes[2].kill().await;
    held.commit().await.expect("release the change-log lock");
    wait_for_acks(&storm.acked, before_kill + 60).await;
    let (outcomes, pulled) = finish_storm(storm).await;
    stop_pullers.store(true, Ordering::SeqCst);
    // nginx answers 502 for a push whose node died under it: to the device, that is what a 503
    // is to a lone server (retry with the same transmission id), and nothing else may appear.
    let outcomes: Vec<_> =
        outcomes.into_iter().map(|(t, n, o)| (t, n, if o == Some(502) { Some(503) } else { o })).collect();
    assert!(outcomes.iter().any(|(_, _, o)| *o == Some(503)), "some push was cut off by the kill");
    retry_and_verify(&lb, &token, pulled, outcomes).await;

    // The other pullers saw no change twice and none out of order (absorb_page checks as they
    // go); where each stopped, it had every change up to there: a prefix of the whole log.
    let (all, _) = lb.pull_all(&token, "cluster-check", 0, 500).await;
    let log: BTreeMap<String, i64> = all
        .iter()
        .map(|r| {
            (r["observation_id"].as_str().expect("id").to_string(), r["version"].as_i64().expect("version"))
        })
        .collect();
    for puller in pullers {
        let seen = puller.await.expect("puller");
        let reached = seen.values().copied().max().expect("a puller made progress");
        let expected: BTreeMap<String, i64> =
            log.iter().filter(|(_, v)| **v <= reached).map(|(k, v)| (k.clone(), *v)).collect();
        assert_eq!(seen, expected, "a puller skipped or misplaced a change");
    }

    let export_job =
        export_job_started_on_one_node_is_downloaded_on_another(&nodes[0], &nodes[1], &lb, &token, all.len())
            .await;

    // The object store hangs, then stops, under the two live nodes, and comes back each time.
    wait_until_cached(&[&data_roots[0], &data_roots[1]], &version).await;
    let cached = CachedBundle { version, zip: small_bundle("3.1.0", "cluster") };
    let outage = Outage {
        nodes: [&nodes[0].api, &nodes[1].api],
        lb: &lb,
        token: &token,
        export_job: &export_job,
        cached,
    };
    a_frozen_store_gives_503s_then_serves_again(&s3, &outage).await;
    an_object_store_outage_gives_503s_and_recovers(&mut s3, &bucket, &outage).await;
    // Two more records (pushed during the outages): an export job runs and downloads as before.
    export_job_started_on_one_node_is_downloaded_on_another(&nodes[1], &nodes[0], &lb, &token, all.len() + 2)
        .await;

    a_job_whose_node_is_killed_becomes_failed(&mut nodes[1], NODES[1], &lb, &token).await;
    drop(nginx);
    drop(nodes);
}
