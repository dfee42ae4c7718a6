//! The engine: its runtime, pool and slots, one export's run inside its snapshot, and the two ways
//! an export ends (a streamed response body, or a job's file).

use std::collections::HashSet;
use std::fs::File;
use std::future::Future;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::reader::Reader;
use super::sink::{ChannelWriter, Chunk, ExportBody, PendingExport, Sink, CHANNEL_CHUNKS};
use crate::clock::Clock;
use crate::db::replicas::{ReadRouter, Target};
use crate::domain::export::{
    entry_name_for_form_type, observation_json, raw_json_entry_name, write_ndjson_line, ColumnInference,
    CsvFormWriter, DataColumn, ExportError, ExportFormat, ExportRequest, ExportRow, ExportZip, JobState,
    JobStatus, ParquetFormWriter,
};
use crate::error::{ApiError, ApiResult};

/// A job's progress: written by its thread, read by the registry.
#[derive(Default)]
pub struct JobProgress {
    status: Mutex<JobStatus>,
    rows_done: AtomicU64,
}

impl JobProgress {
    pub fn update(&self, f: impl FnOnce(&mut JobStatus)) {
        // A panic elsewhere cannot leave a status half-written: every update is one assignment.
        let mut status = self.status.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut status);
    }

    pub fn snapshot(&self) -> JobStatus {
        self.status.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn rows_done(&self) -> u64 {
        self.rows_done.load(Ordering::Relaxed)
    }
}

/// What the export threads share: the runtime they block on, their pool and the slots.
pub struct Engine {
    runtime: Handle,
    /// The exports' own connections to the primary (one per slot).
    pool: deadpool_postgres::Pool,
    /// The request path's router: snapshots are taken on a replica when one is configured and
    /// current (docs/api.md §18.3), else on `pool`.
    reads: Arc<ReadRouter>,
    slots: Arc<Semaphore>,
    /// Where jobs write (`DATA_ROOT/exports`); finished files are stored in `exports` under
    /// their file name, which is this folder itself with the default storage.
    dir: PathBuf,
    exports: crate::storage::Area,
    /// Jobs' start and finish times (their files expire a TTL after the finish).
    clock: Clock,
}

/// Dropping this stops the export runtime's thread.
pub struct EngineStop {
    _stop: oneshot::Sender<()>,
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

/// Removes job files past the TTL that no expiry removed with their row: the file of a job whose
/// node died before recording it, the `.part` of a job whose node died while writing it. Files
/// of other nodes sharing the data root stay until then.
fn remove_stale_files(dir: &Path, ttl: Duration) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let old = entry.metadata().and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok());
        if old.is_some_and(|age| age > ttl) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Job files of an earlier run kept in an object store, past their TTL.
async fn remove_stale_stored(area: crate::storage::Area, ttl: Duration) {
    let Ok(entries) = area.list("").await else { return };
    for entry in entries {
        if entry.modified.elapsed().is_ok_and(|age| age > ttl) {
            let _ = area.delete(&entry.key).await;
        }
    }
}

impl Engine {
    /// Where finished job files are stored (docs/storage.md).
    pub fn exports(&self) -> &crate::storage::Area {
        &self.exports
    }

    /// Builds the export runtime and pool. `db_conn` is the same connection the main pool uses.
    pub fn start(
        config: &crate::config::Config,
        db_conn: &str,
        reads: Arc<ReadRouter>,
        clock: Clock,
    ) -> anyhow::Result<(Arc<Engine>, EngineStop)> {
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
        let exports = crate::storage::Storage::open(&config.storage())?.exports;
        if !exports.is_local() {
            handle.spawn(remove_stale_stored(exports.clone(), config.export_job_ttl));
        }
        let pool = crate::db::create_pool(db_conn, slots)?;
        let slots = Arc::new(Semaphore::new(slots));
        let engine = Engine { runtime: handle, pool, reads, slots, dir, exports, clock };
        Ok((Arc::new(engine), EngineStop { _stop: stop_tx }))
    }

    /// The folder of job files: DATA_ROOT/exports/, shared by the nodes of a cluster.
    pub fn files_dir(&self) -> &Path {
        &self.dir
    }

    /// Where job `id`'s file lives once it is done.
    pub fn job_path(&self, id: &str, format: ExportFormat) -> PathBuf {
        self.dir.join(format!("{id}.{}", format.extension()))
    }

    /// Starts a streamed export in a free slot, or `None` when every slot is taken.
    pub fn try_stream(self: &Arc<Self>, request: ExportRequest) -> Option<PendingExport> {
        let slot = Arc::new(Arc::clone(&self.slots).try_acquire_owned().ok()?);
        let (tx, rx) = mpsc::channel(CHANNEL_CHUNKS);
        let (head_tx, head_rx) = oneshot::channel();
        let engine = Arc::clone(self);
        let thread_slot = Arc::clone(&slot);
        // A child of the request's span: the export thread's log lines and queries are the request's.
        let span =
            tracing::info_span!("export", otel.name = "export stream", format = request.format.as_str());
        self.runtime.spawn_blocking(move || {
            let _entered = span.enter();
            let _running = crate::monitoring::export_running();
            engine.stream(&request, &tx, head_tx);
            // The slot goes before the channel closes: a client that has seen the end of the
            // body can start its next export at once.
            drop(thread_slot);
            drop(tx);
        });
        Some(PendingExport { head: head_rx, body: ExportBody { rx, slot: Some(slot) } })
    }

    /// Queues a job for a slot (the semaphore is fair); its thread writes `path` and reports
    /// through `progress`.
    pub fn spawn_job(
        self: &Arc<Self>,
        id: String,
        request: ExportRequest,
        progress: Arc<JobProgress>,
        path: PathBuf,
    ) {
        let engine = Arc::clone(self);
        let span = tracing::info_span!("export", otel.name = "export job", job = %id,
            format = request.format.as_str());
        self.runtime.spawn(async move {
            let Ok(slot) = Arc::clone(&engine.slots).acquire_owned().await else { return };
            let runner = Arc::clone(&engine);
            let done = tokio::task::spawn_blocking(move || {
                let _entered = span.enter();
                let _slot = slot;
                let _running = crate::monitoring::export_running();
                runner.run_job(&id, &request, &progress, &path);
            })
            .await;
            if let Err(e) = done {
                tracing::error!(error = %e, "export job thread failed");
            }
        });
    }

    pub(super) fn block<F: Future>(&self, f: F) -> F::Output {
        self.runtime.block_on(f)
    }

    pub(super) fn runtime(&self) -> &Handle {
        &self.runtime
    }

    /// A streamed export, on an export thread: snapshot, head to the handler, then the body.
    fn stream(
        &self,
        request: &ExportRequest,
        tx: &mpsc::Sender<Chunk>,
        head_tx: oneshot::Sender<ApiResult<(i64, Target)>>,
    ) {
        let (client, by) = match self.block(self.reads.export_connection(
            &request.requested_by,
            request.filter.since_change_id,
            &self.pool,
        )) {
            Ok(c) => c,
            Err(e) => {
                let _ = head_tx.send(Err(e.into()));
                return;
            }
        };
        let reader = match Reader::start(self, client, &request.filter) {
            Ok(reader) => reader,
            Err(e) => {
                let _ = head_tx.send(Err(e.into()));
                return;
            }
        };
        if head_tx.send(Ok((reader.snapshot().head, by))).is_err() {
            reader.close();
            return;
        }
        let aborted = Arc::new(AtomicBool::new(false));
        let run = Run { reader: &reader, aborted: &aborted, progress: None };
        let sink = Sink { out: ChannelWriter::new(tx.clone()), aborted: aborted.clone() };
        let result = run.write(request.format, sink).and_then(|mut sink| Ok(sink.out.send()?));
        reader.close();
        if let Err(e) = result {
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
            s.started_at = Some(self.clock.now());
        });
        let part = path.with_extension("part");
        let result = self
            .write_job(request, progress, &part)
            .and_then(|()| Ok(std::fs::rename(&part, path)?))
            .and_then(|()| self.store_job_file(path));
        match result {
            Ok(()) => progress.update(|s| {
                s.state = Some(JobState::Done);
                s.finished_at = Some(self.clock.now());
            }),
            Err(e) => {
                let _ = std::fs::remove_file(&part);
                tracing::error!(job = id, error = %e, "export job failed");
                progress.update(|s| {
                    s.state = Some(JobState::Failed);
                    s.finished_at = Some(self.clock.now());
                    s.error = Some("The export failed; see the server log".into());
                });
            }
        }
    }

    /// Moves a finished file into the exports area when that is not the folder it was written in.
    fn store_job_file(&self, path: &Path) -> Result<(), RunError> {
        let key = job_key(path);
        if self.exports.local_path(&key).as_deref() == Some(path) {
            return Ok(());
        }
        let stored = self.block(self.exports.put_file(&key, path));
        let _ = std::fs::remove_file(path);
        stored.map_err(|e| RunError::from(std::io::Error::other(e)))
    }

    fn write_job(
        &self,
        request: &ExportRequest,
        progress: &JobProgress,
        part: &Path,
    ) -> Result<(), RunError> {
        let (client, by) = self.block(self.reads.export_connection(
            &request.requested_by,
            request.filter.since_change_id,
            &self.pool,
        ))?;
        let mut result = self.write_job_with(client, request, progress, part);
        if matches!(result, Err(RunError::Db(_))) && by == Target::Replica {
            // A replica failing mid-job: the job runs again on the primary, from the start.
            tracing::warn!("export job failed on a read replica; running it again on the primary");
            progress.rows_done.store(0, Ordering::Relaxed);
            let client = self.block(self.pool.get())?;
            result = self.write_job_with(client, request, progress, part);
        }
        result
    }

    fn write_job_with(
        &self,
        client: deadpool_postgres::Object,
        request: &ExportRequest,
        progress: &JobProgress,
        part: &Path,
    ) -> Result<(), RunError> {
        let reader = Reader::start(self, client, &request.filter)?;
        let result = self.write_job_file(&reader, request.format, progress, part);
        reader.close();
        result
    }

    fn write_job_file(
        &self,
        reader: &Reader,
        format: ExportFormat,
        progress: &JobProgress,
        part: &Path,
    ) -> Result<(), RunError> {
        let total = reader.count()?;
        progress.update(|s| {
            s.change_id = Some(reader.snapshot().head);
            s.rows_total = u64::try_from(total).ok();
        });
        let aborted = Arc::new(AtomicBool::new(false));
        let sink = Sink { out: BufWriter::new(File::create(part)?), aborted: aborted.clone() };
        let run = Run { reader, aborted: &aborted, progress: Some(progress) };
        let sink = run.write(format, sink)?;
        let file = sink.out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        Ok(())
    }
}

/// Why an export stopped early.
#[derive(Debug, thiserror::Error)]
pub(super) enum RunError {
    #[error("database: {0}")]
    Db(#[from] tokio_postgres::Error),
    #[error("database pool: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    #[error("database: {0}")]
    Connect(#[from] crate::db::DbError),
    #[error(transparent)]
    Export(#[from] ExportError),
    #[error("I/O: {0}")]
    Io(#[from] io::Error),
    #[error("the export's database task stopped")]
    ReaderGone,
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

/// One export inside its snapshot.
struct Run<'a, 'e> {
    reader: &'a Reader<'e>,
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
        let mut zip = ExportZip::new(out).with_modified_time(self.reader.snapshot().taken_at);
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
                    serde_json::to_writer(&mut *zip, &observation_json(row)?)?;
                }
                Ok(())
            });
        }
        let form_types = self.reader.form_types()?;
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
        let mut inference = ColumnInference::new();
        self.reader.data(form_type, |batch| {
            batch.iter().for_each(|data| inference.observe_json_text(data));
            Ok(())
        })?;
        Ok(inference.finish())
    }

    fn for_each_batch(
        &self,
        form_type: Option<&str>,
        mut f: impl FnMut(&[ExportRow]) -> Result<(), RunError>,
    ) -> Result<(), RunError> {
        self.reader.rows(form_type, |rows| {
            if !rows.is_empty() {
                f(&rows)?;
            }
            if let Some(progress) = self.progress {
                progress.rows_done.fetch_add(rows.len() as u64, Ordering::Relaxed);
            }
            Ok(())
        })
    }
}

/// A job file's key in the exports area: its file name.
pub fn job_key(path: &Path) -> String {
    path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default()
}
