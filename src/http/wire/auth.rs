//! Login, refresh, logout, me and verify bodies (docs/api.md §6).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::users::{RoleName, User};
use super::{first_of, required_of, Text};
use crate::error::ApiResult;

#[derive(Deserialize, ToSchema)]
pub struct LoginRequest {
    #[serde(default)]
    #[schema(value_type = String, required = true)]
    pub username: Text,
    #[serde(default)]
    #[schema(value_type = String, required = true)]
    pub password: Text,
}

/// A refresh token, in either spelling (`refresh_token` wins).
#[derive(Deserialize, ToSchema)]
pub struct RefreshRequest {
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub refresh_token: Text,
    #[serde(default, rename = "refreshToken")]
    #[schema(value_type = Option<String>)]
    pub refresh_token_camel: Text,
}

impl RefreshRequest {
    pub fn required(&self) -> ApiResult<&str> {
        required_of(&[(&self.refresh_token, "refresh_token"), (&self.refresh_token_camel, "refreshToken")])
    }

    pub fn optional(&self) -> ApiResult<Option<&str>> {
        first_of(&[(&self.refresh_token, "refresh_token"), (&self.refresh_token_camel, "refreshToken")])
    }
}

/// The answer to a login or a refresh: both spellings of every field clients read.
#[derive(Serialize, ToSchema)]
pub struct TokenPair {
    /// Unix seconds.
    #[serde(rename = "expiresAt")]
    pub expires_at: i64,
    #[serde(rename = "expiresIn")]
    pub expires_in_camel: u64,
    pub expires_in: u64,
    #[serde(rename = "refreshToken")]
    pub refresh_token_camel: String,
    pub refresh_token: String,
    pub token: String,
    pub user: TokenUser,
}

/// The user inside a token answer.
#[derive(Serialize, ToSchema)]
pub struct TokenUser {
    #[schema(format = DateTime)]
    pub created_at: String,
    pub email: Option<String>,
    pub id: String,
    pub role: RoleName,
    pub roles: Vec<RoleName>,
    pub username: String,
}

impl From<User> for TokenUser {
    fn from(u: User) -> Self {
        TokenUser {
            created_at: u.created_at,
            email: u.email,
            id: u.id,
            role: u.role,
            roles: u.roles,
            username: u.username,
        }
    }
}

/// `GET /auth/me`.
#[derive(Serialize, ToSchema)]
pub struct Me {
    pub data: MeUser,
}

#[derive(Serialize, ToSchema)]
pub struct MeUser {
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

impl From<User> for MeUser {
    fn from(u: User) -> Self {
        MeUser {
            created_at: u.created_at,
            email: u.email,
            id: u.id,
            last_login: u.last_login,
            role: u.role,
            roles: u.roles,
            username: u.username,
        }
    }
}

/// `GET /auth/verify`: what the presented token is worth. `valid` is always there; a valid token
/// adds who and until when, an invalid one the error code it would get.
#[derive(Serialize, Default, ToSchema)]
pub struct Verification {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime)]
    pub expires_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<RoleName>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    pub valid: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::wire::tests::assert_map_order;

    fn user() -> TokenUser {
        TokenUser {
            created_at: String::new(),
            email: None,
            id: String::new(),
            role: RoleName::Admin,
            roles: vec![RoleName::Admin],
            username: String::new(),
        }
    }

    #[test]
    fn fields_are_in_map_order() {
        assert_map_order(&TokenPair {
            expires_at: 1,
            expires_in_camel: 2,
            expires_in: 2,
            refresh_token_camel: String::new(),
            refresh_token: String::new(),
            token: String::new(),
            user: user(),
        });
        assert_map_order(&Me {
            data: MeUser {
                created_at: String::new(),
                email: Some(String::new()),
                id: String::new(),
                last_login: None,
                role: RoleName::ReadOnly,
                roles: vec![],
                username: String::new(),
            },
        });
        assert_map_order(&Verification {
            error: Some("x"),
            expires_at: Some(String::new()),
            role: Some(RoleName::ReadWrite),
            username: Some(String::new()),
            valid: true,
        });
    }
}
