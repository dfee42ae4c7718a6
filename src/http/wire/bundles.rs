//! App bundle bodies (docs/api.md §9, §17.6). Manifests and change lists are open objects: their
//! keys are file paths and form names.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::Text;
use crate::domain::formspec::KeptFormSpec;

/// The upload: the ZIP in the part `bundle` (or `file`), optionally `activate=true`.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct BundleUpload {
    #[schema(value_type = String, format = Binary)]
    bundle: Vec<u8>,
    activate: Option<bool>,
}

#[derive(Serialize, ToSchema)]
pub struct PushAnswer {
    pub active: bool,
    #[schema(value_type = Object)]
    pub manifest: Value,
    pub message: &'static str,
    pub version: String,
    pub warnings: Vec<BundleWarning>,
}

/// `FORMSPEC_CONFLICT`: a form of the activated bundle names a spec version that already exists
/// with other content; the existing spec was kept (docs/api.md §11.2).
#[derive(Serialize, ToSchema)]
pub struct BundleWarning {
    #[schema(example = "FORMSPEC_CONFLICT")]
    pub code: &'static str,
    pub form: String,
    pub message: String,
    pub version: String,
}

impl From<KeptFormSpec> for BundleWarning {
    fn from(kept: KeptFormSpec) -> Self {
        BundleWarning {
            code: "FORMSPEC_CONFLICT",
            message: kept.message(),
            form: kept.form_type,
            version: kept.version,
        }
    }
}

#[derive(Deserialize, ToSchema)]
pub struct SwitchRequest {
    #[serde(default)]
    #[schema(value_type = String, required = true)]
    pub version: Text,
}

#[derive(Serialize, ToSchema)]
pub struct SwitchAnswer {
    pub message: String,
    pub previous_version: Option<String>,
    pub version: String,
    pub warnings: Vec<BundleWarning>,
}

/// Stored versions, newest first: objects, or for `x-api-version: 1.0` clients the version ids
/// with the active one marked `" *"`.
#[derive(Serialize, ToSchema)]
pub struct BundleVersions {
    pub versions: Vec<BundleVersionEntry>,
}

#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub enum BundleVersionEntry {
    Listed(BundleVersion),
    Marked(String),
}

#[derive(Serialize, ToSchema)]
pub struct BundleVersion {
    pub active: bool,
    #[schema(format = DateTime)]
    pub created_at: String,
    pub name: String,
    pub version: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::wire::tests::assert_map_order;

    #[test]
    fn fields_are_in_map_order() {
        assert_map_order(&PushAnswer {
            active: true,
            manifest: serde_json::json!({"b": 1, "a": 2}),
            message: "",
            version: String::new(),
            warnings: vec![BundleWarning::from(KeptFormSpec { form_type: "f".into(), version: "1".into() })],
        });
        assert_map_order(&SwitchAnswer {
            message: String::new(),
            previous_version: None,
            version: String::new(),
            warnings: vec![],
        });
        let listed = BundleVersion {
            active: true,
            created_at: String::new(),
            name: String::new(),
            version: String::new(),
        };
        assert_map_order(&BundleVersions {
            versions: vec![BundleVersionEntry::Listed(listed), BundleVersionEntry::Marked("1 *".into())],
        });
    }
}
