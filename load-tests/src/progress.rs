//! Progress bar on stderr with live request, error and violation counts.

use crate::stats::Stats;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub struct Progress {
    bar: ProgressBar,
    /// Set while a timed phase runs: the ticker then moves the bar with the clock.
    timed: Arc<Mutex<Option<Instant>>>,
    ticker: tokio::task::JoinHandle<()>,
}

impl Progress {
    pub fn new(enabled: bool, stats: Arc<Stats>) -> Progress {
        let bar = if enabled {
            ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr())
        } else {
            ProgressBar::hidden()
        };
        let timed: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
        let (b, t) = (bar.clone(), timed.clone());
        // Refreshing from a ticker keeps the per-request hot path free of terminal work.
        let ticker = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                let (ok, err) = stats.totals();
                let viol = stats.violations_total();
                b.set_message(format!("ok {ok}  err {err}  violations {viol}"));
                let started = *t.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(s) = started {
                    b.set_position(s.elapsed().as_secs());
                }
            }
        });
        Progress { bar, timed, ticker }
    }

    fn style(template: &str) -> ProgressStyle {
        ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar())
    }

    /// A phase that ends after `len` units (records, requests, files).
    pub fn counted(&self, phase: &str, len: u64, unit: &str) {
        *self.timed.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.bar.set_style(Self::style(&format!(
            "{{prefix}} [{{elapsed_precise}}] {{wide_bar}} {{pos}}/{{len}} {unit} ({{per_sec}}) {{msg}}"
        )));
        self.bar.set_prefix(phase.to_string());
        self.bar.set_length(len);
        self.bar.set_position(0);
    }

    /// A phase that ends after `secs` seconds.
    pub fn timed(&self, phase: &str, secs: u64) {
        self.bar.set_style(Self::style("{prefix} [{elapsed_precise}] {wide_bar} {pos}/{len} s {msg}"));
        self.bar.set_prefix(phase.to_string());
        self.bar.set_length(secs);
        self.bar.set_position(0);
        *self.timed.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    }

    pub fn inc(&self, n: u64) {
        self.bar.inc(n);
    }

    pub fn finish(&self) {
        self.ticker.abort();
        self.bar.finish_and_clear();
    }
}
