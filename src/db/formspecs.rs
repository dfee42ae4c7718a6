//! SQL for form specifications (docs/api.md §11) and the forms each activated bundle carried.

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use serde_json::Value;
use tokio_postgres::Row;

use crate::db::DbResult;
use crate::domain::formspec::{bundle_form_version, KeptFormSpec};

#[derive(Debug, Clone)]
pub struct FormSpecRow {
    pub form_type: String,
    pub version: String,
    pub schema: Value,
    pub uischema: Value,
    pub source: String,
    pub created_at: DateTime<Utc>,
}

/// A listing entry (no schema bodies).
#[derive(Debug, Clone)]
pub struct FormSpecSummary {
    pub form_type: String,
    pub version: String,
    pub source: String,
    pub created_at: DateTime<Utc>,
}

/// What registering a spec did.
#[derive(Debug, Clone)]
pub enum Registration {
    Created(FormSpecRow),
    /// The same (formType, version) already existed with the same content.
    Identical(FormSpecRow),
    /// It existed with different content; the stored spec is kept.
    Conflict(FormSpecRow),
}

const COLUMNS: &str = "form_type, version, schema, uischema, source, created_at";

fn spec_from_row(row: &Row) -> FormSpecRow {
    FormSpecRow {
        form_type: row.get("form_type"),
        version: row.get("version"),
        schema: row.get("schema"),
        uischema: row.get("uischema"),
        source: row.get("source"),
        created_at: row.get("created_at"),
    }
}

fn summary_from_row(row: &Row) -> FormSpecSummary {
    FormSpecSummary {
        form_type: row.get("form_type"),
        version: row.get("version"),
        source: row.get("source"),
        created_at: row.get("created_at"),
    }
}

/// Stores a spec unless its (formType, version) exists. Only the `BundleStore` calls this (and
/// `register_bundle_forms`): it is the one writer of `form_specs`, under the bundle lock. Content is compared as jsonb, which
/// ignores key order and formatting: the canonical-JSON comparison of docs/api.md §11.1.
#[tracing::instrument(name = "db.formspecs.register", level = "debug", skip_all)]
pub async fn register(
    db: &impl GenericClient,
    form_type: &str,
    version: &str,
    schema: &Value,
    uischema: &Value,
    source: &str,
) -> DbResult<Registration> {
    let insert = format!(
        "INSERT INTO form_specs (form_type, version, schema, uischema, source) VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (form_type, version) DO NOTHING RETURNING {COLUMNS}"
    );
    if let Some(row) = db.query_opt(&insert, &[&form_type, &version, schema, uischema, &source]).await? {
        return Ok(Registration::Created(spec_from_row(&row)));
    }
    let existing = format!(
        "SELECT {COLUMNS}, (schema = $3::jsonb AND uischema = $4::jsonb) AS same
         FROM form_specs WHERE form_type = $1 AND version = $2"
    );
    let row = db.query_one(&existing, &[&form_type, &version, schema, uischema]).await?;
    let spec = spec_from_row(&row);
    Ok(if row.get::<_, bool>("same") { Registration::Identical(spec) } else { Registration::Conflict(spec) })
}

/// Registers the forms of a bundle version that becomes active (docs/api.md §11.2) and remembers
/// them for the record-validation fallback. Returns the forms whose existing spec was kept.
#[tracing::instrument(name = "db.formspecs.register_bundle_forms", level = "debug", skip_all)]
pub async fn register_bundle_forms(
    db: &impl GenericClient,
    bundle_version: &str,
    forms: &[(String, Value, Value)],
) -> DbResult<Vec<KeptFormSpec>> {
    let source = format!("bundle:{bundle_version}");
    let mut kept = Vec::new();
    for (form_type, schema, uischema) in forms {
        let version = bundle_form_version(schema, bundle_version);
        if let Registration::Conflict(_) =
            register(db, form_type, &version, schema, uischema, &source).await?
        {
            kept.push(KeptFormSpec { form_type: form_type.clone(), version: version.clone() });
        }
        db.execute(
            "INSERT INTO bundle_forms (bundle_version, form_type, spec_version, schema) VALUES ($1, $2, $3, $4)
             ON CONFLICT (bundle_version, form_type) DO NOTHING",
            &[&bundle_version, form_type, &version, schema],
        )
        .await?;
    }
    Ok(kept)
}

/// Every spec, sorted by form type (byte order), then newest first.
#[tracing::instrument(name = "db.formspecs.list", level = "debug", skip_all)]
pub async fn list(db: &impl GenericClient) -> DbResult<Vec<FormSpecSummary>> {
    let rows = db
        .query(
            "SELECT form_type, version, source, created_at FROM form_specs
             ORDER BY form_type COLLATE \"C\", seq DESC",
            &[],
        )
        .await?;
    Ok(rows.iter().map(summary_from_row).collect())
}

/// The versions of one form type, newest first.
#[tracing::instrument(name = "db.formspecs.versions_of", level = "debug", skip_all)]
pub async fn versions_of(db: &impl GenericClient, form_type: &str) -> DbResult<Vec<FormSpecSummary>> {
    let rows = db
        .query(
            "SELECT form_type, version, source, created_at FROM form_specs WHERE form_type = $1
             ORDER BY seq DESC",
            &[&form_type],
        )
        .await?;
    Ok(rows.iter().map(summary_from_row).collect())
}

#[tracing::instrument(name = "db.formspecs.get", level = "debug", skip_all)]
pub async fn get(db: &impl GenericClient, form_type: &str, version: &str) -> DbResult<Option<FormSpecRow>> {
    let sql = format!("SELECT {COLUMNS} FROM form_specs WHERE form_type = $1 AND version = $2");
    Ok(db.query_opt(&sql, &[&form_type, &version]).await?.map(|row| spec_from_row(&row)))
}

/// The JSON Schema to check a record of (form type, form version) against (docs/api.md §8.4): the
/// spec registered for exactly that pair, else the schema the active bundle carries for that
/// form type, else `None` (the check is skipped).
#[tracing::instrument(name = "db.formspecs.spec_for", level = "debug", skip_all)]
pub async fn spec_for(
    db: &impl GenericClient,
    form_type: &str,
    form_version: &str,
) -> DbResult<Option<Value>> {
    let row = db
        .query_opt(
            "SELECT schema FROM (
                 SELECT 0 AS rank, schema FROM form_specs WHERE form_type = $1 AND version = $2
                 UNION ALL
                 SELECT 1 AS rank, f.schema FROM bundle_active a
                 JOIN bundle_forms f ON f.bundle_version = a.version
                 WHERE f.form_type = $1
             ) candidates ORDER BY rank LIMIT 1",
            &[&form_type, &form_version],
        )
        .await?;
    Ok(row.map(|row| row.get(0)))
}
