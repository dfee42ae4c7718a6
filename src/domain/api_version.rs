//! `x-api-version` and `x-ode-version` header parsing (docs/api.md §1.2 and 17.1).

/// The negotiated API version: 1.0 selects the synkronus shapes for body-less requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiVersion {
    V1_0,
    V1_1,
}

impl ApiVersion {
    pub fn header_value(self) -> &'static str {
        match self {
            ApiVersion::V1_0 => "1.0.0",
            ApiVersion::V1_1 => "1.1.0",
        }
    }
}

/// `MAJOR[.MINOR[.PATCH]]` with an optional leading `v` and any `-pre`/`+build` suffix ignored.
pub fn parse_semver(raw: &str) -> Option<(u64, Option<u64>)> {
    let s = raw.trim();
    let s = s.strip_prefix('v').or_else(|| s.strip_prefix('V')).unwrap_or(s);
    let core = s.split(['-', '+']).next().unwrap_or("");
    let mut parts = core.split('.');
    let major = parse_digits(parts.next()?)?;
    let minor = match parts.next() {
        None => None,
        Some(p) => Some(parse_digits(p)?),
    };
    if let Some(patch) = parts.next() {
        parse_digits(patch)?;
    }
    if parts.next().is_some() {
        return None;
    }
    Some((major, minor))
}

fn parse_digits(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// `None` means the header is unsupported (406).
pub fn negotiate(header: Option<&str>) -> Option<ApiVersion> {
    let Some(raw) = header.filter(|h| !h.trim().is_empty()) else {
        return Some(ApiVersion::V1_1);
    };
    match parse_semver(raw)? {
        (1, Some(0)) => Some(ApiVersion::V1_0),
        (1, _) => Some(ApiVersion::V1_1),
        _ => None,
    }
}

/// True when a client's `x-ode-version` may talk to this server (same major version).
pub fn client_version_supported(header: &str, server_major: u64) -> bool {
    matches!(parse_semver(header), Some((major, _)) if major == server_major)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_table() {
        assert_eq!(negotiate(None), Some(ApiVersion::V1_1));
        assert_eq!(negotiate(Some("  ")), Some(ApiVersion::V1_1));
        assert_eq!(negotiate(Some("1")), Some(ApiVersion::V1_1));
        assert_eq!(negotiate(Some("1.1.4")), Some(ApiVersion::V1_1));
        assert_eq!(negotiate(Some("v1.2.0")), Some(ApiVersion::V1_1));
        assert_eq!(negotiate(Some("1.0")), Some(ApiVersion::V1_0));
        assert_eq!(negotiate(Some("1.0.0-beta+7")), Some(ApiVersion::V1_0));
        assert_eq!(negotiate(Some("2.0.0")), None);
        assert_eq!(negotiate(Some("0.9")), None);
        assert_eq!(negotiate(Some("abc")), None);
        assert_eq!(negotiate(Some("1.x")), None);
    }

    #[test]
    fn ode_version() {
        assert!(client_version_supported("1.4.2", 1));
        assert!(!client_version_supported("2.0.0", 1));
        assert!(!client_version_supported("garbage", 1));
    }
}
