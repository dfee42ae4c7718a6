//! User field rules (docs/api.md §7.1).

/// The account the server ships with when `ADMIN_USERNAME` and `ADMIN_PASSWORD` are left unset.
/// While it still signs in with this password the server says so: once per start in its log, and
/// to that user through `GET /auth/me` (docs/api.md §6.5, §18.4).
pub const DEFAULT_ADMIN_USERNAME: &str = "admin";
pub const DEFAULT_ADMIN_PASSWORD: &str = "admin";
/// bcrypt cost of stored password hashes (docs/api.md §7.1).
pub const BCRYPT_COST: u32 = 12;

/// Why a username, email or password was refused; the message is shown to the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldProblem(pub &'static str);

pub fn validate_username(name: &str) -> Result<(), FieldProblem> {
    let chars = name.chars().count();
    if chars == 0 || chars > 255 {
        return Err(FieldProblem("username must be 1 to 255 characters"));
    }
    if name.contains('/') || name.chars().any(char::is_control) {
        return Err(FieldProblem("username must not contain '/' or control characters"));
    }
    if name.trim() != name {
        return Err(FieldProblem("username must not start or end with whitespace"));
    }
    Ok(())
}

pub fn validate_email(email: &str) -> Result<(), FieldProblem> {
    if email.chars().count() > 255 || !email.contains('@') || email.chars().any(char::is_control) {
        return Err(FieldProblem("email must contain '@' and be at most 255 characters"));
    }
    Ok(())
}

/// At least 8 characters and at most 72 bytes: bcrypt ignores everything past 72 bytes.
pub fn is_strong_enough(password: &str) -> bool {
    password.chars().count() >= 8 && password.len() <= 72
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn username_rules() {
        assert!(validate_username("enum1").is_ok());
        assert!(validate_username("").is_err());
        assert!(validate_username("a/b").is_err());
        assert!(validate_username(" lead").is_err());
        assert!(validate_username("tab\tname").is_err());
        assert!(validate_username(&"x".repeat(256)).is_err());
    }

    #[test]
    fn password_rules() {
        assert!(!is_strong_enough("short"));
        assert!(is_strong_enough("longenough"));
        assert!(!is_strong_enough(&"é".repeat(37)));
    }
}
