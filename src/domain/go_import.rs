//! The rules of the import from Go Synkronus (docs/api.md §19): what the source's schema says
//! about its generation, how its roles, versions and attachment operations map onto ours, and
//! which ids its bundle versions may keep. No I/O: `src/import/` reads and writes.

use std::fmt;

use crate::domain::role::Role;

/// What `information_schema` says the source has (docs/api.md §19.1).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SchemaFacts {
    pub has_users: bool,
    pub has_observations: bool,
    pub has_attachment_operations: bool,
    pub has_sync_version: bool,
    /// 2026: `observations.author`, `device_id`, `tags`.
    pub has_author: bool,
    pub has_device_id: bool,
    pub has_tags: bool,
    /// 2026: `sync_version.repository_generation`.
    pub has_generation: bool,
    /// 2026: `user_client_presence`.
    pub has_presence: bool,
}

/// The Go server's schema generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Generation {
    /// December 2025: no author/device/tags, no presence, no repository generation.
    Dec2025,
    /// 2026: any of the additions.
    Y2026,
}

impl fmt::Display for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Generation::Dec2025 => "December 2025",
            Generation::Y2026 => "2026",
        })
    }
}

impl SchemaFacts {
    /// The generation, or why this is not a Go Synkronus database at all.
    pub fn generation(&self) -> Result<Generation, String> {
        let missing: Vec<&str> = [
            (self.has_users, "users"),
            (self.has_observations, "observations"),
            (self.has_attachment_operations, "attachment_operations"),
            (self.has_sync_version, "sync_version"),
        ]
        .iter()
        .filter(|(present, _)| !present)
        .map(|(_, name)| *name)
        .collect();
        if !missing.is_empty() {
            return Err(format!(
                "the source is not a Go Synkronus database: table(s) {} missing",
                missing.join(", ")
            ));
        }
        let additions = self.has_author
            || self.has_device_id
            || self.has_tags
            || self.has_generation
            || self.has_presence;
        Ok(if additions { Generation::Y2026 } else { Generation::Dec2025 })
    }
}

/// A Go role by its exact name; anything else is refused, never guessed (docs/api.md §19.2).
pub fn role(name: &str) -> Option<Role> {
    match name {
        "read-only" => Some(Role::ReadOnly),
        "read-write" => Some(Role::ReadWrite),
        "admin" => Some(Role::Admin),
        _ => None,
    }
}

/// A source version usable as a change_id: devices start at cursor 0, so it must be above it.
pub fn change_id(version: Option<i64>) -> Result<i64, String> {
    match version {
        Some(v) if v >= 1 => Ok(v),
        Some(v) => Err(format!("version {v} is not a positive number")),
        None => Err("no version".to_string()),
    }
}

/// The head after the import: the source's counter or the highest version seen, whichever is
/// larger; files without an operation are then numbered after it.
pub fn base_head(current_version: i64, highest_version: i64) -> i64 {
    current_version.max(highest_version).max(0)
}

/// The latest operation of an attachment decides what it becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachmentFate {
    /// `create` or `update`: a current attachment at that version.
    Current,
    /// `delete`: a tombstone at that version.
    Deleted,
}

pub fn attachment_fate(operation: &str) -> Result<AttachmentFate, String> {
    match operation {
        "create" | "update" => Ok(AttachmentFate::Current),
        "delete" => Ok(AttachmentFate::Deleted),
        other => Err(format!("unknown attachment operation '{other}'")),
    }
}

/// Whether a Go bundle version folder's name can be kept as our version id. The Go names
/// (`0055`) are an exception to the id format of docs/api.md §9.3, allowed for imports only; they
/// still must be one safe path segment, without a space, and not `0` or `current`.
pub fn bundle_version_id_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name != "0"
        && name != "current"
        && !name.starts_with('.')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Go's own file in each version folder: kept byte for byte, but not part of the archive the
/// version was pushed as, so neither validated nor put into the version's ZIP.
pub const GO_APP_INFO: &str = "APP_INFO.json";

/// Go's pointer to the active version, inside the versions folder.
pub const GO_CURRENT_VERSION: &str = "CURRENT_VERSION";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_from_the_schema() {
        let base = SchemaFacts {
            has_users: true,
            has_observations: true,
            has_attachment_operations: true,
            has_sync_version: true,
            ..SchemaFacts::default()
        };
        assert_eq!(base.generation(), Ok(Generation::Dec2025));
        assert_eq!(SchemaFacts { has_presence: true, ..base.clone() }.generation(), Ok(Generation::Y2026));
        assert_eq!(SchemaFacts { has_tags: true, ..base.clone() }.generation(), Ok(Generation::Y2026));
        let error = SchemaFacts { has_observations: false, ..base }.generation().unwrap_err();
        assert!(error.contains("observations"), "{error}");
    }

    #[test]
    fn roles_versions_and_operations() {
        assert_eq!(role("admin"), Some(Role::Admin));
        assert_eq!(role("read-only"), Some(Role::ReadOnly));
        assert_eq!(role("user"), None);
        assert_eq!(role("Admin"), None);
        assert_eq!(change_id(Some(7)), Ok(7));
        assert!(change_id(Some(0)).is_err());
        assert!(change_id(None).is_err());
        assert_eq!(base_head(10, 12), 12);
        assert_eq!(base_head(15, 12), 15);
        assert_eq!(attachment_fate("update"), Ok(AttachmentFate::Current));
        assert_eq!(attachment_fate("delete"), Ok(AttachmentFate::Deleted));
        assert!(attachment_fate("rename").is_err());
    }

    #[test]
    fn bundle_version_ids() {
        for ok in ["0055", "0001", "20250625-120000", "v1.2"] {
            assert!(bundle_version_id_ok(ok), "{ok}");
        }
        for bad in ["", "0", "current", "..", ".hidden", "a b", "a/b", "x *"] {
            assert!(!bundle_version_id_ok(bad), "{bad}");
        }
    }
}
