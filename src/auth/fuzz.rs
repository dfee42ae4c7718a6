//! Property suite of token verification: garbage and every mutation of a real token are refused
//! with a plain 401 code, never a panic.

use std::time::Duration;

use proptest::prelude::*;

use crate::auth::AuthService;
use crate::db::users::UserRow;
use crate::domain::role::Role;
use crate::testing::*;

const SECRET: &[u8] = b"fuzz-secret-fuzz-secret-fuzz-secret-0123";
const B64URL: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

fn service() -> AuthService {
    AuthService::new(SECRET, Duration::from_secs(3600), Duration::from_secs(7200)).expect("auth service")
}

fn real_token(auth: &AuthService) -> String {
    let user = UserRow {
        id: uuid::Uuid::new_v4(),
        username: "fuzz".into(),
        email: None,
        role: Role::Admin,
        password_hash: String::new(),
        token_generation: 1,
        created_at: chrono::Utc::now(),
        last_login: None,
        attributes: serde_json::json!({}),
    };
    auth.issue_access_token(&user).expect("token").token
}

proptest! {
    #![proptest_config(config(128))]

    #[test]
    fn arbitrary_strings_are_refused(token in any::<String>()) {
        prop_assert!(service().decode(&token).is_err());
    }

    #[test]
    fn dotted_garbage_is_refused(parts in proptest::collection::vec("[A-Za-z0-9_\\-]{0,80}", 0..5)) {
        prop_assert!(service().decode(&parts.join(".")).is_err());
    }

    /// Any change to a real token's characters is refused (no malleable signature, no
    /// accepted alternative encoding), and the error is a plain 401 code.
    #[test]
    fn mutated_real_tokens_are_refused(at in any::<prop::sample::Index>(), pick in any::<prop::sample::Index>()) {
        let auth = service();
        let token = real_token(&auth);
        prop_assert!(auth.decode(&token).is_ok());
        let mut bytes = token.clone().into_bytes();
        let i = at.index(bytes.len());
        let mut replacement = B64URL[pick.index(B64URL.len())];
        if replacement == bytes[i] {
            replacement = if bytes[i] == b'A' { b'B' } else { b'A' };
        }
        bytes[i] = replacement;
        let mutated = String::from_utf8(bytes).expect("ascii");
        match auth.decode(&mutated) {
            Ok(_) => prop_assert!(false, "mutated token accepted: {} -> {}", token, mutated),
            Err(error) => prop_assert!(matches!(error, crate::auth::AuthError::InvalidToken)),
        }
    }

    #[test]
    fn truncated_or_extended_real_tokens_are_refused(cut in any::<prop::sample::Index>(), tail in "[A-Za-z0-9_\\-.]{1,8}") {
        let auth = service();
        let token = real_token(&auth);
        let short = &token[..cut.index(token.len())];
        prop_assert!(auth.decode(short).is_err());
        let extended = format!("{token}{tail}");
        prop_assert!(auth.decode(&extended).is_err());
    }
}
