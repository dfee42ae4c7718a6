//! Request extractors that turn wire input into checked values or a 4xx from the error table.
//! Bodies decode into the wire types of `http::wire`.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;

use actix_web::dev::Payload;
use actix_web::{web, FromRequest, HttpMessage, HttpRequest};
use futures_util::StreamExt;
use serde_json::Value;

use crate::auth::{bearer_token, AuthUser};
use crate::domain::api_version::ApiVersion;
use crate::domain::attachment::AttachmentId;
use crate::domain::audit::Origin;
use crate::domain::bundle::BundleFilePath;
use crate::domain::sync::push_body::Received;
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::http::body_budget::{BodyBuffer, BodyPermit};
use crate::state::AppState;

pub fn state(req: &HttpRequest) -> ApiResult<&AppState> {
    req.app_data::<web::Data<AppState>>()
        .map(|d| d.get_ref())
        .ok_or_else(|| ApiError::internal("application state missing"))
}

/// The caller, authenticated. Missing or bad credentials give 401 before any role check.
pub struct Auth(pub AuthUser);

impl FromRequest for Auth {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Self, Self::Error>>>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let req = req.clone();
        Box::pin(async move {
            let user = authenticate(&req).await?;
            let state = state(&req)?;
            // HEAD is exempt (docs/api.md §15); OPTIONS preflights never reach an extractor.
            if req.method() != actix_web::http::Method::HEAD && !state.user_limiter.try_take(user.id) {
                crate::monitoring::rate_limited("user");
                return Err(ApiError::rate_limited(1));
            }
            record_sighting(&req, state, &user.username);
            Ok(Auth(user))
        })
    }
}

/// The caller behind the bearer token, without the per-user rate limit (`/metrics` is exempt).
pub async fn authenticate(req: &HttpRequest) -> ApiResult<AuthUser> {
    let state = state(req)?;
    let header = req.headers().get("authorization").and_then(|v| v.to_str().ok());
    let token = bearer_token(header).ok_or_else(|| ApiError::of(ErrorCode::MissingToken))?;
    Ok(state.auth.verify(token, &state.pool).await?)
}

/// The device's client id from `x-ode-client-id`, if sent.
pub fn header_client_id(req: &HttpRequest) -> Option<String> {
    req.headers()
        .get("x-ode-client-id")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|s| !s.is_empty() && s.len() <= 255)
        .map(str::to_string)
}

/// The client's version hint for presence: `x-ode-version`, else `x-formulus-version`.
pub fn client_version_hint(req: &HttpRequest) -> Option<String> {
    ["x-ode-version", "x-formulus-version"]
        .iter()
        .find_map(|h| req.headers().get(*h).and_then(|v| v.to_str().ok()))
        .map(|v| v.trim().chars().take(64).collect())
}

/// Every authenticated request is a sighting of its device (docs/api.md §17.4). Sync routes name the
/// device in their body, so without the header they report it themselves, with the cursor.
fn record_sighting(req: &HttpRequest, state: &AppState, username: &str) {
    let client_id = match header_client_id(req) {
        Some(id) => id,
        None if carries_body_client_id(req) => return,
        None => String::new(),
    };
    state.actors.presence.seen(crate::actors::presence::Seen {
        username: username.to_string(),
        client_id,
        client_version: client_version_hint(req),
        data_version: None,
        app_bundle_version: None,
    });
}

fn carries_body_client_id(req: &HttpRequest) -> bool {
    let path = req.path();
    req.method() == actix_web::http::Method::POST
        && (path.ends_with("/sync/pull")
            || path.ends_with("/sync/push")
            || path.ends_with("/attachments/manifest"))
}

/// A JSON request body, parsed whatever the Content-Type says (docs/api.md §1.3). An empty body is
/// `Value::Null`; size and nesting limits give 413 and 400. Its room in the body budget is held
/// until the request is done (the permit rides in the request's extensions).
pub struct JsonBody(pub Value);

impl FromRequest for JsonBody {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Self, Self::Error>>>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let body = BodyBytes::from_request(req, payload);
        let req = req.clone();
        Box::pin(async move {
            let BodyBytes { bytes, permit } = body.await?;
            let value = parse_json(&bytes)?;
            req.extensions_mut().insert(permit);
            Ok(JsonBody(value))
        })
    }
}

/// A request body as bytes, read within `MAX_JSON_BODY_BYTES` (413 beyond) once the body budget
/// has room for it (docs/api.md §18.4): by its Content-Length up front, else as it arrives. The
/// room is held for as long as `permit` lives.
pub struct BodyBytes {
    pub bytes: web::Bytes,
    pub permit: BodyPermit,
}

impl FromRequest for BodyBytes {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Self, Self::Error>>>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let budget = state(req).map(|s| (s.config.max_json_body_bytes, s.body_budget.clone()));
        let declared = req
            .headers()
            .get("content-length")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        let mut payload = payload.take();
        Box::pin(async move {
            let (limit, budget) = budget?;
            if declared.is_some_and(|n| n > limit) {
                return Err(too_large(limit));
            }
            let mut permit = budget.reserve(declared.unwrap_or(0)).await?;
            let mut body = BodyBuffer::with_capacity(declared.unwrap_or(0).min(limit));
            while let Some(chunk) = payload.next().await {
                let chunk = chunk.map_err(|_| ApiError::bad_request("Could not read the request body"))?;
                if body.received() + chunk.len() > limit {
                    return Err(too_large(limit));
                }
                permit.cover_growing(body.received() + chunk.len(), limit).await?;
                body.extend_from_slice(&chunk);
            }
            Ok(BodyBytes { bytes: body.freeze(), permit })
        })
    }
}

fn too_large(limit: usize) -> ApiError {
    ApiError::new(ErrorCode::PayloadTooLarge, format!("Request body exceeds {limit} bytes"))
}

/// Nesting docs/api.md §1.3 accepts; serde_json's built-in limit stops one level short of it.
const MAX_JSON_DEPTH: usize = 128;

/// Parses JSON, refusing nesting deeper than `MAX_JSON_DEPTH` with a 400.
pub fn parse_json(bytes: &[u8]) -> ApiResult<Value> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    parse_json_as(bytes)
}

/// Parses JSON into any type, borrowing from `bytes` where it can (a `&RawValue` keeps the text
/// instead of building a tree), with the nesting limit of [`parse_json`].
pub fn parse_json_as<'a, T: serde::Deserialize<'a>>(bytes: &'a [u8]) -> ApiResult<T> {
    check_nesting(bytes)?;
    let mut de = serde_json::Deserializer::from_slice(bytes);
    // The scan above bounds the depth, so the parser's recursion stays shallow.
    de.disable_recursion_limit();
    T::deserialize(&mut de).and_then(|v| de.end().map(|()| v)).map_err(malformed_json)
}

/// A push body (docs/api.md §8.3): checked and split in one pass where it can be, with the
/// nesting limit and the errors of [`parse_json_as`].
pub fn parse_push_body(bytes: &[u8]) -> ApiResult<Received<'_>> {
    check_nesting(bytes)?;
    Received::parse(bytes).map_err(malformed_json)
}

pub fn malformed_json(e: serde_json::Error) -> ApiError {
    ApiError::bad_request(format!("Malformed JSON: {e}"))
}

fn check_nesting(bytes: &[u8]) -> ApiResult<()> {
    if nesting_exceeds(bytes, MAX_JSON_DEPTH) {
        return Err(ApiError::bad_request(format!("JSON nesting deeper than {MAX_JSON_DEPTH} levels")));
    }
    Ok(())
}

/// True when brackets outside strings nest deeper than `max`. Up to the first syntax error the
/// parser sees the same structure, so this bounds its depth even for malformed input. Strings,
/// most of a push body's bytes, are crossed by `memchr` from one quote or backslash to the next.
fn nesting_exceeds(bytes: &[u8], max: usize) -> bool {
    let mut depth = 0usize;
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        i += 1;
        match b {
            b'"' => loop {
                let rest = bytes.get(i..).unwrap_or_default();
                match memchr::memchr2(b'"', b'\\', rest) {
                    // An escape: the next byte is part of it, whatever it is.
                    Some(at) if rest[at] == b'\\' => i += at + 2,
                    Some(at) => {
                        i += at + 1;
                        break;
                    }
                    // An unterminated string: no bracket follows.
                    None => return false,
                }
            },
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// The API version negotiated by the context middleware.
pub fn api_version(req: &HttpRequest) -> ApiVersion {
    req.extensions().get::<ApiVersion>().copied().unwrap_or(ApiVersion::V1_1)
}

/// Typed path parameters: `PathParams<AttachmentId>`, `PathParams<(String, String)>`, in the route's order.
/// Each is percent-decoded exactly once (the router leaves `%2F` and `%25` encoded), must be
/// UTF-8 without NUL (PostgreSQL text cannot hold NUL: a lookup would fail with a 500), and is
/// then parsed by its type; anything else is a 400 naming the parameter, before the handler runs.
pub struct PathParams<T>(pub T);

/// One path parameter's type: built from its checked text, or a 400 naming `name`.
pub trait PathValue: Sized {
    fn parse(name: &str, text: String) -> ApiResult<Self>;
}

impl PathValue for String {
    fn parse(_: &str, text: String) -> ApiResult<Self> {
        Ok(text)
    }
}

impl PathValue for AttachmentId {
    fn parse(_: &str, text: String) -> ApiResult<Self> {
        Ok(AttachmentId::parse(text)?)
    }
}

impl PathValue for BundleFilePath {
    fn parse(name: &str, text: String) -> ApiResult<Self> {
        BundleFilePath::parse(text).map_err(|e| ApiError::bad_request(e.to_string()).with_path(name))
    }
}

/// What a route's parameters make: one value, or a tuple of them in the route's order.
pub trait FromPath: Sized {
    fn from_params(params: Vec<(String, String)>) -> ApiResult<Self>;
}

impl<T: PathValue> FromPath for T {
    fn from_params(params: Vec<(String, String)>) -> ApiResult<Self> {
        let mut params = params.into_iter();
        let (name, text) =
            params.next().ok_or_else(|| ApiError::internal("a route without its parameter"))?;
        T::parse(&name, text)
    }
}

impl<A: PathValue, B: PathValue> FromPath for (A, B) {
    fn from_params(params: Vec<(String, String)>) -> ApiResult<Self> {
        let mut params = params.into_iter();
        let mut next = || params.next().ok_or_else(|| ApiError::internal("a route without its parameters"));
        let (a, b) = (next()?, next()?);
        Ok((A::parse(&a.0, a.1)?, B::parse(&b.0, b.1)?))
    }
}

impl<T: FromPath> FromRequest for PathParams<T> {
    type Error = ApiError;
    type Future = std::future::Ready<Result<Self, Self::Error>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        std::future::ready(path_texts(req).and_then(T::from_params).map(PathParams))
    }
}

/// Every parameter of the matched route as checked text, in order.
fn path_texts(req: &HttpRequest) -> ApiResult<Vec<(String, String)>> {
    // The router has already decoded most escapes, replacing invalid UTF-8 with U+FFFD; only the
    // raw path shows that a parameter was not text.
    if percent_encoding::percent_decode_str(req.uri().path()).decode_utf8().is_err() {
        return Err(ApiError::bad_request("The request path is not valid UTF-8 once percent-decoded"));
    }
    req.match_info()
        .iter()
        .map(|(name, raw)| {
            let value = percent_encoding::percent_decode_str(raw)
                .decode_utf8()
                .map(|s| s.into_owned())
                .map_err(|_| ApiError::bad_request(format!("Path parameter '{name}' is not valid UTF-8")))?;
            if value.contains('\0') {
                return Err(ApiError::bad_request(format!("Path parameter '{name}' must not contain NUL")));
            }
            Ok((name.to_owned(), value))
        })
        .collect()
}

/// The query string as ordered pairs (repeated keys kept), each key and value percent-decoded
/// once (invalid UTF-8 becomes U+FFFD, as browsers do).
#[derive(Debug, Clone, Default)]
pub struct QueryPairs(pub Vec<(String, String)>);

impl QueryPairs {
    pub fn parse(query: &str) -> Self {
        QueryPairs(form_urlencoded::parse(query.as_bytes()).into_owned().collect())
    }
}

/// Typed query values: a route's query type reads what it needs from the pairs, and a bad value
/// is a 400 naming its parameter before the handler runs.
pub struct Query<T>(pub T);

/// A route's query, built from the query string's pairs.
pub trait FromQuery: Sized {
    fn from_query(query: &QueryPairs) -> ApiResult<Self>;
}

impl FromQuery for QueryPairs {
    fn from_query(query: &QueryPairs) -> ApiResult<Self> {
        Ok(query.clone())
    }
}

impl<T: FromQuery> FromRequest for Query<T> {
    type Error = ApiError;
    type Future = std::future::Ready<Result<Self, Self::Error>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        std::future::ready(T::from_query(&QueryPairs::parse(req.query_string())).map(Query))
    }
}

fn peer_ip(req: &HttpRequest) -> IpAddr {
    req.peer_addr().map(|a| a.ip()).unwrap_or(IpAddr::from([127, 0, 0, 1]))
}

fn is_trusted(trusted: &[ipnet::IpNet], ip: &IpAddr) -> bool {
    trusted.iter().any(|net| net.contains(ip))
}

/// The client IP for rate limiting: X-Forwarded-For only counts from a trusted proxy.
pub fn client_ip(req: &HttpRequest, trusted: &[ipnet::IpNet]) -> IpAddr {
    let peer = peer_ip(req);
    if !is_trusted(trusted, &peer) {
        return peer;
    }
    let forwarded = req.headers().get("x-forwarded-for").and_then(|v| v.to_str().ok());
    // Walk from the nearest hop outwards, skipping our own proxies.
    forwarded
        .into_iter()
        .flat_map(|v| v.split(',').rev())
        .filter_map(|s| s.trim().parse::<IpAddr>().ok())
        .find(|ip| !is_trusted(trusted, ip))
        .unwrap_or(peer)
}

/// Who makes this request and from where, for the audit log (docs/api.md §18.4): `actor` (the
/// caller, or the name a sign-in tried), the client IP as the rate limits see it, the request id.
pub fn audit_origin(req: &HttpRequest, state: &AppState, actor: &str) -> Origin {
    Origin {
        actor: Some(actor.to_owned()),
        client_ip: Some(client_ip(req, &state.config.trusted_proxies)),
        request_id: Some(crate::telemetry::request_id::current()),
        node: state.config.node_id.clone(),
    }
}

/// The first value of a forwarding header (`x-forwarded-proto`, `-host`, `-prefix`), honoured
/// only from a peer in `TRUSTED_PROXIES` (docs/api.md §18.4): from anyone else it would let a
/// client make the server build links to a host of its choosing.
pub fn forwarded_header<'r>(req: &'r HttpRequest, trusted: &[ipnet::IpNet], name: &str) -> Option<&'r str> {
    if !is_trusted(trusted, &peer_ip(req)) {
        return None;
    }
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').next())
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(levels: usize) -> String {
        format!("{}{}", "[".repeat(levels), "]".repeat(levels))
    }

    #[test]
    fn nesting_limit_is_128_levels() {
        assert!(parse_json(nested(128).as_bytes()).is_ok());
        let err = parse_json(nested(129).as_bytes()).unwrap_err();
        assert!(err.message.contains("128"), "{}", err.message);
        // Brackets inside strings, escaped quotes included, do not count.
        let in_string = format!(r#"{{"a": "\"{}"}}"#, "[".repeat(300));
        assert!(parse_json(in_string.as_bytes()).is_ok());
        // Deep but malformed input is refused either way.
        assert!(parse_json("[".repeat(1000).as_bytes()).is_err());
    }

    /// The byte-by-byte scan the memchr one replaced, kept as the reference.
    fn nesting_exceeds_byte_by_byte(bytes: &[u8], max: usize) -> bool {
        let mut depth = 0usize;
        let mut in_string = false;
        let mut escaped = false;
        for &b in bytes {
            if in_string {
                match b {
                    _ if escaped => escaped = false,
                    b'\\' => escaped = true,
                    b'"' => in_string = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => in_string = true,
                b'[' | b'{' => {
                    depth += 1;
                    if depth > max {
                        return true;
                    }
                }
                b']' | b'}' => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
        false
    }

    proptest::proptest! {
        #![proptest_config(crate::testing::config(2048))]

        #[test]
        fn nesting_scan_equals_the_byte_by_byte_one(
            bytes in proptest::collection::vec(
                proptest::prop_oneof![
                    6 => proptest::sample::select(b"[]{}\"\\\\\"a ".to_vec()),
                    1 => proptest::prelude::any::<u8>(),
                ],
                0..200,
            ),
            max in 0usize..6,
        ) {
            proptest::prop_assert_eq!(nesting_exceeds(&bytes, max), nesting_exceeds_byte_by_byte(&bytes, max));
        }
    }

    #[test]
    fn json_parsing_rules() {
        assert_eq!(parse_json(b"  \n").unwrap(), Value::Null);
        assert_eq!(parse_json(br#"{"a":1,"a":2}"#).unwrap()["a"], 2);
        assert!(parse_json(b"{} x").is_err());
        assert!(parse_json(b"{").is_err());
    }
}
