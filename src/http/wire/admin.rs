//! Repository reset and the device list (docs/api.md §17.3, §17.4).

use serde::{Deserialize, Serialize};
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::wire::tests::assert_map_order;

    #[test]
    fn fields_are_in_map_order() {
        assert_map_order(&ResetAnswer { current_version: 1, message: "", repository_generation: 2 });
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
