//! Where files live: `STORAGE_URL`, the `AWS_*` variables (docs/api.md §18.1) and the local
//! folders, as the one section of the configuration that `Storage::open` takes.

use std::path::PathBuf;

use secrecy::SecretString;

use super::Config;

/// What `Storage::open` needs to know, and nothing else.
#[derive(Debug, Clone)]
pub struct StorageConfig {
    /// `None`: the three local folders below.
    pub url: Option<StorageUrl>,
    pub aws: AwsSettings,
    pub attachments_path: PathBuf,
    pub app_bundle_path: PathBuf,
    pub exports_path: PathBuf,
}

impl Config {
    /// The storage section: `STORAGE_URL`, `AWS_*`, `ATTACHMENTS_PATH`, `APP_BUNDLE_PATH` and
    /// `DATA_ROOT/exports`.
    pub fn storage(&self) -> StorageConfig {
        StorageConfig {
            url: self.storage_url.clone(),
            aws: self.aws.clone(),
            attachments_path: self.attachments_path.clone(),
            app_bundle_path: self.app_bundle_path.clone(),
            exports_path: self.data_root.join("exports"),
        }
    }
}

/// Where files live, as `STORAGE_URL` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StorageUrl {
    /// `file:///absolute/path`: `attachments/`, `app-bundles/` and `exports/` under it.
    File(PathBuf),
    /// `s3://bucket[/prefix]`; `prefix` is empty or ends in `/`.
    S3 { bucket: String, prefix: String },
}

impl StorageUrl {
    pub fn parse(raw: &str) -> Result<Self, String> {
        let raw = raw.trim();
        if let Some(path) = raw.strip_prefix("file://") {
            if !path.starts_with('/') {
                return Err(format!("'{raw}' needs an absolute path (file:///srv/synkronus)"));
            }
            return Ok(StorageUrl::File(PathBuf::from(path)));
        }
        if let Some(rest) = raw.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            let valid = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.';
            if bucket.len() < 3 || bucket.len() > 63 || !bucket.chars().all(valid) {
                return Err(format!("'{raw}' does not name a bucket (s3://bucket or s3://bucket/prefix)"));
            }
            let prefix = prefix.trim_matches('/');
            let prefix = if prefix.is_empty() { String::new() } else { format!("{prefix}/") };
            return Ok(StorageUrl::S3 { bucket: bucket.to_owned(), prefix });
        }
        Err(format!("'{raw}' is not a file:/// or s3:// URL"))
    }
}

impl std::fmt::Display for StorageUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StorageUrl::File(path) => write!(f, "file://{}", path.display()),
            StorageUrl::S3 { bucket, prefix } => write!(f, "s3://{bucket}/{prefix}"),
        }
    }
}

/// The standard AWS variables; the keys are secrets (their `Debug` shows no value).
#[derive(Debug, Clone, Default)]
pub struct AwsSettings {
    pub access_key_id: Option<SecretString>,
    pub secret_access_key: Option<SecretString>,
    pub session_token: Option<SecretString>,
    pub region: String,
    pub endpoint: Option<String>,
    pub allow_http: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(StorageUrl::parse("file:///srv/x"), Ok(StorageUrl::File(PathBuf::from("/srv/x"))));
        assert_eq!(
            StorageUrl::parse("s3://my-bucket"),
            Ok(StorageUrl::S3 { bucket: "my-bucket".into(), prefix: String::new() })
        );
        assert_eq!(
            StorageUrl::parse("s3://my-bucket/a/b/"),
            Ok(StorageUrl::S3 { bucket: "my-bucket".into(), prefix: "a/b/".into() })
        );
        for bad in ["s3://", "s3:///x", "file://relative", "http://x", "/srv/x", "s3://UPPER"] {
            assert!(StorageUrl::parse(bad).is_err(), "{bad}");
        }
    }
}
