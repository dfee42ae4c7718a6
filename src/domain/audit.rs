//! The audit log's vocabulary (docs/api.md §18.4): the actions it records, who did one and from
//! where ([`Origin`], captured at the HTTP edge and carried to the transaction that performs the
//! action), the entry written, and the filter of a listing.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::domain::export::{ExportFormat, ExportRequest};
use crate::domain::role::Role;

/// Default and largest page of `GET /admin/audit`.
pub const DEFAULT_LIMIT: i64 = 100;
pub const MAX_LIMIT: i64 = 500;

/// Everything the audit log records. The names are the wire values of `action`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    SignIn,
    SignInFailed,
    RefreshTokenReused,
    UserCreated,
    UserDeleted,
    RoleChanged,
    PasswordReset,
    PasswordChanged,
    AttributesChanged,
    BundlePushed,
    BundleActivated,
    BundleRolledBack,
    BundleVersionRemoved,
    RepositoryReset,
    FormSpecChanged,
    ExportStarted,
    ExportDownloaded,
    ScopeSetChanged,
    ScopeSetActivated,
    ServerStarted,
}

impl Action {
    pub const ALL: [Action; 20] = [
        Action::SignIn,
        Action::SignInFailed,
        Action::RefreshTokenReused,
        Action::UserCreated,
        Action::UserDeleted,
        Action::RoleChanged,
        Action::PasswordReset,
        Action::PasswordChanged,
        Action::AttributesChanged,
        Action::BundlePushed,
        Action::BundleActivated,
        Action::BundleRolledBack,
        Action::BundleVersionRemoved,
        Action::RepositoryReset,
        Action::FormSpecChanged,
        Action::ExportStarted,
        Action::ExportDownloaded,
        Action::ScopeSetChanged,
        Action::ScopeSetActivated,
        Action::ServerStarted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Action::SignIn => "auth.sign_in",
            Action::SignInFailed => "auth.sign_in_failed",
            Action::RefreshTokenReused => "auth.refresh_token_reused",
            Action::UserCreated => "user.create",
            Action::UserDeleted => "user.delete",
            Action::RoleChanged => "user.role_change",
            Action::PasswordReset => "user.password_reset",
            Action::PasswordChanged => "user.password_change",
            Action::AttributesChanged => "user.attributes_change",
            Action::BundlePushed => "bundle.push",
            Action::BundleActivated => "bundle.activate",
            Action::BundleRolledBack => "bundle.rollback",
            Action::BundleVersionRemoved => "bundle.retention_delete",
            Action::RepositoryReset => "repository.reset",
            Action::FormSpecChanged => "formspec.change",
            Action::ExportStarted => "export.start",
            Action::ExportDownloaded => "export.download",
            Action::ScopeSetChanged => "scope.change",
            Action::ScopeSetActivated => "scope.activate",
            Action::ServerStarted => "server.start",
        }
    }

    pub fn parse(raw: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.as_str() == raw)
    }

    /// Whether the action is a write its actor's later reads must reflect (docs/api.md §18.3,
    /// read your writes): it changes users, bundles, form specs or the repository. Signing in and
    /// exporting change nothing a read shows.
    pub fn is_write(self) -> bool {
        match self {
            Action::UserCreated
            | Action::UserDeleted
            | Action::RoleChanged
            | Action::PasswordReset
            | Action::PasswordChanged
            | Action::BundlePushed
            | Action::BundleActivated
            | Action::BundleRolledBack
            | Action::BundleVersionRemoved
            | Action::RepositoryReset
            | Action::FormSpecChanged
            | Action::AttributesChanged
            | Action::ScopeSetChanged
            | Action::ScopeSetActivated => true,
            Action::SignIn
            | Action::SignInFailed
            | Action::RefreshTokenReused
            | Action::ExportStarted
            | Action::ExportDownloaded
            | Action::ServerStarted => false,
        }
    }
}

/// Who did an action and from where.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Origin {
    /// A username (the caller, or the name a failed sign-in tried); `None` for the server itself.
    pub actor: Option<String>,
    pub client_ip: Option<std::net::IpAddr>,
    pub request_id: Option<String>,
    /// The server process that handled it (its host name).
    pub node: String,
}

impl Origin {
    /// The server acting on its own (start-up), on `node`.
    pub fn server(node: &str) -> Self {
        Origin { node: node.to_owned(), ..Origin::default() }
    }

    /// The same request, in the name of another user (a sign-in names who it signs in).
    pub fn as_actor(&self, actor: &str) -> Self {
        Origin { actor: Some(actor.to_owned()), ..self.clone() }
    }

    pub fn entry(&self, action: Action, target: Option<&str>, details: Value) -> Entry {
        Entry { origin: self.clone(), action, target: target.map(str::to_owned), details }
    }
}

/// One audit log row, before the database gives it its id and time.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub origin: Origin,
    pub action: Action,
    pub target: Option<String>,
    pub details: Value,
}

/// The entries of a user update (`PUT /users/{username}`): a role change and a password set by
/// an admin are each an action of their own; a change of the email address alone is not audited.
pub fn user_update_entries(
    origin: &Origin,
    username: &str,
    role: (Role, Role),
    password_set: bool,
) -> Vec<Entry> {
    let mut entries = Vec::new();
    let (from, to) = role;
    if from != to {
        let details = json!({"from": from.as_str(), "to": to.as_str()});
        entries.push(origin.entry(Action::RoleChanged, Some(username), details));
    }
    if password_set {
        entries.push(origin.entry(Action::PasswordReset, Some(username), json!({})));
    }
    entries
}

/// The entries of a bundle upload: the push, and when it is activated at once (`activated` holds
/// the version it replaces), the activation.
pub fn push_entries(
    origin: &Origin,
    version: &str,
    hash: &str,
    activated: Option<Option<String>>,
) -> Vec<Entry> {
    let details = json!({"activate": activated.is_some(), "hash": hash});
    let mut entries = vec![origin.entry(Action::BundlePushed, Some(version), details)];
    if let Some(previous) = activated {
        let details = json!({"previous_version": previous});
        entries.push(origin.entry(Action::BundleActivated, Some(version), details));
    }
    entries
}

/// A bundle switch is a rollback when it goes back to a version uploaded before the active one.
pub fn switch_action(goes_back: bool) -> Action {
    if goes_back {
        Action::BundleRolledBack
    } else {
        Action::BundleActivated
    }
}

/// An export's entry details: its format and filters (`streamed` for the direct downloads).
pub fn export_details(request: &ExportRequest, streamed: bool) -> Value {
    let filter = &request.filter;
    json!({
        "format": request.format.as_str(),
        "form_types": filter.form_types,
        "since_change_id": filter.since_change_id,
        "include_deleted": filter.include_deleted,
        "streamed": streamed,
    })
}

/// A finished job's download: which format; its filters are on the job's `export.start` entry.
pub fn job_download_details(format: ExportFormat) -> Value {
    json!({"format": format.as_str(), "streamed": false})
}

/// What a listing selects; carried in its page tokens with the cursor.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditFilter {
    #[serde(rename = "u", default, skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
    #[serde(rename = "a", default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    #[serde(rename = "s", default, skip_serializing_if = "Option::is_none")]
    pub since: Option<DateTime<Utc>>,
    #[serde(rename = "t", default, skip_serializing_if = "Option::is_none")]
    pub until: Option<DateTime<Utc>>,
}

/// The state of `GET /admin/audit` page tokens: the filter and the last id shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditCursor {
    #[serde(flatten)]
    pub filter: AuditFilter,
    /// Entries strictly older (smaller id) than this one come next.
    pub b: i64,
}

/// `?limit`: the default when absent or ≤ 0, at most [`MAX_LIMIT`] (docs/api.md §1.5).
pub fn clamp_limit(requested: Option<i64>) -> i64 {
    match requested {
        Some(n) if n > 0 => n.min(MAX_LIMIT),
        _ => DEFAULT_LIMIT,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn action_names_round_trip_and_are_unique() {
        for action in Action::ALL {
            assert_eq!(Action::parse(action.as_str()), Some(action));
        }
        let mut names: Vec<_> = Action::ALL.iter().map(|a| a.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Action::ALL.len());
        assert_eq!(Action::parse("user.nonsense"), None);
    }

    #[test]
    fn a_user_update_records_each_audited_change_once() {
        let origin = Origin::server("n1").as_actor("root");
        assert!(user_update_entries(&origin, "ann", (Role::ReadOnly, Role::ReadOnly), false).is_empty());
        let both = user_update_entries(&origin, "ann", (Role::ReadOnly, Role::Admin), true);
        let actions: Vec<_> = both.iter().map(|e| e.action).collect();
        assert_eq!(actions, [Action::RoleChanged, Action::PasswordReset]);
        assert_eq!(both[0].details, json!({"from": "read-only", "to": "admin"}));
        assert_eq!(both[0].target.as_deref(), Some("ann"));
        assert_eq!(both[0].origin.actor.as_deref(), Some("root"));
    }

    #[test]
    fn limits_follow_the_listing_rules() {
        assert_eq!(clamp_limit(None), 100);
        assert_eq!(clamp_limit(Some(0)), 100);
        assert_eq!(clamp_limit(Some(-3)), 100);
        assert_eq!(clamp_limit(Some(7)), 7);
        assert_eq!(clamp_limit(Some(10_000)), 500);
    }
}
