//! Repository reset, the device list and the audit log (docs/api.md §17.3, §17.4, §18.4).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::Text;

/// The reset happens only with `"confirm": "RESET_REPOSITORY"`.
#[derive(Deserialize, ToSchema)]
pub struct ResetRequest {
    #[serde(default)]
    #[schema(value_type = String, required = true, example = "RESET_REPOSITORY")]
    pub confirm: Text,
}

#[derive(Serialize, ToSchema)]
pub struct ResetAnswer {
    pub current_version: i64,
    pub message: &'static str,
    pub repository_generation: i64,
}

/// A device seen by the server, with how far its data lags behind the head.
#[derive(Serialize, ToSchema)]
pub struct Device {
    pub app_bundle_version: Option<String>,
    pub client_id: String,
    pub client_version: Option<String>,
    pub lag: Option<i64>,
    pub last_data_version: Option<i64>,
    #[schema(format = DateTime)]
    pub last_seen_at: String,
    pub username: String,
}

/// One audit log entry: who (`actor`, from `client_ip`, in request `request_id`, on `node`) did
/// what (`action`) to what (`target`), and when.
#[derive(Serialize, ToSchema)]
pub struct AuditEntry {
    #[schema(example = "user.role_change")]
    pub action: String,
    /// A username; null for the server itself (`server.start`).
    pub actor: Option<String>,
    #[schema(format = DateTime)]
    pub at: String,
    pub client_ip: Option<String>,
    /// What the action needs besides its target (a role's old and new value, an export's filters).
    #[schema(value_type = Object)]
    pub details: Value,
    pub id: i64,
    pub node: String,
    pub request_id: Option<String>,
    pub target: Option<String>,
}

/// A page of the audit log, newest first; `next_page_token` is null on the last page.
#[derive(Serialize, ToSchema)]
pub struct AuditPage {
    pub items: Vec<AuditEntry>,
    pub next_page_token: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::wire::tests::assert_map_order;

    #[test]
    fn fields_are_in_map_order() {
        assert_map_order(&ResetAnswer { current_version: 1, message: "", repository_generation: 2 });
        let entry = AuditEntry {
            action: String::new(),
            actor: None,
            at: String::new(),
            client_ip: None,
            details: Value::Null,
            id: 1,
            node: String::new(),
            request_id: None,
            target: None,
        };
        assert_map_order(&entry);
        assert_map_order(&AuditPage { items: vec![entry], next_page_token: None });
        assert_map_order(&Device {
            app_bundle_version: None,
            client_id: String::new(),
            client_version: Some(String::new()),
            lag: Some(0),
            last_data_version: None,
            last_seen_at: String::new(),
            username: String::new(),
        });
    }
}
