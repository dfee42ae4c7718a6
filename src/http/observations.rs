//! Read access to observations (docs/api.md §12).

use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tokio_postgres::IsolationLevel;

use crate::db::records::{self, Owner};
use crate::db::scope::read as scope_read;
use crate::domain::page_token::{self, TokenKind};
use crate::domain::role::Role;
use crate::domain::sync::clamp_limit;
use crate::domain::sync::encode::synkronus_record;
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::http::compress::negotiated;
use crate::http::context::served_by;
use crate::http::extract::{state, Auth, FromQuery, PathParams, Query, QueryPairs};
use crate::http::wire::observations::{History, ObservationPage};

#[derive(Serialize, Deserialize)]
struct ListCursor {
    a: i64,
    /// The owner filter: None = all.
    u: Option<String>,
    t: Vec<String>,
    d: bool,
}

#[derive(Serialize, Deserialize)]
struct HistoryCursor {
    /// Revisions strictly older than this change_id.
    b: i64,
}

fn parse_limit(pairs: &[(String, String)]) -> ApiResult<i64> {
    let raw = pairs.iter().find(|(k, _)| k == "limit").map(|(_, v)| v.as_str());
    let parsed = raw
        .map(|v| {
            v.trim()
                .parse::<i64>()
                .map_err(|_| ApiError::bad_request("'limit' must be an integer").with_path("?limit"))
        })
        .transpose()?;
    Ok(clamp_limit(parsed))
}

/// `GET /observations`' query; who may use `all` and `user` is the handler's to decide.
pub struct ListQuery {
    all: bool,
    user: Option<String>,
    limit: i64,
    types: Vec<String>,
    deleted: bool,
    page_token: Option<String>,
}

impl FromQuery for ListQuery {
    fn from_query(query: &QueryPairs) -> ApiResult<Self> {
        let pairs = &query.0;
        let get = |k: &str| pairs.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str());
        Ok(ListQuery {
            all: parse_bool(get("all"), "all", false)?,
            user: get("user").filter(|u| !u.is_empty()).map(str::to_string),
            limit: parse_limit(pairs)?,
            types: pairs
                .iter()
                .filter(|(k, _)| k == "form_type")
                .flat_map(|(_, v)| v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string))
                .collect(),
            deleted: parse_bool(get("include_deleted"), "include_deleted", false)?,
            page_token: get("page_token").filter(|t| !t.is_empty()).map(str::to_string),
        })
    }
}

/// `GET /observations/{id}/history`' query: the page size and the page token's position.
pub struct HistoryQuery {
    limit: i64,
    before: Option<i64>,
}

impl FromQuery for HistoryQuery {
    fn from_query(query: &QueryPairs) -> ApiResult<Self> {
        let pairs = &query.0;
        let limit = parse_limit(pairs)?;
        let token =
            pairs.iter().find(|(k, _)| k == "page_token").map(|(_, v)| v.as_str()).filter(|t| !t.is_empty());
        let before = match token {
            None => None,
            Some(token) => Some(
                page_token::decode::<HistoryCursor>(TokenKind::History, token)
                    .ok_or_else(|| ApiError::of(ErrorCode::InvalidPageToken))?
                    .b,
            ),
        };
        Ok(HistoryQuery { limit, before })
    }
}

fn parse_bool(raw: Option<&str>, name: &str, default: bool) -> ApiResult<bool> {
    match raw.map(|s| s.trim().to_ascii_lowercase()) {
        None => Ok(default),
        Some(v) if v == "true" || v == "1" => Ok(true),
        Some(v) if v == "false" || v == "0" || v.is_empty() => Ok(false),
        Some(_) => {
            Err(ApiError::bad_request(format!("'{name}' must be true or false"))
                .with_path(&format!("?{name}")))
        }
    }
}

/// List records (own, or all for admins)
///
/// Role: read-only or above.
#[utoipa::path(get, path = "/observations", tag = "observations",
    params(("all" = Option<bool>, Query, description = "All users' records (admins)"), ("user" = Option<String>, Query, description = "One user's records (admins)"), ("form_type" = Option<String>, Query, description = "Form types, comma-separated or repeated"),
        ("include_deleted" = Option<bool>, Query, description = "Include deleted records"), ("limit" = Option<String>, Query, description = "integer; default 50, clamped to 500"), ("page_token" = Option<String>, Query, description = "The token of the previous page")),
    responses((status = 200, body = ObservationPage), (status = 400)),
    security(("bearerAuth" = [])))]
pub async fn list(
    req: HttpRequest,
    Auth(caller): Auth,
    Query(query): Query<ListQuery>,
) -> ApiResult<HttpResponse> {
    caller.require(Role::ReadOnly)?;
    let st = state(&req)?;
    let ListQuery { all, user, limit, types, deleted, page_token } = query;
    if (all || user.is_some()) && !caller.role.allows(Role::Admin) {
        return Err(ApiError::forbidden());
    }
    let mut cursor = ListCursor {
        a: 0,
        u: if all { user } else { Some(user.unwrap_or_else(|| caller.username.clone())) },
        t: types,
        d: deleted,
    };
    if let Some(token) = page_token.as_deref() {
        let decoded: ListCursor = page_token::decode(TokenKind::Observations, token)
            .ok_or_else(|| ApiError::of(ErrorCode::InvalidPageToken))?;
        // A token may not widen what the caller is allowed to see.
        if decoded.u.as_deref() != Some(caller.username.as_str()) && !caller.role.allows(Role::Admin) {
            return Err(ApiError::of(ErrorCode::InvalidPageToken));
        }
        cursor = decoded;
    }
    let owner = match &cursor.u {
        None => Owner::All,
        Some(u) => Owner::User(u),
    };
    let (types, deleted, after) = (&cursor.t, cursor.d, cursor.a);
    let served = st
        .reads
        .read(
            &caller.username,
            Some(after),
            |(head, _): &(i64, _)| *head,
            |db| {
                let owner = match &owner {
                    Owner::All => Owner::All,
                    Owner::User(u) => Owner::User(u),
                };
                Box::pin(
                    async move { records::list_observations(&db, owner, types, deleted, after, limit).await },
                )
            },
        )
        .await?;
    let (head, mut found) = served.value;
    let has_more = found.len() as i64 > limit;
    found.truncate(limit as usize);
    let cutoff = found.last().map(|r| r.record.change_id).unwrap_or(head);
    let next = ListCursor { a: if has_more { cutoff } else { head.max(cursor.a) }, ..cursor };
    let observations = found
        .iter()
        .map(|o| {
            let mut m = synkronus_record(&o.record);
            m.insert("created_by".into(), o.created_by.clone().into());
            m
        })
        .collect();
    let res = HttpResponse::Ok().json(ObservationPage {
        change_cutoff: cutoff,
        has_more,
        next_page_token: page_token::encode(TokenKind::Observations, &next),
        observations,
    });
    Ok(negotiated(&req, served_by(res, served.by)))
}

/// One record
///
/// Role: read-only or above.
#[utoipa::path(get, path = "/observations/{id}", tag = "observations", params(("id" = String, Path, description = "The observation id")),
    responses((status = 200, body = Object), (status = 400), (status = 404)),
    security(("bearerAuth" = [])))]
pub async fn get_one(
    req: HttpRequest,
    Auth(caller): Auth,
    PathParams(id): PathParams<String>,
) -> ApiResult<HttpResponse> {
    caller.require(Role::ReadOnly)?;
    let st = state(&req)?;
    let mut db = st.pool.get().await?;
    // One snapshot for the visibility and the record (docs/api.md §20.4: outside the caller's
    // set, the record is absent).
    let tx = db
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?;
    let not_found = || ApiError::not_found(format!("Observation '{id}' not found"));
    if !scope_read::record_visible(&tx, &caller.username, &id).await? {
        return Err(not_found());
    }
    let found = records::find_observation(&tx, &id).await?.ok_or_else(not_found)?;
    let mut m = synkronus_record(&found.record);
    m.insert("created_by".into(), found.created_by.into());
    Ok(HttpResponse::Ok().json(Value::Object(m)))
}

/// A record's revisions
///
/// Role: read-only or above.
#[utoipa::path(get, path = "/observations/{id}/history", tag = "observations",
    params(("id" = String, Path, description = "The observation id"), ("limit" = Option<String>, Query, description = "integer; default 50, clamped to 500"), ("page_token" = Option<String>, Query, description = "The token of the previous page")),
    responses((status = 200, body = History), (status = 400), (status = 404)),
    security(("bearerAuth" = [])))]
pub async fn history(
    req: HttpRequest,
    Auth(caller): Auth,
    PathParams(id): PathParams<String>,
    Query(HistoryQuery { limit, before }): Query<HistoryQuery>,
) -> ApiResult<HttpResponse> {
    caller.require(Role::ReadOnly)?;
    let st = state(&req)?;
    // A replica that does not know the record yet (it may have been pushed a moment ago) counts
    // as behind: the primary decides whether it exists. The head is read first, pipelined with the
    // existence check: the later statements' snapshots show at least what it showed.
    let served = st
        .reads
        .read(
            &caller.username,
            Some(0),
            |(head, found): &(i64, Option<_>)| if found.is_some() { *head } else { -1 },
            |db| {
                let id = &id;
                let username = &caller.username;
                Box::pin(async move {
                    let (head, exists) =
                        futures_util::try_join!(records::head(&db), records::record_exists(&db, id))?;
                    if !exists || !scope_read::record_visible(&db, username, id).await? {
                        return Ok((head, None));
                    }
                    Ok((head, Some(records::history(&db, id, before, limit).await?)))
                })
            },
        )
        .await?;
    let (_, Some(mut revisions)) = served.value else {
        return Err(ApiError::not_found(format!("Observation '{id}' not found")));
    };
    let has_more = revisions.len() as i64 > limit;
    revisions.truncate(limit as usize);
    let items: Vec<Map<String, Value>> = revisions
        .iter()
        .map(|r| {
            let mut m = synkronus_record(&r.record);
            m.remove("observation_id");
            m.insert("client_id".into(), r.client_id.clone().into());
            m.insert(
                "transmission_id".into(),
                r.transmission_id.clone().map(Value::from).unwrap_or(Value::Null),
            );
            m.insert("pushed_by".into(), r.pushed_by.clone().into());
            m.insert("overwrote_version".into(), r.overwrote_version.map(Value::from).unwrap_or(Value::Null));
            m.insert("conflict".into(), r.conflict.into());
            m
        })
        .collect();
    let next_page_token = revisions
        .last()
        .filter(|_| has_more)
        .map(|last| page_token::encode(TokenKind::History, &HistoryCursor { b: last.record.change_id }));
    let res =
        HttpResponse::Ok().json(History { has_more, next_page_token, observation_id: id, revisions: items });
    Ok(negotiated(&req, served_by(res, served.by)))
}

pub fn routes(cfg: &mut web::ServiceConfig) {
    use crate::http::routing::{get, resource};
    cfg.service(resource("/observations", "GET, HEAD").route(get().to(list)))
        .service(resource("/observations/{id}/history", "GET, HEAD").route(get().to(history)))
        .service(resource("/observations/{id}", "GET, HEAD").route(get().to(get_one)));
}
