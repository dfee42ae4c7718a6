//! Scenario plumbing shared by every subcommand: the run context, bounds, and the sync
//! building blocks (seeding, checked pushes, checked pull loops).

pub mod attachments;
pub mod bundle_switch;
pub mod capacity;
pub mod db_ceiling;
pub mod export_load;
pub mod fleet;
pub mod initial_sync;
pub mod push_storm;
pub mod scale;
pub mod scope;
pub mod scope_cost;
pub mod seed;
pub mod stats_latency;

use crate::api::{Api, Fail, PagedRecord, PullPage, PushResult, ScannedPage};
use crate::cli::Common;
use crate::payload;
use crate::progress::Progress;
use crate::stats::Stats;
use rand::SeedableRng;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Everything a scenario needs; shared by all its tasks.
pub struct Ctx {
    pub api: Arc<Api>,
    pub stats: Arc<Stats>,
    pub common: Common,
    pub progress: Progress,
    /// Unique per run, so ids and form types of different runs never collide.
    pub run: String,
    /// Seeded ids handed out so far: each seeding (scale seeds once a step) continues after the
    /// last, so it adds records instead of overwriting the earlier ones.
    seeded: AtomicU64,
    results: Mutex<BTreeMap<String, Value>>,
    details: Mutex<BTreeMap<String, Value>>,
    sections: Mutex<Vec<String>>,
    notes: Mutex<Vec<String>>,
    correctness: AtomicBool,
}

impl Ctx {
    pub fn new(api: Arc<Api>, stats: Arc<Stats>, common: Common, progress: Progress) -> Ctx {
        Ctx {
            api,
            stats,
            common,
            progress,
            run: payload::run_tag(),
            seeded: AtomicU64::new(0),
            results: Mutex::new(BTreeMap::new()),
            details: Mutex::new(BTreeMap::new()),
            sections: Mutex::new(Vec::new()),
            notes: Mutex::new(Vec::new()),
            correctness: AtomicBool::new(false),
        }
    }

    /// A headline number for the report's results table.
    pub fn result(&self, key: &str, v: impl Into<Value>) {
        let v = v.into();
        // Round floats so the report stays readable; JSON keeps 3 decimals.
        let v = match v.as_f64() {
            Some(f) if v.is_f64() => Value::from(crate::report::round3(f)),
            _ => v,
        };
        self.results.lock().unwrap_or_else(|p| p.into_inner()).insert(key.to_string(), v);
    }

    pub fn note(&self, s: impl Into<String>) {
        self.notes.lock().unwrap_or_else(|p| p.into_inner()).push(s.into());
    }

    /// Marks the run as a correctness run: its violations must be 0.
    pub fn checks_correctness(&self) {
        self.correctness.store(true, Ordering::Relaxed);
    }

    /// Structured figures for the JSON report only (too big for the results table).
    pub fn detail(&self, key: &str, v: Value) {
        self.details.lock().unwrap_or_else(|p| p.into_inner()).insert(key.to_string(), v);
    }

    /// Replaces the scenario's own markdown sections of the report.
    pub fn set_sections(&self, sections: Vec<String>) {
        *self.sections.lock().unwrap_or_else(|p| p.into_inner()) = sections;
    }

    pub fn take_results(&self) -> Taken {
        Taken {
            results: self.results.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            details: self.details.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            sections: self.sections.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            notes: self.notes.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            correctness: self.correctness.load(Ordering::Relaxed),
        }
    }

    /// The timed-phase length: `--duration` or the scenario's default.
    pub fn duration(&self, default_secs: u64) -> Duration {
        Duration::from_secs(self.common.duration.unwrap_or(default_secs))
    }

    pub fn rng(&self) -> rand::rngs::StdRng {
        rand::rngs::StdRng::from_entropy()
    }

    /// Hands out `n` seeded ids: the index of the first, after every id handed out before.
    fn seed_ids(&self, n: u64) -> u64 {
        self.seeded.fetch_add(n, Ordering::Relaxed)
    }
}

/// What a scenario leaves for its report.
pub struct Taken {
    pub results: BTreeMap<String, Value>,
    pub details: BTreeMap<String, Value>,
    pub sections: Vec<String>,
    pub notes: Vec<String>,
    pub correctness: bool,
}

/// Time and count bounds of a phase. Workers call `take()` before each request.
pub struct Bounds {
    deadline: Instant,
    remaining: Option<AtomicU64>,
    stopped: AtomicBool,
}

impl Bounds {
    pub fn new(duration: Duration, requests: Option<u64>) -> Bounds {
        Bounds {
            deadline: Instant::now() + duration,
            remaining: requests.map(AtomicU64::new),
            stopped: AtomicBool::new(false),
        }
    }

    /// Whether one more request may start.
    pub fn take(&self) -> bool {
        if self.stopped.load(Ordering::Relaxed) || Instant::now() >= self.deadline {
            return false;
        }
        match &self.remaining {
            None => true,
            Some(r) => r.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1)).is_ok(),
        }
    }

    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Relaxed) || Instant::now() >= self.deadline
    }
}

/// Sleeps after a failure the server flagged as overload (429/503), honouring the spirit of
/// `Retry-After` without stalling the run for long.
pub async fn backoff(f: &Fail) {
    if f.is_backpressure() {
        tokio::time::sleep(Duration::from_millis(500)).await;
    } else if matches!(f, Fail::Transport(_)) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Checks one successful push: every record counted, and the head strictly above this
/// device's previous head (new change_ids are assigned after the previous commit, and the
/// reported head is at least every one of them: 8.3).
pub fn check_push(stats: &Stats, res: &PushResult, sent: usize, last_head: &mut i64) {
    if let Some(n) = res.success_count {
        if n != sent as u64 {
            stats.violation("push_success_count", format!("sent {sent}, success_count {n}"));
        }
    }
    if sent > 0 && res.current_version <= *last_head {
        stats.violation(
            "push_head_not_increasing",
            format!("head {} after previous head {}", res.current_version, *last_head),
        );
    }
    *last_head = (*last_head).max(res.current_version);
}

/// State of one incremental pull loop, with the ordering checks of 8.2 (P2, P3, P4).
pub struct PullLoop {
    pub cursor: i64,
    pub pages: u64,
    pub records: u64,
}

/// How a pull loop asks for and reads its pages.
#[derive(Debug, Clone, Copy, Default)]
pub struct PullMode {
    /// Accept `Content-Encoding: gzip` and inflate the answers.
    pub gzip: bool,
    /// Leave the records unparsed (see `PullBody::scan`): no ids, no per-record checks.
    pub raw: bool,
}

pub struct PulledPage {
    /// Empty in raw mode.
    pub ids: Vec<(String, i64)>,
    pub records: u64,
    pub wire_bytes: u64,
    pub json_bytes: u64,
    pub done: bool,
}

impl PullLoop {
    pub fn new(cursor: i64) -> PullLoop {
        PullLoop { cursor, pages: 0, records: 0 }
    }

    /// Fetches one page as the real clients do and advances the cursor. `Err` is a failed
    /// request (already recorded).
    pub async fn page(
        &mut self,
        api: &Api,
        kind: &str,
        client_id: &str,
        limit: u32,
        types: &[String],
    ) -> Result<PulledPage, Fail> {
        self.page_as(api, kind, client_id, limit, types, PullMode::default()).await
    }

    /// [`PullLoop::page`] read the way `mode` says.
    pub async fn page_as(
        &mut self,
        api: &Api,
        kind: &str,
        client_id: &str,
        limit: u32,
        types: &[String],
        mode: PullMode,
    ) -> Result<PulledPage, Fail> {
        let after = self.cursor;
        let body = api.pull_body(kind, client_id, after, limit, types, mode.gzip).await?;
        let (page, ids) = if mode.raw {
            let Some(page) = body.scan() else {
                api.stats.violation(
                    "unreadable_pull_page",
                    format!("the page after {after} lacks its cursor fields"),
                );
                return Err(Fail::Decode("a pull page without its cursor fields".into()));
            };
            (page, Vec::new())
        } else {
            let page: PullPage = api.decode(kind, &body.json)?;
            check_records(&api.stats, after, &page);
            let scanned = ScannedPage {
                current_version: page.current_version,
                change_cutoff: page.change_cutoff,
                has_more: page.has_more,
                records: page.records.len() as u64,
            };
            (scanned, page.records.into_iter().map(|r| (r.observation_id, r.version)).collect())
        };
        let done = self.advance(&api.stats, after, &page);
        Ok(PulledPage {
            ids,
            records: page.records,
            wire_bytes: body.wire_bytes,
            json_bytes: body.json.len() as u64,
            done,
        })
    }

    /// One page decoded into records of shape `R` (a scoped device reads each record's form
    /// type, deletion and district), with the same checks; the records and whether the loop is
    /// done.
    pub async fn page_of<R>(
        &mut self,
        api: &Api,
        kind: &str,
        client_id: &str,
        limit: u32,
        types: &[String],
    ) -> Result<(Vec<R>, bool), Fail>
    where
        R: serde::de::DeserializeOwned + PagedRecord,
    {
        let after = self.cursor;
        let body = api.pull_body(kind, client_id, after, limit, types, false).await?;
        let page: PullPage<R> = api.decode(kind, &body.json)?;
        check_records(&api.stats, after, &page);
        let scanned = ScannedPage {
            current_version: page.current_version,
            change_cutoff: page.change_cutoff,
            has_more: page.has_more,
            records: page.records.len() as u64,
        };
        let done = self.advance(&api.stats, after, &scanned);
        Ok((page.records, done))
    }

    /// The checks every page gets (P3, P4) and the next cursor (§8.2 rule 5); true when done.
    fn advance(&mut self, stats: &Stats, after: i64, page: &ScannedPage) -> bool {
        if page.change_cutoff > page.current_version {
            stats.violation(
                "cutoff_above_head",
                format!("change_cutoff {} > current_version {}", page.change_cutoff, page.current_version),
            );
        }
        self.pages += 1;
        self.records += page.records;
        stats.add("records_pulled", page.records);
        if page.has_more {
            if page.change_cutoff <= after {
                // P3: without progress the loop would spin forever; report and stop.
                stats.violation(
                    "has_more_without_progress",
                    format!("has_more with change_cutoff {} <= after {after}", page.change_cutoff),
                );
                true
            } else {
                self.cursor = page.change_cutoff;
                false
            }
        } else {
            // Rule 6: with nothing more, the next cursor is the snapshot head.
            self.cursor = page.current_version.max(after);
            true
        }
    }
}

/// P2 and P4 on a decoded page: versions strictly increase from the cursor, none above the head,
/// and the cutoff is the last record's version.
fn check_records<R: PagedRecord>(stats: &Stats, after: i64, page: &PullPage<R>) {
    let mut prev = after;
    for r in &page.records {
        if r.version() <= prev {
            stats.violation(
                "change_id_not_increasing",
                format!("{} has version {} after {prev} (cursor {after})", r.id(), r.version()),
            );
        }
        if r.version() > page.current_version {
            stats.violation(
                "record_above_head",
                format!("{} version {} > current_version {}", r.id(), r.version(), page.current_version),
            );
        }
        prev = prev.max(r.version());
    }
    if let Some(last) = page.records.last() {
        if page.change_cutoff != last.version() {
            stats.violation(
                "cutoff_not_last_record",
                format!("change_cutoff {} but last record version {}", page.change_cutoff, last.version()),
            );
        }
    }
}

/// Outcome of a bulk seeding phase.
pub struct SeedOutcome {
    pub records: u64,
    pub secs: f64,
}

/// What one kind of seeded record looks like: its form type and fields its `data` always holds
/// (a `district`, say, that scope rules match on).
#[derive(Debug, Clone)]
pub struct SeedKind {
    pub form_type: String,
    pub fields: Vec<(String, Value)>,
}

impl SeedKind {
    pub fn plain(form_type: &str) -> SeedKind {
        SeedKind { form_type: form_type.to_string(), fields: Vec::new() }
    }
}

/// Pushes `total` fresh records in batches of `batch` from `concurrency` workers, batch `b`
/// under form type `b % form_types.len()`. Failed batches are retried (a few times) with a new
/// transmission id, which is harmless because pushes are upserts (8.6).
pub async fn seed_records(
    ctx: &Arc<Ctx>,
    kind: &str,
    total: u64,
    batch: u64,
    concurrency: u64,
    payload_bytes: u64,
    form_types: &[String],
) -> SeedOutcome {
    let kinds: Vec<SeedKind> = form_types.iter().map(|t| SeedKind::plain(t)).collect();
    seed_kinds(ctx, kind, total, batch, concurrency, payload_bytes, &kinds).await
}

/// [`seed_records`] with batch `b` of kind `b % kinds.len()`.
pub async fn seed_kinds(
    ctx: &Arc<Ctx>,
    kind: &str,
    total: u64,
    batch: u64,
    concurrency: u64,
    payload_bytes: u64,
    kinds: &[SeedKind],
) -> SeedOutcome {
    let batches = total.div_ceil(batch);
    let first_id = ctx.seed_ids(total);
    let next = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    ctx.progress.counted(kind, total, "records");
    let mut set = tokio::task::JoinSet::new();
    for w in 0..concurrency {
        let (ctx, next, done) = (ctx.clone(), next.clone(), done.clone());
        let (kind, kinds) = (kind.to_string(), kinds.to_vec());
        set.spawn(async move {
            let mut rng = ctx.rng();
            // Many kinds (100 districts) need fewer variants each to stay small.
            let variants = (1600 / kinds.len().max(1)).clamp(2, 16);
            let pools: Vec<payload::RecordPool> = kinds
                .iter()
                .map(|k| {
                    payload::RecordPool::with_fields(
                        &k.form_type,
                        payload_bytes as usize,
                        variants,
                        &k.fields,
                        &mut rng,
                    )
                })
                .collect();
            let client_id = format!("load-{}-seed{w}", ctx.run);
            let mut last_head = 0i64;
            loop {
                let b = next.fetch_add(1, Ordering::Relaxed);
                if b >= batches {
                    break;
                }
                let first = b * batch;
                let n = batch.min(total - first);
                let Some(pool) = pools.get((b % pools.len().max(1) as u64) as usize) else { break };
                // `s` keeps seeded ids apart from the per-device ids of storms.
                let ids: Vec<String> = (first_id + first..first_id + first + n)
                    .map(|i| format!("obs_{}_s_{i}", ctx.run))
                    .collect();
                let mut ok = false;
                for _attempt in 0..5 {
                    let tx = uuid::Uuid::new_v4().to_string();
                    let body = bytes::Bytes::from(pool.push_body(&tx, &client_id, &ids, &mut rng));
                    match ctx.api.push_raw(&kind, body).await {
                        Ok(res) => {
                            check_push(&ctx.stats, &res, ids.len(), &mut last_head);
                            ok = true;
                            break;
                        }
                        Err(f) => backoff(&f).await,
                    }
                }
                if ok {
                    done.fetch_add(n, Ordering::Relaxed);
                    ctx.stats.add("records_seeded", n);
                    ctx.progress.inc(n);
                } else {
                    ctx.stats.add("records_seed_failed", n);
                }
            }
        });
    }
    while set.join_next().await.is_some() {}
    SeedOutcome { records: done.load(Ordering::Relaxed), secs: start.elapsed().as_secs_f64() }
}

/// `n` form types named `prefix_00`, `prefix_01`, ... (just `prefix` when `n` is 1), so the
/// seeded records can be pulled one type among many (the typed pull of `scale`).
pub fn form_type_names(prefix: &str, n: u64) -> Vec<String> {
    match n {
        0 | 1 => vec![prefix.to_string()],
        n => (0..n).map(|i| format!("{prefix}_{i:02}")).collect(),
    }
}

/// Records per second, guarding against a zero-length phase.
pub fn rate(n: f64, secs: f64) -> f64 {
    if secs > 0.0 {
        n / secs
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_count_and_stop() {
        let b = Bounds::new(Duration::from_secs(60), Some(3));
        assert!(b.take() && b.take() && b.take());
        assert!(!b.take());
        let b = Bounds::new(Duration::from_secs(60), None);
        assert!(b.take());
        b.stop();
        assert!(!b.take());
        let b = Bounds::new(Duration::ZERO, None);
        assert!(!b.take());
    }

    #[test]
    fn push_checks() {
        let s = Stats::new();
        let mut head = 0;
        check_push(&s, &PushResult { current_version: 10, success_count: Some(5) }, 5, &mut head);
        assert_eq!(head, 10);
        check_push(&s, &PushResult { current_version: 10, success_count: Some(4) }, 5, &mut head);
        assert_eq!(s.violations_total(), 2);
        assert_eq!(rate(10.0, 0.0), 0.0);
        assert_eq!(rate(10.0, 2.0), 5.0);
    }

    #[tokio::test]
    async fn each_seeding_gets_ids_of_its_own() {
        use clap::Parser;
        let cli =
            crate::cli::Cli::try_parse_from(["synkronus-load", "--no-progress", "push-storm"]).expect("cli");
        let base = crate::target::check_base_url(&cli.common.base_url, false).expect("base url");
        let stats = Arc::new(Stats::new());
        let api =
            Api::new(base, "u".into(), "p".into(), stats.clone(), 1, Duration::from_secs(1)).expect("api");
        let ctx = Ctx::new(Arc::new(api), stats.clone(), cli.common, Progress::new(false, stats));
        // scale seeds to 100k, then to 1M: the second seeding must not start over at 0.
        assert_eq!(ctx.seed_ids(100_000), 0);
        assert_eq!(ctx.seed_ids(900_000), 100_000);
        assert_eq!(ctx.seed_ids(1), 1_000_000);
    }
}
