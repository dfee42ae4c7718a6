//! The preparation's scan against commits (docs/architecture.md, "Preparing a new version of the
//! set"): it reads records without a lock and writes their keys under the change-log lock, so a
//! record a commit changes in between must keep the keys its commit wrote. Staged by holding the
//! preparation lock from the test (the server's preparer waits) and driving the scan's two steps.

use std::time::Duration;

use serde_json::json;
use synkronus::db::scope::prepare::{self, ChunkWrite, Plan, BATCH, PREPARATION_LOCK};
use synkronus::db::scope::{self as scope_db};

use crate::helpers::{connect, TestApp};
use crate::scopes::{create_user, push, record, set_rules, wait_in_force, Device};

/// A preparation the test drives: the server's preparer cannot start while `holder` holds the
/// preparation lock; the districts rule is stored as the version being prepared, its scan begun.
pub struct HeldPreparation {
    pub holder: tokio_postgres::Client,
    pub version: i64,
    pub plan: Plan,
}

impl HeldPreparation {
    pub async fn begin(app: &TestApp, admin: &str) -> HeldPreparation {
        let holder = connect(&app.db_conn).await;
        holder.execute("SELECT pg_advisory_lock($1)", &[&PREPARATION_LOCK]).await.expect("preparation lock");
        let rules = json!([{"name": "districts", "applies_to": {"roles": ["read-write"]},
                            "form_types": ["household"], "where": {"field": "district", "in_attribute": "district"}}]);
        let (status, body) =
            app.call(reqwest::Method::PUT, "/admin/scopes", Some(admin), Some(json!({"rules": rules}))).await;
        assert_eq!(status, reqwest::StatusCode::ACCEPTED, "{body}");
        let version = body["version"].as_i64().expect("version");
        let db = app.state.pool.get().await.expect("connection");
        let set = scope_db::set_version(&db, version).await.expect("set").expect("stored");
        let plan = Plan::new(&set, None).expect("plan");
        prepare::begin(&db, version).await.expect("begin");
        HeldPreparation { holder, version, plan }
    }

    /// Lets the server's preparer take over.
    pub async fn release(holder: &tokio_postgres::Client) {
        holder.execute("SELECT pg_advisory_unlock($1)", &[&PREPARATION_LOCK]).await.expect("unlock");
    }
}

/// Reads the scan's next batch and writes its first chunk, committed when it wrote anything.
async fn write_next_chunk(db: &mut deadpool_postgres::Object, plan: &Plan) -> ChunkWrite {
    let batch = prepare::read_batch(&*db, plan).await.expect("read").expect("records to scan");
    let (after, chunk) = batch.chunks().next().expect("a chunk");
    let tx = db.transaction().await.expect("transaction");
    let written = prepare::write_chunk(&tx, plan, chunk, after).await.expect("write");
    match written {
        ChunkWrite::Written(_) => tx.commit().await.expect("commit"),
        ChunkWrite::Held | ChunkWrite::Moved => tx.rollback().await.expect("rollback"),
    }
    written
}

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

    let HeldPreparation { holder, version, plan } = HeldPreparation::begin(&app, &admin).await;
    let mut db = app.state.pool.get().await.expect("connection");
    let batch = prepare::read_batch(&db, &plan).await.expect("read").expect("records to scan");

    // Between the read and the write, a commit moves one record out of the north.
    push(&app, &admin, "admin-device", vec![record("moves", "household", json!({"district": "south"}))])
        .await;

    for (after, chunk) in batch.chunks() {
        let tx = db.transaction().await.expect("transaction");
        assert_eq!(
            prepare::write_chunk(&tx, &plan, chunk, after).await.expect("write"),
            ChunkWrite::Written(chunk.len())
        );
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
    HeldPreparation::release(&holder).await;
    wait_in_force(&app, &admin, version).await;
    let mut phone = Device::new("phone");
    phone.sync(&app, &north, 2).await;
    assert_eq!(phone.ids(), ["stays"]);
}

/// A record an unfinished commit holds is neither waited for nor skipped: the chunk's write stops
/// before it (the scan's position too), and the next read starts from it once the commit is done.
#[actix_web::test]
async fn the_scan_stops_before_a_record_an_unfinished_commit_holds_and_resumes_from_it() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let north = create_user(&app, &admin, "north-worker", "read-write", json!({"district": ["north"]})).await;
    let records = ["a", "b", "c", "d"].iter().map(|id| record(id, "household", json!({"district": "north"})));
    push(&app, &admin, "admin-device", records.collect()).await;

    let HeldPreparation { holder, version, plan } = HeldPreparation::begin(&app, &admin).await;
    let mut db = app.state.pool.get().await.expect("connection");

    // A commit that has updated `c` and not finished holds its row (as a group commit does).
    let mut commit = connect(&app.db_conn).await;
    let open = commit.transaction().await.expect("transaction");
    open.execute("UPDATE records SET synced_at = synced_at WHERE id = 'c'", &[]).await.expect("hold c");

    let batch = prepare::read_batch(&db, &plan).await.expect("read").expect("records to scan");
    let (after, chunk) = batch.chunks().next().expect("a chunk");
    let tx = db.transaction().await.expect("transaction");
    let written =
        tokio::time::timeout(Duration::from_secs(10), prepare::write_chunk(&tx, &plan, chunk, after))
            .await
            .expect("the write does not wait for the commit")
            .expect("write");
    assert_eq!(written, ChunkWrite::Written(2), "a and b, then stopped before c");
    tx.commit().await.expect("commit");
    let keyed = |rows: Vec<tokio_postgres::Row>| rows.iter().map(|r| r.get(0)).collect::<Vec<String>>();
    let sql = "SELECT DISTINCT record_id FROM scope_rows ORDER BY 1";
    assert_eq!(keyed(holder.query(sql, &[]).await.expect("rows")), ["a", "b"]);
    let set = scope_db::set_version(&db, version).await.expect("set").expect("stored");
    assert_eq!((set.scan_after.as_deref(), set.scanned), (Some("b"), 2));

    // Still held: nothing written, the position stays.
    assert_eq!(write_next_chunk(&mut db, &plan).await, ChunkWrite::Held);

    // Finished (rolled back here: a change would have written its own keys), c is scanned.
    open.rollback().await.expect("rollback");
    assert_eq!(write_next_chunk(&mut db, &plan).await, ChunkWrite::Written(2));
    assert_eq!(keyed(holder.query(sql, &[]).await.expect("rows")), ["a", "b", "c", "d"]);

    HeldPreparation::release(&holder).await;
    wait_in_force(&app, &admin, version).await;
    let mut phone = Device::new("phone");
    phone.sync(&app, &north, 3).await;
    assert_eq!(phone.ids(), ["a", "b", "c", "d"]);
}

/// A commit writes the key rows of the records it updates before it updates them. One that does
/// so while a chunk writes the same record's keys waits for the chunk's lock on the record as the
/// chunk waits for its key rows: the chunk gives way (rolls back, to be read again), long before
/// PostgreSQL's deadlock check would pick one of the two, and the commit goes through.
#[actix_web::test]
async fn a_chunk_gives_way_to_a_commit_that_waits_for_it_while_it_waits_for_that_commit() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let records = ["a", "b"].iter().map(|id| record(id, "household", json!({"district": "north"})));
    push(&app, &admin, "admin-device", records.collect()).await;

    let HeldPreparation { holder, version, plan } = HeldPreparation::begin(&app, &admin).await;
    let mut db = app.state.pool.get().await.expect("connection");
    let batch = prepare::read_batch(&db, &plan).await.expect("read").expect("records to scan");
    let (after, chunk) = batch.chunks().next().expect("a chunk");
    let key = plan.backfill.record_keys("household", r#"{"district":"north"}"#).expect("keys");
    let key = key.first().expect("a district key").clone();

    // The commit's first step: b's key row, not committed.
    let mut commit = connect(&app.db_conn).await;
    let open = commit.transaction().await.expect("transaction");
    open.execute(
        "INSERT INTO scope_rows (key, record_id, change_id, live)
         SELECT $1, id, change_id + 1000, true FROM records WHERE id = 'b'",
        &[&key],
    )
    .await
    .expect("b's key row");
    let chunk_pid: i32 = db.query_one("SELECT pg_backend_pid()", &[]).await.expect("pid").get(0);
    let tx = db.transaction().await.expect("transaction");
    let write = async {
        let written = prepare::write_chunk(&tx, &plan, chunk, after).await.expect("write");
        tx.rollback().await.expect("rollback");
        written
    };
    // Its second step, once the chunk waits for the key row: b itself, which the chunk holds.
    let update = async {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let waiting: bool = holder
                .query_one(
                    "SELECT coalesce((SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1), false)",
                    &[&chunk_pid],
                )
                .await
                .expect("activity")
                .get(0);
            if waiting || tokio::time::Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        open.execute("UPDATE records SET synced_at = synced_at WHERE id = 'b'", &[]).await
    };
    let (written, updated) =
        tokio::time::timeout(Duration::from_secs(20), async { tokio::join!(write, update) })
            .await
            .expect("neither waits for ever");
    assert_eq!(written, ChunkWrite::Held, "the chunk gives way");
    assert_eq!(updated.expect("the commit is not the one rolled back"), 1);
    open.rollback().await.expect("rollback");

    // Read again, the chunk goes through; so does the preparation.
    assert_eq!(write_next_chunk(&mut db, &plan).await, ChunkWrite::Written(2));
    HeldPreparation::release(&holder).await;
    wait_in_force(&app, &admin, version).await;
}

/// A preparation of several batches: the tables it fills are analyzed as the scan grows (after
/// the first batch, then each time it doubles), its stale-key deletes probe the index, and every
/// device ends up with exactly its set, whether it synced before the set or after.
#[actix_web::test]
async fn a_preparation_of_several_batches_analyzes_as_it_goes_and_every_device_gets_its_set() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let north = create_user(&app, &admin, "north-worker", "read-write", json!({"district": ["north"]})).await;
    let south =
        create_user(&app, &admin, "south-worker", "read-only", json!({"district": ["south", "east"]})).await;
    let districts = ["north", "south", "east", "west"];
    let households = 2 * BATCH as usize + 600;
    let ids: Vec<String> = (0..households).map(|n| format!("h{n:05}")).collect();
    for chunk in ids.chunks(650) {
        let records = chunk
            .iter()
            .map(|id| {
                let n: usize = id[1..].parse().expect("number");
                record(id, "household", json!({"district": districts[n % 4]}))
            })
            .collect();
        push(&app, &admin, "admin-device", records).await;
    }
    push(
        &app,
        &admin,
        "admin-device",
        (0..50).map(|n| record(&format!("f{n:02}"), "facility", json!({}))).collect(),
    )
    .await;

    // Before any set, the north worker's phone holds everything.
    let mut north_phone = Device::new("north-phone");
    north_phone.sync(&app, &north, 500).await;
    assert_eq!(north_phone.ids().len(), households + 50);

    let rules = json!([
        {"name": "workers: their districts' households", "applies_to": {"roles": ["read-only", "read-write"]},
         "form_types": ["household"], "where": {"field": "district", "in_attribute": "district"}},
        {"name": "everyone: facilities", "applies_to": {"roles": ["read-only", "read-write"]},
         "form_types": ["facility"]}
    ]);
    set_rules(&app, &admin, rules).await;

    let db = connect(&app.db_conn).await;
    // 2,600 records scanned: analyzed at 1,000 and 2,000. Autovacuum's analyses count apart.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let analyses: i64 = db
            .query_one("SELECT analyze_count FROM pg_stat_user_tables WHERE relname = 'scope_rows'", &[])
            .await
            .expect("statistics")
            .get(0);
        if analyses >= 2 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "scope_rows analyzed {analyses} times");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let live: i64 =
        db.query_one("SELECT count(*) FROM scope_rows WHERE live", &[]).await.expect("rows").get(0);
    assert!(live >= households as i64, "one live key per household at least: {live}");

    let in_districts = |wanted: &[&str]| -> Vec<String> {
        let mut expected: Vec<String> = ids
            .iter()
            .enumerate()
            .filter(|(n, _)| wanted.contains(&districts[n % 4]))
            .map(|(_, id)| id.clone())
            .collect();
        expected.extend((0..50).map(|n| format!("f{n:02}")));
        expected.sort();
        expected
    };
    // The phone that held everything drops what left its set (one tombstone each) ...
    north_phone.sync(&app, &north, 300).await;
    assert_eq!(north_phone.ids(), in_districts(&["north"]));
    // ... and a new phone receives exactly its set.
    let mut south_phone = Device::new("south-phone");
    south_phone.sync(&app, &south, 700).await;
    assert_eq!(south_phone.ids(), in_districts(&["south", "east"]));
}
