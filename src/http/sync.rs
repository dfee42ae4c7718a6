//! Push and pull (API.md 8): decode the dialect, authorize, hand pushes to the ChangeLog actor,
//! read pull pages straight from the pool.

use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::Value;

use crate::actors::change_log::Push;
use crate::db::records;
use crate::domain::api_version::ApiVersion;
use crate::domain::role::Role;
use crate::domain::sync::decode::{decode_pull, decode_pull_query, decode_push, PullQuery};
use crate::domain::sync::{encode, Dialect, PullPage, PullRequest};
use crate::error::{ApiError, ApiResult};
use crate::http::context::X_API_VERSION_USED;
use crate::http::extract::{api_version, state, Auth, JsonBody};
use crate::state::AppState;

static X_IDEMPOTENT_REPLAY: HeaderName = HeaderName::from_static("x-idempotent-replay");

/// The query string as ordered pairs (repeated keys kept).
pub fn query_pairs(req: &HttpRequest) -> Vec<(String, String)> {
    form_urlencoded::parse(req.query_string().as_bytes()).into_owned().collect()
}

fn dialect_response(dialect: Dialect, body: &Value) -> HttpResponse {
    let mut res = HttpResponse::Ok().json(body);
    res.headers_mut()
        .insert(X_API_VERSION_USED.clone(), HeaderValue::from_static(dialect.api_version_used()));
    res
}

pub async fn push(req: HttpRequest, Auth(caller): Auth, JsonBody(body): JsonBody) -> ApiResult<HttpResponse> {
    caller.require(Role::ReadWrite)?;
    let st = state(&req)?;
    let request = decode_push(&body)?;
    let fingerprint = request.fingerprint();
    let dialect = request.dialect;
    let outcome = st
        .actors
        .change_log
        .send(Push {
            client_id: request.client_id,
            transmission_id: request.transmission_id,
            fingerprint,
            records: request.records,
            warnings: request.warnings,
            pushed_by: caller.username,
        })
        .await
        .map_err(|e| ApiError::internal(format!("change log unavailable: {e}")))??;
    let mut res = dialect_response(dialect, &encode::push_response(dialect, &outcome.result));
    if outcome.replayed {
        res.headers_mut().insert(X_IDEMPOTENT_REPLAY.clone(), HeaderValue::from_static("true"));
    }
    Ok(res)
}

async fn pull_page(st: &AppState, pull: &PullRequest) -> ApiResult<PullPage> {
    let db = st.pool.get().await?;
    let (head, mut found) = records::pull_page(&db, pull.after, &pull.types, pull.limit).await?;
    let has_more = found.len() as i64 > pull.limit;
    found.truncate(pull.limit as usize);
    Ok(PullPage { records: found, head, has_more, types: pull.types.clone() })
}

pub async fn pull(req: HttpRequest, Auth(caller): Auth, JsonBody(body): JsonBody) -> ApiResult<HttpResponse> {
    caller.require(Role::ReadOnly)?;
    let st = state(&req)?;
    let pairs = query_pairs(&req);
    let get = |k: &str| pairs.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
    let query = PullQuery {
        limit: get("limit"),
        page_token: get("page_token"),
        schema_types: pairs.iter().filter(|(k, _)| k == "schemaType").map(|(_, v)| v.clone()).collect(),
    };
    let pull = decode_pull(&body, &query)?;
    let page = pull_page(st, &pull).await?;
    Ok(dialect_response(pull.dialect, &encode::pull_response(pull.dialect, &page)))
}

/// `GET /sync/pull`: the spec shape unless `x-api-version: 1.0.x` asks for the synkronus one.
pub async fn pull_get(req: HttpRequest, Auth(caller): Auth) -> ApiResult<HttpResponse> {
    caller.require(Role::ReadOnly)?;
    let st = state(&req)?;
    let dialect = match api_version(&req) {
        ApiVersion::V1_0 => Dialect::Synkronus,
        ApiVersion::V1_1 => Dialect::Spec,
    };
    let pull = decode_pull_query(&query_pairs(&req), dialect)?;
    let page = pull_page(st, &pull).await?;
    Ok(dialect_response(dialect, &encode::pull_response(dialect, &page)))
}

pub fn routes(cfg: &mut web::ServiceConfig) {
    use crate::http::routing::{get, resource};
    cfg.service(resource("/sync/push", "POST").route(web::post().to(push))).service(
        resource("/sync/pull", "GET, HEAD, POST").route(web::post().to(pull)).route(get().to(pull_get)),
    );
}
