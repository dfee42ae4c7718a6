//! The outermost middleware: request id, tracing span, limits on request heads and stalled bodies,
//! client-version gate (426), API version negotiation (406) and the headers every response carries.

use std::pin::Pin;
use std::time::Duration;

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::error::PayloadError;
use actix_web::http::header::{self, HeaderName, HeaderValue};
use actix_web::middleware::Next;
use actix_web::web::Bytes;
use actix_web::{HttpMessage, ResponseError};
use futures_util::{Stream, StreamExt};
use tracing::Instrument;

use crate::domain::api_version::{self, ApiVersion};
use crate::error::{ApiError, ErrorCode};
use crate::telemetry::request_id;

pub const SERVER_VERSION: &str = env!("CARGO_PKG_VERSION");
const SERVER_MAJOR: u64 = 1;

pub static X_API_VERSION_USED: HeaderName = HeaderName::from_static("x-api-version-used");
/// Which database answered a routed read (docs/api.md §18.3), for operators.
pub static X_SERVED_BY: HeaderName = HeaderName::from_static("x-served-by");
static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
static X_SYNKRONUS_VERSION: HeaderName = HeaderName::from_static("x-synkronus-version");

pub async fn request_context(
    mut req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let id = request_id::accept_or_generate(header_str(&req, "x-request-id"));
    let span = tracing::info_span!("request", request_id = %id, method = %req.method(), path = %req.path());
    let quiet = matches!(req.path(), "/health" | "/ready" | "/metrics");
    let body_timeout = req
        .app_data::<actix_web::web::Data<crate::state::AppState>>()
        .map(|s| s.config.request_body_timeout)
        .unwrap_or(DEFAULT_BODY_TIMEOUT);
    let payload = req.take_payload();
    req.set_payload(with_idle_timeout(payload, body_timeout));
    let started = std::time::Instant::now();
    let result = request_id::scope(id.clone(), async {
        let negotiated = api_version::negotiate(header_str(&req, "x-api-version"));
        let gate = headers_within_limit(&req).and_then(|()| client_version_gate(&req)).and_then(|()| {
            negotiated.ok_or_else(|| {
                ApiError::new(
                    ErrorCode::UnsupportedApiVersion,
                    "Unsupported x-api-version; this server speaks 1.x",
                )
            })
        });
        let version = negotiated.unwrap_or(ApiVersion::V1_1);
        let mut res = match gate {
            Err(e) => req.into_response(e.error_response()),
            Ok(v) => {
                req.extensions_mut().insert(v);
                // Inner services turn errors into responses; an `Err` here is actix's own failure.
                uniform_error_body(next.call(req).await?.map_into_boxed_body()).await
            }
        };
        let headers = res.headers_mut();
        if let Ok(v) = HeaderValue::from_str(&id) {
            headers.insert(X_REQUEST_ID.clone(), v);
        }
        if !headers.contains_key(&X_API_VERSION_USED) {
            headers.insert(X_API_VERSION_USED.clone(), HeaderValue::from_static(version.header_value()));
        }
        headers.insert(X_SYNKRONUS_VERSION.clone(), HeaderValue::from_static(SERVER_VERSION));
        Ok(res)
    })
    .instrument(span.clone())
    .await;
    if let Ok(res) = &result {
        let status = res.status().as_u16();
        let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
        let _enter = span.enter();
        if quiet {
            tracing::debug!(status, elapsed_ms, "request");
        } else {
            tracing::info!(status, elapsed_ms, "request");
        }
    }
    result
}

/// Error responses that did not come from the error table (actix's own: CORS refusals, extractor
/// and routing errors) get the standard error body, so every error has the one shape of docs/api.md §4.
async fn uniform_error_body(res: ServiceResponse<BoxBody>) -> ServiceResponse<BoxBody> {
    let status = res.status();
    let is_problem = res.headers().get(header::CONTENT_TYPE).is_some_and(|v| v == "application/problem+json");
    if !(status.is_client_error() || status.is_server_error()) || is_problem {
        return res;
    }
    let Some(code) = ErrorCode::for_status(status) else {
        return res;
    };
    let (req, original) = res.into_parts();
    let (head, body) = original.into_parts();
    // actix's texts for client errors are short and say what was wrong; server texts may leak internals.
    let text = match actix_web::body::to_bytes_limited(body, 512).await {
        Ok(Ok(bytes)) if status.is_client_error() => String::from_utf8(bytes.to_vec()).unwrap_or_default(),
        _ => String::new(),
    };
    let error = match text.trim() {
        "" => ApiError::of(code),
        t => ApiError::new(code, t),
    };
    let mut replaced = error.error_response();
    for (name, value) in head.headers() {
        if name != header::CONTENT_TYPE
            && name != header::CONTENT_LENGTH
            && !replaced.headers().contains_key(name)
        {
            replaced.headers_mut().append(name.clone(), value.clone());
        }
    }
    ServiceResponse::new(req, replaced)
}

/// actix accepts request heads up to 128 KiB; no client of this API needs more than a few KiB.
const MAX_HEADER_BYTES: usize = 32 * 1024;

fn headers_within_limit(req: &ServiceRequest) -> Result<(), ApiError> {
    let total: usize = req.headers().iter().map(|(name, value)| name.as_str().len() + value.len() + 4).sum();
    if total > MAX_HEADER_BYTES {
        return Err(ApiError::bad_request(format!("Request headers exceed {} KiB", MAX_HEADER_BYTES / 1024)));
    }
    Ok(())
}

const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// actix times out only the request head: a body that stalls would hold its handler (and any temp
/// file it is writing) forever. Every body extractor maps this read error to a 400.
fn with_idle_timeout(payload: Payload, idle: Duration) -> Payload {
    let stream = futures_util::stream::unfold(Some(payload), move |payload| async move {
        let mut payload = payload?;
        match tokio::time::timeout(idle, payload.next()).await {
            Ok(Some(item)) => Some((item, Some(payload))),
            Ok(None) => None,
            Err(_) => {
                let stalled = std::io::Error::new(std::io::ErrorKind::TimedOut, "the request body stalled");
                Some((Err(PayloadError::Io(stalled)), None))
            }
        }
    });
    // Fused: multipart parsers poll again after the end.
    let boxed: Pin<Box<dyn Stream<Item = Result<Bytes, PayloadError>>>> = Box::pin(stream.fuse());
    Payload::from(boxed)
}

/// `x-ode-version` of another major, or garbage, is refused before authentication (docs/api.md §17.1).
fn client_version_gate(req: &ServiceRequest) -> Result<(), ApiError> {
    match header_str(req, "x-ode-version") {
        None => Ok(()),
        Some(v) if api_version::client_version_supported(v, SERVER_MAJOR) => Ok(()),
        Some(_) => {
            Err(ApiError::of(ErrorCode::ClientVersionUnsupported)
                .with_extra("synkronus_version", SERVER_VERSION))
        }
    }
}

fn header_str<'a>(req: &'a ServiceRequest, name: &str) -> Option<&'a str> {
    req.headers().get(name).and_then(|v| v.to_str().ok())
}

/// Marks a routed read's response with the database that answered it.
pub fn served_by(
    mut res: actix_web::HttpResponse,
    by: crate::db::replicas::Target,
) -> actix_web::HttpResponse {
    res.headers_mut().insert(X_SERVED_BY.clone(), HeaderValue::from_static(by.as_str()));
    res
}
