//! The memory budget for request bodies (docs/api.md §18.4), against the built binary so that its
//! resident memory is its own: while `MAX_INFLIGHT_BODY_BYTES` is in use a push waits, then gets
//! 503 with `Retry-After: 1` and stores nothing; its retry succeeds; and a storm of concurrent
//! large pushes keeps the server's RSS bounded while every push ends fully stored.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::Value;
use tokio::io::AsyncWriteExt;

use crate::helpers::{assert_error, ChildServer};

const MIB: usize = 1 << 20;
/// Small enough to exhaust with a handful of pushes on a two-core test machine.
const BUDGET: usize = 64 * MIB;
/// Each push of the storm: 12,000 records of about 1 KB, 12 MB of body.
const RECORDS_PER_PUSH: usize = 12_000;
const STORM: usize = 8;

/// The server's resident set, in bytes.
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("process status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kib * 1024
}

/// A synkronus-dialect push body of `RECORDS_PER_PUSH` records of form type `form`.
fn push_text(form: &str, transmission: &str) -> String {
    let filler = "x".repeat(960);
    let records: Vec<String> = (0..RECORDS_PER_PUSH)
        .map(|i| {
            format!(
                r#"{{"observation_id":"{form}-{i}","form_type":"{form}","form_version":"1","data":{{"i":{i},"note":"{filler}"}}}}"#
            )
        })
        .collect();
    format!(
        r#"{{"client_id":"dev-{form}","transmission_id":"{transmission}","records":[{}]}}"#,
        records.join(",")
    )
}

async fn send_push(server: &ChildServer, token: &str, body: &str) -> (StatusCode, Option<String>, Value) {
    try_push(server, token, body).await.expect("push request")
}

/// A push, or the error of a request the server closed: a 503 is answered before the body is
/// read, and the connection closed, so a client still sending its body can see a reset instead.
async fn try_push(
    server: &ChildServer,
    token: &str,
    body: &str,
) -> reqwest::Result<(StatusCode, Option<String>, Value)> {
    let res = server
        .client
        .post(server.url("/sync/push"))
        .bearer_auth(token)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await?;
    let status = res.status();
    let retry_after = res.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_string);
    let body = serde_json::from_str(&res.text().await.unwrap_or_default()).unwrap_or(Value::Null);
    Ok((status, retry_after, body))
}

/// Records stored per form type.
async fn stored_counts(server: &ChildServer) -> std::collections::HashMap<String, i64> {
    let (db, connection) =
        tokio_postgres::connect(&server.db_conn, tokio_postgres::NoTls).await.expect("connect to test db");
    let driver = tokio::spawn(connection);
    let rows = db
        .query("SELECT form_type, count(*) FROM records GROUP BY form_type", &[])
        .await
        .expect("count records");
    drop(db);
    let _ = driver.await;
    rows.iter().map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1))).collect()
}

/// A push that declares `bytes` of body and then sends almost nothing: it holds its room in the
/// budget for as long as the connection stays open.
async fn stalled_push(server: &ChildServer, token: &str, bytes: usize) -> tokio::net::TcpStream {
    let addr = server.base.trim_start_matches("http://").to_string();
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "POST /sync/push HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {bytes}\r\n\r\n{{\"client_id\""
    );
    stream.write_all(head.as_bytes()).await.expect("send head");
    stream
}

/// Waits until the server's budget gauge (bytes held) satisfies `reached`.
async fn wait_for_budget_in_use(
    server: &ChildServer,
    token: &str,
    reached: impl Fn(f64) -> bool,
    what: &str,
) {
    for _ in 0..100 {
        let res = server.client.get(server.url("/metrics")).bearer_auth(token).send().await.expect("scrape");
        let text = res.text().await.expect("metrics text");
        let held = text
            .lines()
            // The series carries labels (`node`), so the value is the line's last field.
            .find(|l| l.starts_with("synkronus_body_budget_in_use_bytes"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        if reached(held) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_beyond_the_budget_wait_then_get_503_and_memory_stays_bounded() {
    let budget = BUDGET.to_string();
    let server = ChildServer::spawn(&[("MAX_INFLIGHT_BODY_BYTES", &budget)]).await;
    let pid = server.pid();
    let token = server.admin_token().await;
    let baseline = rss_bytes(pid);

    // Two stalled bodies of 30 MiB hold 60 of the 64 MiB: a 12 MB push finds no room, waits its
    // 5 s and is refused, with nothing stored.
    let stalled =
        [stalled_push(&server, &token, 30 * MIB).await, stalled_push(&server, &token, 30 * MIB).await];
    let held = 60.0 * MIB as f64;
    wait_for_budget_in_use(&server, &token, |b| b >= held, "the stalled bodies never held 60 MiB").await;
    let refused_body = push_text("refused", "t-refused");
    let started = Instant::now();
    let (status, retry_after, body) = send_push(&server, &token, &refused_body).await;
    assert_error(status, &body, 503, "SERVICE_UNAVAILABLE");
    assert_eq!(retry_after.as_deref(), Some("1"));
    assert!(started.elapsed() >= Duration::from_secs(4), "it waited for room first: {:?}", started.elapsed());
    assert!(!stored_counts(&server).await.contains_key("refused"), "nothing of a refused push is stored");

    // Once the stalled bodies go away, the same push (same transmission id) is stored once.
    drop(stalled);
    wait_for_budget_in_use(&server, &token, |b| b == 0.0, "the dropped bodies still hold the budget").await;
    let (status, _, body) = send_push(&server, &token, &refused_body).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["success_count"], RECORDS_PER_PUSH as i64, "{body}");

    // The storm: more concurrent 12 MB pushes than the budget holds. RSS is sampled throughout.
    let peak = Arc::new(AtomicU64::new(0));
    let sampling = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = {
        let (peak, sampling) = (peak.clone(), sampling.clone());
        tokio::spawn(async move {
            while sampling.load(Ordering::Relaxed) {
                peak.fetch_max(rss_bytes(pid), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let server = Arc::new(server);
    let refusals = Arc::new(AtomicU64::new(0));
    let pushes: Vec<_> = (0..STORM)
        .map(|i| {
            let (server, token, refusals) = (server.clone(), token.clone(), refusals.clone());
            tokio::spawn(async move {
                let body = push_text(&format!("storm{i}"), &format!("t-storm{i}"));
                for _ in 0..30 {
                    let Ok((status, retry_after, answer)) = try_push(&server, &token, &body).await else {
                        // Refused while its body was still being sent: as a 503, try again.
                        refusals.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    };
                    match status {
                        StatusCode::OK => return answer,
                        StatusCode::SERVICE_UNAVAILABLE => {
                            assert_eq!(retry_after.as_deref(), Some("1"), "{answer}");
                            refusals.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                        other => panic!("push storm{i}: {other} {answer}"),
                    }
                }
                panic!("push storm{i} was never admitted");
            })
        })
        .collect();
    for push in pushes {
        let answer = push.await.expect("push task");
        assert_eq!(answer["success_count"], RECORDS_PER_PUSH as i64, "{answer}");
    }
    sampling.store(false, Ordering::Relaxed);
    sampler.await.expect("sampler");

    // Every push is there exactly once, whole.
    let counts = stored_counts(&server).await;
    for form in (0..STORM).map(|i| format!("storm{i}")).chain(["refused".to_string()]) {
        assert_eq!(counts.get(&form).copied(), Some(RECORDS_PER_PUSH as i64), "{form}: {counts:?}");
    }

    // A push in flight is its body or, once decoded, its records (about the body's size), plus
    // the statement parameters of the one being committed: the budget counts bodies, so four
    // times it on top of the idle server bounds what the storm may hold.
    let peak = peak.load(Ordering::Relaxed);
    let bound = baseline + 4 * BUDGET as u64;
    eprintln!(
        "membudget: baseline {} MiB, peak {} MiB, bound {} MiB, {} refusals",
        baseline / MIB as u64,
        peak / MIB as u64,
        bound / MIB as u64,
        refusals.load(Ordering::Relaxed)
    );
    assert!(peak < bound, "RSS peaked at {} MiB, over {} MiB", peak / MIB as u64, bound / MIB as u64);
}
