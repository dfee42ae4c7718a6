//! Operator routes: repository reset and the device list (docs/api.md §17.3, §17.4), the audit log
//! (docs/api.md §18.4).

use actix_web::http::header::HeaderValue;
use actix_web::{web, HttpRequest, HttpResponse};

use crate::db::{audit, presence};
use crate::domain::audit::{clamp_limit, Action, AuditCursor, AuditFilter};
use crate::domain::page_token::{self, TokenKind};
use crate::domain::role::Role;
use crate::domain::time;
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::http::common::X_REPOSITORY_GENERATION;
use crate::http::compress::negotiated;
use crate::http::extract::{audit_origin, state, Auth, FromQuery, JsonBody, Query, QueryPairs};
use crate::http::wire;
use crate::http::wire::admin::{AuditEntry, AuditPage, Device, ResetAnswer, ResetRequest};

const RESET_CONFIRMATION: &str = "RESET_REPOSITORY";

/// Empty the repository and raise its generation
///
/// Role: admin.
#[utoipa::path(post, path = "/admin/repository/reset", tag = "admin",
    request_body = ResetRequest, responses((status = 200, body = ResetAnswer), (status = 400)),
    security(("bearerAuth" = [])))]
pub async fn reset_repository(
    req: HttpRequest,
    Auth(caller): Auth,
    JsonBody(body): JsonBody,
) -> ApiResult<HttpResponse> {
    caller.require(Role::Admin)?;
    let st = state(&req)?;
    let body: ResetRequest = wire::object(&body)?;
    let confirm = body.confirm.optional("confirm")?;
    if confirm != Some(RESET_CONFIRMATION) {
        return Err(ApiError::bad_request(format!(
            "Send {{\"confirm\": \"{RESET_CONFIRMATION}\"}} to reset the repository"
        ))
        .with_path("/confirm"));
    }
    // Through the attachment store: it deletes the files, and no upload commits in between.
    let head = st.actors.attachments.reset_repository(audit_origin(&req, st, &caller.username)).await?;
    tracing::warn!(admin = %caller.username, generation = head.repository_generation, head = head.change_id,
        "repository reset: observations, history and attachments deleted");
    let mut res = HttpResponse::Ok().json(ResetAnswer {
        current_version: head.change_id,
        message: "Repository reset; devices must discard local data and sync again",
        repository_generation: head.repository_generation,
    });
    res.headers_mut().insert(X_REPOSITORY_GENERATION.clone(), HeaderValue::from(head.repository_generation));
    Ok(res)
}

/// Devices seen
///
/// Role: admin.
#[utoipa::path(get, path = "/devices", tag = "admin",
    params(("username" = Option<String>, Query, description = "A user name"), ("stale_after" = Option<String>, Query, description = "Only devices not seen for this many seconds")),
    responses((status = 200, body = [Device]), (status = 400)),
    security(("bearerAuth" = [])))]
pub async fn devices(
    req: HttpRequest,
    Auth(caller): Auth,
    Query(DeviceFilter { username, stale_after }): Query<DeviceFilter>,
) -> ApiResult<HttpResponse> {
    caller.require(Role::Admin)?;
    let st = state(&req)?;
    let username = username.as_deref();
    let seen_before = stale_after.map(|secs| st.clock.now() - chrono::Duration::seconds(secs));
    let served = st
        .reads
        .read(
            &caller.username,
            None,
            |(head, _)| *head,
            |db| Box::pin(async move { presence::list(&db, username, seen_before).await }),
        )
        .await?;
    let (head, rows) = served.value;
    let devices: Vec<Device> = rows
        .into_iter()
        .map(|d| Device {
            app_bundle_version: d.app_bundle_version,
            client_id: d.client_id,
            client_version: d.client_version,
            lag: d.last_data_version.map(|v| (head - v).max(0)),
            last_data_version: d.last_data_version,
            last_seen_at: time::format(d.last_seen_at),
            username: d.username,
        })
        .collect();
    Ok(negotiated(&req, crate::http::context::served_by(HttpResponse::Ok().json(devices), served.by)))
}

/// `GET /devices`' filters: one user's devices, devices not seen for `stale_after` seconds.
pub struct DeviceFilter {
    username: Option<String>,
    stale_after: Option<i64>,
}

impl FromQuery for DeviceFilter {
    fn from_query(query: &QueryPairs) -> ApiResult<Self> {
        let get = |k: &str| query.0.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str());
        let stale_after = match get("stale_after").filter(|s| !s.is_empty()) {
            None => None,
            Some(raw) => Some(raw.trim().parse::<i64>().ok().filter(|s| *s >= 0).ok_or_else(|| {
                bad_filter("stale_after", "'stale_after' must be a number of seconds".to_owned())
            })?),
        };
        Ok(DeviceFilter {
            username: get("username").filter(|u| !u.is_empty()).map(str::to_owned),
            stale_after,
        })
    }
}

/// `GET /admin/audit`'s page size and its filter and position (from the page token or the filters).
pub struct AuditQuery {
    limit: i64,
    cursor: AuditCursor,
}

impl FromQuery for AuditQuery {
    fn from_query(query: &QueryPairs) -> ApiResult<Self> {
        let pairs = &query.0;
        let limit = match pairs.iter().find(|(k, _)| k == "limit").map(|(_, v)| v.trim()) {
            None | Some("") => clamp_limit(None),
            Some(raw) => clamp_limit(Some(
                raw.parse::<i64>()
                    .map_err(|_| bad_filter("limit", "'limit' must be an integer".to_owned()))?,
            )),
        };
        Ok(AuditQuery { limit, cursor: audit_cursor(pairs)? })
    }
}

fn bad_filter(name: &str, message: String) -> ApiError {
    ApiError::bad_request(message).with_path(&format!("?{name}"))
}

/// The listing's filter and cursor from the query: a page token carries both and wins over
/// explicit filters (docs/api.md §1.5).
fn audit_cursor(pairs: &[(String, String)]) -> ApiResult<AuditCursor> {
    let get =
        |k: &str| pairs.iter().find(|(key, _)| key == k).map(|(_, v)| v.trim()).filter(|v| !v.is_empty());
    if let Some(token) = get("page_token") {
        return page_token::decode(TokenKind::Audit, token)
            .ok_or_else(|| ApiError::of(ErrorCode::InvalidPageToken));
    }
    let instant = |name: &str| -> ApiResult<_> {
        get(name)
            .map(|raw| {
                time::parse_rfc3339(raw).ok_or_else(|| {
                    bad_filter(name, format!("'{name}' must be an RFC 3339 timestamp with an offset"))
                })
            })
            .transpose()
    };
    let action = get("action")
        .map(|raw| {
            Action::parse(raw).map(|a| a.as_str().to_owned()).ok_or_else(|| {
                let known: Vec<_> = Action::ALL.iter().map(|a| a.as_str()).collect();
                bad_filter("action", format!("Unknown action '{raw}'; use one of {}", known.join(", ")))
            })
        })
        .transpose()?;
    let filter = AuditFilter {
        actor: get("actor").map(str::to_owned),
        action,
        since: instant("since")?,
        until: instant("until")?,
    };
    if let (Some(since), Some(until)) = (filter.since, filter.until) {
        if since > until {
            return Err(bad_filter("since", "'since' is after 'until'".to_owned()));
        }
    }
    Ok(AuditCursor { filter, b: i64::MAX })
}

/// The audit log, newest first
///
/// Role: admin.
#[utoipa::path(get, path = "/admin/audit", tag = "admin",
    params(("actor" = Option<String>, Query, description = "Only this user's actions"), ("action" = Option<String>, Query, description = "Only this action (e.g. auth.sign_in_failed)"),
        ("since" = Option<String>, Query, description = "RFC 3339: entries at or after"), ("until" = Option<String>, Query, description = "RFC 3339: entries at or before"),
        ("limit" = Option<String>, Query, description = "integer; default 100, clamped to 500"), ("page_token" = Option<String>, Query, description = "The token of the previous page")),
    responses((status = 200, body = AuditPage), (status = 400)),
    security(("bearerAuth" = [])))]
pub async fn audit_log(
    req: HttpRequest,
    Auth(caller): Auth,
    Query(AuditQuery { limit, cursor }): Query<AuditQuery>,
) -> ApiResult<HttpResponse> {
    caller.require(Role::Admin)?;
    let st = state(&req)?;
    let db = st.pool.get().await?;
    let mut rows = audit::list(&db, &cursor.filter, cursor.b, limit + 1).await?;
    let has_more = rows.len() as i64 > limit;
    rows.truncate(limit as usize);
    let next_page_token = rows.last().filter(|_| has_more).map(|last| {
        page_token::encode(TokenKind::Audit, &AuditCursor { filter: cursor.filter.clone(), b: last.id })
    });
    let items = rows
        .into_iter()
        .map(|row| AuditEntry {
            action: row.action,
            actor: row.actor,
            at: time::format(row.at),
            client_ip: row.client_ip.map(|ip| ip.to_string()),
            details: row.details,
            id: row.id,
            node: row.node,
            request_id: row.request_id,
            target: row.target,
        })
        .collect();
    Ok(negotiated(&req, HttpResponse::Ok().json(AuditPage { items, next_page_token })))
}

pub fn routes(cfg: &mut web::ServiceConfig) {
    use crate::http::routing::{get, resource};
    cfg.service(resource("/admin/repository/reset", "POST").route(web::post().to(reset_repository)))
        .service(resource("/admin/audit", "GET, HEAD").route(get().to(audit_log)))
        .service(resource("/devices", "GET, HEAD").route(get().to(devices)));
}
