//! Observation reads (docs/api.md §12). A record is the synkronus Observation of §8.7 plus who
//! created it (and in a history, who pushed each revision): an open object here, its fields are
//! described with the sync dialects.

use serde::Serialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;

#[derive(Serialize, ToSchema)]
pub struct ObservationPage {
    pub change_cutoff: i64,
    pub has_more: bool,
    pub next_page_token: String,
    #[schema(value_type = Vec<Object>)]
    pub observations: Vec<Map<String, Value>>,
}

/// A record's revisions, newest first; `next_page_token` only while more remain.
#[derive(Serialize, ToSchema)]
pub struct History {
    pub has_more: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_page_token: Option<String>,
    pub observation_id: String,
    #[schema(value_type = Vec<Object>)]
    pub revisions: Vec<Map<String, Value>>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::wire::tests::assert_map_order;

    #[test]
    fn fields_are_in_map_order() {
        let record: Map<String, Value> = serde_json::from_str(r#"{"b": 1, "a": 2}"#).expect("json");
        assert_map_order(&ObservationPage {
            change_cutoff: 1,
            has_more: false,
            next_page_token: String::new(),
            observations: vec![record.clone()],
        });
        assert_map_order(&History {
            has_more: true,
            next_page_token: Some(String::new()),
            observation_id: String::new(),
            revisions: vec![record],
        });
    }
}
