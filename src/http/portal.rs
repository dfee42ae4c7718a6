//! The admin portal (docs/api.md §17.9): static HTML, JavaScript modules and CSS compiled into the
//! binary and served at `/portal/`. The portal talks only to the public API with the signed-in
//! user's own token, so these handlers need no authentication and touch no state but the config.

use std::sync::LazyLock;

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse};
use sha2::{Digest, Sha256};

use crate::error::{ApiError, ApiResult};
use crate::http::common::{base_path, if_none_match};
use crate::http::extract::PathParams;

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
    asset!("scopes.js", JS),
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

/// `GET /portal` and `GET /portal/` (the same route once the trailing slash is trimmed).
pub async fn index(req: HttpRequest) -> HttpResponse {
    let html = INDEX_HTML.replace(BASE_MARKER, &format!("{}/portal/", base_path(&req)));
    let etag = hex::encode(Sha256::digest(html.as_bytes()));
    respond(&req, "text/html; charset=utf-8", &etag, html.into_bytes())
}

/// `GET /portal/{file}`: one of the embedded assets, or 404.
pub async fn file(req: HttpRequest, PathParams(name): PathParams<String>) -> ApiResult<HttpResponse> {
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

/// Root only: the portal is not part of the API prefixes.
pub fn routes(cfg: &mut actix_web::web::ServiceConfig) {
    use crate::http::routing::{get, resource};
    cfg.service(resource("/portal", "GET, HEAD").route(get().to(index)))
        .service(resource("/portal/{file}", "GET, HEAD").route(get().to(file)));
}
