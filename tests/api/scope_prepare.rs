//! The preparation's scan against commits (docs/architecture.md, "Preparing a new version of the
//! set"): it reads records without a lock and writes their keys under the change-log lock, so a
//! record a commit changes in between must keep the keys its commit wrote. Staged by holding the
//! preparation lock from the test (the server's preparer waits) and driving the scan's two steps.

use serde_json::json;
use synkronus::db::scope::prepare::{self, Plan, PREPARATION_LOCK};
use synkronus::db::scope::{self as scope_db};

use crate::helpers::{connect, TestApp};
use crate::scopes::{create_user, push, record, wait_in_force, Device};

#[actix_web::test]
async fn a_record_moved_between_the_scans_read_and_write_keeps_the_keys_of_its_commit() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let north = create_user(&app, &admin, "north-worker", "read-write", json!({"district": ["north"]})).await;
    push(
        &app,
        &admin,
        "admin-device",
        vec![
            record("moves", "household", json!({"district": "north"})),
            record("stays", "household", json!({"district": "north"})),
            record("elsewhere", "household", json!({"district": "south"})),
        ],
    )
    .await;

    // The server's preparer cannot start while the test holds the preparation lock.
    let holder = connect(&app.db_conn).await;
    holder.execute("SELECT pg_advisory_lock($1)", &[&PREPARATION_LOCK]).await.expect("preparation lock");
    let rules = json!([{"name": "districts", "applies_to": {"roles": ["read-write"]},
                        "form_types": ["household"], "where": {"field": "district", "in_attribute": "district"}}]);
    let (status, body) =
        app.call(reqwest::Method::PUT, "/admin/scopes", Some(&admin), Some(json!({"rules": rules}))).await;
    assert_eq!(status, reqwest::StatusCode::ACCEPTED, "{body}");
    let version = body["version"].as_i64().expect("version");

    let mut db = app.state.pool.get().await.expect("connection");
    let set = scope_db::set_version(&db, version).await.expect("set").expect("stored");
    let plan = Plan::new(&set, None).expect("plan");
    prepare::begin(&db, version).await.expect("begin");
    let batch = prepare::read_batch(&db, &plan).await.expect("read").expect("records to scan");

    // Between the read and the write, a commit moves one record out of the north.
    push(&app, &admin, "admin-device", vec![record("moves", "household", json!({"district": "south"}))])
        .await;

    for (after, chunk) in batch.chunks() {
        let tx = db.transaction().await.expect("transaction");
        assert!(prepare::write_chunk(&tx, &plan, chunk, after).await.expect("write"));
        tx.commit().await.expect("commit");
    }
    let rows = holder
        .query("SELECT key, live FROM scope_rows WHERE record_id = 'moves' ORDER BY key", &[])
        .await
        .expect("rows");
    let live: Vec<(String, bool)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(live.len(), 1, "the scan left the key it read beside the commit's: {live:?}");
    assert!(live[0].0.ends_with("=south") && live[0].1, "{live:?}");

    // The server finishes the preparation; the worker receives the north as it is now.
    holder.execute("SELECT pg_advisory_unlock($1)", &[&PREPARATION_LOCK]).await.expect("unlock");
    wait_in_force(&app, &admin, version).await;
    let mut phone = Device::new("phone");
    phone.sync(&app, &north, 2).await;
    assert_eq!(phone.ids(), ["stays"]);
}
