//! Users (API.md 7) and the user JSON object shared with auth responses.

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::auth::AuthUser;
use crate::db::presence;
use crate::db::users::{self as db_users, UserRow, UserUpdate};
use crate::domain::role::Role;
use crate::domain::{time, user as rules};
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::http::extract::{path_param, state, Auth, Fields, JsonBody};
use crate::state::AppState;

/// The user object of API.md 7.1 (never the password).
pub fn user_json(u: &UserRow) -> Value {
    json!({
        "id": u.id.to_string(),
        "username": u.username,
        "email": u.email,
        "role": u.role.as_str(),
        "roles": [u.role.as_str()],
        "created_at": time::format(u.created_at),
        "createdAt": time::format(u.created_at),
        "last_login": u.last_login.map(time::format),
    })
}

fn weak_password() -> ApiError {
    ApiError::of(ErrorCode::WeakPassword)
}

fn parse_role(raw: &str) -> ApiResult<Role> {
    Role::parse(raw).ok_or_else(|| {
        ApiError::bad_request(format!("Unknown role '{raw}'; use read-only, read-write or admin"))
            .with_path("/role")
    })
}

fn parse_email(fields: &Fields) -> ApiResult<Option<Option<String>>> {
    if !fields.has("email") {
        return Ok(None);
    }
    match fields.get("email") {
        Some(Value::Null) | None => Ok(Some(None)),
        Some(Value::String(e)) => {
            rules::validate_email(e).map_err(|p| ApiError::bad_request(p.0).with_path("/email"))?;
            Ok(Some(Some(e.clone())))
        }
        Some(_) => Err(ApiError::bad_request("'email' must be a string or null").with_path("/email")),
    }
}

pub async fn list(req: HttpRequest, Auth(caller): Auth) -> ApiResult<HttpResponse> {
    caller.require(Role::Admin)?;
    let st = state(&req)?;
    let db = st.pool.get().await?;
    let users = db_users::list(&db).await?;
    let mut devices = presence::all_by_user(&db).await?;
    let items: Vec<Value> = users
        .iter()
        .map(|u| {
            let mut item = user_json(u);
            item["presence"] = presence_json(devices.remove(&u.username).unwrap_or_default());
            item
        })
        .collect();
    Ok(HttpResponse::Ok().json(items))
}

/// `presence` of a user in `GET /users` (API.md 17.4): null when never seen.
fn presence_json(devices: Vec<presence::DeviceRow>) -> Value {
    let Some(last) = devices.iter().map(|d| d.last_seen_at).max() else {
        return Value::Null;
    };
    let clients: Vec<Value> = devices
        .iter()
        .map(|d| {
            json!({
                "clientId": d.client_id,
                "lastSeenAt": time::format(d.last_seen_at),
                "lastDataVersion": d.last_data_version,
                "appBundleVersion": d.app_bundle_version,
                "lastOdeVersion": d.client_version,
            })
        })
        .collect();
    json!({"lastSeenAt": time::format(last), "clientCount": clients.len(), "clients": clients})
}

pub async fn create(
    req: HttpRequest,
    Auth(caller): Auth,
    JsonBody(body): JsonBody,
) -> ApiResult<HttpResponse> {
    caller.require(Role::Admin)?;
    let st = state(&req)?;
    let f = Fields::of(&body)?;
    let username = f.req_str(&["username"])?;
    let password = f.req_str(&["password"])?;
    let role = parse_role(f.req_str(&["role"])?)?;
    rules::validate_username(username).map_err(|p| ApiError::bad_request(p.0).with_path("/username"))?;
    let email = parse_email(&f)?.flatten();
    if !rules::is_strong_enough(password) {
        return Err(weak_password());
    }
    let hash = st.auth.hash_password(password.to_string()).await?;
    let db = st.pool.get().await?;
    let user = db_users::insert(&db, username, email.as_deref(), &hash, role).await?;
    Ok(HttpResponse::Created().json(user_json(&user)))
}

pub async fn get_one(req: HttpRequest, Auth(caller): Auth) -> ApiResult<HttpResponse> {
    let username = path_param(&req, "username")?;
    if caller.username != username {
        caller.require(Role::Admin)?;
    }
    let st = state(&req)?;
    let db = st.pool.get().await?;
    let user = db_users::find_by_username(&db, &username)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("User '{username}' not found")))?;
    Ok(HttpResponse::Ok().json(user_json(&user)))
}

pub async fn update(
    req: HttpRequest,
    Auth(caller): Auth,
    JsonBody(body): JsonBody,
) -> ApiResult<HttpResponse> {
    caller.require(Role::Admin)?;
    let st = state(&req)?;
    let username = path_param(&req, "username")?;
    let f = Fields::of(&body)?;
    let role = f.opt_str(&["role"])?.map(parse_role).transpose()?;
    let email = parse_email(&f)?;
    let password_hash = match f.opt_str(&["password"])? {
        None => None,
        Some(p) if !rules::is_strong_enough(p) => return Err(weak_password()),
        Some(p) => Some(st.auth.hash_password(p.to_string()).await?),
    };
    let mut db = st.pool.get().await?;
    let user = db_users::update(&mut db, &username, UserUpdate { role, email, password_hash })
        .await?
        .ok_or_else(|| ApiError::not_found(format!("User '{username}' not found")))?;
    st.auth.forget_cached_checks();
    Ok(HttpResponse::Ok().json(user_json(&user)))
}

pub async fn delete(req: HttpRequest, Auth(caller): Auth) -> ApiResult<HttpResponse> {
    caller.require(Role::Admin)?;
    let st = state(&req)?;
    let key = path_param(&req, "username")?;
    let mut db = st.pool.get().await?;
    let user = match db_users::find_by_username(&db, &key).await? {
        Some(u) => Some(u),
        None => match Uuid::parse_str(&key) {
            Ok(id) => db_users::find_by_id(&db, id).await?,
            Err(_) => None,
        },
    };
    let user = user.ok_or_else(|| ApiError::not_found(format!("User '{key}' not found")))?;
    if !db_users::delete(&mut db, user.id).await? {
        return Err(ApiError::not_found(format!("User '{key}' not found")));
    }
    st.auth.forget_cached_checks();
    tracing::info!(deleted = %user.username, by = %caller.username, "user deleted");
    Ok(HttpResponse::Ok().json(json!({"message": "User deleted successfully"})))
}

pub async fn reset_password(
    req: HttpRequest,
    Auth(caller): Auth,
    JsonBody(body): JsonBody,
) -> ApiResult<HttpResponse> {
    caller.require(Role::Admin)?;
    let st = state(&req)?;
    let f = Fields::of(&body)?;
    let username = f.req_str(&["username"])?;
    let new_password = f.req_str(&["new_password", "newPassword"])?;
    if !rules::is_strong_enough(new_password) {
        return Err(weak_password());
    }
    let mut db = st.pool.get().await?;
    let user = db_users::find_by_username(&db, username)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("User '{username}' not found")))?;
    let hash = st.auth.hash_password(new_password.to_string()).await?;
    db_users::set_password(&mut db, user.id, &hash).await?;
    st.auth.forget_cached_checks();
    Ok(HttpResponse::Ok().json(json!({"message": "Password reset successfully"})))
}

pub async fn change_password(
    req: HttpRequest,
    Auth(caller): Auth,
    JsonBody(body): JsonBody,
) -> ApiResult<HttpResponse> {
    let st = state(&req)?;
    let f = Fields::of(&body)?;
    let current = f.req_str(&["current_password", "currentPassword", "oldPassword"])?;
    let new_password = f.req_str(&["new_password", "newPassword"])?;
    if !rules::is_strong_enough(new_password) {
        return Err(weak_password());
    }
    let user = current_user(st, &caller).await?;
    if !st.auth.verify_password(current.to_string(), Some(user.password_hash.clone())).await? {
        return Err(ApiError::of(ErrorCode::InvalidPassword));
    }
    let hash = st.auth.hash_password(new_password.to_string()).await?;
    // Taken only now: holding a connection across two bcrypt runs (or while current_user takes a
    // second one) starves the pool under load.
    let mut db = st.pool.get().await?;
    db_users::set_password(&mut db, user.id, &hash).await?;
    st.auth.forget_cached_checks();
    Ok(HttpResponse::Ok().json(json!({"message": "Password changed successfully"})))
}

/// The caller's own row; a token can outlive its user by at most the revocation cache TTL.
pub async fn current_user(st: &AppState, caller: &AuthUser) -> ApiResult<UserRow> {
    let db = st.pool.get().await?;
    db_users::find_by_id(&db, caller.id).await?.ok_or_else(|| ApiError::of(ErrorCode::InvalidToken))
}

pub fn routes(cfg: &mut web::ServiceConfig) {
    use crate::http::routing::{get, resource};
    cfg.service(resource("/users", "GET, HEAD, POST").route(get().to(list)).route(web::post().to(create)))
        .service(resource("/users/create", "POST").route(web::post().to(create)))
        .service(resource("/users/reset-password", "POST").route(web::post().to(reset_password)))
        .service(resource("/users/change-password", "POST").route(web::post().to(change_password)))
        .service(resource("/users/delete/{username}", "DELETE").route(web::delete().to(delete)))
        .service(
            resource("/users/{username}", "GET, HEAD, PUT, DELETE")
                .route(get().to(get_one))
                .route(web::put().to(update))
                .route(web::delete().to(delete)),
        );
}
