//! MIME types by file extension (docs/api.md §9.5). Bundle downloads and attachment
//! type guessing share this one table so both report the same type for a path.

/// The MIME type for `path`, chosen by its extension (case-insensitive).
/// Unknown or missing extensions are `application/octet-stream`.
pub fn mime_for_path(path: &str) -> &'static str {
    let file_name = path.rsplit('/').next().unwrap_or(path);
    let Some((stem, extension)) = file_name.rsplit_once('.') else {
        return "application/octet-stream";
    };
    // A dot-file such as `.json` has no extension, only a name.
    if stem.is_empty() {
        return "application/octet-stream";
    }
    match extension.to_ascii_lowercase().as_str() {
        "html" | "htm" => "text/html; charset=utf-8",
        "js" | "mjs" | "jsx" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "json" | "map" => "application/json",
        "txt" => "text/plain; charset=utf-8",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "ico" => "image/x-icon",
        "woff" => "font/woff",
        "woff2" => "font/woff2",
        "ttf" => "font/ttf",
        "wasm" => "application/wasm",
        "pdf" => "application/pdf",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::mime_for_path;

    #[test]
    fn table_entries_are_case_insensitive() {
        assert_eq!(mime_for_path("app/index.html"), "text/html; charset=utf-8");
        assert_eq!(mime_for_path("app/INDEX.HTM"), "text/html; charset=utf-8");
        assert_eq!(mime_for_path("renderers/x/renderer.jsx"), "text/javascript; charset=utf-8");
        assert_eq!(mime_for_path("a.MJS"), "text/javascript; charset=utf-8");
        assert_eq!(mime_for_path("a.js"), "text/javascript; charset=utf-8");
        assert_eq!(mime_for_path("s.Css"), "text/css; charset=utf-8");
        assert_eq!(mime_for_path("forms/x/schema.json"), "application/json");
        assert_eq!(mime_for_path("app/main.js.map"), "application/json");
        assert_eq!(mime_for_path("readme.txt"), "text/plain; charset=utf-8");
        assert_eq!(mime_for_path("i.svg"), "image/svg+xml");
        assert_eq!(mime_for_path("i.PNG"), "image/png");
        assert_eq!(mime_for_path("i.jpg"), "image/jpeg");
        assert_eq!(mime_for_path("i.jpeg"), "image/jpeg");
        assert_eq!(mime_for_path("i.gif"), "image/gif");
        assert_eq!(mime_for_path("i.webp"), "image/webp");
        assert_eq!(mime_for_path("favicon.ico"), "image/x-icon");
        assert_eq!(mime_for_path("f.woff"), "font/woff");
        assert_eq!(mime_for_path("f.woff2"), "font/woff2");
        assert_eq!(mime_for_path("f.ttf"), "font/ttf");
        assert_eq!(mime_for_path("m.wasm"), "application/wasm");
        assert_eq!(mime_for_path("d.pdf"), "application/pdf");
    }

    #[test]
    fn unknown_or_missing_extension_is_octet_stream() {
        assert_eq!(mime_for_path("archive.tar.gz"), "application/octet-stream");
        assert_eq!(mime_for_path("LICENSE"), "application/octet-stream");
        assert_eq!(mime_for_path("dir.html/file"), "application/octet-stream");
        assert_eq!(mime_for_path(".json"), "application/octet-stream");
        assert_eq!(mime_for_path("trailing."), "application/octet-stream");
        assert_eq!(mime_for_path(""), "application/octet-stream");
    }
}
