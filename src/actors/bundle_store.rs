//! `BundleStore` owns the active app bundle version (docs/api.md §9, docs/architecture.md
//! "App bundles").
//!
//! Uploads are validated, unpacked into a staging folder, then stored as `versions/<id>/` in
//! the bundles storage area (renamed there with the local backend) and recorded in one
//! transaction under the bundle lock, so a failed upload leaves nothing and uses no id. The active pointer lives in the database; this actor keeps
//! the active version in memory and learns about switches made by other processes through
//! LISTEN/NOTIFY, with a periodic re-read as the fallback. Every change carries the pointer's
//! generation, so updates applied out of order never move the pointer back.

mod cache;
mod files;
mod insert;
mod version;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use actix::WeakAddr;
use chrono::{DateTime, Utc};
use dashmap::DashMap;
use deadpool_postgres::Pool;
use serde_json::Value;

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

/// Resolves a target to one version; the caller then serves only from that version. With
/// `files`, the version's files are made readable on this node first.
struct Resolve {
    target: Target,
    files: bool,
}

impl Message for Resolve {
    type Result = ApiResult<Arc<VersionInfo>>;
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

impl Message for Push {
    type Result = ApiResult<PushOutcome>;
}

struct Switch {
    pub version: String,
    pub origin: Origin,
}

#[derive(Debug)]
pub struct SwitchOutcome {
    pub version: String,
    pub previous_version: Option<String>,
    pub warnings: Vec<KeptFormSpec>,
}

impl Message for Switch {
    type Result = ApiResult<SwitchOutcome>;
}

/// Re-read the active pointer (sent by the LISTEN task and the timer).
struct Refresh;

impl Message for Refresh {
    type Result = ();
}

/// The pointer state applied in memory: its generation and the version it names.
type Pointer = (i64, Option<Arc<VersionInfo>>);

/// The bundle store's front door: reads resolve a version, writes upload or switch.
#[derive(Clone)]
pub struct BundleStoreHandle(pub(super) Addr<BundleStore>);

impl BundleStoreHandle {
    /// Resolves a target to one version; the caller then serves only from that version.
    pub async fn resolve(&self, target: Target) -> ApiResult<Arc<VersionInfo>> {
        super::ask_traced(&self.0, "bundle store", Resolve { target, files: false }).await
    }

    /// Like [`Self::resolve`], for routes that read the version's files (`info.dir`, `info.zip_path`).
    pub async fn resolve_files(&self, target: Target) -> ApiResult<Arc<VersionInfo>> {
        super::ask_traced(&self.0, "bundle store", Resolve { target, files: true }).await
    }

    /// Validates and stores an upload already streamed to `push.upload`, activating it if asked.
    pub async fn push(&self, push: Push) -> ApiResult<PushOutcome> {
        super::ask_traced(&self.0, "bundle store", push).await
    }

    /// Makes `version` the active one.
    pub async fn activate(&self, version: String, origin: Origin) -> ApiResult<SwitchOutcome> {
        super::ask_traced(&self.0, "bundle store", Switch { version, origin }).await
    }

    /// Registers a form spec sent through the API. The store is the one writer of `form_specs`
    /// (activating a bundle registers its forms), so both kinds of registration take the bundle
    /// lock and cannot interleave, in this process or another.
    pub async fn register_form_spec(&self, spec: NewFormSpec, origin: Origin) -> ApiResult<Registration> {
        super::ask_traced(&self.0, "bundle store", RegisterFormSpec(spec, origin)).await
    }
}

/// A form spec as the API receives it (docs/api.md §11.1), already checked.
#[derive(Debug, Clone)]
pub struct NewFormSpec {
    pub form_type: String,
    pub version: String,
    pub schema: Value,
    pub uischema: Value,
}

struct RegisterFormSpec(NewFormSpec, Origin);

impl Message for RegisterFormSpec {
    type Result = ApiResult<Registration>;
}

super::traced!(BundleStore: Resolve, Push, Switch, RegisterFormSpec);

impl Handler<RegisterFormSpec> for BundleStore {
    type Result = ResponseFuture<ApiResult<Registration>>;

    fn handle(
        &mut self,
        RegisterFormSpec(spec, origin): RegisterFormSpec,
        _: &mut Context<Self>,
    ) -> Self::Result {
        let pool = self.pool.clone();
        Box::pin(async move {
            let mut client = pool.get().await?;
            let tx = client.transaction().await?;
            db::bundles::lock(&tx).await?;
            let registration = db::formspecs::register(
                &tx,
                &spec.form_type,
                &spec.version,
                &spec.schema,
                &spec.uischema,
                "api",
            )
            .await?;
            // Only a new spec changes anything; an identical one is a no-op, a conflict refused.
            if let Registration::Created(_) = &registration {
                let details = serde_json::json!({"version": spec.version});
                db::audit::append(
                    &tx,
                    &origin.entry(Action::FormSpecChanged, Some(&spec.form_type), details),
                )
                .await?;
            }
            tx.commit().await?;
            Ok(registration)
        })
    }
}

pub struct BundleStore {
    pool: Pool,
    conn: String,
    /// APP_BUNDLE_PATH: uploads and staging folders.
    root: PathBuf,
    files: BundleFiles,
    keep: usize,
    limits: Limits,
    generation: i64,
    active: Option<Arc<VersionInfo>>,
    cache: Arc<DashMap<String, Arc<VersionInfo>>>,
    /// Its background work (the LISTEN loop, sweeps, caching), stopped with the server.
    tasks: crate::shutdown::Tasks,
}

impl BundleStore {
    /// Loads the active version, then starts the actor. `conn` opens the LISTEN connection.
    pub async fn start(
        config: &crate::config::Config,
        pool: &Pool,
        conn: &str,
        storage: &crate::storage::Storage,
        tasks: &crate::shutdown::Tasks,
    ) -> anyhow::Result<Addr<Self>> {
        let root = config.app_bundle_path.clone();
        std::fs::create_dir_all(staging_dir(&root))?;
        remove_stale_staging(&staging_dir(&root));
        let files = BundleFiles::new(config, storage.bundles.clone())?;
        let cache = Arc::new(DashMap::new());
        let job = Job { pool: pool.clone(), root: root.clone(), files: files.clone(), cache: cache.clone() };
        let (generation, active) = read_pointer(&job, -1)
            .await
            .map_err(|e| anyhow::anyhow!("cannot read the active app bundle: {e}"))?
            .unwrap_or((0, None));
        let store = BundleStore {
            pool: pool.clone(),
            conn: conn.to_owned(),
            root,
            files,
            keep: config.max_versions_kept,
            limits: Limits::default(),
            generation,
            active,
            cache,
            tasks: tasks.clone(),
        };
        Ok(store.start())
    }

    fn apply(&mut self, (generation, active): Pointer) {
        if generation > self.generation {
            self.generation = generation;
            self.active = active;
            // Fetched now rather than by the first device asking, and kept through outages.
            if let Some(info) = self.active.clone() {
                let files = self.files.clone();
                self.tasks.spawn_local(async move {
                    if let Err(error) = files.ensure(&info, Some(&info.version)).await {
                        tracing::warn!(%error, version = %info.version, "cannot cache the active app bundle");
                    }
                });
            }
        }
    }

    fn refresh(&mut self, ctx: &mut Context<Self>) {
        let (job, known) = (self.job(), self.generation);
        let read = async move { read_pointer(&job, known).await };
        ctx.spawn(read.into_actor(self).map(|result, store, _| match result {
            Ok(Some(pointer)) => store.apply(pointer),
            Ok(None) => {}
            Err(error) => tracing::warn!(%error, "cannot re-read the active app bundle"),
        }));
    }

    fn job(&self) -> Job {
        Job {
            pool: self.pool.clone(),
            root: self.root.clone(),
            files: self.files.clone(),
            cache: self.cache.clone(),
        }
    }
}

impl Actor for BundleStore {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(REFRESH_INTERVAL, |store, ctx| store.refresh(ctx));
        self.tasks.spawn(listen_loop(self.conn.clone(), ctx.address().downgrade()));
        let sweep = |store: &mut Self| {
            let (files, pool) = (store.files.clone(), store.pool.clone());
            store.tasks.spawn(async move { files.sweep(&pool).await });
        };
        sweep(self);
        ctx.run_interval(Duration::from_secs(3600), move |store, _| sweep(store));
    }
}

/// Keeps a LISTEN connection open for the actor's lifetime, reconnecting after failures.
async fn listen_loop(conn: String, store: WeakAddr<BundleStore>) {
    loop {
        match db::bundles::listen_for_switches(&conn).await {
            Ok((client, mut notifications)) => {
                // Catch up with any switch made while nobody was listening.
                let Some(addr) = store.upgrade() else { return };
                addr.do_send(Refresh);
                while notifications.recv().await.is_some() {
                    let Some(addr) = store.upgrade() else { return };
                    addr.do_send(Refresh);
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

impl Handler<Refresh> for BundleStore {
    type Result = ();

    fn handle(&mut self, _: Refresh, ctx: &mut Context<Self>) {
        self.refresh(ctx);
    }
}

impl Handler<Resolve> for BundleStore {
    type Result = ResponseFuture<ApiResult<Arc<VersionInfo>>>;

    fn handle(&mut self, Resolve { target, files }: Resolve, _: &mut Context<Self>) -> Self::Result {
        let job = self.job();
        let active = self.active.clone();
        Box::pin(async move {
            let info = job.resolve(target, active.clone()).await?;
            if files {
                job.files.ensure(&info, active.as_ref().map(|a| a.version.as_str())).await?;
            }
            Ok(info)
        })
    }
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

impl Handler<Push> for BundleStore {
    type Result = ResponseActFuture<Self, ApiResult<PushOutcome>>;

    fn handle(&mut self, push: Push, _: &mut Context<Self>) -> Self::Result {
        let job = self.job();
        let (keep, limits) = (self.keep, self.limits.clone());
        let work = async move {
            let upload = push.upload.clone();
            let origin = push.origin.clone();
            let result = job.push(push, limits).await;
            // Only a failed push still owns its upload; a successful one moved it into place.
            if result.is_err() {
                let _ = tokio::fs::remove_file(&upload).await;
            }
            let (outcome, pointer) = result?;
            job.retain(keep, &outcome.version.version, &origin).await;
            ApiResult::Ok((outcome, pointer))
        };
        Box::pin(work.into_actor(self).map(|result, store, _| {
            let (outcome, pointer) = result?;
            if let Some(pointer) = pointer {
                store.apply(pointer);
            }
            Ok(outcome)
        }))
    }
}

impl Handler<Switch> for BundleStore {
    type Result = ResponseActFuture<Self, ApiResult<SwitchOutcome>>;

    fn handle(&mut self, Switch { version, origin }: Switch, _: &mut Context<Self>) -> Self::Result {
        let job = self.job();
        Box::pin(async move { job.switch(&version, &origin).await }.into_actor(self).map(
            |result, store, _| {
                let (outcome, pointer) = result?;
                if let Some(pointer) = pointer {
                    store.apply(pointer);
                }
                Ok(outcome)
            },
        ))
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

/// The work of one message, run off the actor so downloads keep resolving meanwhile.
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
