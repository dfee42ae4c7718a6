//! Service descriptor, health, readiness, version and status (docs/api.md §5).

use std::time::Duration;

use crate::domain::role::Role;
use crate::domain::time;
use crate::error::{ApiError, ApiResult};
use crate::http::context::SERVER_VERSION;
use crate::http::extract::{state, Auth};
use crate::http::wire::info::{
    ApiVersionStatus, ApiVersions, BuildInfo, DatabaseInfo, Health, Ready, ReplicaHealth, ServerInfo,
    ServiceDescriptor, Status, SystemInfo, Version,
};
use crate::state::AppState;
use actix_web::{web, HttpRequest, HttpResponse};
use chrono::Utc;

/// Service descriptor (root only)
///
/// Public. Browsers that prefer HTML go to the portal (docs/api.md §17.9); everybody else gets
/// the descriptor.
#[utoipa::path(get, path = "/", tag = "info", responses((status = 200, body = ServiceDescriptor)))]
pub async fn root(req: HttpRequest) -> HttpResponse {
    if let Some(redirect) = crate::http::common::redirect_to_portal(&req) {
        return redirect;
    }
    HttpResponse::Ok().json(ServiceDescriptor {
        api_version: "1.1.0",
        health: "/health",
        openapi: "/openapi/synkronus.yaml",
        service: "synkronus",
        version: SERVER_VERSION,
    })
}

async fn database_answers(st: &AppState) -> bool {
    let probe = async {
        let db = st.pool.get().await.ok()?;
        crate::db::status::ping(&db).await.ok()
    };
    matches!(tokio::time::timeout(Duration::from_secs(2), probe).await, Ok(Some(_)))
}

async fn storage_answers(st: &AppState) -> &'static str {
    match tokio::time::timeout(Duration::from_secs(2), st.storage.check()).await {
        Ok(Ok(())) => "up",
        _ => "down",
    }
}

fn replica_health(st: &AppState) -> Vec<ReplicaHealth> {
    st.reads
        .reports()
        .into_iter()
        .enumerate()
        .map(|(i, r)| ReplicaHealth {
            name: format!("replica-{}", i + 1),
            state: r.state.as_str(),
            lag_seconds: r.lag_seconds,
            replay_lsn: r.replay_lsn,
        })
        .collect()
}

/// Liveness and database check
///
/// Public.
#[utoipa::path(get, path = "/health", tag = "info", responses((status = 200, body = Health)))]
pub async fn health(req: HttpRequest) -> ApiResult<HttpResponse> {
    let st = state(&req)?;
    let now = time::format(Utc::now());
    let (database, storage) = futures_util::join!(database_answers(st), storage_answers(st));
    if database {
        Ok(HttpResponse::Ok().json(Health {
            database: "up",
            node: st.config.node_id.clone(),
            status: "OK",
            storage,
            timestamp: now,
            version: SERVER_VERSION,
            replicas: replica_health(st),
        }))
    } else {
        Err(ApiError::unavailable("health check: database did not answer within 2 s")
            .with_extra("database", "down")
            .with_extra("storage", storage)
            .with_extra("node", st.config.node_id.clone())
            .with_extra("timestamp", now)
            .with_extra("version", SERVER_VERSION))
    }
}

/// Readiness
///
/// Public.
#[utoipa::path(get, path = "/ready", tag = "info", responses((status = 200, body = Ready)))]
pub async fn ready(req: HttpRequest) -> ApiResult<HttpResponse> {
    let st = state(&req)?;
    if st.is_ready() && database_answers(st).await {
        Ok(HttpResponse::Ok().json(Ready { status: "ready" }))
    } else {
        Err(ApiError::unavailable("not ready"))
    }
}

/// Build and database versions
///
/// Public.
#[utoipa::path(get, path = "/version", tag = "info", responses((status = 200, body = Version)))]
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
    Ok(HttpResponse::Ok().json(Version {
        build: BuildInfo { build_time, commit, go_version: rustc },
        build_time,
        database: DatabaseInfo { database_name: db_name, kind: "postgresql", version: db_version },
        git_commit: commit,
        go_version: rustc,
        server: ServerInfo { version: SERVER_VERSION },
        system: SystemInfo { architecture: arch, cpus, os: std::env::consts::OS },
        version: SERVER_VERSION,
    }))
}

/// Supported API versions
///
/// Public.
#[utoipa::path(get, path = "/versions", tag = "info", responses((status = 200, body = ApiVersions)))]
pub async fn versions() -> HttpResponse {
    HttpResponse::Ok().json(ApiVersions {
        current: "1.1.0",
        versions: vec![
            ApiVersionStatus { status: "supported", version: "1.0" },
            ApiVersionStatus { status: "current", version: "1.1" },
        ],
    })
}

/// Counters and the current change_id
///
/// Role: read-only or above.
#[utoipa::path(get, path = "/status", tag = "info", responses((status = 200, body = Status)),
    security(("bearerAuth" = [])))]
pub async fn status(req: HttpRequest, Auth(caller): Auth) -> ApiResult<HttpResponse> {
    caller.require(Role::ReadOnly)?;
    let st = state(&req)?;
    let db = st.pool.get().await?;
    let counts = crate::db::status::counts(&db).await?;
    // Counts over the whole repository are for admins while a scope set is in force.
    let shown = caller.role.allows(Role::Admin) || !crate::db::scope::read::is_scoped(&db).await?;
    Ok(HttpResponse::Ok().json(Status {
        active_bundle_version: counts.active_bundle_version,
        attachment_count: shown.then_some(counts.attachments),
        current_change_id: counts.head,
        database: "up",
        observation_count: shown.then_some(counts.observations),
        status: "OK",
        uptime_seconds: st.started_at.elapsed().as_secs(),
        version: SERVER_VERSION,
    }))
}

pub fn routes(cfg: &mut web::ServiceConfig) {
    use crate::http::routing::{get, resource};
    cfg.service(resource("/health", "GET, HEAD").route(get().to(health)))
        .service(resource("/ready", "GET, HEAD").route(get().to(ready)))
        .service(resource("/version", "GET, HEAD").route(get().to(version)))
        .service(resource("/versions", "GET, HEAD").route(get().to(versions)))
        .service(resource("/status", "GET, HEAD").route(get().to(status)));
}
