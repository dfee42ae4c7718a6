//! Push and pull (docs/api.md §8): decode the dialect, authorize, hand pushes to the ChangeLog actor,
//! read pull pages straight from the pool.

use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::{web, HttpRequest, HttpResponse, HttpResponseBuilder};
use serde_json::Value;

use crate::actors::change_log::Push;
use crate::config::RecordValidation;
use crate::db::replicas::Target;
use crate::domain::api_version::ApiVersion;
use crate::domain::role::Role;
use crate::domain::sync::decode::{decode_pull, decode_pull_query, decode_push_body, PullQuery};
use crate::domain::sync::push_body::{PushBody, Received};
use crate::domain::sync::{encode, Dialect, PullRequest, PushRequest, Warning};
use crate::error::{ApiError, ApiResult, ErrorCode, ItemProblem};
use crate::http::common::{
    client_generation, generation_sent, query_pairs, report_sync, X_REPOSITORY_GENERATION,
};
use crate::http::compress::{self, negotiated};
use crate::http::context::{served_by, X_API_VERSION_USED};
use crate::http::extract::{api_version, malformed_json, parse_push_body, state, Auth, BodyBytes, JsonBody};
use crate::http::pull_body::{self, PageStart, StartedBody};
use crate::state::AppState;

static X_IDEMPOTENT_REPLAY: HeaderName = HeaderName::from_static("x-idempotent-replay");

fn dialect_response(dialect: Dialect, body: Vec<u8>, generation: i64) -> HttpResponse {
    dialect_builder(dialect, generation).body(body)
}

fn dialect_builder(dialect: Dialect, generation: i64) -> HttpResponseBuilder {
    let mut res = HttpResponse::Ok();
    res.content_type("application/json")
        .insert_header((X_API_VERSION_USED.clone(), HeaderValue::from_static(dialect.api_version_used())))
        .insert_header((X_REPOSITORY_GENERATION.clone(), HeaderValue::from(generation)));
    res
}

/// Push records, all or nothing, idempotent
///
/// Role: read-write or above.
#[utoipa::path(post, path = "/sync/push", tag = "sync", params(("x-repository-generation" = Option<String>, Header, description = "The repository generation the client holds (docs/api.md §17.2)")),
    request_body(content = ref("#/components/schemas/PushRequest")),
    responses((status = 200, body = ref("#/components/schemas/PushResponse")), (status = 400), (status = 409), (status = 422)),
    security(("bearerAuth" = [])))]
pub async fn push(req: HttpRequest, Auth(caller): Auth, body: BodyBytes) -> ApiResult<HttpResponse> {
    // The records stay JSON text until decoded one by one (docs/api.md §18.4); the body's room in
    // the budget is held until the change log has answered.
    let BodyBytes { bytes, permit } = body;
    // Malformed JSON is a 400 before any role check, as for every JSON body.
    let received =
        if bytes.iter().all(u8::is_ascii_whitespace) { None } else { Some(parse_push_body(&bytes)?) };
    caller.require(Role::ReadWrite)?;
    let st = state(&req)?;
    let (mut request, expected_generation) = decode_push_text(&req, received)?;
    drop(bytes);
    check_schemas(st, &mut request).await?;
    let fingerprint = request.fingerprint();
    let dialect = request.dialect;
    let client_id = request.client_id.clone();
    let outcome = st
        .actors
        .change_log
        .push(Push {
            client_id: request.client_id,
            transmission_id: request.transmission_id,
            fingerprint,
            records: request.records,
            warnings: request.warnings,
            pushed_by: caller.username.clone(),
            expected_generation,
        })
        .await?;
    drop(permit);
    report_sync(&req, st, &caller.username, &client_id, Some(outcome.result.head));
    let counts = (outcome.result.items.len(), outcome.result.refused.len());
    crate::monitoring::push_answered(dialect, counts, outcome.replayed);
    let result = &outcome.result;
    let body = encode::push_response(dialect, result).map_err(ApiError::internal)?;
    let mut res = dialect_response(dialect, body, result.repository_generation);
    if outcome.replayed {
        res.headers_mut().insert(X_IDEMPOTENT_REPLAY.clone(), HeaderValue::from_static("true"));
    }
    Ok(res)
}

/// The push and the repository generation its sender holds. An empty body is not an object.
fn decode_push_text(req: &HttpRequest, received: Option<Received>) -> ApiResult<(PushRequest, Option<i64>)> {
    let body = match received {
        Some(received) => received.split().map_err(malformed_json)?,
        None => PushBody::default(),
    };
    Ok((decode_push_body(&body)?, generation_sent(req, body.field("repository_generation"))))
}

/// RECORD_VALIDATION: `warn` adds SCHEMA_MISMATCH warnings, `reject` fails the push with 422.
async fn check_schemas(st: &AppState, request: &mut PushRequest) -> ApiResult<()> {
    if st.config.record_validation == RecordValidation::Off {
        return Ok(());
    }
    let failures = st.schemas.check(&st.pool, &request.records).await?;
    if failures.is_empty() {
        return Ok(());
    }
    if st.config.record_validation == RecordValidation::Reject {
        let list_path = if request.dialect == Dialect::Camel { "/changes/observations" } else { "/records" };
        let total = failures.len();
        let problems = failures
            .iter()
            .flat_map(|f| {
                f.errors.iter().map(move |e| {
                    let mut p = ItemProblem::new(
                        format!("{list_path}/{}/data{}", f.index, e["path"].as_str().unwrap_or("")),
                        "SCHEMA_MISMATCH",
                        e["message"].as_str().unwrap_or("schema mismatch"),
                    );
                    p.record_id = Some(f.record_id.clone());
                    p
                })
            })
            .collect();
        return Err(ApiError::new(
            ErrorCode::ValidationFailed,
            format!("{total} records do not match their form's JSON Schema; nothing was stored"),
        )
        .with_errors(problems));
    }
    for f in failures {
        request.warnings.push((f.index, Warning::schema_mismatch(&f.record_id, Value::Array(f.errors))));
    }
    Ok(())
}

/// Starts reading one page, from a replica when one has reached the client's cursor (docs/api.md
/// §18.3); a client holding another repository generation gets 409 instead. Both are decided on
/// the page's first row, which carries the head, before any byte of the answer is sent; a failure
/// up to the end of the first chunk is still an error answer (or, on a replica, a retry on the
/// primary).
async fn pull_page(
    st: &AppState,
    username: &str,
    pull: &PullRequest,
    client_generation: Option<i64>,
    gzip: bool,
) -> ApiResult<(PageStart, Target)> {
    // A replica still showing an older generation than the client's is behind, not a reason to
    // tell the client to reset.
    let position = |page: &PageStart| {
        if client_generation.is_some_and(|g| g > page.head.repository_generation) {
            -1
        } else {
            page.head.change_id
        }
    };
    let span = tracing::Span::current();
    let known_scoped = st.scoped_readers.knows(username);
    let served = st
        .reads
        .read_for_sync(username, Some(pull.after), position, move |db| {
            let user = (username.to_owned(), known_scoped);
            Box::pin(pull_body::start(db, user, pull.clone(), gzip, span.clone()))
        })
        .await?;
    st.scoped_readers.learn(username, served.value.read_scoped);
    crate::monitoring::pull_page_read(served.value.read_scoped);
    let generation = served.value.head.repository_generation;
    if client_generation.is_some_and(|g| g != generation) {
        return Err(ApiError::reset_required(generation));
    }
    if pull.after == 0 {
        // The device holds nothing: the redeliveries this page's snapshot shows are not its own
        // (docs/architecture.md). The snapshot's head, not the primary's: a replica may be behind.
        let head = served.value.head.change_id;
        crate::db::scope::devices::started_fresh(&st.pool.get().await?, username, &pull.client_id, head)
            .await?;
    }
    Ok((served.value, served.by))
}

/// The page whole when it fitted in one chunk (gzipped as any JSON answer); else streamed,
/// chunk by chunk, gzipped on the way when the client accepts it (`gzip`).
fn pull_response(
    req: &HttpRequest,
    st: &AppState,
    username: &str,
    pull: &PullRequest,
    gzip: bool,
    (page, by): (PageStart, Target),
) -> HttpResponse {
    report_sync(req, st, username, &pull.client_id, Some(pull.after));
    let generation = page.head.repository_generation;
    match page.body {
        StartedBody::Whole(body, records) => {
            crate::monitoring::records_pulled(pull.dialect, records);
            negotiated(req, served_by(dialect_response(pull.dialect, body, generation), by))
        }
        StartedBody::Streamed(body) => {
            let mut res = dialect_builder(pull.dialect, generation);
            compress::streamed(req, &mut res, gzip);
            served_by(res.streaming(body), by)
        }
    }
}

/// Pull a page of changes (dialect from the body)
///
/// Role: read-only or above.
#[utoipa::path(post, path = "/sync/pull", tag = "sync",
    params(("limit" = Option<String>, Query, description = "integer; default 50, clamped to 500"), ("page_token" = Option<String>, Query, description = "The token of the previous page"), ("schemaType" = Option<String>, Query, description = "A form type to pull (repeatable)"), ("x-repository-generation" = Option<String>, Header, description = "The repository generation the client holds (docs/api.md §17.2)")),
    request_body(content = ref("#/components/schemas/PullRequest")),
    responses((status = 200, body = ref("#/components/schemas/PullResponse")), (status = 400), (status = 409)),
    security(("bearerAuth" = [])))]
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
    let gzip = compress::wants_gzip(&req);
    let page = pull_page(st, &caller.username, &pull, client_generation(&req, &body), gzip).await?;
    Ok(pull_response(&req, st, &caller.username, &pull, gzip, page))
}

/// Pull a page of changes (spec shape, or synkronus with x-api-version 1.0.x)
///
/// Role: read-only or above.
///
/// `GET /sync/pull`: the spec shape unless `x-api-version: 1.0.x` asks for the synkronus one.
#[utoipa::path(get, path = "/sync/pull", tag = "sync",
    params(("client_id" = Option<String>, Query, description = "The device's id"), ("since" = Option<String>, Query, description = "Changes after this point"),
        ("schema_types" = Option<String>, Query, description = "Form types, comma-separated"), ("limit" = Option<String>, Query, description = "integer; default 50, clamped to 500"), ("page_token" = Option<String>, Query, description = "The token of the previous page"), ("x-api-version" = Option<String>, Header, description = "The API version the client speaks"), ("x-repository-generation" = Option<String>, Header, description = "The repository generation the client holds (docs/api.md §17.2)")),
    responses((status = 200, body = ref("#/components/schemas/PullResponse")), (status = 400), (status = 409)),
    security(("bearerAuth" = [])))]
pub async fn pull_get(req: HttpRequest, Auth(caller): Auth) -> ApiResult<HttpResponse> {
    caller.require(Role::ReadOnly)?;
    let st = state(&req)?;
    let dialect = match api_version(&req) {
        ApiVersion::V1_0 => Dialect::Synkronus,
        ApiVersion::V1_1 => Dialect::Spec,
    };
    let pull = decode_pull_query(&query_pairs(&req), dialect)?;
    let gzip = compress::wants_gzip(&req);
    let page = pull_page(st, &caller.username, &pull, client_generation(&req, &Value::Null), gzip).await?;
    Ok(pull_response(&req, st, &caller.username, &pull, gzip, page))
}

pub fn routes(cfg: &mut web::ServiceConfig) {
    use crate::http::routing::{get, resource};
    cfg.service(resource("/sync/push", "POST").route(web::post().to(push))).service(
        resource("/sync/pull", "GET, HEAD, POST").route(web::post().to(pull)).route(get().to(pull_get)),
    );
}
