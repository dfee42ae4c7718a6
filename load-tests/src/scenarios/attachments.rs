//! `attachments`: N concurrent uploads of distinct files (p99), their manifest and download
//! checks, idempotent re-upload and conflict checks (G7), then repeated downloads of one large
//! file (MB/s).

use super::{rate, Bounds, Ctx};
use crate::cli::AttachmentArgs;
use crate::payload;
use anyhow::{anyhow, Result};
use bytes::Bytes;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

pub async fn run(ctx: Arc<Ctx>, a: AttachmentArgs) -> Result<()> {
    ctx.checks_correctness();
    let client_id = format!("load-{}-att", ctx.run);
    let head = ctx.api.head(&client_id).await?;
    let bounds = Arc::new(Bounds::new(ctx.duration(600), ctx.common.requests));

    // Phase 1: concurrent uploads, all released at once.
    let mut rng = ctx.rng();
    let files: Vec<(String, Bytes, String)> = (0..a.uploads)
        .map(|i| {
            let b = payload::random_bytes(a.upload_bytes as usize, &mut rng);
            let sha = payload::sha256_hex(&b);
            (format!("load-{}-{i}.bin", ctx.run), Bytes::from(b), sha)
        })
        .collect();
    let files = Arc::new(files);
    ctx.progress.counted("uploads", a.uploads, "files");
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for i in 0..files.len() {
        let (ctx, files, bounds) = (ctx.clone(), files.clone(), bounds.clone());
        set.spawn(async move {
            if !bounds.take() {
                return false;
            }
            let (id, bytes, sha) = &files[i];
            let ok = match ctx.api.upload_attachment("upload", id, bytes.clone()).await {
                Ok(r) => {
                    if r.sha256.as_deref().is_some_and(|s| s != sha)
                        || r.size.is_some_and(|s| s != bytes.len() as u64)
                    {
                        ctx.stats.violation("upload_metadata_mismatch", id.clone());
                    }
                    true
                }
                Err(_) => false,
            };
            ctx.progress.inc(1);
            ok
        });
    }
    let mut uploaded = 0u64;
    while let Some(r) = set.join_next().await {
        if matches!(r, Ok(true)) {
            uploaded += 1;
        }
    }
    let up_secs = start.elapsed().as_secs_f64();
    ctx.result("uploads_ok", uploaded);
    ctx.result("upload_mb_per_sec", rate((uploaded * a.upload_bytes) as f64 / 1e6, up_secs));
    if let Some(p) = ctx.stats.quantile("upload", 0.99) {
        ctx.result("upload_p99_ms", p.as_secs_f64() * 1000.0);
    }

    // Every upload must be listed by the manifest since the pre-run head.
    if let Ok(m) = ctx.api.attachment_manifest(&client_id, head).await {
        let listed: HashSet<&str> = m.operations.iter().map(|o| o.attachment_id.as_str()).collect();
        let missing = files.iter().filter(|(id, _, _)| !listed.contains(id.as_str())).count();
        if uploaded == a.uploads && missing > 0 {
            ctx.stats.violation("manifest_missing_upload", format!("{missing} uploads not in the manifest"));
        }
    }

    // Each uploaded file reads back byte-identical.
    ctx.progress.counted("read back", a.uploads, "files");
    let mut set = tokio::task::JoinSet::new();
    for i in 0..files.len() {
        let (ctx, files, bounds) = (ctx.clone(), files.clone(), bounds.clone());
        set.spawn(async move {
            if !bounds.take() {
                return;
            }
            let (id, _, sha) = &files[i];
            if let Ok(s) = ctx.api.download_attachment("download", id).await {
                if &s.sha256 != sha {
                    ctx.stats.violation("download_mismatch", id.clone());
                }
            }
            ctx.progress.inc(1);
        });
    }
    while set.join_next().await.is_some() {}

    // Immutability: same bytes -> 200 created:false; different bytes -> 409 (10.2).
    if let Some((id, bytes, _)) = files.first() {
        match ctx.api.upload_attachment("reupload_same", id, bytes.clone()).await {
            Ok(r) if r.created == Some(true) => {
                ctx.stats.violation("reupload_created", format!("{id}: identical re-upload said created"))
            }
            Ok(_) => {}
            Err(f) => ctx.stats.violation("reupload_failed", format!("{id}: {f}")),
        }
        let other = Bytes::from(payload::random_bytes(bytes.len().max(1), &mut rng));
        match ctx.api.upload_attachment_expecting("conflict_upload", id, other, Some(409)).await {
            Err(f) if f.status() == Some(409) => {}
            Ok(_) => ctx.stats.violation("conflict_accepted", format!("{id}: different bytes accepted")),
            Err(f) => ctx.stats.violation("conflict_wrong_status", format!("{id}: {f}")),
        }
    }
    drop(files);

    // Phase 2: one large file, downloaded repeatedly.
    let large = payload::random_bytes(a.large_bytes as usize, &mut rng);
    let large_sha = payload::sha256_hex(&large);
    let large_id = format!("load-{}-large.bin", ctx.run);
    ctx.api
        .upload_attachment("upload_large", &large_id, Bytes::from(large))
        .await
        .map_err(|f| anyhow!("uploading the large file failed: {f}"))?;
    ctx.progress.counted("large downloads", a.downloads, "files");
    let next = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..a.download_concurrency {
        let (ctx, next, bytes, bounds) = (ctx.clone(), next.clone(), bytes.clone(), bounds.clone());
        let (id, sha, total) = (large_id.clone(), large_sha.clone(), a.downloads);
        set.spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < total && bounds.take() {
                match ctx.api.download_attachment("download_large", &id).await {
                    Ok(s) => {
                        bytes.fetch_add(s.size, Ordering::Relaxed);
                        if s.sha256 != sha {
                            ctx.stats.violation("large_download_mismatch", id.clone());
                        }
                    }
                    Err(f) => super::backoff(&f).await,
                }
                ctx.progress.inc(1);
            }
        });
    }
    while set.join_next().await.is_some() {}
    let secs = start.elapsed().as_secs_f64();
    let total = bytes.load(Ordering::Relaxed);
    ctx.result("large_download_mb_per_sec", rate(total as f64 / 1e6, secs));
    ctx.result("large_download_mib_per_sec", rate(total as f64 / 1_048_576.0, secs));
    if let Some(p) = ctx.stats.quantile("download_large", 0.99) {
        ctx.result("large_download_p99_ms", p.as_secs_f64() * 1000.0);
    }
    Ok(())
}
