//! `scale`: how cost grows with the size of the repository. Seeds up to each `--sizes` step in
//! turn on one server (the records spread over `--form-types` form types, batch by batch) and
//! measures at each step: pull pages from the start and from the head, a typed pull, statistics,
//! the bundle manifest, two initial-sync windows, the database's bytes per record, a whole
//! export (rows/s and the server's memory) and, last because its records grow the repository, a
//! push storm. Results are keyed `<step>.<figure>` (`10M.pull_head_p99_ms`); request kinds carry
//! the step too (`pull_head@10M`), so the report's request table is the curve.

use super::push_storm::{storm, StormSpec};
use super::{form_type_names, rate, seed_records, Bounds, Ctx, PullLoop};
use crate::cli::ScaleArgs;
use anyhow::{Context, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_postgres::Client;

const FORM_PREFIX: &str = "scale_form";
const PAGE: u32 = 500;

pub async fn run(ctx: Arc<Ctx>, a: ScaleArgs) -> Result<()> {
    ctx.checks_correctness();
    let db = match &a.db {
        Some(conn) => {
            let config: tokio_postgres::Config = conn.parse().context("parsing --db")?;
            crate::target::check_db_hosts(&config, ctx.common.allow_remote)?;
            Some(super::stats_latency::connect(conn).await?)
        }
        None => None,
    };
    super::fleet::ensure_bundle(&ctx).await?;
    let types = form_type_names(FORM_PREFIX, a.form_types);
    for (i, &size) in a.sizes.iter().enumerate() {
        let step = label(size);
        let held = stored(&ctx).await?;
        if held < size {
            let out = seed_records(
                &ctx,
                &format!("seed@{step}"),
                size - held,
                a.seeding.seed_batch,
                a.seeding.seed_concurrency,
                a.seeding.shape.payload_bytes,
                &types,
            )
            .await;
            ctx.result(&format!("{step}.seed_records_per_sec"), rate(out.records as f64, out.secs));
        }
        // Seeding retries failed batches: what counts is what the server holds.
        ctx.result(&format!("{step}.records"), stored(&ctx).await?);
        ctx.result(&format!("{step}.loadavg_before"), loadavg());
        if let Some(db) = &db {
            db_size(&ctx, db, &step).await?;
        }
        probes(&ctx, &a, &step, &types).await?;
        if !a.no_export {
            export(&ctx, &a, &step).await;
        }
        push_storm(&ctx, &a, &step, &types, i as u64).await;
    }
    Ok(())
}

/// `100k`, `1M`, `10M`, `2.5M`: the step's name in result keys and request kinds.
fn label(size: u64) -> String {
    let (unit, div) = if size >= 1_000_000 { ("M", 1_000_000) } else { ("k", 1_000) };
    if size.is_multiple_of(div) {
        format!("{}{unit}", size / div)
    } else if size >= 1_000 {
        format!("{}{unit}", size as f64 / div as f64)
    } else {
        size.to_string()
    }
}

/// Live records the server counts (`/status`, from its kept statistics: no `count(*)`).
pub(super) async fn stored(ctx: &Ctx) -> Result<u64> {
    let status = ctx.api.status().await.map_err(|f| anyhow::anyhow!("GET /status failed: {f}"))?;
    status["observation_count"].as_u64().context("/status has no observation_count")
}

/// The 1-minute load average, so each step's figures carry the machine's load.
pub(super) fn loadavg() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/loadavg").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

/// Sequential latency probes at this size, then the two initial-sync windows.
async fn probes(ctx: &Arc<Ctx>, a: &ScaleArgs, step: &str, types: &[String]) -> Result<()> {
    let client_id = format!("load-{}-scale", ctx.run);
    let head = ctx.api.head(&client_id).await?;
    let typed = vec![types[types.len() / 2].clone()];
    // One type's records sit in batches among the others: from this far below the head a typed
    // page still finds a full page of its type.
    let typed_back =
        i64::from(PAGE) * 2 * types.len() as i64 * a.seeding.seed_batch.div_ceil(u64::from(PAGE)) as i64;
    let n = a.probe_requests;
    // A form nobody has filled in yet: a device asks for it from cursor 0 and gets nothing.
    let empty = vec![format!("{FORM_PREFIX}_empty")];
    let pulls: [(&str, i64, &[String]); 5] = [
        ("pull_start", 0, &[]),
        ("pull_head", head - i64::from(PAGE), &[]),
        ("pull_typed_start", 0, &typed),
        ("pull_typed_head", head - typed_back, &typed),
        ("pull_typed_empty", 0, &empty),
    ];
    for (name, from, filter) in pulls {
        let kind = format!("{name}@{step}");
        let mut bytes = 0u64;
        let mut records = 0u64;
        for _ in 0..n {
            let mut pl = PullLoop::new(from.max(0));
            if let Ok(p) = pl.page(&ctx.api, &kind, &client_id, PAGE, filter).await {
                bytes += p.wire_bytes;
                records += p.ids.len() as u64;
            }
        }
        latencies(ctx, step, name, &kind);
        ctx.result(&format!("{step}.{name}_records_per_page"), rate(records as f64, n as f64));
        ctx.result(&format!("{step}.{name}_wire_bytes_per_record"), rate(bytes as f64, records as f64));
    }
    for (name, path) in [("stats", "/stats/observations"), ("status", "/status")] {
        let kind = format!("{name}@{step}");
        let url = ctx.api.base.join(path);
        for _ in 0..n {
            let _ = ctx.api.exec(&kind, true, |c, _| c.get(&url)).await;
        }
        latencies(ctx, step, name, &kind);
    }
    let kind = format!("manifest@{step}");
    for _ in 0..n {
        let _ = ctx.api.manifest(&kind, None).await;
    }
    latencies(ctx, step, "manifest", &kind);
    let window = a.sync_window.min(head.max(0) as u64);
    sync_window(ctx, step, "sync_start", 0, window).await;
    sync_window(ctx, step, "sync_head", head - window as i64, window).await;
    Ok(())
}

fn latencies(ctx: &Ctx, step: &str, name: &str, kind: &str) {
    for (q, qn) in [(0.5, "p50"), (0.99, "p99")] {
        let ms = ctx.stats.quantile(kind, q).map(|d| d.as_secs_f64() * 1000.0);
        ctx.result(&format!("{step}.{name}_{qn}_ms"), ms);
    }
}

/// A fresh device's initial sync over a window of `window` records starting at cursor `from`:
/// the rate of the pull loop (pages of 500, the client decoding each page).
async fn sync_window(ctx: &Arc<Ctx>, step: &str, name: &str, from: i64, window: u64) {
    let kind = format!("{name}@{step}");
    let client_id = format!("load-{}-{name}-{step}", ctx.run);
    ctx.progress.counted(&kind, window, "records");
    let mut pl = PullLoop::new(from.max(0));
    let start = Instant::now();
    while pl.records < window {
        match pl.page(&ctx.api, &kind, &client_id, PAGE, &[]).await {
            Ok(p) => {
                ctx.progress.inc(p.ids.len() as u64);
                if p.done {
                    break;
                }
            }
            Err(f) => {
                ctx.note(format!("{kind} stopped: {f}"));
                break;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    ctx.result(&format!("{step}.{name}_records"), pl.records);
    ctx.result(&format!("{step}.{name}_records_per_sec"), rate(pl.records as f64, secs));
}

/// Table and index bytes per record (`records` and `record_revisions`) and the JSON length of a
/// record (its `data`, and the whole row as JSON) over a sample of the rows.
async fn db_size(ctx: &Ctx, db: &Client, step: &str) -> Result<()> {
    let rows = stored(ctx).await?.max(1) as f64;
    let sizes = db
        .query(
            "SELECT c.relname::text, pg_relation_size(c.oid), pg_total_relation_size(c.oid), pg_indexes_size(c.oid)
             FROM pg_class c WHERE c.relname IN ('records', 'record_revisions') AND c.relkind = 'r'",
            &[],
        )
        .await
        .context("reading table sizes")?;
    for r in sizes {
        let (name, heap, total, indexes): (String, i64, i64, i64) = (r.get(0), r.get(1), r.get(2), r.get(3));
        let per = |b: i64| b as f64 / rows;
        ctx.result(&format!("{step}.db_{name}_heap_bytes_per_record"), per(heap));
        ctx.result(&format!("{step}.db_{name}_toast_bytes_per_record"), per(total - heap - indexes));
        ctx.result(&format!("{step}.db_{name}_index_bytes_per_record"), per(indexes));
        ctx.result(&format!("{step}.db_{name}_total_bytes_per_record"), per(total));
    }
    let indexes = db
        .query(
            "SELECT i.indexrelid::regclass::text, pg_relation_size(i.indexrelid)
             FROM pg_index i WHERE i.indrelid = 'records'::regclass",
            &[],
        )
        .await
        .context("reading index sizes")?;
    for r in indexes {
        let (name, bytes): (String, i64) = (r.get(0), r.get(1));
        ctx.result(&format!("{step}.db_index_{name}_bytes_per_record"), bytes as f64 / rows);
    }
    // About 20,000 sampled rows at any size: enough for an average, cheap at 10M.
    let pct = (2_000_000.0 / rows).clamp(0.01, 100.0);
    let sample = db
        .query_one(
            &format!(
                "SELECT avg(octet_length(data::text))::float8, avg(octet_length(row_to_json(r)::text))::float8
                 FROM records r TABLESAMPLE SYSTEM ({pct})"
            ),
            &[],
        )
        .await
        .context("sampling record sizes")?;
    ctx.result(&format!("{step}.record_data_json_bytes"), sample.get::<_, Option<f64>>(0));
    ctx.result(&format!("{step}.record_row_json_bytes"), sample.get::<_, Option<f64>>(1));
    Ok(())
}

/// Resident memory of a process in bytes (`VmRSS` of /proc/PID/status).
fn rss_bytes(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// One export of the whole repository, alone, with the server's memory sampled every 100 ms.
async fn export(ctx: &Arc<Ctx>, a: &ScaleArgs, step: &str) {
    let rows = stored(ctx).await.ok();
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = a.server_pid.map(|pid| {
        let sampling = sampling.clone();
        tokio::spawn(async move {
            let before = rss_bytes(pid).unwrap_or(0);
            let mut peak = before;
            while sampling.load(Ordering::Relaxed) {
                peak = peak.max(rss_bytes(pid).unwrap_or(0));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (before, peak)
        })
    });
    let kind = format!("export@{step}");
    let url = format!("{}?format={}", ctx.api.base.join("/data/export"), a.export_format.as_str());
    let timeout = Duration::from_secs(a.export_timeout);
    ctx.progress.timed(&kind, a.export_timeout);
    let start = Instant::now();
    let out = ctx.api.exec_stream(&kind, |c, _| c.get(&url).timeout(timeout)).await;
    let secs = start.elapsed().as_secs_f64();
    sampling.store(false, Ordering::Relaxed);
    match out {
        Ok(s) => {
            ctx.result(&format!("{step}.export_secs"), secs);
            ctx.result(&format!("{step}.export_bytes"), s.size);
            if let Some(r) = rows {
                ctx.result(&format!("{step}.export_rows_per_sec"), rate(r as f64, secs));
            }
        }
        Err(f) => ctx.note(format!("{kind} failed: {f}")),
    }
    if let Some(Ok((before, peak))) = match sampler {
        Some(t) => Some(t.await),
        None => None,
    } {
        ctx.result(&format!("{step}.export_server_rss_before_mb"), before as f64 / 1e6);
        ctx.result(&format!("{step}.export_server_rss_growth_mb"), peak.saturating_sub(before) as f64 / 1e6);
    }
}

/// A push storm of fresh records at this size; its records count towards the next size.
async fn push_storm(ctx: &Arc<Ctx>, a: &ScaleArgs, step: &str, types: &[String], index: u64) {
    let kind = format!("push@{step}");
    let spec = StormSpec {
        kind: kind.clone(),
        devices: a.push_devices,
        batch: a.push_batch,
        payload_bytes: a.seeding.shape.payload_bytes,
        // The typed probe's type: so at the next step, after the next seeding, and in a later
        // run on this repository, the records near the head still include that type's.
        form_type: types[types.len() / 2].clone(),
        // Each step's devices push ids of their own: new records, not updates.
        device_offset: index * a.push_devices,
        keep_heads: false,
        pusher: None,
        districts: 0,
    };
    ctx.progress.timed(&kind, a.push_secs);
    let out = storm(ctx, &spec, Arc::new(Bounds::new(Duration::from_secs(a.push_secs), None))).await;
    ctx.result(&format!("{step}.push_records_per_sec"), rate(out.records as f64, out.secs));
    latencies(ctx, step, "push", &kind);
}

#[cfg(test)]
mod tests {
    use super::label;

    #[test]
    fn step_labels() {
        assert_eq!(label(100_000), "100k");
        assert_eq!(label(1_000_000), "1M");
        assert_eq!(label(10_000_000), "10M");
        assert_eq!(label(2_500_000), "2.5M");
        assert_eq!(label(500), "500");
    }
}
