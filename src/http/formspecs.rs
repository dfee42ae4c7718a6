//! Form specifications (docs/api.md §11.1).

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::Value;

use crate::actors::bundle_store::NewFormSpec;
use crate::db::formspecs::{self as db_specs, Registration};
use crate::domain::formspec::{check_content, is_valid_identifier};
use crate::domain::role::Role;
use crate::domain::time;
use crate::error::{ApiError, ApiResult, ErrorCode, ItemProblem};
use crate::http::extract::{audit_origin, state, Auth, JsonBody, PathParams};
use crate::http::wire::formspecs::{
    FormSpec, FormSpecList, FormSpecListed, FormSpecRequest, FormSpecVersion, FormSpecVersions,
};
use crate::http::wire::{self, Text};

/// A required identifier field: a string of 1 to 255 characters without `/`.
fn identifier<'a>(spellings: &[(&'a Text, &str)]) -> ApiResult<&'a str> {
    let value = wire::required_of(spellings)?;
    if !is_valid_identifier(value) {
        let key = spellings.first().map(|(_, key)| *key).unwrap_or("field");
        return Err(ApiError::bad_request(format!("'{key}' must be 1 to 255 characters without '/'"))
            .with_path(&format!("/{key}")));
    }
    Ok(value)
}

/// A required field of any JSON type (its content is checked afterwards, with 422s).
fn required<'a>(spellings: &[(&'a Option<Value>, &str)]) -> ApiResult<&'a Value> {
    spellings.iter().find_map(|(value, _)| value.as_ref()).ok_or_else(|| {
        let key = spellings.first().map(|(_, key)| *key).unwrap_or("field");
        ApiError::bad_request(format!("'{key}' is required")).with_path(&format!("/{key}"))
    })
}

/// Register a form spec version
///
/// Role: admin.
#[utoipa::path(post, path = "/formspecs", tag = "formspecs", request_body = FormSpecRequest,
    responses((status = 200, body = FormSpec), (status = 201, body = FormSpec), (status = 400), (status = 409),
        (status = 422)),
    security(("bearerAuth" = [])))]
pub async fn create(
    req: HttpRequest,
    Auth(caller): Auth,
    JsonBody(body): JsonBody,
) -> ApiResult<HttpResponse> {
    caller.require(Role::Admin)?;
    let st = state(&req)?;
    let body: FormSpecRequest = wire::object(&body)?;
    let form_type = identifier(&[(&body.form_type_camel, "formType"), (&body.form_type, "form_type")])?;
    let version = identifier(&[(&body.version, "version")])?;
    let schema = required(&[(&body.schema, "schema")])?;
    let uischema = required(&[
        (&body.uischema, "uischema"),
        (&body.uischema_camel, "uiSchema"),
        (&body.uischema_snake, "ui_schema"),
    ])?;
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
    match st.actors.bundles.register_form_spec(spec, audit_origin(&req, st, &caller.username)).await? {
        Registration::Created(spec) => Ok(HttpResponse::Created().json(FormSpec::from(&spec))),
        Registration::Identical(spec) => Ok(HttpResponse::Ok().json(FormSpec::from(&spec))),
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
    responses((status = 200, body = FormSpecList)),
    security(("bearerAuth" = [])))]
pub async fn list(req: HttpRequest, Auth(caller): Auth) -> ApiResult<HttpResponse> {
    caller.require(Role::ReadOnly)?;
    let db = state(&req)?.pool.get().await?;
    let formspecs = db_specs::list(&db).await?.iter().map(FormSpecListed::from).collect();
    Ok(HttpResponse::Ok().json(FormSpecList { formspecs }))
}

/// A form's versions
///
/// Role: read-only or above.
#[utoipa::path(get, path = "/formspecs/{form_type}", tag = "formspecs",
    params(("form_type" = String, Path, description = "A form type")), responses((status = 200, body = FormSpecVersions), (status = 400), (status = 404)),
    security(("bearerAuth" = [])))]
pub async fn versions(
    req: HttpRequest,
    Auth(caller): Auth,
    PathParams(form_type): PathParams<String>,
) -> ApiResult<HttpResponse> {
    caller.require(Role::ReadOnly)?;
    let db = state(&req)?.pool.get().await?;
    let versions = db_specs::versions_of(&db, &form_type).await?;
    if versions.is_empty() {
        return Err(ApiError::not_found(format!("No form specs for form type '{form_type}'")));
    }
    let versions = versions
        .iter()
        .map(|s| FormSpecVersion {
            created_at: time::format(s.created_at),
            source: s.source.clone(),
            version: s.version.clone(),
        })
        .collect();
    Ok(HttpResponse::Ok().json(FormSpecVersions { form_type_camel: form_type.clone(), form_type, versions }))
}

/// One form spec
///
/// Role: read-only or above.
#[utoipa::path(get, path = "/formspecs/{form_type}/{version}", tag = "formspecs",
    params(("form_type" = String, Path, description = "A form type"), ("version" = String, Path, description = "A form spec version")),
    responses((status = 200, body = FormSpec), (status = 400), (status = 404)),
    security(("bearerAuth" = [])))]
pub async fn get_one(
    req: HttpRequest,
    Auth(caller): Auth,
    PathParams((form_type, version)): PathParams<(String, String)>,
) -> ApiResult<HttpResponse> {
    caller.require(Role::ReadOnly)?;
    let db = state(&req)?.pool.get().await?;
    let spec = db_specs::get(&db, &form_type, &version)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("Form spec {form_type} version {version} not found")))?;
    Ok(HttpResponse::Ok().json(FormSpec::from(&spec)))
}

pub fn routes(cfg: &mut web::ServiceConfig) {
    use crate::http::routing::{get, resource};
    cfg.service(
        resource("/formspecs", "GET, HEAD, POST").route(get().to(list)).route(web::post().to(create)),
    )
    .service(resource("/formspecs/{form_type}", "GET, HEAD").route(get().to(versions)))
    .service(resource("/formspecs/{form_type}/{version}", "GET, HEAD").route(get().to(get_one)));
}
