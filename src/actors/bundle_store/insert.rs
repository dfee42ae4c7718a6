//! The database side of storing a pushed version: choosing its id and inserting its row (with
//! activation, form registration and the audit entries) in the push's transaction.

use chrono::{DateTime, Timelike, Utc};
use deadpool_postgres::{GenericClient, Pool, Transaction};
use serde_json::Value;

use super::files::BundleFiles;
use super::{Push, VersionInfo};
use crate::db;
use crate::domain::audit::push_entries;
use crate::domain::bundle::{
    declared_version_id, version_id_candidates, version_id_from_time, ValidatedBundle,
};
use crate::domain::formspec::KeptFormSpec;
use crate::error::ApiResult;

/// The declared id (or one from the upload time), suffixed until it names no version ever
/// stored. Run under the bundle lock, so two uploads cannot pick the same id.
pub(super) async fn free_version_id(
    tx: &impl GenericClient,
    bundle: &ValidatedBundle,
    received_at: DateTime<Utc>,
) -> ApiResult<String> {
    let base = bundle
        .manifest
        .as_ref()
        .and_then(declared_version_id)
        .unwrap_or_else(|| version_id_from_time(received_at));
    for candidate in version_id_candidates(&base) {
        if !db::bundles::id_used(tx, &candidate).await? {
            return Ok(candidate);
        }
    }
    Ok(base)
}

/// Inserts the version's row and, when asked, activates it and registers its forms, then
/// commits. Returns the new pointer generation if activated, and the forms whose existing spec
/// was kept.
pub(super) async fn insert_version(
    tx: Transaction<'_>,
    bundle: &ValidatedBundle,
    info: &VersionInfo,
    manifest_json: &Value,
    push: &Push,
) -> ApiResult<(Option<i64>, Vec<KeptFormSpec>)> {
    let manifest = &info.manifest;
    db::bundles::insert(
        &tx,
        &info.version,
        &manifest.name,
        &manifest.entry_point,
        info.created_at,
        manifest_json,
    )
    .await?;
    let mut activated = None;
    let mut warnings = Vec::new();
    let previous = if push.activate { db::bundles::active(&tx).await?.0 } else { None };
    let entries =
        push_entries(&push.origin, &info.version, &manifest.hash, push.activate.then_some(previous));
    db::audit::append_all(&tx, &entries).await?;
    if push.activate {
        let generation = db::bundles::set_active(&tx, &info.version).await?;
        let forms: Vec<(String, Value, Value)> = bundle
            .forms
            .iter()
            .map(|(name, form)| (name.clone(), form.schema.clone(), form.ui.clone()))
            .collect();
        warnings = db::formspecs::register_bundle_forms(&tx, &info.version, &forms).await?;
        activated = Some(generation);
    }
    tx.commit().await?;
    Ok((activated, warnings))
}

/// Database timestamps keep microseconds; truncating keeps memory and rows equal.
pub(super) fn now_micros() -> DateTime<Utc> {
    let now = Utc::now();
    now.with_nanosecond(now.nanosecond() / 1_000 * 1_000).unwrap_or(now)
}

/// Removes the files of a version whose row insert failed. That transaction has ended and with it
/// the bundle lock, so this takes the lock again and leaves the files alone if another push has
/// recorded the same id meanwhile.
pub(super) async fn remove_unrecorded(pool: &Pool, files: &BundleFiles, version: &str) {
    let result = async {
        let mut client = pool.get().await?;
        let tx = client.transaction().await?;
        db::bundles::lock(&tx).await?;
        if db::bundles::find(&tx, version).await?.is_none() {
            files.unpublish(version).await?;
        }
        ApiResult::Ok(())
    }
    .await;
    if let Err(error) = result {
        tracing::warn!(%error, %version, "cannot remove the files of a failed app bundle upload");
    }
}
