//! Form specifications (API.md 11.1).

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::{json, Value};

use crate::actors::bundle_store::NewFormSpec;
use crate::db::formspecs::{self as db_specs, FormSpecRow, Registration};
use crate::domain::formspec::{check_content, is_valid_identifier};
use crate::domain::role::Role;
use crate::domain::time;
use crate::error::{ApiError, ApiResult, ErrorCode, ItemProblem};
use crate::http::extract::{path_param, state, Auth, Fields, JsonBody};

fn spec_json(spec: &FormSpecRow) -> Value {
    json!({
        "formType": spec.form_type,
        "form_type": spec.form_type,
        "version": spec.version,
        "schema": spec.schema,
        "uischema": spec.uischema,
        "created_at": time::format(spec.created_at),
        "source": spec.source,
    })
}

/// A required identifier field: a string of 1 to 255 characters without `/`.
fn identifier<'a>(fields: &Fields<'a>, aliases: &[&str]) -> ApiResult<&'a str> {
    let value = fields.req_str(aliases)?;
    if !is_valid_identifier(value) {
        let key = aliases.first().copied().unwrap_or("field");
        return Err(ApiError::bad_request(format!("'{key}' must be 1 to 255 characters without '/'"))
            .with_path(&format!("/{key}")));
    }
    Ok(value)
}

/// A required field of any JSON type (its content is checked afterwards, with 422s).
fn required<'a>(fields: &Fields<'a>, aliases: &[&str]) -> ApiResult<&'a Value> {
    aliases.iter().find_map(|key| fields.get(key).filter(|v| !v.is_null())).ok_or_else(|| {
        let key = aliases.first().copied().unwrap_or("field");
        ApiError::bad_request(format!("'{key}' is required")).with_path(&format!("/{key}"))
    })
}

/// Register a form spec version
///
/// Role: admin.
#[utoipa::path(post, path = "/formspecs", tag = "formspecs", request_body = Object,
    responses((status = 200, body = Object), (status = 201, body = Object), (status = 400), (status = 409),
        (status = 422)),
    security(("bearerAuth" = [])))]
pub async fn create(
    req: HttpRequest,
    Auth(caller): Auth,
    JsonBody(body): JsonBody,
) -> ApiResult<HttpResponse> {
    caller.require(Role::Admin)?;
    let st = state(&req)?;
    let fields = Fields::of(&body)?;
    let form_type = identifier(&fields, &["formType", "form_type"])?;
    let version = identifier(&fields, &["version"])?;
    let schema = required(&fields, &["schema"])?;
    let uischema = required(&fields, &["uischema", "uiSchema", "ui_schema"])?;
    let problems = check_content(schema, uischema);
    if !problems.is_empty() {
        let message = format!("The form spec content is invalid: {} problem(s)", problems.len());
        let errors = problems.into_iter().map(|p| ItemProblem::new(p.path, p.code, p.message)).collect();
        return Err(ApiError::new(ErrorCode::ValidationFailed, message).with_errors(errors));
    }
    let spec = NewFormSpec {
        form_type: form_type.to_string(),
        version: version.to_string(),
        schema: schema.clone(),
        uischema: uischema.clone(),
    };
    match st.actors.bundles.register_form_spec(spec).await? {
        Registration::Created(spec) => Ok(HttpResponse::Created().json(spec_json(&spec))),
        Registration::Identical(spec) => Ok(HttpResponse::Ok().json(spec_json(&spec))),
        Registration::Conflict(_) => Err(ApiError::new(
            ErrorCode::Conflict,
            format!("Form spec {form_type} version {version} already exists with different content"),
        )),
    }
}

/// Latest version of each form
///
/// Role: read-only or above.
#[utoipa::path(get, path = "/formspecs", tag = "formspecs",
    responses((status = 200, body = Object)),
    security(("bearerAuth" = [])))]
pub async fn list(req: HttpRequest, Auth(caller): Auth) -> ApiResult<HttpResponse> {
    caller.require(Role::ReadOnly)?;
    let db = state(&req)?.pool.get().await?;
    let specs: Vec<Value> = db_specs::list(&db)
        .await?
        .iter()
        .map(|s| {
            json!({"formType": s.form_type, "form_type": s.form_type, "version": s.version,
                   "created_at": time::format(s.created_at), "source": s.source})
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({ "formspecs": specs })))
}

/// A form's versions
///
/// Role: read-only or above.
#[utoipa::path(get, path = "/formspecs/{form_type}", tag = "formspecs",
    params(("form_type" = String, Path, description = "A form type")), responses((status = 200, body = Object), (status = 400), (status = 404)),
    security(("bearerAuth" = [])))]
pub async fn versions(req: HttpRequest, Auth(caller): Auth) -> ApiResult<HttpResponse> {
    caller.require(Role::ReadOnly)?;
    let form_type = path_param(&req, "form_type")?;
    let db = state(&req)?.pool.get().await?;
    let versions = db_specs::versions_of(&db, &form_type).await?;
    if versions.is_empty() {
        return Err(ApiError::not_found(format!("No form specs for form type '{form_type}'")));
    }
    let items: Vec<Value> = versions
        .iter()
        .map(|s| json!({"version": s.version, "created_at": time::format(s.created_at), "source": s.source}))
        .collect();
    Ok(HttpResponse::Ok().json(json!({"formType": form_type, "form_type": form_type, "versions": items})))
}

/// One form spec
///
/// Role: read-only or above.
#[utoipa::path(get, path = "/formspecs/{form_type}/{version}", tag = "formspecs",
    params(("form_type" = String, Path, description = "A form type"), ("version" = String, Path, description = "A form spec version")),
    responses((status = 200, body = Object), (status = 400), (status = 404)),
    security(("bearerAuth" = [])))]
pub async fn get_one(req: HttpRequest, Auth(caller): Auth) -> ApiResult<HttpResponse> {
    caller.require(Role::ReadOnly)?;
    let form_type = path_param(&req, "form_type")?;
    let version = path_param(&req, "version")?;
    let db = state(&req)?.pool.get().await?;
    let spec = db_specs::get(&db, &form_type, &version)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("Form spec {form_type} version {version} not found")))?;
    Ok(HttpResponse::Ok().json(spec_json(&spec)))
}

pub fn routes(cfg: &mut web::ServiceConfig) {
    use crate::http::routing::{get, resource};
    cfg.service(
        resource("/formspecs", "GET, HEAD, POST").route(get().to(list)).route(web::post().to(create)),
    )
    .service(resource("/formspecs/{form_type}", "GET, HEAD").route(get().to(versions)))
    .service(resource("/formspecs/{form_type}/{version}", "GET, HEAD").route(get().to(get_one)));
}
