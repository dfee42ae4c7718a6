//! `ExportJobs`: owns every running export (API.md 13, 17.8).
//!
//! Exports run on the blocking threads of a dedicated Tokio runtime, each with its own connection
//! from a small pool of its own, so sync traffic never waits for them. The encoders are plain
//! `std::io::Write`rs; a streamed export reaches the HTTP response through a bounded channel (a
//! `Write` that `blocking_send`s chunks, and a body stream that receives them), so a slow client
//! slows the export down instead of growing memory, and a client that goes away ends it: the next
//! send fails, the thread unwinds and its transaction rolls back.
//!
//! A slot (`EXPORT_MAX_CONCURRENT`) is taken per export. A streamed export that finds none gets
//! 429; a job waits for one. A streamed export keeps its slot until its response body is gone,
//! so the slot count is what clients actually hold open.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::future::Future;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use actix::prelude::*;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio_postgres::IsolationLevel;

use crate::auth::AuthUser;
use crate::db::export::{self as sql, ExportFilter};
use crate::domain::export::{
    entry_name_for_form_type, observation_json, raw_json_entry_name, write_ndjson_line, ColumnInference,
    CsvFormWriter, DataColumn, ExportError, ExportRow, ExportZip, ParquetFormWriter,
};
use crate::domain::role::Role;
use crate::error::{ApiError, ApiResult};

/// Rows fetched from the server-side portal per round trip.
const FETCH_ROWS: i32 = 1000;
/// Bytes gathered before a chunk goes into the body channel.
const CHUNK_BYTES: usize = 64 * 1024;
/// Chunks in flight between the export thread and the response: with `CHUNK_BYTES` this bounds
/// what a slow client can make the server hold.
const CHANNEL_CHUNKS: usize = 8;
/// What a 429 tells the client to wait; exports take a while, so a short poll is pointless.
const RETRY_AFTER_SECS: u64 = 5;

/// What an export produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportFormat {
    Parquet,
    Csv,
    Json,
    /// One JSON file per non-deleted observation in a ZIP (API.md 17.8).
    RawJson,
}

impl ExportFormat {
    /// The `format` values of `GET /data/export` and export jobs.
    pub fn parse(raw: &str) -> Option<Self> {
        match raw.trim().to_ascii_lowercase().as_str() {
            "parquet" => Some(Self::Parquet),
            "csv" => Some(Self::Csv),
            "json" | "ndjson" => Some(Self::Json),
            "raw-json" => Some(Self::RawJson),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Parquet => "parquet",
            Self::Csv => "csv",
            Self::Json => "json",
            Self::RawJson => "raw-json",
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Self::Json => "application/x-ndjson",
            _ => "application/zip",
        }
    }

    pub fn filename(self) -> &'static str {
        match self {
            Self::Parquet => "observations_export.zip",
            Self::Csv => "observations_export_csv.zip",
            Self::Json => "observations_export.ndjson",
            Self::RawJson => "observations_raw_json.zip",
        }
    }

    fn extension(self) -> &'static str {
        match self {
            Self::Json => "ndjson",
            _ => "zip",
        }
    }
}

/// One export: its format and which records it covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportRequest {
    pub format: ExportFormat,
    pub filter: ExportFilter,
}

type Chunk = Result<Bytes, io::Error>;

/// The response body of a streamed export. It holds the export's slot: the slot is free again
/// once the body is fully sent or dropped (client gone) and the export thread has ended.
pub struct ExportBody {
    rx: mpsc::Receiver<Chunk>,
    slot: Option<Arc<OwnedSemaphorePermit>>,
}

impl futures_util::Stream for ExportBody {
    type Item = Chunk;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Chunk>> {
        let next = self.rx.poll_recv(cx);
        if let Poll::Ready(None) = next {
            // Released before the client can see the end of the body (see `StartExport`).
            self.slot = None;
        }
        next
    }
}

/// A streamed export that has started: `head` resolves once its snapshot is taken (or it failed
/// to start), before any row is read.
pub struct PendingExport {
    pub head: oneshot::Receiver<ApiResult<i64>>,
    pub body: ExportBody,
}

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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    Queued,
    Running,
    Done,
    Failed,
}

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Done => "done",
            Self::Failed => "failed",
        }
    }
}

/// What a job looks like from outside.
#[derive(Debug, Clone)]
pub struct JobView {
    pub id: String,
    pub owner: String,
    pub format: ExportFormat,
    pub state: JobState,
    pub rows_done: u64,
    pub rows_total: Option<u64>,
    /// The snapshot head, once the job has taken its snapshot.
    pub change_id: Option<i64>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub expires_at: Option<DateTime<Utc>>,
    pub error: Option<String>,
}

pub struct JobFile {
    pub path: PathBuf,
    pub format: ExportFormat,
    pub change_id: i64,
}

#[derive(Debug, Clone, Default)]
struct JobStatus {
    state: Option<JobState>,
    rows_total: Option<u64>,
    change_id: Option<i64>,
    started_at: Option<DateTime<Utc>>,
    finished_at: Option<DateTime<Utc>>,
    error: Option<String>,
}

/// Written by the job's thread, read by the actor.
#[derive(Default)]
struct JobProgress {
    status: Mutex<JobStatus>,
    rows_done: AtomicU64,
}

impl JobProgress {
    fn update(&self, f: impl FnOnce(&mut JobStatus)) {
        // A panic elsewhere cannot leave a status half-written: every update is one assignment.
        let mut status = self.status.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut status);
    }

    fn snapshot(&self) -> JobStatus {
        self.status.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

struct Job {
    owner: String,
    format: ExportFormat,
    created_at: DateTime<Utc>,
    path: PathBuf,
    progress: Arc<JobProgress>,
}

/// What the export threads share: the runtime they block on, their pool and the slots.
struct Engine {
    runtime: Handle,
    pool: deadpool_postgres::Pool,
    slots: Arc<Semaphore>,
    dir: PathBuf,
}

/// Export threads run at a lower scheduling priority (nice about 10): on a busy machine the
/// kernel gives the cores to request handling first, so a long export takes longer instead of
/// slowing sync down. Lowering one's own priority needs no privilege; a refusal is only logged.
fn run_in_background() {
    use thread_priority::{set_current_thread_priority, ThreadPriority, ThreadPriorityValue};
    let lowered = ThreadPriorityValue::try_from(25u8).map_err(|e| e.to_string()).and_then(|p| {
        set_current_thread_priority(ThreadPriority::Crossplatform(p)).map_err(|e| format!("{e:?}"))
    });
    if let Err(e) = lowered {
        tracing::debug!(error = %e, "could not lower the export thread's priority");
    }
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
    /// Dropping this stops the export runtime's thread.
    _runtime_stop: oneshot::Sender<()>,
}

impl ExportJobs {
    /// Builds the export runtime and pool. `db_conn` is the same connection the main pool uses.
    pub fn new(config: &crate::config::Config, db_conn: &str) -> anyhow::Result<Self> {
        let slots = config.export_max_concurrent;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(slots + 2)
            .thread_name("export")
            .on_thread_start(run_in_background)
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        std::thread::Builder::new().name("export-runtime".into()).spawn(move || {
            runtime.block_on(async {
                let _ = stop_rx.await;
            });
            runtime.shutdown_timeout(Duration::from_secs(5));
        })?;
        let dir = config.data_root.join("exports");
        std::fs::create_dir_all(&dir)?;
        remove_stale_files(&dir, config.export_job_ttl);
        let engine = Engine {
            runtime: handle,
            pool: crate::db::create_pool(db_conn, slots)?,
            slots: Arc::new(Semaphore::new(slots)),
            dir,
        };
        Ok(Self {
            engine: Arc::new(engine),
            ttl: config.export_job_ttl,
            jobs: HashMap::new(),
            _runtime_stop: stop_tx,
        })
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
            rows_done: job.progress.rows_done.load(Ordering::Relaxed),
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
        let now = Utc::now();
        let expired: Vec<String> = self
            .jobs
            .iter()
            .filter(|(_, job)| self.expires_at(&job.progress.snapshot()).is_some_and(|t| t <= now))
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            if let Some(job) = self.jobs.remove(&id) {
                let _ = std::fs::remove_file(&job.path);
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
        let slot = Arc::clone(&self.engine.slots).try_acquire_owned().map_err(|_| {
            crate::monitoring::rate_limited("export");
            ApiError::rate_limited(RETRY_AFTER_SECS)
        })?;
        let slot = Arc::new(slot);
        let (tx, rx) = mpsc::channel(CHANNEL_CHUNKS);
        let (head_tx, head_rx) = oneshot::channel();
        let engine = Arc::clone(&self.engine);
        let thread_slot = Arc::clone(&slot);
        self.engine.runtime.spawn_blocking(move || {
            let _running = crate::monitoring::export_running();
            engine.stream(&request, &tx, head_tx);
            // The slot goes before the channel closes: a client that has seen the end of the
            // body can start its next export at once.
            drop(thread_slot);
            drop(tx);
        });
        Ok(PendingExport { head: head_rx, body: ExportBody { rx, slot: Some(slot) } })
    }
}

impl Handler<CreateJob> for ExportJobs {
    type Result = ApiResult<JobView>;

    fn handle(&mut self, msg: CreateJob, _: &mut Self::Context) -> Self::Result {
        self.sweep();
        let id = uuid::Uuid::new_v4().simple().to_string();
        let path = self.engine.dir.join(format!("{id}.{}", msg.request.format.extension()));
        let progress = Arc::new(JobProgress::default());
        progress.update(|s| s.state = Some(JobState::Queued));
        let job = Job {
            owner: msg.owner,
            format: msg.request.format,
            created_at: Utc::now(),
            path: path.clone(),
            progress: Arc::clone(&progress),
        };
        let engine = Arc::clone(&self.engine);
        let request = msg.request;
        let job_id = id.clone();
        self.engine.runtime.spawn(async move {
            // Jobs queue for a slot instead of being refused; the semaphore is fair.
            let Ok(slot) = Arc::clone(&engine.slots).acquire_owned().await else { return };
            let runner = Arc::clone(&engine);
            let done = tokio::task::spawn_blocking(move || {
                let _slot = slot;
                let _running = crate::monitoring::export_running();
                runner.run_job(&job_id, &request, &progress, &path);
            })
            .await;
            if let Err(e) = done {
                tracing::error!(error = %e, "export job thread failed");
            }
        });
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

/// Removes job files left by an earlier run once they are past the TTL (their jobs are gone
/// with that process; files of other processes sharing the data root stay until then).
fn remove_stale_files(dir: &Path, ttl: Duration) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let old = entry.metadata().and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok());
        if old.is_some_and(|age| age > ttl) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Why an export stopped early.
#[derive(Debug, thiserror::Error)]
enum RunError {
    #[error("database: {0}")]
    Db(#[from] tokio_postgres::Error),
    #[error("database pool: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    #[error(transparent)]
    Export(#[from] ExportError),
    #[error("I/O: {0}")]
    Io(#[from] io::Error),
}

impl From<serde_json::Error> for RunError {
    fn from(e: serde_json::Error) -> Self {
        Self::Export(ExportError::Json(e))
    }
}

impl From<RunError> for ApiError {
    fn from(e: RunError) -> Self {
        match e {
            RunError::Db(e) => e.into(),
            RunError::Pool(e) => e.into(),
            other => ApiError::internal(other),
        }
    }
}

/// The export's output. Once `aborted` is set, writes are swallowed: a `ZipWriter` dropped on an
/// error path writes its central directory, and that must never reach the client as a tidy end.
struct Sink<W> {
    out: W,
    aborted: Arc<AtomicBool>,
}

impl<W: Write> Write for Sink<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.aborted.load(Ordering::Relaxed) {
            return Ok(buf.len());
        }
        self.out.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.aborted.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.out.flush()
    }
}

/// Bytes into the response body channel, in chunks of about `CHUNK_BYTES`. Blocks while the
/// channel is full (the client is slower than the export) and fails once the body is gone.
struct ChannelWriter {
    tx: mpsc::Sender<Chunk>,
    buf: Vec<u8>,
}

impl ChannelWriter {
    fn send(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK_BYTES)));
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the client went away"))
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(buf);
        if self.buf.len() >= CHUNK_BYTES {
            self.send()?;
        }
        Ok(buf.len())
    }

    // Chunks go out when full or at the end; the encoders' intermediate flushes would only
    // make them smaller.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Engine {
    fn block<F: Future>(&self, f: F) -> F::Output {
        self.runtime.block_on(f)
    }

    /// A streamed export, on an export thread: snapshot, head to the handler, then the body.
    fn stream(
        &self,
        request: &ExportRequest,
        tx: &mpsc::Sender<Chunk>,
        head_tx: oneshot::Sender<ApiResult<i64>>,
    ) {
        let mut client = match self.block(self.pool.get()) {
            Ok(c) => c,
            Err(e) => {
                let _ = head_tx.send(Err(e.into()));
                return;
            }
        };
        let db = match self.block(
            client
                .build_transaction()
                .isolation_level(IsolationLevel::RepeatableRead)
                .read_only(true)
                .start(),
        ) {
            Ok(db) => db,
            Err(e) => {
                let _ = head_tx.send(Err(e.into()));
                return;
            }
        };
        let (head, taken_at) = match self.block(sql::snapshot_head(&db)) {
            Ok(h) => h,
            Err(e) => {
                let _ = head_tx.send(Err(e.into()));
                return;
            }
        };
        if head_tx.send(Ok(head)).is_err() {
            return;
        }
        let aborted = Arc::new(AtomicBool::new(false));
        let run = Run {
            engine: self,
            db: &db,
            filter: &request.filter,
            head,
            taken_at,
            aborted: &aborted,
            progress: None,
        };
        let sink = Sink {
            out: ChannelWriter { tx: tx.clone(), buf: Vec::with_capacity(CHUNK_BYTES) },
            aborted: aborted.clone(),
        };
        let result = run.write(request.format, sink).and_then(|mut sink| Ok(sink.out.send()?));
        // Without a commit the read-only transaction rolls back as it drops.
        drop(db);
        if let Err(e) = result {
            if matches!(e, RunError::Db(_)) {
                // Possibly a dead connection: never hand it to the next export.
                drop(deadpool_postgres::Object::take(client));
            }
            aborted.store(true, Ordering::Relaxed);
            if tx.is_closed() {
                tracing::info!(format = request.format.as_str(), "export stopped: the client disconnected");
            } else {
                tracing::error!(format = request.format.as_str(), error = %e, "export failed mid-stream");

                // An error item makes actix abort the connection: the client sees a truncated body.
                let _ = tx.blocking_send(Err(io::Error::other("export failed")));
            }
        }
    }

    /// An export job, on an export thread: the whole export into a file, then renamed into place.
    fn run_job(&self, id: &str, request: &ExportRequest, progress: &JobProgress, path: &Path) {
        progress.update(|s| {
            s.state = Some(JobState::Running);
            s.started_at = Some(Utc::now());
        });
        let part = path.with_extension("part");
        let result =
            self.write_job(request, progress, &part).and_then(|()| Ok(std::fs::rename(&part, path)?));
        match result {
            Ok(()) => progress.update(|s| {
                s.state = Some(JobState::Done);
                s.finished_at = Some(Utc::now());
            }),
            Err(e) => {
                let _ = std::fs::remove_file(&part);
                tracing::error!(job = id, error = %e, "export job failed");
                progress.update(|s| {
                    s.state = Some(JobState::Failed);
                    s.finished_at = Some(Utc::now());
                    s.error = Some("The export failed; see the server log".into());
                });
            }
        }
    }

    fn write_job(
        &self,
        request: &ExportRequest,
        progress: &JobProgress,
        part: &Path,
    ) -> Result<(), RunError> {
        let mut client = self.block(self.pool.get())?;
        let result = self.write_job_with(&mut client, request, progress, part);
        if matches!(result, Err(RunError::Db(_))) {
            // Possibly a dead connection: never hand it to the next export.
            drop(deadpool_postgres::Object::take(client));
        }
        result
    }

    fn write_job_with(
        &self,
        client: &mut deadpool_postgres::Object,
        request: &ExportRequest,
        progress: &JobProgress,
        part: &Path,
    ) -> Result<(), RunError> {
        let db = self.block(
            client
                .build_transaction()
                .isolation_level(IsolationLevel::RepeatableRead)
                .read_only(true)
                .start(),
        )?;
        let (head, taken_at) = self.block(sql::snapshot_head(&db))?;
        let total = self.block(sql::count(&db, &request.filter, head))?;
        progress.update(|s| {
            s.change_id = Some(head);
            s.rows_total = u64::try_from(total).ok();
        });
        let aborted = Arc::new(AtomicBool::new(false));
        let sink = Sink { out: BufWriter::new(File::create(part)?), aborted: aborted.clone() };
        let run = Run {
            engine: self,
            db: &db,
            filter: &request.filter,
            head,
            taken_at,
            aborted: &aborted,
            progress: Some(progress),
        };
        let sink = run.write(request.format, sink)?;
        let file = sink.out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        Ok(())
    }
}

/// One export inside its snapshot.
struct Run<'a, 't> {
    engine: &'a Engine,
    db: &'a tokio_postgres::Transaction<'t>,
    filter: &'a ExportFilter,
    head: i64,
    taken_at: DateTime<Utc>,
    aborted: &'a AtomicBool,
    progress: Option<&'a JobProgress>,
}

impl Run<'_, '_> {
    fn write<W: Write + Send>(&self, format: ExportFormat, mut out: W) -> Result<W, RunError> {
        if format == ExportFormat::Json {
            self.for_each_batch(None, |rows| {
                rows.iter().try_for_each(|row| write_ndjson_line(&mut out, row))?;
                Ok(())
            })?;
            return Ok(out);
        }
        let mut zip = ExportZip::new(out).with_modified_time(self.taken_at);
        match self.zip_entries(format, &mut zip) {
            Ok(()) => Ok(zip.finish()?),
            Err(e) => {
                // Before the drop, which would otherwise write a central directory.
                self.aborted.store(true, Ordering::Relaxed);
                drop(zip);
                Err(e)
            }
        }
    }

    fn zip_entries<W: Write + Send>(
        &self,
        format: ExportFormat,
        zip: &mut ExportZip<W>,
    ) -> Result<(), RunError> {
        let mut used = HashSet::new();
        if format == ExportFormat::RawJson {
            return self.for_each_batch(None, |rows| {
                for row in rows {
                    zip.start_json_entry(&raw_json_entry_name(
                        &row.form_type,
                        &row.observation_id,
                        &mut used,
                    ))?;
                    serde_json::to_writer(&mut *zip, &observation_json(row))?;
                }
                Ok(())
            });
        }
        let form_types = self.engine.block(sql::form_types(self.db, self.filter, self.head))?;
        for form_type in &form_types {
            // Pass 1 settles the column set; pass 2 writes against it, in the same snapshot.
            let columns = self.infer(form_type)?;
            let stem = entry_name_for_form_type(form_type, &mut used);
            if format == ExportFormat::Parquet {
                zip.start_parquet_entry(&format!("{stem}.parquet"))?;
                let mut writer = ParquetFormWriter::new(&mut *zip, &columns)?;
                self.for_each_batch(Some(form_type), |rows| Ok(writer.write_batch(rows)?))?;
                writer.finish()?;
            } else {
                zip.start_csv_entry(&format!("{stem}.csv"))?;
                let mut writer = CsvFormWriter::new(&mut *zip, &columns)?;
                self.for_each_batch(Some(form_type), |rows| Ok(writer.write_batch(rows)?))?;
                writer.finish()?;
            }
        }
        Ok(())
    }

    fn infer(&self, form_type: &str) -> Result<Vec<DataColumn>, RunError> {
        let db = self.db;
        let portal = self.engine.block(sql::open_rows(db, self.filter, self.head, Some(form_type), true))?;
        let mut inference = ColumnInference::new();
        loop {
            let batch = self.engine.block(sql::fetch_data(db, &portal, FETCH_ROWS))?;
            batch.iter().for_each(|data| inference.observe_json_text(data));
            if batch.len() < FETCH_ROWS as usize {
                return Ok(inference.finish());
            }
        }
    }

    fn for_each_batch(
        &self,
        form_type: Option<&str>,
        mut f: impl FnMut(&[ExportRow]) -> Result<(), RunError>,
    ) -> Result<(), RunError> {
        let db = self.db;
        let portal = self.engine.block(sql::open_rows(db, self.filter, self.head, form_type, false))?;
        loop {
            let rows = self.engine.block(sql::fetch_rows(db, &portal, FETCH_ROWS))?;
            if !rows.is_empty() {
                f(&rows)?;
            }
            if let Some(progress) = self.progress {
                progress.rows_done.fetch_add(rows.len() as u64, Ordering::Relaxed);
            }
            if rows.len() < FETCH_ROWS as usize {
                return Ok(());
            }
        }
    }
}
