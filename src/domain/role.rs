//! Roles: `read-only` ⊂ `read-write` ⊂ `admin` (docs/api.md §3).

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    ReadOnly,
    ReadWrite,
    Admin,
}

impl Role {
    /// Parses input names case-insensitively, accepting the variant-R1 alias `user`.
    pub fn parse(raw: &str) -> Option<Role> {
        match raw.trim().to_ascii_lowercase().as_str() {
            "read-only" | "readonly" | "read_only" => Some(Role::ReadOnly),
            "read-write" | "readwrite" | "read_write" | "user" => Some(Role::ReadWrite),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::ReadOnly => "read-only",
            Role::ReadWrite => "read-write",
            Role::Admin => "admin",
        }
    }

    /// True when this role includes everything `required` may do.
    pub fn allows(self, required: Role) -> bool {
        self >= required
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_aliases_case_insensitively() {
        assert_eq!(Role::parse("ADMIN"), Some(Role::Admin));
        assert_eq!(Role::parse("user"), Some(Role::ReadWrite));
        assert_eq!(Role::parse("Read-Only"), Some(Role::ReadOnly));
        assert_eq!(Role::parse("root"), None);
    }

    #[test]
    fn roles_nest() {
        assert!(Role::Admin.allows(Role::ReadWrite));
        assert!(Role::ReadWrite.allows(Role::ReadOnly));
        assert!(!Role::ReadOnly.allows(Role::ReadWrite));
    }
}
