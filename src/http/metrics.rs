//! `GET /metrics` (docs/api.md §14) and the middleware that counts and times every request.

use std::time::{Duration, Instant};

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header;
use actix_web::middleware::Next;
use actix_web::{web, Error, HttpRequest, HttpResponse};

use crate::domain::role::Role;
use crate::error::ApiResult;
use crate::http::extract::{authenticate, state};
use crate::monitoring;
use crate::state::AppState;

/// Labels requests by route template, the same for all three prefixes, so that ids in paths do
/// not become series.
pub async fn record(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, Error> {
    let start = Instant::now();
    let method = req.method().as_str().to_string();
    let res = next.call(req).await?;
    let pattern = res.request().match_pattern();
    let route = route_label(pattern.as_deref());
    crate::monitoring::http_request(&method, route, res.status().as_u16(), start.elapsed());
    Ok(res)
}

fn route_label(pattern: Option<&str>) -> &str {
    match pattern {
        None => "unmatched",
        Some(p) => {
            let root = p.strip_prefix("/api/v1").or_else(|| p.strip_prefix("/api")).unwrap_or(p);
            if root.is_empty() {
                "/"
            } else {
                root
            }
        }
    }
}

/// Prometheus metrics (also on METRICS_PORT)
///
/// Role: admin.
///
/// Admin only on the API listener; the per-user rate limit does not apply.
#[utoipa::path(get, path = "/metrics", tag = "info",
    responses((status = 200, body = String, content_type = "text/plain")),
    security(("bearerAuth" = [])))]
pub async fn metrics(req: HttpRequest) -> ApiResult<HttpResponse> {
    authenticate(&req).await?.require(Role::Admin)?;
    exposition(req).await
}

/// The METRICS_PORT listener's handler: no authentication.
pub async fn exposition(req: HttpRequest) -> ApiResult<HttpResponse> {
    let st = state(&req)?;
    sample(st).await;
    let text = crate::monitoring::render(&st.config.node_id);
    Ok(HttpResponse::Ok().insert_header((header::CONTENT_TYPE, "text/plain; version=0.0.4")).body(text))
}

/// Values read at scrape time: pool state, the body budget in use, and the head, the active bundle
/// and the scope sets from the database (shared by every process, so they are right whichever
/// process changed them last). A database that does not answer within 2 s leaves the last values
/// in place rather than failing the scrape.
async fn sample(st: &AppState) {
    let status = st.pool.status();
    monitoring::db_pool_connections(status.available, status.size.saturating_sub(status.available));
    monitoring::body_budget_in_use(st.body_budget.in_use_bytes());
    let probe = async { crate::db::status::scrape_values(&st.pool.get().await.ok()?).await.ok() };
    if let Ok(Some(values)) = tokio::time::timeout(Duration::from_secs(2), probe).await {
        monitoring::changelog_head(values.head);
        monitoring::set_active_bundle(values.active_bundle);
        let preparing = values.scope_preparing.map(|p| (p.version, p.scanned, p.to_scan));
        monitoring::scope_sets(values.scope_active_version, preparing);
    }
}

pub fn routes(cfg: &mut web::ServiceConfig) {
    use crate::http::routing::{get, resource};
    cfg.service(resource("/metrics", "GET, HEAD").route(get().to(metrics)));
}

#[cfg(test)]
mod tests {
    use super::route_label;

    #[test]
    fn routes_are_labelled_without_prefix() {
        assert_eq!(route_label(Some("/api/v1/sync/push")), "/sync/push");
        assert_eq!(route_label(Some("/api/attachments/{id}")), "/attachments/{id}");
        assert_eq!(route_label(Some("/users/{username}")), "/users/{username}");
        assert_eq!(route_label(Some("/")), "/");
        assert_eq!(route_label(None), "unmatched");
    }
}
