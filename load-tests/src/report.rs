//! Run reports: one JSON document and one markdown table per run.

use crate::stats::{KindSummary, Snapshot};
use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Serialize)]
pub struct CounterSummary {
    pub name: String,
    pub total: u64,
    /// Over the whole run; scenario-specific phase rates are in `results`.
    pub per_sec: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub scenario: String,
    pub started_at: String,
    pub finished_at: String,
    pub base_url: String,
    pub elapsed_secs: f64,
    /// The knobs the scenario ran with.
    pub params: Value,
    /// Headline numbers computed by the scenario (records/s, MB/s, p99 ratios...).
    pub results: BTreeMap<String, Value>,
    /// Structured figures too big for `results` (the capacity scenario's steps).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub details: BTreeMap<String, Value>,
    /// Markdown sections the scenario wrote itself, shown after the results.
    #[serde(skip)]
    pub sections: Vec<String>,
    pub requests: Vec<KindSummary>,
    pub counters: Vec<CounterSummary>,
    pub errors_by_status: BTreeMap<String, u64>,
    /// Whether the scenario checks correctness; if so `violations_total` must be 0.
    pub correctness_checked: bool,
    pub violations_total: u64,
    pub violations: BTreeMap<String, u64>,
    pub violation_samples: Vec<String>,
    pub notes: Vec<String>,
    /// Set when the run hit `--max-time` or failed part-way; the numbers cover what ran.
    pub incomplete: Option<String>,
}

pub struct ReportMeta {
    pub scenario: String,
    pub started_at: chrono::DateTime<chrono::Utc>,
    pub base_url: String,
    pub params: Value,
    pub results: BTreeMap<String, Value>,
    pub details: BTreeMap<String, Value>,
    pub sections: Vec<String>,
    pub correctness_checked: bool,
    pub notes: Vec<String>,
    pub incomplete: Option<String>,
}

impl Report {
    pub fn build(meta: ReportMeta, snap: Snapshot) -> Report {
        let elapsed = snap.elapsed_secs;
        let counters = snap
            .counters
            .iter()
            .map(|(name, &total)| CounterSummary {
                name: name.clone(),
                total,
                per_sec: if elapsed > 0.0 { total as f64 / elapsed } else { 0.0 },
            })
            .collect();
        Report {
            scenario: meta.scenario,
            started_at: meta.started_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            finished_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            base_url: meta.base_url,
            elapsed_secs: round3(elapsed),
            params: meta.params,
            results: meta.results,
            details: meta.details,
            sections: meta.sections,
            requests: snap.kinds,
            counters,
            errors_by_status: snap.errors_by_status,
            correctness_checked: meta.correctness_checked,
            violations_total: snap.violations.values().sum(),
            violations: snap.violations,
            violation_samples: snap.violation_samples,
            notes: meta.notes,
            incomplete: meta.incomplete,
        }
    }

    /// Human-readable markdown: the same numbers as the JSON.
    pub fn to_markdown(&self) -> String {
        let mut md = String::new();
        let _ = writeln!(md, "# synkronus-load: {}\n", self.scenario);
        let _ = writeln!(
            md,
            "Target `{}`, started {}, {:.1} s.\n",
            self.base_url, self.started_at, self.elapsed_secs
        );
        if let Some(why) = &self.incomplete {
            let _ = writeln!(md, "**INCOMPLETE:** {why}\n");
        }
        if let Value::Object(map) = &self.params {
            if !map.is_empty() {
                let params: Vec<String> = map.iter().map(|(k, v)| format!("{k}={v}")).collect();
                let _ = writeln!(md, "Parameters: {}\n", params.join(", "));
            }
        }
        if !self.results.is_empty() {
            let _ = writeln!(md, "## Results\n\n| metric | value |\n|---|---|");
            for (k, v) in &self.results {
                let _ = writeln!(md, "| {k} | {} |", fmt_value(v));
            }
            md.push('\n');
        }
        for section in &self.sections {
            let _ = writeln!(md, "{section}");
        }
        let _ = writeln!(
            md,
            "## Requests\n\nLatencies of successful requests (2xx/304); req/s over each kind's active window.\n"
        );
        let _ = writeln!(
            md,
            "| kind | ok | errors | req/s | mean ms | p50 ms | p95 ms | p99 ms | max ms |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        for k in &self.requests {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
                k.kind,
                k.ok,
                k.errors,
                k.throughput_per_sec,
                k.mean_ms,
                k.p50_ms,
                k.p95_ms,
                k.p99_ms,
                k.max_ms
            );
        }
        md.push('\n');
        if !self.counters.is_empty() {
            let _ = writeln!(md, "## Counters\n\n| counter | total | per s (whole run) |\n|---|---:|---:|");
            for c in &self.counters {
                let _ = writeln!(md, "| {} | {} | {:.1} |", c.name, c.total, c.per_sec);
            }
            md.push('\n');
        }
        let _ = writeln!(md, "## Errors by status\n");
        if self.errors_by_status.is_empty() {
            let _ = writeln!(md, "None.\n");
        } else {
            let _ = writeln!(md, "| status | count |\n|---|---:|");
            for (s, n) in &self.errors_by_status {
                let _ = writeln!(md, "| {s} | {n} |");
            }
            md.push('\n');
        }
        if self.correctness_checked {
            let verdict = if self.violations_total == 0 { "PASS" } else { "FAIL" };
            let _ = writeln!(md, "## Correctness: {verdict} ({} violations)\n", self.violations_total);
            if !self.violations.is_empty() {
                let _ = writeln!(md, "| violation | count |\n|---|---:|");
                for (v, n) in &self.violations {
                    let _ = writeln!(md, "| {v} | {n} |");
                }
                md.push('\n');
                for s in &self.violation_samples {
                    let _ = writeln!(md, "- {s}");
                }
                md.push('\n');
            }
        }
        if !self.notes.is_empty() {
            let _ = writeln!(md, "## Notes\n");
            for n in &self.notes {
                let _ = writeln!(md, "- {n}");
            }
            md.push('\n');
        }
        md
    }

    /// Writes `<dir>/<scenario>-<timestamp>.json` and `.md`; returns both paths.
    pub fn write(&self, dir: &Path) -> Result<(PathBuf, PathBuf)> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating output directory {}", dir.display()))?;
        let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%S%.3fZ");
        let stem = format!("{}-{stamp}", self.scenario);
        let json_path = dir.join(format!("{stem}.json"));
        let md_path = dir.join(format!("{stem}.md"));
        let json = serde_json::to_vec_pretty(self)?;
        std::fs::write(&json_path, json).with_context(|| format!("writing {}", json_path.display()))?;
        std::fs::write(&md_path, self.to_markdown())
            .with_context(|| format!("writing {}", md_path.display()))?;
        Ok((json_path, md_path))
    }
}

fn fmt_value(v: &Value) -> String {
    match v {
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() => format!("{f:.2}"),
            _ => n.to_string(),
        },
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{Outcome, Stats};
    use std::time::Instant;

    fn sample() -> Report {
        let s = Stats::new();
        s.record("push", Instant::now(), Outcome::Ok);
        s.record("push", Instant::now(), Outcome::Status(503));
        s.add("records_pushed", 50);
        s.violation("stale_head", "push head 3 < 4");
        let mut results = BTreeMap::new();
        results.insert("records_per_sec".into(), serde_json::json!(1234.5678));
        results.insert("target".into(), serde_json::json!("x"));
        Report::build(
            ReportMeta {
                scenario: "push-storm".into(),
                started_at: chrono::Utc::now(),
                base_url: "http://127.0.0.1:8080".into(),
                params: serde_json::json!({"devices": 2}),
                results,
                details: BTreeMap::new(),
                sections: vec!["## Steps\n\n| devices |\n|---:|\n| 10 |\n".into()],
                correctness_checked: true,
                notes: vec!["a note".into()],
                incomplete: None,
            },
            s.snapshot(),
        )
    }

    #[test]
    fn markdown_has_tables_and_verdict() {
        let md = sample().to_markdown();
        assert!(md.contains("# synkronus-load: push-storm"));
        assert!(md.contains("| push | 1 | 1 |"), "{md}");
        assert!(md.contains("| 503 | 1 |"));
        assert!(md.contains("| records_per_sec | 1234.57 |"));
        assert!(md.contains("Correctness: FAIL (1 violations)"));
        assert!(md.contains("stale_head: push head 3 < 4"));
        assert!(md.contains("devices=2"));
    }

    #[test]
    fn json_roundtrip_and_files_written() {
        let r = sample();
        let dir = std::env::temp_dir().join(format!("synkload-test-{}", uuid::Uuid::new_v4()));
        let (j, m) = r.write(&dir).unwrap();
        let v: Value = serde_json::from_slice(&std::fs::read(&j).unwrap()).unwrap();
        assert_eq!(v["scenario"], "push-storm");
        assert_eq!(v["violations_total"], 1);
        assert_eq!(v["errors_by_status"]["503"], 1);
        assert_eq!(v["requests"][0]["kind"], "push");
        assert!(j.file_name().unwrap().to_str().unwrap().starts_with("push-storm-"));
        assert!(std::fs::read_to_string(&m).unwrap().contains("| push |"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
