//! `BundleStore` owns the app bundle versions and the active pointer (docs/api.md §9,
//! docs/architecture.md "App bundles").
//!
//! Uploads are validated, unpacked into a staging folder, then stored as `versions/<id>/` in
//! the bundles storage area (renamed there with the local backend) and recorded in one
//! transaction under the bundle lock, so a failed upload leaves nothing and uses no id. The
//! active pointer lives in the database; the store keeps the active version in memory and learns
//! about switches made by other processes through LISTEN/NOTIFY, with a periodic re-read as the
//! fallback. Every change carries the pointer's generation, so updates applied out of order never
//! move the pointer back.
//!
//! It is not an actor but a plain value every handler shares (cheap to clone): its writes are
//! serialised by the bundle lock in the database, which orders other nodes too, and its one piece
//! of memory, the active pointer, changes under a mutex and only to a newer generation.

mod cache;
mod files;
mod insert;
mod version;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use chrono::{DateTime, Utc};
use dashmap::DashMap;
use deadpool_postgres::Pool;
use serde_json::Value;
use tracing::Instrument;

use files::{remove_stale_staging, unpack, BundleFiles};
pub use files::{staging_dir, version_prefix, zip_key};
use insert::{free_version_id, insert_version, now_micros, remove_unrecorded};
pub use version::VersionInfo;

use crate::db;
use crate::db::formspecs::Registration;
use crate::domain::audit::{switch_action, Action, Origin};
use crate::domain::bundle::{
    validate_zip, version_manifest, Limits, ManifestFile, ValidatedBundle, VersionView,
};
use crate::domain::formspec::KeptFormSpec;
use crate::error::{ApiError, ApiResult, ErrorCode};

/// How often the active pointer is re-read in case a notification was lost.
const REFRESH_INTERVAL: Duration = Duration::from_secs(1);

/// Which version a read wants.
#[derive(Debug, Clone)]
pub enum Target {
    Active,
    /// The most recently uploaded version, active or not.
    Newest,
    Version(String),
}

/// A validated-to-be upload, already streamed to `upload` (a file in [`staging_dir`]).
pub struct Push {
    pub upload: PathBuf,
    pub activate: bool,
    pub received_at: DateTime<Utc>,
    /// Who pushes: the audit log's entries of the push, activation and retention name them.
    pub origin: Origin,
}

#[derive(Debug)]
pub struct PushOutcome {
    pub version: Arc<VersionInfo>,
    pub active: bool,
    pub warnings: Vec<KeptFormSpec>,
}

#[derive(Debug)]
pub struct SwitchOutcome {
    pub version: String,
    pub previous_version: Option<String>,
    pub warnings: Vec<KeptFormSpec>,
}

/// A form spec as the API receives it (docs/api.md §11.1), already checked.
#[derive(Debug, Clone)]
pub struct NewFormSpec {
    pub form_type: String,
    pub version: String,
    pub schema: Value,
    pub uischema: Value,
}

/// The pointer state applied in memory: its generation and the version it names.
type Pointer = (i64, Option<Arc<VersionInfo>>);

/// The bundle store: reads resolve a version, writes upload, switch or register form specs.
#[derive(Clone)]
pub struct BundleStore {
    inner: Arc<Inner>,
}

struct Inner {
    job: Job,
    conn: String,
    keep: usize,
    limits: Limits,
    /// The pointer as this process last applied it.
    pointer: Mutex<Pointer>,
    /// Its background work (following the pointer, sweeps, caching), stopped with the server.
    tasks: crate::shutdown::Tasks,
}

/// A call's work, run to its end (the pointer applied) even if the request goes away.
async fn to_the_end<T: 'static>(
    message: &'static str,
    work: impl std::future::Future<Output = ApiResult<T>> + 'static,
) -> ApiResult<T> {
    super::to_the_end("bundle store", message, work).await
}

impl BundleStore {
    /// Loads the active version, then starts following the pointer (LISTEN and the timer) and
    /// the hourly sweep of files without a row. `conn` opens the LISTEN connection.
    pub async fn start(
        config: &crate::config::Config,
        pool: &Pool,
        conn: &str,
        storage: &crate::storage::Storage,
        tasks: &crate::shutdown::Tasks,
    ) -> anyhow::Result<Self> {
        let root = config.app_bundle_path.clone();
        std::fs::create_dir_all(staging_dir(&root))?;
        remove_stale_staging(&staging_dir(&root));
        let files = BundleFiles::new(config, storage.bundles.clone())?;
        let job = Job { pool: pool.clone(), root, files, cache: Arc::new(DashMap::new()) };
        let pointer = read_pointer(&job, -1)
            .await
            .map_err(|e| anyhow::anyhow!("cannot read the active app bundle: {e}"))?
            .unwrap_or((0, None));
        let store = BundleStore {
            inner: Arc::new(Inner {
                job,
                conn: conn.to_owned(),
                keep: config.max_versions_kept,
                limits: Limits::default(),
                pointer: Mutex::new((-1, None)),
                tasks: tasks.clone(),
            }),
        };
        store.apply(pointer);
        tasks.spawn_local(follow_pointer(Arc::downgrade(&store.inner)));
        tasks.spawn_local(listen_loop(Arc::downgrade(&store.inner)));
        let (files, pool) = (store.inner.job.files.clone(), pool.clone());
        tasks.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(3600));
            loop {
                tick.tick().await;
                files.sweep(&pool).await;
            }
        });
        Ok(store)
    }

    /// Resolves a target to one version; the caller then serves only from that version.
    pub async fn resolve(&self, target: Target) -> ApiResult<Arc<VersionInfo>> {
        self.resolve_with(target, false).instrument(super::store_span("bundle store", "Resolve")).await
    }

    /// Like [`Self::resolve`], for routes that read the version's files (`info.dir`, `info.zip_path`):
    /// the version's files are made readable on this node first.
    pub async fn resolve_files(&self, target: Target) -> ApiResult<Arc<VersionInfo>> {
        self.resolve_with(target, true).instrument(super::store_span("bundle store", "Resolve")).await
    }

    /// Validates and stores an upload already streamed to `push.upload`, activating it if asked.
    pub async fn push(&self, push: Push) -> ApiResult<PushOutcome> {
        let store = self.clone();
        to_the_end("Push", async move {
            let inner = &store.inner;
            let upload = push.upload.clone();
            let origin = push.origin.clone();
            let result = inner.job.push(push, inner.limits.clone()).await;
            // Only a failed push still owns its upload; a successful one moved it into place.
            if result.is_err() {
                let _ = tokio::fs::remove_file(&upload).await;
            }
            let (outcome, pointer) = result?;
            inner.job.retain(inner.keep, &outcome.version.version, &origin).await;
            if let Some(pointer) = pointer {
                store.apply(pointer);
            }
            Ok(outcome)
        })
        .await
    }

    /// Makes `version` the active one.
    pub async fn activate(&self, version: String, origin: Origin) -> ApiResult<SwitchOutcome> {
        let store = self.clone();
        to_the_end("Switch", async move {
            let (outcome, pointer) = store.inner.job.switch(&version, &origin).await?;
            if let Some(pointer) = pointer {
                store.apply(pointer);
            }
            Ok(outcome)
        })
        .await
    }

    /// Registers a form spec sent through the API. The store is the one writer of `form_specs`
    /// (activating a bundle registers its forms), so both kinds of registration take the bundle
    /// lock and cannot interleave, in this process or another.
    pub async fn register_form_spec(&self, spec: NewFormSpec, origin: Origin) -> ApiResult<Registration> {
        to_the_end("RegisterFormSpec", register_form_spec(self.inner.job.pool.clone(), spec, origin)).await
    }

    async fn resolve_with(&self, target: Target, files: bool) -> ApiResult<Arc<VersionInfo>> {
        let job = &self.inner.job;
        let active = self.active();
        let info = job.resolve(target, active.clone()).await?;
        if files {
            job.files.ensure(&info, active.as_ref().map(|a| a.version.as_str())).await?;
        }
        Ok(info)
    }

    fn active(&self) -> Option<Arc<VersionInfo>> {
        self.inner
            .pointer
            .lock()
            .map(|p| p.1.clone())
            .unwrap_or_else(|poisoned| poisoned.into_inner().1.clone())
    }

    /// Applies a pointer read from the database, if it is newer than the one applied.
    fn apply(&self, (generation, active): Pointer) {
        let mut applied = self.inner.pointer.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if generation <= applied.0 {
            return;
        }
        *applied = (generation, active.clone());
        drop(applied);
        // Fetched now rather than by the first device asking, and kept through outages.
        if let Some(info) = active {
            let files = self.inner.job.files.clone();
            self.inner.tasks.spawn_local(async move {
                if let Err(error) = files.ensure(&info, Some(&info.version)).await {
                    tracing::warn!(%error, version = %info.version, "cannot cache the active app bundle");
                }
            });
        }
    }

    /// Re-reads the pointer and applies it if it moved.
    async fn refresh(&self) {
        let known = self.inner.pointer.lock().map(|p| p.0).unwrap_or_else(|poisoned| poisoned.into_inner().0);
        match read_pointer(&self.inner.job, known).await {
            Ok(Some(pointer)) => self.apply(pointer),
            Ok(None) => {}
            Err(error) => tracing::warn!(%error, "cannot re-read the active app bundle"),
        }
    }
}

/// Re-reads the pointer every [`REFRESH_INTERVAL`] while the store exists, in case a
/// notification was lost.
async fn follow_pointer(store: Weak<Inner>) {
    let mut tick = tokio::time::interval(REFRESH_INTERVAL);
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(inner) = store.upgrade() else { return };
        BundleStore { inner }.refresh().await;
    }
}

/// Keeps a LISTEN connection open while the store exists, reconnecting after failures.
async fn listen_loop(store: Weak<Inner>) {
    loop {
        let Some(conn) = store.upgrade().map(|inner| inner.conn.clone()) else { return };
        match db::bundles::listen_for_switches(&conn).await {
            Ok((client, mut notifications)) => {
                // Catch up with any switch made while nobody was listening.
                let Some(inner) = store.upgrade() else { return };
                BundleStore { inner }.refresh().await;
                while notifications.recv().await.is_some() {
                    let Some(inner) = store.upgrade() else { return };
                    BundleStore { inner }.refresh().await;
                }
                drop(client);
            }
            Err(error) => tracing::warn!(%error, "cannot listen for app bundle switches"),
        }
        if store.upgrade().is_none() {
            return;
        }
        tokio::time::sleep(REFRESH_INTERVAL).await;
    }
}

/// A form spec registration, in one transaction under the bundle lock, with its audit entry.
async fn register_form_spec(pool: Pool, spec: NewFormSpec, origin: Origin) -> ApiResult<Registration> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    db::bundles::lock(&tx).await?;
    let registration =
        db::formspecs::register(&tx, &spec.form_type, &spec.version, &spec.schema, &spec.uischema, "api")
            .await?;
    // Only a new spec changes anything; an identical one is a no-op, a conflict refused.
    if let Registration::Created(_) = &registration {
        let details = serde_json::json!({"version": spec.version});
        db::audit::append(&tx, &origin.entry(Action::FormSpecChanged, Some(&spec.form_type), details))
            .await?;
    }
    tx.commit().await?;
    Ok(registration)
}

impl Job {
    async fn resolve(&self, target: Target, active: Option<Arc<VersionInfo>>) -> ApiResult<Arc<VersionInfo>> {
        if let Target::Active = target {
            return active.ok_or_else(|| ApiError::not_found("No app bundle is active"));
        }
        let job = self;
        {
            let db = job.pool.get().await?;
            let row = match &target {
                Target::Version(version) => {
                    if let Some(info) = job.cache.get(version) {
                        return Ok(info.clone());
                    }
                    db::bundles::find(&db, version).await?
                }
                _ => db::bundles::newest(&db).await?,
            };
            let row = row.ok_or_else(|| match &target {
                Target::Version(version) => {
                    ApiError::not_found(format!("App bundle version '{version}' not found"))
                }
                _ => ApiError::not_found("No app bundle versions exist"),
            })?;
            job.load(row)
        }
    }
}

/// Reads the pointer; `None` when its generation is not newer than `known`.
async fn read_pointer(job: &Job, known: i64) -> ApiResult<Option<Pointer>> {
    let db = job.pool.get().await?;
    let (version, generation) = db::bundles::active(&db).await?;
    if generation <= known {
        return Ok(None);
    }
    // Only when the pointer moved: one look-up, then `load` answers from the cache if it can.
    let info = match version {
        None => None,
        Some(version) => {
            let row = db::bundles::find(&db, &version).await?;
            let missing = || ApiError::internal(format!("active bundle version {version} has no row"));
            Some(job.load(row.ok_or_else(missing)?)?)
        }
    };
    Ok(Some((generation, info)))
}

/// What every call of the store works with: the database, the files and the loaded versions.
struct Job {
    pool: Pool,
    root: PathBuf,
    files: BundleFiles,
    cache: Arc<DashMap<String, Arc<VersionInfo>>>,
}

impl Job {
    fn load(&self, row: db::bundles::VersionRow) -> ApiResult<Arc<VersionInfo>> {
        if let Some(info) = self.cache.get(&row.version) {
            return Ok(info.clone());
        }
        let info = Arc::new(VersionInfo::from_row(&self.files.local_root(), row)?);
        self.cache.insert(info.version.clone(), info.clone());
        Ok(info)
    }

    async fn push(&self, push: Push, limits: Limits) -> ApiResult<(PushOutcome, Option<Pointer>)> {
        let upload = push.upload.clone();
        let bundle = tokio::task::spawn_blocking(move || validate_zip(&upload, &limits))
            .await
            .map_err(ApiError::internal)??;

        let created_at = now_micros();
        let staging = staging_dir(&self.root).join(format!("{}.d", uuid::Uuid::new_v4().simple()));
        let unpacked = {
            let (bundle, upload, staging) = (bundle.clone(), push.upload.clone(), staging.clone());
            tokio::task::spawn_blocking(move || unpack(&bundle, &upload, &staging, created_at))
                .await
                .map_err(ApiError::internal)?
        };
        let files = match unpacked {
            Ok(files) => files,
            Err(error) => {
                let _ = tokio::fs::remove_dir_all(&staging).await;
                return Err(ApiError::internal(format!("unpacking an app bundle failed: {error}")));
            }
        };
        let result = self.record(&bundle, &push, &staging, files, created_at).await;
        if result.is_err() {
            let _ = tokio::fs::remove_dir_all(&staging).await;
        }
        result
    }

    /// Assigns the id, moves the files into place and records the version, all under the
    /// bundle lock and in one transaction; on failure the moved files are removed again.
    async fn record(
        &self,
        bundle: &ValidatedBundle,
        push: &Push,
        staging: &Path,
        files: Vec<ManifestFile>,
        created_at: DateTime<Utc>,
    ) -> ApiResult<(PushOutcome, Option<Pointer>)> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        db::bundles::lock(&tx).await?;
        let version = free_version_id(&tx, bundle, push.received_at).await?;
        let manifest = version_manifest(bundle, &version, files, created_at);
        let manifest_json = serde_json::to_value(&manifest).map_err(ApiError::internal)?;
        let info = Arc::new(VersionInfo::new(&self.files.local_root(), created_at, manifest)?);

        if let Err(error) = self.files.publish(&version, staging, &push.upload).await {
            // Cleaning up would wait for the store as long again, past a 503's 10 s (docs/api.md
            // §18.1); files under an id without a row go at its next push or in the orphan sweep.
            // Otherwise `tx` still holds the bundle lock: no other push can have taken this id.
            if error.code != ErrorCode::ServiceUnavailable {
                if let Err(e) = self.files.unpublish(&version).await {
                    tracing::warn!(error = %e, %version, "cannot remove the files of a failed app bundle upload");
                }
            }
            return Err(error);
        }
        let (activated, warnings) = match insert_version(tx, bundle, &info, &manifest_json, push).await {
            Ok(stored) => stored,
            Err(error) => {
                remove_unrecorded(&self.pool, &self.files, &version).await;
                return Err(error);
            }
        };
        let active = activated.map(|_| version.as_str());
        self.files.committed(&info, staging, &push.upload, active).await;
        self.cache.insert(version.clone(), info.clone());
        tracing::info!(version = %version, activated = activated.is_some(), "app bundle stored");
        let pointer = activated.map(|generation| (generation, Some(info.clone())));
        Ok((PushOutcome { version: info, active: pointer.is_some(), warnings }, pointer))
    }

    /// Retention after an upload (docs/api.md §9.3). A failure is logged: the upload itself succeeded.
    async fn retain(&self, keep: usize, just_uploaded: &str, origin: &Origin) {
        let result = async {
            let mut client = self.pool.get().await?;
            let tx = client.transaction().await?;
            db::bundles::lock(&tx).await?;
            let victims = db::bundles::retention_victims(&tx, keep, just_uploaded).await?;
            db::bundles::mark_removed(&tx, &victims).await?;
            let details = serde_json::json!({"max_versions_kept": keep});
            let entries: Vec<_> = victims
                .iter()
                .map(|v| origin.entry(Action::BundleVersionRemoved, Some(v), details.clone()))
                .collect();
            db::audit::append_all(&tx, &entries).await?;
            tx.commit().await?;
            ApiResult::Ok(victims)
        }
        .await;
        match result {
            Ok(victims) => {
                for version in victims {
                    self.cache.remove(&version);
                    // A failure leaves files without a row, which the orphan sweep removes.
                    if let Err(error) = self.files.unpublish(&version).await {
                        tracing::warn!(%error, %version, "cannot remove a retained-out app bundle version");
                    }
                    tracing::info!(version = %version, "app bundle version removed by retention");
                }
            }
            Err(error) => tracing::error!(%error, "app bundle retention failed"),
        }
    }

    async fn switch(&self, version: &str, origin: &Origin) -> ApiResult<(SwitchOutcome, Option<Pointer>)> {
        let not_found = || ApiError::not_found(format!("App bundle version '{version}' not found"));
        let info = {
            let db = self.pool.get().await?;
            let row = db::bundles::find(&db, version).await?.ok_or_else(not_found)?;
            self.load(row)?
        };
        self.files.ensure(&info, None).await?;
        let forms = {
            let info = info.clone();
            tokio::task::spawn_blocking(move || VersionView::load(&info.manifest, &info.dir))
                .await
                .map_err(ApiError::internal)??
        };
        let forms: Vec<(String, Value, Value)> = forms
            .forms
            .into_iter()
            .filter(|(_, form)| form.schema.is_object() && form.ui.is_object())
            .map(|(name, form)| (name, form.schema, form.ui))
            .collect();

        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        db::bundles::lock(&tx).await?;
        // Retention may have removed it since the look-up above.
        if db::bundles::find(&tx, version).await?.is_none() {
            return Err(not_found());
        }
        let (previous, _) = db::bundles::active(&tx).await?;
        if previous.as_deref() == Some(version) {
            tx.commit().await?;
            let outcome =
                SwitchOutcome { version: version.to_owned(), previous_version: previous, warnings: vec![] };
            return Ok((outcome, None));
        }
        let goes_back = match &previous {
            Some(previous) => db::bundles::uploaded_before(&tx, version, previous).await?,
            None => false,
        };
        let details = serde_json::json!({"previous_version": previous});
        db::audit::append(&tx, &origin.entry(switch_action(goes_back), Some(version), details)).await?;
        let generation = db::bundles::set_active(&tx, version).await?;
        let warnings = db::formspecs::register_bundle_forms(&tx, version, &forms).await?;
        tx.commit().await?;
        tracing::info!(version, previous = previous.as_deref().unwrap_or(""), "app bundle switched");
        let outcome = SwitchOutcome { version: version.to_owned(), previous_version: previous, warnings };
        Ok((outcome, Some((generation, Some(info)))))
    }
}
