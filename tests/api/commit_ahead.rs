//! A push group written ahead of the commit before it (docs/architecture.md, "The change log"):
//! it commits right behind that commit, and is rolled back and committed the usual way when that
//! commit fails or another commit comes in between. Each case is staged with sessions of our own
//! that hold the rows and the lock the change log waits for, so the order is certain.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::task::JoinHandle;

use crate::helpers::{connect, TestApp};

fn push_body(tid: &str, ids: &[String]) -> Value {
    let records: Vec<Value> =
        ids.iter().map(|id| json!({"observation_id": id, "form_type": "f", "data": {"id": id}})).collect();
    json!({"transmission_id": tid, "client_id": format!("device-{tid}"), "records": records})
}

fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

fn spawn_push(app: &TestApp, token: &str, body: Value) -> JoinHandle<(StatusCode, Value)> {
    let api = app.api.clone();
    let token = token.to_string();
    tokio::spawn(async move { api.push(&token, body).await })
}

/// Waits until a session is in the state `condition` (on `pg_stat_activity`) describes.
async fn wait_for(db: &tokio_postgres::Client, condition: &str, what: &str) {
    let sql = format!("SELECT count(*) FROM pg_stat_activity WHERE {condition}");
    for _ in 0..600 {
        let n: i64 = db.query_one(&sql, &[]).await.expect("pg_stat_activity").get(0);
        if n > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no session {what}");
}

/// Our own sessions are named `stager`; the server's are not. Other tests' databases share the
/// cluster, so every condition names this test's database.
const HEAD_UPDATE_BLOCKED: &str =
    "datname = current_database() AND application_name <> 'stager' AND wait_event_type = 'Lock' AND query LIKE 'UPDATE change_head%'";
const WRITTEN_AHEAD: &str =
    "datname = current_database() AND application_name <> 'stager' AND state = 'idle in transaction' AND query LIKE 'INSERT INTO transmissions%'";
const WAITING_FOR_THE_LOCK: &str =
    "datname = current_database() AND application_name <> 'stager' AND wait_event_type = 'Lock' AND wait_event = 'advisory'";
const OURS_WAITING_FOR_THE_LOCK: &str =
    "datname = current_database() AND application_name = 'stager' AND wait_event_type = 'Lock' AND wait_event = 'advisory'";

/// The pushes' versions, sorted, from a pull of everything.
async fn versions(app: &TestApp, token: &str, of: &[String]) -> Vec<i64> {
    let (records, _) = app.pull_all(token, "checker", 0, 500).await;
    let mut v: Vec<i64> = records
        .iter()
        .filter(|r| of.iter().any(|id| r["observation_id"] == id.as_str()))
        .map(|r| r["version"].as_i64().expect("version"))
        .collect();
    v.sort_unstable();
    v
}

/// Push A held after its plan (its head update waits for our lock on the head row, held by
/// `head_row` until it sends COMMIT) and push B, which names other records, written ahead of it.
struct Staged {
    app: TestApp,
    admin: String,
    /// Connection string of our own sessions, and one of them for looking at the server's.
    conn: String,
    observer: tokio_postgres::Client,
    head_row: tokio_postgres::Client,
    a: JoinHandle<(StatusCode, Value)>,
    b: JoinHandle<(StatusCode, Value)>,
    a_ids: Vec<String>,
    b_ids: Vec<String>,
}

async fn stage() -> Staged {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let conn = format!("{} application_name=stager", app.db_conn);
    let observer = connect(&conn).await;
    let (a_ids, b_ids) = (ids("a", 30), ids("b", 20));
    let head_row = connect(&conn).await;
    head_row.batch_execute("BEGIN; SELECT * FROM change_head FOR UPDATE").await.expect("lock the head row");
    let a = spawn_push(&app, &admin, push_body("a", &a_ids));
    wait_for(&observer, HEAD_UPDATE_BLOCKED, "holding push A after its plan").await;
    let b = spawn_push(&app, &admin, push_body("b", &b_ids));
    // B's rows are written while A still holds the change-log lock.
    wait_for(&observer, WRITTEN_AHEAD, "with push B written ahead").await;
    Staged { app, admin, conn, observer, head_row, a, b, a_ids, b_ids }
}

#[actix_web::test]
async fn a_group_written_ahead_commits_right_behind_the_one_before() {
    let Staged { app, admin, observer: _, conn: _, head_row, a, b, a_ids, b_ids } = stage().await;
    assert!(!b.is_finished(), "B cannot answer before A commits");

    head_row.batch_execute("COMMIT").await.expect("release the head row");
    let (status, body) = a.await.expect("push A");
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["current_version"], 30);
    let (status, body) = b.await.expect("push B");
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["current_version"], 50, "B's ids follow A's");

    assert_eq!(versions(&app, &admin, &a_ids).await, (1..=30).collect::<Vec<_>>());
    assert_eq!(versions(&app, &admin, &b_ids).await, (31..=50).collect::<Vec<_>>());
    let (_, status) = app.call(reqwest::Method::GET, "/status", Some(&admin), None).await;
    assert_eq!(status["current_change_id"], 50);
    assert_counted(&app, &admin, 50).await;
}

/// The kept statistics count every record committed, ahead or not.
async fn assert_counted(app: &TestApp, token: &str, n: i64) {
    let (_, stats) = app.call(reqwest::Method::GET, "/stats/observations", Some(token), None).await;
    assert_eq!(stats["totalCount"], n, "{stats}");
}

#[actix_web::test]
async fn a_group_written_ahead_is_redone_when_another_commit_comes_in_between() {
    let Staged { app, admin, observer, conn, head_row, a, b, a_ids, b_ids } = stage().await;

    // Another process queues for the change-log lock behind A, and takes a change_id once it has it.
    let other_conn = conn;
    let (took_lock, lock_taken) = tokio::sync::oneshot::channel();
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let other = tokio::spawn(async move {
        let mut db = connect(&other_conn).await;
        let tx = db.transaction().await.expect("begin");
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&synkronus::db::records::CHANGELOG_LOCK])
            .await
            .expect("the change-log lock");
        tx.execute("UPDATE change_head SET head = head + 1", &[]).await.expect("take a change_id");
        took_lock.send(()).expect("test waits");
        released.await.expect("test releases");
        tx.commit().await.expect("commit");
    });
    wait_for(&observer, OURS_WAITING_FOR_THE_LOCK, "of ours queued for the lock").await;

    head_row.batch_execute("COMMIT").await.expect("release the head row");
    let (status, body) = a.await.expect("push A");
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["current_version"], 30);
    lock_taken.await.expect("the other process has the lock");
    // B found the head moved: its rows are gone and it waits for the lock like any commit.
    wait_for(&observer, WAITING_FOR_THE_LOCK, "with push B redone").await;
    assert!(!b.is_finished(), "B waits for the other commit");
    release.send(()).expect("other commit");
    other.await.expect("other commit");
    let (status, body) = b.await.expect("push B");
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["current_version"], 51, "B's ids follow the other commit's");

    assert_eq!(versions(&app, &admin, &a_ids).await, (1..=30).collect::<Vec<_>>());
    assert_eq!(versions(&app, &admin, &b_ids).await, (32..=51).collect::<Vec<_>>());
    assert_counted(&app, &admin, 50).await;
}

#[actix_web::test]
async fn a_group_written_ahead_of_a_failed_commit_is_redone_and_the_failed_push_retried_applies() {
    let Staged { app, admin, observer, conn: _, head_row, a, b, a_ids, b_ids } = stage().await;

    // A's connection dies before its commit.
    observer
        .execute(
            &format!("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE {HEAD_UPDATE_BLOCKED}"),
            &[],
        )
        .await
        .expect("terminate A's session");
    let (status, body) = a.await.expect("push A");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    head_row.batch_execute("COMMIT").await.expect("release the head row");
    let (status, body) = b.await.expect("push B");
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["current_version"], 20, "B took the ids A did not commit");

    let (status, body) = app.push(&admin, push_body("a", &a_ids)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["current_version"], 50);
    assert_eq!(versions(&app, &admin, &b_ids).await, (1..=20).collect::<Vec<_>>());
    assert_eq!(versions(&app, &admin, &a_ids).await, (21..=50).collect::<Vec<_>>());
    assert_counted(&app, &admin, 50).await;
}
