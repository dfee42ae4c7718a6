//! `capacity`: how many realistic devices one node holds. Devices on a timer (push, pull,
//! a photo every tenth push, a manifest check every few minutes) are added in steps; each step
//! is measured after its new devices have joined, and the ramp stops at the first step whose
//! p99 of any request kind passes the limit or that has more errors than allowed.
//!
//! Each device is one async task asleep between its cycles, sharing one HTTP connection pool:
//! 20,000 devices need about as many sockets as requests in flight, not 20,000.

mod device;
mod district;

use super::fleet::ensure_bundle;
use super::scope::{self, district_name, ScopedTypes};
use super::{rate, Ctx};
use crate::api::{Api, ManifestAnswer};
use crate::cli::CapacityArgs;
use crate::payload::RecordPool;
use crate::stats::KindSummary;
use crate::sysmon::{self, Usage, Watched};
use anyhow::{bail, Result};
use device::{Device, Mode, Shared};
use district::{District, Names, Planner};
use futures_util::StreamExt;
use serde::Serialize;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The request kinds a device sends, in the order the step tables show them.
const KINDS: [&str; 5] = ["push", "pull", "attachment_manifest", "upload", "manifest"];

#[derive(Debug, Clone, Serialize)]
struct Step {
    devices: u64,
    measured_secs: f64,
    requests: Vec<KindSummary>,
    records_pushed_per_sec: f64,
    records_pulled_per_sec: f64,
    errors: u64,
    usage: Usage,
    /// Why the step failed the stop rule; `None` when it passed.
    failed: Option<String>,
}

pub async fn run(ctx: Arc<Ctx>, a: CapacityArgs) -> Result<()> {
    ctx.checks_correctness();
    let warmup = a.warmup_secs.unwrap_or(a.period_secs);
    if warmup >= a.step_secs {
        bail!("--warmup-secs ({warmup}) must be shorter than --step-secs ({})", a.step_secs);
    }
    if a.batch_min > a.batch_max {
        bail!("--batch-min ({}) is above --batch-max ({})", a.batch_min, a.batch_max);
    }
    if a.district_min > a.district_max {
        bail!("--district-min ({}) is above --district-max ({})", a.district_min, a.district_max);
    }
    let users = if a.scoped { Vec::new() } else { login_users(&ctx, a.users).await? };
    let names = if a.scoped { Some(scoped_setup(&ctx, &a).await?) } else { None };
    ensure_bundle(&ctx).await?;
    let etag = match ctx.api.manifest("setup_manifest", None).await {
        Ok(ManifestAnswer::Fresh { etag, .. }) => etag,
        Ok(ManifestAnswer::NotModified) => None,
        Err(f) => bail!("bundle manifest failed: {f}"),
    };
    let head = ctx.api.head(&format!("cap-{}-setup", ctx.run)).await?;
    let a = Arc::new(a);
    let stop = Arc::new(AtomicBool::new(false));
    let mut rng = ctx.rng();
    let photos = (0..a.photo_variants)
        .map(|_| bytes::Bytes::from(crate::payload::random_bytes(a.photo_bytes as usize, &mut rng)))
        .collect();
    let shared = Arc::new(Shared {
        ctx: ctx.clone(),
        args: a.clone(),
        stop: stop.clone(),
        etag,
        head,
        photos,
        names: names.clone(),
    });
    let watched = Watched { server: a.server_pid, postgres: a.pg_pid };
    if a.scoped {
        ctx.note(format!(
            "districts of {}..{} devices (sizes drawn uniformly); each district's devices share one \
             read-write user whose attribute `district` names it, logged in once",
            a.district_min, a.district_max
        ));
        ctx.note(
            "scope set: the district's households and visits (`where district in_attribute district`) \
             and a shared form type for everyone; devices send no schema_types and sync from cursor 0",
        );
    } else {
        ctx.note(format!(
            "{} users (role read-write), each logged in once; device d uses user d mod {}",
            a.users, a.users
        ));
        ctx.note(if a.pull_all {
            format!("teams of {} devices share a form type; every device pulls every record", a.team_size)
        } else {
            format!(
                "teams of {} devices share a form type; each device pulls only its team's type",
                a.team_size
            )
        });
    }

    let mut set = tokio::task::JoinSet::new();
    let mut spawned = 0u64;
    let mut pool: Option<Arc<RecordPool>> = None;
    let mut planner = Planner::new(a.district_min, a.district_max);
    let mut districts: Vec<Arc<District>> = Vec::new();
    let mut steps: Vec<Step> = Vec::new();
    let mut target = a.start_devices.min(a.max_devices);
    loop {
        let mut rng = ctx.rng();
        if let Some(names) = &names {
            let placed: Vec<u64> = (spawned..target).map(|_| planner.place(&mut rng)).collect();
            open_districts(&ctx, &a, names, &mut districts, planner.districts()).await?;
            for d in placed {
                let district = districts[d as usize].clone();
                let dev = Device { id: spawned, api: district.api.clone(), mode: Mode::District(district) };
                set.spawn(dev.run(shared.clone()));
                spawned += 1;
            }
            ctx.result("districts", planner.districts());
            ctx.result("district_mean_devices", (planner.mean_size() * 10.0).round() / 10.0);
        }
        while spawned < target {
            let team = spawned / a.team_size;
            let team_type = format!("cap_{}_team{team}", ctx.run);
            if spawned.is_multiple_of(a.team_size) || pool.is_none() {
                pool =
                    Some(Arc::new(RecordPool::new(&team_type, a.shape.payload_bytes as usize, 4, &mut rng)));
            }
            let Some(pool) = pool.clone() else { break };
            let types = if a.pull_all { Vec::new() } else { vec![team_type] };
            let dev = Device {
                id: spawned,
                api: users[(spawned % a.users) as usize].clone(),
                mode: Mode::Team { pool, types },
            };
            set.spawn(dev.run(shared.clone()));
            spawned += 1;
        }
        let step = measure_step(&ctx, &a, watched, spawned, warmup).await;
        eprintln!("capacity: {}", step_line(&step));
        let failed = step.failed.is_some();
        steps.push(step);
        publish(&ctx, &a, &steps);
        if failed || target >= a.max_devices {
            break;
        }
        target = (target + a.step_devices).min(a.max_devices);
    }
    stop.store(true, Ordering::Relaxed);
    set.abort_all();
    while set.join_next().await.is_some() {}
    Ok(())
}

/// Puts the district scope set in force (replacing any set on the server) and pushes the shared
/// records as the admin, before any device starts.
async fn scoped_setup(ctx: &Arc<Ctx>, a: &CapacityArgs) -> Result<Names> {
    let types = ScopedTypes::new(&format!("cap_{}", ctx.run));
    let (version, secs) =
        scope::put_in_force(ctx, &types.district_rules(), Duration::from_secs(a.scope_timeout_secs)).await?;
    ctx.result("scope_version", version);
    ctx.result("scope_prepare_secs", secs);
    let names = Names::new(&ctx.run, types, a.shared_records);
    if a.shared_records > 0 {
        let mut rng = ctx.rng();
        let pool = RecordPool::new(&names.types.shared, a.shape.payload_bytes as usize, 4, &mut rng);
        let ids: Vec<String> = (0..a.shared_records).map(|i| names.shared_record(i)).collect();
        let tx = uuid::Uuid::new_v4().to_string();
        let body = bytes::Bytes::from(pool.push_body(&tx, &format!("cap-{}-admin", ctx.run), &ids, &mut rng));
        if let Err(f) = ctx.api.push_raw("setup_shared", body).await {
            bail!("pushing the shared records failed: {f}");
        }
    }
    Ok(names)
}

/// Opens districts up to `count`: for each a read-write user with its `district` attribute,
/// logged in once, and its record pools; a few at a time (each user costs a password hash to
/// create and one to log in).
async fn open_districts(
    ctx: &Arc<Ctx>,
    a: &CapacityArgs,
    names: &Names,
    districts: &mut Vec<Arc<District>>,
    count: u64,
) -> Result<()> {
    let from = districts.len() as u64;
    let opened: Vec<Result<District>> = futures_util::stream::iter(from..count)
        .map(|i| open_district(ctx, a, names, i))
        .buffered(8)
        .collect()
        .await;
    for d in opened {
        districts.push(Arc::new(d?));
    }
    Ok(())
}

async fn open_district(ctx: &Arc<Ctx>, a: &CapacityArgs, names: &Names, i: u64) -> Result<District> {
    let name = district_name(i);
    let user = format!("cap-{}-{name}", ctx.run);
    let password = format!("pw-{}-{i}", ctx.run);
    if let Err(f) = ctx.api.create_user(&user, &password, "read-write").await {
        bail!("creating user {user} failed (--username must be an admin): {f}");
    }
    if let Err(f) = ctx.api.set_attributes(&user, &serde_json::json!({ "district": [name] })).await {
        bail!("setting the district of {user} failed: {f}");
    }
    let api = ctx.api.as_user(&user, &password);
    api.login().await?;
    let mut rng = ctx.rng();
    let fields = vec![("district".to_string(), serde_json::Value::from(name.clone()))];
    let pool = |form_type: &str, rng: &mut rand::rngs::StdRng| {
        Arc::new(RecordPool::with_fields(form_type, a.shape.payload_bytes as usize, 2, &fields, rng))
    };
    let pools = [pool(&names.types.household, &mut rng), pool(&names.types.visit, &mut rng)];
    Ok(District { name, api: Arc::new(api), pools, ledger: Mutex::new(Default::default()) })
}

/// Creates `n` read-write users through the admin and logs each in once.
async fn login_users(ctx: &Ctx, n: u64) -> Result<Vec<Arc<Api>>> {
    let mut users = Vec::new();
    for i in 0..n {
        let name = format!("cap-{}-u{i}", ctx.run);
        let password = format!("pw-{}-{i}", ctx.run);
        if let Err(f) = ctx.api.create_user(&name, &password, "read-write").await {
            bail!("creating user {name} failed (--username must be an admin): {f}");
        }
        let api = ctx.api.as_user(&name, &password);
        api.login().await?;
        users.push(Arc::new(api));
    }
    Ok(users)
}

/// Waits out the warm-up, then measures the rest of the step.
async fn measure_step(ctx: &Ctx, a: &CapacityArgs, w: Watched, devices: u64, warmup: u64) -> Step {
    tokio::time::sleep(Duration::from_secs(warmup)).await;
    let started = Instant::now();
    let _ = ctx.stats.take_window(0.0);
    let before = sysmon::sample(w);
    let (pushed0, pulled0) = (ctx.stats.counter("records_pushed"), ctx.stats.counter("records_pulled"));
    tokio::time::sleep(Duration::from_secs(a.step_secs - warmup)).await;
    let secs = started.elapsed().as_secs_f64();
    let requests = ctx.stats.take_window(secs);
    let after = sysmon::sample(w);
    let pushed = ctx.stats.counter("records_pushed") - pushed0;
    let pulled = ctx.stats.counter("records_pulled") - pulled0;
    let errors = requests.iter().map(|k| k.errors).sum();
    let mut step = Step {
        devices,
        measured_secs: (secs * 10.0).round() / 10.0,
        requests,
        records_pushed_per_sec: rate(pushed as f64, secs).round(),
        records_pulled_per_sec: rate(pulled as f64, secs).round(),
        errors,
        usage: sysmon::usage(w, &before, &after),
        failed: None,
    };
    step.failed = verdict(&step, a);
    step
}

/// The stop rule: any kind's p99 above the limit, or more errors than allowed.
fn verdict(step: &Step, a: &CapacityArgs) -> Option<String> {
    let mut why = Vec::new();
    for k in &step.requests {
        if k.p99_ms > a.p99_limit_ms as f64 {
            why.push(format!("{} p99 {:.0} ms > {} ms", k.kind, k.p99_ms, a.p99_limit_ms));
        }
    }
    if step.errors > a.max_errors {
        let by: Vec<String> = step
            .requests
            .iter()
            .flat_map(|k| k.errors_by_status.iter().map(move |(s, n)| format!("{} {s}: {n}", k.kind)))
            .collect();
        why.push(format!("{} errors ({})", step.errors, by.join(", ")));
    }
    (!why.is_empty()).then(|| why.join("; "))
}

fn kind<'a>(step: &'a Step, name: &str) -> Option<&'a KindSummary> {
    step.requests.iter().find(|k| k.kind == name)
}

fn step_line(s: &Step) -> String {
    let mut line = format!("{} devices:", s.devices);
    for name in KINDS {
        if let Some(k) = kind(s, name) {
            let _ = write!(line, " {name} {:.1}/s p99 {:.0} ms;", k.throughput_per_sec, k.p99_ms);
        }
    }
    let u = &s.usage;
    let _ = write!(
        line,
        " errors {}; cpu server {:?} (wait {:?}) pg {:?} (wait {:?}) load {:?} machine {:?} %; {}",
        s.errors,
        u.server_cpu_pct,
        u.server_runqueue_wait_pct,
        u.postgres_cpu_pct,
        u.postgres_runqueue_wait_pct,
        u.load_tool_cpu_pct,
        u.machine_busy_pct,
        s.failed.as_deref().unwrap_or("pass")
    );
    line
}

/// Puts the steps so far into the report (the run may still be cut short by --max-time).
fn publish(ctx: &Ctx, a: &CapacityArgs, steps: &[Step]) {
    let held = steps.iter().filter(|s| s.failed.is_none()).map(|s| s.devices).max();
    ctx.result("devices_held", held.unwrap_or(0));
    if let Some(last) = steps.last().filter(|s| s.failed.is_some()) {
        ctx.result("stopped_at_devices", last.devices);
        ctx.result("stop_reason", last.failed.clone().unwrap_or_default());
    }
    ctx.result(
        "device_request_rate_per_sec",
        format!(
            "push and pull{} {:.4} × devices; upload / {}; manifest / {}",
            if a.attachment_manifest { " and attachment manifest" } else { "" },
            1.0 / a.period_secs as f64,
            a.period_secs * a.photo_every.max(1),
            a.manifest_secs
        ),
    );
    ctx.detail("steps", serde_json::to_value(steps).unwrap_or_default());
    ctx.set_sections(vec![steps_markdown(steps)]);
}

fn opt(v: Option<f64>) -> String {
    v.map(|x| format!("{x:.1}")).unwrap_or_else(|| "–".into())
}

fn steps_markdown(steps: &[Step]) -> String {
    let mut md =
        String::from("## Steps\n\nRequests per second and latency over each step's measured part.\n\n");
    md.push_str("| devices | push/s | pull/s | attachment manifest/s | upload/s | manifest/s | records pushed/s | records pulled/s | errors | verdict |\n");
    md.push_str("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for s in steps {
        let rate = |n: &str| {
            kind(s, n).map(|k| format!("{:.1}", k.throughput_per_sec)).unwrap_or_else(|| "–".into())
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            s.devices,
            rate("push"),
            rate("pull"),
            rate("attachment_manifest"),
            rate("upload"),
            rate("manifest"),
            s.records_pushed_per_sec,
            s.records_pulled_per_sec,
            s.errors,
            s.failed.as_deref().unwrap_or("pass")
        );
    }
    md.push_str("\n| devices | push p50 / p99 ms | pull p50 / p99 ms | attachment manifest p50 / p99 ms | upload p50 / p99 ms | manifest p50 / p99 ms |\n");
    md.push_str("|---:|---:|---:|---:|---:|---:|\n");
    for s in steps {
        let lat = |n: &str| {
            kind(s, n).map(|k| format!("{:.1} / {:.1}", k.p50_ms, k.p99_ms)).unwrap_or_else(|| "–".into())
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} |",
            s.devices,
            lat("push"),
            lat("pull"),
            lat("attachment_manifest"),
            lat("upload"),
            lat("manifest")
        );
    }
    md.push_str("\nCPU in % of one core (the machine's total is 100 % when every core is busy).\n\n");
    md.push_str("Run-queue wait: time the processes were ready to run but waited for a core.\n\n");
    md.push_str("| devices | server CPU % | server run-queue wait % | server RSS MB | PostgreSQL CPU % | PostgreSQL run-queue wait % | load tool CPU % | load tool RSS MB | load tool fds | machine busy % | iowait % | load average |\n");
    md.push_str("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for s in steps {
        let u = &s.usage;
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            s.devices,
            opt(u.server_cpu_pct),
            opt(u.server_runqueue_wait_pct),
            opt(u.server_rss_mb),
            opt(u.postgres_cpu_pct),
            opt(u.postgres_runqueue_wait_pct),
            opt(u.load_tool_cpu_pct),
            opt(u.load_tool_rss_mb),
            u.load_tool_open_fds.map(|n| n.to_string()).unwrap_or_else(|| "–".into()),
            opt(u.machine_busy_pct),
            opt(u.machine_iowait_pct),
            opt(u.load_average_1m),
        );
    }
    md
}
