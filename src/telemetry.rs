//! Logging: LOG_LEVEL and LOG_FORMAT (text or one JSON object per line), and the request id every
//! log line and error body of a request carries.

pub mod request_id;

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

pub fn init(level: &str, format: LogFormat) {
    // Noisy dependencies stay at warn unless RUST_LOG says otherwise.
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new(format!("{level},actix_server=warn,tokio_postgres=warn,refinery_core=warn"))
    });
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_target(false);
    let _ = match format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.try_init(),
    };
}
