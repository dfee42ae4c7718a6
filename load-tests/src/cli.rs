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
    /// Seeds to each size in turn (100k, 1M, 10M) and measures every path at each: how cost grows.
    Scale(ScaleArgs),
    /// Realistic devices on a timer, added in steps until a p99 or an error limit is passed.
    Capacity(CapacityArgs),
    /// What a scope set costs: a 1 % user's initial sync and empty pull against unscoped ones,
    /// push rate with the set in force, and preparing it over a large repository under pushes.
    ScopeCost(ScopeCostArgs),
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
            Cmd::Scale(_) => "scale",
            Cmd::Capacity(_) => "capacity",
            Cmd::ScopeCost(_) => "scope-cost",
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
            Cmd::Scale(a) => serde_json::to_value(a),
            Cmd::Capacity(a) => serde_json::to_value(a),
            Cmd::ScopeCost(a) => serde_json::to_value(a),
        };
        v.unwrap_or(serde_json::Value::Null)
    }

    /// Connections the HTTP pool should keep per host.
    pub fn concurrency(&self) -> usize {
        let n = match self {
            Cmd::PushStorm(a) => a.devices,
            Cmd::InitialSync(a) => a.seeding.seed_concurrency,
            Cmd::Fleet(a) => a.devices,
            Cmd::BundleSwitch(a) => a.devices + 1,
            Cmd::ExportUnderLoad(a) => a.devices.max(a.seed_concurrency) + 1,
            Cmd::Attachments(a) => a.uploads.max(a.download_concurrency),
            Cmd::DbCeiling(a) => a.concurrency,
            Cmd::Seed(a) => a.concurrency,
            Cmd::Stats(_) => 1,
            Cmd::Scale(a) => a.push_devices.max(a.seeding.seed_concurrency),
            // Devices spend almost all their time asleep: the pool only needs the requests in
            // flight at once (more are opened on demand, and closed when idle).
            Cmd::Capacity(_) => 256,
            Cmd::ScopeCost(a) => a.push_devices.max(a.seeding.seed_concurrency),
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

/// How a scenario seeds its records: large pushes from several connections.
#[derive(Debug, Clone, Args, Serialize)]
pub struct Seeding {
    /// Records per push when seeding.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub seed_batch: u64,
    /// Concurrent pushers when seeding.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=256))]
    pub seed_concurrency: u64,
    #[command(flatten)]
    #[serde(flatten)]
    pub shape: RecordShape,
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
    pub seeding: Seeding,
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
    /// Server process ids whose resident memory is sampled throughout (summed; repeatable):
    /// the before, per-phase peak and after figures show whether files are buffered whole.
    #[arg(long = "rss-pid")]
    pub rss_pids: Vec<u32>,
    /// Talk to an S3-compatible object store directly instead of a server: --base-url is
    /// `http://host:port/BUCKET`, uploads are unsigned `PUT` with `If-None-Match: *`, downloads
    /// `GET` (no login, no manifest checks). The same phases and concurrency, so the store's own
    /// cost can be told apart from the server's.
    #[arg(long)]
    pub direct: bool,
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
    /// Form type of the seeded records (the prefix of the names with --form-types above 1).
    #[arg(long, default_value = "load_seed")]
    pub form_type: String,
    /// Form types the records spread over, batch by batch: `<form-type>_00`, `_01`, ...
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub form_types: u64,
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

#[derive(Debug, Clone, Args, Serialize)]
pub struct ScaleArgs {
    /// Repository sizes to seed up to and measure at, in order (records already stored count).
    #[arg(long, value_delimiter = ',', default_value = "100000,1000000,10000000",
          value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub sizes: Vec<u64>,
    /// Form types the seeded records spread over (`scale_form_00`, ...); the typed pull asks for one.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(2..=1000))]
    pub form_types: u64,
    #[command(flatten)]
    #[serde(flatten)]
    pub seeding: Seeding,
    /// Sequential requests of each latency probe (pull pages, statistics, bundle manifest).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub probe_requests: u64,
    /// Records of each initial-sync window: from cursor 0, and the last ones up to the head.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub sync_window: u64,
    /// Devices of the push storm at each size (its records count towards the next size).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub push_devices: u64,
    /// Records per push of the storm.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub push_batch: u64,
    /// Seconds of push storm at each size.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub push_secs: u64,
    /// Skip the whole-repository export at each size.
    #[arg(long)]
    pub no_export: bool,
    /// Format of the export at each size.
    #[arg(long, value_enum, default_value_t = ExportFormat::Parquet)]
    pub export_format: ExportFormat,
    /// Timeout of each export in seconds.
    #[arg(long, default_value_t = 1800, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub export_timeout: u64,
    /// The server's process id (same machine): its resident memory is sampled during the export.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// The server's database (libpq text or URL): table and index bytes per record.
    #[arg(long)]
    #[serde(skip)]
    pub db: Option<String>,
}

#[derive(Debug, Clone, Args, Serialize)]
pub struct CapacityArgs {
    /// Devices in the first step.
    #[arg(long, default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub start_devices: u64,
    /// Devices added at each further step.
    #[arg(long, default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub step_devices: u64,
    /// Length of each step in seconds (its first --warmup-secs are not measured).
    #[arg(long, default_value_t = 150, value_parser = clap::value_parser!(u64).range(2..=86_400))]
    pub step_secs: u64,
    /// Unmeasured start of each step while the new devices join (default: one --period-secs).
    #[arg(long)]
    pub warmup_secs: Option<u64>,
    /// No step goes beyond this many devices.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_devices: u64,
    /// Mean seconds between a device's pushes.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3_600))]
    pub period_secs: u64,
    /// Each wait is the period times a uniform factor in [1 - j, 1 + j], j = this / 100.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(0..=100))]
    pub jitter_pct: u64,
    /// Fewest records in a push.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub batch_min: u64,
    /// Most records in a push.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub batch_max: u64,
    #[command(flatten)]
    #[serde(flatten)]
    pub shape: RecordShape,
    /// Every this many pushes a device uploads a photo (0: never).
    #[arg(long, default_value_t = 10)]
    pub photo_every: u64,
    /// Size of each photo.
    #[arg(long, default_value_t = 204_800, value_parser = clap::value_parser!(u64).range(0..=67_108_864))]
    pub photo_bytes: u64,
    /// Photos come from this many distinct ones (0: every photo is new). The server still
    /// receives, hashes and fsyncs each upload, but stores each distinct photo once, so a long
    /// run does not fill a small disk.
    #[arg(long, default_value_t = 0)]
    pub photo_variants: u64,
    /// Seconds between a device's bundle manifest checks (conditional, If-None-Match).
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub manifest_secs: u64,
    /// After each pull, a device asks for the attachments it lacks since its last answer
    /// (`POST /attachments/manifest`), as Formulus does at every sync. The operations are
    /// counted, not downloaded.
    #[arg(long)]
    pub attachment_manifest: bool,
    /// Devices per team: a team shares one form type and each device pulls that type, so a
    /// device receives its team's records (a whole fleet pulling everything grows as N²).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub team_size: u64,
    /// Devices send no `schema_types`: every device receives every record (as Formulus does),
    /// so the pull volume grows as N².
    #[arg(long, conflicts_with = "scoped")]
    pub pull_all: bool,
    /// District-scoped devices: a scope set gives each district's user the district's
    /// households and visits and a shared form type; devices send no `schema_types`, sync from
    /// cursor 0 and check that they receive their district's records and nothing of another
    /// district's. Replaces any scope set on the server.
    #[arg(long)]
    pub scoped: bool,
    /// With --scoped: fewest devices in a district.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub district_min: u64,
    /// With --scoped: most devices in a district (sizes are drawn uniformly).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub district_max: u64,
    /// With --scoped: records of the shared form type the admin pushes first (every device must
    /// receive them all).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub shared_records: u64,
    /// With --scoped: how long to wait for the scope set to be prepared.
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub scope_timeout_secs: u64,
    /// Users the devices are spread over (created by the admin of --username); each user logs
    /// in once and its token is shared by its devices.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=1_000))]
    pub users: u64,
    /// A step fails when the p99 of any request kind is above this.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..))]
    pub p99_limit_ms: u64,
    /// A step fails when it has more failed requests than this.
    #[arg(long, default_value_t = 0)]
    pub max_errors: u64,
    /// The server's process id, for its CPU and memory per step.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// The postmaster's process id, for PostgreSQL's CPU per step (the postmaster and its
    /// backends).
    #[arg(long)]
    pub pg_pid: Option<u32>,
}

#[derive(Debug, Clone, Args, Serialize)]
pub struct ScopeCostArgs {
    /// Size of the large repository the scoped figures are measured at (records it already
    /// holds count; the rest are seeded).
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub records: u64,
    /// Size of the unscoped repository whose initial sync is the yardstick (measured on the
    /// way up, before the rest is seeded).
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub baseline_records: u64,
    /// Districts the seeded households spread over; the scoped user sees one of them.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub districts: u64,
    /// Rules of the scope set put in force (the district rule, a shared type, then others).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(2..=100))]
    pub rules: u64,
    /// Timed initial syncs of each kind (the median is the figure).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub sync_runs: u64,
    /// Sequential empty incremental pulls of each kind.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub probe_requests: u64,
    /// Devices of each push storm.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub push_devices: u64,
    /// Records per push of the storms.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub push_batch: u64,
    /// Seconds of each measured push storm.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub push_secs: u64,
    /// Seconds of the unmeasured storm before each measured one (0: none).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub push_warmup_secs: u64,
    /// Longest wait for a scope set to be prepared.
    #[arg(long, default_value_t = 3600, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub prepare_timeout_secs: u64,
    #[command(flatten)]
    #[serde(flatten)]
    pub seeding: Seeding,
}
