//! The admin portal (docs/api.md §17.9): static HTML, JavaScript modules and CSS compiled into the
//! binary and served at `/portal/`. The portal talks only to the public API with the signed-in
//! user's own token, so these handlers need no authentication and touch no state but the config.

use std::sync::LazyLock;

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse};
use sha2::{Digest, Sha256};

use crate::error::{ApiError, ApiResult};
use crate::http::bundles::if_none_match;
use crate::http::extract::{forwarded_header, path_param, state};

struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

macro_rules! asset {
    ($name:literal, $type:expr) => {
        Asset { name: $name, content_type: $type, body: include_bytes!(concat!("../../portal/", $name)) }
    };
}

const JS: &str = "text/javascript; charset=utf-8";

static ASSETS: &[Asset] = &[
    asset!("app.css", "text/css; charset=utf-8"),
    asset!("icon.svg", "image/svg+xml"),
    asset!("api.js", JS),
    asset!("app.js", JS),
    asset!("audit.js", JS),
    asset!("bundles.js", JS),
    asset!("chart.js", JS),
    asset!("devices.js", JS),
    asset!("exports.js", JS),
    asset!("observations.js", JS),
    asset!("overview.js", JS),
    asset!("ui.js", JS),
    asset!("users.js", JS),
];

const INDEX_HTML: &str = include_str!("../../portal/index.html");
/// The marker in index.html replaced by the portal's base path, so that relative asset and API
/// URLs resolve the same from `/portal` and `/portal/`, and behind a path-prefixing proxy.
const BASE_MARKER: &str = "{{BASE}}";

/// Hashes are computed once: the assets cannot change while the binary runs.
static ETAGS: LazyLock<Vec<String>> =
    LazyLock::new(|| ASSETS.iter().map(|a| hex::encode(Sha256::digest(a.body))).collect());

/// Everything the portal loads comes from this server; blob: URLs carry downloads and previews.
const CSP: &str = "default-src 'self'; img-src 'self' blob: data:; connect-src 'self'; \
                   script-src 'self'; style-src 'self'; object-src 'none'; base-uri 'self'; \
                   form-action 'self'; frame-ancestors 'none'";

fn respond(req: &HttpRequest, content_type: &str, etag: &str, body: Vec<u8>) -> HttpResponse {
    let quoted = format!("\"{etag}\"");
    let hit = if_none_match(req, etag);
    let mut builder = if hit { HttpResponse::NotModified() } else { HttpResponse::Ok() };
    builder
        .insert_header((header::ETAG, quoted))
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .insert_header((header::CONTENT_SECURITY_POLICY, CSP))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .insert_header((header::REFERRER_POLICY, "no-referrer"));
    if hit {
        return builder.finish();
    }
    builder.insert_header((header::CONTENT_TYPE, content_type.to_owned())).body(body)
}

/// The path under which this server is reachable from the browser: the path of `PUBLIC_URL`,
/// else a trusted proxy's `X-Forwarded-Prefix`, else nothing. Only plain path characters are kept,
/// since the value lands in HTML.
fn base_path(req: &HttpRequest) -> String {
    let config = state(req).ok().map(|st| st.config.clone());
    let from_config = config.as_ref().and_then(|c| c.public_url.clone()).map(|url| {
        let rest = url.split_once("://").map_or("", |(_, rest)| rest);
        rest.find('/').map_or(String::new(), |i| rest[i..].to_owned())
    });
    let prefix = from_config.or_else(|| {
        let trusted = config.as_ref().map_or(&[][..], |c| &c.trusted_proxies[..]);
        forwarded_header(req, trusted, "x-forwarded-prefix").map(str::to_owned)
    });
    let prefix = prefix.unwrap_or_default();
    let prefix = prefix.trim().trim_matches('/');
    let safe = prefix.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~/".contains(&b));
    if prefix.is_empty() || !safe || prefix.split('/').any(|s| s.is_empty() || s == "." || s == "..") {
        String::new()
    } else {
        format!("/{prefix}")
    }
}

/// `GET /portal` and `GET /portal/` (the same route once the trailing slash is trimmed).
pub async fn index(req: HttpRequest) -> HttpResponse {
    let html = INDEX_HTML.replace(BASE_MARKER, &format!("{}/portal/", base_path(&req)));
    let etag = hex::encode(Sha256::digest(html.as_bytes()));
    respond(&req, "text/html; charset=utf-8", &etag, html.into_bytes())
}

/// `GET /portal/{file}`: one of the embedded assets, or 404.
pub async fn file(req: HttpRequest) -> ApiResult<HttpResponse> {
    let name = path_param(&req, "file")?;
    if name == "index.html" {
        return Ok(index(req).await);
    }
    let (i, asset) = ASSETS
        .iter()
        .enumerate()
        .find(|(_, a)| a.name == name)
        .ok_or_else(|| ApiError::not_found("No such portal file"))?;
    Ok(respond(&req, asset.content_type, &ETAGS[i], asset.body.to_vec()))
}

/// Whether an `Accept` header prefers HTML to JSON: the best quality given to `text/html` beats
/// the one given to `application/json` (directly or through a wildcard), or ties and comes first.
pub fn prefers_html(accept: &str) -> bool {
    let mut html: Option<(f32, usize)> = None;
    let mut json: Option<(f32, usize)> = None;
    for (pos, item) in accept.split(',').enumerate() {
        let mut parts = item.split(';');
        let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        let q = parts
            .filter_map(|p| p.trim().strip_prefix("q=").or_else(|| p.trim().strip_prefix("Q=")))
            .find_map(|v| v.trim().parse::<f32>().ok())
            .unwrap_or(1.0);
        let better = |slot: &mut Option<(f32, usize)>| {
            if slot.is_none_or(|(best, _)| q > best) {
                *slot = Some((q, pos));
            }
        };
        match media.as_str() {
            "text/html" => better(&mut html),
            "application/json" | "application/*" | "*/*" => better(&mut json),
            _ => {}
        }
    }
    match (html, json) {
        (Some((hq, _)), _) if hq <= 0.0 => false,
        (Some(_), None) => true,
        (Some((hq, hpos)), Some((jq, jpos))) => hq > jq || (hq == jq && hpos < jpos),
        (None, _) => false,
    }
}

/// The 303 that `GET /` sends to browsers (docs/api.md §17.9).
pub fn redirect_to_portal(req: &HttpRequest) -> Option<HttpResponse> {
    let accept = req.headers().get(header::ACCEPT)?.to_str().ok()?;
    prefers_html(accept).then(|| {
        HttpResponse::SeeOther()
            .insert_header((header::LOCATION, format!("{}/portal/", base_path(req))))
            .insert_header((header::VARY, "Accept"))
            .finish()
    })
}

/// Root only: the portal is not part of the API prefixes.
pub fn routes(cfg: &mut actix_web::web::ServiceConfig) {
    use crate::http::routing::{get, resource};
    cfg.service(resource("/portal", "GET, HEAD").route(get().to(index)))
        .service(resource("/portal/{file}", "GET, HEAD").route(get().to(file)));
}

#[cfg(test)]
mod tests {
    use super::prefers_html;

    #[test]
    fn browsers_prefer_html() {
        assert!(prefers_html("text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"));
        assert!(prefers_html(
            "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8"
        ));
        assert!(prefers_html("text/html"));
        assert!(prefers_html("text/html, application/json"));
    }

    #[test]
    fn api_clients_get_json() {
        assert!(!prefers_html("*/*"));
        assert!(!prefers_html("application/json"));
        assert!(!prefers_html("application/json, text/html"));
        assert!(!prefers_html("text/html;q=0.5, application/json"));
        assert!(!prefers_html("text/html;q=0"));
        assert!(!prefers_html(""));
    }
}
