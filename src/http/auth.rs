//! Login, refresh, logout, me, verify (API.md 6).

use actix_web::{web, HttpRequest, HttpResponse};
use chrono::Duration as ChronoDuration;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::auth::{bearer_token, hash_refresh_token, new_refresh_token};
use crate::db::users::{self as db_users, RefreshLookup, UserRow};
use crate::domain::time;
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::http::extract::{client_ip, state, Auth, Fields, JsonBody};
use crate::http::users::{current_user, user_json};
use crate::state::AppState;

/// Issues an access token and a refresh token in `family`, in the login response shape.
async fn token_response(st: &AppState, user: &UserRow, family: Uuid) -> ApiResult<Value> {
    let access = st.auth.issue_access_token(user)?;
    let (refresh, refresh_hash) = new_refresh_token();
    let refresh_expires = st.clock.now() + ChronoDuration::seconds(st.auth.refresh_ttl.as_secs() as i64);
    let db = st.pool.get().await?;
    db_users::insert_refresh_token(&db, &refresh_hash, user.id, family, refresh_expires).await?;
    let ttl = st.auth.access_ttl.as_secs();
    let mut user_obj = user_json(user);
    if let Value::Object(o) = &mut user_obj {
        o.remove("createdAt");
        o.remove("last_login");
    }
    Ok(json!({
        "token": access.token,
        "expires_in": ttl,
        "expiresIn": ttl,
        "expiresAt": access.expires_at,
        "refresh_token": refresh,
        "refreshToken": refresh,
        "user": user_obj,
    }))
}

pub async fn login(req: HttpRequest, JsonBody(body): JsonBody) -> ApiResult<HttpResponse> {
    let st = state(&req)?;
    let f = Fields::of(&body)?;
    let username = f.req_str(&["username"])?;
    let password = f.req_str(&["password"])?;
    let ip = client_ip(&req, &st.config.trusted_proxies);
    st.login_limiter.try_attempt(ip, username).map_err(|wait| {
        crate::monitoring::rate_limited("login");
        ApiError::rate_limited(wait)
    })?;

    let db = st.pool.get().await?;
    let user = db_users::find_by_username(&db, username).await?;
    drop(db);
    let hash = user.as_ref().map(|u| u.password_hash.clone());
    if !st.auth.verify_password(password.to_string(), hash).await? {
        return Err(ApiError::new(ErrorCode::InvalidCredentials, "Invalid credentials"));
    }
    let Some(mut user) = user else {
        return Err(ApiError::new(ErrorCode::InvalidCredentials, "Invalid credentials"));
    };
    if user.username == "admin" && password == "admin" {
        tracing::warn!("the admin account still uses the default password 'admin': change it now");
    }
    let db = st.pool.get().await?;
    user.last_login = Some(db_users::touch_last_login(&db, user.id).await?);
    drop(db);
    let body = token_response(st, &user, Uuid::new_v4()).await?;
    Ok(HttpResponse::Ok().json(body))
}

pub async fn refresh(req: HttpRequest, JsonBody(body): JsonBody) -> ApiResult<HttpResponse> {
    let st = state(&req)?;
    let f = Fields::of(&body)?;
    let token = f.req_str(&["refresh_token", "refreshToken"])?;
    let db = st.pool.get().await?;
    let invalid = || ApiError::new(ErrorCode::InvalidToken, "Invalid refresh token");
    let (user_id, family) =
        match db_users::consume_refresh_token(&db, &hash_refresh_token(token), st.clock.now()).await? {
            RefreshLookup::Consumed { user_id, family_id } => (user_id, family_id),
            RefreshLookup::Reused { family_id } => {
                db_users::revoke_refresh_family(&db, family_id).await?;
                tracing::warn!(family = %family_id, "refresh token reused: family revoked");
                return Err(invalid());
            }
            RefreshLookup::Expired => {
                return Err(ApiError::new(ErrorCode::TokenExpired, "Refresh token expired"))
            }
            RefreshLookup::Unknown => return Err(invalid()),
        };
    let user = db_users::find_by_id(&db, user_id).await?.ok_or_else(invalid)?;
    drop(db);
    let body = token_response(st, &user, family).await?;
    Ok(HttpResponse::Ok().json(body))
}

pub async fn logout(
    req: HttpRequest,
    Auth(caller): Auth,
    JsonBody(body): JsonBody,
) -> ApiResult<HttpResponse> {
    let st = state(&req)?;
    let refresh = match &body {
        Value::Null => None,
        _ => Fields::of(&body)?.opt_str(&["refresh_token", "refreshToken"])?,
    };
    let db = st.pool.get().await?;
    db_users::revoke_access_token(&db, &caller.jti, caller.expires_at).await?;
    if let Some(token) = refresh {
        db_users::revoke_refresh_token(&db, &hash_refresh_token(token), caller.id).await?;
    }
    st.auth.forget_token(caller.id, &caller.jti);
    Ok(HttpResponse::Ok().json(json!({"message": "Logged out"})))
}

pub async fn me(req: HttpRequest, Auth(caller): Auth) -> ApiResult<HttpResponse> {
    let st = state(&req)?;
    let user = current_user(st, &caller).await?;
    let mut obj = user_json(&user);
    if let Value::Object(o) = &mut obj {
        o.remove("createdAt");
    }
    Ok(HttpResponse::Ok().json(json!({ "data": obj })))
}

/// Always 200: it reports on the presented token rather than guarding anything.
pub async fn verify(req: HttpRequest) -> ApiResult<HttpResponse> {
    let st = state(&req)?;
    let header = req.headers().get("authorization").and_then(|v| v.to_str().ok());
    let Some(token) = bearer_token(header) else {
        return Ok(HttpResponse::Ok().json(json!({"valid": false, "error": "MISSING_TOKEN"})));
    };
    match st.auth.verify(token, &st.pool).await {
        Ok(user) => Ok(HttpResponse::Ok().json(json!({
            "valid": true,
            "expires_at": time::format(user.expires_at),
            "username": user.username,
            "role": user.role.as_str(),
        }))),
        Err(e) if matches!(e.code, ErrorCode::ServiceUnavailable | ErrorCode::Internal) => Err(e),
        Err(e) => Ok(HttpResponse::Ok().json(json!({"valid": false, "error": e.code.as_str()}))),
    }
}

pub fn routes(cfg: &mut web::ServiceConfig) {
    use crate::http::routing::{get, resource};
    cfg.service(resource("/auth/login", "POST").route(web::post().to(login)))
        .service(resource("/auth/refresh", "POST").route(web::post().to(refresh)))
        .service(resource("/auth/logout", "POST").route(web::post().to(logout)))
        .service(resource("/auth/me", "GET, HEAD").route(get().to(me)))
        .service(resource("/auth/verify", "GET, HEAD").route(get().to(verify)));
}
