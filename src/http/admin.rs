//! Operator routes of the 2026 surface: repository reset and the device list (API.md 17.3, 17.4).

use actix_web::http::header::HeaderValue;
use actix_web::{web, HttpRequest, HttpResponse};

use crate::db::presence;
use crate::domain::role::Role;
use crate::domain::time;
use crate::error::{ApiError, ApiResult};
use crate::http::extract::{state, Auth, JsonBody};
use crate::http::sync::{query_pairs, X_REPOSITORY_GENERATION};
use crate::http::wire;
use crate::http::wire::admin::{Device, ResetAnswer, ResetRequest};

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
    let head = st.actors.attachments.reset_repository().await?;
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
pub async fn devices(req: HttpRequest, Auth(caller): Auth) -> ApiResult<HttpResponse> {
    caller.require(Role::Admin)?;
    let st = state(&req)?;
    let pairs = query_pairs(&req);
    let get = |k: &str| pairs.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str());
    let username = get("username").filter(|u| !u.is_empty());
    let stale_after = match get("stale_after").filter(|s| !s.is_empty()) {
        None => None,
        Some(raw) => Some(raw.trim().parse::<i64>().ok().filter(|s| *s >= 0).ok_or_else(|| {
            ApiError::bad_request("'stale_after' must be a number of seconds").with_path("?stale_after")
        })?),
    };
    let served = st
        .reads
        .read(None, |_| 0, |db| Box::pin(async move { presence::list(&db, username, stale_after).await }))
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
    Ok(crate::http::context::served_by(HttpResponse::Ok().json(devices), served.by))
}

pub fn routes(cfg: &mut web::ServiceConfig) {
    use crate::http::routing::{get, resource};
    cfg.service(resource("/admin/repository/reset", "POST").route(web::post().to(reset_repository)))
        .service(resource("/devices", "GET, HEAD").route(get().to(devices)));
}
