//! The scope set (docs/api.md §20.2): who receives which records. Admins only.

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::Value;

use crate::db::scope::{self as db_scope, read};
use crate::db::users as db_users;
use crate::domain::role::Role;
use crate::domain::scope::{ScopeRules, UserAttributes, UserFacts, Visibility};
use crate::domain::time;
use crate::error::{ApiError, ApiResult};
use crate::http::common::query_pairs;
use crate::http::extract::{audit_origin, state, Auth, JsonBody};
use crate::http::wire::scopes::{ScopeChange, ScopePreview, ScopeSet, ScopeStatus, SetPreview};

/// The scope set in force
///
/// Role: admin.
#[utoipa::path(get, path = "/admin/scopes", tag = "scopes", responses((status = 200, body = ScopeSet)),
    security(("bearerAuth" = [])))]
pub async fn get_set(req: HttpRequest, Auth(caller): Auth) -> ApiResult<HttpResponse> {
    caller.require(Role::Admin)?;
    let st = state(&req)?;
    let db = st.pool.get().await?;
    let active = db_scope::state(&db).await?.active_version;
    let set = match active {
        0 => None,
        version => db_scope::set_version(&db, version).await?,
    };
    let answer = match set {
        None => ScopeSet { activated_at: None, rules: Value::Null, version: 0 },
        Some(set) => ScopeSet {
            activated_at: set.activated_at.map(time::format),
            rules: set.rules.as_deref().map_or(Value::Null, ScopeRules::to_json),
            version: set.version,
        },
    };
    Ok(HttpResponse::Ok().json(answer))
}

/// Replace the scope set (it takes effect once prepared)
///
/// Role: admin.
#[utoipa::path(put, path = "/admin/scopes", tag = "scopes",
    request_body(content = Object, description = "{\"rules\": [...]}"),
    responses((status = 202, body = ScopeChange), (status = 400)), security(("bearerAuth" = [])))]
pub async fn put_set(
    req: HttpRequest,
    Auth(caller): Auth,
    JsonBody(body): JsonBody,
) -> ApiResult<HttpResponse> {
    caller.require(Role::Admin)?;
    let st = state(&req)?;
    let Some(object) = body.as_object() else {
        return Err(ApiError::bad_request("Request body must be a JSON object with 'rules'"));
    };
    let raw = object
        .get("rules")
        .ok_or_else(|| ApiError::bad_request("'rules' is required").with_path("/rules"))?;
    let rules = ScopeRules::parse(raw).map_err(|problems| {
        let count = problems.len();
        ApiError::bad_request(format!("The scope set has {count} problem(s); none was saved"))
            .with_errors(problems)
    })?;
    let new = st.actors.scope_sets.replace(Some(rules), audit_origin(&req, st, &caller.username)).await?;
    Ok(HttpResponse::Accepted().json(ScopeChange {
        replaced_version: new.replaced,
        state: "preparing",
        version: new.version,
    }))
}

/// Return to no scope set (it takes effect once prepared)
///
/// Role: admin.
#[utoipa::path(delete, path = "/admin/scopes", tag = "scopes",
    responses((status = 202, body = ScopeChange), (status = 200, body = ScopeChange)), security(("bearerAuth" = [])))]
pub async fn delete_set(req: HttpRequest, Auth(caller): Auth) -> ApiResult<HttpResponse> {
    caller.require(Role::Admin)?;
    let st = state(&req)?;
    let new = st.actors.scope_sets.replace(None, audit_origin(&req, st, &caller.username)).await?;
    if new.version == 0 {
        return Ok(HttpResponse::Ok().json(ScopeChange {
            replaced_version: None,
            state: "active",
            version: 0,
        }));
    }
    Ok(HttpResponse::Accepted().json(ScopeChange {
        replaced_version: new.replaced,
        state: "preparing",
        version: new.version,
    }))
}

/// How far the preparation of a new scope set got
///
/// Role: admin.
#[utoipa::path(get, path = "/admin/scopes/status", tag = "scopes", responses((status = 200, body = ScopeStatus)),
    security(("bearerAuth" = [])))]
pub async fn status(req: HttpRequest, Auth(caller): Auth) -> ApiResult<HttpResponse> {
    caller.require(Role::Admin)?;
    let st = state(&req)?;
    let db = st.pool.get().await?;
    let state = db_scope::state(&db).await?;
    let preparing = match state.preparing_version {
        None => None,
        Some(version) => db_scope::set_version(&db, version).await?,
    };
    let (scanned, to_scan) = preparing.as_ref().map_or((0, 0), |p| (p.scanned, p.to_scan));
    let progress = match &preparing {
        None => 1.0,
        Some(p) if p.scan_head.is_none() => 0.0,
        // The scan is most of the work; the last hundredth is the catch-up and the switch.
        Some(_) if to_scan == 0 => 0.99,
        Some(_) => (scanned as f64 / to_scan as f64).min(1.0) * 0.99,
    };
    Ok(HttpResponse::Ok().json(ScopeStatus {
        active_version: state.active_version,
        preparing_version: state.preparing_version,
        progress,
        scanned,
        to_scan,
    }))
}

/// What a user receives under the set in force and the one being prepared
///
/// Role: admin.
#[utoipa::path(get, path = "/admin/scopes/preview", tag = "scopes",
    params(("user" = String, Query, description = "A user name")),
    responses((status = 200, body = ScopePreview), (status = 400), (status = 404)), security(("bearerAuth" = [])))]
pub async fn preview(req: HttpRequest, Auth(caller): Auth) -> ApiResult<HttpResponse> {
    caller.require(Role::Admin)?;
    let st = state(&req)?;
    let username = query_pairs(&req)
        .into_iter()
        .find(|(k, _)| k == "user")
        .map(|(_, v)| v)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| ApiError::bad_request("'user' is required").with_path("/user"))?;
    let db = st.pool.get().await?;
    let user = db_users::find_by_username(&db, &username)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("User '{username}' not found")))?;
    let attributes = UserAttributes::parse(&user.attributes)
        .map_err(|_| ApiError::internal(format!("user {username}: stored attributes do not parse")))?;
    let facts = UserFacts { username: user.username.clone(), role: user.role, attributes };
    let state = db_scope::state(&db).await?;
    let active_rules = db_scope::rules_of(&db, state.active_version).await?;
    let active = set_preview(&db, &facts, state.active_version, active_rules.as_deref(), true).await?;
    let preparing = match state.preparing_version {
        None => None,
        Some(version) => {
            let rules = db_scope::rules_of(&db, version).await?;
            Some(set_preview(&db, &facts, version, rules.as_deref(), false).await?)
        }
    };
    Ok(HttpResponse::Ok().json(ScopePreview {
        active,
        preparing,
        role: user.role.to_string(),
        user: username,
    }))
}

async fn set_preview(
    db: &deadpool_postgres::Object,
    user: &UserFacts,
    version: i64,
    rules: Option<&ScopeRules>,
    complete: bool,
) -> ApiResult<SetPreview> {
    let visibility = Visibility::of(rules, user);
    let keys = visibility.keys();
    let everything = visibility == Visibility::All;
    let counts = read::visible_counts(db, &user.username, (!everything).then_some(keys.as_slice())).await?;
    let names = rules
        .map(|rules| Visibility::matching_rules(rules, user).into_iter().map(|r| r.name.clone()).collect())
        .unwrap_or_default();
    Ok(SetPreview { total: counts.values().sum(), counts, complete, everything, rules: names, version })
}

pub fn routes(cfg: &mut web::ServiceConfig) {
    use crate::http::routing::{get, resource};
    cfg.service(
        resource("/admin/scopes", "GET, HEAD, PUT, DELETE")
            .route(get().to(get_set))
            .route(web::put().to(put_set))
            .route(web::delete().to(delete_set)),
    )
    .service(resource("/admin/scopes/status", "GET, HEAD").route(get().to(status)))
    .service(resource("/admin/scopes/preview", "GET, HEAD").route(get().to(preview)));
}
