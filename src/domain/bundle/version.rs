//! Version ids (docs/api.md §9.3): `YYYYMMDD-HHMMSS`, optionally `-N` when taken.

use chrono::{DateTime, NaiveDateTime, Timelike, Utc};

use super::DeclaredManifest;

const VERSION_ID_FORMAT: &str = "%Y%m%d-%H%M%S";

/// The declared manifest `version` when it is a valid `YYYYMMDD-HHMMSS`
/// date and time; otherwise the caller uses the upload time.
pub fn declared_version_id(manifest: &DeclaredManifest) -> Option<String> {
    let version = manifest.version.as_str();
    let bytes = version.as_bytes();
    // chrono's parser accepts unpadded and signed fields; the id must be exact.
    let shape_ok = bytes.len() == 15
        && bytes[8] == b'-'
        && bytes.iter().enumerate().all(|(position, byte)| position == 8 || byte.is_ascii_digit());
    if !shape_ok {
        return None;
    }
    let parsed = NaiveDateTime::parse_from_str(version, VERSION_ID_FORMAT).ok()?;
    // A leap second (`...60`) parses but is not a valid id.
    (parsed.nanosecond() == 0).then(|| version.to_owned())
}

/// The id for a version received at `time`, before any `-N` suffix.
pub fn version_id_from_time(time: DateTime<Utc>) -> String {
    time.format(VERSION_ID_FORMAT).to_string()
}

/// Strips the active marker `" *"` of the Synkronus 1.0 version list.
pub fn strip_active_marker(version: &str) -> &str {
    version.strip_suffix(" *").unwrap_or(version)
}

/// Candidate ids in the order to try them: `base`, `base-2`, `base-3`, ...
/// The caller takes the first one that was never used.
pub fn version_id_candidates(base: &str) -> impl Iterator<Item = String> + '_ {
    std::iter::once(base.to_owned()).chain((2u64..).map(move |suffix| format!("{base}-{suffix}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn manifest_with(version: &str) -> DeclaredManifest {
        DeclaredManifest {
            version: version.to_owned(),
            name: "n".to_owned(),
            entry_point: "app/index.html".to_owned(),
            description: None,
            created_at: None,
        }
    }

    #[test]
    fn declared_ids_must_be_real_times() {
        assert_eq!(
            declared_version_id(&manifest_with("20250625-120000")).as_deref(),
            Some("20250625-120000")
        );
        for bad in [
            "1.0.0",
            "20250230-120000",
            "20251301-120000",
            "20250625-240000",
            "20250625-126000",
            "20250630-235960",
            "2025062-1200000",
            "+2025062-120000",
            "20250625 120000",
            "20250625-120000 ",
            "20250625-120000-2",
            "",
        ] {
            assert_eq!(declared_version_id(&manifest_with(bad)), None, "{bad}");
        }
    }

    #[test]
    fn time_ids_and_markers() {
        let time = Utc.with_ymd_and_hms(2025, 6, 25, 12, 0, 3).single();
        assert_eq!(time.map(version_id_from_time).as_deref(), Some("20250625-120003"));
        assert_eq!(strip_active_marker("20250625-120000 *"), "20250625-120000");
        assert_eq!(strip_active_marker("20250625-120000"), "20250625-120000");
        assert_eq!(strip_active_marker("x * *"), "x *");
        let candidates: Vec<String> = version_id_candidates("20250625-120000").take(3).collect();
        assert_eq!(candidates, ["20250625-120000", "20250625-120000-2", "20250625-120000-3"]);
    }
}
