//! Configuration from the environment (docs/api.md §2), parsed and validated once at start.
//!
//! Every variable is one row of [`VARIABLES`]: its name, its default, its meaning and its parser.
//! Defaults are parsed like values, so a default cannot disagree with the rules; the README's
//! configuration table is rendered from the same rows, and a test keeps the two equal.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;
use secrecy::{ExposeSecret, SecretSlice, SecretString};

pub mod jwt_secret;
mod storage;
mod table;
pub mod test_only;

pub use storage::{AwsSettings, StorageConfig, StorageUrl};
pub use table::{render_markdown_table, Variable, VARIABLES};

/// A configuration problem: the message names the variable, so start-up can print one clear line.
#[derive(Debug, thiserror::Error)]
#[error("{var}: {reason}")]
pub struct ConfigError {
    pub var: &'static str,
    pub reason: String,
}

fn invalid(var: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError { var, reason: reason.into() }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordValidation {
    Off,
    Warn,
    Reject,
}

/// Where the database lives: an external server, or a private cluster the server runs itself.
#[derive(Debug, Clone)]
pub enum DatabaseConfig {
    /// `DB_CONNECTION`: a secret, as it may hold a password.
    External(SecretString),
    Embedded {
        pg_run_as: String,
        pg_bin_dir: Option<PathBuf>,
    },
}

/// Every secret is a `secrecy` type, so this `Debug` shows none of them.
#[derive(Debug, Clone)]
pub struct Config {
    pub port: u16,
    pub bind_address: IpAddr,
    /// This node's name (`NODE_ID`): logs, metrics, `/health`, the export jobs it runs.
    pub node_id: String,
    pub database: DatabaseConfig,
    pub db_pool_size: usize,
    /// Hot-standby replicas that serve reads (docs/api.md §18.3).
    pub db_read_replicas: Vec<SecretString>,
    pub replica_max_wait: Duration,
    pub replica_max_lag: Duration,
    /// `JWT_SECRET`; unset, [`Config::signing_key`] finds the key in the data root.
    pub jwt_secret: Option<SecretSlice<u8>>,
    pub jwt_ttl: Duration,
    pub refresh_ttl: Duration,
    pub log_level: String,
    pub log_format: LogFormat,
    pub data_root: PathBuf,
    pub app_bundle_path: PathBuf,
    pub attachments_path: PathBuf,
    /// `STORAGE_URL`; `None` keeps the three local folders above (docs/api.md §18.1).
    pub storage_url: Option<StorageUrl>,
    pub aws: AwsSettings,
    /// Bound of each node's local cache of bundle files when they live in an object store.
    pub bundle_cache_bytes: u64,
    pub max_versions_kept: usize,
    pub admin_username: String,
    pub admin_password: SecretString,
    pub public_url: Option<String>,
    pub trusted_proxies: Vec<IpNet>,
    pub cors_allowed_origins: Vec<String>,
    pub max_json_body_bytes: usize,
    /// The memory budget of request bodies in flight (docs/api.md §18.4).
    pub max_inflight_body_bytes: usize,
    pub max_attachment_bytes: u64,
    /// A request body that sends nothing for this long is abandoned with a 400 (slow-body attacks).
    pub request_body_timeout: Duration,
    pub record_validation: RecordValidation,
    pub rate_limit_login_per_min: u32,
    pub rate_limit_per_user_per_sec: u32,
    pub export_max_concurrent: usize,
    /// How long a finished export job's file is kept (`EXPORT_JOB_TTL_SECONDS`).
    pub export_job_ttl: Duration,
    pub transmission_retention_days: u32,
    /// How long audit log entries are kept (`AUDIT_RETENTION_DAYS`).
    pub audit_retention_days: u32,
    pub metrics_port: Option<u16>,
    /// Where spans are exported (OTLP/HTTP), when they are (docs/operations.md, "Tracing").
    pub otlp_traces_endpoint: Option<String>,
    pub otel_service_name: String,
    /// bcrypt cost of new password hashes: 12 (docs/api.md §7.1); only the test suite lowers it
    /// (see [`test_only`]).
    pub password_hash_cost: u32,
    /// Every variable of [`VARIABLES`] as given or defaulted, secrets redacted: the audit log's
    /// copy of the settings.
    shown: serde_json::Map<String, serde_json::Value>,
}

/// The process environment, `.env` (if present) included.
pub fn environment() -> impl Fn(&str) -> Option<String> {
    // dotenvy never overrides a variable that is already set: the real environment wins.
    let _ = dotenvy::dotenv();
    |name| std::env::var(name).ok()
}

/// Where `synkronus healthcheck` finds this machine's server: `PORT` on `BIND_ADDRESS`, the
/// loopback address when that is the unspecified one. Only those two variables are read, so a
/// probe never fails on a setting the server alone needs.
pub fn probe_address(lookup: impl Fn(&str) -> Option<String>) -> Result<SocketAddr, ConfigError> {
    let config = Config::from_rows(&lookup, &["PORT", "BIND_ADDRESS"])?;
    let ip = match config.bind_address {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    Ok(SocketAddr::new(ip, config.port))
}

/// `DB_POOL_SIZE` shared out between a process's two request pools (see `db::create_sync_pool`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestConnections {
    pub sync: usize,
    pub others: usize,
}

impl Config {
    /// Half of `DB_POOL_SIZE` (rounded up) for sync reads, the rest for every other request: the
    /// total a node holds stays what operators size `max_connections` by.
    pub fn request_connections(&self) -> RequestConnections {
        let sync = self.db_pool_size.div_ceil(2);
        RequestConnections { sync, others: self.db_pool_size - sync }
    }

    /// Loads `.env` (if present) then the environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(environment())
    }

    /// Only the rows of `names`, in the table's order, over the unparsed state: for commands
    /// that need a setting or two and must not refuse to run over the others.
    fn from_rows(lookup: &impl Fn(&str) -> Option<String>, names: &[&str]) -> Result<Self, ConfigError> {
        let mut config = Config::before_parsing();
        for variable in VARIABLES.iter().filter(|v| names.contains(&v.name)) {
            let raw = lookup(variable.name);
            variable.apply(&mut config, raw.as_deref()).map_err(|reason| invalid(variable.name, reason))?;
        }
        Ok(config)
    }

    /// Builds the configuration from any variable source (tests pass a map): every variable of
    /// [`VARIABLES`] in order, then the test-only ones.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut config = Config::before_parsing();
        for variable in VARIABLES {
            let raw = lookup(variable.name);
            variable.apply(&mut config, raw.as_deref()).map_err(|reason| invalid(variable.name, reason))?;
            config.shown.insert(variable.name.to_string(), variable.shown(raw.as_deref()));
        }
        test_only::apply(&mut config, &lookup)?;
        Ok(config)
    }

    /// The state every variable's setter starts from; each overwrites its own fields.
    fn before_parsing() -> Self {
        Config {
            port: 0,
            bind_address: IpAddr::from([0, 0, 0, 0]),
            node_id: String::new(),
            database: DatabaseConfig::Embedded { pg_run_as: String::new(), pg_bin_dir: None },
            db_pool_size: 0,
            db_read_replicas: Vec::new(),
            replica_max_wait: Duration::ZERO,
            replica_max_lag: Duration::ZERO,
            jwt_secret: None,
            jwt_ttl: Duration::ZERO,
            refresh_ttl: Duration::ZERO,
            log_level: String::new(),
            log_format: LogFormat::Text,
            data_root: PathBuf::new(),
            app_bundle_path: PathBuf::new(),
            attachments_path: PathBuf::new(),
            storage_url: None,
            aws: AwsSettings::default(),
            bundle_cache_bytes: 0,
            max_versions_kept: 0,
            admin_username: String::new(),
            admin_password: SecretString::from(""),
            public_url: None,
            trusted_proxies: Vec::new(),
            cors_allowed_origins: Vec::new(),
            max_json_body_bytes: 0,
            max_inflight_body_bytes: 0,
            max_attachment_bytes: 0,
            request_body_timeout: Duration::ZERO,
            record_validation: RecordValidation::Warn,
            rate_limit_login_per_min: 0,
            rate_limit_per_user_per_sec: 0,
            export_max_concurrent: 0,
            export_job_ttl: Duration::ZERO,
            transmission_retention_days: 0,
            audit_retention_days: 0,
            metrics_port: None,
            otlp_traces_endpoint: None,
            otel_service_name: String::new(),
            password_hash_cost: crate::domain::user::BCRYPT_COST,
            shown: serde_json::Map::new(),
        }
    }

    /// The settings as the audit log's `server.start` entry shows them: every variable of the
    /// table by name, as given or defaulted, the secrets (`JWT_SECRET`, the connection strings,
    /// the AWS keys, the admin password) only as `"(redacted)"` when set.
    pub fn without_secrets(&self) -> serde_json::Value {
        serde_json::Value::Object(self.shown.clone())
    }

    /// True when the bootstrap admin still has the shipped default password.
    pub fn uses_default_admin_password(&self) -> bool {
        self.admin_username == "admin" && self.admin_password.expose_secret() == "admin"
    }
}

fn absolute(path: &std::path::Path) -> PathBuf {
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().map(|d| d.join(path)).unwrap_or_else(|_| path.to_path_buf())
    }
}

#[cfg(test)]
mod tests;
