//! `push-storm`: many devices push fresh batches concurrently; optionally verifies afterwards
//! that every acknowledged record is pullable at a change_id no higher than the head its push
//! reported.

use super::scope::district_name;
use super::{backoff, check_push, rate, Bounds, Ctx, PullLoop};
use crate::api::Api;
use crate::cli::PushStormArgs;
use crate::payload;
use crate::payload::RecordPool;
use anyhow::Result;
use bytes::Bytes;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

pub struct StormOutcome {
    pub records: u64,
    pub pushes: u64,
    pub secs: f64,
    /// Per device, per attempt: the head the push reported (None if it failed).
    pub heads: Vec<Vec<Option<i64>>>,
}

pub struct StormSpec {
    pub kind: String,
    pub devices: u64,
    pub batch: u64,
    pub payload_bytes: u64,
    pub form_type: String,
    /// Device-id offset so several storms in one run use distinct observation ids.
    pub device_offset: u64,
    pub keep_heads: bool,
    /// Who pushes (the run's login when `None`).
    pub pusher: Option<Arc<Api>>,
    /// When above 0, device d's records carry `data.district` = district d mod `districts`
    /// (the field scope rules match).
    pub districts: u64,
}

/// Runs devices that push until `bounds` says stop.
pub async fn storm(ctx: &Arc<Ctx>, spec: &StormSpec, bounds: Arc<Bounds>) -> StormOutcome {
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for d in 0..spec.devices {
        let (ctx, bounds) = (ctx.clone(), bounds.clone());
        let kind = spec.kind.clone();
        let form_type = spec.form_type.clone();
        let (batch, payload_bytes, keep) = (spec.batch, spec.payload_bytes as usize, spec.keep_heads);
        let device = d + spec.device_offset;
        let api = spec.pusher.clone().unwrap_or_else(|| ctx.api.clone());
        let fields = match spec.districts {
            0 => Vec::new(),
            n => vec![("district".to_string(), serde_json::Value::from(district_name(device % n)))],
        };
        set.spawn(async move {
            let mut rng = ctx.rng();
            let pool = RecordPool::with_fields(&form_type, payload_bytes, 16, &fields, &mut rng);
            let client_id = format!("load-{}-dev{device}", ctx.run);
            let mut last_head = 0i64;
            let mut heads = Vec::new();
            let (mut records, mut pushes) = (0u64, 0u64);
            let mut attempt = 0u64;
            while bounds.take() {
                let base = attempt * batch;
                let ids: Vec<String> =
                    (base..base + batch).map(|seq| payload::observation_id(&ctx.run, device, seq)).collect();
                let tx = uuid::Uuid::new_v4().to_string();
                let body = Bytes::from(pool.push_body(&tx, &client_id, &ids, &mut rng));
                attempt += 1;
                match api.push_raw(&kind, body).await {
                    Ok(res) => {
                        check_push(&ctx.stats, &res, ids.len(), &mut last_head);
                        records += batch;
                        pushes += 1;
                        ctx.stats.add("records_pushed", batch);
                        if keep {
                            heads.push(Some(res.current_version));
                        }
                    }
                    Err(f) => {
                        if keep {
                            heads.push(None);
                        }
                        backoff(&f).await;
                    }
                }
            }
            (d, records, pushes, heads)
        });
    }
    let mut out =
        StormOutcome { records: 0, pushes: 0, secs: 0.0, heads: vec![Vec::new(); spec.devices as usize] };
    while let Some(r) = set.join_next().await {
        if let Ok((d, records, pushes, heads)) = r {
            out.records += records;
            out.pushes += pushes;
            if let Some(slot) = out.heads.get_mut(d as usize) {
                *slot = heads;
            }
        }
    }
    out.secs = start.elapsed().as_secs_f64();
    out
}

pub async fn run(ctx: Arc<Ctx>, a: PushStormArgs) -> Result<()> {
    ctx.checks_correctness();
    let form_type = format!("load_storm_{}", ctx.run);
    let client_id = format!("load-{}-verify", ctx.run);
    let head_before = ctx.api.head(&client_id).await?;
    let duration = ctx.duration(30);
    ctx.progress.timed("push-storm", duration.as_secs());
    let spec = StormSpec {
        kind: "push".into(),
        devices: a.devices,
        batch: a.batch,
        payload_bytes: a.shape.payload_bytes,
        form_type: form_type.clone(),
        device_offset: 0,
        keep_heads: !a.no_verify,
        pusher: None,
        districts: 0,
    };
    let bounds = Arc::new(Bounds::new(duration, ctx.common.requests));
    let out = storm(&ctx, &spec, bounds).await;
    ctx.result("records_pushed", out.records);
    ctx.result("pushes_ok", out.pushes);
    ctx.result("storm_secs", out.secs);
    ctx.result("records_per_sec", rate(out.records as f64, out.secs));
    ctx.result("pushes_per_sec", rate(out.pushes as f64, out.secs));
    if let Some(p99) = ctx.stats.quantile("push", 0.99) {
        ctx.result("push_p99_ms", p99.as_secs_f64() * 1000.0);
    }
    if !a.no_verify {
        verify(&ctx, &form_type, head_before, a.batch, &out).await?;
    }
    Ok(())
}

/// Pulls the storm's form type from the pre-storm head and checks every acknowledged record
/// arrived, at a change_id at or below the head its push reported.
async fn verify(ctx: &Arc<Ctx>, form_type: &str, from: i64, batch: u64, out: &StormOutcome) -> Result<()> {
    let expected: u64 =
        out.heads.iter().map(|h| h.iter().filter(|x| x.is_some()).count() as u64 * batch).sum();
    ctx.progress.counted("verify pull", expected, "records");
    let prefix = format!("obs_{}_", ctx.run);
    let types = vec![form_type.to_string()];
    let client_id = format!("load-{}-verify", ctx.run);
    let mut pl = PullLoop::new(from);
    let mut seen: HashSet<String> = HashSet::with_capacity(expected as usize);
    let (mut acked_found, mut unacked_found) = (0u64, 0u64);
    let start = Instant::now();
    loop {
        if start.elapsed() > ctx.duration(30) * 20 {
            ctx.note("verification pull stopped early: took more than 20x the storm duration");
            break;
        }
        let page = match pl.page(&ctx.api, "verify_pull", &client_id, 500, &types).await {
            Ok(p) => p,
            Err(f) => {
                ctx.note(format!("verification pull failed: {f}"));
                break;
            }
        };
        ctx.progress.inc(page.ids.len() as u64);
        for (id, version) in page.ids {
            if !seen.insert(id.clone()) {
                ctx.stats.add("duplicate_pulled_records", 1);
                continue;
            }
            let head = id
                .strip_prefix(&prefix)
                .and_then(|rest| rest.split_once('_'))
                .and_then(|(d, seq)| Some((d.parse::<usize>().ok()?, seq.parse::<u64>().ok()?)))
                .and_then(|(d, seq)| out.heads.get(d)?.get((seq / batch) as usize).copied());
            match head {
                Some(Some(h)) => {
                    acked_found += 1;
                    if version > h {
                        ctx.stats.violation(
                            "record_above_push_head",
                            format!("{id} at change_id {version} but its push reported head {h}"),
                        );
                    }
                }
                // A push that failed on the wire may still have committed: not a violation.
                _ => unacked_found += 1,
            }
        }
        if page.done {
            break;
        }
    }
    if acked_found < expected {
        ctx.stats.violation(
            "acknowledged_record_missing",
            format!("{} of {expected} acknowledged records not pulled", expected - acked_found),
        );
    }
    ctx.result("verified_records", acked_found);
    ctx.result("unacknowledged_records_found", unacked_found);
    ctx.result("verify_pull_records_per_sec", rate(pl.records as f64, start.elapsed().as_secs_f64()));
    Ok(())
}
