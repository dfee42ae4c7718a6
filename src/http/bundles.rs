//! App bundles (docs/api.md §9 and 17.6): uploads and switches go to the `BundleStore` actor; reads
//! resolve one version through it, then serve only from that version's immutable folder.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use actix_multipart::{Field, Multipart};
use actix_web::body::SizedStream;
use actix_web::http::header::{self, HeaderValue};
use actix_web::{web, HttpRequest, HttpResponse, HttpResponseBuilder};
use chrono::Utc;
use futures_util::StreamExt;
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio_util::io::ReaderStream;

use crate::actors::bundle_store::{staging_dir, Push, Target, VersionInfo};
use crate::auth::AuthUser;
use crate::db;
use crate::domain::api_version::ApiVersion;
use crate::domain::bundle::{diff_versions, strip_active_marker, BundleFilePath, Limits, VersionView};
use crate::domain::role::Role;
use crate::domain::time;
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::http::common::if_none_match;
use crate::http::extract::{
    api_version, audit_origin, state, Auth, FromQuery, JsonBody, PathParams, Query, QueryPairs,
};
use crate::http::wire;
use crate::http::wire::bundles::{
    BundleVersion, BundleVersionEntry, BundleVersions, BundleWarning, PushAnswer, SwitchAnswer, SwitchRequest,
};
use crate::state::AppState;

/// Multipart framing around the ZIP: a Content-Length up to this much over the ZIP limit may
/// still carry an acceptable ZIP; the part itself is checked exactly while streaming.
const MULTIPART_OVERHEAD: u64 = 64 * 1024;
const IMMUTABLE: &str = "public, max-age=31536000, immutable";

fn quoted(hex: &str) -> String {
    format!("\"{hex}\"")
}

fn query(req: &HttpRequest) -> ApiResult<HashMap<String, String>> {
    web::Query::<HashMap<String, String>>::from_query(req.query_string())
        .map(web::Query::into_inner)
        .map_err(|_| ApiError::bad_request("Malformed query string"))
}

fn is_true(value: Option<&str>) -> bool {
    value.is_some_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// A version id from input, without the 1.0 list's active marker (docs/api.md §9.3).
fn version_param(raw: &str) -> String {
    strip_active_marker(raw).to_owned()
}

async fn resolve(st: &AppState, target: Target) -> ApiResult<Arc<VersionInfo>> {
    st.actors.bundles.resolve(target).await
}

/// For routes that read the version's files: they are on this node's disk once this returns.
async fn resolve_files(st: &AppState, target: Target) -> ApiResult<Arc<VersionInfo>> {
    st.actors.bundles.resolve_files(target).await
}

// ---- uploads ----

/// The upload file until it is handed to the actor; removed if the request ends first.
struct TempUpload(Option<PathBuf>);

impl TempUpload {
    fn into_path(mut self) -> Option<PathBuf> {
        self.0.take()
    }
}

impl Drop for TempUpload {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

fn too_large(limit: u64) -> ApiError {
    ApiError::new(ErrorCode::PayloadTooLarge, format!("App bundle exceeds {limit} bytes"))
}

fn bad_multipart() -> ApiError {
    ApiError::bad_request(
        "Expected a multipart/form-data body with the bundle ZIP in the field 'bundle' or 'file'",
    )
}

/// Streams the file part to a new file in `dir`, never holding it in memory.
async fn write_part(field: &mut Field, dir: &Path, limit: u64) -> ApiResult<TempUpload> {
    let path = dir.join(format!("{}.upload", uuid::Uuid::new_v4().simple()));
    let mut file = tokio::fs::OpenOptions::new().write(true).create_new(true).open(&path).await?;
    let guard = TempUpload(Some(path));
    let mut written: u64 = 0;
    while let Some(chunk) = field.next().await {
        let chunk = chunk.map_err(|_| bad_multipart())?;
        written += chunk.len() as u64;
        if written > limit {
            return Err(too_large(limit));
        }
        file.write_all(&chunk).await?;
    }
    file.sync_all().await?;
    Ok(guard)
}

/// A short text field; longer values are read to the end but never count as `true`.
async fn read_text(field: &mut Field) -> ApiResult<String> {
    let mut text = Vec::new();
    while let Some(chunk) = field.next().await {
        let chunk = chunk.map_err(|_| bad_multipart())?;
        if text.len() + chunk.len() <= 64 {
            text.extend_from_slice(&chunk);
        } else {
            text.clear();
            text.extend_from_slice(b"<too long>");
        }
    }
    Ok(String::from_utf8_lossy(&text).trim().to_owned())
}

async fn upload(
    req: HttpRequest,
    caller: Auth,
    payload: web::Payload,
    force_activate: bool,
) -> ApiResult<HttpResponse> {
    let Auth(caller) = caller;
    caller.require(Role::Admin)?;
    let st = state(&req)?;
    let limit = Limits::default().max_zip_bytes;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit + MULTIPART_OVERHEAD) {
        return Err(too_large(limit));
    }
    let mut activate = force_activate || is_true(query(&req)?.get("activate").map(String::as_str));
    let received_at = Utc::now();
    let dir = staging_dir(&st.config.app_bundle_path);

    let mut multipart = Multipart::new(req.headers(), payload);
    let mut upload: Option<TempUpload> = None;
    while let Some(field) = multipart.next().await {
        let mut field = field.map_err(|_| bad_multipart())?;
        let name = field.name().unwrap_or("").to_owned();
        match name.as_str() {
            "bundle" | "file" if upload.is_none() => {
                upload = Some(write_part(&mut field, &dir, limit).await?)
            }
            "activate" => activate |= is_true(Some(read_text(&mut field).await?.as_str())),
            _ => {
                while let Some(chunk) = field.next().await {
                    chunk.map_err(|_| bad_multipart())?;
                }
            }
        }
    }
    let upload = upload.and_then(TempUpload::into_path).ok_or_else(bad_multipart)?;
    let origin = audit_origin(&req, st, &caller.username);
    let outcome = st.actors.bundles.push(Push { upload, activate, received_at, origin }).await?;
    let manifest = serde_json::to_value(&outcome.version.manifest).map_err(ApiError::internal)?;
    Ok(HttpResponse::Ok().json(PushAnswer {
        active: outcome.active,
        manifest,
        message: "App bundle successfully pushed",
        version: outcome.version.version.clone(),
        warnings: outcome.warnings.into_iter().map(BundleWarning::from).collect(),
    }))
}

/// Upload a bundle ZIP (multipart part bundle or file)
///
/// Role: admin.
#[utoipa::path(post, path = "/app-bundle/push", tag = "app-bundle",
    params(("activate" = Option<bool>, Query, description = "Make the upload the active version")),
    request_body(content = BundleUpload, content_type = "multipart/form-data"),
    responses((status = 200, body = PushAnswer), (status = 400), (status = 413)),
    security(("bearerAuth" = [])))]
pub async fn push(req: HttpRequest, caller: Auth, payload: web::Payload) -> ApiResult<HttpResponse> {
    upload(req, caller, payload, false).await
}

/// Upload a bundle ZIP (raw body, any content type)
///
/// Role: admin.
#[utoipa::path(put, path = "/app-bundle", tag = "app-bundle",
    params(("activate" = Option<bool>, Query, description = "Make the upload the active version")),
    request_body(content = Binary, content_type = "application/octet-stream"),
    responses((status = 200, body = PushAnswer), (status = 400), (status = 413)),
    security(("bearerAuth" = [])))]
pub async fn put(req: HttpRequest, caller: Auth, payload: web::Payload) -> ApiResult<HttpResponse> {
    upload(req, caller, payload, true).await
}

// ---- switching ----

async fn switch_to(req: &HttpRequest, caller: &AuthUser, raw: Option<&str>) -> ApiResult<HttpResponse> {
    let st = state(req)?;
    let version = version_param(raw.unwrap_or("").trim());
    if version.is_empty() {
        return Err(ApiError::bad_request("Version is required").with_path("/version"));
    }
    let outcome = st.actors.bundles.activate(version, audit_origin(req, st, &caller.username)).await?;
    Ok(HttpResponse::Ok().json(SwitchAnswer {
        message: format!("Switched to app bundle version {}", outcome.version),
        previous_version: outcome.previous_version,
        version: outcome.version,
        warnings: outcome.warnings.into_iter().map(BundleWarning::from).collect(),
    }))
}

/// Activate a version
///
/// Role: admin.
#[utoipa::path(post, path = "/app-bundle/switch/{version}", tag = "app-bundle",
    params(("version" = String, Path, description = "The version to activate")), responses((status = 200, body = SwitchAnswer), (status = 400), (status = 404)),
    security(("bearerAuth" = [])))]
pub async fn switch_path(
    req: HttpRequest,
    Auth(caller): Auth,
    PathParams(version): PathParams<String>,
) -> ApiResult<HttpResponse> {
    caller.require(Role::Admin)?;
    switch_to(&req, &caller, Some(&version)).await
}

/// Activate a version (body)
///
/// Role: admin.
#[utoipa::path(post, path = "/app-bundle/switch", tag = "app-bundle",
    request_body = Option<SwitchRequest>, responses((status = 200, body = SwitchAnswer), (status = 400), (status = 404)),
    security(("bearerAuth" = [])))]
pub async fn switch_body(
    req: HttpRequest,
    Auth(caller): Auth,
    JsonBody(body): JsonBody,
) -> ApiResult<HttpResponse> {
    caller.require(Role::Admin)?;
    let body: Option<SwitchRequest> = match &body {
        Value::Null => None,
        other => Some(wire::object(other)?),
    };
    let version = body.as_ref().map(|b| b.version.optional("version")).transpose()?.flatten();
    switch_to(&req, &caller, version).await
}

// ---- reads ----

/// Stored versions
///
/// Role: read-only or above.
#[utoipa::path(get, path = "/app-bundle/versions", tag = "app-bundle",
    params(("x-api-version" = Option<String>, Header, description = "The API version the client speaks")), responses((status = 200, body = BundleVersions)),
    security(("bearerAuth" = [])))]
pub async fn versions(req: HttpRequest, Auth(caller): Auth) -> ApiResult<HttpResponse> {
    caller.require(Role::ReadOnly)?;
    let st = state(&req)?;
    let db = st.pool.get().await?;
    let versions = db::bundles::list(&db).await?;
    let marked = api_version(&req) == ApiVersion::V1_0;
    let versions = versions
        .into_iter()
        .map(|v| match marked {
            true => BundleVersionEntry::Marked(if v.active { format!("{} *", v.version) } else { v.version }),
            false => BundleVersionEntry::Listed(BundleVersion {
                active: v.active,
                created_at: time::format(v.created_at),
                name: v.name,
                version: v.version,
            }),
        })
        .collect();
    Ok(HttpResponse::Ok().json(BundleVersions { versions }))
}

fn not_modified(tag: &str, version: &str) -> HttpResponse {
    HttpResponse::NotModified()
        .insert_header((header::ETAG, tag.to_owned()))
        .insert_header(("x-bundle-version", version.to_owned()))
        .finish()
}

/// Manifest of a version
///
/// Role: read-only or above.
#[utoipa::path(get, path = "/app-bundle/manifest", tag = "app-bundle",
    params(("version" = Option<String>, Query, description = "A bundle version"), ("If-None-Match" = Option<String>, Header, description = "An ETag the client holds")),
    responses((status = 200, body = Object), (status = 304), (status = 400), (status = 404)),
    security(("bearerAuth" = [])))]
pub async fn manifest(req: HttpRequest, Auth(caller): Auth) -> ApiResult<HttpResponse> {
    caller.require(Role::ReadOnly)?;
    let st = state(&req)?;
    let info = resolve(st, Target::Active).await?;
    // Presence (docs/api.md §17.4): the bundle version this device was told about.
    st.actors.presence.seen(crate::actors::presence::Seen {
        username: caller.username.clone(),
        client_id: crate::http::extract::header_client_id(&req).unwrap_or_default(),
        client_version: crate::http::extract::client_version_hint(&req),
        data_version: None,
        app_bundle_version: Some(info.version.clone()),
    });
    let tag = quoted(&info.manifest.hash);
    if if_none_match(&req, &info.manifest.hash) {
        return Ok(not_modified(&tag, &info.version));
    }
    Ok(HttpResponse::Ok()
        .content_type("application/json")
        .insert_header((header::ETAG, tag))
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .insert_header(("x-bundle-version", info.version.clone()))
        .body(info.manifest_body.clone()))
}

async fn open_sized(path: &Path, size: u64) -> ApiResult<SizedStream<ReaderStream<tokio::fs::File>>> {
    let file = tokio::fs::File::open(path).await.map_err(|error| match error.kind() {
        // Retention removed the version after it was resolved.
        std::io::ErrorKind::NotFound => ApiError::not_found("File not found in the app bundle"),
        _ => ApiError::internal(error),
    })?;
    Ok(SizedStream::new(size, ReaderStream::with_capacity(file, 64 * 1024)))
}

/// The version a download serves: `?version` wins, then `?preview`, then the active one.
pub struct DownloadTarget {
    target: Target,
    preview: bool,
    /// A named version: its files never change.
    pinned: bool,
}

impl FromQuery for DownloadTarget {
    fn from_query(query: &QueryPairs) -> ApiResult<Self> {
        // The last of repeated keys counts, as it did when the query was read into a map.
        let last = |key: &str| query.0.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
        Ok(match last("version").map(version_param).filter(|v| !v.is_empty()) {
            Some(version) => {
                DownloadTarget { target: Target::Version(version), preview: false, pinned: true }
            }
            None if is_true(last("preview")) => {
                DownloadTarget { target: Target::Newest, preview: true, pinned: false }
            }
            None => DownloadTarget { target: Target::Active, preview: false, pinned: false },
        })
    }
}

fn cache_headers(builder: &mut HttpResponseBuilder, pinned: bool, preview: bool, version: &str) {
    builder
        .insert_header((header::CACHE_CONTROL, if pinned { IMMUTABLE } else { "no-cache" }))
        .insert_header(("x-bundle-version", version.to_owned()));
    if preview {
        builder.insert_header(("x-is-preview", HeaderValue::from_static("true")));
    }
}

/// One file of a version (path may contain /)
///
/// Role: read-only or above.
#[utoipa::path(get, path = "/app-bundle/download/{path}", tag = "app-bundle",
    params(("path" = String, Path, description = "A file path inside the bundle"), ("version" = Option<String>, Query, description = "A bundle version"), ("preview" = Option<bool>, Query, description = "The newest version instead of the active one"), ("If-None-Match" = Option<String>, Header, description = "An ETag the client holds")),
    responses((status = 200, body = Binary, content_type = "application/octet-stream"), (status = 304),
        (status = 400), (status = 404)),
    security(("bearerAuth" = [])))]
pub async fn download(
    req: HttpRequest,
    Auth(caller): Auth,
    PathParams(path): PathParams<BundleFilePath>,
    Query(DownloadTarget { target, preview, pinned }): Query<DownloadTarget>,
) -> ApiResult<HttpResponse> {
    caller.require(Role::ReadOnly)?;
    let st = state(&req)?;
    let path = path.as_str();
    let info = resolve_files(st, target).await?;
    let file = info
        .file(path)
        .ok_or_else(|| ApiError::not_found(format!("File '{path}' not found in the app bundle")))?;
    let matched = if_none_match(&req, &file.hash);
    let mut builder = if matched { HttpResponse::NotModified() } else { HttpResponse::Ok() };
    builder.insert_header((header::ETAG, quoted(&file.hash)));
    cache_headers(&mut builder, pinned, preview, &info.version);
    if matched {
        return Ok(builder.finish());
    }
    let body = open_sized(&info.file_path(path), file.size).await?;
    Ok(builder.insert_header((header::CONTENT_TYPE, file.mime_type.clone())).body(body))
}

/// No file named: 400
///
/// Role: read-only or above.
///
/// `/app-bundle/download` with nothing after it.
#[utoipa::path(get, path = "/app-bundle/download", tag = "app-bundle",
    responses((status = 400), (status = 404)),
    security(("bearerAuth" = [])))]
pub async fn download_empty(Auth(caller): Auth) -> ApiResult<HttpResponse> {
    caller.require(Role::ReadOnly)?;
    Err(ApiError::bad_request("Invalid file path: the path is empty").with_path("path"))
}

/// A version's ZIP
///
/// Role: read-only or above.
#[utoipa::path(get, path = "/app-bundle/download-zip", tag = "app-bundle",
    params(("version" = Option<String>, Query, description = "A bundle version"), ("preview" = Option<bool>, Query, description = "The newest version instead of the active one"), ("If-None-Match" = Option<String>, Header, description = "An ETag the client holds")),
    responses((status = 200, body = Binary, content_type = "application/zip"), (status = 304), (status = 400),
        (status = 404)),
    security(("bearerAuth" = [])))]
pub async fn download_zip(
    req: HttpRequest,
    Auth(caller): Auth,
    Query(DownloadTarget { target, preview, pinned }): Query<DownloadTarget>,
) -> ApiResult<HttpResponse> {
    caller.require(Role::ReadOnly)?;
    let st = state(&req)?;
    let info = resolve_files(st, target).await?;
    let matched = if_none_match(&req, &info.manifest.hash);
    let mut builder = if matched { HttpResponse::NotModified() } else { HttpResponse::Ok() };
    builder.insert_header((header::ETAG, quoted(&info.manifest.hash)));
    cache_headers(&mut builder, pinned, preview, &info.version);
    if matched {
        return Ok(builder.finish());
    }
    let size = tokio::fs::metadata(&info.zip_path)
        .await
        .map_err(|_| ApiError::not_found("The app bundle ZIP is not available"))?
        .len();
    let body = open_sized(&info.zip_path, size).await?;
    Ok(builder
        .insert_header((header::CONTENT_TYPE, "application/zip"))
        .insert_header((header::CONTENT_DISPOSITION, "attachment; filename=\"bundle.zip\""))
        .body(body))
}

/// Files changed between versions
///
/// Role: read-only or above.
#[utoipa::path(get, path = "/app-bundle/changes", tag = "app-bundle",
    params(("current" = Option<String>, Query, description = "The version the client has (default: the active one)"), ("target" = Option<String>, Query, description = "The version to compare with (default: the newest)")),
    responses((status = 200, body = Object), (status = 400), (status = 404)),
    security(("bearerAuth" = [])))]
pub async fn changes(
    req: HttpRequest,
    Auth(caller): Auth,
    Query(Comparison { current, target }): Query<Comparison>,
) -> ApiResult<HttpResponse> {
    caller.require(Role::ReadOnly)?;
    let st = state(&req)?;
    let current = resolve_files(st, current).await?;
    let target = resolve_files(st, target).await?;
    let body = web::block(move || {
        let a = VersionView::load(&current.manifest, &current.dir)?;
        let b = VersionView::load(&target.manifest, &target.dir)?;
        std::io::Result::Ok(diff_versions(&a, &b))
    })
    .await??;
    Ok(HttpResponse::Ok().json(body))
}

/// The two versions `GET /app-bundle/changes` compares: `?current` (default the active one) and
/// `?target` (default the newest).
pub struct Comparison {
    current: Target,
    target: Target,
}

impl FromQuery for Comparison {
    fn from_query(query: &QueryPairs) -> ApiResult<Self> {
        let pick = |name: &str, fallback: Target| match query
            .0
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| version_param(v.trim()))
        {
            Some(version) if !version.is_empty() => Target::Version(version),
            _ => fallback,
        };
        Ok(Comparison { current: pick("current", Target::Active), target: pick("target", Target::Newest) })
    }
}

pub fn routes(cfg: &mut web::ServiceConfig) {
    use crate::http::routing::{get, resource};
    cfg.service(resource("/app-bundle", "PUT").route(web::put().to(put)))
        .service(resource("/app-bundle/push", "POST").route(web::post().to(push)))
        .service(resource("/app-bundle/switch", "POST").route(web::post().to(switch_body)))
        .service(resource("/app-bundle/switch/{version}", "POST").route(web::post().to(switch_path)))
        .service(resource("/app-bundle/versions", "GET, HEAD").route(get().to(versions)))
        .service(resource("/app-bundle/manifest", "GET, HEAD").route(get().to(manifest)))
        .service(resource("/app-bundle/changes", "GET, HEAD").route(get().to(changes)))
        .service(resource("/app-bundle/download-zip", "GET, HEAD").route(get().to(download_zip)))
        .service(resource("/app-bundle/download", "GET, HEAD").route(get().to(download_empty)))
        .service(resource("/app-bundle/download/{path:.*}", "GET, HEAD").route(get().to(download)));
}
