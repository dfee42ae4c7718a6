//! `ExportJobs`: the export registry (docs/api.md §13, §17.8, §18.2). Jobs live in PostgreSQL
//! (`db::export_jobs`) and their files under DATA_ROOT/exports/, so every node answers for every
//! job: polls and downloads read the table straight from the handle. The actor owns what is this
//! node's alone: the jobs it runs (it reports their progress and renews their lease) and the
//! admission of streamed exports. The exports themselves run in the engine (`crate::export`),
//! which knows nothing of the registry.
//!
//! A node that dies stops renewing its jobs' leases; whichever node sweeps next marks them failed,
//! so no job stays `running` for ever (within `LEASE + SWEEP_EVERY`, well under a minute).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;

use crate::auth::AuthUser;
use crate::clock::Clock;
use crate::db::export_jobs::{self as sql, JobReport, NewJob, StoredJob};
use crate::db::DbResult;
use crate::domain::export::{ExportFormat, ExportRequest, JobState, JobView};
use crate::domain::role::Role;
use crate::error::{ApiError, ApiResult};
use crate::export::{Engine, EngineStop, JobProgress, PendingExport};

/// What a 429 tells the client to wait; exports take a while, so a short poll is pointless.
const RETRY_AFTER_SECS: u64 = 5;
/// How far ahead a job's lease reaches each time it is renewed.
const LEASE: Duration = Duration::from_secs(30);
/// How often a job's lease is renewed when nothing else about it changed.
const RENEW_EVERY: Duration = Duration::from_secs(10);
/// How often this node's jobs' progress is written (what other nodes show while one runs).
const REPORT_EVERY: Duration = Duration::from_secs(1);
/// How often jobs whose lease ran out are failed and expired jobs removed.
const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// Starts a streamed export, or 429 when every slot is taken.
#[derive(Message)]
#[rtype(result = "ApiResult<PendingExport>")]
struct StartExport(pub ExportRequest);

/// Queues an export job owned by the caller, run on this node.
#[derive(Message)]
#[rtype(result = "ApiResult<JobView>")]
struct CreateJob {
    pub owner: String,
    pub request: ExportRequest,
}

pub struct JobFile {
    pub path: PathBuf,
    pub format: ExportFormat,
    pub change_id: i64,
}

/// The export registry's front door.
#[derive(Clone)]
pub struct ExportJobsHandle {
    addr: Addr<ExportJobs>,
    pool: Pool,
    clock: Clock,
    files: PathBuf,
    /// Where finished files are stored (docs/storage.md): `files` itself by default.
    exports: crate::storage::Area,
}

impl ExportJobsHandle {
    /// Starts a streamed export, or 429 when every slot is taken.
    pub async fn start(&self, request: ExportRequest) -> ApiResult<PendingExport> {
        super::ask(&self.addr, "export registry", StartExport(request)).await
    }

    /// Queues an export job owned by `owner`.
    pub async fn create_job(&self, owner: String, request: ExportRequest) -> ApiResult<JobView> {
        super::ask(&self.addr, "export registry", CreateJob { owner, request }).await
    }

    /// A job's status, for its owner or an admin.
    pub async fn job(&self, id: String, caller: AuthUser) -> ApiResult<JobView> {
        Ok(self.visible_job(&id, &caller).await?.view)
    }

    /// A finished job's file, for its owner or an admin; 404 until it is done.
    pub async fn download(&self, id: String, caller: AuthUser) -> ApiResult<JobFile> {
        let job = self.visible_job(&id, &caller).await?;
        match (job.view.state, job.view.change_id) {
            (JobState::Done, Some(change_id)) => {
                Ok(JobFile { path: self.files.join(&job.file_name), format: job.view.format, change_id })
            }
            _ => Err(ApiError::not_found(format!("Export job '{id}' has no file yet"))),
        }
    }

    /// The job if it exists, is not expired, and the caller may see it. Another user's job is a
    /// 404 like an unknown one, so ids cannot be probed. Expired jobs are removed first, so a job
    /// is gone the moment its TTL has passed, whether or not a sweep ran since.
    async fn visible_job(&self, id: &str, caller: &AuthUser) -> ApiResult<StoredJob> {
        let db = self.pool.get().await?;
        remove_files(&self.exports, sql::delete_expired(&db, self.clock.now()).await?).await;
        match sql::find(&db, id).await? {
            Some(job) if job.view.owner == caller.username || caller.role.allows(Role::Admin) => Ok(job),
            _ => Err(ApiError::not_found(format!("Export job '{id}' not found"))),
        }
    }
}

fn expiry(finished_at: DateTime<Utc>, ttl: Duration) -> Option<DateTime<Utc>> {
    chrono::Duration::from_std(ttl).ok().map(|ttl| finished_at + ttl)
}

fn lease_from(now: DateTime<Utc>) -> DateTime<Utc> {
    now + chrono::Duration::from_std(LEASE).unwrap_or(chrono::Duration::seconds(30))
}

async fn remove_files(exports: &crate::storage::Area, names: Vec<String>) {
    for name in names {
        let _ = exports.delete(&name).await;
    }
}

/// One of this node's jobs, until its end has been written.
struct OwnJob {
    progress: Arc<JobProgress>,
    path: PathBuf,
    /// What was last written, and when (the lease went with it).
    reported: Option<(JobReport, Instant)>,
    /// The row is no longer ours (a sweep failed the job while this node could not renew its
    /// lease): nothing more is written, and the file goes once the export ends.
    lost: bool,
}

pub struct ExportJobs {
    engine: Arc<Engine>,
    pool: Pool,
    node: String,
    ttl: Duration,
    jobs: HashMap<String, OwnJob>,
    clock: Clock,
    /// A report or sweep is being written: the next tick skips rather than overlapping it.
    reporting: bool,
    sweeping: bool,
    _engine_stop: EngineStop,
    /// Removals of lost jobs' files, stopped with the server.
    tasks: crate::shutdown::Tasks,
}

impl ExportJobs {
    /// Starts the engine and the registry. `db_conn` is the same connection the main pool uses;
    /// `reads` is the request path's router, whose replicas exports read from too.
    pub fn start(
        config: &crate::config::Config,
        pool: &Pool,
        db_conn: &str,
        reads: &Arc<crate::db::replicas::ReadRouter>,
        clock: Clock,
        tasks: crate::shutdown::Tasks,
    ) -> anyhow::Result<ExportJobsHandle> {
        let (engine, stop) = Engine::start(config, db_conn, Arc::clone(reads), clock.clone())?;
        let files = engine.files_dir().to_path_buf();
        let exports = engine.exports().clone();
        let registry = ExportJobs {
            engine,
            pool: pool.clone(),
            node: config.node_id.clone(),
            ttl: config.export_job_ttl,
            jobs: HashMap::new(),
            clock: clock.clone(),
            reporting: false,
            sweeping: false,
            _engine_stop: stop,
            tasks,
        };
        Ok(ExportJobsHandle { addr: registry.start(), pool: pool.clone(), clock, files, exports })
    }

    /// The report a job's progress makes now, with its expiry once it has finished.
    fn report_of(&self, job: &OwnJob) -> JobReport {
        let status = job.progress.snapshot();
        let expires_at = status.finished_at.and_then(|t| expiry(t, self.ttl));
        JobReport {
            state: status.state.unwrap_or(JobState::Queued),
            rows_done: job.progress.rows_done(),
            rows_total: status.rows_total,
            change_id: status.change_id,
            started_at: status.started_at,
            finished_at: status.finished_at,
            expires_at,
            error: status.error,
        }
    }

    /// Writes what changed about this node's jobs, and every lease due for renewal.
    fn report(&mut self, ctx: &mut Context<Self>) {
        self.forget_lost_jobs();
        if self.reporting {
            return;
        }
        let due: Vec<(String, JobReport)> = self
            .jobs
            .iter()
            .filter(|(_, job)| !job.lost)
            .map(|(id, job)| (id.clone(), job, self.report_of(job)))
            .filter(|(_, job, report)| match &job.reported {
                None => true,
                Some((last, at)) => last != report || at.elapsed() >= RENEW_EVERY,
            })
            .map(|(id, _, report)| (id, report))
            .collect();
        if due.is_empty() {
            return;
        }
        self.reporting = true;
        let (pool, node, lease) = (self.pool.clone(), self.node.clone(), lease_from(self.clock.now()));
        let write = async move {
            let db = pool.get().await?;
            let mut written = Vec::with_capacity(due.len());
            for (id, report) in due {
                let kept = sql::report(&db, &id, &node, &report, lease).await?;
                written.push((id, report, kept));
            }
            DbResult::Ok(written)
        };
        ctx.spawn(write.into_actor(self).map(|result, registry, _| {
            registry.reporting = false;
            match result {
                Ok(written) => {
                    written.into_iter().for_each(|(id, report, kept)| registry.reported(id, report, kept))
                }
                Err(e) => tracing::warn!(error = %e, "writing export job progress failed; retrying"),
            }
        }));
    }

    fn reported(&mut self, id: String, report: JobReport, kept: bool) {
        let Some(job) = self.jobs.get_mut(&id) else { return };
        if !kept {
            tracing::warn!(job = %id, "export job was failed by another node (its lease ran out)");
            job.lost = true;
        } else if report.state.is_finished() {
            self.jobs.remove(&id);
        } else {
            job.reported = Some((report, Instant::now()));
        }
    }

    /// Lost jobs (see [`OwnJob::lost`]) that have ended: their files belong to no row.
    fn forget_lost_jobs(&mut self) {
        let ended: Vec<String> = self
            .jobs
            .iter()
            .filter(|(_, job)| job.lost && job.progress.snapshot().state.is_some_and(JobState::is_finished))
            .map(|(id, _)| id.clone())
            .collect();
        for id in ended {
            if let Some(job) = self.jobs.remove(&id) {
                let _ = std::fs::remove_file(&job.path);
                let (exports, key) = (self.engine.exports().clone(), crate::export::job_key(&job.path));
                self.tasks.spawn(async move {
                    let _ = exports.delete(&key).await;
                });
            }
        }
    }

    /// Fails jobs whose node stopped renewing their lease, and removes expired jobs with their
    /// files. Every node sweeps; the statements make a second sweep a no-op.
    fn sweep(&mut self, ctx: &mut Context<Self>) {
        if self.sweeping {
            return;
        }
        self.sweeping = true;
        let (pool, files, now) = (self.pool.clone(), self.engine.exports().clone(), self.clock.now());
        let expires_at = expiry(now, self.ttl).unwrap_or(now);
        let sweep = async move {
            let db = pool.get().await?;
            for (job, node) in sql::fail_abandoned(&db, now, expires_at).await? {
                tracing::warn!(job = %job, job_node = %node, "export job failed: its node stopped renewing it");
            }
            remove_files(&files, sql::delete_expired(&db, now).await?).await;
            DbResult::Ok(())
        };
        ctx.spawn(sweep.into_actor(self).map(|result, registry, _| {
            registry.sweeping = false;
            if let Err(e) = result {
                tracing::warn!(error = %e, "export job sweep failed");
            }
        }));
    }
}

impl Actor for ExportJobs {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(REPORT_EVERY, |registry, ctx| registry.report(ctx));
        ctx.run_interval(SWEEP_EVERY, |registry, ctx| registry.sweep(ctx));
    }
}

super::traced!(ExportJobs: StartExport, CreateJob);

impl Handler<StartExport> for ExportJobs {
    type Result = ApiResult<PendingExport>;

    fn handle(&mut self, StartExport(request): StartExport, _: &mut Self::Context) -> Self::Result {
        self.engine.try_stream(request).ok_or_else(|| {
            crate::monitoring::rate_limited("export");
            ApiError::rate_limited(RETRY_AFTER_SECS)
        })
    }
}

impl Handler<CreateJob> for ExportJobs {
    type Result = ResponseActFuture<Self, ApiResult<JobView>>;

    /// The row first (queued, leased to this node), then the engine: a job runs only once every
    /// node can see it.
    fn handle(&mut self, msg: CreateJob, _: &mut Self::Context) -> Self::Result {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let request = msg.request;
        let path = self.engine.job_path(&id, request.format);
        let now = self.clock.now();
        let filter = &request.filter;
        let job = NewJob {
            id: id.clone(),
            owner: msg.owner,
            format: request.format,
            filters: serde_json::json!({
                "form_types": filter.form_types,
                "since_change_id": filter.since_change_id,
                "include_deleted": filter.include_deleted,
            }),
            node: self.node.clone(),
            lease_expires_at: lease_from(now),
            file_name: path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
            created_at: now,
        };
        let view = JobView {
            id: id.clone(),
            owner: job.owner.clone(),
            format: request.format,
            state: JobState::Queued,
            rows_done: 0,
            rows_total: None,
            change_id: None,
            created_at: now,
            started_at: None,
            finished_at: None,
            expires_at: None,
            error: None,
        };
        let pool = self.pool.clone();
        let insert = async move {
            let db = pool.get().await?;
            sql::insert(&db, &job).await
        };
        Box::pin(insert.into_actor(self).map(move |inserted, registry, _| {
            inserted?;
            let progress = Arc::new(JobProgress::default());
            progress.update(|s| s.state = Some(JobState::Queued));
            registry.engine.spawn_job(id.clone(), request, Arc::clone(&progress), path.clone());
            registry.jobs.insert(id, OwnJob { progress, path, reported: None, lost: false });
            Ok(view)
        }))
    }
}
