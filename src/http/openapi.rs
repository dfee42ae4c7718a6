//! The OpenAPI 3.0 document (API.md 5), built from the operation table below into utoipa's model
//! and served as YAML and JSON, plus a self-contained browsing page. `tests/api/openapi.rs` checks
//! that every route the routers register appears here, and `make api-fuzz` runs schemathesis
//! against the live server with this document.

use std::sync::OnceLock;

use actix_web::http::header;
use actix_web::{web, HttpResponse};
use serde_json::{json, Map, Value};
use utoipa::openapi::OpenApi;

use crate::http::context::SERVER_VERSION;

/// Who may call an operation (API.md 3).
#[derive(Clone, Copy, PartialEq)]
enum Access {
    Public,
    ReadOnly,
    ReadWrite,
    Admin,
}

/// A request body.
#[derive(Clone, Copy)]
enum Body {
    None,
    /// JSON whose schema is the named component.
    Json(&'static str),
    /// Raw bytes of the given media type.
    Bytes(&'static str),
    /// `multipart/form-data` with a file part named as given.
    Multipart(&'static str),
}

/// A success response.
#[derive(Clone, Copy)]
enum Reply {
    /// JSON whose schema is the named component.
    Json(u16, &'static str),
    /// Bytes of the given media type.
    Bytes(u16, &'static str),
    /// YAML whose schema is the named component.
    Yaml(u16, &'static str),
}

struct Op {
    method: &'static str,
    path: &'static str,
    tag: &'static str,
    summary: &'static str,
    access: Access,
    /// `(name, location, required, schema)`.
    params: &'static [(&'static str, &'static str, bool, &'static str)],
    body: Body,
    reply: &'static [Reply],
    /// Statuses besides those every operation of its access level can answer.
    errors: &'static [u16],
}

const STR: &str = r#"{"type":"string"}"#;
const LIMIT: &str = r#"{"type":"string","description":"integer; default 50, clamped to 500"}"#;
const BOOL_STR: &str = r#"{"type":"string","enum":["true","false"]}"#;
const IF_NONE_MATCH: (&str, &str, bool, &str) = ("If-None-Match", "header", false, STR);

use Access::{Admin, Public, ReadOnly, ReadWrite};
use Body::{Bytes, Json, Multipart};

const OPS: &[Op] = &[
    // 5. Health, information, versioning, OpenAPI
    Op {
        method: "get",
        path: "/",
        tag: "info",
        summary: "Service descriptor (root only)",
        access: Public,
        params: &[],
        body: Body::None,
        reply: &[Reply::Json(200, "ServiceDescriptor")],
        errors: &[],
    },
    Op {
        method: "get",
        path: "/health",
        tag: "info",
        summary: "Liveness and database check",
        access: Public,
        params: &[],
        body: Body::None,
        reply: &[Reply::Json(200, "Health")],
        errors: &[],
    },
    Op {
        method: "get",
        path: "/ready",
        tag: "info",
        summary: "Readiness",
        access: Public,
        params: &[],
        body: Body::None,
        reply: &[Reply::Json(200, "Object")],
        errors: &[],
    },
    Op {
        method: "get",
        path: "/version",
        tag: "info",
        summary: "Build and database versions",
        access: Public,
        params: &[],
        body: Body::None,
        reply: &[Reply::Json(200, "Version")],
        errors: &[],
    },
    Op {
        method: "get",
        path: "/versions",
        tag: "info",
        summary: "Supported API versions",
        access: Public,
        params: &[],
        body: Body::None,
        reply: &[Reply::Json(200, "Object")],
        errors: &[],
    },
    Op {
        method: "get",
        path: "/status",
        tag: "info",
        summary: "Counters and the current change_id",
        access: ReadOnly,
        params: &[],
        body: Body::None,
        reply: &[Reply::Json(200, "Status")],
        errors: &[],
    },
    Op {
        method: "get",
        path: "/metrics",
        tag: "info",
        summary: "Prometheus metrics (also on METRICS_PORT)",
        access: Admin,
        params: &[],
        body: Body::None,
        reply: &[Reply::Bytes(200, "text/plain")],
        errors: &[],
    },
    // 6. Authentication
    Op {
        method: "post",
        path: "/auth/login",
        tag: "auth",
        summary: "Log in",
        access: Public,
        params: &[],
        body: Json("LoginRequest"),
        reply: &[Reply::Json(200, "TokenPair")],
        errors: &[400, 401, 429],
    },
    Op {
        method: "post",
        path: "/auth/refresh",
        tag: "auth",
        summary: "Rotate a refresh token",
        access: Public,
        params: &[],
        body: Json("RefreshRequest"),
        reply: &[Reply::Json(200, "TokenPair")],
        errors: &[400, 401],
    },
    Op {
        method: "post",
        path: "/auth/logout",
        tag: "auth",
        summary: "Revoke this token and its refresh family",
        access: ReadOnly,
        params: &[],
        body: Json("AnyJson"),
        reply: &[Reply::Json(200, "Message")],
        errors: &[400],
    },
    Op {
        method: "get",
        path: "/auth/me",
        tag: "auth",
        summary: "The caller",
        access: ReadOnly,
        params: &[],
        body: Body::None,
        reply: &[Reply::Json(200, "Object")],
        errors: &[],
    },
    Op {
        method: "get",
        path: "/auth/verify",
        tag: "auth",
        summary: "Inspect the Authorization header (always 200)",
        access: Public,
        params: &[],
        body: Body::None,
        reply: &[Reply::Json(200, "Object")],
        errors: &[],
    },
    // 7. Users
    Op {
        method: "get",
        path: "/users",
        tag: "users",
        summary: "List users",
        access: Admin,
        params: &[],
        body: Body::None,
        reply: &[Reply::Json(200, "UserList")],
        errors: &[],
    },
    Op {
        method: "post",
        path: "/users",
        tag: "users",
        summary: "Create a user",
        access: Admin,
        params: &[],
        body: Json("CreateUser"),
        reply: &[Reply::Json(201, "User")],
        errors: &[400, 409],
    },
    Op {
        method: "post",
        path: "/users/create",
        tag: "users",
        summary: "Create a user (Synkronus 1.0 path)",
        access: Admin,
        params: &[],
        body: Json("CreateUser"),
        reply: &[Reply::Json(201, "User")],
        errors: &[400, 409],
    },
    Op {
        method: "post",
        path: "/users/reset-password",
        tag: "users",
        summary: "Set another user's password",
        access: Admin,
        params: &[],
        body: Json("ResetPassword"),
        reply: &[Reply::Json(200, "Message")],
        errors: &[400, 404],
    },
    Op {
        method: "post",
        path: "/users/change-password",
        tag: "users",
        summary: "Change one's own password",
        access: ReadOnly,
        params: &[],
        body: Json("ChangePassword"),
        reply: &[Reply::Json(200, "Message")],
        errors: &[400],
    },
    Op {
        method: "delete",
        path: "/users/delete/{username}",
        tag: "users",
        summary: "Delete a user (Synkronus 1.0 path)",
        access: Admin,
        params: &[("username", "path", true, STR)],
        body: Body::None,
        reply: &[Reply::Json(200, "Message")],
        errors: &[400, 404, 409],
    },
    Op {
        method: "get",
        path: "/users/{username}",
        tag: "users",
        summary: "One user (admin, or oneself)",
        access: ReadOnly,
        params: &[("username", "path", true, STR)],
        body: Body::None,
        reply: &[Reply::Json(200, "User")],
        errors: &[400, 404],
    },
    Op {
        method: "put",
        path: "/users/{username}",
        tag: "users",
        summary: "Change a user's role or email",
        access: Admin,
        params: &[("username", "path", true, STR)],
        body: Json("UpdateUser"),
        reply: &[Reply::Json(200, "User")],
        errors: &[400, 404, 409],
    },
    Op {
        method: "delete",
        path: "/users/{username}",
        tag: "users",
        summary: "Delete a user (by name or id)",
        access: Admin,
        params: &[("username", "path", true, STR)],
        body: Body::None,
        reply: &[Reply::Json(200, "Message")],
        errors: &[400, 404, 409],
    },
    // 8. Synchronization
    Op {
        method: "post",
        path: "/sync/pull",
        tag: "sync",
        summary: "Pull a page of changes (dialect from the body)",
        access: ReadOnly,
        params: &[
            ("limit", "query", false, LIMIT),
            ("page_token", "query", false, STR),
            ("schemaType", "query", false, STR),
            ("x-repository-generation", "header", false, STR),
        ],
        body: Json("PullRequest"),
        reply: &[Reply::Json(200, "PullResponse")],
        errors: &[400, 409],
    },
    Op {
        method: "get",
        path: "/sync/pull",
        tag: "sync",
        summary: "Pull a page of changes (spec shape, or synkronus with x-api-version 1.0.x)",
        access: ReadOnly,
        params: &[
            ("client_id", "query", false, STR),
            ("since", "query", false, STR),
            ("schema_types", "query", false, STR),
            ("limit", "query", false, LIMIT),
            ("page_token", "query", false, STR),
            ("x-api-version", "header", false, STR),
            ("x-repository-generation", "header", false, STR),
        ],
        body: Body::None,
        reply: &[Reply::Json(200, "PullResponse")],
        errors: &[400, 409],
    },
    Op {
        method: "post",
        path: "/sync/push",
        tag: "sync",
        summary: "Push records, all or nothing, idempotent",
        access: ReadWrite,
        params: &[("x-repository-generation", "header", false, STR)],
        body: Json("PushRequest"),
        reply: &[Reply::Json(200, "PushResponse")],
        errors: &[400, 409, 422],
    },
    // 12. Observations
    Op {
        method: "get",
        path: "/observations",
        tag: "observations",
        summary: "List records (own, or all for admins)",
        access: ReadOnly,
        params: &[
            ("all", "query", false, BOOL_STR),
            ("user", "query", false, STR),
            ("form_type", "query", false, STR),
            ("include_deleted", "query", false, BOOL_STR),
            ("limit", "query", false, LIMIT),
            ("page_token", "query", false, STR),
        ],
        body: Body::None,
        reply: &[Reply::Json(200, "Object")],
        errors: &[400],
    },
    Op {
        method: "get",
        path: "/observations/{id}/history",
        tag: "observations",
        summary: "A record's revisions",
        access: ReadOnly,
        params: &[
            ("id", "path", true, STR),
            ("limit", "query", false, LIMIT),
            ("page_token", "query", false, STR),
        ],
        body: Body::None,
        reply: &[Reply::Json(200, "Object")],
        errors: &[400, 404],
    },
    Op {
        method: "get",
        path: "/observations/{id}",
        tag: "observations",
        summary: "One record",
        access: ReadOnly,
        params: &[("id", "path", true, STR)],
        body: Body::None,
        reply: &[Reply::Json(200, "Object")],
        errors: &[400, 404],
    },
    // 17. 2026 additions
    Op {
        method: "post",
        path: "/admin/repository/reset",
        tag: "admin",
        summary: "Empty the repository and raise its generation",
        access: Admin,
        params: &[],
        body: Json("AnyJson"),
        reply: &[Reply::Json(200, "Object")],
        errors: &[400],
    },
    Op {
        method: "get",
        path: "/devices",
        tag: "admin",
        summary: "Devices seen",
        access: Admin,
        params: &[],
        body: Body::None,
        reply: &[Reply::Json(200, "AnyJson")],
        errors: &[400],
    },
    // 9. App bundles
    Op {
        method: "put",
        path: "/app-bundle",
        tag: "app-bundle",
        summary: "Upload a bundle ZIP (raw body, any content type)",
        access: Admin,
        params: &[("activate", "query", false, BOOL_STR)],
        body: Bytes("application/octet-stream"),
        reply: &[Reply::Json(200, "Object")],
        errors: &[400, 413],
    },
    Op {
        method: "post",
        path: "/app-bundle/push",
        tag: "app-bundle",
        summary: "Upload a bundle ZIP (multipart part bundle or file)",
        access: Admin,
        params: &[("activate", "query", false, BOOL_STR)],
        body: Multipart("bundle"),
        reply: &[Reply::Json(200, "Object")],
        errors: &[400, 413],
    },
    Op {
        method: "post",
        path: "/app-bundle/switch",
        tag: "app-bundle",
        summary: "Activate a version (body)",
        access: Admin,
        params: &[],
        body: Json("SwitchRequest"),
        reply: &[Reply::Json(200, "Object")],
        errors: &[400, 404],
    },
    Op {
        method: "post",
        path: "/app-bundle/switch/{version}",
        tag: "app-bundle",
        summary: "Activate a version",
        access: Admin,
        params: &[("version", "path", true, STR)],
        body: Body::None,
        reply: &[Reply::Json(200, "Object")],
        errors: &[400, 404],
    },
    Op {
        method: "get",
        path: "/app-bundle/versions",
        tag: "app-bundle",
        summary: "Stored versions",
        access: ReadOnly,
        params: &[("x-api-version", "header", false, STR)],
        body: Body::None,
        reply: &[Reply::Json(200, "Object")],
        errors: &[],
    },
    Op {
        method: "get",
        path: "/app-bundle/manifest",
        tag: "app-bundle",
        summary: "Manifest of a version",
        access: ReadOnly,
        params: &[("version", "query", false, STR), IF_NONE_MATCH],
        body: Body::None,
        reply: &[Reply::Json(200, "Object"), Reply::Bytes(304, "")],
        errors: &[400, 404],
    },
    Op {
        method: "get",
        path: "/app-bundle/changes",
        tag: "app-bundle",
        summary: "Files changed between versions",
        access: ReadOnly,
        params: &[("current", "query", false, STR), ("target", "query", false, STR)],
        body: Body::None,
        reply: &[Reply::Json(200, "Object")],
        errors: &[400, 404],
    },
    Op {
        method: "get",
        path: "/app-bundle/download-zip",
        tag: "app-bundle",
        summary: "A version's ZIP",
        access: ReadOnly,
        params: &[("version", "query", false, STR), IF_NONE_MATCH],
        body: Body::None,
        reply: &[Reply::Bytes(200, "application/zip"), Reply::Bytes(304, "")],
        errors: &[400, 404],
    },
    Op {
        method: "get",
        path: "/app-bundle/download",
        tag: "app-bundle",
        summary: "No file named: 404",
        access: ReadOnly,
        params: &[],
        body: Body::None,
        reply: &[],
        errors: &[404],
    },
    Op {
        method: "get",
        path: "/app-bundle/download/{path}",
        tag: "app-bundle",
        summary: "One file of a version (path may contain /)",
        access: ReadOnly,
        params: &[
            ("path", "path", true, STR),
            ("version", "query", false, STR),
            ("preview", "query", false, BOOL_STR),
            IF_NONE_MATCH,
        ],
        body: Body::None,
        reply: &[Reply::Bytes(200, "application/octet-stream"), Reply::Bytes(304, "")],
        errors: &[400, 404],
    },
    // 11. Form specifications
    Op {
        method: "get",
        path: "/formspecs",
        tag: "formspecs",
        summary: "Latest version of each form",
        access: ReadOnly,
        params: &[],
        body: Body::None,
        reply: &[Reply::Json(200, "AnyJson")],
        errors: &[],
    },
    Op {
        method: "post",
        path: "/formspecs",
        tag: "formspecs",
        summary: "Register a form spec version",
        access: Admin,
        params: &[],
        body: Json("FormSpecRequest"),
        reply: &[Reply::Json(200, "Object"), Reply::Json(201, "Object")],
        errors: &[400, 409, 422],
    },
    Op {
        method: "get",
        path: "/formspecs/{form_type}",
        tag: "formspecs",
        summary: "A form's versions",
        access: ReadOnly,
        params: &[("form_type", "path", true, STR)],
        body: Body::None,
        reply: &[Reply::Json(200, "AnyJson")],
        errors: &[400, 404],
    },
    Op {
        method: "get",
        path: "/formspecs/{form_type}/{version}",
        tag: "formspecs",
        summary: "One form spec",
        access: ReadOnly,
        params: &[("form_type", "path", true, STR), ("version", "path", true, STR)],
        body: Body::None,
        reply: &[Reply::Json(200, "Object")],
        errors: &[400, 404],
    },
    // 10. Attachments
    Op {
        method: "get",
        path: "/attachments/manifest",
        tag: "attachments",
        summary: "Attachments changed since a cursor (spec shape)",
        access: ReadOnly,
        params: &[
            ("since", "query", false, STR),
            ("limit", "query", false, LIMIT),
            ("page_token", "query", false, STR),
        ],
        body: Body::None,
        reply: &[Reply::Json(200, "Object")],
        errors: &[400, 409],
    },
    Op {
        method: "post",
        path: "/attachments/manifest",
        tag: "attachments",
        summary: "Attachments changed since a cursor (Synkronus 1.0 shape)",
        access: ReadOnly,
        params: &[],
        body: Json("AttachmentManifestRequest"),
        reply: &[Reply::Json(200, "Object")],
        errors: &[400, 409],
    },
    Op {
        method: "get",
        path: "/attachments/export-zip",
        tag: "attachments",
        summary: "All attachments as a ZIP",
        access: ReadOnly,
        params: &[],
        body: Body::None,
        reply: &[Reply::Bytes(200, "application/zip")],
        errors: &[400],
    },
    Op {
        method: "post",
        path: "/attachments",
        tag: "attachments",
        summary: "Upload (multipart part file)",
        access: ReadWrite,
        params: &[("id", "query", false, STR)],
        body: Multipart("file"),
        reply: &[Reply::Json(200, "Object")],
        errors: &[400, 409, 413],
    },
    Op {
        method: "get",
        path: "/attachments/{id}",
        tag: "attachments",
        summary: "Download (ranges, variants)",
        access: ReadOnly,
        params: &[
            ("id", "path", true, STR),
            ("quality", "query", false, STR),
            ("Range", "header", false, STR),
            IF_NONE_MATCH,
        ],
        body: Body::None,
        reply: &[
            Reply::Bytes(200, "application/octet-stream"),
            Reply::Bytes(206, "application/octet-stream"),
            Reply::Bytes(304, ""),
        ],
        errors: &[400, 404, 416],
    },
    Op {
        method: "put",
        path: "/attachments/{id}",
        tag: "attachments",
        summary: "Upload (raw body)",
        access: ReadWrite,
        params: &[("id", "path", true, STR)],
        body: Bytes("application/octet-stream"),
        reply: &[Reply::Json(200, "Object")],
        errors: &[400, 409, 413],
    },
    // 13. Export
    Op {
        method: "get",
        path: "/dataexport/parquet",
        tag: "export",
        summary: "ZIP of Parquet files, streamed",
        access: ReadOnly,
        params: EXPORT_FILTERS,
        body: Body::None,
        reply: &[Reply::Bytes(200, "application/zip")],
        errors: &[400],
    },
    Op {
        method: "get",
        path: "/dataexport/raw-json",
        tag: "export",
        summary: "ZIP of raw JSON records, streamed",
        access: ReadOnly,
        params: EXPORT_FILTERS,
        body: Body::None,
        reply: &[Reply::Bytes(200, "application/zip")],
        errors: &[400],
    },
    Op {
        method: "get",
        path: "/data/export",
        tag: "export",
        summary: "Parquet, CSV or NDJSON export, streamed",
        access: ReadOnly,
        params: EXPORT_FILTERS,
        body: Body::None,
        reply: &[Reply::Bytes(200, "application/octet-stream")],
        errors: &[400],
    },
    Op {
        method: "post",
        path: "/dataexport/jobs",
        tag: "export",
        summary: "Start a background export",
        access: ReadOnly,
        params: &[],
        body: Json("AnyJson"),
        reply: &[Reply::Json(202, "Object")],
        errors: &[400],
    },
    Op {
        method: "get",
        path: "/dataexport/jobs/{id}",
        tag: "export",
        summary: "An export job's state",
        access: ReadOnly,
        params: &[("id", "path", true, STR)],
        body: Body::None,
        reply: &[Reply::Json(200, "Object")],
        errors: &[404],
    },
    Op {
        method: "get",
        path: "/dataexport/jobs/{id}/download",
        tag: "export",
        summary: "A finished job's file",
        access: ReadOnly,
        params: &[("id", "path", true, STR)],
        body: Body::None,
        reply: &[Reply::Bytes(200, "application/octet-stream")],
        errors: &[404, 409],
    },
    Op {
        method: "get",
        path: "/stats/observations",
        tag: "export",
        summary: "Record counts by form type",
        access: ReadOnly,
        params: &[],
        body: Body::None,
        reply: &[Reply::Json(200, "Object")],
        errors: &[400],
    },
    // This document
    Op {
        method: "get",
        path: "/openapi/synkronus.yaml",
        tag: "info",
        summary: "This document as YAML",
        access: Public,
        params: &[],
        body: Body::None,
        reply: &[Reply::Yaml(200, "Object")],
        errors: &[],
    },
    Op {
        method: "get",
        path: "/openapi/synkronus.json",
        tag: "info",
        summary: "This document as JSON",
        access: Public,
        params: &[],
        body: Body::None,
        reply: &[Reply::Json(200, "Object")],
        errors: &[],
    },
    Op {
        method: "get",
        path: "/openapi/swagger",
        tag: "info",
        summary: "A page to browse this document",
        access: Public,
        params: &[],
        body: Body::None,
        reply: &[Reply::Bytes(200, "text/html")],
        errors: &[],
    },
];

const EXPORT_FILTERS: &[(&str, &str, bool, &str)] = &[
    ("form_type", "query", false, STR),
    ("since_change_id", "query", false, STR),
    ("include_deleted", "query", false, BOOL_STR),
    ("format", "query", false, STR),
];

fn problem_response(status: u16) -> Value {
    let mut res = json!({
        "description": reason(status),
        "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}},
    });
    if status == 429 || status == 503 {
        res["headers"] = json!({"Retry-After": {"schema": {"type": "integer", "minimum": 1}}});
    }
    res
}

fn reason(status: u16) -> String {
    actix_web::http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Response")
        .to_string()
}

fn operation(op: &Op) -> Value {
    let mut responses = Map::new();
    for reply in op.reply {
        let (status, content) = match *reply {
            Reply::Json(status, schema) => (
                status,
                json!({"application/json": {"schema": {"$ref": format!("#/components/schemas/{schema}")}}}),
            ),
            Reply::Yaml(status, schema) => (
                status,
                json!({"application/yaml": {"schema": {"$ref": format!("#/components/schemas/{schema}")}}}),
            ),
            Reply::Bytes(status, "") => (status, Value::Null),
            Reply::Bytes(status, mime) => {
                (status, json!({mime: {"schema": {"type": "string", "format": "binary"}}}))
            }
        };
        let mut res = json!({"description": reason(status)});
        if !content.is_null() {
            res["content"] = content;
        }
        responses.insert(status.to_string(), res);
    }
    // Every route can answer these (API.md 4): version negotiation, size limits, overload, database.
    let mut errors: Vec<u16> = vec![406, 413, 503];
    if op.access != Access::Public {
        errors.extend([401, 403, 429]);
    }
    errors.extend(op.errors);
    errors.sort_unstable();
    errors.dedup();
    for status in errors {
        responses.insert(status.to_string(), problem_response(status));
    }
    let params: Vec<Value> = op
        .params
        .iter()
        .map(|(name, location, required, schema)| {
            json!({"name": name, "in": location, "required": required,
                "schema": serde_json::from_str::<Value>(schema).unwrap_or_else(|_| json!({}))})
        })
        .collect();
    let operation_id = format!("{}{}", op.method, op.path.replace(['/', '{', '}', '-', '.'], "_"));
    let mut out = json!({
        "tags": [op.tag],
        "summary": op.summary,
        "operationId": operation_id,
        "parameters": params,
        "responses": responses,
    });
    out["security"] = match op.access {
        Access::Public => json!([]),
        _ => json!([{"bearerAuth": []}]),
    };
    out["description"] = Value::from(match op.access {
        Access::Public => "Public.",
        Access::ReadOnly => "Role: read-only or above.",
        Access::ReadWrite => "Role: read-write or above.",
        Access::Admin => "Role: admin.",
    });
    match op.body {
        Body::None => {}
        Body::Json(schema) => {
            out["requestBody"] = json!({"required": true, "content": {"application/json":
                {"schema": {"$ref": format!("#/components/schemas/{schema}")}}}});
        }
        Body::Bytes(mime) => {
            out["requestBody"] = json!({"required": true, "content": {mime: {"schema": {"type": "string", "format": "binary"}}}});
        }
        Body::Multipart(part) => {
            out["requestBody"] = json!({"required": true, "content": {"multipart/form-data": {"schema": {
                "type": "object", "required": [part],
                "properties": {part: {"type": "string", "format": "binary"}}}}}});
        }
    }
    out
}

fn document_json() -> Value {
    let mut paths = Map::new();
    for op in OPS {
        let item = paths.entry(op.path.to_string()).or_insert_with(|| json!({}));
        item[op.method] = operation(op);
    }
    let tags: Vec<Value> = [
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
    ]
    .iter()
    .map(|t| json!({"name": t}))
    .collect();
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "Synkronus",
            "version": SERVER_VERSION,
            "description": "Offline-first sync server, compatible with Synkronus 1.0. Every path is also \
                served under /api and /api/v1 (the servers below), except GET /, which is served only at \
                the root. Every GET also answers HEAD. Sync pull and push have three dialects \
                (synkronus, spec, camel), chosen by the body; they appear as oneOf. Every error is a \
                Problem (API.md section 4).",
            "license": {"name": "MIT"},
        },
        "servers": [{"url": "/"}, {"url": "/api"}, {"url": "/api/v1"}],
        "tags": tags,
        "paths": paths,
        "components": {"securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}},
            "schemas": schemas()},
    })
}

/// Component schemas. Bodies whose shape varies freely (record data, manifests) stay open objects.
fn schemas() -> Value {
    let ts = json!({"type": "string", "format": "date-time"});
    let nullable_ts = json!({"type": "string", "format": "date-time", "nullable": true});
    let any_object = json!({"type": "object", "additionalProperties": true});
    let warning = json!({"type": "object", "required": ["code", "message"], "properties": {
        "id": {"type": "string"}, "code": {"type": "string"}, "message": {"type": "string"}}});
    let mut common = json!({
        // utoipa's name for "no type": it writes the schema without a `type` key, so any JSON fits.
        "AnyJson": {"type": "value",
            "description": "Any JSON value; the fields this operation reads are described in API.md."},
        "Object": any_object,
        "Message": {"type": "object", "required": ["message"], "properties": {"message": {"type": "string"}}},
        "ItemProblem": {"type": "object", "required": ["path", "code", "message"], "properties": {
            "recordId": {"type": "string"}, "path": {"type": "string"}, "code": {"type": "string"},
            "message": {"type": "string"}}},
        "Problem": {
            "type": "object",
            "description": "RFC 7807 problem details plus the flat keys real clients read (API.md 4).",
            "required": ["type", "title", "status", "detail", "code", "error", "message", "request_id"],
            "properties": {
                "type": {"type": "string"}, "title": {"type": "string"}, "status": {"type": "integer"},
                "detail": {"type": "string"}, "code": {"type": "string"}, "error": {"type": "string"},
                "message": {"type": "string"}, "request_id": {"type": "string"},
                "errors": {"type": "array", "items": {"$ref": "#/components/schemas/ItemProblem"}},
                "retry_after": {"type": "integer"},
            },
        },
        "ServiceDescriptor": {"type": "object", "required": ["service", "version", "api_version"], "properties": {
            "service": {"type": "string"}, "version": {"type": "string"}, "api_version": {"type": "string"},
            "health": {"type": "string"}, "openapi": {"type": "string"}}},
        "Health": {"type": "object", "required": ["status", "timestamp", "version", "database"], "properties": {
            "status": {"type": "string"}, "timestamp": ts, "version": {"type": "string"},
            "database": {"type": "string"}}},
        "Version": {"type": "object", "required": ["version", "database", "system", "build"], "properties": {
            "version": {"type": "string"}, "build_time": {"type": "string"}, "git_commit": {"type": "string"},
            "go_version": {"type": "string"}, "server": any_object, "database": any_object,
            "system": any_object, "build": any_object}},
        "Status": {"type": "object", "required": ["status", "current_change_id"], "properties": {
            "status": {"type": "string"}, "version": {"type": "string"}, "uptime_seconds": {"type": "integer"},
            "database": {"type": "string"},
            "active_bundle_version": {"type": "string", "nullable": true},
            "observation_count": {"type": "integer"}, "attachment_count": {"type": "integer"},
            "current_change_id": {"type": "integer"}}},
        "LoginRequest": {"type": "object", "required": ["username", "password"], "properties": {
            "username": {"type": "string"}, "password": {"type": "string"}}},
        "RefreshRequest": {"type": "object", "properties": {
            "refresh_token": {"type": "string"}, "refreshToken": {"type": "string"}}},
        "TokenPair": {"type": "object", "required": ["token", "refresh_token", "expiresAt"], "properties": {
            "token": {"type": "string"}, "refresh_token": {"type": "string"}, "refreshToken": {"type": "string"},
            "expires_in": {"type": "integer"}, "expiresIn": {"type": "integer"}, "expiresAt": {"type": "integer"},
            "user": any_object}},
        "User": {"type": "object", "required": ["id", "username", "role", "roles"], "properties": {
            "id": {"type": "string", "format": "uuid"}, "username": {"type": "string"},
            "email": {"type": "string", "nullable": true}, "role": {"$ref": "#/components/schemas/Role"},
            "roles": {"type": "array", "items": {"$ref": "#/components/schemas/Role"}},
            "created_at": ts, "createdAt": ts, "last_login": nullable_ts}},
        "Role": {"type": "string", "enum": ["read-only", "read-write", "admin"]},
        "UserList": {"type": "array", "items": {"$ref": "#/components/schemas/User"}},
        "CreateUser": {"type": "object", "required": ["username", "password"], "properties": {
            "username": {"type": "string"}, "password": {"type": "string"}, "role": {"type": "string"},
            "email": {"type": "string", "nullable": true}}},
        "UpdateUser": {"type": "object", "properties": {
            "role": {"type": "string"}, "email": {"type": "string", "nullable": true}}},
        "ResetPassword": {"type": "object", "required": ["username"], "properties": {
            "username": {"type": "string"}, "new_password": {"type": "string"}, "newPassword": {"type": "string"}}},
        "ChangePassword": {"type": "object", "properties": {
            "current_password": {"type": "string"}, "currentPassword": {"type": "string"},
            "new_password": {"type": "string"}, "newPassword": {"type": "string"}}},
        "SwitchRequest": {"type": "object", "required": ["version"], "properties": {"version": {"type": "string"}}},
        "FormSpecRequest": {"type": "object", "required": ["form_type", "version", "schema"], "properties": {
            "form_type": {"type": "string"}, "version": {"type": "string"}, "schema": any_object,
            "uischema": any_object}},
        "AttachmentManifestRequest": {"type": "object", "required": ["client_id"], "properties": {
            "client_id": {"type": "string"}, "since": {"type": "integer"}}},
        "Warning": warning,
    });
    if let (Value::Object(all), Value::Object(sync)) = (&mut common, sync_schemas()) {
        all.extend(sync);
    }
    common
}

/// Sync bodies, one schema per dialect (API.md 8.7-8.9).
fn sync_schemas() -> Value {
    let ts = json!({"type": "string", "format": "date-time"});
    let nullable_ts = json!({"type": "string", "format": "date-time", "nullable": true});
    let any_object = json!({"type": "object", "additionalProperties": true});
    let geolocation = json!({"type": "object", "nullable": true, "additionalProperties": true});
    json!({
        "PullRequest": {"oneOf": [
            {"$ref": "#/components/schemas/PullRequestSynkronus"},
            {"$ref": "#/components/schemas/PullRequestSpec"},
            {"$ref": "#/components/schemas/PullRequestCamel"}]},
        "PullRequestSynkronus": {"type": "object", "required": ["client_id"], "properties": {
            "client_id": {"type": "string"},
            "since": {"type": "object", "nullable": true, "properties": {
                "version": {"type": "integer"}, "id": {"type": "string"}}},
            "schema_types": {"type": "array", "items": {"type": "string"}},
            "limit": {"type": "integer"}, "page_token": {"type": "string"}}},
        "PullRequestSpec": {"type": "object", "required": ["client_id", "since_change_id"], "properties": {
            "client_id": {"type": "string"}, "since_change_id": {"type": "integer"},
            "schema_types": {"type": "array", "items": {"type": "string"}},
            "limit": {"type": "integer"}, "page_token": {"type": "string"}}},
        "PullRequestCamel": {"type": "object", "required": ["clientId"], "properties": {
            "clientId": {"type": "string"}, "currentVersion": {"type": "integer"},
            "schemaTypes": {"type": "array", "items": {"type": "string"}},
            "limit": {"type": "integer"}, "pageToken": {"type": "string"}}},
        "PullResponse": {"oneOf": [
            {"$ref": "#/components/schemas/PullResponseSynkronus"},
            {"$ref": "#/components/schemas/PullResponseSpec"},
            {"$ref": "#/components/schemas/PullResponseCamel"}]},
        "PullResponseSynkronus": {"type": "object",
            "required": ["current_version", "records", "change_cutoff", "has_more", "sync_format_version"],
            "properties": {
                "current_version": {"type": "integer"}, "change_cutoff": {"type": "integer"},
                "has_more": {"type": "boolean"}, "next_page_token": {"type": "string"},
                "sync_format_version": {"type": "string"},
                "records": {"type": "array", "items": {"type": "object",
                    "required": ["observation_id", "form_type", "data", "deleted", "version"], "properties": {
                    "observation_id": {"type": "string"}, "form_type": {"type": "string"},
                    "form_version": {"type": "string"}, "data": any_object, "created_at": nullable_ts,
                    "updated_at": nullable_ts, "synced_at": nullable_ts, "deleted": {"type": "boolean"},
                    "geolocation": geolocation, "version": {"type": "integer"}}}}}},
        "PullResponseSpec": {"type": "object", "required": ["records", "change_cutoff", "has_more", "next_page_token"],
            "properties": {
                "change_cutoff": {"type": "integer"}, "has_more": {"type": "boolean"},
                "next_page_token": {"type": "string"},
                "records": {"type": "array", "items": {"type": "object",
                    "required": ["id", "schema_type", "change_id", "deleted"], "properties": {
                    "id": {"type": "string"}, "schema_type": {"type": "string"},
                    "schema_version": {"type": "string"}, "data": any_object, "change_id": {"type": "integer"},
                    "last_modified": ts, "deleted": {"type": "boolean"}}}}}},
        "PullResponseCamel": {"type": "object", "required": ["changes", "timestamp", "hasMore", "changeCutoff"],
            "properties": {
                "timestamp": {"type": "integer"}, "hasMore": {"type": "boolean"},
                "changeCutoff": {"type": "integer"}, "nextPageToken": {"type": "string"},
                "changes": {"type": "object", "required": ["observations"], "properties": {
                    "observations": {"type": "array", "items": {"type": "object",
                        "required": ["observationId", "formType", "deleted", "version"], "properties": {
                        "observationId": {"type": "string"}, "formType": {"type": "string"},
                        "formVersion": {"type": "string"}, "data": any_object, "createdAt": nullable_ts,
                        "updatedAt": nullable_ts, "syncedAt": nullable_ts, "deleted": {"type": "boolean"},
                        "geolocation": geolocation, "version": {"type": "integer"}}}}}}}},
        "PushRequest": {"oneOf": [
            {"$ref": "#/components/schemas/PushRequestSynkronus"},
            {"$ref": "#/components/schemas/PushRequestSpec"},
            {"$ref": "#/components/schemas/PushRequestCamel"}]},
        "PushRequestSynkronus": {"type": "object", "required": ["transmission_id", "client_id", "records"],
            "properties": {
                "transmission_id": {"type": "string"}, "client_id": {"type": "string"},
                "records": {"type": "array", "items": {"type": "object", "required": ["observation_id"],
                    "properties": {
                    "observation_id": {"type": "string"}, "form_type": {"type": "string"},
                    "form_version": {"type": "string"}, "data": any_object, "created_at": nullable_ts,
                    "updated_at": nullable_ts, "synced_at": nullable_ts, "deleted": {"type": "boolean"},
                    "geolocation": geolocation, "version": {"type": "integer"}}}}}},
        "PushRequestSpec": {"type": "object", "required": ["transmission_id", "client_id", "records"],
            "properties": {
                "transmission_id": {"type": "string"}, "client_id": {"type": "string"},
                "records": {"type": "array", "items": {"type": "object", "required": ["id", "schema_type"],
                    "properties": {
                    "id": {"type": "string"}, "schema_type": {"type": "string"},
                    "schema_version": {"type": "string"}, "data": any_object, "deleted": {"type": "boolean"},
                    "version": {"type": "integer"}}}}}},
        "PushRequestCamel": {"type": "object", "required": ["clientId", "transmissionId", "changes"],
            "properties": {
                "clientId": {"type": "string"}, "transmissionId": {"type": "string"},
                "changes": {"type": "object", "required": ["observations"], "properties": {
                    "observations": {"type": "array", "items": {"type": "object", "required": ["observationId"],
                        "properties": {
                        "observationId": {"type": "string"}, "formType": {"type": "string"},
                        "formVersion": {"type": "string"}, "data": any_object, "deleted": {"type": "boolean"},
                        "version": {"type": "integer"}}}}}}}},
        "PushResponse": {"oneOf": [
            {"$ref": "#/components/schemas/PushResponseSynkronus"},
            {"$ref": "#/components/schemas/PushResponseSpec"},
            {"$ref": "#/components/schemas/PushResponseCamel"}]},
        "PushResponseSynkronus": {"type": "object",
            "required": ["current_version", "success_count", "failed_records", "warnings"], "properties": {
                "current_version": {"type": "integer"}, "success_count": {"type": "integer"},
                "failed_records": {"type": "array", "items": any_object},
                "warnings": {"type": "array", "items": {"$ref": "#/components/schemas/Warning"}}}},
        "PushResponseSpec": {"type": "object", "required": ["successes", "failures", "warnings", "change_cutoff"],
            "properties": {
                "successes": {"type": "array", "items": {"type": "object", "required": ["id", "change_id"],
                    "properties": {"id": {"type": "string"}, "change_id": {"type": "integer"}}}},
                "failures": {"type": "array", "items": any_object},
                "warnings": {"type": "array", "items": {"$ref": "#/components/schemas/Warning"}},
                "change_cutoff": {"type": "integer"}}},
        "PushResponseCamel": {"type": "object", "required": ["timestamp", "conflicts", "warnings"], "properties": {
            "timestamp": {"type": "integer"},
            "conflicts": {"type": "array", "items": {"$ref": "#/components/schemas/Warning"}},
            "warnings": {"type": "array", "items": {"$ref": "#/components/schemas/Warning"}}}},
    })
}

/// The document, in utoipa's model (which checks its structure), and its two serialisations.
pub struct Document {
    pub model: OpenApi,
    pub json: String,
    pub yaml: String,
}

pub fn document() -> &'static Document {
    static DOC: OnceLock<Document> = OnceLock::new();
    DOC.get_or_init(|| {
        let model: OpenApi = serde_json::from_value(document_json()).unwrap_or_else(|e| {
            // A malformed table is a programming error caught by the tests, never by users.
            tracing::error!(error = %e, "the OpenAPI document does not fit the OpenAPI model");
            OpenApi::default()
        });
        let json = model.to_pretty_json().unwrap_or_else(|_| "{}".into());
        let yaml = model.to_yaml().unwrap_or_default();
        Document { model, json, yaml }
    })
}

async fn json_document() -> HttpResponse {
    HttpResponse::Ok().content_type("application/json").body(document().json.clone())
}

async fn yaml_document() -> HttpResponse {
    HttpResponse::Ok().content_type("application/yaml").body(document().yaml.clone())
}

/// A small page that lists the operations from the JSON document; it loads nothing from elsewhere.
async fn browser() -> HttpResponse {
    HttpResponse::Ok()
        .insert_header((header::CONTENT_TYPE, "text/html; charset=utf-8"))
        .insert_header((
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'",
        ))
        .body(SWAGGER_PAGE)
}

const SWAGGER_PAGE: &str = r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Synkronus API</title>
<style>
body{font-family:system-ui,sans-serif;margin:2rem;max-width:70rem}
details{border:1px solid #ccc;border-radius:4px;margin:.3rem 0;padding:.3rem .6rem}
summary{cursor:pointer}.m{display:inline-block;width:4.5rem;font-weight:bold;text-transform:uppercase}
.get{color:#1565c0}.post{color:#2e7d32}.put{color:#ef6c00}.delete{color:#c62828}
pre{background:#f6f6f6;padding:.5rem;overflow:auto}code{font-size:.9em}
</style></head><body>
<h1>Synkronus API</h1>
<p>Raw document: <a href="synkronus.json">JSON</a> · <a href="synkronus.yaml">YAML</a></p>
<div id="info"></div><div id="ops">Loading…</div>
<script>
fetch('synkronus.json').then(r => r.json()).then(doc => {
  const esc = s => String(s ?? '').replace(/[&<>"]/g, c => ({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c]));
  document.getElementById('info').innerHTML = '<p>' + esc(doc.info.description) + '</p>';
  const out = [];
  for (const [path, item] of Object.entries(doc.paths)) {
    for (const [method, op] of Object.entries(item)) {
      const params = (op.parameters || []).map(p => esc(p.in) + ' <code>' + esc(p.name) + '</code>' + (p.required ? ' (required)' : '')).join(', ');
      const body = op.requestBody ? '<pre>' + esc(JSON.stringify(op.requestBody.content, null, 2)) + '</pre>' : '';
      const statuses = Object.entries(op.responses).map(([s, r]) => esc(s) + ' ' + esc(r.description)).join(' · ');
      out.push('<details><summary><span class="m ' + esc(method) + '">' + esc(method) + '</span><code>' + esc(path) +
        '</code> — ' + esc(op.summary) + '</summary><p>' + esc(op.description) + '</p>' +
        (params ? '<p>Parameters: ' + params + '</p>' : '') + body + '<p>Responses: ' + statuses + '</p></details>');
    }
  }
  document.getElementById('ops').innerHTML = out.join('');
}).catch(e => { document.getElementById('ops').textContent = 'Cannot load the document: ' + e; });
</script></body></html>"#;

pub fn routes(cfg: &mut web::ServiceConfig) {
    use crate::http::routing::{get, resource};
    cfg.service(resource("/openapi/synkronus.yaml", "GET, HEAD").route(get().to(yaml_document)))
        .service(resource("/openapi/synkronus.json", "GET, HEAD").route(get().to(json_document)))
        .service(resource("/openapi/swagger", "GET, HEAD").route(get().to(browser)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_keeps_everything_the_table_says() {
        let mut table = document_json();
        let model: OpenApi =
            serde_json::from_value(table.clone()).unwrap_or_else(|e| panic!("not an OpenAPI model: {e}"));
        let round_trip = serde_json::to_value(model).expect("serialises");
        table["components"]["schemas"]["AnyJson"].as_object_mut().map(|o| o.remove("type"));
        assert_eq!(round_trip, table, "utoipa's model dropped or changed something");
        let served: Value = serde_json::from_str(&document().json).expect("JSON");
        assert_eq!(served, table);
        assert!(served["paths"]["/sync/push"]["post"]["responses"]["422"].is_object());
        assert!(document().yaml.contains("openapi: 3.0.3"));
    }

    #[test]
    fn operation_ids_are_unique() {
        let mut ids: Vec<String> = OPS.iter().map(|op| operation(op)["operationId"].to_string()).collect();
        let total = ids.len();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), total);
    }
}
