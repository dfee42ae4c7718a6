//! `attachments`: N concurrent uploads of distinct files (p99), their manifest and download
//! checks, idempotent re-upload and conflict checks (G7), then repeated downloads of one large
//! file (MB/s). `--rss-pid` samples the server's resident memory through every phase;
//! `--direct` runs the same phases against an object store, the server left out.

use super::{rate, Bounds, Ctx};
use crate::api::{encode_segment, Fail, Streamed, UploadResult};
use crate::cli::AttachmentArgs;
use crate::payload;
use crate::rss::RssSampler;
use anyhow::{anyhow, Result};
use bytes::Bytes;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// An upload: `PUT /attachments/{id}` of the server, or an unsigned conditional `PUT` of the
/// object store with `--direct` (no answer body to check then).
async fn upload(
    ctx: &Ctx,
    direct: bool,
    kind: &str,
    id: &str,
    bytes: Bytes,
) -> Result<Option<UploadResult>, Fail> {
    if !direct {
        return ctx.api.upload_attachment(kind, id, bytes).await.map(Some);
    }
    let url = ctx.api.base.join(&format!("/{}", encode_segment(id)));
    ctx.api
        .exec(kind, false, |c, _| {
            c.put(&url).header("if-none-match", "*").header("x-amz-acl", "public-read").body(bytes.clone())
        })
        .await
        .map(|_| None)
}

async fn download(ctx: &Ctx, direct: bool, kind: &str, id: &str) -> Result<Streamed, Fail> {
    if !direct {
        return ctx.api.download_attachment(kind, id).await;
    }
    let url = ctx.api.base.join(&format!("/{}", encode_segment(id)));
    ctx.api.exec_stream_as(kind, false, |c, _| c.get(&url)).await
}

pub async fn run(ctx: Arc<Ctx>, a: AttachmentArgs) -> Result<()> {
    ctx.checks_correctness();
    let rss = RssSampler::start(&a.rss_pids);
    if let Some(r) = &rss {
        ctx.result("rss_mib_before", r.now_mib());
    }
    let client_id = format!("load-{}-att", ctx.run);
    let head = if a.direct { 0 } else { ctx.api.head(&client_id).await? };
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
        let (ctx, files, bounds, direct) = (ctx.clone(), files.clone(), bounds.clone(), a.direct);
        set.spawn(async move {
            if !bounds.take() {
                return false;
            }
            let (id, bytes, sha) = &files[i];
            let ok = match upload(&ctx, direct, "upload", id, bytes.clone()).await {
                Ok(None) => true,
                Ok(Some(r)) => {
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
    if let Some(r) = &rss {
        ctx.result("rss_mib_peak_uploads", r.mark());
    }

    // Every upload must be listed by the manifest since the pre-run head.
    if a.direct {
        ctx.note("--direct: the object store alone; manifest and immutability checks skipped");
    } else if let Ok(m) = ctx.api.attachment_manifest(&client_id, head).await {
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
        let (ctx, files, bounds, direct) = (ctx.clone(), files.clone(), bounds.clone(), a.direct);
        set.spawn(async move {
            if !bounds.take() {
                return;
            }
            let (id, _, sha) = &files[i];
            match download(&ctx, direct, "download", id).await {
                Ok(s) if &s.sha256 != sha => ctx.stats.violation("download_mismatch", id.clone()),
                Ok(_) => {}
                Err(f) => ctx.stats.violation("readback_failed", format!("{id}: {f}")),
            }
            ctx.progress.inc(1);
        });
    }
    while set.join_next().await.is_some() {}

    // Immutability: same bytes -> 200 created:false; different bytes -> 409 (10.2).
    if let Some((id, bytes, _)) = files.first().filter(|_| !a.direct) {
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
    upload(&ctx, a.direct, "upload_large", &large_id, Bytes::from(large))
        .await
        .map_err(|f| anyhow!("uploading the large file failed: {f}"))?;
    if let Some(r) = &rss {
        ctx.result("rss_mib_peak_readback", r.mark());
    }
    ctx.progress.counted("large downloads", a.downloads, "files");
    let next = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..a.download_concurrency {
        let (ctx, next, bytes, bounds) = (ctx.clone(), next.clone(), bytes.clone(), bounds.clone());
        let (id, sha, total, direct) = (large_id.clone(), large_sha.clone(), a.downloads, a.direct);
        set.spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < total && bounds.take() {
                match download(&ctx, direct, "download_large", &id).await {
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
    if let Some(r) = &rss {
        ctx.result("rss_mib_peak_downloads", r.mark());
        ctx.result("rss_mib_after", r.now_mib());
    }
    Ok(())
}
