//! Exports and observation statistics (docs/api.md §13, 17.8). The work is done by the `ExportJobs`
//! actor; these handlers parse, authorize, ask it, and shape the response.

use actix_web::http::{header, Method};
use actix_web::{web, HttpRequest, HttpResponse, HttpResponseBuilder};
use serde_json::Value;

use crate::auth::AuthUser;
use crate::db::audit;
use crate::db::export as sql;
use crate::domain::audit::{export_details, job_download_details, Action};
use crate::domain::export::{ExportFilter, ExportFormat, ExportRequest};
use crate::domain::role::Role;
use crate::domain::time;
use crate::error::{ApiError, ApiResult};
use crate::http::extract::{audit_origin, state, Auth, FromQuery, JsonBody, PathParams, Query, QueryPairs};
use crate::http::wire::export::{Bucket, ExportJob, FormTypeCount, JobRequest, ObservationStats, Timeline};

/// Export parameters as sent, from the query string and (for jobs) a JSON body.
/// An export's query, as given (the body of a job may fill what it leaves out).
#[derive(Default)]
pub struct RawParams {
    format: Option<String>,
    form_types: Vec<String>,
    since_change_id: Option<String>,
    include_deleted: Option<String>,
}

impl FromQuery for RawParams {
    fn from_query(query: &QueryPairs) -> ApiResult<Self> {
        let mut raw = RawParams::default();
        for (key, value) in query.0.iter().cloned() {
            match key.as_str() {
                "format" => raw.format = Some(value),
                "form_type" | "formType" | "schema_type" => raw.form_types.push(value),
                "since_change_id" | "sinceChangeId" => raw.since_change_id = Some(value),
                "include_deleted" | "includeDeleted" => raw.include_deleted = Some(value),
                _ => {}
            }
        }
        Ok(raw)
    }
}

impl RawParams {
    /// Fills what the query left out from a JSON object body (the query wins).
    fn merge_body(&mut self, body: &Value) -> ApiResult<()> {
        let body: JobRequest = match body {
            Value::Null => return Ok(()),
            other => crate::http::wire::object(other)?,
        };
        let text = |key: &str, v: &Value| -> ApiResult<String> {
            match v {
                Value::String(s) => Ok(s.clone()),
                Value::Number(n) => Ok(n.to_string()),
                Value::Bool(b) => Ok(b.to_string()),
                _ => Err(ApiError::bad_request(format!("'{key}' has the wrong type"))
                    .with_path(&format!("/{key}"))),
            }
        };
        if let Some(v) = body.format.as_ref().filter(|v| !v.is_null()) {
            self.format.get_or_insert(text("format", v)?);
        }
        if self.form_types.is_empty() {
            match body.form_type.as_ref().or(body.form_types.as_ref()) {
                None | Some(Value::Null) => {}
                Some(Value::Array(items)) => {
                    for item in items {
                        match item {
                            Value::String(s) => self.form_types.push(s.clone()),
                            _ => {
                                return Err(ApiError::bad_request("'form_type' must be strings")
                                    .with_path("/form_type"))
                            }
                        }
                    }
                }
                Some(Value::String(s)) => self.form_types.push(s.clone()),
                Some(_) => {
                    return Err(ApiError::bad_request("'form_type' must be a string or an array of strings")
                        .with_path("/form_type"))
                }
            }
        }
        if let Some(v) = body.since_change_id.as_ref().filter(|v| !v.is_null()) {
            if self.since_change_id.is_none() {
                self.since_change_id = Some(text("since_change_id", v)?);
            }
        }
        if let Some(v) = body.include_deleted.as_ref().filter(|v| !v.is_null()) {
            if self.include_deleted.is_none() {
                self.include_deleted = Some(text("include_deleted", v)?);
            }
        }
        Ok(())
    }

    fn format(&self) -> ApiResult<ExportFormat> {
        match &self.format {
            None => Ok(ExportFormat::Parquet),
            Some(raw) => ExportFormat::parse(raw).filter(|f| *f != ExportFormat::RawJson).ok_or_else(|| {
                ApiError::bad_request(format!("Unknown format '{raw}'; use parquet, json or csv"))
                    .with_path("?format")
            }),
        }
    }

    fn filter(&self) -> ApiResult<ExportFilter> {
        // `a,b` and repeated parameters mean the same; empty pieces select nothing extra.
        let mut form_types: Vec<String> = self
            .form_types
            .iter()
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        form_types.sort();
        form_types.dedup();
        // Checked here because the database would refuse it only after the response has started.
        if form_types.iter().any(|t| t.contains('\0')) {
            return Err(
                ApiError::bad_request("'form_type' must not contain NUL characters").with_path("?form_type")
            );
        }
        let since_change_id = match &self.since_change_id {
            None => 0,
            Some(raw) => raw.trim().parse::<i64>().ok().filter(|n| *n >= 0).ok_or_else(|| {
                ApiError::bad_request("'since_change_id' must be an integer >= 0")
                    .with_path("?since_change_id")
            })?,
        };
        let include_deleted = match self.include_deleted.as_deref().map(str::trim) {
            None => true,
            Some(v) if v.eq_ignore_ascii_case("true") => true,
            Some(v) if v.eq_ignore_ascii_case("false") => false,
            Some(_) => {
                return Err(ApiError::bad_request("'include_deleted' must be true or false")
                    .with_path("?include_deleted"))
            }
        };
        Ok(ExportFilter { form_types, since_change_id, include_deleted, viewer: None })
    }
}

/// Limits a non-admin's export to the records they may see (docs/api.md §20.4; with no scope set
/// that is every record).
fn viewed_by(filter: ExportFilter, caller: &AuthUser) -> ExportFilter {
    let viewer = (!caller.role.allows(Role::Admin)).then(|| caller.username.clone());
    ExportFilter { viewer, ..filter }
}

fn export_headers(builder: &mut HttpResponseBuilder, format: ExportFormat, head: i64) {
    builder
        .insert_header((header::CONTENT_TYPE, format.content_type()))
        .insert_header((
            header::CONTENT_DISPOSITION,
            format!("attachment; filename=\"{}\"", format.filename()),
        ))
        .insert_header(("x-export-change-id", head.to_string()))
        .insert_header((header::CACHE_CONTROL, "no-store"));
}

/// Runs a streamed export: headers (with the snapshot head) first, then the body as produced.
async fn stream(req: &HttpRequest, caller: &AuthUser, request: ExportRequest) -> ApiResult<HttpResponse> {
    let st = state(req)?;
    if req.method() == Method::HEAD {
        // Same headers, no body: no need to hold an export slot for it.
        let head = sql::current_head(&st.pool.get().await?).await?;
        let mut builder = HttpResponse::Ok();
        export_headers(&mut builder, request.format, head);
        builder.insert_header((crate::http::context::X_SERVED_BY.clone(), "primary"));
        return Ok(builder.finish());
    }
    let format = request.format;
    // Recorded once admitted (a 429 exports nothing), on its own: an export changes nothing else.
    let entry = audit_origin(req, st, &caller.username).entry(
        Action::ExportDownloaded,
        None,
        export_details(&request, true),
    );
    let pending = st.actors.export_jobs.start(request).await?;
    audit::append(&st.pool.get().await?, &entry).await?;
    let (head, by) =
        pending.head.await.map_err(|_| ApiError::internal("export ended before its snapshot"))??;
    let mut builder = HttpResponse::Ok();
    export_headers(&mut builder, format, head);
    builder.insert_header((crate::http::context::X_SERVED_BY.clone(), by.as_str()));
    Ok(builder.streaming(pending.body))
}

/// ZIP of Parquet files, streamed
///
/// Role: read-only or above.
#[utoipa::path(get, path = "/dataexport/parquet", tag = "export", params(("form_type" = Option<String>, Query, description = "Form types, comma-separated or repeated"), ("since_change_id" = Option<String>, Query, description = "Only records changed after this change_id"),
        ("include_deleted" = Option<bool>, Query, description = "Include deleted records"), ("format" = Option<String>, Query, description = "parquet, json or csv")),
    responses((status = 200, body = Binary, content_type = "application/zip"), (status = 400)),
    security(("bearerAuth" = [])))]
pub async fn parquet(
    req: HttpRequest,
    Auth(caller): Auth,
    Query(raw): Query<RawParams>,
) -> ApiResult<HttpResponse> {
    caller.require(Role::ReadOnly)?;
    let filter = raw.filter()?;
    let request = ExportRequest {
        format: ExportFormat::Parquet,
        filter: viewed_by(filter, &caller),
        requested_by: caller.username.clone(),
    };
    stream(&req, &caller, request).await
}

/// Parquet, CSV or NDJSON export, streamed
///
/// Role: read-only or above.
#[utoipa::path(get, path = "/data/export", tag = "export", params(("form_type" = Option<String>, Query, description = "Form types, comma-separated or repeated"), ("since_change_id" = Option<String>, Query, description = "Only records changed after this change_id"),
        ("include_deleted" = Option<bool>, Query, description = "Include deleted records"), ("format" = Option<String>, Query, description = "parquet, json or csv")),
    responses((status = 200, body = Binary, content_type = "application/octet-stream"), (status = 400)),
    security(("bearerAuth" = [])))]
pub async fn data_export(
    req: HttpRequest,
    Auth(caller): Auth,
    Query(raw): Query<RawParams>,
) -> ApiResult<HttpResponse> {
    caller.require(Role::ReadOnly)?;
    let request = ExportRequest {
        format: raw.format()?,
        filter: viewed_by(raw.filter()?, &caller),
        requested_by: caller.username.clone(),
    };
    stream(&req, &caller, request).await
}

/// ZIP of raw JSON records, streamed
///
/// Role: read-only or above.
///
/// One JSON file per non-deleted observation (docs/api.md §17.8); `include_deleted` does not apply.
#[utoipa::path(get, path = "/dataexport/raw-json", tag = "export", params(("form_type" = Option<String>, Query, description = "Form types, comma-separated or repeated"), ("since_change_id" = Option<String>, Query, description = "Only records changed after this change_id"),
        ("include_deleted" = Option<bool>, Query, description = "Include deleted records"), ("format" = Option<String>, Query, description = "parquet, json or csv")),
    responses((status = 200, body = Binary, content_type = "application/zip"), (status = 400)),
    security(("bearerAuth" = [])))]
pub async fn raw_json(
    req: HttpRequest,
    Auth(caller): Auth,
    Query(raw): Query<RawParams>,
) -> ApiResult<HttpResponse> {
    caller.require(Role::ReadOnly)?;
    let mut filter = raw.filter()?;
    filter.include_deleted = false;
    let request = ExportRequest {
        format: ExportFormat::RawJson,
        filter: viewed_by(filter, &caller),
        requested_by: caller.username.clone(),
    };
    stream(&req, &caller, request).await
}

/// Start a background export
///
/// Role: read-only or above.
#[utoipa::path(post, path = "/dataexport/jobs", tag = "export", params(("form_type" = Option<String>, Query, description = "Form types, comma-separated or repeated"), ("since_change_id" = Option<String>, Query, description = "Only records changed after this change_id"),
        ("include_deleted" = Option<bool>, Query, description = "Include deleted records"), ("format" = Option<String>, Query, description = "parquet, json or csv")),
    request_body = Option<JobRequest>, responses((status = 202, body = ExportJob), (status = 400)),
    security(("bearerAuth" = [])))]
pub async fn create_job(
    req: HttpRequest,
    Auth(caller): Auth,
    Query(mut raw): Query<RawParams>,
    JsonBody(body): JsonBody,
) -> ApiResult<HttpResponse> {
    caller.require(Role::ReadOnly)?;
    let st = state(&req)?;
    raw.merge_body(&body)?;
    let request = ExportRequest {
        format: raw.format()?,
        filter: viewed_by(raw.filter()?, &caller),
        requested_by: caller.username.clone(),
    };
    let details = export_details(&request, false);
    let job = st.actors.export_jobs.create_job(caller.username.clone(), request).await?;
    let entry = audit_origin(&req, st, &caller.username).entry(Action::ExportStarted, Some(&job.id), details);
    audit::append(&st.pool.get().await?, &entry).await?;
    Ok(HttpResponse::Accepted()
        .insert_header((header::LOCATION, format!("/dataexport/jobs/{}", job.id)))
        .json(ExportJob::from(&job)))
}

/// An export job's state
///
/// Role: read-only or above.
#[utoipa::path(get, path = "/dataexport/jobs/{id}", tag = "export", params(("id" = String, Path, description = "The job id")),
    responses((status = 200, body = ExportJob), (status = 404)),
    security(("bearerAuth" = [])))]
pub async fn get_job(
    req: HttpRequest,
    Auth(caller): Auth,
    PathParams(id): PathParams<String>,
) -> ApiResult<HttpResponse> {
    caller.require(Role::ReadOnly)?;
    let st = state(&req)?;
    let job = st.actors.export_jobs.job(id, caller).await?;
    Ok(HttpResponse::Ok().json(ExportJob::from(&job)))
}

/// A finished job's file
///
/// Role: read-only or above.
#[utoipa::path(get, path = "/dataexport/jobs/{id}/download", tag = "export",
    params(("id" = String, Path, description = "The job id")),
    responses((status = 200, body = Binary, content_type = "application/octet-stream"), (status = 404), (status = 409)),
    security(("bearerAuth" = [])))]
pub async fn download_job(
    req: HttpRequest,
    Auth(caller): Auth,
    PathParams(id): PathParams<String>,
) -> ApiResult<HttpResponse> {
    caller.require(Role::ReadOnly)?;
    let st = state(&req)?;
    let file = st.actors.export_jobs.download(id.clone(), caller.clone()).await?;
    // The sweep may remove the file between the answer and the open: that is a 404 too.
    let expired = || ApiError::not_found("The export job's file has expired");
    let key = crate::export::job_key(&file.path);
    let len = st.storage.exports.head(&key).await?.ok_or_else(expired)?;
    let body = st.storage.exports.get(&key, None).await.map_err(|e| match e {
        crate::storage::StorageError::NotFound(_) => expired(),
        other => other.into(),
    })?;
    if req.method() != Method::HEAD {
        let details = job_download_details(file.format);
        let entry =
            audit_origin(&req, st, &caller.username).entry(Action::ExportDownloaded, Some(&id), details);
        audit::append(&st.pool.get().await?, &entry).await?;
    }
    let mut builder = HttpResponse::Ok();
    export_headers(&mut builder, file.format, file.change_id);
    builder.no_chunking(len);
    Ok(builder.streaming(body))
}

/// Record counts by form type
///
/// Role: read-only or above (admin while a scope set is in force).
#[utoipa::path(get, path = "/stats/observations", tag = "export",
    responses((status = 200, body = ObservationStats), (status = 400)),
    security(("bearerAuth" = [])))]
pub async fn observation_stats(req: HttpRequest, Auth(caller): Auth) -> ApiResult<HttpResponse> {
    caller.require(Role::ReadOnly)?;
    let st = state(&req)?;
    if !caller.role.allows(Role::Admin) && crate::db::scope::read::is_scoped(&st.pool.get().await?).await? {
        return Err(ApiError::new(
            crate::error::ErrorCode::Forbidden,
            "Statistics over the whole repository are for admins while a scope set is in force",
        ));
    }
    let served = st
        .reads
        .read(
            &caller.username,
            None,
            |stats: &crate::db::stats::ObservationStats| stats.head,
            |db| Box::pin(async move { crate::db::stats::observation_stats(&db).await }),
        )
        .await?;
    let stats = served.value;
    let week = stats.bucket_unit == "week";
    let step = if week { chrono::Duration::days(7) } else { chrono::Duration::days(1) };
    let range_start = stats.buckets.first().map(|b| time::format(b.0));
    // The end of the last bucket (exclusive), so the range covers every bucket whole.
    let range_end = stats.buckets.last().map(|b| time::format(b.0 + step));
    let label = |ft: &str| if ft.is_empty() { "(no form type)".to_owned() } else { ft.to_owned() };
    let res = HttpResponse::Ok().json(ObservationStats {
        by_form_type: stats
            .by_form_type
            .iter()
            .map(|(ft, n)| FormTypeCount { count: *n, form_type: label(ft) })
            .collect(),
        computed_at: stats.computed_at.map(time::format),
        timeline: Timeline {
            bucket_unit: if week { "week" } else { "day" },
            buckets: stats
                .buckets
                .iter()
                .map(|(start, label, n)| Bucket {
                    bucket_start: time::format(*start),
                    count: *n,
                    label: label.clone(),
                })
                .collect(),
            range_end,
            range_start,
        },
        total_count: stats.total,
    });
    Ok(crate::http::context::served_by(res, served.by))
}

pub fn routes(cfg: &mut web::ServiceConfig) {
    use crate::http::routing::{get, resource};
    cfg.service(resource("/dataexport/parquet", "GET, HEAD").route(get().to(parquet)))
        .service(resource("/dataexport/raw-json", "GET, HEAD").route(get().to(raw_json)))
        .service(resource("/data/export", "GET, HEAD").route(get().to(data_export)))
        .service(resource("/dataexport/jobs", "POST").route(web::post().to(create_job)))
        .service(resource("/dataexport/jobs/{id}", "GET, HEAD").route(get().to(get_job)))
        .service(resource("/dataexport/jobs/{id}/download", "GET, HEAD").route(get().to(download_job)))
        .service(resource("/stats/observations", "GET, HEAD").route(get().to(observation_stats)));
}
