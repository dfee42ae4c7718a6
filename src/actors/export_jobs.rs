//! `ExportJobs`: the export registry (docs/api.md §13, §17.8). It owns which export jobs exist, who
//! owns each and when its file expires, and it admits streamed exports; the exports themselves run
//! in the engine (`crate::export`), which knows nothing of the registry.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use chrono::{DateTime, Utc};

use crate::auth::AuthUser;
use crate::clock::Clock;
use crate::domain::export::{ExportFormat, ExportRequest, JobState, JobStatus, JobView};
use crate::domain::role::Role;
use crate::error::{ApiError, ApiResult};
use crate::export::{Engine, EngineStop, JobProgress, PendingExport};

/// What a 429 tells the client to wait; exports take a while, so a short poll is pointless.
const RETRY_AFTER_SECS: u64 = 5;

/// Starts a streamed export, or 429 when every slot is taken.
#[derive(Message)]
#[rtype(result = "ApiResult<PendingExport>")]
struct StartExport(pub ExportRequest);

/// Queues an export job owned by the caller.
#[derive(Message)]
#[rtype(result = "ApiResult<JobView>")]
struct CreateJob {
    pub owner: String,
    pub request: ExportRequest,
}

/// A job's status, for its owner or an admin.
#[derive(Message)]
#[rtype(result = "ApiResult<JobView>")]
struct GetJob {
    pub id: String,
    pub caller: AuthUser,
}

/// A finished job's file, for its owner or an admin; 404 until it is done.
#[derive(Message)]
#[rtype(result = "ApiResult<JobFile>")]
struct JobDownload {
    pub id: String,
    pub caller: AuthUser,
}

pub struct JobFile {
    pub path: PathBuf,
    pub format: ExportFormat,
    pub change_id: i64,
}

struct Job {
    owner: String,
    format: ExportFormat,
    created_at: DateTime<Utc>,
    path: PathBuf,
    progress: Arc<JobProgress>,
}

/// The export registry's front door.
#[derive(Clone)]
pub struct ExportJobsHandle(pub(super) Addr<ExportJobs>);

impl ExportJobsHandle {
    /// Starts a streamed export, or 429 when every slot is taken.
    pub async fn start(&self, request: ExportRequest) -> ApiResult<PendingExport> {
        super::ask(&self.0, "export registry", StartExport(request)).await
    }

    /// Queues an export job owned by `owner`.
    pub async fn create_job(&self, owner: String, request: ExportRequest) -> ApiResult<JobView> {
        super::ask(&self.0, "export registry", CreateJob { owner, request }).await
    }

    /// A job's status, for its owner or an admin.
    pub async fn job(&self, id: String, caller: AuthUser) -> ApiResult<JobView> {
        super::ask(&self.0, "export registry", GetJob { id, caller }).await
    }

    /// A finished job's file, for its owner or an admin; 404 until it is done.
    pub async fn download(&self, id: String, caller: AuthUser) -> ApiResult<JobFile> {
        super::ask(&self.0, "export registry", JobDownload { id, caller }).await
    }
}

pub struct ExportJobs {
    engine: Arc<Engine>,
    ttl: Duration,
    jobs: HashMap<String, Job>,
    clock: Clock,
    _engine_stop: EngineStop,
}

impl ExportJobs {
    /// Starts the engine. `db_conn` is the same connection the main pool uses.
    pub fn new(config: &crate::config::Config, db_conn: &str, clock: Clock) -> anyhow::Result<Self> {
        let (engine, stop) = Engine::start(config, db_conn, clock.clone())?;
        Ok(Self { engine, ttl: config.export_job_ttl, jobs: HashMap::new(), clock, _engine_stop: stop })
    }

    fn expires_at(&self, status: &JobStatus) -> Option<DateTime<Utc>> {
        let ttl = chrono::Duration::from_std(self.ttl).ok()?;
        status.finished_at.map(|t| t + ttl)
    }

    fn view(&self, id: &str, job: &Job) -> JobView {
        let status = job.progress.snapshot();
        JobView {
            id: id.to_owned(),
            owner: job.owner.clone(),
            format: job.format,
            state: status.state.unwrap_or(JobState::Queued),
            rows_done: job.progress.rows_done(),
            rows_total: status.rows_total,
            change_id: status.change_id,
            created_at: job.created_at,
            started_at: status.started_at,
            finished_at: status.finished_at,
            expires_at: self.expires_at(&status),
            error: status.error.clone(),
        }
    }

    /// Forgets finished jobs past their TTL and removes their files.
    fn sweep(&mut self) {
        let now = self.clock.now();
        let expired: Vec<String> = self
            .jobs
            .iter()
            .filter(|(_, job)| self.expires_at(&job.progress.snapshot()).is_some_and(|t| t <= now))
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            if let Some(job) = self.jobs.remove(&id) {
                let _ = std::fs::remove_file(&job.path);
                let (exports, key) = (self.engine.exports().clone(), crate::export::job_key(&job.path));
                actix::spawn(async move {
                    let _ = exports.delete(&key).await;
                });
            }
        }
    }

    /// The job if it exists, is not expired, and the caller may see it. Another user's job is a
    /// 404 like an unknown one, so ids cannot be probed.
    fn visible_job(&self, id: &str, caller: &AuthUser) -> ApiResult<&Job> {
        match self.jobs.get(id) {
            Some(job) if job.owner == caller.username || caller.role.allows(Role::Admin) => Ok(job),
            _ => Err(ApiError::not_found(format!("Export job '{id}' not found"))),
        }
    }
}

impl Actor for ExportJobs {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let every = (self.ttl / 2).clamp(Duration::from_secs(1), Duration::from_secs(60));
        ctx.run_interval(every, |act, _| act.sweep());
    }
}

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
    type Result = ApiResult<JobView>;

    fn handle(&mut self, msg: CreateJob, _: &mut Self::Context) -> Self::Result {
        self.sweep();
        let id = uuid::Uuid::new_v4().simple().to_string();
        let path = self.engine.job_path(&id, msg.request.format);
        let progress = Arc::new(JobProgress::default());
        progress.update(|s| s.state = Some(JobState::Queued));
        let job = Job {
            owner: msg.owner,
            format: msg.request.format,
            created_at: self.clock.now(),
            path: path.clone(),
            progress: Arc::clone(&progress),
        };
        self.engine.spawn_job(id.clone(), msg.request, progress, path);
        let view = self.view(&id, &job);
        self.jobs.insert(id, job);
        Ok(view)
    }
}

impl Handler<GetJob> for ExportJobs {
    type Result = ApiResult<JobView>;

    fn handle(&mut self, msg: GetJob, _: &mut Self::Context) -> Self::Result {
        self.sweep();
        let job = self.visible_job(&msg.id, &msg.caller)?;
        let view = self.view(&msg.id, job);
        Ok(view)
    }
}

impl Handler<JobDownload> for ExportJobs {
    type Result = ApiResult<JobFile>;

    fn handle(&mut self, msg: JobDownload, _: &mut Self::Context) -> Self::Result {
        self.sweep();
        let job = self.visible_job(&msg.id, &msg.caller)?;
        let status = job.progress.snapshot();
        match (status.state, status.change_id) {
            (Some(JobState::Done), Some(change_id)) => {
                Ok(JobFile { path: job.path.clone(), format: job.format, change_id })
            }
            _ => Err(ApiError::not_found(format!("Export job '{}' has no file yet", msg.id))),
        }
    }
}
