//! `export-under-load`: a push storm alone (baseline), then the same storm while one export
//! streams the whole data set. Reports export rows/s and push p99 with and without the export
//! (G8: pushes keep working and degrade by at most a small factor).

use super::push_storm::{storm, StormSpec};
use super::{rate, seed_records, Bounds, Ctx};
use crate::cli::{ExportArgs, ExportFormat};
use anyhow::Result;
use std::sync::Arc;
use std::time::{Duration, Instant};

const BASELINE: &str = "push (baseline)";
const DURING: &str = "push (during export)";

pub async fn run(ctx: Arc<Ctx>, a: ExportArgs) -> Result<()> {
    ctx.checks_correctness();
    if a.seed_records > 0 {
        let out = seed_records(
            &ctx,
            "seed_push",
            a.seed_records,
            1000,
            a.seed_concurrency,
            a.shape.payload_bytes,
            &["load_export".to_string()],
        )
        .await;
        ctx.result("seed_records_per_sec", rate(out.records as f64, out.secs));
    }
    let form_type = format!("load_export_storm_{}", ctx.run);
    let mut spec = StormSpec {
        kind: BASELINE.into(),
        devices: a.devices,
        batch: a.batch,
        payload_bytes: a.shape.payload_bytes,
        form_type,
        device_offset: 0,
        keep_heads: false,
        pusher: None,
        districts: 0,
    };

    // Phase 1: baseline.
    ctx.progress.timed("baseline storm", a.baseline_secs);
    let base = storm(&ctx, &spec, Arc::new(Bounds::new(Duration::from_secs(a.baseline_secs), None))).await;
    ctx.result("baseline_records_per_sec", rate(base.records as f64, base.secs));

    // Rows the export will hold, for parquet/csv where the body cannot be counted cheaply.
    let rows_estimate = match ctx.api.status().await {
        Ok(v) => v.get("observation_count").and_then(|c| c.as_u64()),
        Err(_) => None,
    };

    // Phase 2: the same storm (new devices, new ids) until the export finishes.
    spec.kind = DURING.into();
    spec.device_offset = a.devices;
    let bounds = Arc::new(Bounds::new(Duration::from_secs(a.export_timeout), None));
    ctx.progress.timed("export + storm", a.export_timeout);
    let storm_task = {
        let (ctx, bounds) = (ctx.clone(), bounds.clone());
        tokio::spawn(async move { storm(&ctx, &spec, bounds).await })
    };
    let start = Instant::now();
    let export = ctx.api.export(a.format.as_str(), Duration::from_secs(a.export_timeout)).await;
    let export_secs = start.elapsed().as_secs_f64();
    bounds.stop();
    let during = storm_task.await.ok();

    match export {
        Ok(s) => {
            let rows = if a.format == ExportFormat::Json { Some(s.newlines) } else { rows_estimate };
            ctx.result("export_secs", export_secs);
            ctx.result("export_bytes", s.size);
            ctx.result("export_mb_per_sec", rate(s.size as f64 / 1e6, export_secs));
            if let Some(r) = rows {
                ctx.result("export_rows", r);
                ctx.result("export_rows_per_sec", rate(r as f64, export_secs));
            }
            if let Some(h) = s.header("x-export-change-id") {
                ctx.result("export_change_id", h);
            }
            if a.format != ExportFormat::Json {
                ctx.note("export_rows for parquet/csv is /status observation_count just before the export; use --format json for an exact count");
            }
        }
        Err(f) => ctx.note(format!("export failed: {f}")),
    }
    if let Some(d) = during {
        ctx.result("during_export_records_per_sec", rate(d.records as f64, d.secs));
    }
    let p99 = |k: &str| ctx.stats.quantile(k, 0.99).map(|d| d.as_secs_f64() * 1000.0);
    if let (Some(b), Some(d)) = (p99(BASELINE), p99(DURING)) {
        ctx.result("push_p99_baseline_ms", b);
        ctx.result("push_p99_during_export_ms", d);
        ctx.result("push_p99_ratio", if b > 0.0 { d / b } else { 0.0 });
    }
    Ok(())
}
