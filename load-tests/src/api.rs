//! A Synkronus client speaking the synkronus dialect, as the real clients do, that records
//! every request's latency and outcome in the shared `Stats`.

use crate::stats::{Outcome, Stats};
use crate::target::BaseUrl;
use anyhow::{anyhow, bail, Result};
use bytes::Bytes;
use futures_util::StreamExt;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use reqwest::header::HeaderMap;
use reqwest::{Client, RequestBuilder};
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::Digest;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// Characters left unescaped in a path segment: RFC 3986 unreserved. `/` is escaped, which is
/// what real clients do for bundle paths (`forms%2Fhousehold%2Fschema.json`).
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

pub fn encode_segment(s: &str) -> String {
    utf8_percent_encode(s, SEGMENT).to_string()
}

/// A failed request. It has already been recorded in the stats.
#[derive(Debug)]
pub enum Fail {
    Status(u16, Bytes),
    Transport(String),
    Decode(String),
}

impl std::fmt::Display for Fail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fail::Status(s, body) => {
                let text = String::from_utf8_lossy(&body[..body.len().min(300)]);
                write!(f, "HTTP {s}: {text}")
            }
            Fail::Transport(e) => write!(f, "transport error: {e}"),
            Fail::Decode(e) => write!(f, "undecodable response: {e}"),
        }
    }
}

impl Fail {
    pub fn status(&self) -> Option<u16> {
        match self {
            Fail::Status(s, _) => Some(*s),
            _ => None,
        }
    }

    /// Whether backing off before the next request is polite (the server asked for it).
    pub fn is_backpressure(&self) -> bool {
        matches!(self.status(), Some(429) | Some(503))
    }
}

pub struct Resp {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The body's length as received: less than `body`'s when it came gzipped and was inflated.
    pub wire_bytes: u64,
}

/// Why a body could not be read.
enum BodyError {
    Transport(reqwest::Error),
    Inflate(std::io::Error),
}

/// The body of `r`. With `inflate`, a gzipped body is inflated chunk by chunk as it arrives, as
/// Android's and Go's HTTP stacks do, so that the client inflates one part while the server still
/// sends the next; the latency recorded then includes the inflating.
async fn read_body(r: reqwest::Response, inflate: bool) -> Result<(Bytes, u64), BodyError> {
    if !inflate || header_str(r.headers(), "content-encoding").as_deref() != Some("gzip") {
        let body = r.bytes().await.map_err(BodyError::Transport)?;
        let wire_bytes = body.len() as u64;
        return Ok((body, wire_bytes));
    }
    let mut wire_bytes = 0u64;
    let mut inflater = flate2::write::GzDecoder::new(Vec::new());
    let mut stream = r.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(BodyError::Transport)?;
        wire_bytes += chunk.len() as u64;
        std::io::Write::write_all(&mut inflater, &chunk).map_err(BodyError::Inflate)?;
    }
    let json = inflater.finish().map_err(BodyError::Inflate)?;
    Ok((Bytes::from(json), wire_bytes))
}

/// Result of a streamed download: never buffered, hashed on the fly.
pub struct Streamed {
    pub headers: HeaderMap,
    pub size: u64,
    pub sha256: String,
    pub newlines: u64,
}

impl Streamed {
    pub fn header(&self, name: &str) -> Option<String> {
        header_str(&self.headers, name)
    }
}

pub fn header_str(h: &HeaderMap, name: &str) -> Option<String> {
    h.get(name).and_then(|v| v.to_str().ok()).map(|s| s.to_string())
}

fn success(status: u16) -> bool {
    (200..300).contains(&status) || status == 304
}

fn transport_outcome(e: &reqwest::Error) -> Outcome {
    if e.is_timeout() {
        Outcome::Timeout
    } else {
        Outcome::Io
    }
}

pub struct Api {
    http: Client,
    pub base: BaseUrl,
    pub stats: Arc<Stats>,
    username: String,
    password: String,
    token: RwLock<Arc<str>>,
    /// Serialises re-logins so a burst of 401s after token expiry logs in once.
    relogin: tokio::sync::Mutex<()>,
}

#[derive(Debug, Deserialize)]
pub struct PulledRecord {
    pub observation_id: String,
    pub version: i64,
}

/// A record as a scoped device reads it: enough to tell whose district it belongs to.
#[derive(Debug, Deserialize)]
pub struct ScopedRecord {
    pub observation_id: String,
    pub version: i64,
    #[serde(default)]
    pub form_type: String,
    #[serde(default)]
    pub deleted: bool,
    /// `{}` in a tombstone; only the `district` field is read.
    #[serde(default)]
    pub data: Option<DistrictField>,
}

#[derive(Debug, Default, Deserialize)]
pub struct DistrictField {
    #[serde(default)]
    pub district: Option<String>,
}

impl ScopedRecord {
    pub fn district(&self) -> Option<&str> {
        self.data.as_ref().and_then(|d| d.district.as_deref())
    }
}

/// What the page checks (P2, P4) read of any record shape.
pub trait PagedRecord {
    fn id(&self) -> &str;
    fn version(&self) -> i64;
}

impl PagedRecord for PulledRecord {
    fn id(&self) -> &str {
        &self.observation_id
    }
    fn version(&self) -> i64 {
        self.version
    }
}

impl PagedRecord for ScopedRecord {
    fn id(&self) -> &str {
        &self.observation_id
    }
    fn version(&self) -> i64 {
        self.version
    }
}

#[derive(Debug, Deserialize)]
pub struct PullPage<R = PulledRecord> {
    pub current_version: i64,
    pub records: Vec<R>,
    pub change_cutoff: i64,
    pub has_more: bool,
}

/// A pull answer's bytes: as they crossed the wire, and as JSON.
pub struct PullBody {
    pub wire_bytes: u64,
    pub json: Bytes,
}

impl PullBody {
    /// The page's cursor fields and record count read from its bytes without parsing the records.
    /// The synkronus dialect writes `current_version` first and `change_cutoff` and `has_more` after
    /// the records, so the first and last occurrences of those keys are the page's own. Records are
    /// counted by their `"observation_id":` key, exact for the load tool's payloads (whose data
    /// never holds that key).
    pub fn scan(&self) -> Option<ScannedPage> {
        let text = std::str::from_utf8(&self.json).ok()?;
        let number_after = |at: usize| -> Option<i64> {
            let rest = &text[at..];
            let end = rest.find(|c: char| !c.is_ascii_digit() && c != '-').unwrap_or(rest.len());
            rest[..end].parse().ok()
        };
        const HEAD: &str = "\"current_version\":";
        const CUTOFF: &str = "\"change_cutoff\":";
        const MORE: &str = "\"has_more\":";
        let current_version = number_after(text.find(HEAD)? + HEAD.len())?;
        let change_cutoff = number_after(text.rfind(CUTOFF)? + CUTOFF.len())?;
        let has_more = text[text.rfind(MORE)? + MORE.len()..].starts_with("true");
        let records = text.matches("\"observation_id\":").count() as u64;
        Some(ScannedPage { current_version, change_cutoff, has_more, records })
    }
}

/// What [`PullBody::scan`] finds.
pub struct ScannedPage {
    pub current_version: i64,
    pub change_cutoff: i64,
    pub has_more: bool,
    pub records: u64,
}

#[derive(Debug, Deserialize)]
pub struct PushResult {
    pub current_version: i64,
    #[serde(default)]
    pub success_count: Option<u64>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct ManifestFile {
    pub path: String,
    pub hash: String,
    pub size: u64,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Manifest {
    pub version: String,
    pub hash: String,
    pub files: Vec<ManifestFile>,
}

impl Manifest {
    /// The bundle hash as section 9.4 defines it; the ETag must carry exactly this.
    pub fn computed_hash(&self) -> String {
        let mut h = sha2::Sha256::new();
        h.update(self.version.as_bytes());
        h.update(b"\n");
        for f in &self.files {
            h.update(format!("{}\t{}\t{}\n", f.path, f.hash, f.size).as_bytes());
        }
        hex::encode(h.finalize())
    }
}

pub enum ManifestAnswer {
    NotModified,
    Fresh { manifest: Manifest, etag: Option<String> },
}

#[derive(Debug, Deserialize)]
pub struct BundlePushResult {
    pub version: String,
    pub manifest: Manifest,
}

#[derive(Debug, Deserialize)]
pub struct UploadResult {
    #[serde(default)]
    pub sha256: Option<String>,
    #[serde(default)]
    pub size: Option<u64>,
    #[serde(default)]
    pub created: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub struct AttachmentOp {
    pub attachment_id: String,
}

#[derive(Debug, Deserialize)]
pub struct AttachmentManifest {
    pub current_version: i64,
    pub operations: Vec<AttachmentOp>,
}

impl Api {
    pub fn new(
        base: BaseUrl,
        username: String,
        password: String,
        stats: Arc<Stats>,
        max_connections: usize,
        request_timeout: Duration,
    ) -> Result<Api> {
        let http = Client::builder()
            .pool_max_idle_per_host(max_connections.max(1))
            // Below the server's keep-alive (actix-web closes idle connections after 5 s): a
            // connection reused just as the server closes it fails with an I/O error that says
            // nothing about the server's capacity.
            .pool_idle_timeout(Duration::from_secs(4))
            .connect_timeout(Duration::from_secs(10))
            .timeout(request_timeout)
            .tcp_nodelay(true)
            .user_agent(concat!("synkronus-load/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Api {
            http,
            base,
            stats,
            username,
            password,
            token: RwLock::new(Arc::from("")),
            relogin: tokio::sync::Mutex::new(()),
        })
    }

    /// Another user on the same connection pool and statistics, not yet logged in: the
    /// capacity scenario spreads its devices over a few users.
    pub fn as_user(&self, username: &str, password: &str) -> Api {
        Api {
            http: self.http.clone(),
            base: self.base.clone(),
            stats: self.stats.clone(),
            username: username.to_string(),
            password: password.to_string(),
            token: RwLock::new(Arc::from("")),
            relogin: tokio::sync::Mutex::new(()),
        }
    }

    /// `POST /users` (admin): creates a user with `role`; 409 (it exists) is fine.
    pub async fn create_user(&self, username: &str, password: &str, role: &str) -> Result<(), Fail> {
        let url = self.base.join("/users");
        let body = json!({"username": username, "password": password, "role": role});
        match self.exec_expecting("setup_user", true, Some(409), |c, _| c.post(&url).json(&body)).await {
            Ok(_) => Ok(()),
            Err(f) if f.status() == Some(409) => Ok(()),
            Err(f) => Err(f),
        }
    }

    fn token(&self) -> Arc<str> {
        self.token.read().map(|t| t.clone()).unwrap_or_else(|p| p.into_inner().clone())
    }

    fn set_token(&self, t: &str) {
        let mut g = self.token.write().unwrap_or_else(|p| p.into_inner());
        *g = Arc::from(t);
    }

    /// `POST /auth/login` (6.2). One token is shared by every simulated device of the run:
    /// logging each device in would trip the login rate limit (15) long before the sync paths.
    pub async fn login(&self) -> Result<()> {
        // Sent directly rather than through `exec`, whose 401 handling calls back into login.
        let url = self.base.join("/auth/login");
        let body = json!({"username": self.username, "password": self.password});
        let start = Instant::now();
        let r = match self.http.post(&url).json(&body).send().await {
            Ok(r) => r,
            Err(e) => {
                self.stats.record("login", start, transport_outcome(&e));
                bail!("login request to {url} failed: {e}");
            }
        };
        let status = r.status().as_u16();
        let bytes = r.bytes().await;
        let outcome = if success(status) { Outcome::Ok } else { Outcome::Status(status) };
        self.stats.record("login", start, outcome);
        let bytes = bytes?;
        if !success(status) {
            let text = String::from_utf8_lossy(&bytes[..bytes.len().min(300)]).to_string();
            bail!("login as {:?} failed: HTTP {status}: {text}", self.username);
        }
        let v: Value = serde_json::from_slice(&bytes)?;
        let token =
            v.get("token").and_then(Value::as_str).ok_or_else(|| anyhow!("login response has no token"))?;
        self.set_token(token);
        Ok(())
    }

    async fn relogin_if_stale(&self, stale: &str) -> bool {
        let _g = self.relogin.lock().await;
        if &*self.token() != stale {
            return true; // another task already refreshed it
        }
        self.stats.add("relogins", 1);
        self.login().await.is_ok()
    }

    /// Sends a request built by `build` (given the client and the bearer token), reads the
    /// whole body and records latency (send to last byte) under `kind`. A 401 on an
    /// authenticated request triggers one re-login and retry, because long runs outlive
    /// `JWT_TTL_SECONDS`.
    pub async fn exec<F>(&self, kind: &str, auth: bool, build: F) -> Result<Resp, Fail>
    where
        F: Fn(&Client, &str) -> RequestBuilder,
    {
        self.exec_expecting(kind, auth, None, build).await
    }

    /// `exec` for a request whose error status is the expected answer (a correctness probe):
    /// that status is still returned as `Err`, but is not counted as an error in the report.
    pub async fn exec_expecting<F>(
        &self,
        kind: &str,
        auth: bool,
        expected: Option<u16>,
        build: F,
    ) -> Result<Resp, Fail>
    where
        F: Fn(&Client, &str) -> RequestBuilder,
    {
        self.exec_reading(kind, auth, expected, false, build).await
    }

    /// `exec_expecting`, inflating a gzipped body as it arrives when `inflate` ([`read_body`]).
    async fn exec_reading<F>(
        &self,
        kind: &str,
        auth: bool,
        expected: Option<u16>,
        inflate: bool,
        build: F,
    ) -> Result<Resp, Fail>
    where
        F: Fn(&Client, &str) -> RequestBuilder,
    {
        let mut retried = false;
        loop {
            let token = self.token();
            let start = Instant::now();
            let mut rb = build(&self.http, &token);
            if auth {
                rb = rb.bearer_auth(&*token);
            }
            let r = match rb.send().await {
                Ok(r) => r,
                Err(e) => {
                    self.stats.record(kind, start, transport_outcome(&e));
                    return Err(Fail::Transport(e.to_string()));
                }
            };
            let status = r.status().as_u16();
            if status == 401 && auth && !retried {
                retried = true;
                let _ = r.bytes().await;
                if self.relogin_if_stale(&token).await {
                    continue;
                }
                self.stats.record(kind, start, Outcome::Status(401));
                return Err(Fail::Status(401, Bytes::new()));
            }
            let headers = r.headers().clone();
            let (body, wire_bytes) = match read_body(r, inflate && success(status)).await {
                Ok(read) => read,
                Err(BodyError::Transport(e)) => {
                    self.stats.record(kind, start, transport_outcome(&e));
                    return Err(Fail::Transport(e.to_string()));
                }
                Err(BodyError::Inflate(e)) => {
                    self.stats.record(kind, start, Outcome::Decode);
                    return Err(Fail::Decode(format!("gzip: {e}")));
                }
            };
            if success(status) {
                self.stats.record(kind, start, Outcome::Ok);
                return Ok(Resp { status, headers, body, wire_bytes });
            }
            let outcome = if expected == Some(status) { Outcome::Ok } else { Outcome::Status(status) };
            self.stats.record(kind, start, outcome);
            return Err(Fail::Status(status, body));
        }
    }

    /// Like `exec`, but streams the body: hashes it and counts bytes and newlines without
    /// holding it in memory (200 devices x 3 MB bundles, or a 1M-row export).
    pub async fn exec_stream<F>(&self, kind: &str, build: F) -> Result<Streamed, Fail>
    where
        F: Fn(&Client, &str) -> RequestBuilder,
    {
        self.exec_stream_as(kind, true, build).await
    }

    /// `exec_stream` with or without the bearer token (`--direct` talks to an object store).
    pub async fn exec_stream_as<F>(&self, kind: &str, auth: bool, build: F) -> Result<Streamed, Fail>
    where
        F: Fn(&Client, &str) -> RequestBuilder,
    {
        let mut retried = false;
        loop {
            let token = self.token();
            let start = Instant::now();
            let mut rb = build(&self.http, &token);
            if auth {
                rb = rb.bearer_auth(&*token);
            }
            let r = match rb.send().await {
                Ok(r) => r,
                Err(e) => {
                    self.stats.record(kind, start, transport_outcome(&e));
                    return Err(Fail::Transport(e.to_string()));
                }
            };
            let status = r.status().as_u16();
            if status == 401 && auth && !retried {
                retried = true;
                let _ = r.bytes().await;
                if self.relogin_if_stale(&token).await {
                    continue;
                }
                self.stats.record(kind, start, Outcome::Status(401));
                return Err(Fail::Status(401, Bytes::new()));
            }
            let headers = r.headers().clone();
            if !success(status) {
                let body = r.bytes().await.unwrap_or_default();
                self.stats.record(kind, start, Outcome::Status(status));
                return Err(Fail::Status(status, body));
            }
            let mut hasher = sha2::Sha256::new();
            let mut size = 0u64;
            let mut newlines = 0u64;
            let mut stream = r.bytes_stream();
            while let Some(chunk) = stream.next().await {
                match chunk {
                    Ok(c) => {
                        size += c.len() as u64;
                        newlines += c.iter().filter(|&&b| b == b'\n').count() as u64;
                        hasher.update(&c);
                    }
                    Err(e) => {
                        self.stats.record(kind, start, transport_outcome(&e));
                        return Err(Fail::Transport(e.to_string()));
                    }
                }
            }
            self.stats.record(kind, start, Outcome::Ok);
            return Ok(Streamed { headers, size, sha256: hex::encode(hasher.finalize()), newlines });
        }
    }

    /// Decodes a success body; an undecodable one is recorded as a `decode` error of `kind`.
    pub fn decode<T: serde::de::DeserializeOwned>(&self, kind: &str, body: &[u8]) -> Result<T, Fail> {
        serde_json::from_slice(body).map_err(|e| {
            // Count it as an error of the kind; the latency sample was already taken.
            self.stats.record(kind, Instant::now(), Outcome::Decode);
            Fail::Decode(e.to_string())
        })
    }

    /// `POST /sync/pull` in the synkronus dialect (`since.version` is the cursor, exactly what
    /// Formulus sends), answered as bytes: with `gzip`, the request accepts
    /// `Content-Encoding: gzip` and a gzipped answer is inflated as it arrives.
    pub async fn pull_body(
        &self,
        kind: &str,
        client_id: &str,
        since: i64,
        limit: u32,
        schema_types: &[String],
        gzip: bool,
    ) -> Result<PullBody, Fail> {
        let url = format!("{}?limit={limit}", self.base.join("/sync/pull"));
        let mut body = json!({"client_id": client_id, "since": {"version": since}});
        if !schema_types.is_empty() {
            body["schema_types"] = json!(schema_types);
        }
        let body = Bytes::from(serde_json::to_vec(&body).unwrap_or_default());
        let resp = self
            .exec_reading(kind, true, None, gzip, |c, _| {
                let rb = c.post(&url).header("content-type", "application/json").body(body.clone());
                if gzip {
                    rb.header("accept-encoding", "gzip")
                } else {
                    rb
                }
            })
            .await?;
        Ok(PullBody { wire_bytes: resp.wire_bytes, json: resp.body })
    }

    /// `POST /sync/push` with a fresh transmission id, as Formulus does on every attempt.
    pub async fn push(&self, kind: &str, client_id: &str, records: &[Value]) -> Result<PushResult, Fail> {
        let url = self.base.join("/sync/push");
        let body = json!({
            "transmission_id": uuid::Uuid::new_v4().to_string(),
            "client_id": client_id,
            "records": records,
        });
        let body = Bytes::from(serde_json::to_vec(&body).unwrap_or_default());
        let resp = self
            .exec(kind, true, |c, _| {
                c.post(&url).header("content-type", "application/json").body(body.clone())
            })
            .await?;
        self.decode(kind, &resp.body)
    }

    /// `POST /sync/push` of a body built by `RecordPool::push_body`.
    pub async fn push_raw(&self, kind: &str, body: Bytes) -> Result<PushResult, Fail> {
        let url = self.base.join("/sync/push");
        let resp = self
            .exec(kind, true, |c, _| {
                c.post(&url).header("content-type", "application/json").body(body.clone())
            })
            .await?;
        self.decode(kind, &resp.body)
    }

    /// `GET /app-bundle/manifest`, conditional when `etag` is given.
    pub async fn manifest(&self, kind: &str, etag: Option<&str>) -> Result<ManifestAnswer, Fail> {
        let url = self.base.join("/app-bundle/manifest");
        let resp = self
            .exec(kind, true, |c, _| {
                let rb = c.get(&url);
                match etag {
                    Some(t) => rb.header("if-none-match", t),
                    None => rb,
                }
            })
            .await?;
        if resp.status == 304 {
            return Ok(ManifestAnswer::NotModified);
        }
        let manifest = self.decode(kind, &resp.body)?;
        Ok(ManifestAnswer::Fresh { manifest, etag: header_str(&resp.headers, "etag") })
    }

    /// `GET /app-bundle/download/<percent-encoded path>[?version=V]`, streamed and hashed.
    pub async fn bundle_file(&self, kind: &str, path: &str, version: Option<&str>) -> Result<Streamed, Fail> {
        let mut url = self.base.join(&format!("/app-bundle/download/{}", encode_segment(path)));
        if let Some(v) = version {
            url.push_str(&format!("?version={}", encode_segment(v)));
        }
        self.exec_stream(kind, |c, _| c.get(&url)).await
    }

    /// `POST /app-bundle/push` (multipart part `bundle`), optionally activating.
    pub async fn bundle_push(&self, zip: Bytes, activate: bool) -> Result<BundlePushResult, Fail> {
        let url = self.base.join("/app-bundle/push");
        let resp = self
            .exec("bundle_push", true, |c, _| {
                let part = reqwest::multipart::Part::stream_with_length(zip.clone(), zip.len() as u64)
                    .file_name("bundle.zip")
                    .mime_str("application/zip")
                    .unwrap_or_else(|_| reqwest::multipart::Part::bytes(zip.to_vec()));
                let form = reqwest::multipart::Form::new()
                    .part("bundle", part)
                    .text("activate", if activate { "true" } else { "false" });
                c.post(&url).multipart(form)
            })
            .await?;
        self.decode("bundle_push", &resp.body)
    }

    /// `POST /app-bundle/switch/{version}`.
    pub async fn bundle_switch(&self, version: &str) -> Result<(), Fail> {
        let url = self.base.join(&format!("/app-bundle/switch/{}", encode_segment(version)));
        self.exec("switch", true, |c, _| c.post(&url)).await.map(|_| ())
    }

    /// `PUT /attachments/{id}` as multipart part `file`, which is what real clients send.
    pub async fn upload_attachment(&self, kind: &str, id: &str, bytes: Bytes) -> Result<UploadResult, Fail> {
        self.upload_attachment_expecting(kind, id, bytes, None).await
    }

    /// An upload whose expected answer may be an error status (409 for different bytes).
    pub async fn upload_attachment_expecting(
        &self,
        kind: &str,
        id: &str,
        bytes: Bytes,
        expected: Option<u16>,
    ) -> Result<UploadResult, Fail> {
        let url = self.base.join(&format!("/attachments/{}", encode_segment(id)));
        let resp = self
            .exec_expecting(kind, true, expected, |c, _| {
                let part = reqwest::multipart::Part::stream_with_length(bytes.clone(), bytes.len() as u64)
                    .file_name(id.to_string());
                c.put(&url).multipart(reqwest::multipart::Form::new().part("file", part))
            })
            .await?;
        self.decode(kind, &resp.body)
    }

    /// `GET /attachments/{id}`, streamed and hashed.
    pub async fn download_attachment(&self, kind: &str, id: &str) -> Result<Streamed, Fail> {
        let url = self.base.join(&format!("/attachments/{}", encode_segment(id)));
        self.exec_stream(kind, |c, _| c.get(&url)).await
    }

    /// `POST /attachments/manifest` (the Synkronus 1.0 shape Formulus uses).
    pub async fn attachment_manifest(&self, client_id: &str, since: i64) -> Result<AttachmentManifest, Fail> {
        let url = self.base.join("/attachments/manifest");
        let body = json!({"client_id": client_id, "since_version": since});
        let resp = self.exec("attachment_manifest", true, |c, _| c.post(&url).json(&body)).await?;
        self.decode("attachment_manifest", &resp.body)
    }

    /// `GET /data/export?format=F`, streamed. An export of a million rows can legitimately
    /// take minutes, so the per-request timeout is replaced by `timeout`.
    pub async fn export(&self, format: &str, timeout: Duration) -> Result<Streamed, Fail> {
        let url = format!("{}?format={format}", self.base.join("/data/export"));
        self.exec_stream("export", |c, _| c.get(&url).timeout(timeout)).await
    }

    /// `PUT /users/{username}` (admin) with `{"attributes": attributes}` (§20.1).
    pub async fn set_attributes(&self, username: &str, attributes: &Value) -> Result<(), Fail> {
        let url = self.base.join(&format!("/users/{}", encode_segment(username)));
        let body = json!({ "attributes": attributes });
        self.exec("setup_user", true, |c, _| c.put(&url).json(&body)).await.map(|_| ())
    }

    /// `PUT /admin/scopes` (§20.2): the new version, being prepared.
    pub async fn put_scopes(&self, rules: &Value) -> Result<i64, Fail> {
        let url = self.base.join("/admin/scopes");
        let body = json!({ "rules": rules });
        let resp = self.exec("scopes_put", true, |c, _| c.put(&url).json(&body)).await?;
        let v: Value = self.decode("scopes_put", &resp.body)?;
        v["version"].as_i64().ok_or_else(|| Fail::Decode("PUT /admin/scopes answered no version".into()))
    }

    /// `DELETE /admin/scopes`: back to no set (prepared like any other version).
    pub async fn delete_scopes(&self) -> Result<(), Fail> {
        let url = self.base.join("/admin/scopes");
        self.exec("scopes_delete", true, |c, _| c.delete(&url)).await.map(|_| ())
    }

    /// `GET /admin/scopes/status`.
    pub async fn scope_status(&self) -> Result<Value, Fail> {
        let url = self.base.join("/admin/scopes/status");
        let resp = self.exec("scopes_status", true, |c, _| c.get(&url)).await?;
        self.decode("scopes_status", &resp.body)
    }

    /// `GET /admin/scopes/preview?user=U`: the live records U receives under the set in force.
    pub async fn scope_preview_total(&self, username: &str) -> Result<Option<u64>, Fail> {
        let url = format!("{}?user={}", self.base.join("/admin/scopes/preview"), encode_segment(username));
        let resp = self.exec("scopes_preview", true, |c, _| c.get(&url)).await?;
        let v: Value = self.decode("scopes_preview", &resp.body)?;
        Ok(v["active"]["total"].as_u64())
    }

    /// `GET /status` (observation count, head).
    pub async fn status(&self) -> Result<Value, Fail> {
        let url = self.base.join("/status");
        let resp = self.exec("status", true, |c, _| c.get(&url)).await?;
        self.decode("status", &resp.body)
    }

    /// The current head, learned the way a client does: an empty push is valid and answers
    /// with `current_version` (17.2).
    pub async fn head(&self, client_id: &str) -> Result<i64> {
        match self.push("setup", client_id, &[]).await {
            Ok(r) => Ok(r.current_version),
            Err(e) => bail!("empty push to learn the head failed: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A response whose body arrives in `pieces` of 7 bytes, with `Content-Encoding: gzip`.
    fn gzipped_response(packed: &[u8]) -> reqwest::Response {
        let pieces: Vec<std::io::Result<Bytes>> =
            packed.chunks(7).map(|piece| Ok(Bytes::copy_from_slice(piece))).collect();
        let body = reqwest::Body::wrap_stream(futures_util::stream::iter(pieces));
        http::Response::builder().header("content-encoding", "gzip").body(body).expect("response").into()
    }

    #[tokio::test]
    async fn a_gzipped_body_is_inflated_as_it_arrives_and_counted_as_sent() {
        let json = br#"{"observation_id":"a","data":{"n":1}},"#.repeat(200);
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(&json).expect("gzip");
        let packed = encoder.finish().expect("gzip");

        let Ok((body, wire_bytes)) = read_body(gzipped_response(&packed), true).await else {
            panic!("the body should inflate");
        };
        assert_eq!(body.as_ref(), json.as_slice());
        assert_eq!(wire_bytes, packed.len() as u64);

        let Ok((body, wire_bytes)) = read_body(gzipped_response(&packed), false).await else {
            panic!("the body should be read as it came");
        };
        assert_eq!(body.as_ref(), packed.as_slice());
        assert_eq!(wire_bytes, packed.len() as u64);

        let cut = &packed[..packed.len() - 12];
        assert!(matches!(read_body(gzipped_response(cut), true).await, Err(BodyError::Inflate(_))));
    }

    #[test]
    fn a_raw_page_is_read_from_its_outer_fields() {
        // A record's data holding the page's own keys must not be taken for them.
        let page = br#"{"current_version":1200,"records":[{"observation_id":"a","data":{"change_cutoff":5,"has_more":false},"version":7},{"observation_id":"b","data":{},"version":9}],"change_cutoff":9,"has_more":true,"next_page_token":"x","sync_format_version":"1.0","repository_generation":1}"#;
        let body = PullBody { wire_bytes: 10, json: Bytes::from_static(page) };
        let scanned = body.scan().unwrap();
        assert_eq!(
            (scanned.current_version, scanned.change_cutoff, scanned.has_more, scanned.records),
            (1200, 9, true, 2)
        );
        let last = br#"{"current_version":9,"records":[],"change_cutoff":9,"has_more":false,"sync_format_version":"1.0","repository_generation":1}"#;
        let scanned = PullBody { wire_bytes: 0, json: Bytes::from_static(last) }.scan().unwrap();
        assert_eq!((scanned.change_cutoff, scanned.has_more, scanned.records), (9, false, 0));
        assert!(PullBody { wire_bytes: 0, json: Bytes::from_static(b"{}") }.scan().is_none());
    }

    #[test]
    fn segments_are_fully_encoded() {
        assert_eq!(encode_segment("forms/household/schema.json"), "forms%2Fhousehold%2Fschema.json");
        assert_eq!(encode_segment("photo 1.jpg"), "photo%201.jpg");
        assert_eq!(encode_segment("20250625-120000"), "20250625-120000");
        assert_eq!(encode_segment("a%b"), "a%25b");
    }

    #[test]
    fn manifest_hash_follows_contract() {
        let m = Manifest {
            version: "20250625-120000".into(),
            hash: String::new(),
            files: vec![ManifestFile { path: "app/index.html".into(), hash: "ab".into(), size: 3 }],
        };
        let expected = crate::payload::sha256_hex(b"20250625-120000\napp/index.html\tab\t3\n");
        assert_eq!(m.computed_hash(), expected);
    }

    #[test]
    fn pull_page_ignores_data() {
        let body = br#"{"current_version":5,"records":[{"observation_id":"a","version":4,
            "data":{"big":[1,2,3]},"form_type":"x"}],"change_cutoff":4,"has_more":true,
            "next_page_token":"t","sync_format_version":"1.0"}"#;
        let p: PullPage = serde_json::from_slice(body).unwrap();
        assert_eq!(p.records[0].observation_id, "a");
        assert!(p.has_more);
    }
}
