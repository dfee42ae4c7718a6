//! The scope set's bodies (docs/api.md §20.2).

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

/// The set in force: version 0 and no rules while there is none.
#[derive(Serialize, ToSchema)]
pub struct ScopeSet {
    #[schema(format = DateTime)]
    pub activated_at: Option<String>,
    /// The rules, as `PUT /admin/scopes` takes them; null when no set is in force.
    #[schema(value_type = Option<Vec<Object>>)]
    pub rules: Value,
    pub version: i64,
}

/// `PUT` and `DELETE /admin/scopes`: the version stored, being prepared (202); or, for a `DELETE`
/// with no set in force or being prepared, version 0, already in force (200).
#[derive(Serialize, ToSchema)]
pub struct ScopeChange {
    /// A version that was still being prepared and is replaced by this one.
    pub replaced_version: Option<i64>,
    #[schema(example = "preparing")]
    pub state: &'static str,
    pub version: i64,
}

/// Where the sets stand: the one in force, the one being prepared and how far it got (0..1).
#[derive(Serialize, ToSchema)]
pub struct ScopeStatus {
    pub active_version: i64,
    pub preparing_version: Option<i64>,
    pub progress: f64,
    /// Records the preparation has scanned, of `to_scan` (0 when nothing is being prepared).
    pub scanned: i64,
    pub to_scan: i64,
}

/// What a user receives under the set in force and under the one being prepared.
#[derive(Serialize, ToSchema)]
pub struct ScopePreview {
    pub active: SetPreview,
    pub preparing: Option<SetPreview>,
    pub role: String,
    pub user: String,
}

/// Under one version: whether the user receives everything, the rules that apply to them, and
/// how many live records of each form type they receive (their own included).
#[derive(Serialize, ToSchema)]
pub struct SetPreview {
    pub counts: BTreeMap<String, i64>,
    /// False while the version is being prepared: counts may still grow.
    pub complete: bool,
    pub everything: bool,
    pub rules: Vec<String>,
    pub total: i64,
    pub version: i64,
}
