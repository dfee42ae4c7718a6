//! `db-ceiling`: the same rows a push storm would write, INSERTed straight into PostgreSQL with
//! multi-row UNNEST batches from the same concurrency. No HTTP, no JSON parsing, no change-log
//! bookkeeping: the physical limit the push path is compared against.

use super::{rate, Ctx};
use crate::cli::DbCeilingArgs;
use crate::payload;
use crate::stats::Outcome;
use anyhow::{Context, Result};
use chrono::{DateTime, Utc};
use serde_json::Value;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio_postgres::{Client, NoTls};

async fn connect(db: &str) -> Result<Client> {
    let (client, conn) = tokio_postgres::connect(db, NoTls).await.context("connecting to PostgreSQL")?;
    // The connection future drives the socket; it ends when the client is dropped.
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

pub fn create_table_sql(table: &str) -> String {
    format!(
        "CREATE TABLE {table} (
            id text PRIMARY KEY,
            form_type text NOT NULL,
            form_version text NOT NULL,
            data jsonb NOT NULL,
            deleted boolean NOT NULL DEFAULT false,
            created_at timestamptz,
            updated_at timestamptz,
            synced_at timestamptz NOT NULL,
            change_id bigint NOT NULL
        )"
    )
}

pub fn insert_sql(table: &str) -> String {
    format!(
        "INSERT INTO {table} (id, form_type, form_version, data, deleted, created_at, updated_at, synced_at, change_id)
         SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::jsonb[], $5::bool[],
                              $6::timestamptz[], $7::timestamptz[], $8::timestamptz[], $9::bigint[])"
    )
}

pub async fn run(ctx: Arc<Ctx>, a: DbCeilingArgs) -> Result<()> {
    let config: tokio_postgres::Config = a.db.parse().context("parsing --db")?;
    crate::target::check_db_hosts(&config, ctx.common.allow_remote)?;
    // Only [a-z0-9_] goes into the identifier, so formatting it into SQL is safe.
    let table = format!("synk_load_ceiling_{}", ctx.run);
    let admin = connect(&a.db).await?;
    admin.batch_execute(&create_table_sql(&table)).await.context("creating the scratch table")?;
    let result = insert_all(&ctx, &a, &table).await;
    if a.keep_table {
        ctx.note(format!("scratch table {table} kept"));
    } else if let Err(e) = admin.batch_execute(&format!("DROP TABLE IF EXISTS {table}")).await {
        ctx.note(format!("dropping {table} failed: {e}"));
    }
    result
}

async fn insert_all(ctx: &Arc<Ctx>, a: &DbCeilingArgs, table: &str) -> Result<()> {
    let batches = a.records.div_ceil(a.batch);
    let next = Arc::new(AtomicU64::new(0));
    let change_id = Arc::new(AtomicU64::new(1));
    let sql = Arc::new(insert_sql(table));
    let mut clients = Vec::new();
    for _ in 0..a.concurrency {
        clients.push(connect(&a.db).await?);
    }
    ctx.progress.counted("insert", a.records, "rows");
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for (w, client) in clients.into_iter().enumerate() {
        let (ctx, next, change_id, sql) = (ctx.clone(), next.clone(), change_id.clone(), sql.clone());
        let (total, batch, payload_bytes) = (a.records, a.batch, a.shape.payload_bytes as usize);
        set.spawn(async move {
            let mut rng = ctx.rng();
            let stmt = match client.prepare(&sql).await {
                Ok(s) => s,
                Err(e) => {
                    ctx.note(format!("worker {w}: prepare failed: {e}"));
                    return;
                }
            };
            while ctx.common.requests.is_none_or(|r| next.load(Ordering::Relaxed) < r) {
                let b = next.fetch_add(1, Ordering::Relaxed);
                if b >= batches {
                    break;
                }
                let first = b * batch;
                let n = batch.min(total - first) as usize;
                // The same row content a push of this batch would store.
                let mut ids = Vec::with_capacity(n);
                let mut datas: Vec<Value> = Vec::with_capacity(n);
                for i in 0..n as u64 {
                    ids.push(format!("obs_{}_db_{}", ctx.run, first + i));
                    datas.push(payload::record_data(payload_bytes, &mut rng));
                }
                let now: DateTime<Utc> = Utc::now();
                let form_types = vec!["load_ceiling".to_string(); n];
                let versions = vec!["1.0".to_string(); n];
                let deleted = vec![false; n];
                let times = vec![now; n];
                let first_id = change_id.fetch_add(n as u64, Ordering::Relaxed) as i64;
                let change_ids: Vec<i64> = (first_id..first_id + n as i64).collect();
                let t = Instant::now();
                let r = client
                    .execute(
                        &stmt,
                        &[
                            &ids,
                            &form_types,
                            &versions,
                            &datas,
                            &deleted,
                            &times,
                            &times,
                            &times,
                            &change_ids,
                        ],
                    )
                    .await;
                match r {
                    Ok(_) => {
                        ctx.stats.record("insert", t, Outcome::Ok);
                        ctx.stats.add("rows_inserted", n as u64);
                        ctx.progress.inc(n as u64);
                    }
                    Err(e) => {
                        ctx.stats.record("insert", t, Outcome::Io);
                        ctx.note(format!("worker {w}: insert failed: {e}"));
                        break;
                    }
                }
            }
        });
    }
    while set.join_next().await.is_some() {}
    let secs = start.elapsed().as_secs_f64();
    let rows = ctx.stats.counter("rows_inserted");
    ctx.result("rows_inserted", rows);
    ctx.result("insert_secs", secs);
    ctx.result("rows_per_sec", rate(rows as f64, secs));
    if let Some(p) = ctx.stats.quantile("insert", 0.99) {
        ctx.result("insert_p99_ms", p.as_secs_f64() * 1000.0);
    }
    ctx.note("compare rows_per_sec with push-storm's records_per_sec at the same --batch and concurrency (--devices)");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sql_shapes() {
        let c = create_table_sql("t1");
        for col in ["id text PRIMARY KEY", "data jsonb", "change_id bigint", "synced_at timestamptz"] {
            assert!(c.contains(col), "{col}");
        }
        let i = insert_sql("t1");
        assert!(i.contains("UNNEST($1::text[]"));
        assert!(i.contains("$9::bigint[]"));
    }
}
