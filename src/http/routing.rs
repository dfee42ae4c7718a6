//! Route helpers: GET routes also answer HEAD, and a known path with the wrong method answers 405
//! with an `Allow` header and the standard error body.

use actix_web::http::header;
use actix_web::{guard, web, HttpResponse, Resource, Route};

use crate::error::{ApiError, ErrorCode};

/// A route for GET that also serves HEAD (actix sends HEAD responses without the body).
pub fn get() -> Route {
    web::route().guard(guard::Any(guard::Get()).or(guard::Head()))
}

/// A resource whose unmatched methods get 405 listing `allow`.
pub fn resource(path: &str, allow: &'static str) -> Resource {
    web::resource(path).default_service(web::to(move || async move {
        Err::<HttpResponse, _>(ApiError::of(ErrorCode::MethodNotAllowed).with_header(header::ALLOW, allow))
    }))
}

pub async fn not_found() -> Result<HttpResponse, ApiError> {
    Err(ApiError::not_found("No such route"))
}
