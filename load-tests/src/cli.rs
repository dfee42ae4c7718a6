//! Command line: common flags plus one subcommand per scenario.

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::Serialize;
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "synkronus-load",
    version,
    about = "Load-test and device-fleet simulator for Synkronus-compatible sync servers"
)]
pub struct Cli {
    #[command(flatten)]
    pub common: Common,
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Debug, Clone, Args, Serialize)]
pub struct Common {
    /// Server base URL (may include a path prefix such as /api).
    #[arg(long, global = true, default_value = "http://127.0.0.1:8080")]
    pub base_url: String,
    /// Username to log in with (needs read-write; admin for bundle scenarios).
    #[arg(long, global = true, default_value = "admin")]
    pub username: String,
    /// Password to log in with.
    #[arg(long, global = true, default_value = "admin")]
    #[serde(skip)]
    pub password: String,
    /// Directory for `<scenario>-<timestamp>.json` and `.md` reports.
    #[arg(long, global = true, default_value = "load-results")]
    pub out: PathBuf,
    /// Allow non-loopback base URLs and database hosts.
    #[arg(long, global = true)]
    pub allow_remote: bool,
    /// Length of the timed phase in seconds (each scenario has its own default).
    #[arg(long, global = true, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub duration: Option<u64>,
    /// Upper bound on the number of requests of the main phase.
    #[arg(long, global = true, value_parser = clap::value_parser!(u64).range(1..))]
    pub requests: Option<u64>,
    /// Per-request timeout in seconds (exports use --export-timeout instead).
    #[arg(long, global = true, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub request_timeout: u64,
    /// Hard limit on the whole run in seconds; the report is still written, marked incomplete.
    #[arg(long, global = true, default_value_t = 3600, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub max_time: u64,
    /// Hide the progress bar.
    #[arg(long, global = true)]
    pub no_progress: bool,
}

#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Many devices push fresh record batches as fast as they can.
    PushStorm(PushStormArgs),
    /// One device pulls N records from cursor 0 until has_more is false.
    InitialSync(InitialSyncArgs),
    /// A mixed fleet: pulls, pushes, attachment and bundle traffic.
    Fleet(FleetArgs),
    /// Devices download the bundle while an admin switches versions.
    BundleSwitch(BundleSwitchArgs),
    /// An export runs while devices push; compares push p99 with and without it.
    ExportUnderLoad(ExportArgs),
    /// Concurrent attachment uploads and large-file downloads.
    Attachments(AttachmentArgs),
    /// Raw batch INSERT of push-like rows straight into PostgreSQL: the physical ceiling.
    DbCeiling(DbCeilingArgs),
    /// Loads N records fast (large batches, several connections) for the other scenarios.
    Seed(SeedArgs),
    /// Latency of the statistics the portal overview loads, optionally after seeding rows by SQL.
    Stats(StatsArgs),
}

impl Cmd {
    pub fn name(&self) -> &'static str {
        match self {
            Cmd::PushStorm(_) => "push-storm",
            Cmd::InitialSync(_) => "initial-sync",
            Cmd::Fleet(_) => "fleet",
            Cmd::BundleSwitch(_) => "bundle-switch",
            Cmd::ExportUnderLoad(_) => "export-under-load",
            Cmd::Attachments(_) => "attachments",
            Cmd::DbCeiling(_) => "db-ceiling",
            Cmd::Seed(_) => "seed",
            Cmd::Stats(_) => "stats",
        }
    }

    /// The scenario's knobs, for the report.
    pub fn params(&self) -> serde_json::Value {
        let v = match self {
            Cmd::PushStorm(a) => serde_json::to_value(a),
            Cmd::InitialSync(a) => serde_json::to_value(a),
            Cmd::Fleet(a) => serde_json::to_value(a),
            Cmd::BundleSwitch(a) => serde_json::to_value(a),
            Cmd::ExportUnderLoad(a) => serde_json::to_value(a),
            Cmd::Attachments(a) => serde_json::to_value(a),
            Cmd::DbCeiling(a) => serde_json::to_value(a),
            Cmd::Seed(a) => serde_json::to_value(a),
            Cmd::Stats(a) => serde_json::to_value(a),
        };
        v.unwrap_or(serde_json::Value::Null)
    }

    /// Connections the HTTP pool should keep per host.
    pub fn concurrency(&self) -> usize {
        let n = match self {
            Cmd::PushStorm(a) => a.devices,
            Cmd::InitialSync(a) => a.seed_concurrency,
            Cmd::Fleet(a) => a.devices,
            Cmd::BundleSwitch(a) => a.devices + 1,
            Cmd::ExportUnderLoad(a) => a.devices.max(a.seed_concurrency) + 1,
            Cmd::Attachments(a) => a.uploads.max(a.download_concurrency),
            Cmd::DbCeiling(a) => a.concurrency,
            Cmd::Seed(a) => a.concurrency,
            Cmd::Stats(_) => 1,
        };
        n as usize
    }
}

#[derive(Debug, Clone, Args, Serialize)]
pub struct RecordShape {
    /// Approximate size of each record's `data` JSON in bytes.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(16..=1_048_576))]
    pub payload_bytes: u64,
}

#[derive(Debug, Clone, Args, Serialize)]
pub struct PushStormArgs {
    /// Concurrent devices, each pushing in a loop.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub devices: u64,
    /// Records per push.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub batch: u64,
    #[command(flatten)]
    #[serde(flatten)]
    pub shape: RecordShape,
    /// Skip the final pull that checks every acknowledged record is present.
    #[arg(long)]
    pub no_verify: bool,
}

#[derive(Debug, Clone, Args, Serialize)]
pub struct InitialSyncArgs {
    /// Records the device must receive.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..=50_000_000))]
    pub records: u64,
    /// Seed the records first under a fresh form type, then pull only that type.
    #[arg(long)]
    pub seed: bool,
    /// Form type to filter the pull by (default: all types, or the seeded one with --seed).
    #[arg(long)]
    pub form_type: Option<String>,
    /// Page size (`limit`, max 500 per the contract).
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=500))]
    pub limit: u32,
    /// Records per push when seeding.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub seed_batch: u64,
    /// Concurrent pushers when seeding.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=256))]
    pub seed_concurrency: u64,
    /// Read each page's bytes without parsing its records (the server-side rate): the cursor
    /// fields are found in the bytes, records counted by their `observation_id` key.
    #[arg(long)]
    pub raw: bool,
    /// Send `Accept-Encoding: gzip` (as Android's HTTP stack does) and inflate the answers;
    /// reports bytes per record on the wire and as JSON.
    #[arg(long)]
    pub gzip: bool,
    #[command(flatten)]
    #[serde(flatten)]
    pub shape: RecordShape,
}

#[derive(Debug, Clone, Args, Serialize)]
pub struct FleetArgs {
    /// Concurrent devices.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub devices: u64,
    /// Records per push.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub batch: u64,
    #[command(flatten)]
    #[serde(flatten)]
    pub shape: RecordShape,
    /// Relative weight of incremental pulls.
    #[arg(long, default_value_t = 40)]
    pub pull_weight: u32,
    /// Relative weight of pushes.
    #[arg(long, default_value_t = 40)]
    pub push_weight: u32,
    /// Relative weight of attachment upload + manifest + download.
    #[arg(long, default_value_t = 10)]
    pub attachment_weight: u32,
    /// Relative weight of bundle manifest (If-None-Match) + file downloads.
    #[arg(long, default_value_t = 10)]
    pub bundle_weight: u32,
    /// Size of each uploaded attachment.
    #[arg(long, default_value_t = 262_144, value_parser = clap::value_parser!(u64).range(0..=67_108_864))]
    pub attachment_bytes: u64,
    /// Pause between a device's operations, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub think_ms: u64,
}

#[derive(Debug, Clone, Args, Serialize)]
pub struct BundleSwitchArgs {
    /// Concurrent downloading devices.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub devices: u64,
    /// Size of the incompressible asset in each bundle.
    #[arg(long, default_value_t = 3_000_000, value_parser = clap::value_parser!(u64).range(0..=50_000_000))]
    pub asset_bytes: u64,
    /// Distinct bundle versions to build, upload and switch between.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(2..=4))]
    pub versions: u64,
    /// Number of admin switches.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub switches: u64,
    /// Pause between switches in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub switch_interval_ms: u64,
    /// Form folders per bundle.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(0..=50))]
    pub forms: u32,
    /// Every device downloads with ?version= (default: odd devices download unpinned and are
    /// checked against their x-bundle-version header).
    #[arg(long)]
    pub pinned_only: bool,
    /// Seconds of conditional manifest requests (If-None-Match) after the switches, to measure
    /// ETag-hit throughput; 0 skips the phase.
    #[arg(long, default_value_t = 10)]
    pub etag_secs: u64,
}

#[derive(Debug, Clone, ValueEnum, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ExportFormat {
    Parquet,
    Json,
    Csv,
}

impl ExportFormat {
    pub fn as_str(&self) -> &'static str {
        match self {
            ExportFormat::Parquet => "parquet",
            ExportFormat::Json => "json",
            ExportFormat::Csv => "csv",
        }
    }
}

#[derive(Debug, Clone, Args, Serialize)]
pub struct ExportArgs {
    /// Records to seed before the run (0: export whatever the server holds).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=50_000_000))]
    pub seed_records: u64,
    /// Concurrent pushers when seeding.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=256))]
    pub seed_concurrency: u64,
    /// Devices pushing during both phases.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub devices: u64,
    /// Records per push.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub batch: u64,
    #[command(flatten)]
    #[serde(flatten)]
    pub shape: RecordShape,
    /// Seconds of push storm without an export (the baseline).
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub baseline_secs: u64,
    /// Export format (json counts rows exactly; parquet/csv report /status's count).
    #[arg(long, value_enum, default_value_t = ExportFormat::Parquet)]
    pub format: ExportFormat,
    /// Timeout of the export request in seconds.
    #[arg(long, default_value_t = 1800, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub export_timeout: u64,
}

#[derive(Debug, Clone, Args, Serialize)]
pub struct AttachmentArgs {
    /// Concurrent uploads, one distinct file each.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub uploads: u64,
    /// Size of each concurrent upload.
    #[arg(long, default_value_t = 1_048_576, value_parser = clap::value_parser!(u64).range(0..=67_108_864))]
    pub upload_bytes: u64,
    /// Size of the large file downloaded repeatedly.
    #[arg(long, default_value_t = 10_485_760, value_parser = clap::value_parser!(u64).range(1..=67_108_864))]
    pub large_bytes: u64,
    /// Number of large-file downloads.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub downloads: u64,
    /// Concurrent large-file downloads.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub download_concurrency: u64,
}

#[derive(Debug, Clone, Args, Serialize)]
pub struct DbCeilingArgs {
    /// PostgreSQL connection: libpq key=value text, a postgres:// URL, or host=<socket dir>.
    #[arg(long)]
    #[serde(skip)]
    pub db: String,
    /// Rows to insert.
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1..=50_000_000))]
    pub records: u64,
    /// Rows per INSERT (compare with push-storm's --batch).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub batch: u64,
    /// Concurrent connections (compare with push-storm's --devices; mind max_connections).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub concurrency: u64,
    #[command(flatten)]
    #[serde(flatten)]
    pub shape: RecordShape,
    /// Keep the scratch table instead of dropping it.
    #[arg(long)]
    pub keep_table: bool,
}

#[derive(Debug, Clone, Args, Serialize)]
pub struct SeedArgs {
    /// Records to load.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=50_000_000))]
    pub records: u64,
    /// Records per push.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub batch: u64,
    /// Concurrent pushers.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=256))]
    pub concurrency: u64,
    #[command(flatten)]
    #[serde(flatten)]
    pub shape: RecordShape,
    /// Form type of the seeded records.
    #[arg(long, default_value = "load_seed")]
    pub form_type: String,
}

#[derive(Debug, Clone, Args, Serialize)]
pub struct StatsArgs {
    /// The server's database, to seed rows and to check the answer against a full count.
    #[arg(long)]
    #[serde(skip)]
    pub db: Option<String>,
    /// Rows to write straight into `records` first (needs --db).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=100_000_000))]
    pub seed_rows: u64,
    /// Form types the seeded rows spread over.
    #[arg(long, default_value_t = 12, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub seed_form_types: u64,
}
