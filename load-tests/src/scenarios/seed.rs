//! `seed`: loads N records quickly for the other scenarios.

use super::{form_type_names, rate, seed_records, Ctx};
use crate::cli::SeedArgs;
use anyhow::Result;
use std::sync::Arc;

pub async fn run(ctx: Arc<Ctx>, a: SeedArgs) -> Result<()> {
    let out = seed_records(
        &ctx,
        "seed_push",
        a.records,
        a.batch,
        a.concurrency,
        a.shape.payload_bytes,
        &form_type_names(&a.form_type, a.form_types),
    )
    .await;
    ctx.result("records_seeded", out.records);
    ctx.result("seed_secs", out.secs);
    ctx.result("records_per_sec", rate(out.records as f64, out.secs));
    if out.records < a.records {
        anyhow::bail!("only {} of {} records were stored", out.records, a.records);
    }
    Ok(())
}
