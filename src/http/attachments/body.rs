//! Reading an upload's body: its declared length against the limit, and a multipart form's file
//! and fields staged to disk as they arrive.

use actix_multipart::Multipart;
use actix_web::http::header;
use actix_web::{web, HttpRequest};
use futures_util::StreamExt;

use crate::actors::attachment_store::{BlobPaths, Staged, Staging};
use crate::domain::attachment as rules;
use crate::error::{ApiError, ApiResult, ErrorCode};

pub(super) fn declared_length(req: &HttpRequest) -> Option<u64> {
    req.headers().get(header::CONTENT_LENGTH)?.to_str().ok()?.trim().parse().ok()
}

pub(super) fn header_str<'a>(req: &'a HttpRequest, name: &str) -> Option<&'a str> {
    req.headers().get(name).and_then(|v| v.to_str().ok())
}

pub(super) fn is_multipart(req: &HttpRequest) -> bool {
    header_str(req, "content-type")
        .is_some_and(|t| t.trim().to_ascii_lowercase().starts_with("multipart/form-data"))
}

/// The file part of a multipart upload and what came with it.
pub(super) struct MultipartUpload {
    pub(super) staged: Staged,
    pub(super) content_type: Option<String>,
    pub(super) filename: Option<String>,
    pub(super) attachment_id: Option<String>,
}

/// Reads a multipart body: the part named `file`, else the only part carrying a filename, plus an
/// optional `attachment_id` text field. Other parts are read and dropped (counted against the limit).
pub(super) async fn read_multipart(
    req: &HttpRequest,
    payload: web::Payload,
    paths: &BlobPaths,
    limit: u64,
) -> ApiResult<MultipartUpload> {
    let malformed =
        |e: actix_multipart::MultipartError| ApiError::bad_request(format!("Malformed multipart body: {e}"));
    let mut parts = Multipart::new(req.headers(), payload);
    let mut named: Option<MultipartUpload> = None;
    let mut only: Option<MultipartUpload> = None;
    let mut unnamed_files = 0;
    let mut attachment_id = None;
    let mut discarded: u64 = 0;
    while let Some(field) = parts.next().await {
        let mut field = field.map_err(malformed)?;
        let name = field.name().unwrap_or("").to_string();
        let filename = field.content_disposition().and_then(|cd| cd.get_filename()).map(str::to_string);
        let content_type = field.content_type().map(|m| m.to_string());
        if name == "file" && named.is_none() {
            let staged = stage(paths, &mut field, limit).await?;
            named = Some(MultipartUpload { staged, content_type, filename, attachment_id: None });
            continue;
        }
        if name == "attachment_id" && filename.is_none() {
            attachment_id = Some(read_text(&mut field).await?);
            continue;
        }
        if filename.is_some() && named.is_none() {
            unnamed_files += 1;
            if unnamed_files == 1 {
                let staged = stage(paths, &mut field, limit).await?;
                only = Some(MultipartUpload { staged, content_type, filename, attachment_id: None });
                continue;
            }
            only = None;
        }
        // A field must not be polled once it has ended, so only parts nobody read are drained.
        while let Some(chunk) = field.next().await {
            discarded += chunk.map_err(malformed)?.len() as u64;
            if discarded > limit {
                return Err(too_large(limit));
            }
        }
    }
    let file = named.or(if unnamed_files == 1 { only } else { None });
    let mut upload = file.ok_or_else(|| {
        ApiError::bad_request("Multipart body has no file part (expected a part named 'file')")
            .with_path("file")
    })?;
    upload.attachment_id = attachment_id;
    Ok(upload)
}

/// A short text field (`attachment_id`).
pub(super) async fn read_text(field: &mut actix_multipart::Field) -> ApiResult<String> {
    let mut text = Vec::new();
    while let Some(chunk) = field.next().await {
        let chunk = chunk.map_err(|e| ApiError::bad_request(format!("Malformed multipart body: {e}")))?;
        text.extend_from_slice(&chunk);
        if text.len() > rules::MAX_ID_BYTES * 4 {
            return Err(ApiError::bad_request("Invalid attachment id: it must be 1 to 512 bytes long"));
        }
    }
    String::from_utf8(text).map_err(|_| ApiError::bad_request("'attachment_id' must be UTF-8 text"))
}

/// Streams an upload's `body` into a new staged temp file; more than `limit` bytes is a 413, a
/// body that breaks off a 400.
pub(super) async fn stage<E: std::fmt::Display>(
    paths: &BlobPaths,
    mut body: impl futures_util::Stream<Item = Result<web::Bytes, E>> + Unpin,
    limit: u64,
) -> ApiResult<Staged> {
    let mut staging = Staging::new(paths).await?;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| ApiError::bad_request(format!("Could not read the upload: {e}")))?;
        if staging.size() + chunk.len() as u64 > limit {
            return Err(too_large(limit));
        }
        staging.write(&chunk).await?;
    }
    Ok(staging.finish().await?)
}

pub(super) fn too_large(limit: u64) -> ApiError {
    ApiError::new(ErrorCode::PayloadTooLarge, format!("Attachment exceeds {limit} bytes"))
}

pub(super) fn check_declared_length(req: &HttpRequest, limit: u64, overhead: u64) -> ApiResult<()> {
    match declared_length(req) {
        Some(n) if n > limit.saturating_add(overhead) => Err(too_large(limit)),
        _ => Ok(()),
    }
}
