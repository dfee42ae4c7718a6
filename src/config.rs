//! Configuration from the environment (API.md section 2), parsed and validated once at start.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;

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
    External(String),
    Embedded { pg_run_as: String, pg_bin_dir: Option<PathBuf> },
}

#[derive(Clone)]
pub struct Config {
    pub port: u16,
    pub bind_address: IpAddr,
    pub database: DatabaseConfig,
    pub db_pool_size: usize,
    pub jwt_secret: Vec<u8>,
    pub jwt_ttl: Duration,
    pub refresh_ttl: Duration,
    pub log_level: String,
    pub log_format: LogFormat,
    pub data_root: PathBuf,
    pub app_bundle_path: PathBuf,
    pub attachments_path: PathBuf,
    pub max_versions_kept: usize,
    pub admin_username: String,
    pub admin_password: String,
    pub public_url: Option<String>,
    pub trusted_proxies: Vec<IpNet>,
    pub cors_allowed_origins: Vec<String>,
    pub max_json_body_bytes: usize,
    pub max_attachment_bytes: u64,
    pub record_validation: RecordValidation,
    pub rate_limit_login_per_min: u32,
    pub rate_limit_per_user_per_sec: u32,
    pub export_max_concurrent: usize,
    /// How long a finished export job's file is kept (`EXPORT_JOB_TTL_SECONDS`).
    pub export_job_ttl: Duration,
    pub transmission_retention_days: u32,
    pub metrics_port: Option<u16>,
}

impl std::fmt::Debug for Config {
    // Hand-written so that the JWT secret and the admin password never reach a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("port", &self.port)
            .field("bind_address", &self.bind_address)
            .field("data_root", &self.data_root)
            .field("db_pool_size", &self.db_pool_size)
            .field("record_validation", &self.record_validation)
            .finish_non_exhaustive()
    }
}

fn parse_num<T: std::str::FromStr>(
    var: &dyn Fn(&str) -> Option<String>,
    name: &'static str,
    default: T,
) -> Result<T, ConfigError> {
    match var(name) {
        None => Ok(default),
        Some(raw) => {
            raw.trim().parse::<T>().map_err(|_| invalid(name, format!("'{raw}' is not a valid number")))
        }
    }
}

impl Config {
    /// Loads `.env` (if present) then the environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        // dotenvy never overrides a variable that is already set: the real environment wins.
        let _ = dotenvy::dotenv();
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Builds the configuration from any variable source (tests pass a map).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let var = |name: &str| lookup(name);
        let port: u32 = parse_num(&var, "PORT", 8080)?;
        if port == 0 || port > 65535 {
            return Err(invalid("PORT", "must be between 1 and 65535"));
        }
        let bind_address = match var("BIND_ADDRESS") {
            None => IpAddr::from([0, 0, 0, 0]),
            Some(raw) => raw
                .trim()
                .parse()
                .map_err(|_| invalid("BIND_ADDRESS", format!("'{raw}' is not an IP address")))?,
        };

        let database = match var("DB_CONNECTION").filter(|s| !s.trim().is_empty()) {
            Some(conn) => {
                crate::db::parse_connection(&conn).map_err(|e| invalid("DB_CONNECTION", e))?;
                DatabaseConfig::External(conn)
            }
            None => DatabaseConfig::Embedded {
                pg_run_as: var("PG_RUN_AS").unwrap_or_else(|| "postgres".into()),
                pg_bin_dir: var("PG_BIN_DIR").filter(|s| !s.is_empty()).map(PathBuf::from),
            },
        };
        let db_pool_size: usize = parse_num(&var, "DB_POOL_SIZE", 16)?;
        if db_pool_size < 2 {
            return Err(invalid("DB_POOL_SIZE", "must be at least 2"));
        }

        let jwt_secret =
            var("JWT_SECRET").ok_or_else(|| invalid("JWT_SECRET", "is required (at least 32 bytes)"))?;
        if jwt_secret.len() < 32 {
            return Err(invalid("JWT_SECRET", "must be at least 32 bytes long"));
        }
        let jwt_ttl: u64 = parse_num(&var, "JWT_TTL_SECONDS", 3600)?;
        let refresh_ttl: u64 = parse_num(&var, "REFRESH_TTL_SECONDS", 2_592_000)?;
        if jwt_ttl == 0 {
            return Err(invalid("JWT_TTL_SECONDS", "must be at least 1"));
        }
        if refresh_ttl == 0 {
            return Err(invalid("REFRESH_TTL_SECONDS", "must be at least 1"));
        }

        let log_level = var("LOG_LEVEL").unwrap_or_else(|| "info".into()).to_lowercase();
        if !["trace", "debug", "info", "warn", "error"].contains(&log_level.as_str()) {
            return Err(invalid("LOG_LEVEL", "must be trace, debug, info, warn or error"));
        }
        let log_format = match var("LOG_FORMAT").unwrap_or_else(|| "text".into()).to_lowercase().as_str() {
            "text" => LogFormat::Text,
            "json" => LogFormat::Json,
            _ => return Err(invalid("LOG_FORMAT", "must be text or json")),
        };

        let data_root = PathBuf::from(var("DATA_ROOT").unwrap_or_else(|| "./data".into()));
        let data_root = absolute(&data_root);
        let app_bundle_path = var("APP_BUNDLE_PATH")
            .map(|p| absolute(&PathBuf::from(p)))
            .unwrap_or_else(|| data_root.join("app-bundles"));
        let attachments_path = var("ATTACHMENTS_PATH")
            .map(|p| absolute(&PathBuf::from(p)))
            .unwrap_or_else(|| data_root.join("attachments"));

        let max_versions_kept: i64 = parse_num(&var, "MAX_VERSIONS_KEPT", 5)?;
        if max_versions_kept < 1 {
            return Err(invalid("MAX_VERSIONS_KEPT", "must be at least 1"));
        }

        let admin_username = var("ADMIN_USERNAME").unwrap_or_else(|| "admin".into());
        if crate::domain::user::validate_username(&admin_username).is_err() {
            return Err(invalid("ADMIN_USERNAME", "is not a valid username"));
        }
        let admin_password = var("ADMIN_PASSWORD").unwrap_or_else(|| "admin".into());
        if admin_password.is_empty() {
            return Err(invalid("ADMIN_PASSWORD", "must not be empty"));
        }

        let public_url = match var("PUBLIC_URL").filter(|s| !s.trim().is_empty()) {
            None => None,
            Some(url) => {
                let url = url.trim().trim_end_matches('/').to_string();
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(invalid("PUBLIC_URL", "must start with http:// or https://"));
                }
                Some(url)
            }
        };

        let trusted_proxies = match var("TRUSTED_PROXIES") {
            None => Vec::new(),
            Some(raw) => raw
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| {
                    s.parse::<IpNet>()
                        .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
                        .map_err(|_| invalid("TRUSTED_PROXIES", format!("'{s}' is not a CIDR")))
                })
                .collect::<Result<_, _>>()?,
        };

        let cors_allowed_origins: Vec<String> = var("CORS_ALLOWED_ORIGINS")
            .unwrap_or_else(|| "*".into())
            .split(',')
            .map(|s| s.trim().trim_end_matches('/').to_string())
            .filter(|s| !s.is_empty())
            .collect();

        let max_json_body_bytes: usize = parse_num(&var, "MAX_JSON_BODY_BYTES", 33_554_432)?;
        let max_attachment_bytes: u64 = parse_num(&var, "MAX_ATTACHMENT_BYTES", 67_108_864)?;
        if max_json_body_bytes == 0 {
            return Err(invalid("MAX_JSON_BODY_BYTES", "must be at least 1"));
        }

        let record_validation =
            match var("RECORD_VALIDATION").unwrap_or_else(|| "warn".into()).to_lowercase().as_str() {
                "off" => RecordValidation::Off,
                "warn" => RecordValidation::Warn,
                "reject" => RecordValidation::Reject,
                _ => return Err(invalid("RECORD_VALIDATION", "must be off, warn or reject")),
            };

        let rate_limit_login_per_min = parse_num(&var, "RATE_LIMIT_LOGIN_PER_MIN", 10)?;
        let rate_limit_per_user_per_sec = parse_num(&var, "RATE_LIMIT_PER_USER_PER_SEC", 0)?;
        let export_max_concurrent: usize = parse_num(&var, "EXPORT_MAX_CONCURRENT", 2)?;
        if export_max_concurrent == 0 {
            return Err(invalid("EXPORT_MAX_CONCURRENT", "must be at least 1"));
        }
        let export_job_ttl: u64 = parse_num(&var, "EXPORT_JOB_TTL_SECONDS", 3600)?;
        if export_job_ttl == 0 {
            return Err(invalid("EXPORT_JOB_TTL_SECONDS", "must be at least 1"));
        }
        let transmission_retention_days = parse_num(&var, "TRANSMISSION_RETENTION_DAYS", 30)?;
        let metrics_port = match var("METRICS_PORT").filter(|s| !s.trim().is_empty()) {
            None => None,
            Some(raw) => match raw.trim().parse::<u16>() {
                Ok(p) if p > 0 => Some(p),
                _ => return Err(invalid("METRICS_PORT", "must be between 1 and 65535")),
            },
        };

        Ok(Config {
            port: port as u16,
            bind_address,
            database,
            db_pool_size,
            jwt_secret: jwt_secret.into_bytes(),
            jwt_ttl: Duration::from_secs(jwt_ttl),
            refresh_ttl: Duration::from_secs(refresh_ttl),
            log_level,
            log_format,
            data_root,
            app_bundle_path,
            attachments_path,
            max_versions_kept: max_versions_kept as usize,
            admin_username,
            admin_password,
            public_url,
            trusted_proxies,
            cors_allowed_origins,
            max_json_body_bytes,
            max_attachment_bytes,
            record_validation,
            rate_limit_login_per_min,
            rate_limit_per_user_per_sec,
            export_max_concurrent,
            export_job_ttl: Duration::from_secs(export_job_ttl),
            transmission_retention_days,
            metrics_port,
        })
    }

    /// True when the bootstrap admin still has the shipped default password.
    pub fn uses_default_admin_password(&self) -> bool {
        self.admin_username == "admin" && self.admin_password == "admin"
    }
}

fn absolute(path: &std::path::Path) -> PathBuf {
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().map(|d| d.join(path)).unwrap_or_else(|_| path.to_path_buf())
    }
}
