//! What an export is asked for and what an export job looks like from outside (docs/api.md §13,
//! §17.8): plain types shared by the handlers, the registry actor and the engine.

use chrono::{DateTime, Utc};

/// What an export produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportFormat {
    Parquet,
    Csv,
    Json,
    /// One JSON file per non-deleted observation in a ZIP (docs/api.md §17.8).
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

    /// The extension of a job's file.
    pub fn extension(self) -> &'static str {
        match self {
            Self::Json => "ndjson",
            _ => "zip",
        }
    }
}

/// Which records an export covers (docs/api.md §13.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportFilter {
    /// Empty means every form type.
    pub form_types: Vec<String>,
    /// Only records whose latest change_id is greater.
    pub since_change_id: i64,
    pub include_deleted: bool,
    /// Whose visible set the export is limited to (docs/api.md §20.4); `None` for admins, who see
    /// every record.
    pub viewer: Option<String>,
}

/// One export: its format, which records it covers, and who asked (it reflects their own
/// writes, docs/api.md §18.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportRequest {
    pub format: ExportFormat,
    pub filter: ExportFilter,
    pub requested_by: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    Queued,
    Running,
    Done,
    Failed,
}

impl JobState {
    pub fn parse(raw: &str) -> Option<Self> {
        [Self::Queued, Self::Running, Self::Done, Self::Failed].into_iter().find(|s| s.as_str() == raw)
    }

    /// Done or failed: nothing about the job changes any more.
    pub fn is_finished(self) -> bool {
        matches!(self, Self::Done | Self::Failed)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Done => "done",
            Self::Failed => "failed",
        }
    }
}

/// What an export job reports as it runs (written by its thread, read by the registry).
#[derive(Debug, Clone, Default)]
pub struct JobStatus {
    pub state: Option<JobState>,
    pub rows_total: Option<u64>,
    /// The snapshot head, once the job has taken its snapshot.
    pub change_id: Option<i64>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub error: Option<String>,
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
