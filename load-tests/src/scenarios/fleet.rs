//! `fleet`: a mix of device behaviour (incremental pulls, pushes, attachment upload + manifest +
//! download, bundle manifest with If-None-Match + file downloads), each device choosing its next
//! operation by weight.

use super::{backoff, check_push, rate, Bounds, Ctx, PullLoop};
use crate::api::{Manifest, ManifestAnswer};
use crate::bundle::build_bundle;
use crate::cli::FleetArgs;
use crate::payload;
use anyhow::Result;
use bytes::Bytes;
use rand::Rng;
use serde_json::Value;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Clone, Copy)]
enum Op {
    Pull,
    Push,
    Attachment,
    Bundle,
}

fn pick(a: &FleetArgs, rng: &mut impl Rng) -> Option<Op> {
    let weights = [
        (Op::Pull, a.pull_weight),
        (Op::Push, a.push_weight),
        (Op::Attachment, a.attachment_weight),
        (Op::Bundle, a.bundle_weight),
    ];
    let total: u32 = weights.iter().map(|w| w.1).sum();
    if total == 0 {
        return None;
    }
    let mut x = rng.gen_range(0..total);
    for (op, w) in weights {
        if x < w {
            return Some(op);
        }
        x -= w;
    }
    None
}

struct Device {
    id: u64,
    client_id: String,
    pull: PullLoop,
    push_seq: u64,
    last_head: i64,
    attachment_cursor: i64,
    etag: Option<String>,
}

pub async fn run(ctx: Arc<Ctx>, a: FleetArgs) -> Result<()> {
    ctx.checks_correctness();
    let setup_client = format!("load-{}-setup", ctx.run);
    let head = ctx.api.head(&setup_client).await?;
    if a.bundle_weight > 0 {
        ensure_bundle(&ctx).await?;
    }
    let duration = ctx.duration(60);
    ctx.progress.timed("fleet", duration.as_secs());
    let bounds = Arc::new(Bounds::new(duration, ctx.common.requests));
    let a = Arc::new(a);
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for d in 0..a.devices {
        let (ctx, bounds, a) = (ctx.clone(), bounds.clone(), a.clone());
        set.spawn(async move {
            let mut dev = Device {
                id: d,
                client_id: format!("load-{}-dev{d}", ctx.run),
                // Devices start "in sync" at the pre-run head; a full initial pull is what
                // `initial-sync` measures.
                pull: PullLoop::new(head),
                push_seq: 0,
                last_head: 0,
                attachment_cursor: head,
                etag: None,
            };
            let mut rng = ctx.rng();
            while !bounds.is_stopped() {
                let Some(op) = pick(&a, &mut rng) else { break };
                match op {
                    Op::Pull => pull(&ctx, &bounds, &mut dev).await,
                    Op::Push => push(&ctx, &bounds, &a, &mut dev, &mut rng).await,
                    Op::Attachment => attachment(&ctx, &bounds, &a, &mut dev, &mut rng).await,
                    Op::Bundle => bundle(&ctx, &bounds, &mut dev).await,
                }
                if a.think_ms > 0 {
                    tokio::time::sleep(Duration::from_millis(a.think_ms)).await;
                }
            }
        });
    }
    while set.join_next().await.is_some() {}
    let secs = start.elapsed().as_secs_f64();
    ctx.result("fleet_secs", secs);
    let (ok, err) = ctx.stats.totals();
    ctx.result("requests_per_sec", rate((ok + err) as f64, secs));
    ctx.result("records_pushed_per_sec", rate(ctx.stats.counter("records_pushed") as f64, secs));
    ctx.result("records_pulled_per_sec", rate(ctx.stats.counter("records_pulled") as f64, secs));
    Ok(())
}

/// Makes sure a bundle is active so bundle traffic has something to fetch.
pub async fn ensure_bundle(ctx: &Arc<Ctx>) -> Result<()> {
    match ctx.api.manifest("setup_manifest", None).await {
        Ok(_) => Ok(()),
        Err(f) if f.status() == Some(404) => {
            let b = build_bundle(1, 256 * 1024, 2)?;
            ctx.api
                .bundle_push(Bytes::from(b.zip), true)
                .await
                .map_err(|f| anyhow::anyhow!("pushing a bundle for the fleet failed: {f}"))?;
            ctx.note("no bundle was active: pushed and activated a small test bundle");
            Ok(())
        }
        Err(f) => anyhow::bail!("bundle manifest failed: {f}"),
    }
}

async fn pull(ctx: &Ctx, bounds: &Bounds, dev: &mut Device) {
    while bounds.take() {
        match dev.pull.page(&ctx.api, "pull", &dev.client_id, 500, &[]).await {
            Ok(p) if p.done => break,
            Ok(_) => {}
            Err(f) => {
                backoff(&f).await;
                break;
            }
        }
    }
}

async fn push(ctx: &Ctx, bounds: &Bounds, a: &FleetArgs, dev: &mut Device, rng: &mut impl Rng) {
    if !bounds.take() {
        return;
    }
    let records: Vec<Value> = (0..a.batch)
        .map(|_| {
            dev.push_seq += 1;
            let id = payload::observation_id(&ctx.run, dev.id, dev.push_seq);
            payload::record(&id, "load_fleet", a.shape.payload_bytes as usize, rng)
        })
        .collect();
    match ctx.api.push("push", &dev.client_id, &records).await {
        Ok(res) => {
            check_push(&ctx.stats, &res, records.len(), &mut dev.last_head);
            ctx.stats.add("records_pushed", records.len() as u64);
        }
        Err(f) => backoff(&f).await,
    }
}

async fn attachment(ctx: &Ctx, bounds: &Bounds, a: &FleetArgs, dev: &mut Device, rng: &mut impl Rng) {
    if !bounds.take() {
        return;
    }
    let bytes = payload::random_bytes(a.attachment_bytes as usize, rng);
    let sha = payload::sha256_hex(&bytes);
    let id = format!("{}.bin", uuid::Uuid::new_v4());
    match ctx.api.upload_attachment("upload", &id, Bytes::from(bytes)).await {
        Ok(r) => {
            ctx.stats.add("attachment_bytes_uploaded", a.attachment_bytes);
            if r.sha256.as_deref().is_some_and(|s| s != sha) {
                ctx.stats.violation("upload_sha_mismatch", format!("{id}: server sha differs"));
            }
        }
        Err(f) => {
            backoff(&f).await;
            return;
        }
    }
    if !bounds.take() {
        return;
    }
    // Formulus's flow: ask the manifest what is new since its cursor, then fetch.
    match ctx.api.attachment_manifest(&dev.client_id, dev.attachment_cursor).await {
        Ok(m) => {
            if !m.operations.iter().any(|o| o.attachment_id == id) {
                ctx.stats.violation(
                    "attachment_manifest_missing",
                    format!("{id} uploaded but absent from the manifest since {}", dev.attachment_cursor),
                );
            }
            dev.attachment_cursor = m.current_version;
        }
        Err(f) => backoff(&f).await,
    }
    if !bounds.take() {
        return;
    }
    match ctx.api.download_attachment("attachment_download", &id).await {
        Ok(s) => {
            ctx.stats.add("attachment_bytes_downloaded", s.size);
            if s.sha256 != sha {
                ctx.stats.violation("attachment_content_mismatch", format!("{id}: downloaded bytes differ"));
            }
        }
        Err(f) => backoff(&f).await,
    }
}

async fn bundle(ctx: &Ctx, bounds: &Bounds, dev: &mut Device) {
    if !bounds.take() {
        return;
    }
    let kind = if dev.etag.is_some() { "manifest_conditional" } else { "manifest" };
    let manifest: Manifest = match ctx.api.manifest(kind, dev.etag.as_deref()).await {
        Ok(ManifestAnswer::NotModified) => {
            ctx.stats.add("manifest_etag_hits", 1);
            return;
        }
        Ok(ManifestAnswer::Fresh { manifest, etag }) => {
            check_manifest_etag(ctx, &manifest, etag.as_deref());
            dev.etag = etag;
            manifest
        }
        Err(f) => {
            backoff(&f).await;
            return;
        }
    };
    for f in &manifest.files {
        if !bounds.take() {
            return;
        }
        match ctx.api.bundle_file("download", &f.path, Some(&manifest.version)).await {
            Ok(s) => {
                ctx.stats.add("bundle_bytes_downloaded", s.size);
                check_file(ctx, &manifest.version, &f.path, &f.hash, &s);
            }
            Err(e) => backoff(&e).await,
        }
    }
}

/// The manifest's ETag must be its bundle hash, and the hash must follow 9.4's formula.
pub fn check_manifest_etag(ctx: &Ctx, m: &Manifest, etag: Option<&str>) {
    let want = format!("\"{}\"", m.hash);
    if etag != Some(want.as_str()) {
        ctx.stats.violation(
            "manifest_etag_mismatch",
            format!("version {}: ETag {:?}, body hash {}", m.version, etag, m.hash),
        );
    }
    if m.computed_hash() != m.hash {
        ctx.stats.violation(
            "manifest_hash_wrong",
            format!("version {}: hash does not match its file list", m.version),
        );
    }
}

/// A pinned file download must come from the pinned version and match its manifest hash.
pub fn check_file(ctx: &Ctx, version: &str, path: &str, hash: &str, s: &crate::api::Streamed) {
    let served = s.header("x-bundle-version");
    if served.as_deref() != Some(version) {
        ctx.stats.violation(
            "mixed_version",
            format!("{path}?version={version} served x-bundle-version {served:?}"),
        );
    }
    if s.sha256 != hash {
        ctx.stats.violation(
            "bundle_file_mismatch",
            format!("{path} of {version}: sha256 {} != manifest {hash}", s.sha256),
        );
    }
}
