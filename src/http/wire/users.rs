//! User bodies (docs/api.md §7) and the presence of a user's devices (§17.4).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{required_of, Text};
use crate::db::presence::DeviceRow;
use crate::db::users::UserRow;
use crate::domain::role::Role;
use crate::domain::time;
use crate::error::ApiResult;

/// A role as the API names it.
#[derive(Serialize, ToSchema, Clone, Copy, Debug, PartialEq)]
#[serde(rename_all = "kebab-case")]
pub enum RoleName {
    ReadOnly,
    ReadWrite,
    Admin,
}

impl From<Role> for RoleName {
    fn from(role: Role) -> Self {
        match role {
            Role::ReadOnly => RoleName::ReadOnly,
            Role::ReadWrite => RoleName::ReadWrite,
            Role::Admin => RoleName::Admin,
        }
    }
}

/// The user object (never the password). `createdAt` repeats `created_at` for camelCase clients.
#[derive(Serialize, ToSchema)]
pub struct User {
    /// Attribute name → values, compared by scope rules (docs/api.md §20.1); `{}` by default.
    #[schema(value_type = Object)]
    pub attributes: serde_json::Value,
    #[serde(rename = "createdAt")]
    #[schema(format = DateTime)]
    pub created_at_camel: String,
    #[schema(format = DateTime)]
    pub created_at: String,
    pub email: Option<String>,
    pub id: String,
    #[schema(format = DateTime)]
    pub last_login: Option<String>,
    pub role: RoleName,
    pub roles: Vec<RoleName>,
    pub username: String,
}

impl From<&UserRow> for User {
    fn from(u: &UserRow) -> Self {
        let role = RoleName::from(u.role);
        User {
            created_at_camel: time::format(u.created_at),
            created_at: time::format(u.created_at),
            email: u.email.clone(),
            id: u.id.to_string(),
            last_login: u.last_login.map(time::format),
            role,
            roles: vec![role],
            username: u.username.clone(),
            attributes: u.attributes.clone(),
        }
    }
}

/// A user in `GET /users`, with the devices seen for it (null when none ever was).
#[derive(Serialize, ToSchema)]
pub struct ListedUser {
    #[schema(value_type = Object)]
    pub attributes: serde_json::Value,
    #[serde(rename = "createdAt")]
    #[schema(format = DateTime)]
    pub created_at_camel: String,
    #[schema(format = DateTime)]
    pub created_at: String,
    pub email: Option<String>,
    pub id: String,
    #[schema(format = DateTime)]
    pub last_login: Option<String>,
    pub presence: Option<Presence>,
    pub role: RoleName,
    pub roles: Vec<RoleName>,
    pub username: String,
}

impl ListedUser {
    pub fn new(user: User, presence: Option<Presence>) -> Self {
        ListedUser {
            created_at_camel: user.created_at_camel,
            created_at: user.created_at,
            email: user.email,
            id: user.id,
            last_login: user.last_login,
            presence,
            role: user.role,
            roles: user.roles,
            username: user.username,
            attributes: user.attributes,
        }
    }
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Presence {
    pub client_count: usize,
    pub clients: Vec<PresenceClient>,
    #[schema(format = DateTime)]
    pub last_seen_at: String,
}

impl Presence {
    /// None for a user no device was ever seen for.
    pub fn of(devices: &[DeviceRow]) -> Option<Self> {
        let last = devices.iter().map(|d| d.last_seen_at).max()?;
        let clients: Vec<PresenceClient> = devices.iter().map(PresenceClient::from).collect();
        Some(Presence { client_count: clients.len(), clients, last_seen_at: time::format(last) })
    }
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PresenceClient {
    pub app_bundle_version: Option<String>,
    pub client_id: String,
    pub last_data_version: Option<i64>,
    pub last_ode_version: Option<String>,
    #[schema(format = DateTime)]
    pub last_seen_at: String,
}

impl From<&DeviceRow> for PresenceClient {
    fn from(d: &DeviceRow) -> Self {
        PresenceClient {
            app_bundle_version: d.app_bundle_version.clone(),
            client_id: d.client_id.clone(),
            last_data_version: d.last_data_version,
            last_ode_version: d.client_version.clone(),
            last_seen_at: time::format(d.last_seen_at),
        }
    }
}

#[derive(Deserialize, ToSchema)]
pub struct CreateUser {
    #[serde(default)]
    #[schema(value_type = String, required = true)]
    pub username: Text,
    #[serde(default)]
    #[schema(value_type = String, required = true)]
    pub password: Text,
    #[serde(default)]
    /// `read-only`, `read-write` or `admin` (also `readonly`, `read_only`, `user`, any case).
    #[schema(value_type = String, required = true)]
    pub role: Text,
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub email: Text,
}

/// Changes to a user; absent fields stay as they are, `"email": null` removes the address.
#[derive(Deserialize, ToSchema)]
pub struct UpdateUser {
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub role: Text,
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub email: Text,
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub password: Text,
    /// Replaces all of the user's attributes (docs/api.md §20.1).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub attributes: Option<serde_json::Value>,
}

#[derive(Deserialize, ToSchema)]
pub struct ResetPassword {
    #[serde(default)]
    #[schema(value_type = String, required = true)]
    pub username: Text,
    #[serde(default)]
    /// Required in one of its spellings (`new_password` wins).
    #[schema(value_type = Option<String>)]
    pub new_password: Text,
    #[serde(default, rename = "newPassword")]
    #[schema(value_type = Option<String>)]
    pub new_password_camel: Text,
}

impl ResetPassword {
    pub fn new_password(&self) -> ApiResult<&str> {
        required_of(&[(&self.new_password, "new_password"), (&self.new_password_camel, "newPassword")])
    }
}

/// Both passwords are required, each in one of its spellings (snake_case wins).
#[derive(Deserialize, ToSchema)]
pub struct ChangePassword {
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub current_password: Text,
    #[serde(default, rename = "currentPassword")]
    #[schema(value_type = Option<String>)]
    pub current_password_camel: Text,
    #[serde(default, rename = "oldPassword")]
    #[schema(value_type = Option<String>)]
    pub old_password: Text,
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub new_password: Text,
    #[serde(default, rename = "newPassword")]
    #[schema(value_type = Option<String>)]
    pub new_password_camel: Text,
}

impl ChangePassword {
    pub fn current_password(&self) -> ApiResult<&str> {
        required_of(&[
            (&self.current_password, "current_password"),
            (&self.current_password_camel, "currentPassword"),
            (&self.old_password, "oldPassword"),
        ])
    }

    pub fn new_password(&self) -> ApiResult<&str> {
        required_of(&[(&self.new_password, "new_password"), (&self.new_password_camel, "newPassword")])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::wire::tests::assert_map_order;

    #[test]
    fn fields_are_in_map_order() {
        let device = DeviceRow {
            username: "u".into(),
            client_id: "c".into(),
            last_seen_at: chrono::Utc::now(),
            last_data_version: Some(3),
            app_bundle_version: None,
            client_version: Some("1".into()),
        };
        let user = User {
            attributes: serde_json::json!({}),
            created_at_camel: String::new(),
            created_at: String::new(),
            email: None,
            id: String::new(),
            last_login: None,
            role: RoleName::Admin,
            roles: vec![RoleName::Admin],
            username: String::new(),
        };
        assert_map_order(&user);
        assert_map_order(&ListedUser::new(user, Presence::of(&[device])));
        assert_eq!(serde_json::to_value(RoleName::ReadWrite).expect("json"), "read-write");
    }
}
