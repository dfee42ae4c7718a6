//! The sync bodies (docs/api.md §8.7-§8.9), written by hand: one schema per dialect, joined by
//! `oneOf`, because the handlers decode all three from one JSON body (`domain::sync::decode`)
//! and encode them through per-dialect types the document could not tell apart.

use serde_json::{json, Value};
use utoipa::openapi::OpenApi;
use utoipa::Modify;

pub struct Dialects;

impl Modify for Dialects {
    fn modify(&self, doc: &mut OpenApi) {
        let Some(components) = doc.components.as_mut() else { return };
        let Value::Object(schemas) = schemas() else { return };
        for (name, schema) in schemas {
            match serde_json::from_value(schema) {
                Ok(schema) => {
                    components.schemas.insert(name, schema);
                }
                // A malformed literal is a programming error the document tests catch.
                Err(e) => tracing::error!(schema = %name, error = %e, "a sync schema does not fit the model"),
            }
        }
    }
}

fn schemas() -> Value {
    let ts = json!({"type": "string", "format": "date-time"});
    let nullable_ts = json!({"type": "string", "format": "date-time", "nullable": true});
    let any_object = json!({"type": "object", "additionalProperties": true});
    let geolocation = json!({"type": "object", "nullable": true, "additionalProperties": true});
    json!({
        "Warning": {"type": "object", "required": ["code", "message"], "properties": {
            "id": {"type": "string"}, "code": {"type": "string"}, "message": {"type": "string"}}},
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
