//! Service descriptor, health, readiness, version and status (API.md 5).

use std::time::Duration;

use actix_web::{web, HttpRequest, HttpResponse};
use chrono::Utc;
use serde_json::json;

use crate::domain::role::Role;
use crate::domain::time;
use crate::error::{ApiError, ApiResult};
use crate::http::context::SERVER_VERSION;
use crate::http::extract::{state, Auth};
use crate::state::AppState;

/// Browsers that prefer HTML go to the portal (API.md 17.9); everybody else gets the descriptor.
pub async fn root(req: HttpRequest) -> HttpResponse {
    if let Some(redirect) = crate::http::portal::redirect_to_portal(&req) {
        return redirect;
    }
    HttpResponse::Ok().json(json!({
        "service": "synkronus",
        "version": SERVER_VERSION,
        "api_version": "1.1.0",
        "health": "/health",
        "openapi": "/openapi/synkronus.yaml",
    }))
}

async fn database_answers(st: &AppState) -> bool {
    let probe = async {
        let db = st.pool.get().await.ok()?;
        crate::db::status::ping(&db).await.ok()
    };
    matches!(tokio::time::timeout(Duration::from_secs(2), probe).await, Ok(Some(_)))
}

pub async fn health(req: HttpRequest) -> ApiResult<HttpResponse> {
    let st = state(&req)?;
    let now = time::format(Utc::now());
    if database_answers(st).await {
        Ok(HttpResponse::Ok().json(json!({
            "status": "OK", "timestamp": now, "version": SERVER_VERSION, "database": "up",
        })))
    } else {
        Err(ApiError::unavailable("health check: database did not answer within 2 s")
            .with_extra("database", "down")
            .with_extra("timestamp", now)
            .with_extra("version", SERVER_VERSION))
    }
}

pub async fn ready(req: HttpRequest) -> ApiResult<HttpResponse> {
    let st = state(&req)?;
    if st.is_ready() && database_answers(st).await {
        Ok(HttpResponse::Ok().json(json!({"status": "ready"})))
    } else {
        Err(ApiError::unavailable("not ready"))
    }
}

pub async fn version(req: HttpRequest) -> ApiResult<HttpResponse> {
    let st = state(&req)?;
    let probe = async {
        let db = st.pool.get().await.ok()?;
        let (full, name) = crate::db::status::server_version(&db).await.ok()?;
        // "PostgreSQL 15.18 (Debian ...) on x86_64..." -> "PostgreSQL 15.18"
        let short = full.split_whitespace().take(2).collect::<Vec<_>>().join(" ");
        Some((short, name))
    };
    let (db_version, db_name) = tokio::time::timeout(Duration::from_secs(2), probe)
        .await
        .ok()
        .flatten()
        .unwrap_or_else(|| ("unknown".into(), "unknown".into()));
    let commit = env!("SYNKRONUS_GIT_COMMIT");
    let build_time = env!("SYNKRONUS_BUILD_TIME");
    let rustc = env!("SYNKRONUS_RUSTC_VERSION");
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    Ok(HttpResponse::Ok().json(json!({
        "version": SERVER_VERSION,
        "build_time": build_time,
        "git_commit": commit,
        "go_version": rustc,
        "server": {"version": SERVER_VERSION},
        "database": {"type": "postgresql", "version": db_version, "database_name": db_name},
        "system": {"os": std::env::consts::OS, "architecture": arch, "cpus": cpus},
        "build": {"commit": commit, "build_time": build_time, "go_version": rustc},
    })))
}

pub async fn versions() -> HttpResponse {
    HttpResponse::Ok().json(json!({
        "current": "1.1.0",
        "versions": [{"version": "1.0", "status": "supported"}, {"version": "1.1", "status": "current"}],
    }))
}

pub async fn status(req: HttpRequest, Auth(caller): Auth) -> ApiResult<HttpResponse> {
    caller.require(Role::ReadOnly)?;
    let st = state(&req)?;
    let db = st.pool.get().await?;
    let counts = crate::db::status::counts(&db).await?;
    Ok(HttpResponse::Ok().json(json!({
        "status": "OK",
        "version": SERVER_VERSION,
        "uptime_seconds": st.started_at.elapsed().as_secs(),
        "database": "up",
        "active_bundle_version": counts.active_bundle_version,
        "observation_count": counts.observations,
        "attachment_count": counts.attachments,
        "current_change_id": counts.head,
    })))
}

pub fn routes(cfg: &mut web::ServiceConfig) {
    use crate::http::routing::{get, resource};
    cfg.service(resource("/health", "GET, HEAD").route(get().to(health)))
        .service(resource("/ready", "GET, HEAD").route(get().to(ready)))
        .service(resource("/version", "GET, HEAD").route(get().to(version)))
        .service(resource("/versions", "GET, HEAD").route(get().to(versions)))
        .service(resource("/status", "GET, HEAD").route(get().to(status)));
}
