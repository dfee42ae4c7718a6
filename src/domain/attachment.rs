//! Attachment rules (docs/api.md §10 and 17.7): ids, content types, ranges, conditional requests,
//! image qualities and the headers and URLs built from an id.

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

/// Longest id in bytes (17.7 widened 10.1's 255 characters to 512 bytes).
pub const MAX_ID_BYTES: usize = 512;

/// Literal routes under `/attachments/` that can never be ids.
const RESERVED_IDS: [&str; 2] = ["manifest", "export-zip"];

/// Why an attachment id was refused (a 400 at the HTTP boundary).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("Invalid attachment id: {0}")]
pub struct InvalidId(&'static str);

/// An attachment id that passed [`validate_id`]: what a handler gets from the path or the upload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachmentId(String);

impl AttachmentId {
    /// Checks an already percent-decoded id (see [`validate_id`]).
    pub fn parse(id: String) -> Result<Self, InvalidId> {
        validate_id(&id)?;
        Ok(AttachmentId(id))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

impl std::fmt::Display for AttachmentId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Checks an already percent-decoded id: 1-512 bytes of `/`-separated non-empty segments, none
/// `.` or `..`, no `\`, NUL or control characters, not a reserved literal.
pub fn validate_id(id: &str) -> Result<(), InvalidId> {
    let refuse = |why: &'static str| Err(InvalidId(why));
    if id.is_empty() || id.len() > MAX_ID_BYTES {
        return refuse("it must be 1 to 512 bytes long");
    }
    if id.chars().any(|c| c == '\\' || c.is_control()) {
        return refuse("backslashes and control characters are not allowed");
    }
    if id.split('/').any(|s| s.is_empty() || s == "." || s == "..") {
        return refuse("path segments must be non-empty and not '.' or '..'");
    }
    if RESERVED_IDS.contains(&id) {
        return refuse("this name is reserved");
    }
    Ok(())
}

/// The stored type: the request's own type unless absent or octet-stream, else guessed from the id.
pub fn content_type(declared: Option<&str>, id: &str) -> String {
    match declared.map(str::trim).filter(|t| !t.is_empty()) {
        Some(t) if !t.to_ascii_lowercase().starts_with("application/octet-stream") => t.to_string(),
        _ => crate::domain::mime::mime_for_path(id).to_string(),
    }
}

/// The id of a `POST /attachments` without `attachment_id`: the base name of the part's filename.
pub fn id_from_filename(filename: &str) -> Option<String> {
    let base = filename.rsplit(['/', '\\']).next().unwrap_or(filename).trim();
    (!base.is_empty()).then(|| base.to_string())
}

/// What a `Range` header asks of a representation of `size` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeAnswer {
    /// No range, a multi-range, or a header we do not understand: 200 with everything.
    Full,
    /// 206 with bytes `start..=end`.
    Partial { start: u64, end: u64 },
    /// 416.
    Unsatisfiable,
}

/// Parses a single `bytes=a-b`, `bytes=a-` or `bytes=-n` range (RFC 9110 14.1).
pub fn parse_range(header: Option<&str>, size: u64) -> RangeAnswer {
    let Some(spec) = header.map(str::trim).and_then(|h| h.strip_prefix("bytes=")) else {
        return RangeAnswer::Full;
    };
    if spec.contains(',') {
        return RangeAnswer::Full;
    }
    let Some((first, last)) = spec.trim().split_once('-') else {
        return RangeAnswer::Full;
    };
    let (first, last) = (first.trim(), last.trim());
    let number = |s: &str| s.bytes().all(|b| b.is_ascii_digit()).then(|| s.parse::<u64>().ok()).flatten();
    match (first.is_empty(), last.is_empty()) {
        (true, true) => RangeAnswer::Full,
        (true, false) => match number(last) {
            None => RangeAnswer::Full,
            Some(0) => RangeAnswer::Unsatisfiable,
            Some(_) if size == 0 => RangeAnswer::Unsatisfiable,
            Some(n) => RangeAnswer::Partial { start: size.saturating_sub(n), end: size - 1 },
        },
        (false, _) => {
            let Some(start) = number(first) else { return RangeAnswer::Full };
            let end = if last.is_empty() { Some(u64::MAX) } else { number(last) };
            match end {
                None => RangeAnswer::Full,
                Some(end) if end < start => RangeAnswer::Full,
                Some(_) if start >= size => RangeAnswer::Unsatisfiable,
                Some(end) => RangeAnswer::Partial { start, end: end.min(size - 1) },
            }
        }
    }
}

/// The quoted strong ETag of an attachment or of one of its image variants.
pub fn etag(sha256: &str, quality: Option<Quality>) -> String {
    match quality {
        Some(q) => format!("\"{sha256}-{}\"", q.as_str()),
        None => format!("\"{sha256}\""),
    }
}

fn opaque(tag: &str) -> &str {
    tag.trim().trim_start_matches("W/")
}

/// `If-None-Match`: a list of tags or `*`, compared weakly (docs/api.md §1.6).
pub fn none_match(header: Option<&str>, etag: &str) -> bool {
    header.is_some_and(|h| h.split(',').any(|t| t.trim() == "*" || opaque(t) == opaque(etag)))
}

/// `If-Range` is honoured only when it names the current strong ETag; a date never matches
/// because attachments carry no `Last-Modified`.
pub fn if_range_allows(header: Option<&str>, etag: &str) -> bool {
    header.is_none_or(|h| h.trim() == etag)
}

/// `Content-Disposition` with the last segment of the id as file name; non-ASCII names also get
/// the RFC 6266 `filename*` form, with an ASCII fallback.
pub fn content_disposition(id: &str) -> String {
    let name = id.rsplit('/').next().unwrap_or(id);
    let fallback: String = name
        .chars()
        .map(|c| match c {
            '"' | '\\' => '_',
            c if c.is_ascii() && !c.is_ascii_control() => c,
            _ => '_',
        })
        .collect();
    if name.is_ascii() && !name.contains(['"', '\\']) {
        return format!("attachment; filename=\"{name}\"");
    }
    let encoded = utf8_percent_encode(name, UNRESERVED);
    format!("attachment; filename=\"{fallback}\"; filename*=UTF-8''{encoded}")
}

/// Everything but RFC 3986's unreserved characters is escaped, `/` included.
const UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// An id as one URL path segment.
pub fn encode_segment(id: &str) -> String {
    utf8_percent_encode(id, UNRESERVED).to_string()
}

/// A downscaled image size (`?quality=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Quality {
    Large,
    Medium,
    Small,
}

impl Quality {
    pub fn as_str(self) -> &'static str {
        match self {
            Quality::Large => "large",
            Quality::Medium => "medium",
            Quality::Small => "small",
        }
    }

    /// The longest side, in pixels, of a variant.
    pub fn max_side(self) -> u32 {
        match self {
            Quality::Large => 2048,
            Quality::Medium => 1024,
            Quality::Small => 256,
        }
    }
}

/// The variant a download asks for: `original=true|1|yes` wins; unknown qualities mean the original.
pub fn requested_quality(pairs: &[(String, String)]) -> Option<Quality> {
    let get = |k: &str| pairs.iter().find(|(key, _)| key == k).map(|(_, v)| v.trim().to_ascii_lowercase());
    if get("original").is_some_and(|v| matches!(v.as_str(), "1" | "true" | "yes")) {
        return None;
    }
    match get("quality")?.as_str() {
        "large" => Some(Quality::Large),
        "medium" => Some(Quality::Medium),
        "small" => Some(Quality::Small),
        _ => None,
    }
}

/// Image types that have variants.
pub fn is_resizable(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    matches!(essence.as_str(), "image/jpeg" | "image/png" | "image/webp" | "image/gif")
}

/// The size of a variant: the longest side at most `max_side`, aspect ratio kept, never larger.
/// `None` when the image already fits.
pub fn scaled_size(width: u32, height: u32, max_side: u32) -> Option<(u32, u32)> {
    let longest = width.max(height);
    if longest <= max_side || longest == 0 {
        return None;
    }
    let scale =
        |side: u32| (u64::from(side) * u64::from(max_side) + u64::from(longest) / 2) / u64::from(longest);
    let w = scale(width).max(1) as u32;
    let h = scale(height).max(1) as u32;
    Some((w, h))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids() {
        for ok in ["a", "photo 1.jpg", "a/b.jpg", "x/y/z", "manifest.jpg", "manifest/x", "ü.png", "%2F"] {
            assert!(validate_id(ok).is_ok(), "{ok}");
        }
        let long = "a".repeat(513);
        for bad in [
            "",
            ".",
            "..",
            "a/../b",
            "a/./b",
            "/a",
            "a/",
            "a//b",
            "a\\b",
            "a\0b",
            "a\nb",
            "manifest",
            "export-zip",
        ] {
            assert!(validate_id(bad).is_err(), "{bad:?}");
        }
        assert!(validate_id(&long).is_err());
        assert!(validate_id(&"a".repeat(512)).is_ok());
    }

    #[test]
    fn types() {
        assert_eq!(content_type(Some("image/png"), "x.jpg"), "image/png");
        assert_eq!(content_type(Some("application/octet-stream"), "x.jpg"), "image/jpeg");
        assert_eq!(content_type(None, "x.bin"), "application/octet-stream");
        assert_eq!(content_type(Some(" "), "a/b.pdf"), "application/pdf");
        assert_eq!(id_from_filename("C:\\dir\\p.jpg").as_deref(), Some("p.jpg"));
        assert_eq!(id_from_filename("dir/"), None);
    }

    #[test]
    fn ranges() {
        use RangeAnswer::*;
        assert_eq!(parse_range(None, 10), Full);
        assert_eq!(parse_range(Some("bytes=0-3"), 10), Partial { start: 0, end: 3 });
        assert_eq!(parse_range(Some("bytes=4-"), 10), Partial { start: 4, end: 9 });
        assert_eq!(parse_range(Some("bytes=-3"), 10), Partial { start: 7, end: 9 });
        assert_eq!(parse_range(Some("bytes=-30"), 10), Partial { start: 0, end: 9 });
        assert_eq!(parse_range(Some("bytes=5-100"), 10), Partial { start: 5, end: 9 });
        assert_eq!(parse_range(Some("bytes=10-"), 10), Unsatisfiable);
        assert_eq!(parse_range(Some("bytes=-0"), 10), Unsatisfiable);
        assert_eq!(parse_range(Some("bytes=0-"), 0), Unsatisfiable);
        assert_eq!(parse_range(Some("bytes=0-1,3-4"), 10), Full);
        assert_eq!(parse_range(Some("bytes=5-2"), 10), Full);
        assert_eq!(parse_range(Some("items=0-1"), 10), Full);
        assert_eq!(parse_range(Some("bytes=a-b"), 10), Full);
    }

    #[test]
    fn conditionals() {
        let tag = etag("abc", None);
        assert!(none_match(Some("\"x\", W/\"abc\""), &tag));
        assert!(none_match(Some("*"), &tag));
        assert!(!none_match(Some("\"abd\""), &tag));
        assert!(!none_match(None, &tag));
        assert!(if_range_allows(None, &tag));
        assert!(if_range_allows(Some("\"abc\""), &tag));
        assert!(!if_range_allows(Some("W/\"abc\""), &tag));
        assert_eq!(etag("abc", Some(Quality::Small)), "\"abc-small\"");
    }

    #[test]
    fn names() {
        assert_eq!(content_disposition("a/b/p.jpg"), "attachment; filename=\"p.jpg\"");
        assert_eq!(
            content_disposition("fötö.jpg"),
            "attachment; filename=\"f_t_.jpg\"; filename*=UTF-8''f%C3%B6t%C3%B6.jpg"
        );
        assert_eq!(encode_segment("photo 1/x.jpg"), "photo%201%2Fx.jpg");
    }

    #[test]
    fn qualities() {
        let q = |pairs: &[(&str, &str)]| {
            requested_quality(&pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>())
        };
        assert_eq!(q(&[("quality", "small")]), Some(Quality::Small));
        assert_eq!(q(&[("quality", "Medium")]), Some(Quality::Medium));
        assert_eq!(q(&[("quality", "original")]), None);
        assert_eq!(q(&[("quality", "huge")]), None);
        assert_eq!(q(&[("quality", "large"), ("original", "YES")]), None);
        assert_eq!(q(&[("quality", "large"), ("original", "no")]), Some(Quality::Large));
        assert_eq!(scaled_size(4000, 3000, 1024), Some((1024, 768)));
        assert_eq!(scaled_size(300, 4000, 256), Some((19, 256)));
        assert_eq!(scaled_size(200, 100, 256), None);
        assert!(is_resizable("image/JPEG"));
        assert!(!is_resizable("image/svg+xml"));
    }
}
