//! Read replicas (docs/api.md §18.3) against a real primary and a real hot standby that each test
//! makes itself: `initdb` of a primary with streaming replication on, `pg_basebackup -R` of it,
//! the standby started on its own socket folder, both under the test's temporary folder and
//! stopped when the test ends. Replication lag is made deterministic with
//! `pg_wal_replay_pause()` / `pg_wal_replay_resume()` on the standby.

use std::collections::{BTreeMap, HashSet};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use synkronus::db::embedded::EmbeddedPostgres;

use crate::helpers::TestApp;

/// The database the server uses on the pair.
const DB: &str = "synkronus";
/// Short, so that a fallback costs the tests little time.
const MAX_WAIT_MS: u64 = 300;

/// A primary and its hot standby, stopped (immediately) when dropped.
pub struct ReplicaPair {
    primary: EmbeddedPostgres,
    replica: EmbeddedPostgres,
    _dir: tempfile::TempDir,
}

/// Light settings: the machine is shared, durability does not matter here.
fn cluster(dir: std::path::PathBuf) -> EmbeddedPostgres {
    EmbeddedPostgres::new(dir, None, "postgres")
        .expect("PostgreSQL binaries for tests")
        .with_setting("wal_level=replica")
        .with_setting("max_wal_senders=4")
        .with_setting("hot_standby=on")
        .with_setting("hot_standby_feedback=on")
        .with_setting("max_connections=100")
        .with_setting("shared_buffers=16MB")
        .with_setting("fsync=off")
        .with_setting("synchronous_commit=off")
}

impl ReplicaPair {
    pub async fn start() -> Self {
        // Under /tmp with short names: the socket paths must stay short, and the postgres user
        // (when we are root) must be able to reach them.
        let dir = tempfile::Builder::new().prefix("rp").tempdir_in("/tmp").expect("temp dir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let primary = cluster(dir.path().join("p"));
        let starter = primary.clone();
        tokio::task::spawn_blocking(move || starter.start()).await.unwrap().expect("start primary");
        primary.ensure_database(DB).await.expect("create database");

        let replica_dir = dir.path().join("r");
        std::fs::create_dir(&replica_dir).expect("replica dir");
        std::fs::set_permissions(&replica_dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        let mut backup = std::process::Command::new(primary.bin_dir().join("pg_basebackup"));
        backup
            .args(["-R", "-X", "stream", "-c", "fast", "-D"])
            .arg(&replica_dir)
            .arg("-d")
            .arg(primary.connection_string("postgres"))
            .current_dir("/");
        if nix::unistd::geteuid().is_root() {
            let user = nix::unistd::User::from_name("postgres").unwrap().expect("postgres user");
            nix::unistd::chown(&replica_dir, Some(user.uid), Some(user.gid)).expect("chown");
            backup.uid(user.uid.as_raw()).gid(user.gid.as_raw());
        }
        let out = tokio::task::spawn_blocking(move || backup.output()).await.unwrap().expect("pg_basebackup");
        assert!(out.status.success(), "pg_basebackup: {}", String::from_utf8_lossy(&out.stderr));
        // The primary's socket lives in its data folder, and the backup copies its lock file.
        let _ = std::fs::remove_file(replica_dir.join(".s.PGSQL.5432.lock"));
        let replica = cluster(replica_dir);
        let starter = replica.clone();
        tokio::task::spawn_blocking(move || starter.start()).await.unwrap().expect("start replica");
        let pair = ReplicaPair { primary, replica, _dir: dir };
        assert!(pair.replica_query("SELECT pg_is_in_recovery()").await.get::<_, bool>(0), "a hot standby");
        pair
    }

    pub fn primary_conn(&self) -> String {
        self.primary.connection_string(DB)
    }

    pub fn replica_conn(&self) -> String {
        self.replica.connection_string(DB)
    }

    async fn query(conn: &str, sql: &str) -> tokio_postgres::Row {
        let (client, connection) =
            tokio_postgres::connect(conn, tokio_postgres::NoTls).await.expect("connect");
        let driver = tokio::spawn(connection);
        let row = client.query_one(sql, &[]).await.expect(sql);
        drop(client);
        let _ = driver.await;
        row
    }

    async fn replica_query(&self, sql: &str) -> tokio_postgres::Row {
        Self::query(&self.replica_conn(), sql).await
    }

    pub async fn pause_replay(&self) {
        self.replica_query("SELECT pg_wal_replay_pause()::text").await;
    }

    pub async fn resume_replay(&self) {
        self.replica_query("SELECT pg_wal_replay_resume()::text").await;
    }

    async fn head(conn: &str) -> i64 {
        Self::query(conn, "SELECT head FROM change_head").await.get(0)
    }

    /// The standby's change head; -1 while it has not replayed the migrations yet.
    async fn replica_head(&self) -> i64 {
        let (client, connection) =
            tokio_postgres::connect(&self.replica_conn(), tokio_postgres::NoTls).await.expect("connect");
        let driver = tokio::spawn(connection);
        let head = client.query_one("SELECT head FROM change_head", &[]).await.map_or(-1, |r| r.get(0));
        drop(client);
        let _ = driver.await;
        head
    }

    /// Waits until the standby shows the primary's change head.
    pub async fn wait_replayed(&self) {
        let target = Self::head(&self.primary_conn()).await;
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.replica_head().await < target {
            assert!(Instant::now() < deadline, "the replica did not catch up");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until the standby has replayed everything the primary has committed so far, rows
    /// without a change_id (users, device sightings) included. The insert position, not
    /// `pg_current_wal_lsn()` (what is written out): with `synchronous_commit=off` a commit returns
    /// before its WAL is written, and the standby was found still at head 0 after waiting for the
    /// written position, failing a scoped pull's check by chance.
    pub async fn wait_replayed_all(&self) {
        let lsn: String =
            Self::query(&self.primary_conn(), "SELECT pg_current_wal_insert_lsn()::text").await.get(0);
        let deadline = Instant::now() + Duration::from_secs(20);
        let caught_up = format!("SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn");
        while !self.replica_query(&caught_up).await.get::<_, bool>(0) {
            assert!(Instant::now() < deadline, "the replica did not catch up");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn stop_replica(&self) {
        let r = self.replica.clone();
        tokio::task::spawn_blocking(move || r.stop()).await.unwrap().expect("stop replica");
    }

    pub async fn start_replica(&self) {
        let r = self.replica.clone();
        tokio::task::spawn_blocking(move || r.start()).await.unwrap().expect("start replica");
    }
}

impl Drop for ReplicaPair {
    fn drop(&mut self) {
        let _ = self.replica.kill();
        let _ = self.primary.kill();
    }
}

/// A server on the pair's primary, reading from its replica.
async fn server(pair: &ReplicaPair) -> TestApp {
    let wait = MAX_WAIT_MS.to_string();
    TestApp::spawn_on(
        pair.primary_conn(),
        &[("DB_READ_REPLICAS", &pair.replica_conn()), ("REPLICA_MAX_WAIT_MS", &wait), ("DB_POOL_SIZE", "4")],
    )
    .await
}

/// Waits until `/health` lists the replica as healthy (in rotation).
async fn wait_in_rotation(app: &TestApp, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let (_, body) = app.call(Method::GET, "/health", None, None).await;
        if body["replicas"][0]["state"] == "healthy" {
            return;
        }
        assert!(Instant::now() < deadline, "the replica did not enter the rotation: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn served_by(res: &reqwest::Response) -> String {
    res.headers().get("x-served-by").and_then(|v| v.to_str().ok()).unwrap_or("").to_string()
}

/// One synkronus pull; returns (status, body, x-served-by).
async fn pull(app: &TestApp, token: &str, since: i64, limit: i64) -> (StatusCode, Value, String) {
    let body = json!({"client_id": "puller", "since": {"version": since}});
    let res = app.send(Method::POST, &format!("/sync/pull?limit={limit}"), Some(token), Some(body)).await;
    let (status, by) = (res.status(), served_by(&res));
    (status, res.json().await.unwrap_or(Value::Null), by)
}

async fn push_records(app: &TestApp, token: &str, tx: &str, ids: &[String], form_type: &str) -> i64 {
    let records: Vec<Value> = ids
        .iter()
        .map(|id| json!({"observation_id": id, "form_type": form_type, "data": {"id": id}}))
        .collect();
    let (status, body) =
        app.push(token, json!({"transmission_id": tx, "client_id": "pusher", "records": records})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, status_body) = app.call(Method::GET, "/status", Some(token), None).await;
    status_body["current_change_id"].as_i64().expect("head")
}

fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

#[actix_web::test]
async fn without_replicas_every_read_says_primary() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let (status, body, by) = pull(&app, &admin, 0, 10).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(by, "primary");
    let (_, health) = app.call(Method::GET, "/health", None, None).await;
    assert!(health.get("replicas").is_none(), "no replica list without replicas: {health}");
}

/// A device that pushed (primary head H) and pulls with since = H while the replica's replay is
/// paused gets its answer from the primary within REPLICA_MAX_WAIT_MS plus a little, never a
/// head below H; after resume, reads go back to the replica.
#[actix_web::test]
async fn a_lagging_replica_is_waited_for_then_the_primary_answers() {
    let pair = ReplicaPair::start().await;
    let app = server(&pair).await;
    let admin = app.admin_token().await;
    // Reads by a user who writes nothing: only their cursor holds them to the primary (the
    // pusher's own reads reflect their pushes whatever the cursor, see the test below).
    let reader = app.user_token(&admin, "reader", "read-only").await;
    push_records(&app, &admin, "t1", &ids("a", 5), "f").await;
    pair.wait_replayed().await;
    wait_in_rotation(&app, Duration::from_secs(10)).await;
    let (status, body, by) = pull(&app, &admin, 0, 50).await;
    assert_eq!((status, by.as_str()), (StatusCode::OK, "replica"), "{body}");
    assert_eq!(body["records"].as_array().unwrap().len(), 5);

    pair.pause_replay().await;
    let h = push_records(&app, &admin, "t2", &ids("b", 5), "f").await;
    let started = Instant::now();
    let (status, body, by) = pull(&app, &reader, h, 50).await;
    let took = started.elapsed();
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["current_version"].as_i64().unwrap() >= h, "monotonic: {body} below {h}");
    assert_eq!(by, "primary", "the paused replica is behind the cursor");
    assert!(took < Duration::from_millis(MAX_WAIT_MS + 700), "answered after {took:?}");
    // The other cursor-carrying reads: the spec dialect under a prefix, and the manifest.
    for path in [
        format!("/api/v1/sync/pull?client_id=x&since={h}"),
        format!("/attachments/manifest?after_change_id={h}"),
    ] {
        let res = app.send(Method::GET, &path, Some(&reader), None).await;
        assert_eq!((res.status(), served_by(&res).as_str()), (StatusCode::OK, "primary"), "{path}");
        let body: Value = res.json().await.unwrap();
        assert!(body["change_cutoff"].as_i64().unwrap() >= h, "{path}: {body}");
    }
    let (status, body) =
        app.call(Method::GET, "/attachments/manifest?after_change_id=0", Some(&reader), None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body["change_cutoff"].as_i64().unwrap() < h, "served by the paused replica: {body}");
    // A cursor the paused replica has reached is still served by it.
    let (status, body, by) = pull(&app, &reader, 0, 50).await;
    assert_eq!((status, by.as_str()), (StatusCode::OK, "replica"), "{body}");
    assert!(body["current_version"].as_i64().unwrap() < h, "the replica really is paused");

    pair.resume_replay().await;
    pair.wait_replayed().await;
    let (status, body, by) = pull(&app, &admin, h, 50).await;
    assert_eq!((status, by.as_str()), (StatusCode::OK, "replica"), "{body}");
    assert!(body["current_version"].as_i64().unwrap() >= h);
    let (status, body, by) = pull(&app, &admin, 0, 50).await;
    assert_eq!((status, by.as_str()), (StatusCode::OK, "replica"));
    assert_eq!(body["records"].as_array().unwrap().len(), 10);

    let metrics = app.send(Method::GET, "/metrics", Some(&admin), None).await.text().await.unwrap();
    // Every series also carries the `node` label (docs/api.md §18.2).
    let has = |name: &str, label: &str| {
        metrics.lines().any(|line| line.starts_with(&format!("{name}{{")) && line.contains(label))
    };
    assert!(has("synkronus_db_read_fallbacks_total", "reason=\"behind\""), "{metrics}");
    assert!(has("synkronus_db_reads_total", "target=\"replica\""), "{metrics}");
}

/// What one cursor-following puller saw.
struct Pulled {
    seen: BTreeMap<String, i64>,
    cursor: i64,
    from_replica: usize,
    pulls: usize,
}

/// Follows the cursor until `done` is set and the cursor has reached `total`, asserting on every
/// page: 200, strictly increasing change_ids, no record twice, the cursor never going back.
async fn follow(app: &TestApp, token: String, limit: i64, total: i64, done: Arc<AtomicBool>) -> Pulled {
    let mut out = Pulled { seen: BTreeMap::new(), cursor: 0, from_replica: 0, pulls: 0 };
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let finished = done.load(Ordering::SeqCst);
        let (status, body, by) = pull(app, &token, out.cursor, limit).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        out.from_replica += usize::from(by == "replica");
        out.pulls += 1;
        let mut last = out.cursor;
        for r in body["records"].as_array().expect("records") {
            let v = r["version"].as_i64().expect("version");
            assert!(v > last, "strictly increasing ({v} after {last})");
            last = v;
            let id = r["observation_id"].as_str().expect("id").to_string();
            assert!(out.seen.insert(id.clone(), v).is_none(), "{id} came twice");
        }
        let next = if body["has_more"] == true { &body["change_cutoff"] } else { &body["current_version"] };
        let next = next.as_i64().expect("cursor");
        assert!(next >= out.cursor, "the cursor went back from {} to {next}", out.cursor);
        out.cursor = next;
        if finished && out.cursor >= total && body["has_more"] == false {
            return out;
        }
        assert!(Instant::now() < deadline, "the puller never caught up (cursor {})", out.cursor);
        if body["has_more"] == false {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// The sync engine's no-skip test with every pull aimed at a replica whose replay is paused and
/// resumed at random moments.
#[actix_web::test]
async fn no_skipped_change_with_a_replica_paused_at_random() {
    let pair = ReplicaPair::start().await;
    let app = Arc::new(server(&pair).await);
    let admin = app.admin_token().await;
    wait_in_rotation(&app, Duration::from_secs(10)).await;
    const PUSHERS: usize = 8;
    const PUSHES_EACH: usize = 12;
    const RECORDS_EACH: usize = 4;
    let total = (PUSHERS * PUSHES_EACH * RECORDS_EACH) as i64;
    let done = Arc::new(AtomicBool::new(false));

    let toggler = {
        let done = done.clone();
        let conn = pair.replica_conn();
        tokio::spawn(async move {
            let mut toggles = 0;
            while !done.load(Ordering::SeqCst) {
                // Some pauses outlast REPLICA_MAX_WAIT_MS, so both the wait and the fallback happen.
                let sleep = rand::thread_rng().gen_range(5..450);
                tokio::time::sleep(Duration::from_millis(sleep)).await;
                let sql = if toggles % 2 == 0 {
                    "SELECT pg_wal_replay_pause()::text"
                } else {
                    "SELECT pg_wal_replay_resume()::text"
                };
                ReplicaPair::query(&conn, sql).await;
                toggles += 1;
            }
            ReplicaPair::query(&conn, "SELECT pg_wal_replay_resume()::text").await;
            toggles
        })
    };
    let pullers: Vec<_> = [1, 7, 50, 500]
        .into_iter()
        .map(|limit| {
            let (app, token, done) = (app.clone(), admin.clone(), done.clone());
            tokio::spawn(async move { follow(&app, token, limit, total, done).await })
        })
        .collect();
    let pushers: Vec<_> = (0..PUSHERS)
        .map(|d| {
            let (app, token) = (app.clone(), admin.clone());
            tokio::spawn(async move {
                for n in 0..PUSHES_EACH {
                    let records: Vec<Value> = (0..RECORDS_EACH)
                        .map(|k| json!({"observation_id": format!("d{d}-{n}-{k}"), "form_type": "f", "data": {"d": d}}))
                        .collect();
                    let body = json!({"transmission_id": format!("{d}-{n}"), "client_id": format!("dev-{d}"), "records": records});
                    let (status, body) = app.push(&token, body).await;
                    assert_eq!(status, StatusCode::OK, "{body}");
                    let pause = rand::thread_rng().gen_range(0..100);
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
            })
        })
        .collect();
    for p in pushers {
        p.await.expect("pusher");
    }
    done.store(true, Ordering::SeqCst);
    let toggles = toggler.await.expect("toggler");
    let expected: HashSet<String> = (0..PUSHERS)
        .flat_map(|d| {
            (0..PUSHES_EACH).flat_map(move |n| (0..RECORDS_EACH).map(move |k| format!("d{d}-{n}-{k}")))
        })
        .collect();
    let (mut from_replica, mut pulls) = (0, 0);
    for p in pullers {
        let pulled = p.await.expect("puller");
        let got: HashSet<String> = pulled.seen.keys().cloned().collect();
        assert_eq!(got, expected, "a puller missed changes");
        assert_eq!(pulled.cursor, total);
        from_replica += pulled.from_replica;
        pulls += pulled.pulls;
    }
    eprintln!(
        "{pulls} pulls, {from_replica} served by the replica, replay paused or resumed {toggles} times"
    );
    assert!(toggles >= 2, "replay was paused and resumed");
    assert!(from_replica > 0, "the replica served pulls");
}

/// The replica stopped mid-run: no 5xx, reads fall back to the primary, and the replica returns
/// to the rotation after it restarts.
#[actix_web::test]
async fn a_stopped_replica_falls_back_to_the_primary_and_returns() {
    let pair = ReplicaPair::start().await;
    let app = Arc::new(server(&pair).await);
    let admin = app.admin_token().await;
    wait_in_rotation(&app, Duration::from_secs(10)).await;
    let done = Arc::new(AtomicBool::new(false));
    let served = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
    let reader = {
        let (app, token, done, served) = (app.clone(), admin.clone(), done.clone(), served.clone());
        tokio::spawn(async move {
            let mut cursor = 0;
            while !done.load(Ordering::SeqCst) {
                let (status, body, by) = pull(&app, &token, cursor, 20).await;
                assert_eq!(status, StatusCode::OK, "{body}");
                served[usize::from(by == "replica")].fetch_add(1, Ordering::SeqCst);
                let next = body["current_version"].as_i64().unwrap();
                assert!(next >= cursor, "the cursor went back");
                cursor = next;
                let (status, body) = app.call(Method::GET, "/observations?limit=5", Some(&token), None).await;
                assert_eq!(status, StatusCode::OK, "{body}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    for round in 0..3 {
        push_records(&app, &admin, &format!("before-{round}"), &ids(&format!("x{round}"), 3), "f").await;
    }
    served_at_least(&served[1], 1, "the replica never served the reader").await;
    pair.stop_replica().await;
    let primary_before = served[0].load(Ordering::SeqCst);
    for round in 0..5 {
        push_records(&app, &admin, &format!("down-{round}"), &ids(&format!("y{round}"), 3), "f").await;
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, health) = app.call(Method::GET, "/health", None, None).await;
        if health["replicas"][0]["state"] == "unreachable" {
            break;
        }
        assert!(Instant::now() < deadline, "the stopped replica is still in rotation: {health}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    served_at_least(&served[0], primary_before + 1, "the primary did not take over").await;

    pair.start_replica().await;
    wait_in_rotation(&app, Duration::from_secs(20)).await;
    let replica_before = served[1].load(Ordering::SeqCst);
    served_at_least(&served[1], replica_before + 1, "the replica is not back in rotation").await;
    done.store(true, Ordering::SeqCst);
    reader.await.expect("reader");
}

/// Waits until `count` reaches `at_least` (the reader task counts what served each read).
async fn served_at_least(count: &AtomicUsize, at_least: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while count.load(Ordering::SeqCst) < at_least {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Exports and statistics read from a replica equal the primary's at the same position.
#[actix_web::test]
async fn exports_and_statistics_from_a_replica_equal_the_primarys() {
    let pair = ReplicaPair::start().await;
    let app = server(&pair).await;
    // The same database without replicas: every read from the primary.
    let on_primary = TestApp::spawn_on(pair.primary_conn(), &[]).await;
    let admin = app.admin_token().await;
    push_records(&app, &admin, "e1", &ids("a", 7), "alpha").await;
    push_records(&app, &admin, "e2", &ids("b", 4), "beta").await;
    let (status, body) = app
        .push(
            &admin,
            json!({"transmission_id": "e3", "client_id": "pusher",
            "records": [{"observation_id": "a-1", "form_type": "alpha", "data": {}, "deleted": true}]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    pair.wait_replayed().await;
    wait_in_rotation(&app, Duration::from_secs(10)).await;

    for path in ["/stats/observations", "/data/export?format=json", "/data/export?format=csv&form_type=alpha"]
    {
        let from_replica = app.send(Method::GET, path, Some(&admin), None).await;
        assert_eq!(from_replica.status(), StatusCode::OK, "{path}");
        assert_eq!(served_by(&from_replica), "replica", "{path}");
        let from_primary = on_primary.send(Method::GET, path, Some(&admin), None).await;
        assert_eq!(served_by(&from_primary), "primary", "{path}");
        let head = |r: &reqwest::Response| r.headers().get("x-export-change-id").cloned();
        assert_eq!(head(&from_replica), head(&from_primary), "{path}: same snapshot head");
        let (a, b) = (from_replica.text().await.unwrap(), from_primary.text().await.unwrap());
        if path.starts_with("/stats") {
            let strip = |t: &str| {
                let mut v: Value = serde_json::from_str(t).unwrap();
                v.as_object_mut().unwrap().remove("computedAt");
                v
            };
            assert_eq!(strip(&a), strip(&b), "{path}");
            assert_eq!(strip(&a)["totalCount"], 10, "{a}");
        } else {
            assert_eq!(a, b, "{path}");
            assert!(!a.is_empty());
        }
    }
    let res = app.send(Method::GET, "/devices", Some(&admin), None).await;
    assert_eq!((res.status(), served_by(&res).as_str()), (StatusCode::OK, "replica"));
    let res = app.send(Method::GET, "/observations/a-2/history", Some(&admin), None).await;
    assert_eq!((res.status(), served_by(&res).as_str()), (StatusCode::OK, "replica"));
}

fn observation_ids(records: &Value) -> HashSet<String> {
    records
        .as_array()
        .expect("records")
        .iter()
        .map(|r| r["observation_id"].as_str().expect("id").to_string())
        .collect()
}

/// Read your writes (docs/api.md §18.3): with the replica's replay paused, a user who pushed, or
/// uploaded an attachment, reads it back at once through any node: a pull from their old cursor,
/// their observation listing, the spec dialect, statistics, an export, a record's history and
/// the attachment manifest. An admin who deleted a user no longer sees that user's devices. Users
/// who wrote nothing are still served by the paused replica.
#[actix_web::test]
async fn a_user_reads_their_own_writes_through_a_paused_replica() {
    let pair = ReplicaPair::start().await;
    let node_a = server(&pair).await;
    let node_b = server(&pair).await;
    let admin = node_a.admin_token().await;
    let writer = node_a.user_token(&admin, "writer", "read-write").await;
    let bystander = node_a.user_token(&admin, "bystander", "read-only").await;
    let before = push_records(&node_a, &writer, "w0", &ids("old", 2), "f").await;
    // A device of the bystander's, for /devices to lose with the user.
    let (status, body, _) = pull(&node_b, &bystander, 0, 50).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, devices) = node_a.call(Method::GET, "/devices?username=bystander", Some(&admin), None).await;
        if devices.as_array().is_some_and(|d| !d.is_empty()) {
            break;
        }
        assert!(Instant::now() < deadline, "the sighting was never stored: {devices}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    pair.wait_replayed_all().await;
    wait_in_rotation(&node_a, Duration::from_secs(10)).await;
    wait_in_rotation(&node_b, Duration::from_secs(10)).await;
    let (status, body, by) = pull(&node_b, &writer, before, 50).await;
    assert_eq!((status, by.as_str()), (StatusCode::OK, "replica"), "{body}");

    pair.pause_replay().await;
    let new_ids: HashSet<String> = ids("new", 3).into_iter().collect();
    let h = push_records(&node_a, &writer, "w1", &ids("new", 3), "f").await;
    for (name, node) in [("the pushing node", &node_a), ("another node", &node_b)] {
        let (status, body, _) = pull(node, &writer, before, 50).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(observation_ids(&body["records"]), new_ids, "{name}: a pull from the old cursor: {body}");
        assert!(body["current_version"].as_i64().unwrap() >= h, "{name}: {body}");

        let (status, body) = node
            .call(Method::GET, &format!("/api/v1/sync/pull?client_id=x&since={before}"), Some(&writer), None)
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["records"].as_array().map(Vec::len), Some(3), "{name}: the spec dialect: {body}");

        let (status, body) = node.call(Method::GET, "/observations", Some(&writer), None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let listed = observation_ids(&body["observations"]);
        assert!(new_ids.is_subset(&listed), "{name}: the listing: {body}");

        let (status, body) = node.call(Method::GET, "/observations/new-0/history", Some(&writer), None).await;
        assert_eq!(status, StatusCode::OK, "{name}: the history: {body}");

        let (status, body) = node.call(Method::GET, "/stats/observations", Some(&writer), None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["totalCount"], 5, "{name}: the statistics: {body}");

        let res = node.send(Method::GET, "/data/export?format=json", Some(&writer), None).await;
        assert_eq!(res.status(), StatusCode::OK);
        let text = res.text().await.unwrap();
        assert!(text.contains("new-2"), "{name}: the export: {text}");
    }
    // Marks are per user: the bystander still reads the paused replica.
    let (status, body, by) = pull(&node_b, &bystander, before, 50).await;
    assert_eq!((status, by.as_str()), (StatusCode::OK, "replica"), "{body}");
    assert!(body["current_version"].as_i64().unwrap() < h, "{body}");

    // An attachment uploaded through one node is in the manifest through the other.
    let (status, body) = node_b.put_bytes(&writer, "/attachments/rw.bin", b"mine", None).await;
    assert!(status.is_success(), "{body}");
    let (status, body) = node_a
        .call(Method::GET, &format!("/attachments/manifest?after_change_id={h}"), Some(&writer), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.to_string().contains("rw.bin"), "the manifest: {body}");

    // A write without a change_id: the deleted user's device is gone from the admin's list.
    let (status, body) = node_a.call(Method::DELETE, "/users/bystander", Some(&admin), None).await;
    assert!(status.is_success(), "{body}");
    let (status, body) = node_b.call(Method::GET, "/devices", Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(!body.to_string().contains("bystander"), "the devices list: {body}");
    pair.resume_replay().await;
}

/// Read your writes under a scope set (docs/api.md §18.3 and §20): a scoped worker's pull is read
/// by the scoped page (src/db/scope/pull.rs) and their manifest by the scoped manifest. With the
/// replica's replay paused, what the worker pushed (a new record, an update of a record of their
/// district, an update refused as outside their set) and uploaded is in both at once through
/// either node, and what they may not see stays out; another scoped worker is still served by
/// the paused replica.
#[actix_web::test]
async fn a_scoped_user_reads_their_own_writes_through_a_paused_replica() {
    use crate::scopes::{push, record, set_attributes, set_rules};

    let pair = ReplicaPair::start().await;
    let node_a = server(&pair).await;
    let node_b = server(&pair).await;
    let admin = node_a.admin_token().await;
    let north = node_a.user_token(&admin, "north", "read-write").await;
    set_attributes(&node_a, &admin, "north", json!({"district": ["north"]})).await;
    let south = node_a.user_token(&admin, "south", "read-write").await;
    set_attributes(&node_a, &admin, "south", json!({"district": ["south"]})).await;
    push(
        &node_a,
        &admin,
        "admin-device",
        vec![
            record("h-north", "household", json!({"district": "north"})),
            record("h-south", "household", json!({"district": "south"})),
        ],
    )
    .await;
    let rules = json!([{"name": "workers: their districts' households",
        "applies_to": {"roles": ["read-write"]}, "form_types": ["household"],
        "where": {"field": "district", "in_attribute": "district"}}]);
    set_rules(&node_a, &admin, rules).await;
    // Neither worker wrote anything yet: the replica may serve them, once it has caught up.
    pair.wait_replayed_all().await;
    wait_in_rotation(&node_a, Duration::from_secs(10)).await;
    wait_in_rotation(&node_b, Duration::from_secs(10)).await;
    let (north_seen, north_cursor) = node_a.pull_all(&north, "puller", 0, 50).await;
    assert_eq!(observation_ids(&Value::from(north_seen)), HashSet::from(["h-north".to_string()]));
    let (_, south_cursor) = node_a.pull_all(&south, "puller", 0, 50).await;
    // The pulls from 0 noted the devices (src/db/scope/devices.rs).
    pair.wait_replayed_all().await;
    let (status, body, by) = pull(&node_b, &north, north_cursor, 50).await;
    assert_eq!((status, by.as_str()), (StatusCode::OK, "replica"), "{body}");

    pair.pause_replay().await;
    // Another user's write in the south, which the north worker must not receive.
    push(
        &node_a,
        &admin,
        "admin-device",
        vec![record("h-south-2", "household", json!({"district": "south"}))],
    )
    .await;
    let body = json!({"transmission_id": "north-1", "client_id": "puller", "records": [
        record("n-own", "visit", json!({"district": "west"})),
        record("h-north", "household", json!({"district": "north", "visited": true})),
        record("h-south", "household", json!({"district": "north", "stolen": true})),
    ]});
    let (status, answer) = node_a.push(&north, body).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["failed_records"][0]["error"], "OUT_OF_SCOPE", "{answer}");
    let (_, status_body) = node_a.call(Method::GET, "/status", Some(&north), None).await;
    let h = status_body["current_change_id"].as_i64().expect("head");

    for (name, node) in [("the pushing node", &node_a), ("another node", &node_b)] {
        let (status, body, _) = pull(node, &north, north_cursor, 50).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(body["current_version"].as_i64().unwrap() >= h, "{name}: {body}");
        let records = body["records"].as_array().expect("records");
        let by_id: BTreeMap<&str, &Value> =
            records.iter().map(|r| (r["observation_id"].as_str().expect("id"), r)).collect();
        assert_eq!(
            by_id.keys().copied().collect::<Vec<_>>(),
            ["h-north", "h-south", "n-own"],
            "{name}: the scoped page from the old cursor: {body}"
        );
        assert_eq!(by_id["h-north"]["data"], json!({"district": "north", "visited": true}), "{name}");
        assert_eq!(by_id["h-south"]["deleted"], true, "{name}: the refusal's tombstone: {body}");

        let (status, body) = node
            .call(
                Method::GET,
                &format!("/api/v1/sync/pull?client_id=x&since={north_cursor}"),
                Some(&north),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["records"].as_array().map(Vec::len), Some(3), "{name}: the spec dialect: {body}");

        let (status, body) =
            node.call(Method::GET, "/observations/h-north/history", Some(&north), None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["revisions"].as_array().map(Vec::len), Some(2), "{name}: the history: {body}");
    }

    // An attachment uploaded through one node is in the scoped manifest through the other.
    let (status, body) = node_b.put_bytes(&north, "/attachments/north.bin", b"mine", None).await;
    assert!(status.is_success(), "{body}");
    let (status, body) = node_a
        .call(Method::GET, &format!("/attachments/manifest?after_change_id={h}"), Some(&north), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.to_string().contains("north.bin"), "the scoped manifest: {body}");

    // The south worker wrote nothing: the paused replica still serves them.
    let (status, body, by) = pull(&node_b, &south, south_cursor, 50).await;
    assert_eq!((status, by.as_str()), (StatusCode::OK, "replica"), "{body}");
    assert!(body["records"].as_array().is_some_and(Vec::is_empty), "{body}");
    pair.resume_replay().await;
}

/// A device that starts over (cursor 0) on a replica that has not replayed a change of the scope
/// set yet receives what that change moves on its next sync (S2, S3): the redeliveries it may skip
/// are those its first page's snapshot already showed, not those the primary held at that moment
/// (docs/architecture.md, "Scoped sync").
#[actix_web::test]
async fn a_device_starting_over_on_a_replica_behind_a_set_change_receives_the_change() {
    use crate::scopes::{push, record, set_rules, Device};
    let pair = ReplicaPair::start().await;
    let app = server(&pair).await;
    wait_in_rotation(&app, Duration::from_secs(30)).await;
    let admin = app.admin_token().await;
    let worker = app.user_token(&admin, "worker", "read-write").await;
    let rules = |district: &str| {
        json!([{"name": "one district's households", "applies_to": {"roles": ["read-write"]},
                "form_types": ["household"], "where": {"field": "district", "equals": district}}])
    };
    set_rules(&app, &admin, rules("north")).await;
    let households = vec![
        record("h-north", "household", json!({"district": "north"})),
        record("h-south", "household", json!({"district": "south"})),
    ];
    push(&app, &admin, "admin-device", households).await;
    pair.wait_replayed().await;
    pair.pause_replay().await;
    set_rules(&app, &admin, rules("south")).await;

    // The phone starts over; the replica answers as before the change.
    let body = json!({"client_id": "phone", "since": {"version": 0}});
    let res = app.send(Method::POST, "/sync/pull?limit=50", Some(&worker), Some(body)).await;
    assert_eq!(served_by(&res), "replica");
    let page: Value = res.json().await.expect("page");
    assert_eq!(page["has_more"], false, "{page}");
    assert_eq!(page["records"].as_array().map(Vec::len), Some(1), "{page}");
    assert_eq!(page["records"][0]["observation_id"], "h-north", "{page}");
    let mut phone = Device::new("phone");
    phone.records.insert("h-north".into(), json!({"district": "north"}));
    phone.cursor = page["current_version"].as_i64().expect("current_version");

    pair.resume_replay().await;
    pair.wait_replayed().await;
    phone.sync(&app, &worker, 50).await;
    assert_eq!(phone.ids(), ["h-south"], "{:?}", phone.records);
}
