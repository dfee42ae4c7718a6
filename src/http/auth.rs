//! Login, refresh, logout, me, verify (docs/api.md §6).

use actix_web::{web, HttpRequest, HttpResponse};
use chrono::Duration as ChronoDuration;
use uuid::Uuid;

use crate::auth::{bearer_token, hash_refresh_token, new_refresh_token};
use crate::db::audit;
use crate::db::users::{self as db_users, NewRefreshToken, RefreshLookup, UserRow};
use crate::domain::audit::Action;
use crate::domain::time;
use crate::domain::user::DEFAULT_ADMIN_USERNAME;
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::http::common::current_user;
use crate::http::extract::{audit_origin, client_ip, state, Auth, JsonBody};
use crate::http::wire::auth::{LoginRequest, Me, MeUser, RefreshRequest, TokenPair, Verification};
use crate::http::wire::users::{RoleName, User};
use crate::http::wire::{self, Message};
use crate::state::AppState;

/// A new refresh token in `family`: the token for the client and the row that stores its hash.
fn new_refresh(st: &AppState, user: &UserRow, family: Uuid) -> (String, NewRefreshToken) {
    let (refresh, token_hash) = new_refresh_token();
    let expires_at = st.clock.now() + ChronoDuration::seconds(st.auth.refresh_ttl.as_secs() as i64);
    (refresh, NewRefreshToken { token_hash, user_id: user.id, family_id: family, expires_at })
}

/// Issues an access token and answers it with the stored `refresh` token, in the login shape.
fn token_response(st: &AppState, user: &UserRow, refresh: String) -> ApiResult<TokenPair> {
    let access = st.auth.issue_access_token(user)?;
    let ttl = st.auth.access_ttl.as_secs();
    Ok(TokenPair {
        expires_at: access.expires_at,
        expires_in_camel: ttl,
        expires_in: ttl,
        refresh_token_camel: refresh.clone(),
        refresh_token: refresh,
        token: access.token,
        user: User::from(user).into(),
    })
}

/// Log in
///
/// Public.
#[utoipa::path(post, path = "/auth/login", tag = "auth", request_body = LoginRequest,
    responses((status = 200, body = TokenPair), (status = 400), (status = 401), (status = 429)))]
pub async fn login(req: HttpRequest, JsonBody(body): JsonBody) -> ApiResult<HttpResponse> {
    let st = state(&req)?;
    let body: LoginRequest = wire::object(&body)?;
    let username = body.username.required("username")?;
    let password = body.password.required("password")?;
    let ip = client_ip(&req, &st.config.trusted_proxies);
    st.login_limiter.try_attempt(ip, username).await?.map_err(|wait| {
        crate::monitoring::rate_limited("login");
        ApiError::rate_limited(wait)
    })?;

    let origin = audit_origin(&req, st, username);
    let db = st.pool.get().await?;
    let user = db_users::find_by_username(&db, username).await?;
    drop(db);
    let hash = user.as_ref().map(|u| u.password_hash.clone());
    let verified = st.auth.verify_password(password.to_string(), hash).await?;
    let reason = if user.is_some() { "wrong password" } else { "unknown user" };
    let Some(mut user) = user.filter(|_| verified) else {
        // A failure has no transaction of its own: its entry is one.
        let entry = origin.entry(Action::SignInFailed, Some(username), serde_json::json!({"reason": reason}));
        audit::append(&st.pool.get().await?, &entry).await?;
        return Err(ApiError::new(ErrorCode::InvalidCredentials, "Invalid credentials"));
    };
    let (refresh, stored) = new_refresh(st, &user, Uuid::new_v4());
    let entry = origin.entry(Action::SignIn, Some(username), serde_json::json!({}));
    user.last_login = Some(db_users::sign_in(&mut st.pool.get().await?, &stored, &entry).await?);
    Ok(HttpResponse::Ok().json(token_response(st, &user, refresh)?))
}

/// Rotate a refresh token
///
/// Public.
#[utoipa::path(post, path = "/auth/refresh", tag = "auth", request_body = RefreshRequest,
    responses((status = 200, body = TokenPair), (status = 400), (status = 401)))]
pub async fn refresh(req: HttpRequest, JsonBody(body): JsonBody) -> ApiResult<HttpResponse> {
    let st = state(&req)?;
    let body: RefreshRequest = wire::object(&body)?;
    let token = body.required()?;
    let mut db = st.pool.get().await?;
    let invalid = || ApiError::new(ErrorCode::InvalidToken, "Invalid refresh token");
    let (user_id, family) =
        match db_users::consume_refresh_token(&db, &hash_refresh_token(token), st.clock.now()).await? {
            RefreshLookup::Consumed { user_id, family_id } => (user_id, family_id),
            RefreshLookup::Reused { family_id, username } => {
                let details = serde_json::json!({"family": family_id.to_string()});
                let entry = audit_origin(&req, st, &username).entry(
                    Action::RefreshTokenReused,
                    Some(&username),
                    details,
                );
                db_users::revoke_refresh_family(&mut db, family_id, &entry).await?;
                tracing::warn!(family = %family_id, "refresh token reused: family revoked");
                return Err(invalid());
            }
            RefreshLookup::Expired => {
                return Err(ApiError::new(ErrorCode::TokenExpired, "Refresh token expired"))
            }
            RefreshLookup::Unknown => return Err(invalid()),
        };
    let user = db_users::find_by_id(&db, user_id).await?.ok_or_else(invalid)?;
    let (refresh, stored) = new_refresh(st, &user, family);
    db_users::insert_refresh_token(&db, &stored).await?;
    Ok(HttpResponse::Ok().json(token_response(st, &user, refresh)?))
}

/// Revoke this token and its refresh family
///
/// Role: read-only or above. The body is optional; a refresh token in it is revoked too.
#[utoipa::path(post, path = "/auth/logout", tag = "auth", request_body = Option<RefreshRequest>,
    responses((status = 200, body = Message), (status = 400)), security(("bearerAuth" = [])))]
pub async fn logout(
    req: HttpRequest,
    Auth(caller): Auth,
    JsonBody(body): JsonBody,
) -> ApiResult<HttpResponse> {
    let st = state(&req)?;
    let body: Option<RefreshRequest> = match &body {
        serde_json::Value::Null => None,
        _ => Some(wire::object(&body)?),
    };
    let refresh = body.as_ref().map(RefreshRequest::optional).transpose()?.flatten();
    let db = st.pool.get().await?;
    db_users::revoke_access_token(&db, &caller.jti, caller.expires_at).await?;
    if let Some(token) = refresh {
        db_users::revoke_refresh_token(&db, &hash_refresh_token(token), caller.id).await?;
    }
    st.auth.forget_token(caller.id, &caller.jti);
    Ok(HttpResponse::Ok().json(Message { message: "Logged out" }))
}

/// The caller
///
/// Role: read-only or above.
#[utoipa::path(get, path = "/auth/me", tag = "auth", responses((status = 200, body = Me)),
    security(("bearerAuth" = [])))]
pub async fn me(req: HttpRequest, Auth(caller): Auth) -> ApiResult<HttpResponse> {
    let st = state(&req)?;
    let user = current_user(st, &caller).await?;
    let default_password =
        user.username == DEFAULT_ADMIN_USERNAME && st.auth.is_default_password(&user.password_hash).await?;
    Ok(HttpResponse::Ok().json(Me { data: MeUser::new(User::from(&user), default_password) }))
}

/// Inspect the Authorization header (always 200)
///
/// Public. It reports on the presented token rather than guarding anything.
#[utoipa::path(get, path = "/auth/verify", tag = "auth", responses((status = 200, body = Verification)))]
pub async fn verify(req: HttpRequest) -> ApiResult<HttpResponse> {
    let st = state(&req)?;
    let header = req.headers().get("authorization").and_then(|v| v.to_str().ok());
    let Some(token) = bearer_token(header) else {
        return Ok(HttpResponse::Ok().json(invalid("MISSING_TOKEN")));
    };
    match st.auth.verify(token, &st.pool).await.map_err(ApiError::from) {
        Ok(user) => Ok(HttpResponse::Ok().json(Verification {
            error: None,
            expires_at: Some(time::format(user.expires_at)),
            role: Some(RoleName::from(user.role)),
            username: Some(user.username),
            valid: true,
        })),
        Err(e) if matches!(e.code, ErrorCode::ServiceUnavailable | ErrorCode::Internal) => Err(e),
        Err(e) => Ok(HttpResponse::Ok().json(invalid(e.code.as_str()))),
    }
}

fn invalid(error: &'static str) -> Verification {
    Verification { error: Some(error), valid: false, ..Verification::default() }
}

pub fn routes(cfg: &mut web::ServiceConfig) {
    use crate::http::routing::{get, resource};
    cfg.service(resource("/auth/login", "POST").route(web::post().to(login)))
        .service(resource("/auth/refresh", "POST").route(web::post().to(refresh)))
        .service(resource("/auth/logout", "POST").route(web::post().to(logout)))
        .service(resource("/auth/me", "GET, HEAD").route(get().to(me)))
        .service(resource("/auth/verify", "GET, HEAD").route(get().to(verify)));
}
