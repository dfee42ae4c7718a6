//! The export engine (docs/api.md §13, §17.8; docs/architecture.md, "exports").
//!
//! Exports run on the blocking threads of a dedicated Tokio runtime, each with its own connection
//! from a small pool of its own, so sync traffic never waits for them. The encoders of
//! `domain::export` are plain `std::io::Write`rs; a streamed export reaches the HTTP response
//! through a bounded channel (a `Write` that `blocking_send`s chunks, and a body stream that
//! receives them), so a slow client slows the export down instead of growing memory, and a client
//! that goes away ends it: the next send fails, the thread unwinds and its transaction rolls back.
//!
//! Why a module of its own: the engine does I/O (database cursors, threads, files, channels), so it
//! is not `domain/`, and it owns no state that needs a mailbox, so it is not an actor. The
//! `ExportJobs` actor (`actors/export_jobs.rs`) is the registry: which jobs exist, who owns them,
//! when they expire, all kept in PostgreSQL so that any node answers for any job. The engine knows
//! nothing of it: it takes a slot, runs one export, and reports a job's progress through
//! [`JobProgress`], which the registry copies into the job's row.
//!
//! A slot (`EXPORT_MAX_CONCURRENT`) is taken per export. A streamed export that finds none is
//! refused (the registry answers 429); a job waits for one. A streamed export keeps its slot until
//! its response body is gone, so the slot count is what clients actually hold open.

mod engine;
mod reader;
mod sink;

pub use engine::{job_key, Engine, EngineStop, JobProgress};
pub use sink::{ExportBody, PendingExport};
