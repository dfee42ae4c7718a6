//! What the operator sees: a progress line on stderr while the import runs (rows, files, bytes,
//! rate, ETA), and the final report on stdout: counts per kind in source and target, and every
//! warning.

use std::fmt::Write as _;
use std::io::Write as _;
use std::time::{Duration, Instant};

/// Printed at most this often; the last line is printed when the import ends.
const PROGRESS_EVERY: Duration = Duration::from_millis(1000);
/// Warnings of one kind beyond this many are summarised.
const WARNINGS_SHOWN: usize = 50;

pub struct Progress {
    started: Instant,
    last: Option<Instant>,
    pub rows: u64,
    pub total_rows: u64,
    pub files: u64,
    pub total_files: u64,
    pub bytes: u64,
    pub total_bytes: u64,
    /// Time spent copying files: rows and bytes have rates of their own.
    file_time: Duration,
}

impl Progress {
    pub fn new(total_rows: u64, total_files: u64, total_bytes: u64) -> Self {
        Progress {
            started: Instant::now(),
            last: None,
            rows: 0,
            total_rows,
            files: 0,
            total_files,
            bytes: 0,
            total_bytes,
            file_time: Duration::ZERO,
        }
    }

    pub fn rows(&mut self, n: usize) {
        self.rows += n as u64;
        self.tick(false);
    }

    pub fn file(&mut self, bytes: u64, took: Duration) {
        self.files += 1;
        self.bytes += bytes;
        self.file_time += took;
        self.tick(false);
    }

    pub fn done(&mut self) {
        self.tick(true);
    }

    fn tick(&mut self, force: bool) {
        let now = Instant::now();
        if !force && self.last.is_some_and(|last| now - last < PROGRESS_EVERY) {
            return;
        }
        self.last = Some(now);
        let line = self.line(now - self.started);
        let _ = writeln!(std::io::stderr(), "{line}");
    }

    fn line(&self, elapsed: Duration) -> String {
        let secs = elapsed.as_secs_f64().max(0.001);
        let rate = self.rows as f64 / secs;
        let byte_rate = self.bytes as f64 / secs;
        // Rows and files go at their own rates; until a kind has started, it adds nothing.
        let row_secs = (secs - self.file_time.as_secs_f64()).max(0.001);
        let file_secs = self.file_time.as_secs_f64().max(0.001);
        let remaining = |done: u64, total: u64, took: f64| {
            if done == 0 {
                0.0
            } else {
                took * total.saturating_sub(done) as f64 / done as f64
            }
        };
        let eta = remaining(self.rows, self.total_rows, row_secs)
            + remaining(self.bytes, self.total_bytes, file_secs);
        format!(
            "import: {}/{} rows, {}/{} files, {}/{}, {:.0} rows/s, {}/s, ETA {:.0} s",
            self.rows,
            self.total_rows,
            self.files,
            self.total_files,
            human_bytes(self.bytes),
            human_bytes(self.total_bytes),
            rate,
            human_bytes(byte_rate as u64),
            eta
        )
    }
}

pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KB", "MB", "GB", "TB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1000.0 && unit < UNITS.len() - 1 {
        value /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// One row of the final table.
#[derive(Debug, Clone)]
pub struct Line {
    pub kind: &'static str,
    pub source: i64,
    pub target: i64,
}

/// The final report.
#[derive(Debug, Default)]
pub struct Report {
    pub header: Vec<String>,
    pub lines: Vec<Line>,
    /// (kind, message): grouped by kind when printed.
    pub warnings: Vec<(&'static str, String)>,
}

impl Report {
    pub fn warn(&mut self, kind: &'static str, message: impl Into<String>) {
        self.warnings.push((kind, message.into()));
    }

    pub fn line(&mut self, kind: &'static str, source: i64, target: i64) {
        self.lines.push(Line { kind, source, target });
    }

    /// Kinds whose counts differ.
    pub fn differences(&self) -> Vec<&Line> {
        self.lines.iter().filter(|l| l.source != l.target).collect()
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        for h in &self.header {
            let _ = writeln!(out, "{h}");
        }
        let _ = writeln!(out, "{:<24} {:>12} {:>12}", "kind", "source", "target");
        for l in &self.lines {
            let mark = if l.source == l.target { "" } else { "  <- differs" };
            let _ = writeln!(out, "{:<24} {:>12} {:>12}{mark}", l.kind, l.source, l.target);
        }
        let _ = writeln!(out, "warnings: {}", self.warnings.len());
        let mut shown: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
        for (kind, message) in &self.warnings {
            let n = shown.entry(kind).or_default();
            *n += 1;
            if *n <= WARNINGS_SHOWN {
                let _ = writeln!(out, "  - {kind}: {message}");
            }
        }
        for (kind, n) in shown {
            if n > WARNINGS_SHOWN {
                let _ = writeln!(out, "  - {kind}: … and {} more", n - WARNINGS_SHOWN);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_line_and_report() {
        let mut p = Progress::new(100, 2, 2_000_000);
        p.rows = 50;
        p.files = 1;
        p.bytes = 1_000_000;
        p.file_time = Duration::from_millis(500);
        let line = p.line(Duration::from_secs(1));
        assert!(line.contains("50/100 rows, 1/2 files, 1.0 MB/2.0 MB, 50 rows/s"), "{line}");
        assert!(
            line.contains("ETA 1 s"),
            "half a second for the other rows, half for the other bytes: {line}"
        );
        let mut r = Report::default();
        r.line("users", 2, 2);
        r.line("attachments", 3, 2);
        for i in 0..(WARNINGS_SHOWN + 2) {
            r.warn("missing file", format!("a{i}"));
        }
        let text = r.render();
        assert!(text.contains("attachments") && text.contains("<- differs"), "{text}");
        assert!(text.contains("… and 2 more"), "{text}");
        assert_eq!(r.differences().len(), 1);
    }
}
