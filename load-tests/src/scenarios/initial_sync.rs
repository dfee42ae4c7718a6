//! `initial-sync`: one device pulls N records from cursor 0, page by page until `has_more` is
//! false, checking change_ids strictly increase across pages and that N distinct records arrive.
//! `--raw` leaves the records unparsed (the server-side rate: only the count is checked), `--gzip`
//! asks for gzipped pages and reports bytes per record on the wire.

use super::{rate, seed_records, Ctx, PullLoop, PullMode};
use crate::cli::InitialSyncArgs;
use anyhow::Result;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

pub async fn run(ctx: Arc<Ctx>, a: InitialSyncArgs) -> Result<()> {
    ctx.checks_correctness();
    let mut types = Vec::new();
    if a.seed {
        let form_type = a.form_type.clone().unwrap_or_else(|| format!("load_init_{}", ctx.run));
        let out = seed_records(
            &ctx,
            "seed_push",
            a.records,
            a.seeding.seed_batch,
            a.seeding.seed_concurrency,
            a.seeding.shape.payload_bytes,
            std::slice::from_ref(&form_type),
        )
        .await;
        ctx.result("seed_records_per_sec", rate(out.records as f64, out.secs));
        if out.records < a.records {
            anyhow::bail!("seeding stored only {} of {} records", out.records, a.records);
        }
        types.push(form_type);
    } else if let Some(t) = &a.form_type {
        types.push(t.clone());
    }

    let client_id = format!("load-{}-fresh-device", ctx.run);
    ctx.progress.counted("initial pull", a.records, "records");
    let mut pl = PullLoop::new(0);
    let mut seen: HashSet<String> = HashSet::with_capacity(a.records as usize);
    let mut duplicates = 0u64;
    let mut requests = 0u64;
    let mode = PullMode { gzip: a.gzip, raw: a.raw };
    let (mut wire_bytes, mut json_bytes) = (0u64, 0u64);
    let start = Instant::now();
    loop {
        if ctx.common.requests.is_some_and(|r| requests >= r) {
            ctx.note("stopped at --requests before has_more became false");
            break;
        }
        requests += 1;
        let page = match pl.page_as(&ctx.api, "pull", &client_id, a.limit, &types, mode).await {
            Ok(p) => p,
            Err(f) => {
                // A fresh device would retry the same cursor; so do we, a bounded number of times.
                if requests > a.records / u64::from(a.limit) + 100 {
                    anyhow::bail!("giving up after repeated pull failures: {f}");
                }
                super::backoff(&f).await;
                continue;
            }
        };
        ctx.progress.inc(page.records);
        wire_bytes += page.wire_bytes;
        json_bytes += page.json_bytes;
        for (id, _) in page.ids {
            if !seen.insert(id) {
                duplicates += 1;
            }
        }
        if page.done {
            break;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    // Raw pages carry no ids: their count stands in for the distinct ids.
    let distinct = if a.raw { pl.records } else { seen.len() as u64 };
    ctx.result("records_received", distinct);
    if distinct > 0 {
        ctx.result("wire_bytes_per_record", wire_bytes as f64 / distinct as f64);
        ctx.result("json_bytes_per_record", json_bytes as f64 / distinct as f64);
    }
    ctx.result("pages", pl.pages);
    ctx.result("pull_secs", secs);
    ctx.result("records_per_sec", rate(distinct as f64, secs));
    ctx.result("final_cursor", pl.cursor);
    ctx.stats.add("duplicate_records", duplicates);
    // With a seeded, private form type the count must be exact; against shared data the
    // server may hold more than asked for.
    if distinct < a.records || (a.seed && distinct != a.records) {
        ctx.stats.violation(
            "record_count",
            format!("expected {} distinct records, received {distinct}", a.records),
        );
    }
    if duplicates > 0 && a.seed {
        // Nothing updates the seeded records, so each must appear exactly once.
        ctx.stats.violation("duplicate_records", format!("{duplicates} records arrived twice"));
    }
    Ok(())
}
