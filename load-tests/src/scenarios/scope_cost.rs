//! `scope-cost`: what a scope set costs (docs/api.md §20.3 S5). On one repository, seeded with
//! households spread evenly over `--districts` districts (the `district` field of `data`):
//!
//! 1. with no set, at `--baseline-records`: an unscoped initial sync of the whole repository (the
//!    yardstick) and an empty incremental pull;
//! 2. seeded up to `--records`, still with no set: an empty incremental pull, then a push storm
//!    of `--push-devices` read-write devices (the unscoped push rate and the idle p99);
//! 3. a set of `--rules` rules put in force: its preparation over the whole repository is timed,
//!    the same push storm running through its first `--push-secs` (push p99 while preparing,
//!    against idle);
//! 4. under the set: a user whose `district` attribute names one district (1 % of the
//!    repository with 100 districts) syncs from cursor 0, checked once (nothing of another
//!    district, exactly the preview's count) and then timed; an empty incremental pull of that
//!    user, next to an admin's (the unscoped page, same repository and moment); the push storm
//!    again (the push rate with the set in force).
//!
//! The set stays in force at the end; a later run on the same repository starts by clearing it.

use super::push_storm::{storm, StormSpec};
use super::scale::{loadavg, stored};
use super::scope::{self, district_name, ScopedTypes};
use super::{rate, seed_kinds, Bounds, Ctx, PullLoop, PullMode, SeedKind};
use crate::api::{Api, ScopedRecord};
use crate::cli::ScopeCostArgs;
use anyhow::{bail, Result};
use serde_json::Value;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Form types shared by every run on a repository, so a later run finds the seeded records.
const PREFIX: &str = "cost";
const PAGE: u32 = 500;

pub async fn run(ctx: Arc<Ctx>, a: ScopeCostArgs) -> Result<()> {
    ctx.checks_correctness();
    if a.baseline_records > a.records {
        bail!("--baseline-records ({}) is above --records ({})", a.baseline_records, a.records);
    }
    let timeout = Duration::from_secs(a.prepare_timeout_secs);
    let types = ScopedTypes::new(PREFIX);
    let plain = user(&ctx, "plain", None).await?;
    let scoped = user(&ctx, "scoped", Some(&district_name(0))).await?;
    let pusher = user(&ctx, "pusher", Some(&district_name(1))).await?;
    // A set left by an earlier run would scope the yardstick.
    scope::clear(&ctx, timeout).await?;
    let kinds: Vec<SeedKind> = (0..a.districts)
        .map(|i| SeedKind {
            form_type: types.household.clone(),
            fields: vec![("district".into(), Value::from(district_name(i)))],
        })
        .collect();

    // 1. The yardstick: an unscoped repository of --baseline-records.
    let held = seed_to(&ctx, &a, &kinds, a.baseline_records, "seed@baseline").await?;
    if held > a.baseline_records {
        ctx.note(format!(
            "the repository held {held} records already: the unscoped sync reads its first {} only",
            a.baseline_records
        ));
    }
    ctx.result("baseline.records", held.min(a.baseline_records));
    ctx.result("baseline.loadavg_before", loadavg());
    let unscoped = timed_syncs(&ctx, &plain.1, "sync_unscoped", a.baseline_records, a.sync_runs).await;
    ctx.result("baseline.unscoped_sync_records_per_sec", unscoped);
    empty_pulls(
        &ctx,
        &plain.1,
        "empty_pull_unscoped@baseline",
        a.probe_requests,
        "baseline.empty_pull_unscoped",
    )
    .await?;

    // 2. The big repository, no set.
    let held = seed_to(&ctx, &a, &kinds, a.records, "seed@records").await?;
    ctx.result("records", held);
    ctx.result("loadavg_before", loadavg());
    empty_pulls(&ctx, &plain.1, "empty_pull_unscoped", a.probe_requests, "empty_pull_unscoped").await?;
    let mut storms = 0u64;
    let idle = push_phase(&ctx, &a, &pusher, "push_no_set", &mut storms).await;

    // 3. Preparing the set over the big repository, under the push storm.
    let rules = types.rules(a.rules as usize, PREFIX);
    ctx.result("rules", a.rules);
    let to_scan = stored(&ctx).await?;
    ctx.result("prepare.records", to_scan);
    ctx.result("prepare.loadavg_before", loadavg());
    let version = match ctx.api.put_scopes(&rules).await {
        Ok(v) => v,
        Err(f) => bail!("PUT /admin/scopes failed (--username must be an admin): {f}"),
    };
    // The storm covers the first --push-secs of the preparation only: run to its end, it grew the
    // repository several times over, and the later figures were measured at another size.
    let bounds = Arc::new(Bounds::new(Duration::from_secs(a.push_secs), None));
    let spec = storm_spec(&a, &pusher, "push_preparing", storms);
    storms += 1;
    let storm_task = {
        let (ctx, bounds) = (ctx.clone(), bounds.clone());
        tokio::spawn(async move { storm(&ctx, &spec, bounds).await })
    };
    let prepared = scope::wait_prepared(&ctx, Some(version), timeout).await;
    bounds.stop();
    let during = storm_task.await?;
    let prepare_secs = prepared?;
    ctx.result("prepare.secs", prepare_secs);
    ctx.result("prepare.records_per_sec", rate(to_scan as f64, prepare_secs));
    ctx.result("prepare.push_records_per_sec", rate(during.records as f64, during.secs));
    let p99 = quantile_ms(&ctx, "push_preparing", 0.99);
    ctx.result("prepare.push_p99_ms", p99);
    if let (Some(during), Some(idle)) = (p99, idle.p99_ms) {
        ctx.result("prepare.push_p99_vs_idle", during / idle);
    }

    // 4. Under the set: the 1 % user.
    ctx.result("scoped.loadavg_before", loadavg());
    let expected = match ctx.api.scope_preview_total(&scoped.0).await {
        Ok(Some(n)) => n,
        Ok(None) => bail!("the preview of {} has no total", scoped.0),
        Err(f) => bail!("GET /admin/scopes/preview failed: {f}"),
    };
    let held = stored(&ctx).await?;
    ctx.result("scoped.records", held);
    ctx.result("scoped.visible_records", expected);
    ctx.result("scoped.visible_pct", 100.0 * expected as f64 / held.max(1) as f64);
    checked_sync(&ctx, &scoped.1, &types, &district_name(0), expected).await?;
    let scoped_rate = timed_syncs(&ctx, &scoped.1, "sync_scoped", expected, a.sync_runs).await;
    ctx.result("scoped.sync_records_per_sec", scoped_rate);
    if unscoped > 0.0 {
        ctx.result("scoped.sync_vs_unscoped_baseline", scoped_rate / unscoped);
    }
    // The same repository at the same moment, read unscoped: an admin sees everything, so their
    // page is the unscoped statement's. The yardstick of (1) was a smaller repository, earlier.
    empty_pulls(&ctx, &ctx.api, "empty_pull_admin", a.probe_requests, "scoped.empty_pull_admin").await?;
    empty_pulls(&ctx, &scoped.1, "empty_pull_scoped", a.probe_requests, "scoped.empty_pull").await?;
    if let (Some(scoped), Some(admin)) =
        (quantile_ms(&ctx, "empty_pull_scoped", 0.5), quantile_ms(&ctx, "empty_pull_admin", 0.5))
    {
        ctx.result("scoped.empty_pull_vs_admin", scoped / admin);
    }
    let active = push_phase(&ctx, &a, &pusher, "push_set", &mut storms).await;
    if idle.records_per_sec > 0.0 {
        ctx.result("push_set_vs_no_set", active.records_per_sec / idle.records_per_sec);
    }
    Ok(())
}

/// A read-write user of this run, with a `district` attribute when given, logged in once.
async fn user(ctx: &Ctx, role_name: &str, district: Option<&str>) -> Result<(String, Arc<Api>)> {
    let name = format!("cost-{}-{role_name}", ctx.run);
    let password = format!("pw-{}-{role_name}", ctx.run);
    if let Err(f) = ctx.api.create_user(&name, &password, "read-write").await {
        bail!("creating user {name} failed (--username must be an admin): {f}");
    }
    if let Some(d) = district {
        if let Err(f) = ctx.api.set_attributes(&name, &serde_json::json!({ "district": [d] })).await {
            bail!("setting the district of {name} failed: {f}");
        }
    }
    let api = ctx.api.as_user(&name, &password);
    api.login().await?;
    Ok((name, Arc::new(api)))
}

/// Seeds households until the repository holds `size` records; what it holds then.
async fn seed_to(
    ctx: &Arc<Ctx>,
    a: &ScopeCostArgs,
    kinds: &[SeedKind],
    size: u64,
    kind: &str,
) -> Result<u64> {
    let held = stored(ctx).await?;
    if held < size {
        let s = &a.seeding;
        let out = seed_kinds(
            ctx,
            kind,
            size - held,
            s.seed_batch,
            s.seed_concurrency,
            s.shape.payload_bytes,
            kinds,
        )
        .await;
        ctx.result(&format!("{kind}.records_per_sec"), rate(out.records as f64, out.secs));
    }
    stored(ctx).await
}

/// `runs` initial syncs from cursor 0 of at most `window` records by fresh devices of `api`'s
/// user, pages read raw (the server's rate); the median rate.
async fn timed_syncs(ctx: &Arc<Ctx>, api: &Api, kind: &str, window: u64, runs: u64) -> f64 {
    let mut rates = Vec::new();
    for run in 0..runs {
        let client_id = format!("cost-{}-{kind}-{run}", ctx.run);
        let mut pl = PullLoop::new(0);
        let start = Instant::now();
        while pl.records < window {
            match pl.page_as(api, kind, &client_id, PAGE, &[], PullMode { gzip: false, raw: true }).await {
                Ok(p) if p.done => break,
                Ok(_) => {}
                Err(f) => {
                    ctx.note(format!("{kind} run {run} stopped: {f}"));
                    break;
                }
            }
        }
        let r = rate(pl.records as f64, start.elapsed().as_secs_f64());
        ctx.result(&format!("{kind}.run{run}_records"), pl.records);
        ctx.result(&format!("{kind}.run{run}_records_per_sec"), r);
        rates.push(r);
    }
    median(&mut rates)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The scoped user's initial sync, every record decoded: nothing of another district or of a
/// type outside the set (S1), and exactly the records the preview counts (S3).
async fn checked_sync(
    ctx: &Arc<Ctx>,
    api: &Api,
    types: &ScopedTypes,
    district: &str,
    expected: u64,
) -> Result<()> {
    let client_id = format!("cost-{}-checked", ctx.run);
    let mut pl = PullLoop::new(0);
    let mut live = std::collections::HashSet::new();
    loop {
        let (records, done) =
            match pl.page_of::<ScopedRecord>(api, "sync_checked", &client_id, PAGE, &[]).await {
                Ok(page) => page,
                Err(f) => bail!("the checked scoped sync failed: {f}"),
            };
        for r in records {
            if r.deleted {
                continue;
            }
            let ok = (r.form_type == types.household && r.district() == Some(district))
                || r.form_type == types.shared;
            if !ok {
                ctx.stats.violation(
                    "record_outside_scope",
                    format!("{} ({}, district {:?})", r.observation_id, r.form_type, r.district()),
                );
            }
            live.insert(r.observation_id);
        }
        if done {
            break;
        }
    }
    ctx.result("scoped.checked_sync_records", live.len());
    if live.len() as u64 != expected {
        ctx.stats.violation(
            "scoped_record_count",
            format!(
                "the preview counts {expected} records, the sync received {} distinct live ones",
                live.len()
            ),
        );
    }
    Ok(())
}

/// Sequential pulls of a device already at the head: each answers an empty page.
async fn empty_pulls(ctx: &Arc<Ctx>, api: &Api, kind: &str, n: u64, key: &str) -> Result<()> {
    let client_id = format!("cost-{}-{kind}", ctx.run);
    // Sync to the head first (a scoped device is then past its redeliveries too).
    let mut pl = PullLoop::new(api_head(ctx).await?);
    let mut caught_up = false;
    for _ in 0..1000 {
        let page =
            pl.page_as(api, "setup_pull", &client_id, PAGE, &[], PullMode { gzip: false, raw: true }).await;
        if page.is_ok_and(|p| p.done) {
            caught_up = true;
            break;
        }
    }
    if !caught_up {
        bail!("{kind}: the device did not reach the head");
    }
    let head = pl.cursor;
    let mut records = 0u64;
    for _ in 0..n {
        let mut probe = PullLoop::new(head);
        if let Ok(p) =
            probe.page_as(api, kind, &client_id, PAGE, &[], PullMode { gzip: false, raw: true }).await
        {
            records += p.records;
        }
    }
    ctx.result(&format!("{key}_p50_ms"), quantile_ms(ctx, kind, 0.5));
    ctx.result(&format!("{key}_p99_ms"), quantile_ms(ctx, kind, 0.99));
    ctx.result(&format!("{key}_records"), records);
    Ok(())
}

async fn api_head(ctx: &Ctx) -> Result<i64> {
    ctx.api.head(&format!("cost-{}-head", ctx.run)).await
}

fn quantile_ms(ctx: &Ctx, kind: &str, q: f64) -> Option<f64> {
    ctx.stats.quantile(kind, q).map(|d| d.as_secs_f64() * 1000.0)
}

fn storm_spec(a: &ScopeCostArgs, pusher: &(String, Arc<Api>), kind: &str, index: u64) -> StormSpec {
    StormSpec {
        kind: kind.to_string(),
        devices: a.push_devices,
        batch: a.push_batch,
        payload_bytes: a.seeding.shape.payload_bytes,
        form_type: format!("{PREFIX}_household"),
        device_offset: index * a.push_devices,
        keep_heads: false,
        pusher: Some(pusher.1.clone()),
        districts: a.districts,
    }
}

struct PushFigures {
    records_per_sec: f64,
    p99_ms: Option<f64>,
}

/// A warm-up storm, then the measured one.
async fn push_phase(
    ctx: &Arc<Ctx>,
    a: &ScopeCostArgs,
    pusher: &(String, Arc<Api>),
    kind: &str,
    storms: &mut u64,
) -> PushFigures {
    if a.push_warmup_secs > 0 {
        let spec = storm_spec(a, pusher, &format!("{kind}_warmup"), *storms);
        *storms += 1;
        storm(ctx, &spec, Arc::new(Bounds::new(Duration::from_secs(a.push_warmup_secs), None))).await;
    }
    ctx.result(&format!("{kind}.loadavg_before"), loadavg());
    let spec = storm_spec(a, pusher, kind, *storms);
    *storms += 1;
    ctx.progress.timed(kind, a.push_secs);
    let out = storm(ctx, &spec, Arc::new(Bounds::new(Duration::from_secs(a.push_secs), None))).await;
    let figures = PushFigures {
        records_per_sec: rate(out.records as f64, out.secs),
        p99_ms: quantile_ms(ctx, kind, 0.99),
    };
    ctx.result(&format!("{kind}.records_per_sec"), figures.records_per_sec);
    ctx.result(&format!("{kind}.p50_ms"), quantile_ms(ctx, kind, 0.5));
    ctx.result(&format!("{kind}.p99_ms"), figures.p99_ms);
    figures
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn medians() {
        assert_eq!(median(&mut []), 0.0);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
