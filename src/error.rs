//! The one error table: every failure the API can report maps to an HTTP status and a stable code
//! here (docs/api.md §4), and every error body is built by `ApiError::error_response`. The
//! layers below have their own errors (`DbError`, the domain's parse errors); they become an
//! `ApiError` here, at the HTTP and actor boundaries, through the `From` impls at the end.

use actix_web::http::{header, StatusCode};
use actix_web::{HttpResponse, ResponseError};
use serde_json::{Map, Value};

use crate::db::{BoxError, Conflict, DbError};
use crate::domain::attachment::InvalidId;
use crate::domain::bundle::BundleRejection;
pub use crate::domain::problem::ItemProblem;
use crate::domain::sync::decode::{DecodeError, DecodeErrorKind};

/// Stable error codes, each with its HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    BadRequest,
    InvalidPageToken,
    WeakPassword,
    InvalidBundle,
    InvalidCredentials,
    InvalidPassword,
    MissingToken,
    InvalidToken,
    TokenExpired,
    Forbidden,
    NotFound,
    MethodNotAllowed,
    UnsupportedApiVersion,
    Conflict,
    TransmissionMismatch,
    AttachmentExists,
    LastAdmin,
    RepositoryResetRequired,
    PayloadTooLarge,
    RangeNotSatisfiable,
    ValidationFailed,
    ClientVersionUnsupported,
    RateLimited,
    Internal,
    ServiceUnavailable,
}

impl ErrorCode {
    pub fn status(self) -> StatusCode {
        use ErrorCode::*;
        match self {
            BadRequest | InvalidPageToken | WeakPassword | InvalidBundle => StatusCode::BAD_REQUEST,
            InvalidCredentials | InvalidPassword | MissingToken | InvalidToken | TokenExpired => {
                StatusCode::UNAUTHORIZED
            }
            Forbidden => StatusCode::FORBIDDEN,
            NotFound => StatusCode::NOT_FOUND,
            MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            UnsupportedApiVersion => StatusCode::NOT_ACCEPTABLE,
            Conflict | TransmissionMismatch | AttachmentExists | LastAdmin | RepositoryResetRequired => {
                StatusCode::CONFLICT
            }
            PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            RangeNotSatisfiable => StatusCode::RANGE_NOT_SATISFIABLE,
            ValidationFailed => StatusCode::UNPROCESSABLE_ENTITY,
            ClientVersionUnsupported => StatusCode::UPGRADE_REQUIRED,
            RateLimited => StatusCode::TOO_MANY_REQUESTS,
            Internal => StatusCode::INTERNAL_SERVER_ERROR,
            ServiceUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    pub fn as_str(self) -> &'static str {
        use ErrorCode::*;
        match self {
            BadRequest => "BAD_REQUEST",
            InvalidPageToken => "INVALID_PAGE_TOKEN",
            WeakPassword => "WEAK_PASSWORD",
            InvalidBundle => "INVALID_BUNDLE",
            InvalidCredentials => "INVALID_CREDENTIALS",
            InvalidPassword => "INVALID_PASSWORD",
            MissingToken => "MISSING_TOKEN",
            InvalidToken => "INVALID_TOKEN",
            TokenExpired => "TOKEN_EXPIRED",
            Forbidden => "FORBIDDEN",
            NotFound => "NOT_FOUND",
            MethodNotAllowed => "METHOD_NOT_ALLOWED",
            UnsupportedApiVersion => "UNSUPPORTED_API_VERSION",
            Conflict => "CONFLICT",
            TransmissionMismatch => "TRANSMISSION_MISMATCH",
            AttachmentExists => "ATTACHMENT_EXISTS",
            LastAdmin => "LAST_ADMIN",
            // The 2026 clients compare this exact lower-case string (docs/api.md §17.2).
            RepositoryResetRequired => "repository_reset_required",
            PayloadTooLarge => "PAYLOAD_TOO_LARGE",
            RangeNotSatisfiable => "RANGE_NOT_SATISFIABLE",
            ValidationFailed => "VALIDATION_FAILED",
            ClientVersionUnsupported => "CLIENT_VERSION_UNSUPPORTED",
            RateLimited => "RATE_LIMITED",
            Internal => "INTERNAL",
            ServiceUnavailable => "SERVICE_UNAVAILABLE",
        }
    }

    /// The code for an error response of `status` that did not come from this table (actix's own).
    pub fn for_status(status: StatusCode) -> Option<ErrorCode> {
        use ErrorCode::*;
        [
            BadRequest,
            Forbidden,
            NotFound,
            MethodNotAllowed,
            UnsupportedApiVersion,
            Conflict,
            PayloadTooLarge,
            RangeNotSatisfiable,
            ValidationFailed,
            RateLimited,
            Internal,
            ServiceUnavailable,
        ]
        .into_iter()
        .find(|c| c.status() == status)
    }

    fn default_message(self) -> &'static str {
        use ErrorCode::*;
        match self {
            BadRequest => "Bad request",
            InvalidPageToken => "Invalid page token",
            WeakPassword => "Password must be 8 to 72 bytes long",
            InvalidBundle => "Invalid app bundle",
            InvalidCredentials => "Invalid credentials",
            InvalidPassword => "Current password is incorrect",
            MissingToken => "Missing bearer token",
            InvalidToken => "Invalid token",
            TokenExpired => "Token expired",
            Forbidden => "Insufficient role for this operation",
            NotFound => "Not found",
            MethodNotAllowed => "Method not allowed",
            UnsupportedApiVersion => "Unsupported API version",
            Conflict => "Conflict",
            TransmissionMismatch => "Transmission id was already used with a different payload",
            AttachmentExists => "Attachment already exists",
            LastAdmin => "The last admin cannot be deleted or demoted",
            RepositoryResetRequired => "The repository was reset; drop local state and sync again",
            PayloadTooLarge => "Request body too large",
            RangeNotSatisfiable => "Requested range not satisfiable",
            ValidationFailed => "Validation failed",
            ClientVersionUnsupported => "Client version not supported by this server",
            RateLimited => "Too many requests",
            Internal => "Internal server error",
            ServiceUnavailable => "Service temporarily unavailable",
        }
    }
}

/// The error every handler returns. Internal causes are logged, never shown.
#[derive(Debug)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    /// What caused it, chain included: logged at error level when the response is built for a
    /// 5xx, never sent.
    source: Option<BoxError>,
    /// Boxed so that `Result<T, ApiError>` stays small on every happy path.
    details: Box<Details>,
}

#[derive(Debug, Default)]
struct Details {
    errors: Vec<ItemProblem>,
    extra: Map<String, Value>,
    headers: Vec<(header::HeaderName, String)>,
}

pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError { code, message: message.into(), source: None, details: Box::default() }
    }

    pub fn of(code: ErrorCode) -> Self {
        Self::new(code, code.default_message())
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::BadRequest, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, message)
    }

    pub fn forbidden() -> Self {
        Self::of(ErrorCode::Forbidden)
    }

    /// An unexpected failure: the cause goes to the log, the client sees a generic 500.
    pub fn internal(cause: impl Into<BoxError>) -> Self {
        Self::of(ErrorCode::Internal).caused_by(cause)
    }

    /// The database is unreachable: 503 with Retry-After so clients back off and retry.
    pub fn unavailable(cause: impl Into<BoxError>) -> Self {
        Self::of(ErrorCode::ServiceUnavailable).caused_by(cause).with_header(header::RETRY_AFTER, "5")
    }

    /// Keeps `cause` as this error's `source()`.
    pub fn caused_by(mut self, cause: impl Into<BoxError>) -> Self {
        self.source = Some(cause.into());
        self
    }

    /// The causes below this error, outermost first, as one log-friendly line ("" when none).
    pub fn cause_chain(&self) -> String {
        let mut parts = Vec::new();
        let mut next = std::error::Error::source(self);
        while let Some(e) = next {
            parts.push(e.to_string());
            next = e.source();
        }
        parts.join(": ")
    }

    /// The 409 a client gets when its repository generation is not the server's (docs/api.md
    /// §17.2): the server's generation in the body and in `x-repository-generation`.
    pub fn reset_required(server_generation: i64) -> Self {
        Self::of(ErrorCode::RepositoryResetRequired)
            .with_header(
                header::HeaderName::from_static("x-repository-generation"),
                server_generation.to_string(),
            )
            .with_extra("repository_generation", server_generation)
    }

    pub fn rate_limited(retry_after_secs: u64) -> Self {
        let secs = retry_after_secs.max(1);
        let mut e = Self::of(ErrorCode::RateLimited).with_header(header::RETRY_AFTER, secs.to_string());
        e.details.extra.insert("retry_after".into(), Value::from(secs));
        e
    }

    pub fn with_errors(mut self, errors: Vec<ItemProblem>) -> Self {
        self.details.errors = errors;
        self
    }

    pub fn with_extra(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.details.extra.insert(key.to_string(), value.into());
        self
    }

    pub fn with_header(mut self, name: header::HeaderName, value: impl Into<String>) -> Self {
        self.details.headers.push((name, value.into()));
        self
    }

    pub fn errors(&self) -> &[ItemProblem] {
        &self.details.errors
    }

    pub fn with_path(self, path: &str) -> Self {
        let message = self.message.clone();
        let code = self.code.as_str();
        self.with_errors(vec![ItemProblem::new(path, code, message)])
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.message)
    }
}

impl std::error::Error for ApiError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// One failure reported to several callers (the pushes of a failed group commit): each caller's
/// error keeps the one original, chain included, as its source.
#[derive(Debug, Clone)]
pub struct SharedError(std::sync::Arc<ApiError>);

impl SharedError {
    pub fn new(e: ApiError) -> Self {
        SharedError(std::sync::Arc::new(e))
    }
}

impl std::fmt::Display for SharedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for SharedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&*self.0)
    }
}

/// At most this many item problems are sent; `detail` states the total.
const MAX_ITEM_PROBLEMS: usize = 100;

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.code.status()
    }

    fn error_response(&self) -> HttpResponse {
        let status = self.code.status();
        let request_id = crate::telemetry::request_id::current();
        if status.is_server_error() {
            tracing::error!(request_id = %request_id, code = self.code.as_str(),
                cause = %self.cause_chain(), "request failed");
        }
        let mut body = Map::new();
        let code = Value::from(self.code.as_str());
        let message = Value::from(self.message.clone());
        body.insert("type".into(), Value::from(format!("urn:synkronus:error:{}", self.code.as_str())));
        body.insert("title".into(), Value::from(status.canonical_reason().unwrap_or("Error")));
        body.insert("status".into(), Value::from(status.as_u16()));
        body.insert("detail".into(), message.clone());
        body.insert("code".into(), code.clone());
        body.insert("error".into(), code);
        body.insert("message".into(), message);
        body.insert("request_id".into(), Value::from(request_id));
        if !self.details.errors.is_empty() {
            let items: Vec<Value> = self
                .details
                .errors
                .iter()
                .take(MAX_ITEM_PROBLEMS)
                .filter_map(|p| serde_json::to_value(p).ok())
                .collect();
            body.insert("errors".into(), Value::Array(items));
        }
        for (k, v) in &self.details.extra {
            body.insert(k.clone(), v.clone());
        }
        let mut builder = HttpResponse::build(status);
        builder.insert_header((header::CONTENT_TYPE, "application/problem+json"));
        if status == StatusCode::UNAUTHORIZED {
            builder.insert_header((header::WWW_AUTHENTICATE, "Bearer"));
        }
        for (name, value) in &self.details.headers {
            builder.insert_header((name.clone(), value.clone()));
        }
        builder.body(Value::Object(body).to_string())
    }
}

impl From<crate::auth::AuthError> for ApiError {
    fn from(e: crate::auth::AuthError) -> Self {
        use crate::auth::AuthError as A;
        match e {
            A::InvalidToken => ApiError::of(ErrorCode::InvalidToken),
            A::TokenExpired => ApiError::of(ErrorCode::TokenExpired),
            A::Forbidden => ApiError::forbidden(),
            A::Db(db) => db.into(),
            A::Internal(_) => ApiError::internal(e),
        }
    }
}

impl From<DbError> for ApiError {
    fn from(e: DbError) -> Self {
        match e {
            DbError::Unavailable(_) => ApiError::unavailable(e),
            DbError::DataException(_) => ApiError::bad_request(
                "The request contains a value the database cannot store (for example a NUL character)",
            )
            .caused_by(e),
            DbError::Conflict(Conflict::LastAdmin) => ApiError::of(ErrorCode::LastAdmin),
            DbError::Conflict(conflict) => ApiError::new(ErrorCode::Conflict, conflict.to_string()),
            DbError::Other(_) => ApiError::internal(e),
        }
    }
}

/// Files the database still names but storage lacks are reported as missing (404), an object
/// store that does not answer as 503, anything else as an internal error.
impl From<crate::storage::StorageError> for ApiError {
    fn from(e: crate::storage::StorageError) -> Self {
        use crate::storage::StorageError as S;
        match e {
            S::Unavailable(_) => ApiError::unavailable(e),
            S::NotFound(_) => ApiError::not_found("The file is not available").caused_by(e),
            S::AlreadyExists(_) | S::Io(_) => ApiError::internal(e),
        }
    }
}

impl From<DecodeError> for ApiError {
    fn from(e: DecodeError) -> Self {
        let code = match e.kind {
            DecodeErrorKind::BadRequest => ErrorCode::BadRequest,
            DecodeErrorKind::ValidationFailed => ErrorCode::ValidationFailed,
            DecodeErrorKind::InvalidPageToken => ErrorCode::InvalidPageToken,
        };
        ApiError::new(code, e.message).with_errors(e.problems)
    }
}

impl From<BundleRejection> for ApiError {
    fn from(rejection: BundleRejection) -> Self {
        let total = rejection.problems.len();
        let message =
            format!("App bundle validation failed at the {} step: {total} problem(s)", rejection.step);
        let errors = rejection
            .problems
            .into_iter()
            .map(|problem| ItemProblem::new(problem.path, problem.code, problem.message))
            .collect();
        ApiError::new(ErrorCode::InvalidBundle, message).with_errors(errors)
    }
}

impl From<InvalidId> for ApiError {
    fn from(e: InvalidId) -> Self {
        ApiError::bad_request(e.to_string())
    }
}

impl From<tokio_postgres::Error> for ApiError {
    fn from(e: tokio_postgres::Error) -> Self {
        DbError::from(e).into()
    }
}

impl From<deadpool_postgres::PoolError> for ApiError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        DbError::from(e).into()
    }
}

impl From<std::io::Error> for ApiError {
    fn from(e: std::io::Error) -> Self {
        ApiError::internal(e)
    }
}

impl From<actix_web::error::BlockingError> for ApiError {
    fn from(e: actix_web::error::BlockingError) -> Self {
        ApiError::internal(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::sync::decode::decode_push;

    fn io_cause() -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused")
    }

    #[test]
    fn each_db_error_kind_has_one_status() {
        let unavailable = ApiError::from(DbError::Unavailable(Box::new(io_cause())));
        assert_eq!(unavailable.code, ErrorCode::ServiceUnavailable);
        assert!(unavailable.details.headers.iter().any(|(name, v)| name == header::RETRY_AFTER && v == "5"));
        let taken = ApiError::from(DbError::Conflict(Conflict::UsernameTaken("ana".into())));
        assert_eq!(
            (taken.code, taken.message.as_str()),
            (ErrorCode::Conflict, "Username 'ana' is already taken")
        );
        assert_eq!(ApiError::from(DbError::Conflict(Conflict::LastAdmin)).code, ErrorCode::LastAdmin);
        assert_eq!(ApiError::from(DbError::other("broken")).code, ErrorCode::Internal);
    }

    #[test]
    fn the_cause_chain_survives_to_the_log() {
        let e = ApiError::from(DbError::Unavailable(Box::new(io_cause())));
        assert_eq!(e.cause_chain(), "database unavailable: connection refused");
        let source = std::error::Error::source(&e).expect("a source");
        assert!(source.downcast_ref::<DbError>().is_some_and(DbError::is_unavailable));
        // A shared cause (one failed group commit answering several pushes) keeps the chain too.
        let shared = SharedError::new(e);
        let copy = ApiError::internal(shared.clone());
        assert_eq!(
            copy.cause_chain(),
            "SERVICE_UNAVAILABLE: Service temporarily unavailable: database unavailable: connection refused"
        );
        assert_eq!(ApiError::of(ErrorCode::NotFound).cause_chain(), "");
    }

    #[test]
    fn decode_errors_map_to_their_codes() {
        let e = ApiError::from(decode_push(&serde_json::json!([])).expect_err("not an object"));
        assert_eq!(e.code, ErrorCode::BadRequest);
        let body = serde_json::json!({"transmission_id": "t", "client_id": "c", "records": [{"data": 1}]});
        let e = ApiError::from(decode_push(&body).expect_err("bad record"));
        assert_eq!(e.code, ErrorCode::ValidationFailed);
        assert!(!e.errors().is_empty());
    }
}
