//! `stats`: how long the statistics the portal overview loads (`GET /stats/observations` and
//! `GET /status`) take on a big repository. With `--db` and `--seed-rows N`, first writes N rows
//! straight into the server's `records` table (generate_series, in chunks, under the change-log
//! lock) and counts them again with the statement `synkronus stats recount` runs: seeding ten
//! million rows through pushes would take far longer than the measurement.

use super::Ctx;
use crate::cli::StatsArgs;
use anyhow::{Context, Result};
use serde_json::Value;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_postgres::{Client, NoTls};

/// The server's change-log lock (src/db/records.rs): held while allocating change_ids.
const CHANGELOG_LOCK: i64 = 0x5359_4e4b_0010;
const SEED_CHUNK: u64 = 500_000;

pub async fn connect(db: &str) -> Result<Client> {
    let (client, conn) = tokio_postgres::connect(db, NoTls).await.context("connecting to PostgreSQL")?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

pub async fn run(ctx: Arc<Ctx>, a: StatsArgs) -> Result<()> {
    let db = match &a.db {
        Some(conn) => {
            let config: tokio_postgres::Config = conn.parse().context("parsing --db")?;
            crate::target::check_db_hosts(&config, ctx.common.allow_remote)?;
            Some(connect(conn).await?)
        }
        None => None,
    };
    if a.seed_rows > 0 {
        let db = db.as_ref().context("--seed-rows needs --db")?;
        seed(&ctx, db, &a).await?;
    }

    let stats_url = ctx.api.base.join("/stats/observations");
    let status_url = ctx.api.base.join("/status");
    // One request first: connections and the database's caches warm, not measured.
    let _ = ctx.api.exec("warm_up", true, |c, _| c.get(&stats_url)).await;
    let mut total_count = None;
    // `--requests` pairs of sequential requests: `/stats/observations`, then `/status`.
    let pairs = ctx.common.requests.unwrap_or(200);
    ctx.progress.counted("measure", pairs, "request pairs");
    for _ in 0..pairs {
        if let Ok(resp) = ctx.api.exec("stats_observations", true, |c, _| c.get(&stats_url)).await {
            let body: Value = serde_json::from_slice(&resp.body).unwrap_or(Value::Null);
            total_count = body["totalCount"].as_i64();
        }
        let _ = ctx.api.exec("status", true, |c, _| c.get(&status_url)).await;
        ctx.progress.inc(1);
    }
    for (kind, key) in [("stats_observations", "stats"), ("status", "status")] {
        for (q, name) in [(0.5, "p50"), (0.99, "p99"), (1.0, "max")] {
            let ms = ctx.stats.quantile(kind, q).map(|d| d.as_secs_f64() * 1000.0);
            ctx.result(&format!("{key}_{name}_ms"), ms);
        }
    }
    ctx.result("total_count", total_count);

    if let Some(db) = &db {
        // The answer must be exact, not merely fast: compare with a full count (seconds).
        ctx.checks_correctness();
        let started = Instant::now();
        let live: i64 = db.query_one("SELECT count(*) FROM records WHERE NOT deleted", &[]).await?.get(0);
        ctx.result("full_count_ms", started.elapsed().as_secs_f64() * 1000.0);
        ctx.result("full_count", live);
        if total_count != Some(live) {
            ctx.stats.violation("stats_not_exact", format!("totalCount {total_count:?}, full count {live}"));
        }
    }
    Ok(())
}

/// `seed_rows` records over `seed_form_types` form types and three years of creation days, one in
/// twenty deleted.
async fn seed(ctx: &Arc<Ctx>, db: &Client, a: &StatsArgs) -> Result<()> {
    ctx.progress.counted("seed", a.seed_rows, "rows");
    let started = Instant::now();
    let mut done = 0;
    while done < a.seed_rows {
        let n = SEED_CHUNK.min(a.seed_rows - done);
        let (first, last) = (done + 1, done + n);
        let sql = format!(
            "BEGIN;
             SELECT pg_advisory_xact_lock({CHANGELOG_LOCK});
             INSERT INTO records (id, form_type, form_version, data, deleted, created_at, updated_at, synced_at,
                                  change_id, created_by)
             SELECT 'load_{run}_' || g, 'form_' || (g % {types}), '1', json_build_object('n', g), g % 20 = 0,
                    t, t, now(), h.head + g - {done}, 'load'
             FROM (SELECT head FROM change_head) h, generate_series({first}::bigint, {last}) g,
                  LATERAL (SELECT timestamptz '2023-01-01' + ((g * 7919) % 1096) * interval '1 day'
                                  + (g % 86400) * interval '1 second' AS t) c;
             UPDATE change_head SET head = head + {n};
             COMMIT;",
            run = ctx.run,
            types = a.seed_form_types,
        );
        db.batch_execute(&sql).await.context("seeding records")?;
        done += n;
        ctx.progress.inc(n);
    }
    ctx.result("seed_secs", started.elapsed().as_secs_f64());
    let started = Instant::now();
    db.batch_execute(&format!(
        "BEGIN;
         SELECT pg_advisory_xact_lock({CHANGELOG_LOCK});
         DELETE FROM observation_counts;
         INSERT INTO observation_counts (form_type, day, deleted, n)
         SELECT form_type, coalesce((created_at AT TIME ZONE 'UTC')::date, '-infinity'), deleted, count(*)
         FROM records GROUP BY 1, 2, 3;
         COMMIT;
         ANALYZE records;"
    ))
    .await
    .context("recounting")?;
    ctx.result("recount_secs", started.elapsed().as_secs_f64());
    tokio::time::sleep(Duration::from_millis(100)).await;
    Ok(())
}
