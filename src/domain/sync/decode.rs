//! Wire -> internal model for push and pull, with the validation order of docs/api.md §8.3: the
//! errors both share and the request fields both read here, then each in its own file.

mod pull;
mod push;

use serde_json::{Map, Value};

pub use self::pull::{decode_pull, decode_pull_query, PullQuery};
pub use self::push::{decode_push, decode_push_body};

use crate::domain::problem::ItemProblem;

const MAX_ID_CHARS: usize = 255;

/// Why a push or pull request was refused. The HTTP layer gives each kind its status and code.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct DecodeError {
    pub kind: DecodeErrorKind,
    pub message: String,
    /// Where the request went wrong; for `ValidationFailed`, every record problem found.
    pub problems: Vec<ItemProblem>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeErrorKind {
    /// The request as a whole is malformed.
    BadRequest,
    /// The request is well-formed but some of its records are not; nothing is stored.
    ValidationFailed,
    /// The page token is not one this server issued for this listing.
    InvalidPageToken,
}

type DecodeResult<T> = Result<T, DecodeError>;

impl DecodeError {
    fn bad_request(message: impl Into<String>) -> Self {
        DecodeError { kind: DecodeErrorKind::BadRequest, message: message.into(), problems: Vec::new() }
    }

    /// Names the one place that is wrong, as a problem with the request's own message.
    fn with_path(mut self, path: &str) -> Self {
        self.problems = vec![ItemProblem::new(path, "BAD_REQUEST", self.message.clone())];
        self
    }

    fn invalid_page_token() -> Self {
        DecodeError {
            kind: DecodeErrorKind::InvalidPageToken,
            message: "Invalid page token".into(),
            problems: Vec::new(),
        }
    }
}

fn object(body: &Value) -> DecodeResult<&Map<String, Value>> {
    body.as_object().ok_or_else(|| DecodeError::bad_request("Request body must be a JSON object"))
}

/// A required identifier-like string field of the request: 1–255 characters, no NUL.
fn request_id_field(obj: &Map<String, Value>, key: &str) -> DecodeResult<String> {
    match obj.get(key) {
        Some(Value::String(s)) if valid_free_form_id(s) => Ok(s.clone()),
        Some(Value::String(_)) => {
            Err(DecodeError::bad_request(format!("'{key}' must be 1 to 255 characters"))
                .with_path(&format!("/{key}")))
        }
        None | Some(Value::Null) => {
            Err(DecodeError::bad_request(format!("'{key}' is required")).with_path(&format!("/{key}")))
        }
        Some(_) => {
            Err(DecodeError::bad_request(format!("'{key}' must be a string")).with_path(&format!("/{key}")))
        }
    }
}

/// Free-form ids: 1–255 characters; NUL cannot be stored in PostgreSQL text.
pub fn valid_free_form_id(s: &str) -> bool {
    !s.is_empty() && s.chars().count() <= MAX_ID_CHARS && !s.contains('\0')
}
