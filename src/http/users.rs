//! Users (docs/api.md §7) and the user JSON object shared with auth responses.

use actix_web::{web, HttpRequest, HttpResponse};
use uuid::Uuid;

use crate::db::presence;
use crate::db::users::{self as db_users, UserUpdate};
use crate::domain::audit::Action;
use crate::domain::role::Role;
use crate::domain::scope::UserAttributes;
use crate::domain::user as rules;
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::http::common::current_user;
use crate::http::extract::{audit_origin, state, Auth, JsonBody, PathParams};
use crate::http::wire::users::{
    ChangePassword, CreateUser, ListedUser, Presence, ResetPassword, UpdateUser, User,
};
use crate::http::wire::{self, Message, Text};

fn weak_password() -> ApiError {
    ApiError::of(ErrorCode::WeakPassword)
}

fn parse_role(raw: &str) -> ApiResult<Role> {
    Role::parse(raw).ok_or_else(|| {
        ApiError::bad_request(format!("Unknown role '{raw}'; use read-only, read-write or admin"))
            .with_path("/role")
    })
}

/// `None` when the body leaves the address alone, `Some(None)` when it removes it.
fn parse_email(email: &Text) -> ApiResult<Option<Option<String>>> {
    match email {
        Text::Absent => Ok(None),
        Text::Null => Ok(Some(None)),
        Text::Given(e) => {
            rules::validate_email(e).map_err(|p| ApiError::bad_request(p.0).with_path("/email"))?;
            Ok(Some(Some(e.clone())))
        }
        Text::NotString => Err(ApiError::bad_request("'email' must be a string or null").with_path("/email")),
    }
}

/// List users
///
/// Role: admin.
#[utoipa::path(get, path = "/users", tag = "users", responses((status = 200, body = [ListedUser])),
    security(("bearerAuth" = [])))]
pub async fn list(req: HttpRequest, Auth(caller): Auth) -> ApiResult<HttpResponse> {
    caller.require(Role::Admin)?;
    let st = state(&req)?;
    let db = st.pool.get().await?;
    let users = db_users::list(&db).await?;
    let mut devices = presence::all_by_user(&db).await?;
    let items: Vec<ListedUser> = users
        .iter()
        .map(|u| {
            let devices = devices.remove(&u.username).unwrap_or_default();
            ListedUser::new(User::from(u), Presence::of(&devices))
        })
        .collect();
    Ok(HttpResponse::Ok().json(items))
}

/// Create a user
///
/// Role: admin.
#[utoipa::path(post, path = "/users", tag = "users", request_body = CreateUser,
    responses((status = 201, body = User), (status = 400), (status = 409)), security(("bearerAuth" = [])))]
pub async fn create(
    req: HttpRequest,
    Auth(caller): Auth,
    JsonBody(body): JsonBody,
) -> ApiResult<HttpResponse> {
    caller.require(Role::Admin)?;
    let st = state(&req)?;
    let body: CreateUser = wire::object(&body)?;
    let username = body.username.required("username")?;
    let password = body.password.required("password")?;
    let role = parse_role(body.role.required("role")?)?;
    rules::validate_username(username).map_err(|p| ApiError::bad_request(p.0).with_path("/username"))?;
    let email = parse_email(&body.email)?.flatten();
    if !rules::is_strong_enough(password) {
        return Err(weak_password());
    }
    let hash = st.auth.hash_password(password.to_string()).await?;
    let origin = audit_origin(&req, st, &caller.username);
    let mut db = st.pool.get().await?;
    let user = db_users::create(&mut db, username, email.as_deref(), &hash, role, &origin).await?;
    Ok(HttpResponse::Created().json(User::from(&user)))
}

/// Create a user (Synkronus 1.0 path)
///
/// Role: admin.
#[utoipa::path(post, path = "/users/create", tag = "users", request_body = CreateUser,
    responses((status = 201, body = User), (status = 400), (status = 409)), security(("bearerAuth" = [])))]
pub async fn create_v1(req: HttpRequest, caller: Auth, body: JsonBody) -> ApiResult<HttpResponse> {
    create(req, caller, body).await
}

/// One user (admin, or oneself)
///
/// Role: read-only or above.
#[utoipa::path(get, path = "/users/{username}", tag = "users", params(("username" = String, Path, description = "A user name")),
    responses((status = 200, body = User), (status = 400), (status = 404)), security(("bearerAuth" = [])))]
pub async fn get_one(
    req: HttpRequest,
    Auth(caller): Auth,
    PathParams(username): PathParams<String>,
) -> ApiResult<HttpResponse> {
    if caller.username != username {
        caller.require(Role::Admin)?;
    }
    let st = state(&req)?;
    let db = st.pool.get().await?;
    let user = db_users::find_by_username(&db, &username)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("User '{username}' not found")))?;
    Ok(HttpResponse::Ok().json(User::from(&user)))
}

/// Change a user's role, email, password or attributes
///
/// Role: admin.
#[utoipa::path(put, path = "/users/{username}", tag = "users", params(("username" = String, Path, description = "A user name")),
    request_body = UpdateUser, responses((status = 200, body = User), (status = 400), (status = 404), (status = 409)),
    security(("bearerAuth" = [])))]
pub async fn update(
    req: HttpRequest,
    Auth(caller): Auth,
    PathParams(username): PathParams<String>,
    JsonBody(body): JsonBody,
) -> ApiResult<HttpResponse> {
    caller.require(Role::Admin)?;
    let st = state(&req)?;
    let body: UpdateUser = wire::object(&body)?;
    let role = body.role.optional("role")?.map(parse_role).transpose()?;
    let email = parse_email(&body.email)?;
    let password_hash = match body.password.optional("password")? {
        None => None,
        Some(p) if !rules::is_strong_enough(p) => return Err(weak_password()),
        Some(p) => Some(st.auth.hash_password(p.to_string()).await?),
    };
    let attributes = body
        .attributes
        .as_ref()
        .map(|raw| UserAttributes::parse(raw).map_err(invalid_attributes))
        .transpose()?;
    let origin = audit_origin(&req, st, &caller.username);
    let mut db = st.pool.get().await?;
    let change = UserUpdate { role, email, password_hash, attributes };
    let user = db_users::update(&mut db, &username, change, &origin)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("User '{username}' not found")))?;
    st.auth.forget_cached_checks();
    Ok(HttpResponse::Ok().json(User::from(&user)))
}

/// Delete a user (by name or id)
///
/// Role: admin.
#[utoipa::path(delete, path = "/users/{username}", tag = "users", params(("username" = String, Path, description = "A user name")),
    responses((status = 200, body = Message), (status = 400), (status = 404), (status = 409)),
    security(("bearerAuth" = [])))]
pub async fn delete(
    req: HttpRequest,
    Auth(caller): Auth,
    PathParams(key): PathParams<String>,
) -> ApiResult<HttpResponse> {
    caller.require(Role::Admin)?;
    let st = state(&req)?;
    let mut db = st.pool.get().await?;
    let user = match db_users::find_by_username(&db, &key).await? {
        Some(u) => Some(u),
        None => match Uuid::parse_str(&key) {
            Ok(id) => db_users::find_by_id(&db, id).await?,
            Err(_) => None,
        },
    };
    let user = user.ok_or_else(|| ApiError::not_found(format!("User '{key}' not found")))?;
    let details = serde_json::json!({"role": user.role.as_str()});
    let entry =
        audit_origin(&req, st, &caller.username).entry(Action::UserDeleted, Some(&user.username), details);
    if !db_users::delete(&mut db, user.id, &entry).await? {
        return Err(ApiError::not_found(format!("User '{key}' not found")));
    }
    st.auth.forget_cached_checks();
    tracing::info!(deleted = %user.username, by = %caller.username, "user deleted");
    Ok(HttpResponse::Ok().json(Message { message: "User deleted successfully" }))
}

/// Delete a user (Synkronus 1.0 path)
///
/// Role: admin.
#[utoipa::path(delete, path = "/users/delete/{username}", tag = "users", params(("username" = String, Path, description = "A user name")),
    responses((status = 200, body = Message), (status = 400), (status = 404), (status = 409)),
    security(("bearerAuth" = [])))]
pub async fn delete_v1(req: HttpRequest, caller: Auth, key: PathParams<String>) -> ApiResult<HttpResponse> {
    delete(req, caller, key).await
}

/// Set another user's password
///
/// Role: admin.
#[utoipa::path(post, path = "/users/reset-password", tag = "users", request_body = ResetPassword,
    responses((status = 200, body = Message), (status = 400), (status = 404)), security(("bearerAuth" = [])))]
pub async fn reset_password(
    req: HttpRequest,
    Auth(caller): Auth,
    JsonBody(body): JsonBody,
) -> ApiResult<HttpResponse> {
    caller.require(Role::Admin)?;
    let st = state(&req)?;
    let body: ResetPassword = wire::object(&body)?;
    let username = body.username.required("username")?;
    let new_password = body.new_password()?;
    if !rules::is_strong_enough(new_password) {
        return Err(weak_password());
    }
    let mut db = st.pool.get().await?;
    let user = db_users::find_by_username(&db, username)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("User '{username}' not found")))?;
    let hash = st.auth.hash_password(new_password.to_string()).await?;
    let entry = audit_origin(&req, st, &caller.username).entry(
        Action::PasswordReset,
        Some(&user.username),
        serde_json::json!({}),
    );
    db_users::set_password(&mut db, user.id, &hash, &entry).await?;
    st.auth.forget_cached_checks();
    Ok(HttpResponse::Ok().json(Message { message: "Password reset successfully" }))
}

/// Change one's own password
///
/// Role: read-only or above.
#[utoipa::path(post, path = "/users/change-password", tag = "users", request_body = ChangePassword,
    responses((status = 200, body = Message), (status = 400)), security(("bearerAuth" = [])))]
pub async fn change_password(
    req: HttpRequest,
    Auth(caller): Auth,
    JsonBody(body): JsonBody,
) -> ApiResult<HttpResponse> {
    let st = state(&req)?;
    let body: ChangePassword = wire::object(&body)?;
    let current = body.current_password()?;
    let new_password = body.new_password()?;
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
    let entry = audit_origin(&req, st, &caller.username).entry(
        Action::PasswordChanged,
        Some(&user.username),
        serde_json::json!({}),
    );
    let mut db = st.pool.get().await?;
    db_users::set_password(&mut db, user.id, &hash, &entry).await?;
    st.auth.forget_cached_checks();
    Ok(HttpResponse::Ok().json(Message { message: "Password changed successfully" }))
}

pub fn routes(cfg: &mut web::ServiceConfig) {
    use crate::http::routing::{get, resource};
    cfg.service(resource("/users", "GET, HEAD, POST").route(get().to(list)).route(web::post().to(create)))
        .service(resource("/users/create", "POST").route(web::post().to(create_v1)))
        .service(resource("/users/reset-password", "POST").route(web::post().to(reset_password)))
        .service(resource("/users/change-password", "POST").route(web::post().to(change_password)))
        .service(resource("/users/delete/{username}", "DELETE").route(web::delete().to(delete_v1)))
        .service(
            resource("/users/{username}", "GET, HEAD, PUT, DELETE")
                .route(get().to(get_one))
                .route(web::put().to(update))
                .route(web::delete().to(delete)),
        );
}

/// 400 naming each attribute that is not valid (docs/api.md §20.1).
fn invalid_attributes(problems: Vec<crate::error::ItemProblem>) -> ApiError {
    let first = problems.first().map(|p| p.message.clone()).unwrap_or_else(|| "Invalid attributes".into());
    ApiError::bad_request(first).with_errors(problems)
}
