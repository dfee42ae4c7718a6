//! Form specification bodies (docs/api.md §11.1).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::Text;
use crate::db::formspecs::{FormSpecRow, FormSpecSummary};
use crate::domain::time;

/// A form spec to register. Each field has its spellings; the first one listed wins.
#[derive(Deserialize, ToSchema)]
pub struct FormSpecRequest {
    #[serde(default, rename = "formType")]
    #[schema(value_type = Option<String>)]
    pub form_type_camel: Text,
    /// Required in one of its spellings: 1 to 255 characters without `/`.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub form_type: Text,
    #[serde(default)]
    #[schema(value_type = String, required = true)]
    pub version: Text,
    /// A JSON Schema (draft 2020-12 or 7).
    #[serde(default)]
    #[schema(value_type = Object, required = true)]
    pub schema: Option<Value>,
    /// Required in one of its spellings.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub uischema: Option<Value>,
    #[serde(default, rename = "uiSchema")]
    #[schema(value_type = Option<Object>)]
    pub uischema_camel: Option<Value>,
    #[serde(default, rename = "ui_schema")]
    #[schema(value_type = Option<Object>)]
    pub uischema_snake: Option<Value>,
}

/// One form spec. `formType` repeats `form_type` for camelCase clients.
#[derive(Serialize, ToSchema)]
pub struct FormSpec {
    #[schema(format = DateTime)]
    pub created_at: String,
    #[serde(rename = "formType")]
    pub form_type_camel: String,
    pub form_type: String,
    #[schema(value_type = Object)]
    pub schema: Value,
    /// `api` or the bundle version that registered it.
    pub source: String,
    #[schema(value_type = Object)]
    pub uischema: Value,
    pub version: String,
}

impl From<&FormSpecRow> for FormSpec {
    fn from(spec: &FormSpecRow) -> Self {
        FormSpec {
            created_at: time::format(spec.created_at),
            form_type_camel: spec.form_type.clone(),
            form_type: spec.form_type.clone(),
            schema: spec.schema.clone(),
            source: spec.source.clone(),
            uischema: spec.uischema.clone(),
            version: spec.version.clone(),
        }
    }
}

/// `GET /formspecs`: the latest version of each form.
#[derive(Serialize, ToSchema)]
pub struct FormSpecList {
    pub formspecs: Vec<FormSpecListed>,
}

#[derive(Serialize, ToSchema)]
pub struct FormSpecListed {
    #[schema(format = DateTime)]
    pub created_at: String,
    #[serde(rename = "formType")]
    pub form_type_camel: String,
    pub form_type: String,
    pub source: String,
    pub version: String,
}

impl From<&FormSpecSummary> for FormSpecListed {
    fn from(s: &FormSpecSummary) -> Self {
        FormSpecListed {
            created_at: time::format(s.created_at),
            form_type_camel: s.form_type.clone(),
            form_type: s.form_type.clone(),
            source: s.source.clone(),
            version: s.version.clone(),
        }
    }
}

/// `GET /formspecs/{form_type}`: a form's versions.
#[derive(Serialize, ToSchema)]
pub struct FormSpecVersions {
    #[serde(rename = "formType")]
    pub form_type_camel: String,
    pub form_type: String,
    pub versions: Vec<FormSpecVersion>,
}

#[derive(Serialize, ToSchema)]
pub struct FormSpecVersion {
    #[schema(format = DateTime)]
    pub created_at: String,
    pub source: String,
    pub version: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::wire::tests::assert_map_order;

    #[test]
    fn fields_are_in_map_order() {
        let row = FormSpecRow {
            form_type: "f".into(),
            version: "1".into(),
            schema: serde_json::json!({"type": "object", "properties": {}}),
            uischema: serde_json::json!({}),
            source: "api".into(),
            created_at: chrono::Utc::now(),
        };
        assert_map_order(&FormSpec::from(&row));
        let summary = FormSpecSummary {
            form_type: "f".into(),
            version: "1".into(),
            source: "api".into(),
            created_at: chrono::Utc::now(),
        };
        assert_map_order(&FormSpecList { formspecs: vec![FormSpecListed::from(&summary)] });
        assert_map_order(&FormSpecVersions {
            form_type_camel: String::new(),
            form_type: String::new(),
            versions: vec![FormSpecVersion {
                created_at: String::new(),
                source: String::new(),
                version: String::new(),
            }],
        });
    }
}
