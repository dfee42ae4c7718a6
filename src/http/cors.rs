//! CORS as docs/api.md §1.6 lists it; preflights are answered before authentication.

use actix_cors::Cors;
use actix_web::http::{header, Method};

pub fn cors(origins: &[String]) -> Cors {
    let mut cors = Cors::default()
        .allowed_methods([
            Method::GET,
            Method::HEAD,
            Method::POST,
            Method::PUT,
            Method::DELETE,
            Method::OPTIONS,
        ])
        .allowed_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            header::IF_NONE_MATCH,
            header::IF_RANGE,
            header::RANGE,
            header::HeaderName::from_static("x-api-version"),
            header::HeaderName::from_static("x-request-id"),
        ])
        .expose_headers([
            header::ETAG,
            header::CONTENT_DISPOSITION,
            header::CONTENT_RANGE,
            header::RETRY_AFTER,
            header::HeaderName::from_static("x-api-version-used"),
            header::HeaderName::from_static("x-request-id"),
            header::HeaderName::from_static("x-bundle-version"),
            header::HeaderName::from_static("x-is-preview"),
            header::HeaderName::from_static("x-export-change-id"),
            header::HeaderName::from_static("x-idempotent-replay"),
        ])
        .max_age(3600)
        // Another origin's actual request is served without CORS headers (the browser enforces
        // the policy); refusing it here would answer with actix's plain-text error.
        .block_on_origin_mismatch(false);
    if origins.iter().any(|o| o == "*") {
        cors = cors.allow_any_origin().send_wildcard();
    } else {
        for origin in origins {
            cors = cors.allowed_origin(origin);
        }
    }
    cors
}
