//! Statistics at any size (docs/api.md §17.8, 18.4): the kept counts equal a full count after any mix
//! of creates, updates that change form type or creation date, deletions, undeletions,
//! attachments and repository resets, including pushes committed together in one group commit.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::TestApp;

async fn db(app: &TestApp) -> tokio_postgres::Client {
    let (client, conn) =
        tokio_postgres::connect(&app.db_conn, tokio_postgres::NoTls).await.expect("connect to test db");
    tokio::spawn(conn);
    client
}

type Counts = Vec<(String, Option<String>, bool, i64)>;

/// What a full count of the rows gives: (form type, UTC day, deleted) → count.
async fn full_count(db: &tokio_postgres::Client) -> Counts {
    let rows = db
        .query(
            "SELECT form_type, (created_at AT TIME ZONE 'UTC')::date::text, deleted, count(*)
             FROM records GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
            &[],
        )
        .await
        .expect("full count");
    rows.iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3))).collect()
}

/// The counts the server keeps, in the same shape.
async fn kept_counts(db: &tokio_postgres::Client) -> Counts {
    let rows = db
        .query(
            "SELECT form_type, CASE WHEN isfinite(day) THEN day::text END AS d, deleted, n
             FROM observation_counts ORDER BY 1, 2, 3",
            &[],
        )
        .await
        .expect("kept counts");
    rows.iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3))).collect()
}

/// One record of a push: (id, form type, day index or none, deleted).
type Rec = (usize, usize, Option<usize>, bool);

#[derive(Debug, Clone)]
enum Op {
    /// Pushes sent at once, so that several share one group commit.
    Pushes(Vec<Vec<Rec>>),
    Attachment(usize, u8),
    Reset,
}

const IDS: usize = 6;
const FORM_TYPES: [&str; 3] = ["household", "person", ""];
/// Far apart days: a span over a year switches the timeline to weeks.
const DAYS: [&str; 4] = [
    "2025-06-01T08:00:00Z",
    "2025-06-01T23:59:59+00:00",
    "2025-06-03T10:00:00+02:00",
    "2023-01-02T00:00:00Z",
];

fn op() -> impl Strategy<Value = Op> {
    let rec =
        (0..IDS, 0..FORM_TYPES.len(), proptest::option::of(0..DAYS.len()), proptest::bool::weighted(0.3));
    let push = proptest::collection::vec(rec, 0..5);
    prop_oneof![
        8 => proptest::collection::vec(push, 1..4).prop_map(Op::Pushes),
        1 => (0..3usize, 0..2u8).prop_map(|(id, byte)| Op::Attachment(id, byte)),
        1 => Just(Op::Reset),
    ]
}

fn push_body(records: &[Rec], n: usize) -> Value {
    let records: Vec<Value> = records
        .iter()
        .map(|&(id, ft, day, deleted)| {
            let mut r = json!({
                "observation_id": format!("obs-{id}"), "form_type": FORM_TYPES[ft], "form_version": "1",
                "data": {"n": n}, "deleted": deleted,
            });
            if let Some(d) = day {
                r["created_at"] = json!(DAYS[d]);
            }
            r
        })
        .collect();
    json!({"client_id": "stats-prop", "transmission_id": uuid::Uuid::new_v4().to_string(), "records": records})
}

/// Applies `ops`, comparing the kept counts with a full count after each one, and the answers of
/// `/stats/observations` and `/status` with the rows at the end.
async fn run_case(app: &TestApp, admin: &str, ops: &[Op]) -> Result<(), String> {
    let db = db(app).await;
    let (status, body) = app
        .call(
            Method::POST,
            "/admin/repository/reset",
            Some(admin),
            Some(json!({"confirm": "RESET_REPOSITORY"})),
        )
        .await;
    if status != StatusCode::OK {
        return Err(format!("reset: {status} {body}"));
    }
    for (step, op) in ops.iter().enumerate() {
        match op {
            Op::Pushes(pushes) => {
                let sends = pushes.iter().enumerate().map(|(i, records)| {
                    app.call(Method::POST, "/sync/push", Some(admin), Some(push_body(records, step * 10 + i)))
                });
                for (status, body) in futures_util::future::join_all(sends).await {
                    if status != StatusCode::OK {
                        return Err(format!("push: {status} {body}"));
                    }
                }
            }
            Op::Attachment(id, byte) => {
                let res = app
                    .client
                    .put(app.url(&format!("/attachments/att-{id}.bin")))
                    .bearer_auth(admin)
                    .header("content-type", "application/octet-stream")
                    .body(vec![*byte; 16])
                    .send()
                    .await
                    .map_err(|e| e.to_string())?;
                // Other bytes under a stored id are refused (409) and change nothing.
                if !matches!(res.status().as_u16(), 200 | 201 | 409) {
                    return Err(format!("attachment upload: {}", res.status()));
                }
            }
            Op::Reset => {
                let (status, body) = app
                    .call(
                        Method::POST,
                        "/admin/repository/reset",
                        Some(admin),
                        Some(json!({"confirm": "RESET_REPOSITORY"})),
                    )
                    .await;
                if status != StatusCode::OK {
                    return Err(format!("reset: {status} {body}"));
                }
            }
        }
        let (kept, full) = (kept_counts(&db).await, full_count(&db).await);
        if kept != full {
            return Err(format!("after step {step} ({op:?}): kept {kept:?}, full count {full:?}"));
        }
    }

    let full = full_count(&db).await;
    let live: i64 = full.iter().filter(|c| !c.2).map(|c| c.3).sum();
    let dated: i64 = full.iter().filter(|c| !c.2 && c.1.is_some()).map(|c| c.3).sum();
    let all: i64 = full.iter().map(|c| c.3).sum();
    let mut per_type: Vec<(String, i64)> = Vec::new();
    for (ft, _, deleted, n) in &full {
        if *deleted {
            continue;
        }
        let label = if ft.is_empty() { "(no form type)".to_string() } else { ft.clone() };
        match per_type.iter_mut().find(|(l, _)| *l == label) {
            Some(entry) => entry.1 += n,
            None => per_type.push((label, *n)),
        }
    }
    per_type.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));

    let (_, stats) = app.call(Method::GET, "/stats/observations", Some(admin), None).await;
    let shown: Vec<(String, i64)> = stats["byFormType"]
        .as_array()
        .ok_or("byFormType")?
        .iter()
        .map(|t| (t["formType"].as_str().unwrap_or_default().to_string(), t["count"].as_i64().unwrap_or(-1)))
        .collect();
    let bucketed: i64 = stats["timeline"]["buckets"]
        .as_array()
        .ok_or("buckets")?
        .iter()
        .filter_map(|b| b["count"].as_i64())
        .sum();
    if stats["totalCount"] != live || shown != per_type || bucketed != dated {
        return Err(format!("stats {stats} for the full count {full:?}"));
    }
    let attachments: i64 =
        db.query_one("SELECT count(*) FROM attachments", &[]).await.map_err(|e| e.to_string())?.get(0);
    let (_, status) = app.call(Method::GET, "/status", Some(admin), None).await;
    if status["observation_count"] != all || status["attachment_count"] != attachments {
        return Err(format!("status {status}: {all} records, {attachments} attachments"));
    }
    Ok(())
}

/// A property test against the real server and database: one server, one repository reset
/// before each case, shrinking to the shortest failing mix.
#[test]
fn kept_counts_equal_a_full_count_after_any_mix_of_changes() {
    let system = actix_web::rt::System::new();
    let app = system.block_on(TestApp::spawn());
    let admin = system.block_on(app.admin_token());
    let config = Config { cases: 40, failure_persistence: None, ..Config::default() };
    let mut runner = TestRunner::new(config);
    let result = runner.run(&proptest::collection::vec(op(), 1..10), |ops| {
        system.block_on(run_case(&app, &admin, &ops)).map_err(TestCaseError::fail)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[actix_web::test]
async fn live_observations_are_counted_per_type_and_day() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let (status, body) = app.call(Method::GET, "/stats/observations", Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["totalCount"], 0);
    assert_eq!(body["byFormType"], json!([]));
    assert_eq!(body["timeline"]["buckets"], json!([]));
    assert!(body["computedAt"].is_string());

    let rec = |id: &str, ft: &str, at: &str, deleted: bool| {
        json!({"observation_id": id, "form_type": ft, "form_version": "1", "data": {}, "created_at": at,
               "deleted": deleted})
    };
    let records = json!([
        rec("a1", "household", "2025-06-01T08:00:00Z", false),
        rec("a2", "household", "2025-06-01T23:59:59Z", false),
        rec("a3", "household", "2025-06-04T00:00:00Z", false),
        rec("b1", "person", "2025-06-03T10:00:00+02:00", false),
        rec("c1", "", "2025-06-04T12:00:00Z", false),
        rec("d1", "person", "2025-05-01T00:00:00Z", true),
    ]);
    let (status, body) = app
        .call(
            Method::POST,
            "/sync/push",
            Some(&admin),
            Some(json!({"client_id": "c", "transmission_id": "t1", "records": records})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let (status, body) = app.call(Method::GET, "/stats/observations", Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["totalCount"], 5, "{body}");
    assert_eq!(
        body["byFormType"],
        json!([{"formType": "household", "count": 3}, {"formType": "(no form type)", "count": 1},
               {"formType": "person", "count": 1}])
    );
    let t = &body["timeline"];
    assert_eq!(t["bucketUnit"], "day");
    assert_eq!(t["rangeStart"], "2025-06-01T00:00:00Z");
    assert_eq!(t["rangeEnd"], "2025-06-05T00:00:00Z");
    assert_eq!(
        t["buckets"],
        json!([
            {"bucketStart": "2025-06-01T00:00:00Z", "label": "2025-06-01", "count": 2},
            {"bucketStart": "2025-06-02T00:00:00Z", "label": "2025-06-02", "count": 0},
            {"bucketStart": "2025-06-03T00:00:00Z", "label": "2025-06-03", "count": 1},
            {"bucketStart": "2025-06-04T00:00:00Z", "label": "2025-06-04", "count": 2},
        ])
    );
    let (_, status_body) = app.call(Method::GET, "/status", Some(&admin), None).await;
    assert_eq!(status_body["observation_count"], 6, "soft-deleted records count in /status");

    // A span of a year or more switches to ISO weeks (Mondays), still dense.
    let old = json!([rec("old", "person", "2024-06-03T09:00:00Z", false)]);
    let (status, _) = app
        .call(
            Method::POST,
            "/sync/push",
            Some(&admin),
            Some(json!({"client_id": "c", "transmission_id": "t2", "records": old})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (_, body) = app.call(Method::GET, "/stats/observations", Some(&admin), None).await;
    let t = &body["timeline"];
    assert_eq!(t["bucketUnit"], "week");
    let buckets = t["buckets"].as_array().unwrap();
    assert_eq!(buckets.len(), 53, "2024-06-03 .. 2025-06-02 weekly");
    assert_eq!(buckets[0], json!({"bucketStart": "2024-06-03T00:00:00Z", "label": "2024-W23", "count": 1}));
    assert_eq!(buckets[52]["bucketStart"], "2025-06-02T00:00:00Z");
    assert_eq!(buckets[52]["count"], 3, "Tuesday 3rd and Wednesday 4th");
    assert_eq!(buckets[51]["count"], 2, "Sunday 1st belongs to the week of May 26th");
    assert_eq!(buckets.iter().map(|b| b["count"].as_i64().unwrap()).sum::<i64>(), 6);
    assert_eq!(t["rangeEnd"], "2025-06-09T00:00:00Z");
}

/// Rows written with SQL behind the server's back (as an operator or a benchmark might) are
/// counted again by `synkronus stats recount`, which counts rows without a creation date too.
#[actix_web::test]
async fn recount_counts_rows_written_by_hand() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let db = db(&app).await;
    db.batch_execute(
        "INSERT INTO records (id, form_type, form_version, data, deleted, created_at, synced_at, change_id, created_by)
         SELECT 'seed_' || g, 'ft' || (g % 3), '1', '{}', g % 10 = 0,
                CASE WHEN g % 7 = 0 THEN NULL ELSE timestamptz '2025-01-01' + g * interval '1 hour' END,
                now(), g, 'admin'
         FROM generate_series(1, 1000) g;
         UPDATE change_head SET head = 1000;",
    )
    .await
    .unwrap();
    assert_ne!(kept_counts(&db).await, full_count(&db).await);

    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_synkronus"))
        .args(["stats", "recount"])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("DB_CONNECTION", &app.db_conn)
        .env("JWT_SECRET", crate::helpers::JWT_SECRET)
        .env("DATA_ROOT", app.data_root.path())
        .env("LOG_LEVEL", "warn")
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "counted 1000 observations");
    assert_eq!(kept_counts(&db).await, full_count(&db).await);

    let (_, body) = app.call(Method::GET, "/stats/observations", Some(&admin), None).await;
    assert_eq!(body["totalCount"], 900);
    let bucketed: i64 =
        body["timeline"]["buckets"].as_array().unwrap().iter().map(|b| b["count"].as_i64().unwrap()).sum();
    let undated_live = (1..=1000).filter(|g| g % 7 == 0 && g % 10 != 0).count() as i64;
    assert_eq!(bucketed, 900 - undated_live, "rows without a creation date are in no bucket");
    let (_, status) = app.call(Method::GET, "/status", Some(&admin), None).await;
    assert_eq!(status["observation_count"], 1000);
}
