//! Internal model -> wire, per dialect (API.md 8.7–8.9).

use serde_json::{json, Map, Value};

use super::{Dialect, PullCursor, PullPage, PushResult, StoredRecord, Warning};
use crate::domain::page_token::{self, TokenKind};
use crate::domain::time::format;

fn ts(t: Option<chrono::DateTime<chrono::Utc>>) -> Value {
    t.map(|t| Value::String(format(t))).unwrap_or(Value::Null)
}

/// The synkronus Observation (8.7), also used by `/observations` and exports.
pub fn synkronus_record(r: &StoredRecord) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("observation_id".into(), r.id.clone().into());
    m.insert("form_type".into(), r.form_type.clone().into());
    m.insert("form_version".into(), r.form_version.clone().into());
    m.insert("data".into(), r.data.clone());
    m.insert("created_at".into(), ts(r.created_at));
    m.insert("updated_at".into(), ts(r.updated_at));
    m.insert("synced_at".into(), format(r.synced_at).into());
    m.insert("deleted".into(), r.deleted.into());
    m.insert("geolocation".into(), r.geolocation.clone().unwrap_or(Value::Null));
    m.insert("version".into(), r.change_id.into());
    m.insert("author".into(), r.author.clone().map(Value::from).unwrap_or(Value::Null));
    m.insert("device_id".into(), r.device_id.clone().map(Value::from).unwrap_or(Value::Null));
    m.insert("tags".into(), r.tags.clone().unwrap_or(Value::Null));
    m
}

fn spec_record(r: &StoredRecord) -> Value {
    json!({
        "id": r.id,
        "schema_type": r.form_type,
        "schema_version": r.form_version,
        "data": r.data,
        "change_id": r.change_id,
        "last_modified": format(r.synced_at),
        "deleted": r.deleted,
    })
}

fn camel_record(r: &StoredRecord) -> Value {
    json!({
        "observationId": r.id,
        "formType": r.form_type,
        "formVersion": r.form_version,
        "data": r.data,
        "createdAt": ts(r.created_at),
        "updatedAt": ts(r.updated_at),
        "syncedAt": format(r.synced_at),
        "deleted": r.deleted,
        "geolocation": r.geolocation.clone().unwrap_or(Value::Null),
        "version": r.change_id,
        "author": r.author,
        "deviceId": r.device_id,
        "tags": r.tags.clone().unwrap_or(Value::Null),
    })
}

/// The continuation token: resumes after the cutoff while more remain, else after S.
pub fn next_page_token(page: &PullPage) -> String {
    page_token::encode(TokenKind::Pull, &PullCursor { a: page.resume_after(), t: page.types.clone() })
}

pub fn pull_response(dialect: Dialect, page: &PullPage) -> Value {
    let mut body = pull_body(dialect, page);
    body["repository_generation"] = page.repository_generation.into();
    body
}

fn pull_body(dialect: Dialect, page: &PullPage) -> Value {
    let cutoff = page.change_cutoff();
    match dialect {
        Dialect::Synkronus => {
            let records: Vec<Value> =
                page.records.iter().map(|r| Value::Object(synkronus_record(r))).collect();
            let mut body = json!({
                "current_version": page.head,
                "records": records,
                "change_cutoff": cutoff,
                "has_more": page.has_more,
                "sync_format_version": "1.0",
            });
            if page.has_more {
                body["next_page_token"] = next_page_token(page).into();
            }
            body
        }
        Dialect::Spec => json!({
            "records": page.records.iter().map(spec_record).collect::<Vec<_>>(),
            "change_cutoff": cutoff,
            "next_page_token": next_page_token(page),
            "has_more": page.has_more,
        }),
        Dialect::Camel => json!({
            "changes": {"observations": page.records.iter().map(camel_record).collect::<Vec<_>>()},
            "timestamp": page.resume_after(),
            "hasMore": page.has_more,
            "changeCutoff": cutoff,
        }),
    }
}

fn warning_json(w: &Warning) -> Value {
    serde_json::to_value(w).unwrap_or(Value::Null)
}

pub fn push_response(dialect: Dialect, result: &PushResult) -> Value {
    let mut body = push_body(dialect, result);
    body["repository_generation"] = result.repository_generation.into();
    body
}

fn push_body(dialect: Dialect, result: &PushResult) -> Value {
    match dialect {
        Dialect::Synkronus => json!({
            "current_version": result.head,
            "success_count": result.items.len(),
            "failed_records": [],
            "warnings": result.warnings.iter().map(warning_json).collect::<Vec<_>>(),
        }),
        Dialect::Spec => json!({
            "successes": result.items.iter().map(|(id, cid)| json!({"id": id, "change_id": cid})).collect::<Vec<_>>(),
            "failures": [],
            "warnings": result.warnings.iter().map(warning_json).collect::<Vec<_>>(),
            "change_cutoff": result.head,
        }),
        Dialect::Camel => {
            let (conflicts, others): (Vec<&Warning>, Vec<&Warning>) =
                result.warnings.iter().partition(|w| w.code == "CONFLICT_OVERWRITTEN");
            json!({
                "timestamp": result.head,
                "conflicts": conflicts.iter().map(|w| json!({
                    "id": w.id, "code": w.code, "message": w.message,
                    "serverVersion": w.server_version, "baseVersion": w.base_version,
                })).collect::<Vec<_>>(),
                "warnings": others.iter().map(|w| warning_json(w)).collect::<Vec<_>>(),
            })
        }
    }
}
