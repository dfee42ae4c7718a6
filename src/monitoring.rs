//! Prometheus metrics (docs/api.md §14): one process-wide recorder and one-line hooks for the places that
//! count things. A leaf: it knows no state and runs no query; the values sampled when `/metrics`
//! is scraped are read by the metrics handler and set through the gauges here.

use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::domain::sync::Dialect;

const LATENCY_BUCKETS: &[f64] =
    &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
const GROUP_COMMIT_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

/// The recorder, installed on first use. Several servers in one process (the tests) share it.
pub fn handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Full("synkronus_http_request_duration_seconds".into()),
                LATENCY_BUCKETS,
            )
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full("synkronus_changelog_group_commit_size".into()),
                    GROUP_COMMIT_BUCKETS,
                )
            })
            .map(PrometheusBuilder::build_recorder)
            .unwrap_or_else(|_| PrometheusBuilder::new().build_recorder());
        let handle = recorder.handle();
        // Fails only when another recorder is installed; the handle then renders what this one saw.
        let _ = metrics::set_global_recorder(recorder);
        handle
    })
}

pub fn http_request(method: &str, route: &str, status: u16, elapsed: Duration) {
    let (method, route) = (method.to_string(), route.to_string());
    counter!("synkronus_http_requests_total", "method" => method.clone(), "route" => route.clone(),
        "status" => status.to_string())
    .increment(1);
    histogram!("synkronus_http_request_duration_seconds", "method" => method, "route" => route)
        .record(elapsed.as_secs_f64());
}

fn dialect_label(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Synkronus => "synkronus",
        Dialect::Spec => "spec",
        Dialect::Camel => "camel",
    }
}

/// A push answered with 200: a replay stores nothing, so it counts as a replay only. `refused`:
/// its records refused as `OUT_OF_SCOPE` (docs/api.md §20.4), which a device keeps sending
/// when the set takes from its user records it was editing.
pub fn push_answered(dialect: Dialect, (records, refused): (usize, usize), replayed: bool) {
    if replayed {
        counter!("synkronus_sync_push_replays_total").increment(1);
    } else {
        counter!("synkronus_sync_pushed_records_total", "dialect" => dialect_label(dialect))
            .increment(records as u64);
        counter!("synkronus_sync_out_of_scope_records_total").increment(refused as u64);
    }
}

/// A pull page started, read `scoped` (docs/api.md §20.3) or as every change.
pub fn pull_page_read(scoped: bool) {
    counter!("synkronus_sync_pull_pages_total", "read" => if scoped { "scoped" } else { "unscoped" })
        .increment(1);
}

pub fn records_pulled(dialect: Dialect, records: usize) {
    counter!("synkronus_sync_pulled_records_total", "dialect" => dialect_label(dialect))
        .increment(records as u64);
}

pub fn group_commit(pushes: usize) {
    histogram!("synkronus_changelog_group_commit_size").record(pushes as f64);
}

/// A group written ahead of the commit before it: committed so, or rolled back and committed the
/// usual way (`outcome` is `committed` or `redone`).
pub fn commit_ahead(committed: bool) {
    let outcome = if committed { "committed" } else { "redone" };
    counter!("synkronus_changelog_commits_written_ahead_total", "outcome" => outcome).increment(1);
}

pub fn changelog_head(head: i64) {
    gauge!("synkronus_changelog_head").set(head as f64);
}

pub fn attachment_uploaded(bytes: u64) {
    counter!("synkronus_attachment_bytes_uploaded_total").increment(bytes);
}

/// `limit` is `login`, `user` or `export`.
pub fn rate_limited(limit: &'static str) {
    counter!("synkronus_rate_limited_total", "limit" => limit).increment(1);
}

/// One routed read (docs/api.md §18.3), by the database that answered: `primary` or `replica`.
pub fn db_read(target: &'static str) {
    counter!("synkronus_db_reads_total", "target" => target).increment(1);
}

/// A read meant for a replica that the primary answered: `behind` (the replica did not reach the
/// client's cursor in time) or `error` (it failed).
pub fn db_read_fallback(reason: &'static str) {
    counter!("synkronus_db_read_fallbacks_total", "reason" => reason).increment(1);
}

/// A replica's rotation state and replay lag as the checker last saw them.
pub fn replica_state(replica: &str, in_rotation: bool, lag_seconds: Option<f64>) {
    gauge!("synkronus_db_replica_in_rotation", "replica" => replica.to_string()).set(if in_rotation {
        1.0
    } else {
        0.0
    });
    if let Some(lag) = lag_seconds {
        gauge!("synkronus_db_replica_lag_seconds", "replica" => replica.to_string()).set(lag);
    }
}

/// The scope set in force (0: none) and, while one is being prepared, its version and how many
/// records its scan has read of how many (all 0 when none is), read at scrape time.
pub fn scope_sets(active_version: i64, preparing: Option<(i64, i64, i64)>) {
    let (version, scanned, to_scan) = preparing.unwrap_or_default();
    gauge!("synkronus_scope_set_version", "state" => "active").set(active_version as f64);
    gauge!("synkronus_scope_set_version", "state" => "preparing").set(version as f64);
    gauge!("synkronus_scope_preparation_records", "progress" => "scanned").set(scanned as f64);
    gauge!("synkronus_scope_preparation_records", "progress" => "to_scan").set(to_scan as f64);
}

/// A request refused with 503 because `MAX_INFLIGHT_BODY_BYTES` stayed in use for its whole wait.
pub fn body_budget_refused() {
    counter!("synkronus_body_budget_refused_total").increment(1);
}

/// Bytes of `MAX_INFLIGHT_BODY_BYTES` held by requests, read at scrape time.
pub fn body_budget_in_use(bytes: usize) {
    gauge!("synkronus_body_budget_in_use_bytes").set(bytes as f64);
}

/// Counts one running export for as long as it lives.
pub struct ExportRunning(());

pub fn export_running() -> ExportRunning {
    gauge!("synkronus_exports_running").increment(1.0);
    ExportRunning(())
}

impl Drop for ExportRunning {
    fn drop(&mut self) {
        gauge!("synkronus_exports_running").decrement(1.0);
    }
}

/// Every series exists from the start, so dashboards and alerts see zeros rather than gaps.
fn describe_defaults() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        for dialect in ["synkronus", "spec", "camel"] {
            counter!("synkronus_sync_pushed_records_total", "dialect" => dialect).increment(0);
            counter!("synkronus_sync_pulled_records_total", "dialect" => dialect).increment(0);
        }
        for limit in ["login", "user", "export"] {
            counter!("synkronus_rate_limited_total", "limit" => limit).increment(0);
        }
        counter!("synkronus_sync_push_replays_total").increment(0);
        counter!("synkronus_sync_out_of_scope_records_total").increment(0);
        for read in ["scoped", "unscoped"] {
            counter!("synkronus_sync_pull_pages_total", "read" => read).increment(0);
        }
        for target in ["primary", "replica"] {
            counter!("synkronus_db_reads_total", "target" => target).increment(0);
        }
        for reason in ["behind", "error"] {
            counter!("synkronus_db_read_fallbacks_total", "reason" => reason).increment(0);
        }
        counter!("synkronus_body_budget_refused_total").increment(0);
        counter!("synkronus_attachment_bytes_uploaded_total").increment(0);
        gauge!("synkronus_exports_running").increment(0.0);
    });
}

/// The exposition text of everything recorded so far, every series labelled with `node`.
///
/// The label is added here rather than as a global label of the recorder: the recorder is one per
/// process, and the tests run several servers (nodes) in one process.
pub fn render(node: &str) -> String {
    describe_defaults();
    with_node_label(&handle().render(), node)
}

/// Adds `node="…"` first to the labels of every sample line; comments pass unchanged.
fn with_node_label(text: &str, node: &str) -> String {
    let escaped = node.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
    let mut out = String::with_capacity(text.len() + text.len() / 4);
    for line in text.lines() {
        if line.is_empty() || line.starts_with('#') {
            out.push_str(line);
        } else if let Some(brace) = line.find('{').filter(|b| line.find(' ').is_none_or(|s| *b < s)) {
            let (name, labels) = line.split_at(brace + 1);
            out.push_str(&format!("{name}node=\"{escaped}\",{labels}"));
        } else if let Some((name, value)) = line.split_once(' ') {
            out.push_str(&format!("{name}{{node=\"{escaped}\"}} {value}"));
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}

pub fn db_pool_connections(idle: usize, busy: usize) {
    gauge!("synkronus_db_pool_connections", "state" => "idle").set(idle as f64);
    gauge!("synkronus_db_pool_connections", "state" => "busy").set(busy as f64);
}

/// Marks `active` as the active bundle version (and the one shown before as no longer active).
pub fn set_active_bundle(active: Option<String>) {
    static SHOWN: Mutex<Option<String>> = Mutex::new(None);
    let Ok(mut shown) = SHOWN.lock() else { return };
    if *shown == active {
        return;
    }
    if let Some(old) = shown.take() {
        gauge!("synkronus_bundle_active_info", "version" => old).set(0.0);
    }
    if let Some(new) = &active {
        gauge!("synkronus_bundle_active_info", "version" => new.clone()).set(1.0);
    }
    *shown = active;
}

/// Where a group commit's time goes, phase by phase, logged at debug level (target
/// `synkronus::monitoring`; docs/benchmarks-history.md, "Push: where a group commit's time goes").
pub struct CommitPhases {
    last: Instant,
    pushes: usize,
    records: usize,
    queue_wait: Duration,
    laps: Vec<(&'static str, Duration)>,
}

impl CommitPhases {
    /// `queue_wait`: how long the oldest push of the group waited for the commit to start.
    pub fn start(pushes: usize, records: usize, queue_wait: Duration) -> Self {
        CommitPhases { last: Instant::now(), pushes, records, queue_wait, laps: Vec::with_capacity(16) }
    }

    /// Ends the current phase under `name`.
    pub fn lap(&mut self, name: &'static str) {
        let now = Instant::now();
        self.laps.push((name, now - self.last));
        self.last = now;
    }

    pub fn log(&self) {
        if !tracing::enabled!(tracing::Level::DEBUG) {
            return;
        }
        let laps: Vec<String> =
            self.laps.iter().map(|(n, d)| format!("{n}={:.2}", d.as_secs_f64() * 1e3)).collect();
        tracing::debug!(pushes = self.pushes, records = self.records,
            queue_wait_ms = self.queue_wait.as_secs_f64() * 1e3, phases_ms = %laps.join(" "), "group commit");
    }
}

#[cfg(test)]
mod tests {
    use super::with_node_label;

    #[test]
    fn every_sample_gets_the_node_label() {
        let text = "# HELP x_total Things\n# TYPE x_total counter\nx_total 3\n\
                    y{route=\"/a b\",status=\"200\"} 1\nz_bucket{le=\"+Inf\"} 2\n\n";
        let labelled = with_node_label(text, "n\"1");
        assert_eq!(
            labelled,
            "# HELP x_total Things\n# TYPE x_total counter\nx_total{node=\"n\\\"1\"} 3\n\
             y{node=\"n\\\"1\",route=\"/a b\",status=\"200\"} 1\nz_bucket{node=\"n\\\"1\",le=\"+Inf\"} 2\n\n"
        );
    }
}
