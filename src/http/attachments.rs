//! Attachments (docs/api.md §10 and 17.7): uploads are staged here and handed to the AttachmentStore
//! actor; downloads, manifests and the ZIP export read the pool and the blob store directly.

use actix_web::body::SizedStream;
use actix_web::http::header::{self, HeaderValue};
use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::Value;

use crate::actors::attachment_store::{self, BlobPaths, Staged, Store};
use crate::db::attachments::{self, AttachmentRow};
use crate::db::records;
use crate::db::replicas::Target;
use crate::db::scope::manifest as scope_manifest;
use crate::domain::attachment::{self as rules, AttachmentId, Quality, RangeAnswer};
use crate::domain::role::Role;
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::http::common::{client_generation, current_generation, report_sync};
use crate::http::context::served_by;
use crate::http::extract::{
    forwarded_header, state, Auth, FromQuery, JsonBody, PathParams, Query, QueryPairs,
};
use crate::http::wire;
use crate::http::wire::attachments::{
    DownloadManifest, DownloadOperation, Manifest, ManifestOperation, ManifestRequest, OperationCount,
    UploadAnswer,
};
use crate::state::AppState;

mod body;
use body::{check_declared_length, header_str, is_multipart, read_multipart, stage};

/// Room for multipart boundaries and part headers when checking Content-Length against the limit.
const MULTIPART_OVERHEAD: u64 = 64 * 1024;
const CACHE_CONTROL: &str = "private, max-age=31536000, immutable";

fn blob_paths(st: &AppState) -> BlobPaths {
    BlobPaths::new(&st.config.attachments_path)
}

async fn store(
    st: &AppState,
    req: &HttpRequest,
    caller: String,
    id: AttachmentId,
    staged: Staged,
    declared_type: Option<&str>,
) -> ApiResult<HttpResponse> {
    let content_type = rules::content_type(declared_type, id.as_str());
    let client_id = header_str(req, "x-ode-client-id").map(str::trim).filter(|s| !s.is_empty());
    let generation = current_generation(&st.pool.get().await?, req, &Value::Null).await?;
    let commit = st
        .actors
        .attachments
        .store(Store {
            staged,
            id: id.into_string(),
            content_type,
            uploaded_by: caller,
            client_id: client_id.map(str::to_string),
        })
        .await?;
    Ok(HttpResponse::Ok().json(UploadAnswer::new(&commit, generation)))
}

/// Upload (raw body)
///
/// Role: read-write or above.
///
/// `PUT /attachments/{id}`: a raw body, or a multipart `file` part.
#[utoipa::path(put, path = "/attachments/{id}", tag = "attachments",
    params(("id" = String, Path, description = "The attachment id (may contain /)"), ("x-repository-generation" = Option<String>, Header, description = "The repository generation the client holds (docs/api.md §17.2)")), request_body(content = Binary, content_type = "application/octet-stream"),
    responses((status = 200, body = UploadAnswer), (status = 400), (status = 409), (status = 413)),
    security(("bearerAuth" = [])))]
pub async fn upload_put(
    req: HttpRequest,
    Auth(caller): Auth,
    PathParams(id): PathParams<AttachmentId>,
    payload: web::Payload,
) -> ApiResult<HttpResponse> {
    caller.require(Role::ReadWrite)?;
    let st = state(&req)?;
    let limit = st.config.max_attachment_bytes;
    let paths = blob_paths(st);
    if is_multipart(&req) {
        check_declared_length(&req, limit, MULTIPART_OVERHEAD)?;
        let upload = read_multipart(&req, payload, &paths, limit).await?;
        store(st, &req, caller.username, id, upload.staged, upload.content_type.as_deref()).await
    } else {
        check_declared_length(&req, limit, 0)?;
        let staged = stage(&paths, payload, limit).await?;
        let declared = header_str(&req, "content-type").map(str::to_string);
        store(st, &req, caller.username, id, staged, declared.as_deref()).await
    }
}

/// Upload (multipart part file)
///
/// Role: read-write or above.
///
/// `POST /attachments`: multipart with the file part and an optional `attachment_id`.
#[utoipa::path(post, path = "/attachments", tag = "attachments", params(("x-repository-generation" = Option<String>, Header, description = "The repository generation the client holds (docs/api.md §17.2)")),
    request_body(content = AttachmentUpload, content_type = "multipart/form-data"),
    responses((status = 200, body = UploadAnswer), (status = 400), (status = 409), (status = 413)),
    security(("bearerAuth" = [])))]
pub async fn upload_post(
    req: HttpRequest,
    Auth(caller): Auth,
    payload: web::Payload,
) -> ApiResult<HttpResponse> {
    caller.require(Role::ReadWrite)?;
    let st = state(&req)?;
    if !is_multipart(&req) {
        return Err(ApiError::bad_request("POST /attachments needs a multipart/form-data body"));
    }
    let limit = st.config.max_attachment_bytes;
    check_declared_length(&req, limit, MULTIPART_OVERHEAD)?;
    let upload = read_multipart(&req, payload, &blob_paths(st), limit).await?;
    let id = match upload.attachment_id.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
        Some(id) => id.to_string(),
        None => upload.filename.as_deref().and_then(rules::id_from_filename).ok_or_else(|| {
            ApiError::bad_request("Give 'attachment_id' or a filename on the file part")
                .with_path("attachment_id")
        })?,
    };
    let id = AttachmentId::parse(id)?;
    store(st, &req, caller.username, id, upload.staged, upload.content_type.as_deref()).await
}

async fn find(st: &AppState, id: &str) -> ApiResult<AttachmentRow> {
    let db = st.pool.get().await?;
    attachments::find(&db, id).await?.ok_or_else(|| ApiError::not_found("Attachment not found"))
}

/// Download (ranges, variants)
///
/// Role: read-only or above.
///
/// `GET`/`HEAD /attachments/{id}`, optionally a resized image variant.
#[utoipa::path(get, path = "/attachments/{id}", tag = "attachments",
    params(("id" = String, Path, description = "The attachment id (may contain /)"), ("quality" = Option<String>, Query, description = "An image variant: thumbnail, medium or original"), ("Range" = Option<String>, Header, description = "A byte range (docs/api.md §10.3)"), ("If-None-Match" = Option<String>, Header, description = "An ETag the client holds")),
    responses((status = 200, body = Binary, content_type = "application/octet-stream"),
        (status = 206, body = Binary, content_type = "application/octet-stream"), (status = 304), (status = 400),
        (status = 404), (status = 416)),
    security(("bearerAuth" = [])))]
pub async fn download(
    req: HttpRequest,
    Auth(caller): Auth,
    PathParams(id): PathParams<AttachmentId>,
    Query(Variant(quality)): Query<Variant>,
) -> ApiResult<HttpResponse> {
    caller.require(Role::ReadOnly)?;
    let st = state(&req)?;
    let row = find(st, id.as_str()).await?;
    // Outside the caller's scope an attachment is absent (docs/api.md §20.4).
    if !crate::db::scope::read::attachment_visible(&st.pool.get().await?, &caller.username, id.as_str())
        .await?
    {
        return Err(ApiError::not_found("Attachment not found"));
    }
    let quality = quality.filter(|_| rules::is_resizable(&row.content_type));
    let variant = match quality {
        Some(q) => variant(st, &row, q).await?,
        None => None,
    };
    let (key, etag, size) = match variant {
        Some((key, q)) => {
            let size = st.storage.attachments.head(&key).await?;
            (
                key,
                rules::etag(&row.sha256, Some(q)),
                size.ok_or_else(|| ApiError::not_found("Attachment not found"))?,
            )
        }
        None => (attachment_store::blob_key(&row.sha256), rules::etag(&row.sha256, None), row.size as u64),
    };
    serve_file(st, &req, &key, size, &etag, &row).await
}

async fn variant(
    st: &AppState,
    row: &AttachmentRow,
    quality: Quality,
) -> ApiResult<Option<(String, Quality)>> {
    let made = st.actors.attachments.variant(row.sha256.clone(), quality).await?;
    Ok(made.map(|key| (key, quality)))
}

/// Streams `key` with conditional and range handling (docs/api.md §10.3); memory stays flat.
async fn serve_file(
    st: &AppState,
    req: &HttpRequest,
    key: &str,
    size: u64,
    etag: &str,
    row: &AttachmentRow,
) -> ApiResult<HttpResponse> {
    if rules::none_match(header_str(req, "if-none-match"), etag) {
        return Ok(HttpResponse::NotModified()
            .insert_header((header::ETAG, etag))
            .insert_header((header::CACHE_CONTROL, CACHE_CONTROL))
            .finish());
    }
    let range = if rules::if_range_allows(header_str(req, "if-range"), etag) {
        rules::parse_range(header_str(req, "range"), size)
    } else {
        RangeAnswer::Full
    };
    let mut res = match range {
        RangeAnswer::Unsatisfiable => {
            return Err(ApiError::of(ErrorCode::RangeNotSatisfiable)
                .with_header(header::CONTENT_RANGE, format!("bytes */{size}")))
        }
        RangeAnswer::Full => HttpResponse::Ok(),
        RangeAnswer::Partial { start, end } => {
            let mut res = HttpResponse::PartialContent();
            res.insert_header((header::CONTENT_RANGE, format!("bytes {start}-{end}/{size}")));
            res
        }
    };
    let (start, len) = match range {
        RangeAnswer::Partial { start, end } => (start, end - start + 1),
        _ => (0, size),
    };
    let range = (start > 0 || len < size).then_some(start..start + len);
    let body = st.storage.attachments.get(key, range).await.map_err(|e| match e {
        crate::storage::StorageError::NotFound(_) => ApiError::not_found("Attachment not found"),
        other => other.into(),
    })?;
    let content_type = HeaderValue::from_str(&row.content_type)
        .unwrap_or_else(|_| HeaderValue::from_static("application/octet-stream"));
    res.insert_header((header::CONTENT_TYPE, content_type))
        .insert_header((header::ETAG, etag))
        .insert_header((header::ACCEPT_RANGES, "bytes"))
        .insert_header((header::CONTENT_DISPOSITION, rules::content_disposition(&row.id)))
        .insert_header((header::CACHE_CONTROL, CACHE_CONTROL));
    Ok(res.body(SizedStream::new(len, body)))
}

/// The resized image a download asks for (`?quality`, unless `?original`).
pub struct Variant(Option<Quality>);

impl FromQuery for Variant {
    fn from_query(query: &QueryPairs) -> ApiResult<Self> {
        Ok(Variant(rules::requested_quality(&query.0)))
    }
}

impl FromQuery for Cursor {
    fn from_query(query: &QueryPairs) -> ApiResult<Self> {
        operations_cursor(&query.0)
    }
}

fn operations_cursor(pairs: &[(String, String)]) -> ApiResult<Cursor> {
    let get = |k: &str| pairs.iter().find(|(key, _)| key == k).map(|(_, v)| v.trim());
    match (get("after_change_id"), get("since")) {
        (Some(_), Some(_)) => {
            Err(ApiError::bad_request("Give either 'after_change_id' or 'since', not both")
                .with_path("?since"))
        }
        (Some(raw), None) => match raw.parse::<i64>() {
            Ok(n) if n >= 0 => Ok(Cursor::After(n)),
            _ => Err(ApiError::bad_request("'after_change_id' must be an integer >= 0")
                .with_path("?after_change_id")),
        },
        (None, Some(raw)) => crate::domain::time::parse_rfc3339(raw).map(Cursor::Since).ok_or_else(|| {
            ApiError::bad_request("'since' must be an RFC 3339 timestamp").with_path("?since")
        }),
        (None, None) => Ok(Cursor::After(0)),
    }
}

#[derive(Clone, Copy)]
pub enum Cursor {
    After(i64),
    Since(chrono::DateTime<chrono::Utc>),
}

/// Attachments changed since a cursor (spec shape)
///
/// Role: read-only or above.
///
/// `GET /attachments/manifest` (the interface specification's shape).
#[utoipa::path(get, path = "/attachments/manifest", tag = "attachments",
    params(("since" = Option<String>, Query, description = "Changes after this point"), ("after_change_id" = Option<String>, Query, description = "Changes after this change_id"), ("x-repository-generation" = Option<String>, Header, description = "The repository generation the client holds (docs/api.md §17.2)")),
    responses((status = 200, body = Manifest), (status = 400), (status = 409)),
    security(("bearerAuth" = [])))]
pub async fn manifest_get(
    req: HttpRequest,
    Auth(caller): Auth,
    Query(cursor): Query<Cursor>,
) -> ApiResult<HttpResponse> {
    caller.require(Role::ReadOnly)?;
    let st = state(&req)?;
    let (generation, head, rows, by) =
        manifest_rows(st, &req, (&caller.username, ""), &Value::Null, cursor).await?;
    let operations = rows.iter().map(ManifestOperation::from).collect();
    let res = HttpResponse::Ok().json(Manifest {
        change_cutoff: head,
        operations,
        repository_generation: generation,
    });
    Ok(served_by(res, by))
}

/// A manifest's generation, head and rows, from a replica that has reached the client's cursor
/// (docs/api.md §18.3); a client holding another repository generation gets 409.
async fn manifest_rows(
    st: &AppState,
    req: &HttpRequest,
    (username, client_id): (&str, &str),
    body: &Value,
    cursor: Cursor,
) -> ApiResult<(i64, i64, Vec<AttachmentRow>, Target)> {
    let client = client_generation(req, body);
    let after = match cursor {
        Cursor::After(n) => Some(n),
        Cursor::Since(_) => None,
    };
    // A replica showing an older generation than the client's is behind, not a reset.
    let position = |(generation, head, _): &(i64, i64, Vec<AttachmentRow>)| {
        if client.is_some_and(|g| g > *generation) {
            -1
        } else {
            *head
        }
    };
    let served = st
        .reads
        .read_for_sync(username, after.or(client.map(|_| 0)), position, |db| {
            Box::pin(async move {
                let generation = records::head_and_generation(&db).await?.repository_generation;
                // A scoped user's manifest lists what they may download (docs/api.md §20.4).
                let scoped_after = match cursor {
                    Cursor::After(n) => n,
                    Cursor::Since(_) => 0,
                };
                let (head, rows) =
                    match scope_manifest::changes_after(&db, (username, client_id), scoped_after).await? {
                        Some((head, mut rows)) => {
                            if let Cursor::Since(t) = cursor {
                                rows.retain(|r| r.deleted || r.created_at > t);
                            }
                            (head, rows)
                        }
                        None => match cursor {
                            Cursor::After(n) => attachments::changes_after(&db, n, true).await?,
                            Cursor::Since(t) => attachments::changes_since(&db, t).await?,
                        },
                    };
                Ok((generation, head, rows))
            })
        })
        .await?;
    let (generation, head, rows) = served.value;
    if client.is_some_and(|g| g != generation) {
        return Err(ApiError::reset_required(generation));
    }
    Ok((generation, head, rows, served.by))
}

/// Attachments changed since a cursor (Synkronus 1.0 shape)
///
/// Role: read-only or above.
///
/// `POST /attachments/manifest` (the Synkronus 1.0 shape Formulus reads).
#[utoipa::path(post, path = "/attachments/manifest", tag = "attachments",
    params(("x-repository-generation" = Option<String>, Header, description = "The repository generation the client holds (docs/api.md §17.2)")), request_body = ManifestRequest, responses((status = 200, body = DownloadManifest), (status = 400), (status = 409)),
    security(("bearerAuth" = [])))]
pub async fn manifest_post(
    req: HttpRequest,
    Auth(caller): Auth,
    JsonBody(body): JsonBody,
) -> ApiResult<HttpResponse> {
    caller.require(Role::ReadOnly)?;
    let st = state(&req)?;
    let request: ManifestRequest = wire::object(&body)?;
    let client_id =
        wire::required_of(&[(&request.client_id, "client_id"), (&request.client_id_camel, "clientId")])?;
    let since = match request.since_version.as_ref().or(request.since_version_camel.as_ref()) {
        None | Some(Value::Null) => 0,
        Some(v) => v.as_i64().filter(|n| *n >= 0).ok_or_else(|| {
            ApiError::bad_request("'since_version' must be an integer >= 0").with_path("/since_version")
        })?,
    };
    let (generation, head, rows, by) =
        manifest_rows(st, &req, (&caller.username, client_id), &body, Cursor::After(since)).await?;
    // The attachment cursor is not the data cursor: this is a plain sighting.
    report_sync(&req, st, &caller.username, client_id, None);
    let base = format!("{}{}/attachments/", public_base(&req, st), route_prefix(&req));
    let total: i64 = rows.iter().map(|r| r.size).sum();
    let deletions = rows.iter().filter(|r| r.deleted).count();
    let operations = rows
        .iter()
        .map(|r| match r.deleted {
            true => DownloadOperation {
                attachment_id: r.id.clone(),
                content_type: None,
                download_url: None,
                operation: "delete",
                size: None,
                version: r.change_id,
            },
            false => DownloadOperation {
                attachment_id: r.id.clone(),
                content_type: Some(r.content_type.clone()),
                download_url: Some(format!("{base}{}", rules::encode_segment(&r.id))),
                operation: "download",
                size: Some(r.size),
                version: r.change_id,
            },
        })
        .collect();
    let res = HttpResponse::Ok().json(DownloadManifest {
        current_version: head,
        operation_count: OperationCount { delete: deletions, download: rows.len() - deletions },
        operations,
        repository_generation: generation,
        total_download_size: total,
    });
    Ok(served_by(res, by))
}

/// The externally visible base URL (docs/api.md §10.6): PUBLIC_URL, else the forwarding headers of a
/// trusted proxy, else the request's own scheme and Host.
fn public_base(req: &HttpRequest, st: &AppState) -> String {
    if let Some(url) = &st.config.public_url {
        return url.trim_end_matches('/').to_string();
    }
    let printable = |v: &&str| v.bytes().all(|b| b.is_ascii_graphic());
    let forwarded = |name: &str| forwarded_header(req, &st.config.trusted_proxies, name).filter(printable);
    let proto = match forwarded("x-forwarded-proto").map(str::to_ascii_lowercase) {
        Some(p) if p == "https" || p == "http" => p,
        // Not `connection_info()`: it believes any peer's `X-Forwarded-*`.
        _ => if req.app_config().secure() { "https" } else { "http" }.to_string(),
    };
    let own_host = header_str(req, "host").map(str::trim).filter(|v| !v.is_empty()).filter(printable);
    let host = forwarded("x-forwarded-host")
        .or(own_host)
        .map(str::to_string)
        .unwrap_or_else(|| req.app_config().host().to_string());
    let prefix = forwarded("x-forwarded-prefix").map(|p| p.trim_matches('/')).filter(|p| !p.is_empty());
    match prefix {
        Some(p) => format!("{proto}://{host}/{p}"),
        None => format!("{proto}://{host}"),
    }
}

/// The route prefix this request came in under: none, `/api` or `/api/v1`.
fn route_prefix(req: &HttpRequest) -> &'static str {
    let path = req.path();
    if path.starts_with("/api/v1/") {
        "/api/v1"
    } else if path.starts_with("/api/") {
        "/api"
    } else {
        ""
    }
}

/// All attachments as a ZIP
///
/// Role: read-only or above.
///
/// `GET /attachments/export-zip` (17.7): every attachment, entry name = id, streamed.
#[utoipa::path(get, path = "/attachments/export-zip", tag = "attachments",
    responses((status = 200, body = Binary, content_type = "application/zip"), (status = 400)),
    security(("bearerAuth" = [])))]
pub async fn export_zip(req: HttpRequest, Auth(caller): Auth) -> ApiResult<HttpResponse> {
    caller.require(Role::ReadOnly)?;
    let st = state(&req)?;
    let db = st.pool.get().await?;
    // A scoped user's ZIP holds what they may download (docs/api.md §20.4).
    let rows = match scope_manifest::changes_after(&db, (&caller.username, ""), 0).await? {
        Some((_, rows)) => rows.into_iter().filter(|r| !r.deleted).collect(),
        None => attachments::changes_after(&db, 0, false).await?.1,
    };
    drop(db);
    let stream = attachment_store::zip_stream(st.storage.attachments.clone(), rows);
    Ok(HttpResponse::Ok()
        .content_type("application/zip")
        .insert_header((header::CONTENT_DISPOSITION, "attachment; filename=\"attachments.zip\""))
        .streaming(stream))
}

pub fn routes(cfg: &mut web::ServiceConfig) {
    use crate::http::routing::{get, resource};
    // Literal routes first: they win over the id pattern, which spans `/` (17.7).
    cfg.service(
        resource("/attachments/manifest", "GET, HEAD, POST")
            .route(web::post().to(manifest_post))
            .route(get().to(manifest_get)),
    )
    .service(resource("/attachments/export-zip", "GET, HEAD").route(get().to(export_zip)))
    .service(resource("/attachments", "POST").route(web::post().to(upload_post)))
    .service(
        resource("/attachments/{id:.+}", "GET, HEAD, PUT")
            .route(get().to(download))
            .route(web::put().to(upload_put)),
    );
}
