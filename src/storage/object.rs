//! The S3-compatible backend through the `object_store` crate. Every call is bounded in time
//! (an unreachable store is a [`StorageError::Unavailable`] within [`STORE_TIMEOUT`]); creates
//! send `If-None-Match: *`, so an existing key is never overwritten; files above
//! [`MULTIPART_THRESHOLD`] go up in parts, never held in memory whole.

use std::future::Future;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::{
    BackoffConfig, ClientOptions, GetOptions, GetRange, ObjectStore, PutMode, PutOptions, PutPayload,
    RetryConfig, WriteMultipart,
};
use tokio::io::AsyncReadExt;

use secrecy::ExposeSecret;

use super::{ByteStream, Entry, StorageError, StorageResult, STORE_TIMEOUT};
use crate::config::AwsSettings;

/// Smaller files go up in one conditional PUT.
pub const MULTIPART_THRESHOLD: u64 = 8 * 1024 * 1024;
/// A download whose next piece takes longer than this is cut (the client may resume with Range).
const STALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Builds two clients of one bucket: `store` for bounded calls, `reader` without a total time
/// limit for streaming downloads (its pieces are bounded by [`STALL_TIMEOUT`] instead).
pub(super) fn connect(
    bucket: &str,
    aws: &AwsSettings,
) -> anyhow::Result<(Arc<dyn ObjectStore>, Arc<dyn ObjectStore>)> {
    let retry = RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
            base: 2.0,
        },
        max_retries: 2,
        retry_timeout: Duration::from_secs(5),
    };
    let build = |options: ClientOptions| -> anyhow::Result<Arc<dyn ObjectStore>> {
        let mut builder = AmazonS3Builder::new()
            .with_bucket_name(bucket)
            .with_region(&aws.region)
            .with_allow_http(aws.allow_http)
            .with_retry(retry.clone())
            .with_client_options(options.with_allow_http(aws.allow_http));
        if let Some(endpoint) = &aws.endpoint {
            builder = builder.with_endpoint(endpoint).with_virtual_hosted_style_request(false);
        }
        if let Some(key) = &aws.access_key_id {
            builder = builder.with_access_key_id(key.expose_secret());
        }
        if let Some(secret) = &aws.secret_access_key {
            builder = builder.with_secret_access_key(secret.expose_secret());
        }
        if let Some(token) = &aws.session_token {
            builder = builder.with_token(token.expose_secret());
        }
        let store = builder.build().map_err(|e| anyhow::anyhow!("STORAGE_URL: {e}"))?;
        Ok(Arc::new(store))
    };
    let connect = Duration::from_secs(3);
    let store =
        build(ClientOptions::new().with_connect_timeout(connect).with_timeout(Duration::from_secs(60)))?;
    let reader = build(ClientOptions::new().with_connect_timeout(connect).with_timeout_disabled())?;
    Ok((store, reader))
}

fn map_error(e: object_store::Error) -> StorageError {
    use object_store::Error as E;
    match e {
        E::NotFound { path, .. } => StorageError::NotFound(path),
        E::AlreadyExists { path, .. } | E::Precondition { path, .. } => StorageError::AlreadyExists(path),
        other => StorageError::Unavailable(other.to_string()),
    }
}

/// Runs one store call within [`STORE_TIMEOUT`].
async fn bounded<T>(call: impl Future<Output = object_store::Result<T>>) -> StorageResult<T> {
    bounded_by(STORE_TIMEOUT, call).await
}

async fn bounded_by<T>(
    limit: Duration,
    call: impl Future<Output = object_store::Result<T>>,
) -> StorageResult<T> {
    within(limit, async { call.await.map_err(map_error) }).await
}

async fn within<T>(limit: Duration, work: impl Future<Output = StorageResult<T>>) -> StorageResult<T> {
    match tokio::time::timeout(limit, work).await {
        Ok(result) => result,
        Err(_) => Err(StorageError::Unavailable(format!("no answer within {} s", limit.as_secs()))),
    }
}

/// An upload of `bytes` may take longer than a small call: a second more per MiB.
fn upload_limit(bytes: u64) -> Duration {
    STORE_TIMEOUT + Duration::from_secs(bytes / (1024 * 1024))
}

/// An object's name as the key it was written under: object_store encodes only with `%XX`, and
/// encodes `%` itself, so decoding is exact.
fn decoded(location: &ObjectPath) -> String {
    percent_encoding::percent_decode_str(location.as_ref()).decode_utf8_lossy().into_owned()
}

/// One prefix of a bucket.
#[derive(Clone)]
pub struct ObjectArea {
    store: Arc<dyn ObjectStore>,
    reader: Arc<dyn ObjectStore>,
    bucket: String,
    /// Ends in `/`.
    prefix: String,
}

impl ObjectArea {
    pub(super) fn new(
        store: Arc<dyn ObjectStore>,
        reader: Arc<dyn ObjectStore>,
        bucket: &str,
        prefix: &str,
    ) -> Self {
        ObjectArea { store, reader, bucket: bucket.to_owned(), prefix: prefix.to_owned() }
    }

    pub(super) fn describe(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.prefix)
    }

    /// The object a key names. object_store percent-encodes each `/`-separated part (`%`, `#`,
    /// `[`, `?`, non-ASCII, …), so the stored name can differ from the key: [`Self::key_of`]
    /// undoes exactly that, and keys round-trip whatever their characters (bundle files keep
    /// the names of their ZIP entries).
    fn path(&self, key: &str) -> ObjectPath {
        ObjectPath::from(format!("{}{key}", self.prefix))
    }

    /// The key of a listed object's decoded name: without the area's prefix.
    fn key_of(&self, name: String) -> String {
        match name.strip_prefix(&self.prefix) {
            Some(key) => key.to_owned(),
            None => name,
        }
    }

    /// A conditional create is not idempotent to object_store, so it does not retry one whose
    /// connection timed out or was reset: the store may have written it. We know better: the key
    /// is create-only and our keys are content-addressed or new under a lock, so one more try is
    /// safe, and an object of our size found then is the first try's.
    pub(super) async fn put_bytes(&self, key: &str, bytes: Bytes) -> StorageResult<()> {
        let path = self.path(key);
        let size = bytes.len() as u64;
        let create = |bytes: Bytes| {
            let opts = PutOptions { mode: PutMode::Create, ..Default::default() };
            self.store.put_opts(&path, PutPayload::from(bytes), opts)
        };
        let tries = async {
            let first = create(bytes.clone()).await.map_err(map_error);
            let Err(StorageError::Unavailable(cause)) = first else { return first.map(|_| ()) };
            tracing::info!(key, %cause, "object store write failed in transit: trying once more");
            match create(bytes).await.map_err(map_error) {
                Err(StorageError::AlreadyExists(existing)) => {
                    let stored = self.store.head(&path).await.map_err(map_error)?;
                    if stored.size == size {
                        Ok(())
                    } else {
                        Err(StorageError::AlreadyExists(existing))
                    }
                }
                second => second.map(|_| ()),
            }
        };
        within(upload_limit(size), tries).await
    }

    pub(super) async fn put_file(&self, key: &str, src: &Path) -> StorageResult<()> {
        let size = tokio::fs::metadata(src).await?.len();
        if size <= MULTIPART_THRESHOLD {
            let bytes = tokio::fs::read(src).await?;
            return self.put_bytes(key, Bytes::from(bytes)).await;
        }
        // Multipart completion cannot be conditional everywhere; callers write only keys that
        // are content-addressed or new under a lock, so a race writes identical bytes.
        if self.head(key).await?.is_some() {
            return Err(StorageError::AlreadyExists(key.to_owned()));
        }
        let upload = bounded(self.store.put_multipart(&self.path(key))).await?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, MULTIPART_THRESHOLD as usize);
        let written = async {
            let mut file = tokio::fs::File::open(src).await?;
            let mut buf = vec![0u8; 1024 * 1024];
            loop {
                let n = file.read(&mut buf).await?;
                if n == 0 {
                    break;
                }
                bounded_by(upload_limit(MULTIPART_THRESHOLD), writer.wait_for_capacity(4)).await?;
                writer.write(&buf[..n]);
            }
            StorageResult::Ok(())
        }
        .await;
        match written {
            Ok(()) => bounded_by(upload_limit(MULTIPART_THRESHOLD), writer.finish()).await.map(|_| ()),
            Err(e) => {
                let _ = tokio::time::timeout(STORE_TIMEOUT, writer.abort()).await;
                Err(e)
            }
        }
    }

    pub(super) async fn put_dir(&self, prefix: &str, src: &Path) -> StorageResult<()> {
        let files = super::local::list(src, "").await?;
        futures_util::stream::iter(files)
            .map(|entry| async move {
                let local = super::local::path(src, &entry.key);
                self.put_file(&format!("{prefix}{}", entry.key), &local).await
            })
            .buffer_unordered(8)
            .try_collect::<()>()
            .await
    }

    pub(super) async fn head(&self, key: &str) -> StorageResult<Option<u64>> {
        match bounded(self.store.head(&self.path(key))).await {
            Ok(meta) => Ok(Some(meta.size)),
            Err(StorageError::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub(super) async fn get(&self, key: &str, range: Option<Range<u64>>) -> StorageResult<ByteStream> {
        let options = GetOptions { range: range.map(GetRange::Bounded), ..Default::default() };
        let result = bounded(self.reader.get_opts(&self.path(key), options)).await?;
        let stream = result.into_stream();
        // Each piece within STALL_TIMEOUT: a store that stops mid-file ends the body with an error.
        let guarded = futures_util::stream::unfold(stream, |mut stream| async move {
            match tokio::time::timeout(STALL_TIMEOUT, stream.next()).await {
                Ok(Some(item)) => Some((item.map_err(std::io::Error::other), stream)),
                Ok(None) => None,
                Err(_) => Some((Err(std::io::Error::other("object store stalled")), stream)),
            }
        });
        Ok(guarded.boxed())
    }

    pub(super) async fn delete(&self, key: &str) -> StorageResult<()> {
        match bounded(self.store.delete(&self.path(key))).await {
            Err(StorageError::NotFound(_)) => Ok(()),
            other => other,
        }
    }

    pub(super) async fn delete_prefix(&self, prefix: &str) -> StorageResult<()> {
        let entries = self.list(prefix).await?;
        futures_util::stream::iter(entries)
            .map(|entry| async move { self.delete(&entry.key).await })
            .buffer_unordered(8)
            .try_collect::<()>()
            .await
    }

    pub(super) async fn list(&self, prefix: &str) -> StorageResult<Vec<Entry>> {
        let full = ObjectPath::from(format!("{}{prefix}", self.prefix));
        // `list` takes a folder; a name's beginning is filtered here.
        let folder = match format!("{}{prefix}", self.prefix).rsplit_once('/') {
            Some((dir, _)) => ObjectPath::from(dir),
            None => full.clone(),
        };
        // Compared decoded: the names in a listing are encoded (see `path`).
        let wanted = format!("{}{prefix}", self.prefix);
        // A listing comes in pages: each is bounded, the whole is not (buckets may be big).
        let mut listing = self.store.list(Some(&folder));
        let mut out = Vec::new();
        loop {
            let next = tokio::time::timeout(STORE_TIMEOUT, listing.next()).await;
            let meta = match next {
                Ok(Some(meta)) => meta.map_err(map_error)?,
                Ok(None) => break,
                Err(_) => return Err(StorageError::Unavailable("listing stalled".into())),
            };
            let name = decoded(&meta.location);
            if name.starts_with(&wanted) {
                out.push(Entry {
                    key: self.key_of(name),
                    size: meta.size,
                    modified: meta.last_modified.into(),
                });
            }
        }
        Ok(out)
    }

    /// A listing of at most one key: the bucket exists and answers.
    pub(super) async fn check(&self) -> StorageResult<()> {
        let probe =
            self.store.list(Some(&ObjectPath::from(self.prefix.as_str()))).take(1).try_collect::<Vec<_>>();
        match bounded(probe).await {
            Ok(_) => Ok(()),
            Err(StorageError::Unavailable(msg)) if msg.contains("NoSuchBucket") => {
                Err(StorageError::NotFound(format!("bucket '{}' does not exist", self.bucket)))
            }
            Err(e) => Err(e),
        }
    }
}
