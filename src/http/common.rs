//! What several handler modules share, so that no handler module imports another: the repository
//! generation a client holds and the 409 when it is not the server's, sightings for presence,
//! conditional requests, the caller's own row, and the root's redirect of browsers to the portal.

use actix_web::http::header::{self, HeaderName};
use actix_web::{HttpRequest, HttpResponse};
use serde_json::Value;

use crate::auth::AuthUser;
use crate::db::records;
use crate::db::users::{self as db_users, UserRow};
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::http::extract::{forwarded_header, state};
use crate::state::AppState;

pub static X_REPOSITORY_GENERATION: HeaderName = HeaderName::from_static("x-repository-generation");

/// The repository generation a client holds (docs/api.md §17.2): the header, or when it is absent the
/// body field. A header that is present but not an integer >= 1 counts as not sent.
pub fn client_generation(req: &HttpRequest, body: &Value) -> Option<i64> {
    generation_sent(req, body.get("repository_generation"))
}

/// [`client_generation`], given the body's `repository_generation` field.
pub fn generation_sent(req: &HttpRequest, body_field: Option<&Value>) -> Option<i64> {
    match req.headers().get(&X_REPOSITORY_GENERATION) {
        Some(h) => h.to_str().ok().and_then(|v| v.trim().parse::<i64>().ok()).filter(|g| *g >= 1),
        None => body_field.and_then(Value::as_i64).filter(|g| *g >= 1),
    }
}

/// The server's repository generation, or 409 when the client holds another one (docs/api.md §17.2).
pub async fn current_generation(
    db: &impl deadpool_postgres::GenericClient,
    req: &HttpRequest,
    body: &Value,
) -> ApiResult<i64> {
    let server = records::head_and_generation(db).await?.repository_generation;
    match client_generation(req, body) {
        Some(g) if g != server => Err(ApiError::reset_required(server)),
        _ => Ok(server),
    }
}

/// Reports a sighting of the device named in the body (with its data cursor for pull and push)
/// to the Presence actor; never blocks.
pub fn report_sync(
    req: &HttpRequest,
    st: &AppState,
    username: &str,
    body_client_id: &str,
    cursor: Option<i64>,
) {
    let client_id = crate::http::extract::header_client_id(req).unwrap_or_else(|| body_client_id.to_string());
    st.actors.presence.seen(crate::actors::presence::Seen {
        username: username.to_string(),
        client_id,
        client_version: crate::http::extract::client_version_hint(req),
        data_version: cursor,
        app_bundle_version: None,
    });
}

/// The query string as ordered pairs (repeated keys kept).
pub fn query_pairs(req: &HttpRequest) -> Vec<(String, String)> {
    crate::http::extract::QueryPairs::parse(req.query_string()).0
}

/// Whether `If-None-Match` matches the strong tag `"<hex>"` (docs/api.md §1.6: a list, `*`, and
/// `W/` tags compared weakly).
pub fn if_none_match(req: &HttpRequest, hex: &str) -> bool {
    req.headers().get_all(header::IF_NONE_MATCH).filter_map(|value| value.to_str().ok()).any(|value| {
        value.split(',').map(str::trim).any(|tag| {
            tag == "*"
                || tag.strip_prefix("W/").unwrap_or(tag).strip_prefix('"').and_then(|t| t.strip_suffix('"'))
                    == Some(hex)
        })
    })
}

/// The path under which this server is reachable from the browser: the path of `PUBLIC_URL`,
/// else a trusted proxy's `X-Forwarded-Prefix`, else nothing. Only plain path characters are kept,
/// since the value lands in HTML.
pub fn base_path(req: &HttpRequest) -> String {
    let config = state(req).ok().map(|st| st.config.clone());
    let from_config = config.as_ref().and_then(|c| c.public_url.clone()).map(|url| {
        let rest = url.split_once("://").map_or("", |(_, rest)| rest);
        rest.find('/').map_or(String::new(), |i| rest[i..].to_owned())
    });
    let prefix = from_config.or_else(|| {
        let trusted = config.as_ref().map_or(&[][..], |c| &c.trusted_proxies[..]);
        forwarded_header(req, trusted, "x-forwarded-prefix").map(str::to_owned)
    });
    let prefix = prefix.unwrap_or_default();
    let prefix = prefix.trim().trim_matches('/');
    let safe = prefix.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~/".contains(&b));
    if prefix.is_empty() || !safe || prefix.split('/').any(|s| s.is_empty() || s == "." || s == "..") {
        String::new()
    } else {
        format!("/{prefix}")
    }
}

/// Whether an `Accept` header prefers HTML to JSON: the best quality given to `text/html` beats
/// the one given to `application/json` (directly or through a wildcard), or ties and comes first.
pub fn prefers_html(accept: &str) -> bool {
    let mut html: Option<(f32, usize)> = None;
    let mut json: Option<(f32, usize)> = None;
    for (pos, item) in accept.split(',').enumerate() {
        let mut parts = item.split(';');
        let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        let q = parts
            .filter_map(|p| p.trim().strip_prefix("q=").or_else(|| p.trim().strip_prefix("Q=")))
            .find_map(|v| v.trim().parse::<f32>().ok())
            .unwrap_or(1.0);
        let better = |slot: &mut Option<(f32, usize)>| {
            if slot.is_none_or(|(best, _)| q > best) {
                *slot = Some((q, pos));
            }
        };
        match media.as_str() {
            "text/html" => better(&mut html),
            "application/json" | "application/*" | "*/*" => better(&mut json),
            _ => {}
        }
    }
    match (html, json) {
        (Some((hq, _)), _) if hq <= 0.0 => false,
        (Some(_), None) => true,
        (Some((hq, hpos)), Some((jq, jpos))) => hq > jq || (hq == jq && hpos < jpos),
        (None, _) => false,
    }
}

/// The 303 that `GET /` sends to browsers (docs/api.md §17.9).
pub fn redirect_to_portal(req: &HttpRequest) -> Option<HttpResponse> {
    let accept = req.headers().get(header::ACCEPT)?.to_str().ok()?;
    prefers_html(accept).then(|| {
        HttpResponse::SeeOther()
            .insert_header((header::LOCATION, format!("{}/portal/", base_path(req))))
            .insert_header((header::VARY, "Accept"))
            .finish()
    })
}

/// The caller's own row; a token can outlive its user by at most the revocation cache TTL.
pub async fn current_user(st: &AppState, caller: &AuthUser) -> ApiResult<UserRow> {
    let db = st.pool.get().await?;
    db_users::find_by_id(&db, caller.id).await?.ok_or_else(|| ApiError::of(ErrorCode::InvalidToken))
}

#[cfg(test)]
mod tests {
    use super::prefers_html;

    #[test]
    fn browsers_prefer_html() {
        assert!(prefers_html("text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"));
        assert!(prefers_html(
            "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8"
        ));
        assert!(prefers_html("text/html"));
        assert!(prefers_html("text/html, application/json"));
    }

    #[test]
    fn api_clients_get_json() {
        assert!(!prefers_html("*/*"));
        assert!(!prefers_html("application/json"));
        assert!(!prefers_html("application/json, text/html"));
        assert!(!prefers_html("text/html;q=0.5, application/json"));
        assert!(!prefers_html("text/html;q=0"));
        assert!(!prefers_html(""));
    }
}
