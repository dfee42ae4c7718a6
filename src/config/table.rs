//! The configuration variables, one row each, in the order the README lists them (an order that
//! matters: a path default reads `DATA_ROOT`, the embedded-database settings read
//! `DB_CONNECTION`). Adding a variable is adding a row here and a field to `Config`; the README
//! test then asks for the README's row.

use std::net::IpAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use ipnet::IpNet;
use secrecy::{SecretSlice, SecretString};

use super::{absolute, Config, DatabaseConfig, LogFormat, RecordValidation};

/// What the audit log shows of a secret that is set.
pub const REDACTED: &str = "(redacted)";

/// Stores a parsed value in the configuration, or says why the text is not one.
type SetValue = fn(&mut Config, &str) -> Result<(), String>;
/// The same for a variable that may stay unset (it is given `None` then).
type SetOptional = fn(&mut Config, Option<&str>) -> Result<(), String>;

/// One environment variable.
pub struct Variable {
    pub name: &'static str,
    /// The README's "Meaning" column (Markdown).
    pub meaning: &'static str,
    /// Its value is never shown: the audit log's copy of the settings says only whether it is set.
    pub secret: bool,
    kind: Kind,
}

enum Kind {
    /// Unset, the default text is parsed as if it had been given.
    Defaulted(&'static str, SetValue),
    /// Unset is a state of its own, described for the README ("unset", "auto", ...).
    Optional(&'static str, SetOptional),
}

impl Variable {
    const fn defaulted(
        name: &'static str,
        default: &'static str,
        meaning: &'static str,
        set: SetValue,
    ) -> Self {
        Variable { name, meaning, secret: false, kind: Kind::Defaulted(default, set) }
    }

    const fn optional(
        name: &'static str,
        unset: &'static str,
        meaning: &'static str,
        set: SetOptional,
    ) -> Self {
        Variable { name, meaning, secret: false, kind: Kind::Optional(unset, set) }
    }

    const fn secret(self) -> Self {
        Variable { secret: true, ..self }
    }

    /// The setting as the audit log's `server.start` entry shows it: the text given or the
    /// default, `null` when unset without one, `"(redacted)"` for a secret that is set.
    pub fn shown(&self, raw: Option<&str>) -> serde_json::Value {
        let raw = raw.filter(|s| !s.trim().is_empty());
        match (&self.kind, raw) {
            (_, Some(_)) if self.secret => REDACTED.into(),
            (_, Some(raw)) => raw.into(),
            (Kind::Defaulted(default, _), None) => (*default).into(),
            (Kind::Optional(..), None) => serde_json::Value::Null,
        }
    }

    /// The README's "Default" column.
    pub fn default_shown(&self) -> String {
        match self.kind {
            Kind::Defaulted(value, _) => format!("`{value}`"),
            Kind::Optional(unset, _) => unset.to_string(),
        }
    }

    /// Parses `raw` (or the default) into `config`; the error is the reason, without the name.
    pub(super) fn apply(&self, config: &mut Config, raw: Option<&str>) -> Result<(), String> {
        match (&self.kind, raw) {
            (Kind::Defaulted(_, set), Some(raw)) => set(config, raw),
            (Kind::Defaulted(default, set), None) => set(config, default),
            (Kind::Optional(_, set), raw) => set(config, raw),
        }
    }
}

/// The README's configuration table, row for row.
pub fn render_markdown_table() -> String {
    let mut table = String::from("| Variable | Default | Meaning |\n|---|---|---|\n");
    for v in VARIABLES {
        table.push_str(&format!("| `{}` | {} | {} |\n", v.name, v.default_shown(), v.meaning));
    }
    table
}

macro_rules! set {
    ($field:ident = $parse:expr) => {
        |c: &mut Config, raw: &str| -> Result<(), String> {
            c.$field = $parse(raw)?;
            Ok(())
        }
    };
}

pub static VARIABLES: &[Variable] = &[
    Variable::defaulted("PORT", "8080", "HTTP listen port", set!(port = port)),
    Variable::defaulted("BIND_ADDRESS", "0.0.0.0", "Listen address", set!(bind_address = ip_address)),
    Variable::optional(
        "NODE_ID",
        "host name and `PORT`",
        "This node's name in logs, `/metrics` (`node` label), `/health` and export jobs; unique per node \
         when several share one database ([docs/deploy.md](docs/deploy.md))",
        |c, raw| {
            c.node_id = match non_blank(raw) {
                Some(id) => node_id(id)?,
                None => format!("{}:{}", host_name(), c.port),
            };
            Ok(())
        },
    ),
    Variable::optional(
        "DB_CONNECTION",
        "unset",
        "`postgres://…` URL or libpq `key=value` string (`sslmode`, `connect_timeout` honoured). Unset: the \
         embedded cluster under `DATA_ROOT/postgres`",
        |c, raw| {
            c.database = match non_blank(raw) {
                Some(conn) => {
                    crate::db::parse_connection(conn)?;
                    DatabaseConfig::External(SecretString::from(conn))
                }
                None => DatabaseConfig::Embedded { pg_run_as: String::new(), pg_bin_dir: None },
            };
            Ok(())
        },
    ).secret(),
    Variable::defaulted(
        "PG_RUN_AS",
        "postgres",
        "Embedded mode, running as root: the user that runs the cluster",
        |c, raw| {
            if let DatabaseConfig::Embedded { pg_run_as, .. } = &mut c.database {
                *pg_run_as = raw.to_string();
            }
            Ok(())
        },
    ),
    Variable::optional(
        "PG_BIN_DIR",
        "auto",
        "Where `initdb`/`pg_ctl` live (else `PATH`, then the newest `/usr/lib/postgresql/*/bin`)",
        |c, raw| {
            if let DatabaseConfig::Embedded { pg_bin_dir, .. } = &mut c.database {
                *pg_bin_dir = raw.filter(|s| !s.is_empty()).map(PathBuf::from);
            }
            Ok(())
        },
    ),
    Variable::defaulted(
        "DB_POOL_SIZE",
        "16",
        "Connections per process for requests (≥ 2), half of them (rounded up) for sync reads (pull pages, attachment \
         manifests); the change log keeps 2 more, each running export 1",
        set!(db_pool_size = |raw| at_least(raw, 2)),
    ),
    Variable::optional(
        "DB_READ_REPLICAS",
        "empty",
        "Comma-separated connection strings (forms of `DB_CONNECTION`) of PostgreSQL hot-standby replicas \
         of the primary; pulls, manifests, listings, exports, statistics and `GET /devices` are read from them",
        |c, raw| {
            let mut replicas = Vec::new();
            for conn in raw.unwrap_or_default().split(',').map(str::trim).filter(|s| !s.is_empty()) {
                crate::db::parse_connection(conn)?;
                replicas.push(SecretString::from(conn));
            }
            c.db_read_replicas = replicas;
            Ok(())
        },
    ).secret(),
    Variable::defaulted(
        "REPLICA_MAX_WAIT_MS",
        "500",
        "How long a read may wait for a replica to catch up with the client's cursor before the primary answers",
        |c, raw| {
            c.replica_max_wait = Duration::from_millis(number(raw)?);
            Ok(())
        },
    ),
    Variable::defaulted(
        "REPLICA_MAX_LAG_SECONDS",
        "30",
        "A replica further behind (or unreachable) leaves the rotation; it is re-checked every 5 s",
        set!(replica_max_lag = seconds),
    ),
    Variable::optional(
        "JWT_SECRET",
        "generated (embedded database only)",
        "HS256 key, at least 32 bytes. Unset on the embedded database: generated once into \
         `DATA_ROOT/jwt-secret` (mode 0600) and reused at every start; required with `DB_CONNECTION` \
         (every node must sign with the same key)",
        |c, raw| {
            c.jwt_secret = match raw.filter(|s| !s.is_empty()) {
                Some(raw) if raw.len() < super::jwt_secret::MIN_BYTES => {
                    return Err(format!("must be at least {} bytes long", super::jwt_secret::MIN_BYTES))
                }
                Some(raw) => Some(SecretSlice::from(raw.as_bytes().to_vec())),
                None => None,
            };
            Ok(())
        },
    ).secret(),
    Variable::defaulted("JWT_TTL_SECONDS", "3600", "Access-token lifetime", set!(jwt_ttl = seconds)),
    Variable::defaulted(
        "REFRESH_TTL_SECONDS",
        "2592000",
        "Refresh-token lifetime",
        set!(refresh_ttl = seconds),
    ),
    Variable::defaulted("LOG_LEVEL", "info", "`trace` … `error`", |c, raw| {
        let level = raw.to_lowercase();
        if !["trace", "debug", "info", "warn", "error"].contains(&level.as_str()) {
            return Err("must be trace, debug, info, warn or error".into());
        }
        c.log_level = level;
        Ok(())
    }),
    Variable::defaulted("LOG_FORMAT", "text", "`text` or `json`", |c, raw| {
        c.log_format = match raw.to_lowercase().as_str() {
            "text" => LogFormat::Text,
            "json" => LogFormat::Json,
            _ => return Err("must be text or json".into()),
        };
        Ok(())
    }),
    Variable::defaulted("DATA_ROOT", "./data", "All mutable files", |c, raw| {
        c.data_root = absolute(&PathBuf::from(raw));
        Ok(())
    }),
    Variable::optional(
        "APP_BUNDLE_PATH",
        "`DATA_ROOT/app-bundles`",
        "Bundle versions (`versions/<id>/`)",
        |c, raw| {
            c.app_bundle_path =
                raw.map_or_else(|| c.data_root.join("app-bundles"), |p| absolute(&PathBuf::from(p)));
            Ok(())
        },
    ),
    Variable::optional(
        "ATTACHMENTS_PATH",
        "`DATA_ROOT/attachments`",
        "Attachment blobs (content-addressed)",
        |c, raw| {
            c.attachments_path =
                raw.map_or_else(|| c.data_root.join("attachments"), |p| absolute(&PathBuf::from(p)));
            Ok(())
        },
    ),
    Variable::optional(
        "STORAGE_URL",
        "unset",
        "Where files live: unset, the three folders above; `file:///absolute/path`; `s3://BUCKET[/PREFIX]` (docs/storage.md)",
        |c, raw| {
            c.storage_url = raw.map(super::StorageUrl::parse).transpose()?;
            Ok(())
        },
    ),
    Variable::optional("AWS_ACCESS_KEY_ID", "unset", "S3 access key", |c, raw| {
        c.aws.access_key_id = raw.map(SecretString::from);
        Ok(())
    }).secret(),
    Variable::optional("AWS_SECRET_ACCESS_KEY", "unset", "S3 secret key", |c, raw| {
        c.aws.secret_access_key = raw.map(SecretString::from);
        Ok(())
    }).secret(),
    Variable::optional("AWS_SESSION_TOKEN", "unset", "S3 session token", |c, raw| {
        c.aws.session_token = raw.map(SecretString::from);
        Ok(())
    }).secret(),
    Variable::defaulted("AWS_REGION", "us-east-1", "S3 region", |c, raw| {
        c.aws.region = raw.trim().to_owned();
        Ok(())
    }),
    Variable::optional(
        "AWS_ENDPOINT_URL",
        "unset",
        "S3 endpoint of a non-AWS store (`http://127.0.0.1:9000`); path-style addressing",
        |c, raw| {
            c.aws.endpoint = match raw.map(str::trim).filter(|s| !s.is_empty()) {
                Some(url) if url.starts_with("http://") || url.starts_with("https://") => Some(url.to_owned()),
                Some(url) => return Err(format!("'{url}' is not an http:// or https:// URL")),
                None => None,
            };
            Ok(())
        },
    ),
    Variable::defaulted("AWS_ALLOW_HTTP", "false", "`true` permits an `http://` endpoint", |c, raw| {
        c.aws.allow_http = boolean(raw)?;
        Ok(())
    }),
    Variable::defaulted(
        "BUNDLE_CACHE_BYTES",
        "1073741824",
        "Bound of each node's local cache of bundle files kept in an object store",
        set!(bundle_cache_bytes = |raw| at_least::<u64>(raw, 0)),
    ),
    Variable::defaulted(
        "MAX_VERSIONS_KEPT",
        "5",
        "Bundle versions retained",
        set!(max_versions_kept = |raw| at_least::<i64>(raw, 1).map(|n| n as usize)),
    ),
    Variable::defaulted(
        "ADMIN_USERNAME",
        "admin",
        "Initial admin's username, created when there are no users",
        |c, raw| {
            crate::domain::user::validate_username(raw).map_err(|_| "is not a valid username".to_string())?;
            c.admin_username = raw.to_string();
            Ok(())
        },
    ),
    Variable::defaulted("ADMIN_PASSWORD", "admin", "Initial admin's password", |c, raw| {
        if raw.is_empty() {
            return Err("must not be empty".into());
        }
        c.admin_password = SecretString::from(raw);
        Ok(())
    }).secret(),
    Variable::optional(
        "PUBLIC_URL",
        "unset",
        "External base URL for absolute links (attachment `download_url`)",
        |c, raw| {
            c.public_url = match non_blank(raw) {
                None => None,
                Some(url) => {
                    let url = url.trim().trim_end_matches('/');
                    if !(url.starts_with("http://") || url.starts_with("https://")) {
                        return Err("must start with http:// or https://".into());
                    }
                    Some(url.to_string())
                }
            };
            Ok(())
        },
    ),
    Variable::optional(
        "TRUSTED_PROXIES",
        "empty",
        "CIDRs allowed to set the client IP via `X-Forwarded-For`",
        |c, raw| {
            c.trusted_proxies = raw.map_or_else(|| Ok(Vec::new()), cidr_list)?;
            Ok(())
        },
    ),
    Variable::defaulted("CORS_ALLOWED_ORIGINS", "*", "Comma-separated origins", |c, raw| {
        c.cors_allowed_origins = raw
            .split(',')
            .map(|s| s.trim().trim_end_matches('/').to_string())
            .filter(|s| !s.is_empty())
            .collect();
        Ok(())
    }),
    Variable::defaulted(
        "MAX_JSON_BODY_BYTES",
        "33554432",
        "JSON body limit",
        set!(max_json_body_bytes = |raw| at_least(raw, 1)),
    ),
    Variable::defaulted(
        "MAX_INFLIGHT_BODY_BYTES",
        "536870912",
        "Bytes of JSON bodies in flight (being read, decoded or waiting to commit); beyond it a request waits up to 5 s, then gets 503",
        set!(max_inflight_body_bytes = |raw| at_least(raw, 1)),
    ),
    Variable::defaulted(
        "MAX_ATTACHMENT_BYTES",
        "67108864",
        "Attachment size limit",
        set!(max_attachment_bytes = number),
    ),
    Variable::defaulted(
        "RECORD_VALIDATION",
        "warn",
        "`off`, `warn` or `reject`: pushed data against form JSON Schemas",
        |c, raw| {
            c.record_validation = match raw.to_lowercase().as_str() {
                "off" => RecordValidation::Off,
                "warn" => RecordValidation::Warn,
                "reject" => RecordValidation::Reject,
                _ => return Err("must be off, warn or reject".into()),
            };
            Ok(())
        },
    ),
    Variable::defaulted(
        "RATE_LIMIT_LOGIN_PER_MIN",
        "10",
        "Login attempts per (IP, username) per minute, counted for all nodes together (in the database); 0 = off",
        set!(rate_limit_login_per_min = number),
    ),
    Variable::defaulted(
        "RATE_LIMIT_PER_USER_PER_SEC",
        "0",
        "Authenticated requests per user per second, counted by each node on its own; 0 = off",
        set!(rate_limit_per_user_per_sec = number),
    ),
    Variable::defaulted(
        "EXPORT_MAX_CONCURRENT",
        "2",
        "Exports running at once",
        set!(export_max_concurrent = |raw| at_least(raw, 1)),
    ),
    Variable::defaulted(
        "EXPORT_JOB_TTL_SECONDS",
        "3600",
        "How long finished export-job files are kept",
        set!(export_job_ttl = seconds),
    ),
    Variable::defaulted(
        "TRANSMISSION_RETENTION_DAYS",
        "30",
        "How long push results are kept for idempotent replay",
        set!(transmission_retention_days = number),
    ),
    Variable::defaulted(
        "AUDIT_RETENTION_DAYS",
        "365",
        "How long audit log entries are kept (swept hourly)",
        set!(audit_retention_days = |raw| at_least(raw, 1)),
    ),
    Variable::optional(
        "METRICS_PORT",
        "unset",
        "Also serve `/metrics` without auth on this port",
        |c, raw| {
            c.metrics_port = match non_blank(raw) {
                None => None,
                Some(raw) => match raw.trim().parse::<u16>() {
                    Ok(p) if p > 0 => Some(p),
                    _ => return Err("must be between 1 and 65535".into()),
                },
            };
            Ok(())
        },
    ),
    Variable::optional(
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "unset (no export)",
        "An OpenTelemetry collector's OTLP/HTTP base URL (`http://host:4318`): spans go to its `/v1/traces` as protobuf (docs/operations.md)",
        |c, raw| {
            c.otlp_traces_endpoint = match non_blank(raw) {
                None => None,
                Some(raw) => Some(format!("{}/v1/traces", plain_http(raw)?.trim_end_matches('/'))),
            };
            Ok(())
        },
    ),
    Variable::optional(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "unset",
        "The full URL spans are sent to, instead of the one above (also turns the export on)",
        |c, raw| {
            if let Some(raw) = non_blank(raw) {
                c.otlp_traces_endpoint = Some(plain_http(raw)?.to_string());
            }
            Ok(())
        },
    ),
    Variable::defaulted("OTEL_SERVICE_NAME", "synkronus", "The `service.name` of exported spans", |c, raw| {
        c.otel_service_name = raw.trim().to_string();
        Ok(())
    }),
    Variable::defaulted(
        "REQUEST_BODY_TIMEOUT_SECONDS",
        "30",
        "A request body that stalls this long is answered with 400 (slow-body protection)",
        set!(request_body_timeout = seconds),
    ),
];

/// The span exporter speaks plain HTTP only (no TLS stack of its own): a collector beside the
/// server, or in its private network, forwards further.
fn plain_http(raw: &str) -> Result<&str, String> {
    let url = raw.trim();
    match url.strip_prefix("http://") {
        Some(rest) if !rest.is_empty() => Ok(url),
        _ => Err("must be an http:// URL (spans are sent over plain HTTP, to a collector nearby)".into()),
    }
}

/// Blank counts as unset for the variables whose unset state means something.
fn non_blank(raw: Option<&str>) -> Option<&str> {
    raw.filter(|s| !s.trim().is_empty())
}

fn number<T: FromStr>(raw: &str) -> Result<T, String> {
    raw.trim().parse::<T>().map_err(|_| format!("'{raw}' is not a valid number"))
}

fn at_least<T: FromStr + PartialOrd + std::fmt::Display>(raw: &str, min: T) -> Result<T, String> {
    let n = number(raw)?;
    if n < min {
        return Err(format!("must be at least {min}"));
    }
    Ok(n)
}

/// A whole number of seconds, at least one.
fn seconds(raw: &str) -> Result<Duration, String> {
    at_least(raw, 1u64).map(Duration::from_secs)
}

fn port(raw: &str) -> Result<u16, String> {
    match number::<u32>(raw)? {
        p @ 1..=65535 => Ok(p as u16),
        _ => Err("must be between 1 and 65535".into()),
    }
}

/// Printable and short: it becomes a log field, a metrics label and a column value.
fn node_id(raw: &str) -> Result<String, String> {
    let id = raw.trim();
    if id.len() > 100 || id.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err("must be at most 100 characters without spaces or control characters".into());
    }
    Ok(id.to_string())
}

/// The machine's host name; `localhost` when the system does not say.
fn host_name() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|name| name.into_string().ok())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

fn ip_address(raw: &str) -> Result<IpAddr, String> {
    raw.trim().parse().map_err(|_| format!("'{raw}' is not an IP address"))
}

fn cidr_list(raw: &str) -> Result<Vec<IpNet>, String> {
    raw.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<IpNet>()
                .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| format!("'{s}' is not a CIDR"))
        })
        .collect()
}

fn boolean(raw: &str) -> Result<bool, String> {
    match raw.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" => Ok(true),
        "false" | "0" | "no" | "" => Ok(false),
        _ => Err(format!("'{raw}' is not true or false")),
    }
}
