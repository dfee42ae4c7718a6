//! What holds for every operation, applied once to the generated document instead of being
//! repeated on each handler (docs/api.md §3-§5): the document's info, servers and tags, the bearer
//! scheme, operation ids, and the error model. A handler's `#[utoipa::path]` lists only its own
//! statuses; every status >= 400 becomes the one `Problem` response here, and the statuses every
//! route can answer are added: 406 (version negotiation), 413 (size limits), 503 (overload or
//! database), and for authenticated operations 401, 403 and 429.

use utoipa::openapi::path::{Operation, PathItemType};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{
    Components, ContentBuilder, HeaderBuilder, InfoBuilder, License, ObjectBuilder, OpenApi, Ref, RefOr,
    Response, ResponseBuilder, SchemaType, Server, Tag,
};
use utoipa::Modify;

use crate::http::context::SERVER_VERSION;

pub struct Conventions;

/// Tags in the order the document lists them.
const TAGS: [&str; 10] = [
    "info",
    "auth",
    "users",
    "sync",
    "observations",
    "admin",
    "app-bundle",
    "formspecs",
    "attachments",
    "export",
];

const DESCRIPTION: &str = "Offline-first sync server, compatible with Synkronus 1.0. Every path is also \
    served under /api and /api/v1 (the servers below), except GET /, which is served only at the root. \
    Every GET also answers HEAD. Sync pull and push have three dialects (synkronus, spec, camel), chosen \
    by the body; they appear as oneOf. Every error is a Problem (docs/api.md section 4).";

impl Modify for Conventions {
    fn modify(&self, doc: &mut OpenApi) {
        doc.info = InfoBuilder::new()
            .title("Synkronus")
            .version(SERVER_VERSION)
            .description(Some(DESCRIPTION))
            .license(Some(License::new("MIT")))
            .build();
        doc.servers = Some(["/", "/api", "/api/v1"].into_iter().map(Server::new).collect());
        doc.tags = Some(TAGS.iter().map(Tag::new).collect());
        let components = doc.components.get_or_insert_with(Components::new);
        components.add_security_scheme(
            "bearerAuth",
            SecurityScheme::Http(
                HttpBuilder::new().scheme(HttpAuthScheme::Bearer).bearer_format("JWT").build(),
            ),
        );
        for (path, item) in doc.paths.paths.iter_mut() {
            for (method, operation) in item.operations.iter_mut() {
                apply(path, method, operation);
            }
        }
    }
}

fn apply(path: &str, method: &PathItemType, op: &mut Operation) {
    let method =
        serde_json::to_value(method).ok().and_then(|m| m.as_str().map(str::to_owned)).unwrap_or_default();
    op.operation_id = Some(format!("{method}{}", path.replace(['/', '{', '}', '-', '.'], "_")));
    let authenticated = op.security.as_ref().is_some_and(|s| !s.is_empty());
    if !authenticated {
        // Stated, not left out: public operations need no token even where a default would apply.
        op.security = Some(Vec::new());
    }
    let mut common = vec![406, 413, 503];
    if authenticated {
        common.extend([401, 403, 429]);
    }
    for status in common {
        op.responses.responses.entry(status.to_string()).or_insert_with(|| RefOr::T(Response::new("")));
    }
    for (status, response) in op.responses.responses.iter_mut() {
        let code = status.parse::<u16>().unwrap_or(0);
        if code >= 400 {
            *response = RefOr::T(problem(code));
        } else if let RefOr::T(response) = response {
            if response.description.is_empty() {
                response.description = reason(code);
            }
        }
    }
}

/// The error response: a `Problem` body, and `Retry-After` where clients should back off.
fn problem(status: u16) -> Response {
    let mut response = ResponseBuilder::new().description(reason(status)).content(
        "application/problem+json",
        ContentBuilder::new().schema(Ref::from_schema_name("Problem")).build(),
    );
    if status == 429 || status == 503 {
        let seconds = ObjectBuilder::new().schema_type(SchemaType::Integer).minimum(Some(1.0));
        response = response.header("Retry-After", HeaderBuilder::new().schema(seconds).build());
    }
    response.build()
}

fn reason(status: u16) -> String {
    actix_web::http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Response")
        .to_string()
}
