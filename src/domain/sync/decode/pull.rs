//! A pull request (POST body or GET query) -> cursor, form types and page size.

use serde_json::{Map, Value};

use super::super::{clamp_limit, Dialect, PullCursor, PullRequest};
use super::{object, request_id_field, valid_free_form_id, DecodeError, DecodeResult};
use crate::domain::page_token::{self, TokenKind};

/// Query-string parts of a pull request (the query wins over the body).
#[derive(Debug, Default, Clone)]
pub struct PullQuery {
    pub limit: Option<String>,
    pub page_token: Option<String>,
    pub schema_types: Vec<String>,
}

fn parse_limit_text(raw: &str) -> DecodeResult<i64> {
    raw.trim()
        .parse::<i64>()
        .map_err(|_| DecodeError::bad_request("'limit' must be an integer").with_path("?limit"))
}

fn body_limit(obj: &Map<String, Value>) -> DecodeResult<Option<i64>> {
    match obj.get("limit") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_i64() {
            Some(v) => Ok(Some(v)),
            // Huge integers still mean "as many as allowed".
            None if n.as_u64().is_some() => Ok(Some(i64::MAX)),
            None => Err(DecodeError::bad_request("'limit' must be an integer").with_path("/limit")),
        },
        Some(_) => Err(DecodeError::bad_request("'limit' must be an integer").with_path("/limit")),
    }
}

fn string_array(obj: &Map<String, Value>, key: &str) -> DecodeResult<Vec<String>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => {
            items.iter().map(|v| v.as_str().map(str::to_string)).collect::<Option<Vec<_>>>().ok_or_else(
                || {
                    DecodeError::bad_request(format!("'{key}' must be an array of strings"))
                        .with_path(&format!("/{key}"))
                },
            )
        }
        Some(_) => Err(DecodeError::bad_request(format!("'{key}' must be an array of strings"))
            .with_path(&format!("/{key}"))),
    }
}

fn cursor_value(v: &Value, key: &str) -> DecodeResult<i64> {
    let bad = || {
        DecodeError::bad_request(format!("'{key}' must be a non-negative integer"))
            .with_path(&format!("/{key}"))
    };
    match v {
        Value::Null => Ok(0),
        Value::Number(n) => {
            n.as_i64().filter(|v| *v >= 0).or_else(|| n.as_u64().map(|_| i64::MAX)).ok_or_else(bad)
        }
        _ => Err(bad()),
    }
}

/// Decodes a POST pull body (+ query). A page token wins over an explicit cursor or filter.
pub fn decode_pull(body: &Value, query: &PullQuery) -> DecodeResult<PullRequest> {
    let dialect = Dialect::detect(body);
    let obj = object(body)?;
    let client_key = if dialect == Dialect::Camel { "clientId" } else { "client_id" };
    let client_id = request_id_field(obj, client_key)?;

    let mut after = match dialect {
        Dialect::Synkronus => match obj.get("since") {
            None | Some(Value::Null) => 0,
            Some(Value::Object(since)) => {
                cursor_value(since.get("version").unwrap_or(&Value::Null), "since")?
            }
            Some(v @ Value::Number(_)) => cursor_value(v, "since")?,
            Some(_) => {
                return Err(
                    DecodeError::bad_request("'since' must be an object with a version").with_path("/since")
                )
            }
        },
        Dialect::Spec => cursor_value(obj.get("since_change_id").unwrap_or(&Value::Null), "since_change_id")?,
        Dialect::Camel => cursor_value(obj.get("currentVersion").unwrap_or(&Value::Null), "currentVersion")?,
    };
    let mut types = match dialect {
        Dialect::Camel => string_array(obj, "schemaTypes")?,
        _ => string_array(obj, "schema_types")?,
    };
    types.extend(query.schema_types.iter().cloned());

    let limit = match &query.limit {
        Some(raw) => Some(parse_limit_text(raw)?),
        None => body_limit(obj)?,
    };
    let token = query.page_token.clone().or_else(|| {
        let keys: &[&str] =
            if dialect == Dialect::Camel { &["pageToken", "page_token"] } else { &["page_token"] };
        keys.iter().find_map(|k| obj.get(*k).and_then(Value::as_str).map(str::to_string))
    });
    if let Some(token) = token.filter(|t| !t.is_empty()) {
        let cursor = decode_pull_token(&token)?;
        after = cursor.a;
        types = cursor.t;
    }
    Ok(PullRequest { dialect, client_id, after, types: normalize_types(types), limit: clamp_limit(limit) })
}

/// Decodes `GET /sync/pull?client_id=&since=&schema_types=a,b&limit=&page_token=`.
pub fn decode_pull_query(pairs: &[(String, String)], dialect: Dialect) -> DecodeResult<PullRequest> {
    let get = |k: &str| pairs.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str());
    let client_id = match get("client_id") {
        Some(c) if valid_free_form_id(c) => c.to_string(),
        Some(_) => {
            return Err(
                DecodeError::bad_request("'client_id' must be 1 to 255 characters").with_path("?client_id")
            )
        }
        None => return Err(DecodeError::bad_request("'client_id' is required").with_path("?client_id")),
    };
    let mut after = match get("since").or_else(|| get("since_change_id")) {
        None | Some("") => 0,
        Some(raw) => raw.trim().parse::<i64>().ok().filter(|v| *v >= 0).ok_or_else(|| {
            DecodeError::bad_request("'since' must be a non-negative integer").with_path("?since")
        })?,
    };
    let mut types: Vec<String> = pairs
        .iter()
        .filter(|(k, _)| k == "schema_types" || k == "schemaType")
        .flat_map(|(_, v)| v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string))
        .collect();
    let limit = get("limit").map(parse_limit_text).transpose()?;
    if let Some(token) = get("page_token").filter(|t| !t.is_empty()) {
        let cursor = decode_pull_token(token)?;
        after = cursor.a;
        types = cursor.t;
    }
    Ok(PullRequest { dialect, client_id, after, types: normalize_types(types), limit: clamp_limit(limit) })
}

fn decode_pull_token(token: &str) -> DecodeResult<PullCursor> {
    page_token::decode::<PullCursor>(TokenKind::Pull, token)
        .filter(|c| c.a >= 0)
        .ok_or_else(DecodeError::invalid_page_token)
}

/// A set without duplicates, in a stable order (tokens and SQL see the same list).
fn normalize_types(mut types: Vec<String>) -> Vec<String> {
    types.sort();
    types.dedup();
    types
}
