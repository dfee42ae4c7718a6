//! One problem found in one item of a request (a record, a bundle file): where, what, and why.
//! Domain checks collect these; the HTTP layer lists them in the error body.

use serde::Serialize;

/// One item problem inside an error body.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ItemProblem {
    #[serde(rename = "recordId", skip_serializing_if = "Option::is_none")]
    pub record_id: Option<String>,
    pub path: String,
    pub code: String,
    pub message: String,
}

impl ItemProblem {
    pub fn new(path: impl Into<String>, code: impl Into<String>, message: impl Into<String>) -> Self {
        ItemProblem { record_id: None, path: path.into(), code: code.into(), message: message.into() }
    }
}
