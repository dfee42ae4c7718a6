//! Thread-safe run statistics: latency histograms per request kind, error counts by status,
//! named counters and correctness violations.
//!
//! One `Stats` is shared by every simulated device. A plain mutex is enough: each request takes
//! it once, for well under a microsecond, which is noise next to an HTTP round trip.

use hdrhistogram::Histogram;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Violation samples kept for the report; the counts are always complete.
const MAX_VIOLATION_SAMPLES: usize = 20;

/// How one request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// 2xx or 304.
    Ok,
    /// Any other HTTP status.
    Status(u16),
    /// Transport failure (connect, reset, truncated body).
    Io,
    /// Per-request timeout.
    Timeout,
    /// A success status whose body could not be decoded.
    Decode,
}

impl Outcome {
    /// The key used in "errors by status" tables.
    pub fn key(self) -> String {
        match self {
            Outcome::Ok => "ok".into(),
            Outcome::Status(s) => s.to_string(),
            Outcome::Io => "io".into(),
            Outcome::Timeout => "timeout".into(),
            Outcome::Decode => "decode".into(),
        }
    }
}

pub struct KindStats {
    /// Latencies of successful requests, in microseconds.
    pub hist: Histogram<u64>,
    pub ok: u64,
    pub errors: BTreeMap<String, u64>,
    /// Active window of this kind, so throughput is measured over the phase that issued it,
    /// not over the whole run.
    pub first_start: Instant,
    pub last_end: Instant,
}

#[derive(Default)]
struct Inner {
    kinds: BTreeMap<String, KindStats>,
    /// The same per-kind figures since the last `take_window`, for scenarios that report in
    /// steps (capacity); the whole-run figures in `kinds` are kept as well.
    window: BTreeMap<String, KindStats>,
    counters: BTreeMap<String, u64>,
    violations: BTreeMap<String, u64>,
    violation_samples: Vec<String>,
}

pub struct Stats {
    inner: Mutex<Inner>,
    /// Empty histogram cloned for each new request kind.
    template: Histogram<u64>,
    pub started: Instant,
}

impl Default for Stats {
    fn default() -> Self {
        Self::new()
    }
}

impl Stats {
    // Constant, valid bounds: the expect can only fail on a programming error, at start-up.
    #[allow(clippy::expect_used)]
    pub fn new() -> Self {
        Stats {
            inner: Mutex::new(Inner::default()),
            // 1 µs to 1 h at 3 significant digits: covers a loopback ping and a million-row
            // export.
            template: Histogram::new_with_bounds(1, 3_600_000_000, 3)
                .expect("constant histogram bounds are valid"),
            started: Instant::now(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the maps inconsistent in a way that
        // matters for reporting, so a poisoned lock is simply reused.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records one finished request that started at `start`.
    pub fn record(&self, kind: &str, start: Instant, outcome: Outcome) {
        let end = Instant::now();
        let micros = end.duration_since(start).as_micros().max(1) as u64;
        let mut g = self.lock();
        let Inner { kinds, window, .. } = &mut *g;
        for map in [kinds, window] {
            let k = map.entry(kind.to_string()).or_insert_with(|| KindStats {
                hist: self.template.clone(),
                ok: 0,
                errors: BTreeMap::new(),
                first_start: start,
                last_end: end,
            });
            k.first_start = k.first_start.min(start);
            k.last_end = k.last_end.max(end);
            match outcome {
                Outcome::Ok => {
                    k.ok += 1;
                    k.hist.saturating_record(micros);
                }
                other => *k.errors.entry(other.key()).or_insert(0) += 1,
            }
        }
    }

    /// Per-kind figures since the previous call (or the start), then a fresh window. Rates
    /// are over `window_secs`, the wall time since the previous call, not each kind's span.
    pub fn take_window(&self, window_secs: f64) -> Vec<KindSummary> {
        let taken = std::mem::take(&mut self.lock().window);
        taken
            .iter()
            .map(|(name, k)| {
                let mut s = summarize(name, k);
                s.window_secs = window_secs;
                s.throughput_per_sec = if window_secs > 0.0 { k.ok as f64 / window_secs } else { 0.0 };
                s
            })
            .collect()
    }

    pub fn add(&self, counter: &str, n: u64) {
        *self.lock().counters.entry(counter.to_string()).or_insert(0) += n;
    }

    pub fn counter(&self, counter: &str) -> u64 {
        self.lock().counters.get(counter).copied().unwrap_or(0)
    }

    /// Records a correctness violation: something the contract forbids happened.
    pub fn violation(&self, kind: &str, detail: impl Into<String>) {
        let mut g = self.lock();
        *g.violations.entry(kind.to_string()).or_insert(0) += 1;
        if g.violation_samples.len() < MAX_VIOLATION_SAMPLES {
            let d = detail.into();
            g.violation_samples.push(format!("{kind}: {d}"));
        }
    }

    /// Successful and failed requests so far (for the progress line).
    pub fn totals(&self) -> (u64, u64) {
        let g = self.lock();
        g.kinds.values().fold((0, 0), |(ok, err), k| (ok + k.ok, err + k.errors.values().sum::<u64>()))
    }

    pub fn violations_total(&self) -> u64 {
        self.lock().violations.values().sum()
    }

    /// p99 of successful requests of a kind, if any were recorded.
    pub fn quantile(&self, kind: &str, q: f64) -> Option<Duration> {
        let g = self.lock();
        let k = g.kinds.get(kind)?;
        if k.hist.is_empty() {
            return None;
        }
        Some(Duration::from_micros(k.hist.value_at_quantile(q)))
    }

    pub fn snapshot(&self) -> Snapshot {
        let g = self.lock();
        let elapsed = self.started.elapsed().as_secs_f64();
        let mut errors_by_status: BTreeMap<String, u64> = BTreeMap::new();
        let kinds = g
            .kinds
            .iter()
            .map(|(name, k)| {
                for (s, n) in &k.errors {
                    *errors_by_status.entry(s.clone()).or_insert(0) += n;
                }
                summarize(name, k)
            })
            .collect();
        Snapshot {
            elapsed_secs: elapsed,
            kinds,
            counters: g.counters.clone(),
            errors_by_status,
            violations: g.violations.clone(),
            violation_samples: g.violation_samples.clone(),
        }
    }
}

fn summarize(name: &str, k: &KindStats) -> KindSummary {
    let window = k.last_end.duration_since(k.first_start).as_secs_f64();
    let ms = |v: u64| v as f64 / 1000.0;
    let empty = k.hist.is_empty();
    KindSummary {
        kind: name.to_string(),
        ok: k.ok,
        errors: k.errors.values().sum(),
        errors_by_status: k.errors.clone(),
        window_secs: window,
        throughput_per_sec: if window > 0.0 { k.ok as f64 / window } else { 0.0 },
        mean_ms: if empty { 0.0 } else { k.hist.mean() / 1000.0 },
        p50_ms: if empty { 0.0 } else { ms(k.hist.value_at_quantile(0.50)) },
        p95_ms: if empty { 0.0 } else { ms(k.hist.value_at_quantile(0.95)) },
        p99_ms: if empty { 0.0 } else { ms(k.hist.value_at_quantile(0.99)) },
        max_ms: if empty { 0.0 } else { ms(k.hist.max()) },
    }
}

/// Per-kind summary as it appears in the report.
#[derive(Debug, Clone, serde::Serialize)]
pub struct KindSummary {
    pub kind: String,
    pub ok: u64,
    pub errors: u64,
    pub errors_by_status: BTreeMap<String, u64>,
    pub window_secs: f64,
    pub throughput_per_sec: f64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

#[derive(Debug, Clone)]
pub struct Snapshot {
    pub elapsed_secs: f64,
    pub kinds: Vec<KindSummary>,
    pub counters: BTreeMap<String, u64>,
    pub errors_by_status: BTreeMap<String, u64>,
    pub violations: BTreeMap<String, u64>,
    pub violation_samples: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_errors() {
        let s = Stats::new();
        let base = Instant::now();
        // Fake latencies by recording with start times in the past.
        for ms in 1..=100u64 {
            let start = base.checked_sub(Duration::from_millis(ms)).unwrap_or(base);
            s.record("push", start, Outcome::Ok);
        }
        s.record("push", Instant::now(), Outcome::Status(500));
        s.record("push", Instant::now(), Outcome::Io);
        s.record("pull", Instant::now(), Outcome::Status(500));
        let snap = s.snapshot();
        let push = snap.kinds.iter().find(|k| k.kind == "push").unwrap();
        assert_eq!(push.ok, 100);
        assert_eq!(push.errors, 2);
        // Recorded latencies are at least the faked ones; allow scheduling slack above.
        assert!(push.p50_ms >= 50.0 && push.p50_ms < 80.0, "{}", push.p50_ms);
        assert!(push.p99_ms >= 99.0 && push.p99_ms < 130.0, "{}", push.p99_ms);
        assert!(push.max_ms >= push.p99_ms);
        assert_eq!(snap.errors_by_status.get("500"), Some(&2));
        assert_eq!(snap.errors_by_status.get("io"), Some(&1));
        assert_eq!(s.totals(), (100, 3));
    }

    #[test]
    fn violations_counted_and_sampled() {
        let s = Stats::new();
        for i in 0..30 {
            s.violation("mixed_version", format!("file {i}"));
        }
        assert_eq!(s.violations_total(), 30);
        let snap = s.snapshot();
        assert_eq!(snap.violations.get("mixed_version"), Some(&30));
        assert_eq!(snap.violation_samples.len(), MAX_VIOLATION_SAMPLES);
    }

    #[test]
    fn windows_restart_but_the_run_keeps_everything() {
        let s = Stats::new();
        s.record("push", Instant::now(), Outcome::Ok);
        s.record("push", Instant::now(), Outcome::Status(503));
        let w = s.take_window(2.0);
        assert_eq!((w[0].ok, w[0].errors, w[0].throughput_per_sec), (1, 1, 0.5));
        s.record("pull", Instant::now(), Outcome::Ok);
        let w = s.take_window(1.0);
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].kind, "pull");
        assert_eq!(s.totals(), (2, 1));
    }

    #[test]
    fn counters_accumulate() {
        let s = Stats::new();
        s.add("records_pushed", 50);
        s.add("records_pushed", 25);
        assert_eq!(s.counter("records_pushed"), 75);
        assert_eq!(s.counter("missing"), 0);
    }
}
