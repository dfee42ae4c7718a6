//! Archive entry names: decoding and the safety rules of docs/api.md §9.2 (`ZIP_UNSAFE_PATH`).

/// General-purpose flag bit 11: the name is UTF-8.
const UTF8_NAME_FLAG: u16 = 1 << 11;

/// Decodes a raw entry name. With the UTF-8 flag the bytes must be UTF-8;
/// without it they may be UTF-8 (many writers omit the flag) or else CP437.
pub(super) fn decode_entry_name(raw: &[u8], flags: u16) -> Option<String> {
    match std::str::from_utf8(raw) {
        Ok(name) => Some(name.to_owned()),
        Err(_) if flags & UTF8_NAME_FLAG != 0 => None,
        Err(_) => Some(raw.iter().map(|&byte| cp437_char(byte)).collect()),
    }
}

/// Why a decoded entry name is unsafe, or `None` when it is safe.
/// Directory entries may end with one `/`; no other empty segment is allowed.
pub(super) fn unsafe_name_reason(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        return Some("the entry name is empty");
    }
    if name.starts_with('/') {
        return Some("the entry name is an absolute path");
    }
    if name.contains('\\') {
        return Some("the entry name contains a backslash");
    }
    if name.chars().any(char::is_control) {
        return Some("the entry name contains a NUL or control character");
    }
    if has_drive_prefix(name) {
        return Some("the entry name is an absolute path");
    }
    let without_dir_slash = name.strip_suffix('/').unwrap_or(name);
    for segment in without_dir_slash.split('/') {
        match segment {
            "" => return Some("the entry name has an empty segment"),
            "." | ".." => return Some("the entry name has a '.' or '..' segment"),
            _ => {}
        }
    }
    None
}

/// `C:`-style prefixes make a name absolute on Windows even with `/` separators.
fn has_drive_prefix(name: &str) -> bool {
    let bytes = name.as_bytes();
    bytes.len() >= 2 && bytes[0].is_ascii_alphabetic() && bytes[1] == b':'
}

/// Checks a manifest `entryPoint`: relative and without `..` (docs/api.md §9.2 step 2).
pub(super) fn entry_point_is_acceptable(entry_point: &str) -> bool {
    !entry_point.starts_with('/')
        && !entry_point.starts_with('\\')
        && !has_drive_prefix(entry_point)
        && !entry_point.split(['/', '\\']).any(|segment| segment == "..")
}

/// CP437 upper half; the lower half is ASCII.
fn cp437_char(byte: u8) -> char {
    const UPPER_HALF: [char; 128] = [
        'Ç', 'ü', 'é', 'â', 'ä', 'à', 'å', 'ç', 'ê', 'ë', 'è', 'ï', 'î', 'ì', 'Ä', 'Å', 'É', 'æ', 'Æ', 'ô',
        'ö', 'ò', 'û', 'ù', 'ÿ', 'Ö', 'Ü', '¢', '£', '¥', '₧', 'ƒ', 'á', 'í', 'ó', 'ú', 'ñ', 'Ñ', 'ª', 'º',
        '¿', '⌐', '¬', '½', '¼', '¡', '«', '»', '░', '▒', '▓', '│', '┤', '╡', '╢', '╖', '╕', '╣', '║', '╗',
        '╝', '╜', '╛', '┐', '└', '┴', '┬', '├', '─', '┼', '╞', '╟', '╚', '╔', '╩', '╦', '╠', '═', '╬', '╧',
        '╨', '╤', '╥', '╙', '╘', '╒', '╓', '╫', '╪', '┘', '┌', '█', '▄', '▌', '▐', '▀', 'α', 'ß', 'Γ', 'π',
        'Σ', 'σ', 'µ', 'τ', 'Φ', 'Θ', 'Ω', 'δ', '∞', 'φ', 'ε', '∩', '≡', '±', '≥', '≤', '⌠', '⌡', '÷', '≈',
        '°', '∙', '·', '√', 'ⁿ', '²', '■', '\u{a0}',
    ];
    if byte < 0x80 {
        char::from(byte)
    } else {
        UPPER_HALF[usize::from(byte - 0x80)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_names_pass() {
        for name in ["app/index.html", "app/", "forms/a b/schema.json", "é/x", "a..b/c"] {
            assert_eq!(unsafe_name_reason(name), None, "{name}");
        }
    }

    #[test]
    fn unsafe_names_are_caught() {
        for name in [
            "",
            "/etc/passwd",
            "C:\\x",
            "C:/x",
            "a\\b",
            "a/../b",
            "../a",
            "./a",
            "a/./b",
            "a//b",
            "a\0b",
            "a\u{1}b",
            "a\u{7f}",
            "//",
            "a//",
        ] {
            assert!(unsafe_name_reason(name).is_some(), "{name:?}");
        }
    }

    #[test]
    fn names_decode_per_flag() {
        assert_eq!(decode_entry_name(b"caf\x82", 0).as_deref(), Some("café"));
        assert_eq!(decode_entry_name(b"caf\x82", UTF8_NAME_FLAG), None);
        assert_eq!(decode_entry_name("café".as_bytes(), UTF8_NAME_FLAG).as_deref(), Some("café"));
    }

    #[test]
    fn entry_points() {
        assert!(entry_point_is_acceptable("app/index.html"));
        assert!(!entry_point_is_acceptable("/app/index.html"));
        assert!(!entry_point_is_acceptable("app/../index.html"));
        assert!(!entry_point_is_acceptable("C:\\index.html"));
    }
}

/// A file path inside a stored version, as a download names it (docs/api.md §9.4): relative,
/// without backslashes, NUL, `.` or `..` segments, so it can only name a file of that version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleFilePath(String);

/// Why a download's file path was refused (a 400 at the HTTP boundary).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("Invalid file path: {0}")]
pub struct InvalidFilePath(&'static str);

impl BundleFilePath {
    pub fn parse(path: String) -> Result<Self, InvalidFilePath> {
        let refuse = |why: &'static str| Err(InvalidFilePath(why));
        if path.is_empty() {
            return refuse("the path is empty");
        }
        if path.starts_with('/') {
            return refuse("the path must be relative");
        }
        if path.contains('\\') || path.contains('\0') {
            return refuse("the path contains a backslash or NUL");
        }
        if path.split('/').any(|segment| segment == "." || segment == "..") {
            return refuse("the path contains a '.' or '..' segment");
        }
        Ok(BundleFilePath(path))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod file_path_tests {
    use super::*;

    #[test]
    fn a_download_path_names_a_file_inside_the_version() {
        for good in ["index.html", "app/forms/a b.json", "a/.hidden"] {
            assert_eq!(
                BundleFilePath::parse(good.to_owned()).map(|p| p.as_str().to_owned()),
                Ok(good.to_owned())
            );
        }
        for bad in ["", "/etc/passwd", "a\\b", "a\0b", "../x", "a/./b", "a/.."] {
            assert!(BundleFilePath::parse(bad.to_owned()).is_err(), "{bad:?}");
        }
    }
}
