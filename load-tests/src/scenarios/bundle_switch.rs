//! `bundle-switch`: devices download the active bundle file by file while an admin switches
//! between versions. Every manifest must describe one version with a matching ETag, and every
//! file must be byte-identical to the manifest of the version it was served from (G6).

use super::fleet::{check_file, check_manifest_etag};
use super::{rate, Bounds, Ctx};
use crate::api::{Manifest, ManifestAnswer};
use crate::bundle::build_bundle;
use crate::cli::BundleSwitchArgs;
use anyhow::{anyhow, Result};
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// Manifests by version id, learned from uploads and from manifest responses.
type Known = Arc<RwLock<HashMap<String, Arc<Manifest>>>>;

pub async fn run(ctx: Arc<Ctx>, a: BundleSwitchArgs) -> Result<()> {
    ctx.checks_correctness();
    // Build and upload the versions; only the first is activated by the upload itself.
    let known: Known = Arc::new(RwLock::new(HashMap::new()));
    let mut versions = Vec::new();
    ctx.progress.counted("upload bundles", a.versions, "bundles");
    for i in 0..a.versions {
        let built = build_bundle(i as u32 + 1, a.asset_bytes as usize, a.forms)?;
        let zip_len = built.zip.len();
        let res = ctx
            .api
            .bundle_push(Bytes::from(built.zip), i == 0)
            .await
            .map_err(|f| anyhow!("uploading bundle {i} ({zip_len} bytes) failed: {f}"))?;
        for (path, hash) in &built.files {
            let served = res.manifest.files.iter().find(|f| &f.path == path);
            if served.map(|f| &f.hash) != Some(hash) {
                ctx.stats.violation(
                    "push_manifest_mismatch",
                    format!("version {}: {path} missing or hashed differently", res.version),
                );
            }
        }
        known
            .write()
            .map_err(|_| anyhow!("lock poisoned"))?
            .insert(res.version.clone(), Arc::new(res.manifest));
        versions.push(res.version);
        ctx.progress.inc(1);
    }
    ctx.result("versions", serde_json::json!(versions));

    let stop = Arc::new(AtomicBool::new(false));
    let switch_phase = Duration::from_millis(a.switch_interval_ms) * (a.switches as u32 + 1);
    // The bound is generous: devices finish their current round after the last switch.
    let bounds = Arc::new(Bounds::new(switch_phase * 3 + ctx.duration(60), ctx.common.requests));
    ctx.progress.timed("switching", switch_phase.as_secs().max(1));
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for d in 0..a.devices {
        let (ctx, known, stop, bounds) = (ctx.clone(), known.clone(), stop.clone(), bounds.clone());
        let pinned = a.pinned_only || d % 2 == 0;
        set.spawn(async move { device(ctx, known, stop, bounds, pinned).await });
    }

    // The admin: switch in a cycle through the uploaded versions.
    for k in 0..a.switches {
        tokio::time::sleep(Duration::from_millis(a.switch_interval_ms)).await;
        let target = &versions[((k + 1) % a.versions) as usize];
        match ctx.api.bundle_switch(target).await {
            Ok(()) => ctx.stats.add("switches_ok", 1),
            Err(f) => ctx.note(format!("switch {k} to {target} failed: {f}")),
        }
    }
    tokio::time::sleep(Duration::from_millis(a.switch_interval_ms)).await;
    stop.store(true, Ordering::Relaxed);
    let mut etags = Vec::new();
    while let Some(r) = set.join_next().await {
        if let Ok(Some(tag)) = r {
            etags.push(tag);
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let failed = ctx.stats.counter("failed_downloads");
    ctx.result("switch_phase_secs", secs);
    ctx.result("rounds_completed", ctx.stats.counter("rounds_completed"));
    ctx.result("failed_downloads", failed);
    ctx.result("download_mb_per_sec", rate(ctx.stats.counter("bundle_bytes_downloaded") as f64 / 1e6, secs));
    if a.etag_secs > 0 {
        etag_phase(&ctx, a.devices, a.etag_secs).await;
    }
    Ok(())
}

/// One device: fetch the manifest, then every file; repeat until the admin is done.
/// Returns the last ETag seen.
async fn device(
    ctx: Arc<Ctx>,
    known: Known,
    stop: Arc<AtomicBool>,
    bounds: Arc<Bounds>,
    pinned: bool,
) -> Option<String> {
    let mut last_etag = None;
    while !stop.load(Ordering::Relaxed) && bounds.take() {
        let (manifest, etag) = match ctx.api.manifest("manifest", None).await {
            Ok(ManifestAnswer::Fresh { manifest, etag }) => (manifest, etag),
            Ok(ManifestAnswer::NotModified) => continue, // not sent conditionally; unreachable
            Err(f) => {
                ctx.stats.add("failed_manifests", 1);
                super::backoff(&f).await;
                continue;
            }
        };
        check_manifest_etag(&ctx, &manifest, etag.as_deref());
        last_etag = etag;
        let manifest = remember(&ctx, &known, manifest);
        let mut served_versions = std::collections::BTreeSet::new();
        for f in &manifest.files {
            if !bounds.take() {
                return last_etag;
            }
            if pinned {
                match ctx.api.bundle_file("download", &f.path, Some(&manifest.version)).await {
                    Ok(s) => {
                        ctx.stats.add("bundle_bytes_downloaded", s.size);
                        check_file(&ctx, &manifest.version, &f.path, &f.hash, &s);
                    }
                    Err(e) => {
                        ctx.stats.add("failed_downloads", 1);
                        ctx.stats.violation(
                            "failed_download",
                            format!("{}?version={}: {e}", f.path, manifest.version),
                        );
                    }
                }
            } else {
                // An unpinned client gets whatever is active now; the file must still match
                // the version its x-bundle-version header names.
                match ctx.api.bundle_file("download_unpinned", &f.path, None).await {
                    Ok(s) => {
                        ctx.stats.add("bundle_bytes_downloaded", s.size);
                        let Some(v) = s.header("x-bundle-version") else {
                            ctx.stats.violation("missing_bundle_version_header", f.path.clone());
                            continue;
                        };
                        served_versions.insert(v.clone());
                        let expected =
                            known.read().ok().and_then(|k| k.get(&v).cloned()).and_then(|m| {
                                m.files.iter().find(|x| x.path == f.path).map(|x| x.hash.clone())
                            });
                        match expected {
                            Some(h) if h == s.sha256 => {}
                            Some(h) => ctx.stats.violation(
                                "mixed_version",
                                format!("{} served as {v} but sha256 {} != {h}", f.path, s.sha256),
                            ),
                            None => ctx.stats.violation(
                                "unknown_served_version",
                                format!("{} served as {v}, which has no such file or is unknown", f.path),
                            ),
                        }
                    }
                    // After a switch the path may not exist in the new active version: a
                    // legitimate 404 for an unpinned client (that is why clients pin).
                    Err(e) if e.status() == Some(404) => ctx.stats.add("unpinned_404_after_switch", 1),
                    Err(e) => {
                        ctx.stats.add("failed_downloads", 1);
                        ctx.stats.violation("failed_download", format!("{} (unpinned): {e}", f.path));
                    }
                }
            }
        }
        if served_versions.len() > 1 {
            ctx.stats.add("unpinned_rounds_spanning_switch", 1);
        }
        ctx.stats.add("rounds_completed", 1);
    }
    last_etag
}

/// Records a manifest by version; the same version must always describe the same files.
fn remember(ctx: &Ctx, known: &Known, m: Manifest) -> Arc<Manifest> {
    if let Ok(k) = known.read() {
        if let Some(prev) = k.get(&m.version) {
            if prev.files != m.files || prev.hash != m.hash {
                ctx.stats.violation(
                    "manifest_unstable",
                    format!("version {} described two different ways", m.version),
                );
            }
            return prev.clone();
        }
    }
    let m = Arc::new(m);
    if let Ok(mut k) = known.write() {
        ctx.note(format!("manifest named version {} not uploaded by this run", m.version));
        k.insert(m.version.clone(), m.clone());
    }
    m
}

/// Conditional manifest requests with the current ETag: the cheap path every idle device hits.
async fn etag_phase(ctx: &Arc<Ctx>, devices: u64, secs: u64) {
    let etag = match ctx.api.manifest("manifest", None).await {
        Ok(ManifestAnswer::Fresh { etag: Some(t), .. }) => t,
        _ => {
            ctx.note("ETag phase skipped: no manifest ETag");
            return;
        }
    };
    ctx.progress.timed("etag hits", secs);
    let bounds = Arc::new(Bounds::new(Duration::from_secs(secs), ctx.common.requests));
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..devices {
        let (ctx, bounds, etag) = (ctx.clone(), bounds.clone(), etag.clone());
        set.spawn(async move {
            while bounds.take() {
                match ctx.api.manifest("manifest_if_none_match", Some(&etag)).await {
                    Ok(ManifestAnswer::NotModified) => ctx.stats.add("etag_hits", 1),
                    Ok(ManifestAnswer::Fresh { .. }) => ctx.stats.add("etag_misses", 1),
                    Err(f) => super::backoff(&f).await,
                }
            }
        });
    }
    while set.join_next().await.is_some() {}
    let s = start.elapsed().as_secs_f64();
    ctx.result("etag_hit_requests_per_sec", rate(ctx.stats.counter("etag_hits") as f64, s));
    ctx.result("etag_misses", ctx.stats.counter("etag_misses"));
}
