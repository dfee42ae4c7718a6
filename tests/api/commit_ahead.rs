//! A push group written ahead of the commit before it (docs/architecture.md, "The change log"):
//! it commits right behind that commit, and is rolled back and committed the usual way when that
//! commit fails or another commit comes in between. Each case is staged by holding the server's
//! commits at named points (`ChangeLogHandle::pauses`, in debug builds), so the order is certain;
//! the scheduler's rules themselves are property-tested without a database
//! (`actors::change_log::scheduler`). Last, a big push's result, which the commit stores through
//! COPY rather than as a parameter, replays as it was answered.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use synkronus::actors::change_log::pauses::{Held, Point};
use tokio::task::JoinHandle;

use crate::helpers::{connect, TestApp};

pub fn push_body(tid: &str, ids: &[String]) -> Value {
    let records: Vec<Value> =
        ids.iter().map(|id| json!({"observation_id": id, "form_type": "f", "data": {"id": id}})).collect();
    json!({"transmission_id": tid, "client_id": format!("device-{tid}"), "records": records})
}

pub fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

pub fn spawn_push(app: &TestApp, token: &str, body: Value) -> JoinHandle<(StatusCode, Value)> {
    let api = app.api.clone();
    let token = token.to_string();
    tokio::spawn(async move { api.push(&token, body).await })
}

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

/// Push A held right after its plan (it holds the change-log lock and ids 1–30, nothing written)
/// and push B, which names other records, written ahead of it (ids 31–50, rows written and not
/// committed) and waiting for A's COMMIT.
pub struct Staged {
    pub app: TestApp,
    pub admin: String,
    pub a: JoinHandle<(StatusCode, Value)>,
    pub b: JoinHandle<(StatusCode, Value)>,
    pub a_held: Held,
    pub a_ids: Vec<String>,
    pub b_ids: Vec<String>,
}

pub async fn stage() -> Staged {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let pauses = app.state.actors.change_log.pauses();
    let (a_ids, b_ids) = (ids("a", 30), ids("b", 20));
    let a_planned = pauses.arm(Point::Planned);
    let a = spawn_push(&app, &admin, push_body("a", &a_ids));
    let a_held = a_planned.reached().await.expect("push A planned");
    let b_written = pauses.arm(Point::WroteAhead);
    let b = spawn_push(&app, &admin, push_body("b", &b_ids));
    b_written.reached().await.expect("push B written ahead of A").release();
    Staged { app, admin, a, b, a_held, a_ids, b_ids }
}

#[actix_web::test]
async fn a_group_written_ahead_commits_right_behind_the_one_before() {
    let Staged { app, admin, a, b, a_held, a_ids, b_ids } = stage().await;
    let b_told = app.state.actors.change_log.pauses().arm(Point::Told);
    a_held.release();
    let (status, body) = a.await.expect("push A");
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["current_version"], 30);
    // B answers only once it has heard that A committed.
    let held = b_told.reached().await.expect("B told");
    assert!(!b.is_finished(), "B cannot answer before it knows how A ended");
    held.release();
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
    let Staged { app, admin, a, b, a_held, a_ids, b_ids } = stage().await;
    let pauses = app.state.actors.change_log.pauses();
    let b_told = pauses.arm(Point::Told);
    a_held.release();
    let (status, body) = a.await.expect("push A");
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["current_version"], 30);
    let held = b_told.reached().await.expect("B told");

    // Between A's COMMIT and B's attempt at the lock, another process takes the lock and a
    // change_id.
    let other = connect(&app.db_conn).await;
    other.batch_execute("BEGIN").await.expect("begin");
    other
        .execute("SELECT pg_advisory_xact_lock($1)", &[&synkronus::db::records::CHANGELOG_LOCK])
        .await
        .expect("the change-log lock");
    other.execute("UPDATE change_head SET head = head + 1", &[]).await.expect("take a change_id");

    // B finds the lock taken: its rows are rolled back and it is committed the usual way.
    let b_redo = pauses.arm(Point::Redo);
    held.release();
    b_redo.reached().await.expect("B redone").release();
    other.batch_execute("COMMIT").await.expect("other commit");
    let (status, body) = b.await.expect("push B");
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["current_version"], 51, "B's ids follow the other commit's");

    assert_eq!(versions(&app, &admin, &a_ids).await, (1..=30).collect::<Vec<_>>());
    assert_eq!(versions(&app, &admin, &b_ids).await, (32..=51).collect::<Vec<_>>());
    assert_counted(&app, &admin, 50).await;
}

#[actix_web::test]
async fn a_group_written_ahead_of_a_failed_commit_is_redone_and_the_failed_push_retried_applies() {
    let Staged { app, admin, a, b, a_held, a_ids, b_ids } = stage().await;

    // A's connection dies before its writes: A's session is the one holding the change-log lock
    // (a bigint key is split into classid and objid). The call waits for the session to end.
    let observer = connect(&app.db_conn).await;
    let terminated: bool = observer
        .query_one(
            "SELECT pg_terminate_backend(pid, 10000) FROM pg_locks
             WHERE locktype = 'advisory' AND granted AND classid::int8 = $1::int8 >> 32
               AND objid::int8 = $1::int8 & 4294967295
               AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            &[&synkronus::db::records::CHANGELOG_LOCK],
        )
        .await
        .expect("terminate A's session")
        .get(0);
    assert!(terminated);
    let b_redo = app.state.actors.change_log.pauses().arm(Point::Redo);
    a_held.release();
    let (status, body) = a.await.expect("push A");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    // B is told at once, and committed the usual way from the head A did not move.
    b_redo.reached().await.expect("B redone").release();
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

/// A push of more records than a result the commit stores as a statement's parameter (its JSON is
/// copied in, in pieces; src/db/commit.rs), in a body of over 1 MiB (read into a mapping of its
/// own): its retry replays the answer it got, read back from what was stored.
#[actix_web::test]
async fn a_big_push_replays_the_result_it_was_answered() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let records: Vec<Value> = (0..20_000)
        .map(|i| json!({"id": format!("big-{i}"), "schema_type": "f", "data": {"i": i}}))
        .collect();
    let body = json!({"transmission_id": "t-big", "client_id": "device-big", "records": records});
    assert!(body.to_string().len() > 1 << 20);
    let first = app.send(Method::POST, "/sync/push", Some(&admin), Some(body.clone())).await;
    assert_eq!(first.status(), StatusCode::OK);
    assert!(first.headers().get("x-idempotent-replay").is_none());
    let first: Value = first.json().await.expect("json");
    let successes = first["successes"].as_array().expect("successes");
    assert_eq!(successes.len(), 20_000);
    assert_eq!(successes[19_999], json!({"id": "big-19999", "change_id": 20_000}));

    let retry = app.send(Method::POST, "/sync/push", Some(&admin), Some(body)).await;
    assert_eq!(retry.status(), StatusCode::OK);
    assert_eq!(retry.headers().get("x-idempotent-replay").and_then(|v| v.to_str().ok()), Some("true"));
    assert_eq!(retry.json::<Value>().await.expect("json"), first);
    assert_counted(&app, &admin, 20_000).await;
}
