//! `RECORD_VALIDATION` (docs/api.md §8.4): pushed `data` checked against the JSON Schema of its form.
//! Compiled validators are cached for a few seconds so the push hot path rarely touches the
//! database for them; a newly registered spec or a bundle switch takes effect within the TTL.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::DashMap;
use jsonschema::Validator;
use serde_json::{json, Value};

use crate::db::formspecs;
use crate::db::DbResult;
use crate::domain::sync::IncomingRecord;

const CACHE_TTL: Duration = Duration::from_secs(5);
/// At most this many schema errors are reported per record.
const MAX_ERRORS_PER_RECORD: usize = 10;

/// (form type, form version): the validator that applies, if any, and when it was looked up.
type CacheKey = (String, String);
type CacheEntry = (Option<Arc<Validator>>, Instant);

#[derive(Default)]
pub struct SchemaCache {
    entries: DashMap<CacheKey, CacheEntry>,
}

/// A record whose data failed its schema: its index and up to ten `{path, message}` items.
pub struct SchemaFailure {
    pub index: usize,
    pub record_id: String,
    pub errors: Vec<Value>,
}

impl SchemaCache {
    async fn validator(
        &self,
        pool: &deadpool_postgres::Pool,
        form_type: &str,
        form_version: &str,
    ) -> DbResult<Option<Arc<Validator>>> {
        let key = (form_type.to_string(), form_version.to_string());
        if let Some(hit) = self.entries.get(&key) {
            if hit.1.elapsed() < CACHE_TTL {
                return Ok(hit.0.clone());
            }
        }
        let db = pool.get().await?;
        let schema = formspecs::spec_for(&db, form_type, form_version).await?;
        // Registered schemas were compiled when stored; one that no longer compiles is skipped.
        let validator = schema.and_then(|s| jsonschema::draft7::new(&s).ok()).map(Arc::new);
        if self.entries.len() > 10_000 {
            self.entries.retain(|_, (_, at)| at.elapsed() < CACHE_TTL);
        }
        self.entries.insert(key, (validator.clone(), Instant::now()));
        Ok(validator)
    }

    /// Checks every non-deleted record with a form type that has a schema.
    pub async fn check(
        &self,
        pool: &deadpool_postgres::Pool,
        records: &[IncomingRecord],
    ) -> DbResult<Vec<SchemaFailure>> {
        let mut failures = Vec::new();
        for (index, record) in records.iter().enumerate() {
            let Some(data) = record.data().filter(|_| !record.deleted && !record.form_type().is_empty())
            else {
                continue;
            };
            let Some(validator) = self.validator(pool, record.form_type(), record.form_version()).await?
            else {
                continue;
            };
            // Parsed only here, when validation is on: the push path keeps data as text.
            let Ok(data) = serde_json::from_str::<Value>(data) else {
                continue;
            };
            let errors: Vec<Value> = validator
                .iter_errors(&data)
                .take(MAX_ERRORS_PER_RECORD)
                .map(|e| json!({"path": e.instance_path().to_string(), "message": e.to_string()}))
                .collect();
            if !errors.is_empty() {
                failures.push(SchemaFailure { index, record_id: record.id().to_string(), errors });
            }
        }
        Ok(failures)
    }
}
